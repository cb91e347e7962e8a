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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.chat.template import TemplateError, content_forms, prefix_diff, resolve_template_source, template_renderer
from agentrl.chat.formats import FormatDetectionError, chat_messages, detect_format
from agentrl.chat.formats.roundtrip import RoundTrip, round_trip_all
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
    tool_call_format: str = ""  # the format the template's calls were detected as ("" when none)


def _call(name: str, args: dict, n: int) -> ToolCall:
    return ToolCall(name, args, id=f"call{n:05d}")  # 9 characters: Mistral templates require it


def _tool(content: str, call: ToolCall) -> Message:
    return Message("tool", content, tool_call_id=call.id, name=call.name)


def _stages(parallel: bool, system: bool = True) -> list[tuple[str, list[Message], list[Message]]]:
    """(stage name, conversation so far, tool messages appended) for the standard conversation:
    system, user, one call, its result, two parallel calls (or two single-call turns), results, answer."""
    c1 = _call("calculator", {"expression": "17 * 23"}, 1)
    c2 = _call("search", {"query": "capital of France"}, 2)
    c3 = _call("calculator", {"expression": "391 + 1"}, 3)
    convo = [Message("system", "You are a careful assistant.")] * system + [
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


def _suggest_fix(source: str, fmt: str, before: str, after: str, eos: str | None) -> str:
    closed = before.rstrip()
    if eos and closed.endswith(eos) and after.startswith(closed[:-len(eos)]):  # only the trailing eos differs
        return (f"the template ends the conversation with eos_token ({eos!r}) after a final assistant message and "
                "drops it once more messages follow (Phi-3 style; TRL's phi3_training.jinja does the same): the "
                "turn's own formatting is stable. Use a copy of the template without that trailing "
                "`{{ eos_token }}` (the model's sampled end token closes its turns) and pass it with --template FILE")
    if fmt == "hermes" and "<|im_start|>" in source and "<think>" in source:
        return ("this is a Qwen3-style template that inserts an empty <think></think> block into the last "
                "assistant turn and drops it once tool messages follow; use --template qwen3_training "
                "(agentrl/templates/qwen3_training.jinja): same tokens, renders assistant turns as written")
    if fmt == "hermes" and "<|im_start|>" in source:
        return "use --template hermes (agentrl/templates/hermes.jinja), a prefix-preserving Qwen2.5-style template"
    return ("use a template whose rendering of earlier turns does not depend on what follows them (no "
            "`loop.last` special cases for assistant turns), e.g. agentrl/templates/hermes.jinja as a model, "
            "and pass it with --template FILE")


def _renderer(tokenizer: Any, source: str, json_arguments: bool, **template_kwargs: Any):
    render = template_renderer(tokenizer, source, **template_kwargs)

    def run(messages: list[Message], add_generation_prompt: bool = False) -> str:
        try:
            return render(chat_messages(messages, json_arguments), _TOOLS, add_generation_prompt)
        except Exception as e:  # jinja errors and raise_exception() calls of the template itself
            raise TemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from e
    return run


def _adapt(tokenizer: Any, source: str, template_kwargs: dict[str, Any]):
    """The first of: with/without a system message x parallel/single calls x object/JSON-string
    arguments under which the standard conversation renders; notes say what was given up and
    which error made it necessary. None (and the first error) when nothing renders."""
    failed: dict[tuple[bool, bool, bool], str] = {}
    for system in (True, False):
        for parallel in (True, False):
            for as_json in (False, True):
                run = _renderer(tokenizer, source, as_json, **template_kwargs)
                stages = _stages(parallel, system)
                try:
                    run(stages[-1][1])
                except TemplateError as e:
                    failed[(system, parallel, as_json)] = str(e)
                    continue
                notes = []
                if not system:
                    notes.append(f"the template rejects a system message ({failed[(True, parallel, as_json)]}), so "
                                 "the check used none")
                if not parallel:
                    notes.append(f"the template rejects two tool calls in one turn ({failed[(system, True, as_json)]}), "
                                 "so the check used one call per turn")
                if as_json:
                    notes.append(f"the template rejects tool-call arguments given as objects "
                                 f"({failed[(system, parallel, False)]}), so the check passed them as JSON strings "
                                 "(DeepSeek-V3 style); ChatTemplate passes objects, so rollouts need a variant that "
                                 "accepts them (e.g. TRL's deepseekv3_training.jinja)")
                return run, stages, "; ".join(notes), ""
    return None, _stages(True), "", next(iter(failed.values()))


def _calls_note(tokenizer: Any, source: str, template_kwargs: dict[str, Any]) -> tuple[str, str]:
    """(detected tool-call format, note) from rendering a known call and reading it back."""
    try:
        return detect_format(template_renderer(tokenizer, source, **template_kwargs)), ""
    except FormatDetectionError as e:
        if "does not render the assistant's tool calls" in str(e):
            return "", ("the template does not render the assistant's tool calls; harmless for token-in-token-out "
                        "rollouts (the sampled ids are kept), but the model may not have been trained for this "
                        "tool-call format")
        return "", f"tool calls: {e}"


def check_prefix_preservation(tokenizer: Any, template: str | None = None,
                              template_kwargs: dict[str, Any] | None = None) -> TemplateCheck:
    """Check that appending tool messages only extends the rendering, at every tool step of a
    standard tool conversation, and detect the template's tool-call format. Templates that
    reject parallel calls get one call per turn, those that reject a system message none, and
    those that need JSON-string arguments get them; the notes say which and why.

    >>> from transformers import AutoTokenizer
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    >>> check = check_prefix_preservation(tok, "hermes")
    >>> check.passed, check.tool_call_format
    (True, 'hermes')
    """
    source = resolve_template_source(tokenizer, template)
    kwargs = dict(template_kwargs or {})
    fmt, calls_note = _calls_note(tokenizer, source, kwargs)
    run, stages, notes, error = _adapt(tokenizer, source, kwargs)
    if run is None:
        return TemplateCheck(False, stages[0][0], error, "the template cannot render a standard tool conversation "
                             "(roles system/user/assistant with tool_calls/tool); use a tool-capable template "
                             "(--template FILE)", calls_note, fmt)
    for stage, convo, new in stages:
        try:
            before = run(convo)
            after = run(convo + new, True)
        except TemplateError as e:
            return TemplateCheck(False, stage, str(e), "the template cannot render a standard tool conversation "
                                 "(roles system/user/assistant with tool_calls/tool); use a tool-capable template "
                                 "(--template FILE)", notes, fmt)
        if not after.startswith(before):
            eos = getattr(tokenizer, "eos_token", None)
            return TemplateCheck(False, stage, prefix_diff(before, after, "render(conversation)",
                                 "render(conversation + tool messages, add_generation_prompt=True)"),
                                 _suggest_fix(source, fmt, before, after, eos), notes, fmt)
        delta = after[len(before):]
        missing = [m.content for m in new if not any(f in delta for f in content_forms(m.content))]
        if missing:
            return TemplateCheck(False, stage, f"the tool results {missing} do not appear in the rendering",
                                 "the template drops tool results, so the model would never see them; "
                                 "use a tool-capable template (--template FILE)", notes, fmt)
    try:
        run(stages[-1][1] + stages[-1][2] + [_FINAL])
    except TemplateError as e:
        return TemplateCheck(False, "final answer after tool results", str(e),
                             "the template cannot render a final answer after tool results", notes, fmt)
    return TemplateCheck(True, "", "", "", "; ".join(filter(None, [notes, calls_note])), fmt)


def run_check_template(model_or_dir: str, template: str | None) -> int:
    """Body of ``agentrl check-template MODEL_OR_DIR [--template FILE]``; prints PASS or FAIL.

    ``MODEL_OR_DIR`` is named as for ``train`` and ``serve``: a directory, ``tiny``, ``smollm2``
    or a ``.gguf`` file, or a hub name (read from the local Hugging Face cache; the hub is
    asked only when it answers, so offline an uncached name fails in seconds).
    Returns the exit code: 0 when the template is prefix-preserving, 1 otherwise (or on error).
    """
    from transformers import AutoTokenizer

    from agentrl.models.names import ModelNotLocal, from_pretrained

    shown, model_or_dir = model_or_dir, _resolved(model_or_dir)
    hint = ("Without network access, pass a local directory that holds the tokenizer files "
            "(tokenizer_config.json with tokenizer.json or vocab.json/merges.txt), or tiny.")
    if model_or_dir.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(model_or_dir)):
        print(f"error: no such directory {model_or_dir!r}. {hint}")
        return 1
    try:  # local directory or hub cache first: no network round trips when offline
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(model_or_dir), local_files_only=True)
    except Exception as local_error:
        if os.path.isdir(os.path.expanduser(model_or_dir)):
            print(f"error: cannot load a tokenizer from directory {model_or_dir!r}: {_first_line(local_error)}. {hint}")
            return 1
        try:  # the hub, when it can be asked
            tokenizer = from_pretrained(AutoTokenizer, model_or_dir, pass_as="the directory DIR")
        except ModelNotLocal as e:
            print(f"error: cannot load a tokenizer for model id {model_or_dir!r}: {e}")
            return 1
        except Exception as e:  # unknown model ids, gated repositories
            print(f"error: cannot load a tokenizer for model id {model_or_dir!r}: {_first_line(e)}. {hint}")
            return 1
    try:
        check = check_prefix_preservation(tokenizer, template)
    except TemplateError as e:
        print(f"error: {e}")
        return 1
    name = template or f"the chat template of {shown}"
    if check.passed:
        print(f"PASS: {name} is prefix-preserving under tool appends")
        if check.tool_call_format:
            print(f"tool calls: {check.tool_call_format} format, detected (a run can name another: "
                  f"model.tool_call_format=NAME in its config, or `agentrl train CONFIG model.tool_call_format=NAME`)")
        if check.notes:
            print(f"note: {check.notes}")
        return 0
    print(f"FAIL: {name} is not usable for token-in-token-out rollouts\nstage: {check.stage}\n{check.diff}")
    if check.notes:
        print(f"note: {check.notes}")
    print(f"fix: {check.fix}")
    return 1


def _resolved(model_or_dir: str) -> str:
    """The directory of a shortcut (``tiny``; ``smollm2`` or a ``.gguf`` file, converted on first
    use), so the tokenizer checked is the one training loads; anything else unchanged."""
    from agentrl.models.names import resolve_shortcut

    return resolve_shortcut(model_or_dir)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


# --- a folder of templates ------------------------------------------------------------------------

@dataclass
class CorpusRow:
    """One template of ``check_corpus``."""

    template: str  # file name
    check: TemplateCheck
    round_trips: list[RoundTrip] = field(default_factory=list)  # empty when no format was detected
    reasoning: str = ""  # what the template does with a <think> block in assistant content

    @property
    def round_trip(self) -> str:
        """"k/n" of the cases the template could render, "-" when there was nothing to parse."""
        rendered = [r for r in self.round_trips if r.rendered]
        return f"{sum(r.passed for r in rendered)}/{len(rendered)}" if rendered else "-"


def reasoning_handling(tokenizer: Any, source: str, **template_kwargs: Any) -> str:
    """What the template does with ``<think>`` blocks written in assistant content (how the
    rollout stores them): kept in every turn, dropped from earlier turns, or dropped; and
    whether it adds a reasoning block to a turn that has none."""
    render = template_renderer(tokenizer, source, **template_kwargs)
    turns = [Message("user", "U1"), Message("assistant", "<think>\nRzeroA\n</think>\n\nA1"),
             Message("user", "U2"), Message("assistant", "<think>\nRzeroB\n</think>\n\nA2")]
    try:
        text = render(chat_messages(turns), None, False)
        prompt = render(chat_messages(turns[:1]), None, True)
        plain = render(chat_messages(turns[:1] + [Message("assistant", "A1")]), None, False)[len(prompt):]
    except Exception as e:  # templates that reject plain string content (VLM templates) or this role order
        return f"not rendered ({type(e).__name__})"
    kept = {"RzeroA" in text, "RzeroB" in text}
    how = {(True,): "kept in every turn", (False,): "dropped"}.get(tuple(kept), "dropped from earlier turns")
    if "RzeroB" not in text and "RzeroA" in text:
        how = "dropped from the last turn"
    added = [tag for tag in ("<think>", "<|channel>thought", "<|channel|>analysis") if tag in plain]
    return how + (f"; adds an empty {added[0]} block" if added else "")


def check_corpus(directory: str | Path, tokenizer: Any) -> list[CorpusRow]:
    """``check_prefix_preservation``, format detection, round trips and reasoning handling for
    every ``*.jinja`` file of ``directory``, rendered with ``tokenizer``'s special tokens."""
    # templates of other families print bos_token; a tokenizer without one would make them fail
    kwargs = {} if getattr(tokenizer, "bos_token", None) else {"bos_token": ""}
    rows = []
    for path in sorted(Path(directory).glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        check = check_prefix_preservation(tokenizer, source, kwargs)
        render = template_renderer(tokenizer, source, **kwargs)
        trips = round_trip_all(render, check.tool_call_format) if check.tool_call_format else []
        rows.append(CorpusRow(path.name, check, trips, reasoning_handling(tokenizer, source, **kwargs)))
    return rows


def corpus_line(row: CorpusRow) -> str:
    """One line: template, PASS/FAIL (stage), format, round trip, reasoning, first note."""
    verdict = "PASS" if row.check.passed else f"FAIL ({row.check.stage})"
    note = row.check.notes.split("; ")[0][:90] if row.check.notes else ""
    return (f"{row.template:40} {verdict:48} {row.check.tool_call_format or '-':12} round-trip {row.round_trip:5} "
            f"reasoning: {row.reasoning}" + (f"  note: {note}" if note else ""))


def run_check_corpus(directory: str, model_or_dir: str) -> int:
    """Body of a ``check-template --corpus DIR`` mode: one line per template of ``DIR``,
    rendered with the tokenizer of ``model_or_dir``. Returns 0 when every template passes."""
    from transformers import AutoTokenizer

    if not os.path.isdir(directory):
        print(f"error: no such directory {directory!r}: pass a folder of .jinja chat templates")
        return 1
    from agentrl.models.names import from_pretrained

    tokenizer = from_pretrained(AutoTokenizer, os.path.expanduser(_resolved(model_or_dir)), pass_as="the directory DIR")
    rows = check_corpus(directory, tokenizer)
    for row in rows:
        print(corpus_line(row))
    print(f"{sum(r.check.passed for r in rows)}/{len(rows)} prefix-preserving; "
          f"{sum(bool(r.check.tool_call_format) for r in rows)} with a detected tool-call format")
    return 0 if all(r.check.passed for r in rows) else 1
