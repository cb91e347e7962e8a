"""Structured output by constrained decoding (agentrl/engines/grammar.py, agentrl/serve/structured.py):
the recorded log-prob convention on hand numbers and against a replay of the engine, outputs
that parse against 24 schemas (the tiny model is untrained: the constraint does all the work),
truncation, batch invariance of unconstrained rows, and both APIs through the endpoint."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

pytest.importorskip("llguidance", reason="pip install 'agentrl[serve]'")
jsonschema = pytest.importorskip("jsonschema")

from agentrl.engines.base import SamplingParams  # noqa: E402
from agentrl.engines.grammar import Grammar, GrammarError, check_grammar, masked_logprob, unpack_bitmask  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402

S = lambda n=8: {"type": "string", "maxLength": n}  # noqa: E731  (an untrained model never closes a free string)
OBJ = lambda props, req=None: {"type": "object", "properties": props, "required": list(props) if req is None  # noqa: E731
                               else req, "additionalProperties": False}
SCHEMAS = {
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "string_bounded": S(6),
    "enum_strings": {"enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": [1, "two", None, True]},
    "const": {"const": "fixed"},
    "flat_object": OBJ({"a": {"type": "integer"}, "b": {"type": "boolean"}}),
    "optional_props": OBJ({"x": {"type": "integer"}, "y": S(4)}, ["x"]),
    "all_optional": OBJ({"p": {"type": "null"}, "q": {"type": "boolean"}}, []),
    "nested_object": OBJ({"outer": OBJ({"inner": OBJ({"v": {"type": "integer"}})})}),
    "array_ints": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    "array_enum": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    "array_objects": {"type": "array", "items": OBJ({"id": {"type": "integer"}}), "minItems": 1, "maxItems": 3},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False},
    "anyof_scalar": {"anyOf": [{"type": "integer"}, {"type": "boolean"}, {"type": "null"}]},
    "anyof_objects": {"anyOf": [OBJ({"kind": {"const": "a"}, "n": {"type": "integer"}}),
                                OBJ({"kind": {"const": "b"}, "ok": {"type": "boolean"}})]},
    "nullable_field": OBJ({"v": {"type": ["integer", "null"]}}),
    "int_range": {"type": "integer", "minimum": 3, "maximum": 7},
    "number_bounds": OBJ({"t": {"type": "number", "minimum": 0, "maximum": 1}}),
    "defs_ref": {"$defs": {"pt": OBJ({"x": {"type": "integer"}, "y": {"type": "integer"}})},
                 **OBJ({"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}})},
    "openai_strict": OBJ({"answer": {"type": "integer"}, "unit": {"enum": ["m", "s", "kg"]},
                          "steps": {"type": "array", "items": S(5), "maxItems": 2},
                          "note": {"anyOf": [S(5), {"type": "null"}]}}),
    "pattern": {"type": "string", "pattern": "^[a-c]{2,3}$"},
}


@pytest.fixture(scope="module")
def engine():
    return HFEngine.from_pretrained(ensure_tiny_model(), seed=0)


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)


def _end(engine) -> int:
    return engine.tokenizer.convert_tokens_to_ids("<|im_end|>")


def _params(engine, schema=None, **kw) -> SamplingParams:
    grammar = Grammar.json_object() if schema is None else Grammar.json_schema(schema)
    return SamplingParams(**{"max_new_tokens": 96, "stop_token_ids": [_end(engine)], "grammar": grammar, **kw})


def _text(engine, g) -> str:
    return engine.tokenizer.decode(g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids)


# -- the log-prob convention, on hand numbers ------------------------------------------------

def test_masked_logprob_on_hand_numbers():
    logits = torch.tensor([0.0, math.log(3.0), 5.0], dtype=torch.float64)
    allowed = torch.tensor([True, True, False])
    # T = 1: exp = 1, 3, (e^5 masked): μ(1) = 3/4, μ(0) = 1/4
    assert masked_logprob(logits, allowed, 1, 1.0) == pytest.approx(math.log(0.75), abs=1e-12)
    assert masked_logprob(logits, allowed, 0, 1.0) == pytest.approx(math.log(0.25), abs=1e-12)
    # T = 2: exp(z/2) = 1, sqrt(3): μ(1) = sqrt(3) / (1 + sqrt(3))
    assert masked_logprob(logits, allowed, 1, 2.0) == pytest.approx(math.log(3 ** 0.5 / (1 + 3 ** 0.5)), abs=1e-12)
    # greedy records the T = 1 value; a forced token (one allowed) has μ = 1
    assert masked_logprob(logits, allowed, 1, 0.0) == pytest.approx(math.log(0.75), abs=1e-12)
    assert masked_logprob(logits, torch.tensor([False, False, True]), 2, 1.0) == 0.0
    with pytest.raises(ValueError, match="not allowed"):
        masked_logprob(logits, allowed, 2, 1.0)
    # The trainer's π_old is unmasked: π_old(1) = 3 / (4 + e^5); the IS weight π_old / μ = Z = 4 / (4 + e^5) <= 1.
    log_pi_old = float(torch.log_softmax(logits.double(), -1)[1])
    assert log_pi_old == pytest.approx(math.log(3 / (4 + math.e ** 5)), abs=1e-12)
    assert math.exp(log_pi_old - masked_logprob(logits, allowed, 1, 1.0)) == pytest.approx(4 / (4 + math.e ** 5))


def test_unpack_bitmask_bit_order():
    words = torch.tensor([[1 - 2**31, 0b10]], dtype=torch.int32)  # bits 0 and 31 set  # tokens 0, 31 and 33
    assert unpack_bitmask(words, 40).nonzero()[:, 1].tolist() == [0, 31, 33]


def test_recorded_logprobs_are_the_masked_ones(engine, prompt):
    """Replay a constrained generation: every recorded μ is masked_logprob of the model's own
    logits under the grammar's mask at that step, and never below the unmasked π (IS weight <= 1)."""
    schema = SCHEMAS["openai_strict"]
    params = _params(engine, schema, temperature=0.7, seed=3)
    g = asyncio.run(engine.agenerate(prompt, params))
    assert g.finish_reason == "stop"
    seq = torch.tensor([prompt + g.token_ids])
    with torch.inference_mode():
        logits = engine.model(input_ids=seq).logits[0, len(prompt) - 1: -1].float()
    matcher = engine.row_matcher(params)
    bitmask = torch.empty(1, (logits.shape[1] + 31) // 32, dtype=torch.int32)
    forced = 0
    for step, (tok, mu) in enumerate(zip(g.token_ids, g.logprobs)):
        matcher.fill(bitmask, 0)
        allowed = unpack_bitmask(bitmask, logits.shape[1])[0]
        assert mu == pytest.approx(masked_logprob(logits[step], allowed, tok, 0.7), abs=1e-4), step
        unmasked = float(torch.log_softmax(logits[step] / 0.7, -1)[tok])
        assert unmasked <= mu + 1e-4
        forced += int(allowed.sum()) == 1
        matcher.advance(tok)
    assert forced > 0  # e.g. the keys of a strict object: forced tokens record log μ = 0
    assert max(g.logprobs) == pytest.approx(0.0, abs=1e-6)


# -- outputs parse --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_every_schema_parses(engine, prompt, seed):
    assert len(SCHEMAS) >= 20

    async def all_at_once():  # one continuous batch: constrained rows side by side
        return await asyncio.gather(*(engine.agenerate(prompt, _params(engine, s, seed=seed))
                                      for s in SCHEMAS.values()))

    for (name, schema), g in zip(SCHEMAS.items(), asyncio.run(all_at_once())):
        assert g.finish_reason == "stop" and g.token_ids[-1] == _end(engine), name
        jsonschema.validate(json.loads(_text(engine, g)), schema)


def test_json_object_and_lock_step_generate(engine, prompt):
    params = _params(engine, None, seed=0)  # json_object: any object (the untrained model closes it with seed 0)
    g = engine.generate([prompt], params)
    assert g[0].finish_reason == "stop" and isinstance(json.loads(_text(engine, g[0])), dict)
    assert asyncio.run(engine.agenerate(prompt, params)).token_ids == g[0].token_ids  # the same row stream


def test_truncation_mid_json_is_length(engine, prompt):
    g = asyncio.run(engine.agenerate(prompt, _params(engine, SCHEMAS["nested_object"], max_new_tokens=4, seed=0)))
    assert g.finish_reason == "length" and len(g.token_ids) == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(_text(engine, g))


def test_unconstrained_rows_are_untouched(engine, prompt):
    """The same seed samples the same ids whether the row beside it is constrained or not."""
    plain = SamplingParams(max_new_tokens=24, seed=11, stop_token_ids=[_end(engine)])

    async def pair(other: SamplingParams):
        return await asyncio.gather(engine.agenerate(prompt, plain), engine.agenerate(prompt, other))

    beside_plain, _ = asyncio.run(pair(SamplingParams(max_new_tokens=24, seed=12, stop_token_ids=[_end(engine)])))
    beside_json, constrained = asyncio.run(pair(_params(engine, SCHEMAS["flat_object"], seed=12)))
    alone = asyncio.run(engine.agenerate(prompt, plain))
    assert beside_plain.token_ids == beside_json.token_ids == alone.token_ids
    assert beside_plain.logprobs == pytest.approx(beside_json.logprobs, abs=1e-5)
    json.loads(_text(engine, constrained))


def test_bad_schemas_and_engines_without_the_capability_are_refused(engine, prompt):
    with pytest.raises(GrammarError, match="cannot be compiled"):
        check_grammar(Grammar("json_schema", '{"type": "nonsense"}'))
    with pytest.raises(ValueError, match="stop_token_ids"):
        asyncio.run(engine.agenerate(prompt, _params(engine, {"type": "integer"}, stop_token_ids=[])))
    from agentrl.engines.vllm import check_request

    with pytest.raises(ValueError, match="model.engine=hf"):
        check_request([prompt], _params(engine, {"type": "integer"}), 4096)


# -- the endpoint -----------------------------------------------------------------------------

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")


@pytest.fixture(scope="module")
def server(engine):
    from agentrl.chat import ChatTemplate
    from agentrl.serve.server import EndpointServer
    from agentrl.serve.service import AttemptBudget, ChatService

    budget = AttemptBudget(max_total_tokens=1024, max_sampled_tokens=10**6, max_new_tokens=96, temperature=1.0,
                           top_p=1.0)
    with EndpointServer(ChatService(engine, ChatTemplate(engine.tokenizer), budget)) as s:
        yield s


SCHEMA = SCHEMAS["openai_strict"]


def test_chat_completions_response_format(server):
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "answer"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="m", messages=msgs, response_format=fmt, seed=1)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    obj = client.chat.completions.create(model="m", messages=msgs, response_format={"type": "json_object"}, seed=0)
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    streamed = client.chat.completions.create(model="m", messages=msgs, response_format=fmt, seed=1, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content
    cut = client.chat.completions.create(model="m", messages=msgs, response_format=fmt, seed=1, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"


def test_responses_text_format(server):
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    r = client.responses.create(model="m", input="answer", text={"format": fmt})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema" and r.status == "completed"
    r = client.responses.create(model="m", input="answer", text={"format": {"type": "json_object"}},
                                max_output_tokens=2)
    assert r.status == "incomplete"


@pytest.mark.parametrize("api,body,param,words", [
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "needs a schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format", "cannot be compiled"),
    ("chat", {"response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "response_format", "tool_choice='none'"),
    ("chat", {"response_format": {"type": "yaml"}}, "response_format", "not one of"),
    ("responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text.format", "cannot be compiled"),
    ("responses", {"text": {"format": {"type": "json_object", "schema": {}}}}, "text.format", "no other keys"),
])
def test_refusals_name_the_field(server, api, body, param, words):
    import httpx

    url = server.base_url() + ("/chat/completions" if api == "chat" else "/responses")
    base = {"messages": [{"role": "user", "content": "hi"}]} if api == "chat" else {"input": "hi"}
    r = httpx.post(url, json={**base, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
