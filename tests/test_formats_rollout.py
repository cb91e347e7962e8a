"""Multi-turn rollouts in the tool-call formats, including those whose call turn ends with a token of its own (gpt-oss
``<|call|>``, ...): the sampled ids plus the appended tool turns must be exactly the template's
rendering of the conversation, token for token.

Uses the real templates shipped in the ``trl`` package (a test-only dependency) over the
Qwen2.5 tokenizer fixture, with each template's markers added as special tokens (as the
family's own tokenizer has them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.engines.scripted import ScriptedEngine
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.toolbox import ToolBox, tool
from agentrl.types import Message, Task, ToolCall
from fixture_paths import QWEN25

trl_spec = pytest.importorskip("importlib.util").find_spec("trl")
CORPUS = Path(trl_spec.origin).parent / "chat_templates" if trl_spec else None
MARKER_RE = re.compile(r"<\|[^|<>\s]{1,40}\|>|<\|[A-Za-z_\"]{1,40}>|<[A-Za-z_]{1,40}\|>")


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


def _tokenizer_for(source: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(QWEN25)
    tok.add_special_tokens({"additional_special_tokens": sorted(set(MARKER_RE.findall(source)))})
    return tok


def _sampled_turn(chat: ChatTemplate, before: list[Message], turn: Message, tools) -> str:
    """What a model of the family samples for ``turn``: the template's own rendering of it,
    from after the generation prompt through the marker that ends it."""
    prompt = chat.render(before, tools, add_generation_prompt=True)
    full = chat.render([*before, turn], tools)
    assert full.startswith(prompt)
    text = full[len(prompt):]
    ends = [text.find(m) + len(m) for m in (*chat.format.stop_tokens, chat.turn_end) if m in text]
    return text[: min(ends)]


@pytest.mark.skipif(CORPUS is None, reason="needs trl's chat templates: pip install trl (make test installs it)")
@pytest.mark.parametrize("name, fmt", [("gptoss.jinja", "harmony"), ("gemma4.jinja", "gemma4"), ("qwen2_5.jinja", "hermes"),
                                       ("llama3_1.jinja", "llama3_json"), ("qwen3_6.jinja", "qwen_xml")])
def test_call_turn_closed_by_its_own_token_continues_exactly(name: str, fmt: str) -> None:
    source = (CORPUS / name).read_text()
    tok = _tokenizer_for(source)
    chat = ChatTemplate(tok, str(CORPUS / name))
    assert chat.tool_call_format == fmt
    box = ToolBox([add], tokenizer=tok)
    tools = box.schemas()
    user = [Message("user", "What is 2+3?")]
    call = Message("assistant", "", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])
    answer = Message("assistant", "The answer is 5.")
    turns = [_sampled_turn(chat, user, call, tools),
             _sampled_turn(chat, [*user, call, Message("tool", "5", tool_call_id=None, name="add")], answer, tools)]
    engine = ScriptedEngine([tok.encode(t, add_special_tokens=False) for t in turns])
    runner = RolloutRunner(engine, chat, box, RolloutConfig(max_turns=3, answer_pattern="answer"))
    (traj,) = runner.run([Task(id="q", prompt="What is 2+3?", answer="5")], 1).trajectories
    traj.check()
    assert traj.finish_reason == "stop", traj.metadata
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.messages[1].tool_calls[0].arguments == {"a": 2, "b": 3} and traj.messages[2].content == "5"
    assert traj.messages[3].content.endswith("The answer is 5.")  # reasoning, if any, stays in content
    rendered = chat.render(traj.messages, tools)
    assert tok.decode(traj.token_ids) in (rendered, rendered.rstrip("\n"))
