"""The package's import graph runs one way: every part imports only parts below it.

The layers, bottom to top (docs/design.md, "Layout"); a part may import its own modules and
any part of a lower layer, never one of its own layer or above. No exceptions are listed:
what two layers share lives in the lower one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, ...]] = [
    ("agentrl.types", "agentrl.jsonl"),  # boundary objects, JSON Lines files
    ("agentrl.toolbox", "agentrl.models", "agentrl.engines", "agentrl.scale"),  # tool API, models on disk, samplers, ranks
    ("agentrl.chat", "agentrl.env", "agentrl.algo", "agentrl.inspect", "agentrl.tools"),  # templates, the env protocol, the math, the viewer, built-in tools
    ("agentrl.serve", "agentrl.envs"),  # the OpenAI endpoint, built-in environments
    ("agentrl.rollout",),  # both runners
    ("agentrl.run",),  # the recipe that assembles everything
    ("agentrl.cli", "agentrl"),  # the command line, the public API
    ("agentrl.__main__",),  # python -m agentrl
]
LEAVES = ("agentrl.tools", "agentrl.envs", "agentrl.engines.hf", "agentrl.engines.vllm", "agentrl.engines.scripted")
SOURCES = {"agentrl": ROOT / "agentrl", "agentrl.tools": ROOT / "tools", "agentrl.envs": ROOT / "envs"}


def _part(module: str) -> str | None:
    """The part a module belongs to: ``agentrl.rollout.runner`` -> ``agentrl.rollout``."""
    for layer in LAYERS:
        for part in sorted(layer, key=len, reverse=True):
            if module == part or (part != "agentrl" and module.startswith(part + ".")):
                return part
    return "agentrl" if module == "agentrl" else None


def _rank(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def _modules() -> dict[str, set[str]]:
    """module name -> agentrl modules it imports at any depth (function-level imports count)."""
    out = {}
    for root, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module)
            out[".".join([root, *parts])] = {m for m in found if m == "agentrl" or m.startswith("agentrl.")}
    return out


def test_every_module_belongs_to_a_layer():
    assert [m for m in _modules() if _part(m) is None] == []


def _arrows(mods: dict[str, set[str]]) -> list[str]:
    """Imports that go to a part of the same layer or a higher one."""
    arrows = []
    for module, imports in mods.items():
        src = _part(module)
        for target in sorted(imports):
            dst = _part(target)
            if dst != src and (dst is None or _rank(dst) >= _rank(src)):
                arrows.append(f"{module} imports {target}")
    return arrows


def test_no_import_runs_up_or_sideways():
    assert _arrows(_modules()) == []


def test_the_check_sees_upward_and_sideways_arrows(tmp_path, monkeypatch):
    # the graph test above must be able to fail: scale/ importing the run (up) or the models
    # (its own layer), inside a function, is caught; importing types (down) is not
    fake = tmp_path / "agentrl" / "scale"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("import agentrl.types\n\ndef f():\n    from agentrl.run.config import Config\n"
                                 "    import agentrl.models.cache\n")
    monkeypatch.setitem(globals(), "SOURCES", {"agentrl": tmp_path / "agentrl"})
    assert _arrows(_modules()) == ["agentrl.scale.bad imports agentrl.models.cache",
                                   "agentrl.scale.bad imports agentrl.run.config"]


def test_core_never_imports_the_leaves():
    # The run assembles components (engines come through the registry, environments by name);
    # the public API names HFEngine for type checkers only.
    exempt = ("agentrl.run", "agentrl.engines", "agentrl.cli", "agentrl.tools", "agentrl.envs")
    offenders = [f"{m} imports {t}" for m, imps in _modules().items()
                 if m != "agentrl" and not m.startswith(exempt) for t in sorted(imps) if t.startswith(LEAVES)]
    assert offenders == []


def test_at_most_six_modules_at_the_top():
    top = sorted(p.name for p in (ROOT / "agentrl").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py", "env.py", "jsonl.py", "types.py"]
