"""The package's import graph: the core never imports the leaves (built-in tools, environments,
concrete engines), so each leaf can be added or removed in one place; the algorithm never
imports the run that assembles it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = ("agentrl.tools", "agentrl.envs", "agentrl.engines.hf", "agentrl.engines.vllm", "agentrl.engines.scripted")


def _imports(path: Path) -> set[str]:
    """Modules imported by ``path`` at any depth (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(folder: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _imports(p) for p in sorted((ROOT / folder).rglob("*.py"))}


def _offenders(mods: dict[str, set[str]], forbidden: tuple[str, ...], exempt: tuple[str, ...] = ()) -> list[str]:
    return [f"{path} imports {m}" for path, imps in mods.items() if not path.startswith(exempt)
            for m in sorted(imps) if m.startswith(forbidden)]


def test_core_never_imports_the_leaves():
    # The run assembles components (engines come through the registry, environments by name);
    # the public API names HFEngine for type checkers only.
    exempt = ("agentrl/run/", "agentrl/engines/", "agentrl/__init__.py", "agentrl/cli.py")
    assert _offenders(_modules("agentrl"), LEAVES, exempt) == []


def test_algorithm_and_scale_never_import_the_run():
    assert _offenders(_modules("agentrl/algo"), ("agentrl.run", "agentrl.scale.")) == [
        "agentrl/algo/update.py imports agentrl.scale.distributed"]  # the all-reduces of the normalizers
    # config dataclasses, the merged result types, the checkpoint format the sharded one extends
    allowed = ("agentrl.run.config", "agentrl.run.evaluate", "agentrl.run.checkpoint")
    scale = {p: {m for m in imps if m not in allowed} for p, imps in _modules("agentrl/scale").items()}
    assert _offenders(scale, ("agentrl.run",)) == []


def test_leaves_never_import_the_run():
    mods = {**_modules("tools"), **_modules("envs")}
    assert _offenders(mods, ("agentrl.run", "agentrl.algo", "agentrl.scale")) == []
