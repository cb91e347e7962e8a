"""The documents name files that exist, link to files that exist, and stay short where promised.

Which references are checked, and how a name is resolved:

- In docs/design.md and README.md, a *reference* is any token that ends in ``.py`` (backticked
  or not, code blocks included), and any backticked token that ends in ``/``, ``.md``,
  ``.yaml``, ``.jsonl``, ``.jinja`` or ``.png``.
- A reference names a path relative to the repository root; when nothing exists there, it is
  tried relative to ``agentrl/`` (so ``agentrl/rollout/runner.py`` and ``rollout/runner.py``
  both resolve, and a bare ``runner.py`` does not). docs/design.md writes every module from
  the root.
- A token with a placeholder (``<``, ``>``, ``*``, ``{``, ``XXX``, ``...``), or that starts with
  ``/``, ``~``, ``.`` or a URL scheme, is a pattern or a path outside the repository (a run
  directory is written ``<run>/...``): it is skipped.

Relative links (``[text](target)`` and images) in README.md and docs/*.md are resolved from the
linking file's folder, without their ``#fragment``; links to URLs and to anchors of the same
page are not checked here.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from test_import_graph import LAYERS

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"

_PY = re.compile(r"(?<![\w./*<>{~-])(\w[\w./-]*\.py)\b(?![\w*])")
_BACKTICK = re.compile(r"`([^`\s]+)`")
_BACKTICK_SUFFIXES = ("/", ".md", ".yaml", ".jsonl", ".jinja", ".png", ".py")
_PLACEHOLDER = re.compile(r"[<>*{}]|XXX|\.\.\.")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def references(text: str) -> list[str]:
    """The file and folder names a document gives, in order, without duplicates."""
    found = [m.group(1) for m in _PY.finditer(text)]
    found += [t for t in _BACKTICK.findall(text) if t.endswith(_BACKTICK_SUFFIXES)]
    out = []
    for ref in found:
        ref = ref.rstrip(".,;:")
        if not ref or _PLACEHOLDER.search(ref) or ref.startswith(("/", "~", ".")) or "://" in ref:
            continue
        if ref not in out:
            out.append(ref)
    return out


def resolves(ref: str) -> bool:
    """True when ``ref`` exists relative to the repository root, or else to agentrl/."""
    for base in (ROOT, ROOT / "agentrl"):
        path = base / ref
        if (path.is_dir() if ref.endswith("/") else path.exists()):
            return True
    return False


def missing_paths(text: str) -> list[str]:
    return [ref for ref in references(text) if not resolves(ref)]


def broken_links(text: str, folder: Path) -> list[str]:
    """The relative link targets in ``text`` that do not exist, resolved from ``folder``."""
    out = []
    for target in _LINK.findall(text):
        if target.startswith(("#", "mailto:")) or "://" in target:
            continue
        target = target.split("#", 1)[0]
        if target and not (folder / target).exists():
            out.append(target)
    return out


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no section '## {title}'"
    return match.group(1)


def test_design_names_only_paths_that_exist():
    assert missing_paths(DESIGN.read_text()) == []


def test_readme_names_only_paths_that_exist():
    # the whole README, its layout table included
    assert missing_paths(README.read_text()) == []


def test_readme_layout_names_every_part():
    layout = references(_section(README.read_text(), "Layout"))
    parts = [f"agentrl/{p.parent.name}/" for p in sorted((ROOT / "agentrl").glob("*/__init__.py"))]
    parts += ["tools/", "envs/", "templates/"]
    assert [p for p in parts if p not in layout] == []


def test_design_layout_lists_the_import_layers():
    """docs/design.md, "Layout": one numbered item per layer of tests/test_import_graph.py."""
    items = re.findall(r"^\d+\. (.*?)(?=^\d+\. |^\s*$)", _section(DESIGN.read_text(), "Layout"), re.S | re.M)

    def module(ref: str) -> str:
        name = ref.rstrip("/").removesuffix(".py").replace("/", ".")
        name = {"tools": "agentrl.tools", "envs": "agentrl.envs"}.get(name, name)
        return name.removesuffix(".__init__")

    documented = [{module(r) for r in references(item)} for item in items]
    assert documented == [set(layer) for layer in LAYERS]


def test_readme_quickstart_is_the_example():
    """README.md's Quickstart is examples/quickstart.py without its docstring and main guard."""
    block = re.search(r"```python\n(.*?)```", _section(README.read_text(), "Quickstart"), re.S).group(1)
    head, body = (ROOT / "examples" / "quickstart.py").read_text().split('if __name__ == "__main__":\n')
    script = head.split('"""', 2)[2] + textwrap.dedent(body)
    def lines(code: str) -> list[str]:
        return [line for line in code.splitlines() if line.strip()]

    assert lines(block) == lines(script)


def test_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_relative_links_point_to_existing_files():
    broken = [f"{path.relative_to(ROOT)} -> {target}"
              for path in [README, *DOCS] for target in broken_links(path.read_text(), path.parent)]
    assert broken == []


def test_the_checks_report_what_is_missing():
    # the checks above must be able to fail: a module that is not there, at an old path, a
    # folder that is not there and a broken link are reported; patterns and real paths are not
    text = ("See `agentrl/rollout/runner.py`, rollout/base.py, `toolbox/`, `agentrl/no_such_module.py`,\n"
            "the old `agentrl/toolbox.py`, grpo.py, `no_such_folder/`, `<run>/rollouts/`, `search*.py`,\n"
            "`~/.cache/agentrl/`, `rollouts/step_XXXXXX.jsonl` and examples/quickstart.py.\n")
    assert missing_paths(text) == ["agentrl/no_such_module.py", "agentrl/toolbox.py", "grpo.py",
                                   "no_such_folder/"]
    links = ("[ok](test_docs.py) ![img](../docs/design.md#x) [anchor](#x) [web](https://e.com/a.md)\n"
             "[gone](no.md#top)")
    assert broken_links(links, Path(__file__).parent) == ["no.md"]

