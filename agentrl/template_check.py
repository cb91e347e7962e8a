"""Fail fast on chat templates that break token-in-token-out rollouts (docs/design.md convention 6).

A rollout appends ids and never re-renders earlier turns, so the one property a template
needs is *prefix preservation under tool appends*:

    render(conversation)  is a prefix of  render(conversation + tool messages, add_generation_prompt=True)

for a conversation that ends with an assistant tool-call turn. Otherwise the ids the rollout
holds (built from the shorter rendering) differ from what the template says the model should
see next, and the trainer scores a sequence the model would never be shown at inference.

Not checked, on purpose: whether ``render(prefix, add_generation_prompt=True)`` is a prefix of
``render(prefix + assistant)``. The assistant turn's ids are the sampled ids themselves; the
template's re-rendering of that turn (reformatted tool-call JSON, a dropped think block) is
never tokenized, so a mismatch there cannot reach the training sequence.

Example::

    check = check_prefix_preservation(tokenizer, "qwen3_training")
    assert check.passed, check.diff + check.fix
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agentrl.chat import TemplateError, content_forms, prefix_diff, render_chat, resolve_template_source
from agentrl.types import Message, ToolCall

_TOOLS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]


@dataclass
class TemplateCheck:
    """Outcome of check_prefix_preservation."""

    passed: bool
    stage: str  # the append that broke it ("" when passed)
    diff: str  # where the renderings diverge ("" when passed)
    fix: str  # what to do about it ("" when passed)
    notes: str = ""  # adaptations made to the test conversation (e.g. one call per turn)


def _call(name: str, args: dict, n: int) -> ToolCall:
    return ToolCall(name, args, id=f"call{n:05d}")  # 9 characters: Mistral templates require it


def _tool(content: str, call: ToolCall) -> Message:
    return Message("tool", content, tool_call_id=call.id, name=call.name)


def _stages(parallel: bool) -> list[tuple[str, list[Message], list[Message]]]:
    """(stage name, conversation so far, tool messages appended) for the standard conversation:
    system, user, one call, its result, two parallel calls (or two single-call turns), results, answer."""
    c1 = _call("calculator", {"expression": "17 * 23"}, 1)
    c2 = _call("search", {"query": "capital of France"}, 2)
    c3 = _call("calculator", {"expression": "391 + 1"}, 3)
    convo = [Message("system", "You are a careful assistant."),
             Message("user", "What is 17 * 23, and what is the capital of France?"),
             Message("assistant", "", [c1])]
    stages = [("tool message after a tool-call turn", list(convo), [_tool("391", c1)])]
    convo += stages[0][2]
    if parallel:
        convo.append(Message("assistant", "", [c2, c3]))
        stages.append(("two tool messages after a parallel tool-call turn", list(convo),
                       [_tool("Paris is the capital of France.", c2), _tool("392", c3)]))
    else:
        convo.append(Message("assistant", "", [c2]))
        stages.append(("second tool turn", list(convo), [_tool("Paris is the capital of France.", c2)]))
        convo += stages[-1][2] + [Message("assistant", "", [c3])]
        stages.append(("third tool turn", list(convo), [_tool("392", c3)]))
    return stages


_FINAL = Message("assistant", "17 * 23 = 391, and the capital of France is Paris.")


def _suggest_fix(source: str) -> str:
    if "<|im_start|>" in source and "<tool_call>" in source and "<think>" in source:
        return ("this is a Qwen3-style template that inserts an empty <think></think> block into the last "
                "assistant turn and drops it once tool messages follow; use --template qwen3_training "
                "(agentrl/templates/qwen3_training.jinja): same tokens, renders assistant turns as written")
    if "<|im_start|>" in source and "<tool_call>" in source:
        return "use --template hermes (agentrl/templates/hermes.jinja), a prefix-preserving Qwen2.5-style template"
    return ("use a template whose rendering of earlier turns does not depend on what follows them (no "
            "`loop.last` special cases for assistant turns), e.g. agentrl/templates/hermes.jinja as a model, "
            "and pass it with --template FILE")


def check_prefix_preservation(tokenizer: Any, template: str | None = None) -> TemplateCheck:
    """Check that appending tool messages only extends the rendering, at every tool step of a
    standard tool conversation. Templates that reject parallel calls get one call per turn.

    >>> from transformers import AutoTokenizer
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    >>> check_prefix_preservation(tok, "hermes").passed
    True
    """
    source = resolve_template_source(tokenizer, template)
    notes = ""
    try:
        render_chat(tokenizer, source, _stages(True)[-1][1], _TOOLS)
        stages = _stages(True)
    except TemplateError as e:
        stages = _stages(False)
        notes = f"the template rejects two tool calls in one turn, so the check used one call per turn ({e})"
    for stage, convo, new in stages:
        try:
            before = render_chat(tokenizer, source, convo, _TOOLS)
            after = render_chat(tokenizer, source, convo + new, _TOOLS, add_generation_prompt=True)
        except TemplateError as e:
            return TemplateCheck(False, stage, str(e), "the template cannot render a standard tool conversation "
                                 "(roles system/user/assistant with tool_calls/tool); use a tool-capable template "
                                 "(--template FILE)", notes)
        if not after.startswith(before):
            return TemplateCheck(False, stage, prefix_diff(before, after, "render(conversation)",
                                 "render(conversation + tool messages, add_generation_prompt=True)"),
                                 _suggest_fix(source), notes)
        delta = after[len(before):]
        missing = [m.content for m in new if not any(f in delta for f in content_forms(m.content))]
        if missing:
            return TemplateCheck(False, stage, f"the tool results {missing} do not appear in the rendering",
                                 "the template drops tool results, so the model would never see them; "
                                 "use a tool-capable template (--template FILE)", notes)
    try:
        final = render_chat(tokenizer, source, stages[-1][1] + stages[-1][2] + [_FINAL], _TOOLS)
    except TemplateError as e:
        return TemplateCheck(False, "final answer after tool results", str(e),
                             "the template cannot render a final answer after tool results", notes)
    if '"17 * 23"' not in final:
        notes = "; ".join(filter(None, [notes, "the template does not render the assistant's tool calls; harmless "
                                        "for token-in-token-out rollouts (the sampled ids are kept), but the model "
                                        "may not have been trained for this tool-call format"]))
    return TemplateCheck(True, "", "", "", notes)


def run_check_template(model_or_dir: str, template: str | None) -> int:
    """Body of ``agentrl check-template MODEL_OR_DIR [--template FILE]``; prints PASS or FAIL.

    Returns the exit code: 0 when the template is prefix-preserving, 1 otherwise (or on error).
    """
    from transformers import AutoTokenizer

    hint = ("Without network access, pass a local directory that holds the tokenizer files "
            "(tokenizer_config.json with tokenizer.json or vocab.json/merges.txt).")
    if model_or_dir.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(model_or_dir)):
        print(f"error: no such directory {model_or_dir!r}. {hint}")
        return 1
    try:  # local directory or hub cache first: no network round trips when offline
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(model_or_dir), local_files_only=True)
    except Exception as local_error:
        if os.path.isdir(os.path.expanduser(model_or_dir)):
            print(f"error: cannot load a tokenizer from directory {model_or_dir!r}: {_first_line(local_error)}. {hint}")
            return 1
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_or_dir)
        except Exception as e:  # offline hub lookups, unknown model ids
            print(f"error: cannot load a tokenizer for model id {model_or_dir!r}: {_first_line(e)}. {hint}")
            return 1
    try:
        check = check_prefix_preservation(tokenizer, template)
    except TemplateError as e:
        print(f"error: {e}")
        return 1
    name = template or f"the chat template of {model_or_dir}"
    if check.passed:
        print(f"PASS: {name} is prefix-preserving under tool appends")
        if check.notes:
            print(f"note: {check.notes}")
        return 0
    print(f"FAIL: {name} is not usable for token-in-token-out rollouts\nstage: {check.stage}\n{check.diff}")
    if check.notes:
        print(f"note: {check.notes}")
    print(f"fix: {check.fix}")
    return 1


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
