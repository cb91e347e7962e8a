"""What every tool-call format shares: the parse result, the format record, argument helpers.

A format turns the text a model sampled into tool calls. Parsing never raises: a call the
model wrote badly comes back as an error string, which the rollout shows the model as an
``Error: ...`` observation (docs/design.md convention 4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrl.types import TokenSequence, ToolCall

ToolSchemas = list[dict[str, Any]] | None  # OpenAI tool schemas, as passed to chat templates


@dataclass
class ParsedTurn:
    """An assistant turn split into text and tool calls."""

    content: str  # the text with the tool-call blocks removed (stripped)
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed call block


@dataclass(frozen=True)
class Pause:
    """A mid-turn format's decision at one of its stops."""

    call: ToolCall | None = None  # run this now, append its observation, resume the turn; None: just resume
    end_attempt: bool = False  # the turn cannot go on (the model invented a result): a void turn ends the attempt


Decode = Callable[[list[int]], str]  # token ids -> text, special tokens kept


class MidTurnState:
    """One assistant turn of a mid-turn format, owned by the format: the rollout makes one per
    turn (``MidTurn.start``), asks :meth:`pause` at every stop, and reads the turn's calls and
    model text for the assistant message. A format subclasses it with :meth:`decide` and
    :meth:`observation`, and keeps whatever else it needs between pauses on ``self``.

    >>> from agentrl.types import TokenSequence
    >>> class Shout(MidTurnState):  # "word!" runs the tool ``upper`` on the word
    ...     def decide(self, turn_text):
    ...         return Pause(ToolCall("upper", {"text": turn_text.rstrip("!").split()[-1]}))
    ...     def observation(self, output):
    ...         return f" [{output}] "
    >>> fmt = MidTurn(tool="upper", stop_strings=("!",), state=Shout)
    >>> seq, ids = TokenSequence(), lambda text: [ord(c) for c in text]  # one token per character
    >>> seq.append(ids("Q:"), "prompt")
    >>> turn = fmt.start(seq, lambda t: "".join(map(chr, t)))
    >>> seq.append(ids("say hi!"), "model", [0.0] * 7)
    >>> turn.pause(ids("say hi!")).call.arguments
    {'text': 'hi'}
    >>> seq.append(ids(turn.observation("HI")), "tool")
    >>> seq.append(ids("done"), "model", [0.0] * 4)
    >>> turn.model_text(), [c.name for c in turn.calls]
    ('say hi!done', ['upper'])
    """

    def __init__(self, mid: MidTurn, seq: TokenSequence, decode: Decode):
        self.mid, self.seq, self.decode = mid, seq, decode
        self.start = len(seq)  # made before the turn's first sampled ids are appended
        self.calls: list[ToolCall] = []  # the calls run inside this turn, for its assistant message

    def pause(self, sampled: list[int]) -> Pause | None:
        """The decision at a stop that ended ``sampled`` (the ids just generated), its call
        recorded in ``calls``; None when none of the format's stop strings ended them (a
        user's stop string did, and the turn ends as usual)."""
        tail = self.decode(sampled[-16:])  # a stop string ends in the last few tokens
        if not any(s in tail for s in self.mid.stop_strings):
            return None
        decision = self.decide(self.decode(self.seq.token_ids[self.start:]))
        if decision.call is not None:
            self.calls.append(decision.call)
        return decision

    def decide(self, turn_text: str) -> Pause:
        """What the turn's text so far (model and tool tokens since it began, decoded) calls for."""
        raise NotImplementedError

    def observation(self, output: str) -> str:
        """The text appended as tool tokens after the last decision's call returned ``output``."""
        raise NotImplementedError

    def model_text(self, end: int | None = None) -> str:
        """The model's own text of the turn up to ``end`` (default: all of it): the observations
        inside it are left out, so a checker never reads an answer the model only saw printed."""
        end = len(self.seq) if end is None else end
        parts = [self.seq.token_ids[max(s.start, self.start):min(s.end, end)]
                 for s in self.seq.spans if s.kind == "model" and s.end > self.start]
        return "".join(self.decode(p) for p in parts if p)


@dataclass(frozen=True)
class MidTurn:
    """A format whose calls run inside the assistant turn (tool-integrated reasoning): the
    rollout pauses generation on ``stop_strings``, and the turn's ``state`` (a
    :class:`MidTurnState` subclass, one per turn) decides what each stop calls for; calls run in
    the tool named ``tool``, their observations go in as tool tokens and the same turn goes on.
    ``tool_hint`` says where to get that tool. See :mod:`agentrl.chat.formats.code_block`."""

    tool: str
    stop_strings: tuple[str, ...]
    state: type[MidTurnState]
    tool_hint: str = ""

    def start(self, seq: TokenSequence, decode: Decode) -> MidTurnState:
        """The state of a turn about to be sampled onto ``seq``."""
        return self.state(self, seq, decode)


@dataclass(frozen=True)
class ToolCallFormat:
    """One tool-call syntax: its parser and the stop tokens that end a call turn.

    ``stop_tokens`` are the tokens, besides the template's end-of-turn token and the
    tokenizer's eos, after which a model that wrote calls stops to wait for their results
    (gpt-oss ``<|call|>``, GLM ``<|observation|>``); the chat template adds those the
    tokenizer has to its stop ids.
    """

    name: str
    description: str  # the syntax, as one line of the docs table
    parse: Callable[[str, ToolSchemas], ParsedTurn]
    stop_tokens: tuple[str, ...] = ()
    families: str = ""  # model families known to use it
    mid_turn: MidTurn | None = None  # set when calls run inside the turn instead of ending it
    # How a call of ``{name}`` opens, through the name, up to its arguments: one form per
    # syntax its templates write. A forced call (OpenAI ``tool_choice`` "required" or a named
    # function) writes the template's own rendering up to the end of the form it renders
    # (``agentrl.serve.service.ForcedCall``); none (mid-turn formats): no forced calls.
    call_openings: tuple[str, ...] = ()

    def opening(self, form: str, name: str) -> str:
        """``form`` (one of ``call_openings``) for the function ``name``.

        >>> from agentrl.chat.formats import get_format
        >>> get_format("hermes").opening(get_format("hermes").call_openings[0], "add")
        '<tool_call>\\n{"name": "add", "arguments": '
        """
        return form.replace("{name}", name)


def add_json_call(obj: Any, where: str, calls: list[ToolCall], errors: list[str]) -> None:
    """Append the call ``obj`` (``{"name": ..., "arguments"|"parameters": {...}}``) or an error."""
    if not isinstance(obj, dict):
        errors.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
        return
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f'{where}: missing "name"')
        return
    args = obj.get("arguments", obj.get("parameters", {}))
    checked = json_arguments(args, where, errors)
    if checked is not None:
        calls.append(ToolCall(name=name, arguments=checked, id=obj.get("id") if isinstance(obj.get("id"), str) else None))


def json_arguments(args: Any, where: str, errors: list[str]) -> dict[str, Any] | None:
    """``args`` as an argument object, or None after recording why it is not one."""
    if isinstance(args, str):  # some models JSON-encode the arguments a second time
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            errors.append(f'{where}: "arguments" is a string that is not JSON')
            return None
    if not isinstance(args, dict):
        errors.append(f'{where}: "arguments" must be a JSON object, got {type(args).__name__}')
        return None
    return args


def parameter_schemas(tools: ToolSchemas, name: str) -> dict[str, Any]:
    """The JSON-schema ``properties`` of tool ``name`` ({} when unknown)."""
    for tool in tools or []:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            return dict((fn.get("parameters") or {}).get("properties") or {})
    return {}


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter value written as bare text (XML-style formats write strings unquoted and
    everything else as JSON). The tool's schema decides when it says "string"; without one,
    text that parses as JSON is taken as JSON, so a string such as "391" comes back as 391."""
    kind = (schema or {}).get("type")
    if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
        return raw
    if kind == "boolean" and raw in ("True", "False"):  # Qwen3.5 writes Python's str(bool)
        return raw == "True"
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        return raw
