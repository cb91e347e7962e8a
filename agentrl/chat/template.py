"""Chat templates for token-in-token-out multi-turn rollouts.

The rollout keeps the ids the engine sampled and only ever *appends* ids. This module says
which ids to append after a sampled assistant turn so that the sequence continues exactly as
the chat template would render the conversation, with tool output tokenized as literal text
(docs/design.md conventions 1 and 4).

Example (Qwen2.5-style tokenizer)::

    tmpl = ChatTemplate(tokenizer, "hermes")
    prompt = tmpl.encode_prompt([Message("user", "2+2?")], tools=None)
    turn = tmpl.parse_assistant(sampled_text)            # content + tool calls
    segs = tmpl.continuation(history, tool_messages, tools, sampled_end=tmpl.turn_end)
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from agentrl.chat.formats import FORMATS, FormatDetectionError, Renderer, detect_format, get_format
from agentrl.chat.formats.base import ParsedTurn, ToolSchemas
from agentrl.chat.formats.hermes import parse_hermes  # noqa: F401  (re-exported: agentrl.chat.parse_hermes)
from agentrl.chat.formats.lenient import LENIENT_FORMATS, lenient
from agentrl.chat.formats.llama3_json import parse_llama3_json  # noqa: F401  (re-exported)
from agentrl.types import Message

TOOL_CALL_FORMATS = tuple(FORMATS)  # agentrl/chat/formats: hermes, llama3_json, qwen_xml, glm4, harmony...
_PLACEHOLDER = "AgentrlPh{}Z"  # survives tojson, trim and string concatenation unchanged
_PLACEHOLDER_RE = re.compile(r"AgentrlPh(\d+)Z")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_PROBE_USER, _PROBE_ASSISTANT = "AgentrlProbeUser", "AgentrlProbeAssistant"


class TemplateError(Exception):
    """The chat template cannot be used for token-in-token-out rollouts (message says why)."""


@dataclass
class Segment:
    """Ids to append, all of one span kind ("template" or "tool")."""

    token_ids: list[int]
    kind: str


def encode_literal(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text: no special or added token is ever matched.

    Fast tokenizers: the added vocabulary is bypassed (pre-tokenizer, then the model per piece),
    because ``split_special_tokens`` does not protect non-special added tokens such as
    Qwen2.5's ``<tool_call>``. Unicode normalizers (NFC...) and space-prepending steps are
    skipped so that the ids decode to exactly ``text`` in the middle of a sequence. Lone
    surrogates, which no tokenizer accepts, become U+FFFD.

    >>> from transformers import AutoTokenizer
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(ensure_tiny_model())   # its special <|im_end|> is id 2
    >>> ids = encode_literal(tok, "<|im_end|>")
    >>> len(ids) > 1 and 2 not in ids   # several ordinary pieces, not the special token
    True
    >>> tok.decode(ids) == "<|im_end|>"
    True
    """
    if not text:
        return []
    text = _SURROGATE_RE.sub("\ufffd", text)  # lone surrogates (surrogateescape'd bytes) are not text
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        enc = tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return list(enc["input_ids"])
    normalized = _literal_normalizer(backend.normalizer)
    if normalized is not None:
        text = normalized.normalize_str(text)
    pre = _literal_pre_tokenizer(backend.pre_tokenizer)
    pieces = pre.pre_tokenize_str(text) if pre is not None else [(text, (0, len(text)))]
    return [tok.id for piece, _ in pieces for tok in backend.model.tokenize(piece)]


def _literal_normalizer(norm: Any) -> Any:
    """The normalizer minus Unicode normal forms and Prepend (see encode_literal)."""
    from tokenizers import normalizers as N

    if norm is None:
        return None
    dropped = (N.NFC, N.NFD, N.NFKC, N.NFKD, N.Prepend)
    if isinstance(norm, N.Sequence):
        kept = [norm[i] for i in range(len(norm)) if not isinstance(norm[i], dropped)]
        return N.Sequence(kept) if kept else None
    return None if isinstance(norm, dropped) else norm


def _literal_pre_tokenizer(pre: Any) -> Any:
    """Metaspace would prepend '▁' to the fragment as if it started the text; turn that off."""
    from tokenizers import pre_tokenizers as P

    if isinstance(pre, P.Metaspace) and pre.prepend_scheme != "never":
        return P.Metaspace(replacement=pre.replacement, prepend_scheme="never", split=pre.split)
    return pre


def resolve_template_source(tokenizer: Any, template: str | None) -> str:
    """Jinja source for ``template``: None (the tokenizer's), a shipped name, a path, or source."""
    if template is None:
        src = getattr(tokenizer, "chat_template", None)
        if isinstance(src, dict):
            src = src.get("tool_use") or src.get("default")
        if not src:
            raise TemplateError(
                "the tokenizer has no chat template; name one: model.template=hermes in the run config "
                "(or `agentrl train CONFIG model.template=hermes`), --template hermes for check-template and "
                "serve, ChatTemplate(tokenizer, 'hermes') in Python; shipped in agentrl/templates: hermes, "
                "hermes_compact, qwen3_training; a .jinja file path works too"
            )
        return src
    if "{{" in template or "{%" in template:
        return template
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return f.read()
    shipped = resources.files("agentrl.templates") / f"{template}.jinja"
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    names = sorted(p.name[:-6] for p in resources.files("agentrl.templates").iterdir() if p.name.endswith(".jinja"))
    raise TemplateError(f"unknown chat template {template!r}: not a file, not one of {names}, not jinja source")


def render_chat(tokenizer: Any, source: str, messages: list[Message], tools: list[dict] | None = None,
                add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
    """Render with transformers' own renderer so helpers (raise_exception, tojson...) match it."""
    try:
        return tokenizer.apply_chat_template(
            [m.to_chat() for m in messages], tools=tools, chat_template=source, tokenize=False,
            add_generation_prompt=add_generation_prompt, **template_kwargs)
    except Exception as e:  # jinja errors and raise_exception() calls of the template itself
        raise TemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from e


def prefix_diff(before: str, after: str, before_name: str = "before", after_name: str = "after") -> str:
    """Readable explanation of where ``after`` stops extending ``before`` ("" if it does)."""
    if after.startswith(before):
        return ""
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    if i - (line_start := before.rfind("\n", 0, i) + 1) <= 40:  # show whole tags, not '<t' vs '<think>'
        i = line_start
    line = before.count("\n", 0, i) + 1
    head = [f"renderings diverge at character {i} (line {line}):",
            f"  common text ends: {before[max(0, i - 60):i]!r}",
            f"  {before_name} continues: {before[i:i + 80]!r}",
            f"  {after_name} continues: {after[i:i + 80]!r}"]
    lo = max(0, before.rfind("\n", 0, max(0, i - 200)))
    udiff = difflib.unified_diff(before[lo:].splitlines(keepends=True), after[lo:len(before) + 200].splitlines(keepends=True),
                                 fromfile=before_name, tofile=after_name, n=2)
    return "\n".join(head) + "\n" + "".join(udiff)


def content_forms(content: str) -> list[str]:
    """How a template may have written ``content``: as is, JSON-escaped (tojson), trimmed."""
    forms = [content, json.dumps(content, ensure_ascii=False)[1:-1], content.strip(),
             json.dumps(content.strip(), ensure_ascii=False)[1:-1]]
    return list(dict.fromkeys(forms))


def split_rendered(real: str, with_placeholders: str, contents: list[str]) -> list[tuple[str, bool]] | None:
    """Split ``real`` into (text, is_content) pieces using a rendering whose contents were
    ``_PLACEHOLDER.format(i)``; None when the two renderings cannot be aligned."""
    pieces: list[str | int] = []
    pos = 0
    for m in _PLACEHOLDER_RE.finditer(with_placeholders):
        pieces += [with_placeholders[pos:m.start()], int(m.group(1))]
        pos = m.end()
    pieces.append(with_placeholders[pos:])
    seen = [p for p in pieces if isinstance(p, int)]
    if len(seen) != len(set(seen)) or any(i >= len(contents) for i in seen):
        return None

    def walk(k: int, at: int) -> list[tuple[str, bool]] | None:
        if k == len(pieces):
            return [] if at == len(real) else None
        piece = pieces[k]
        if isinstance(piece, str):
            rest = walk(k + 1, at + len(piece)) if real.startswith(piece, at) else None
            return None if rest is None else [(piece, False)] + rest
        for form in content_forms(contents[piece]):
            if real.startswith(form, at) and (rest := walk(k + 1, at + len(form))) is not None:
                return [(form, True)] + rest
        return None

    return walk(0, 0)


def template_renderer(tokenizer: Any, source: str, **template_kwargs: Any) -> Renderer:
    """``(chat messages, tools, add_generation_prompt) -> text`` with transformers' renderer."""
    def render(messages: list[dict[str, Any]], tools: ToolSchemas, add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **template_kwargs)
    return render


def detect_tool_call_format(source: str, tokenizer: Any, **template_kwargs: Any) -> str:
    """The tool-call format the template writes, found by rendering a known call and reading it
    back with every registered format (agentrl/chat/formats); raises TemplateError, naming the
    candidates and the ``tool_call_format=`` fix, unless exactly one format reads it.

    >>> from transformers import AutoTokenizer
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> detect_tool_call_format(resolve_template_source(None, "hermes"), AutoTokenizer.from_pretrained(ensure_tiny_model()))
    'hermes'
    """
    try:
        return detect_format(template_renderer(tokenizer, source, **template_kwargs))
    except FormatDetectionError as e:
        raise TemplateError(f"cannot tell the tool-call format from the chat template: {e}") from e


class ChatTemplate:
    """A chat template bound to a tokenizer, for token-in-token-out rollouts.

    >>> from transformers import AutoTokenizer
    >>> from agentrl.models.tiny import ensure_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    >>> tmpl = ChatTemplate(tok, "hermes")
    >>> tmpl.turn_end, tmpl.tool_call_format
    ('<|im_end|>', 'hermes')
    """

    def __init__(self, tokenizer: Any, template: str | None = None, tool_call_format: str | None = None,
                 template_kwargs: dict[str, Any] | None = None, lenient_tool_calls: bool = False):
        self.tokenizer = tokenizer
        self.source = resolve_template_source(tokenizer, template)
        self.template_kwargs = dict(template_kwargs or {})  # extra jinja variables (enable_thinking...)
        fmt = tool_call_format or detect_tool_call_format(self.source, tokenizer, **self.template_kwargs)
        if fmt not in TOOL_CALL_FORMATS:
            raise TemplateError(f"unknown tool_call_format {fmt!r} (model.tool_call_format); "
                                f"use one of {TOOL_CALL_FORMATS}")
        self.tool_call_format = fmt
        self.format = get_format(fmt)
        # model.lenient_tool_calls: bare and fenced JSON calls read too (agentrl/chat/formats/lenient.py)
        self.lenient_tool_calls = lenient_tool_calls
        if lenient_tool_calls:
            if fmt not in LENIENT_FORMATS:
                raise TemplateError(f"model.lenient_tool_calls reads bare JSON calls, which only the JSON formats "
                                    f"{LENIENT_FORMATS} write; the tool-call format here is {fmt!r}: set "
                                    "model.lenient_tool_calls=false")
            self.format = lenient(self.format)
        self.turn_end = self._detect_turn_end()
        self._turn_end_id = tokenizer.convert_tokens_to_ids(self.turn_end)
        eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        # the format's call-turn stop tokens (gpt-oss <|call|>...), where this tokenizer has them
        vocab = tokenizer.get_added_vocab()
        call_stops = [vocab[t] for t in self.format.stop_tokens if t in vocab]
        self.stop_token_ids = list(dict.fromkeys([self._turn_end_id, *eos_ids, *call_stops]))
        # stop id -> the marker it writes, for the ones that close a turn in the rendering
        self.turn_closers = {self._turn_end_id: self.turn_end,
                             **{vocab[t]: t for t in self.format.stop_tokens if t in vocab}}

    def _detect_turn_end(self) -> str:
        probe = [Message("user", _PROBE_USER), Message("assistant", _PROBE_ASSISTANT)]
        text = self.render(probe)
        after = text[text.rfind(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT):]
        added = sorted(self.tokenizer.get_added_vocab(), key=len, reverse=True)
        for tok in added:
            if after.startswith(tok):
                return tok
        raise TemplateError(f"cannot detect the end-of-turn token: after an assistant message the template "
                            f"renders {after[:40]!r}, which does not start with a special token of this tokenizer")

    def render(self, messages: list[Message], tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> str:
        return render_chat(self.tokenizer, self.source, messages, tools, add_generation_prompt, **self.template_kwargs)

    def encode_template(self, text: str) -> list[int]:
        """Ids of template text, special tokens parsed. The text is encoded after the turn-end
        token so that SentencePiece tokenizers do not prepend a word-start space to it."""
        if not text:
            return []
        ids = self.tokenizer.encode(self.turn_end + text, add_special_tokens=False)
        if not ids or ids[0] != self._turn_end_id:
            return self.tokenizer.encode(text, add_special_tokens=False)
        return ids[1:]

    def _segments(self, pieces: list[tuple[str, bool]], content_kind: str) -> list[Segment]:
        out: list[Segment] = []
        for text, is_content in pieces:
            ids = encode_literal(self.tokenizer, text) if is_content else self.encode_template(text)
            kind = content_kind if is_content else "template"
            if not ids:
                continue
            if out and out[-1].kind == kind:
                out[-1].token_ids.extend(ids)
            else:
                out.append(Segment(ids, kind))
        return out

    def encode_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Ids of ``render(messages, tools, add_generation_prompt=True)``; system/user/tool contents
        are literal text when they can be located (else the whole text is encoded as template)."""
        real = self.render(messages, tools, add_generation_prompt=True)
        literal = [i for i, m in enumerate(messages) if m.role in ("system", "user", "tool") and m.content]
        ph = [Message(m.role, _PLACEHOLDER.format(i), m.tool_calls, m.tool_call_id, m.name) if i in literal else m
              for i, m in enumerate(messages)]
        pieces = None
        try:
            ph_text = self.render(ph, tools, add_generation_prompt=True)
            pieces = split_rendered(real, ph_text, [m.content for m in messages])
        except TemplateError:
            pass
        if pieces is None:
            return self.encode_template(real)
        return [i for seg in self._segments(pieces, "prompt") for i in seg.token_ids]

    def continuation(self, history: list[Message], new_messages: list[Message], tools: list[dict] | None,
                     sampled_end: str | None) -> list[Segment]:
        """Segments to append after the sampled ids of the last assistant turn in ``history``.

        ``sampled_end`` is the marker the sampled turn ended with: the turn end, or a format's
        call-turn stop token (gpt-oss ``<|call|>``), or None (eos, a stop string). Appended:
        [turn_end when sampled_end is None] + the text after that marker in render(history)
        + delta, where delta = render(history + new_messages, gen=True)[len(render(history)):]
        with each new message's content as a literal "tool" segment."""
        before = self.render(history, tools)
        marker = sampled_end or self.turn_end
        cut = before.rfind(marker)
        if cut < 0:
            raise TemplateError(f"the rendering of the history has no {marker!r} closing the assistant turn")
        closing = ("" if sampled_end else self.turn_end) + before[cut + len(marker):]
        after = self.render(history + new_messages, tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError(
                "the chat template is not prefix-preserving: appending tool messages changed the rendering of "
                "the earlier conversation (run `agentrl check-template` for the fix)\n"
                + prefix_diff(before, after, "render(history)", "render(history + tool messages)"))
        ph = [Message(m.role, _PLACEHOLDER.format(i), m.tool_calls, m.tool_call_id, m.name)
              for i, m in enumerate(new_messages)]
        ph_after = self.render(history + ph, tools, add_generation_prompt=True)
        pieces = split_rendered(after[len(before):], ph_after[len(before):], [m.content for m in new_messages]) \
            if ph_after.startswith(before) else None
        if pieces is None:
            raise TemplateError("cannot locate the tool messages' contents in the template's rendering "
                                "(the template transforms them in an unsupported way)")
        return self._segments([(closing, False)] + pieces, "tool")

    def parse_assistant(self, text: str, tools: ToolSchemas = None) -> ParsedTurn:
        """Split a sampled assistant text into content and tool calls (``self.tool_call_format``).
        ``tools`` (the schemas) type the values of formats that write strings bare (qwen_xml,
        glm4, atem_xml); without them a value that reads as JSON is taken as JSON."""
        for stop in (self.turn_end, getattr(self.tokenizer, "eos_token", None), *self.format.stop_tokens):
            if stop and text.endswith(stop):
                text = text[: -len(stop)]
        return self.format.parse(text, tools)
