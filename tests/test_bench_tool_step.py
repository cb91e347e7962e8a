"""The machinery of benchmarks/tool_step.py (agentrl vs TRL's tool loop) cannot silently rot:
the tiny model carries a byte-exact copy of TRL's qwen2_5 template (the one TRL recognises),
both sides render the same prompt ids, and a tool call that agentrl's template rendering
produces parses in TRL into the same call as in agentrl, whose tool gives TRL's result."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from tool_task import MultiplyEnv, multiply  # noqa: E402

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.toolbox import ToolBox  # noqa: E402
from agentrl.types import Message, ToolCall  # noqa: E402

TRL_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentrl.models.cache import default_cache_dir
    from agentrl.models.tiny import ensure_tiny_model

    d = ensure_tiny_model(cache_dir=default_cache_dir() / "bench-tool-step",
                          chat_template=TRL_TEMPLATE.read_text(encoding="utf-8"))
    return AutoTokenizer.from_pretrained(d)


def test_template_is_trls_qwen2_5_and_recognised(tok):
    from trl.chat_template_utils import add_response_schema, is_chat_template_prefix_preserving, qwen2_5_chat_template

    assert tok.chat_template.encode() == TRL_TEMPLATE.read_bytes()
    assert tok.chat_template == qwen2_5_chat_template
    assert is_chat_template_prefix_preserving(tok)  # TRL keeps it (no training-template swap)
    add_response_schema(tok)
    assert getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None


def test_same_prompt_ids_and_tool_call_parse(tok):
    from trl.chat_template_utils import add_response_schema, parse_response

    env = MultiplyEnv(seed=0, num_train=4, num_test=1)
    box = ToolBox(env.tools(), tokenizer=tok)
    chat = ChatTemplate(tok)
    assert chat.tool_call_format == "hermes"
    task = env.tasks("train")[0]
    a, b = task.metadata["a"], task.metadata["b"]
    msgs = [Message("system", env.system_prompt), Message("user", task.prompt)]
    agentrl_ids = chat.encode_prompt(msgs, box.schemas())
    trl_ids = tok.apply_chat_template([m.to_chat() for m in msgs], tools=[multiply], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
    assert agentrl_ids == trl_ids

    # An assistant turn calling the tool, as agentrl's template rendering writes it (the SFT targets).
    call = Message("assistant", "", tool_calls=[ToolCall(name="multiply", arguments={"a": a, "b": b})])
    before = chat.render(msgs, box.schemas(), add_generation_prompt=True)
    turn = chat.render(msgs + [call], box.schemas())[len(before):]
    turn = turn[: turn.index(chat.turn_end) + len(chat.turn_end)]
    ids = chat.encode_template(turn)
    add_response_schema(tok)
    parsed = parse_response(tok, ids, prefix=trl_ids, tools=[multiply])
    assert [c["function"] for c in parsed["tool_calls"]] == [{"name": "multiply", "arguments": {"a": a, "b": b}}]
    ours = chat.parse_assistant(turn, box.schemas()).tool_calls
    assert [(c.name, c.arguments) for c in ours] == [("multiply", {"a": a, "b": b})]

    result = asyncio.run(box.execute("multiply", {"a": a, "b": b}, box.new_context("t")))
    assert result.error is None and result.content == str(multiply(a=a, b=b)) == task.answer


def test_env_scores_and_demonstrations_encode(tok):
    from agentrl.run.demonstrations import encode_demonstration

    env = MultiplyEnv(seed=0, num_train=4, num_test=1)
    demo = env.demonstrations(1, seed=0)[0]
    task = next(t for t in env.tasks("train") if t.prompt == demo[1].content)
    assert env.score(task, demo).reward == 1.0
    enc = encode_demonstration(ChatTemplate(tok), demo, ToolBox(env.tools()).schemas())
    assert sum(enc.loss_mask) > 0 and len(enc.token_ids) == len(enc.loss_mask)
