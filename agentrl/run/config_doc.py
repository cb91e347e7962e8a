"""The config reference: every key of :class:`agentrl.run.config.Config`, generated from the
dataclasses themselves (``agentrl config [SECTION]``, and ``docs/config.md``).

A key's type is its annotation as written, its default the dataclass default (as YAML would
write it), and its description the comment on the field's line, after the comment lines right
above the field when there are any. So the comments in the config dataclasses *are* the
documentation: a new field gets a comment, and ``agentrl config --markdown > docs/config.md``
regenerates the page (tests/test_cli_basics.py fails until it is regenerated).

    >>> keys = {k.key: k for k in config_keys()}
    >>> keys["algo.num_samples"].type, keys["algo.num_samples"].default
    ('int', '8')
    >>> keys["train.steps"].description
    'optimizer steps to run (one batch of rollouts each)'
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import re
import textwrap
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from agentrl.run.config import Config

TOP = "top level"  # the heading of the keys outside any section (name, output_dir, ...)
_TOOL_COMMENT = re.compile(r"^\s*(noqa|type:|pragma|fmt:)")


@dataclass(frozen=True)
class ConfigKey:
    """One key of the reference."""

    key: str  # dotted, as written in overrides: algo.eps_high
    type: str  # the annotation as written in the source
    default: str  # as YAML would write it: 8, 1e-06, null, "tiny", [0.9, 0.99]
    description: str


@dataclass(frozen=True)
class ConfigSection:
    """The keys of one section (``model``, ``algo``, ...), or of the top level (name ``""``)."""

    name: str
    cls: type
    description: str
    keys: tuple[ConfigKey, ...]


def config_sections(root: type = Config) -> list[ConfigSection]:
    """The top-level keys, then one section per dataclass-typed field of ``root``, in field order."""
    comments = _field_comments(root)
    top: list[ConfigKey] = []
    sections: list[ConfigSection] = []
    for f in dataclasses.fields(root):
        value = _default(f)
        if dataclasses.is_dataclass(value):
            doc, comment = _class_doc(type(value)), comments.get(f.name, ("", ""))[1]
            about = f"{doc.rstrip('.')} ({comment})." if doc and comment else doc or comment
            sections.append(ConfigSection(f.name, type(value), about, tuple(_keys(type(value), f.name + "."))))
        else:
            top.append(_key(f, comments, ""))
    return [ConfigSection("", root, _class_doc(root), tuple(top)), *sections]


def config_keys(root: type = Config) -> list[ConfigKey]:
    """Every key, flattened (sections' keys dotted)."""
    return [k for s in config_sections(root) for k in s.keys]


def render_text(selector: str | None = None, width: int = 100) -> str:
    """The reference as plain text; ``selector`` keeps one section (``algo``) or one key
    (``algo.eps_high``). Raises KeyError naming the sections for anything else."""
    sections = _select(selector)
    out: list[str] = []
    for s in sections:
        title = s.name or TOP
        out.append(f"{title}  ({s.cls.__name__})" + (f": {s.description}" if s.description else ""))
        for k in s.keys:
            out.append(f"  {k.key}: {k.type} = {k.default}")
            if k.description:
                out.extend(textwrap.wrap(k.description, width, initial_indent=" " * 6, subsequent_indent=" " * 6))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_markdown() -> str:
    """docs/config.md: every section as a table of key, type, default and description."""
    sections = config_sections()
    out = [
        "# Config reference",
        "",
        "Every key of an `agentrl train` config, generated from the config dataclasses (their",
        "field comments are the descriptions). Set a key in the YAML file under its section, or on",
        "the command line: `agentrl train CONFIG.yaml algo.num_samples=4 env.args.seed=1`.",
        "`agentrl config [SECTION]` prints the same reference in a terminal.",
        "",
        "Do not edit this page by hand: after changing a config dataclass, run",
        "`agentrl config --markdown > docs/config.md`.",
        "",
        "Sections: " + ", ".join(f"[{s.name or TOP}](#{_anchor(s.name or TOP)})" for s in sections) + ".",
    ]
    for s in sections:
        out += ["", f"## {s.name or TOP}", ""]
        where = f"`{s.cls.__module__}.{s.cls.__qualname__}`"
        out += [f"{s.description} ({where})" if s.description else f"({where})", ""]
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for k in s.keys:
            out.append(f"| `{k.key}` | {_code(k.type)} | {_code(k.default)} | {_cell(k.description)} |")
    return "\n".join(out) + "\n"


def section_names() -> list[str]:
    return [s.name for s in config_sections() if s.name]


# -- reading the source --------------------------------------------------------------


def _select(selector: str | None) -> list[ConfigSection]:
    sections = config_sections()
    if selector is None:
        return sections
    for s in sections:
        if s.name == selector:
            return [s]
    for s in sections:
        hit = [k for k in s.keys if k.key == selector]
        if hit:
            return [dataclasses.replace(s, keys=tuple(hit))]
    raise KeyError(f"no config section or key {selector!r}; sections: {', '.join(section_names())} "
                   f"(or a key such as algo.eps_high, or a top-level key: "
                   f"{', '.join(k.key for k in sections[0].keys)})")


def _keys(cls: type, prefix: str) -> list[ConfigKey]:
    comments = _field_comments(cls)
    out: list[ConfigKey] = []
    for f in dataclasses.fields(cls):
        value = _default(f)
        if dataclasses.is_dataclass(value):
            out.extend(_keys(type(value), f"{prefix}{f.name}."))
        else:
            out.append(_key(f, comments, prefix))
    return out


def _key(f: dataclasses.Field, comments: dict[str, tuple[str, str]], prefix: str) -> ConfigKey:
    annotation, text = comments.get(f.name, (f.type if isinstance(f.type, str) else _type_text(f.type), ""))
    return ConfigKey(prefix + f.name, annotation, _yaml(_default(f)), text)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _yaml(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)  # null, true, 1e-06, "tiny", [0.9, 0.99], {}
    except TypeError:
        return repr(value)


def _type_text(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _class_doc(cls: type) -> str:
    """The class's own docstring, one paragraph (a dataclass without one has a generated
    ``__doc__``, the signature, which is not shown)."""
    node = _class_node(cls)
    doc = ast.get_docstring(node) if node is not None else None
    return " ".join(doc.split()) if doc else ""


@lru_cache(maxsize=None)
def _source(cls: type) -> str | None:
    """The class's source, dedented (None when Python has none for it)."""
    try:
        return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return None


def _class_node(cls: type) -> ast.ClassDef | None:
    source = _source(cls)
    node = ast.parse(source).body[0] if source is not None else None
    return node if isinstance(node, ast.ClassDef) else None


def _field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """field name -> (annotation as written, description from its comments), for ``cls`` and
    the dataclasses it inherits fields from (the class that defines a field last wins)."""
    out: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            out.update(_own_field_comments(klass))
    return out


@lru_cache(maxsize=None)
def _own_field_comments(cls: type) -> dict[str, tuple[str, str]]:
    source = _source(cls)
    if source is None:
        return {}
    lines = source.splitlines()
    trailing: dict[int, str] = {}  # line number -> comment after code on that line
    whole: dict[int, str] = {}  # line number -> a line that is only a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            text = tok.string.lstrip("#").strip()
            (whole if not lines[row - 1][:col].strip() else trailing)[row] = text
    node = ast.parse(source).body[0]
    out: dict[str, tuple[str, str]] = {}
    for stmt in getattr(node, "body", []):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above: list[str] = []
        row = stmt.lineno - 1
        while row in whole:  # the comment block right above the field, no blank line between
            above.insert(0, whole[row])
            row -= 1
        after = [trailing[r] for r in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if r in trailing]
        parts = [p for p in (" ".join(above), *after) if p and not _TOOL_COMMENT.match(p)]
        annotation = ast.get_source_segment(source, stmt.annotation) or ""
        out[stmt.target.id] = (annotation, " — ".join(parts))
    return out


def _code(text: str) -> str:
    return f"`{text}`".replace("|", "\\|") if text else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "\\<")  # runs/<name> is not an HTML tag


def _anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
