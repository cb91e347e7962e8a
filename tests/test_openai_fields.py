"""Every Chat Completions and Responses request field is honoured, ignored (it changes nothing
sampled) or refused with a 400 naming it, never accepted and dropped: the tables of
docs/openai_agents.md ("Request fields", "Responses request fields") list each field of the
openai SDK's request types, and each of their example values is sent to the real endpoint."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.serve import responses  # noqa: E402
from agentrl.serve.protocol import IGNORED, READ, REFUSED  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import AttemptBudget, ChatService  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "openai_agents.md"
BASE = {"messages": [{"role": "user", "content": "hi"}]}
RBASE = {"input": "hi"}
STATEFUL = {"previous_response_id"}  # its accepted values are the ids of stored responses: tested with them


def field_table(title: str = "### Request fields") -> dict[str, tuple[str, object, object]]:
    """{field: (status, accepted example or None, refused example or None)} from the doc's
    section ``title`` (up to the next section)."""
    text = DOC.read_text()
    section = text[text.index(title + "\n"):]
    section = section[:section.index("\n### ", 1)] if "\n### " in section[1:] else section
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.fullmatch(r"`\w+`", cells[0]):
            continue
        example = [None if c == "—" else json.loads(c.strip("`")) for c in cells[2:4]]
        rows[cells[0].strip("`")] = (cells[1], *example)
    return rows


@pytest.fixture(scope="module")
def server():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    end = tok.convert_tokens_to_ids("<|im_end|>")
    engine = PerRequestScriptedEngine(lambda _p, _k: tok.encode("fine END", add_special_tokens=False) + [end])
    budget = AttemptBudget(max_total_tokens=512, max_sampled_tokens=10**6, max_new_tokens=32, temperature=1.0,
                           top_p=1.0)
    with EndpointServer(ChatService(engine, ChatTemplate(tok), budget)) as s:
        yield s


def test_the_doc_lists_every_request_field_of_the_sdk_and_the_code_agrees():
    from openai.types.chat import completion_create_params as params

    rows = field_table()
    sdk = set(typing.get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}
    assert sdk <= set(rows), f"not in docs/openai_agents.md: {sorted(sdk - set(rows))}"
    assert {s for s, _, _ in rows.values()} <= {"honoured", "ignored", "refused"}
    assert {f for f, (s, _, _) in rows.items() if s == "ignored"} == set(IGNORED)
    assert set(READ) | set(IGNORED) | set(REFUSED) == set(rows)
    for name, (status, ok, bad) in rows.items():
        assert (name in REFUSED) == (ok is None), name  # refused outright: no value but null passes
        assert name not in REFUSED or status == "refused", name
        assert (status == "ignored") == (bad is None), name


def test_each_documented_value_is_accepted_or_refused_naming_its_field(server):
    url = server.base_url() + "/chat/completions"
    rows = field_table()
    assert len(rows) >= 37
    with httpx.Client(timeout=60) as http:
        for name, (status, ok, bad) in rows.items():
            if ok is not None:
                r = http.post(url, json={**BASE, name: ok})
                assert r.status_code == 200, (name, ok, r.text)
            if bad is not None:
                r = http.post(url, json={**BASE, name: bad})
                assert r.status_code == 400, (name, bad, r.text)
                err = r.json()["error"]
                assert re.split(r"[\[.]", err["param"])[0] == name and name in err["message"], (name, err)
                assert err["type"] == "invalid_request_error"
            r = http.post(url, json={**BASE, name: None}) if name != "messages" else None
            assert r is None or r.status_code == 200, (name, r.text)  # null is as if absent


@pytest.mark.parametrize("name,value,words", [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "constrained decoding"),
    ("frequency_penalty", -1.0, "log-probs"),
    ("presence_penalty", 2, "log-probs"),
    ("logit_bias", {"1": 5}, "log-probs"),
    ("parallel_tool_calls", False, "trained on"),
    ("top_k", 5, "refused rather than ignored"),
    ("chat_template_kwargs", {"enable_thinking": False}, "refused rather than ignored"),
])
def test_refusals_say_why_through_the_sdk(server, name, value, words):
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as got:
        client.chat.completions.create(model="m", messages=BASE["messages"], extra_body={name: value})
    assert got.value.status_code == 400 and name in str(got.value) and words in str(got.value)


def test_neutral_values_through_the_sdk_are_accepted(server):
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    r = client.chat.completions.create(model="m", messages=BASE["messages"], frequency_penalty=0, presence_penalty=0,
                                       logit_bias={}, response_format={"type": "text"}, parallel_tool_calls=True,
                                       user="u", store=False, metadata={"run": "1"})
    assert r.choices[0].message.content == "fine END"


def test_the_doc_lists_every_responses_field_of_the_sdk_and_the_code_agrees():
    from openai.types.responses import response_create_params as params

    rows = field_table("### Responses request fields")
    sdk = set(typing.get_type_hints(params.ResponseCreateParamsBase)) | {"stream"}
    assert sdk <= set(rows), f"not in docs/openai_agents.md: {sorted(sdk - set(rows))}"
    assert {s for s, _, _ in rows.values()} <= {"honoured", "ignored", "refused"}
    assert {f for f, (s, _, _) in rows.items() if s == "ignored"} == set(responses.IGNORED)
    assert set(responses.READ) | set(responses.IGNORED) | set(responses.REFUSED) == set(rows)
    for name, (status, ok, bad) in rows.items():
        assert (name in responses.REFUSED or name in STATEFUL) == (ok is None), name
        assert name not in responses.REFUSED or status == "refused", name
        assert (status == "ignored") == (bad is None), name


def test_each_documented_responses_value_is_accepted_or_refused_naming_its_field(server):
    url = server.base_url() + "/responses"
    rows = field_table("### Responses request fields")
    assert len(rows) >= 34
    with httpx.Client(timeout=60) as http:
        for name, (status, ok, bad) in rows.items():
            if ok is not None:
                r = http.post(url, json={**RBASE, name: ok})
                assert r.status_code == 200, (name, ok, r.text)
            if bad is not None:
                r = http.post(url, json={**RBASE, name: bad})
                assert r.status_code == 400, (name, bad, r.text)
                err = r.json()["error"]
                assert re.split(r"[\[.]", err["param"])[0] == name and name in err["message"], (name, err)
                assert err["type"] == "invalid_request_error"
            r = http.post(url, json={**RBASE, name: None}) if name != "input" else None
            assert r is None or r.status_code == 200, (name, r.text)  # null is as if absent
        stored = http.post(url, json=RBASE).json()["id"]
        r = http.post(url, json={**RBASE, "previous_response_id": stored})
        assert r.status_code == 200 and r.json()["previous_response_id"] == stored


def test_responses_neutral_values_through_the_sdk_are_accepted(server):
    client = openai.OpenAI(base_url=server.base_url(), api_key="x", max_retries=0)
    r = client.responses.create(model="m", input="hi", parallel_tool_calls=True, truncation="disabled",
                                background=False, reasoning={"effort": "none"}, text={"format": {"type": "text"}},
                                include=[], user="u", store=True, metadata={"run": "1"}, top_logprobs=0)
    assert r.output_text == "fine END" and r.metadata == {"run": "1"}
