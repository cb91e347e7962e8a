"""Import agentrl from this working tree, on a machine where nothing can be installed.

The GPU machine has the repository and a fixed set of packages (torch, transformers, peft,
accelerate, safetensors, tokenizers, jinja2, triton and what they pull in: numpy, pyyaml,
tqdm, psutil, huggingface_hub). agentrl is not pip-installed there, and pyproject maps three
packages from other folders (``agentrl.tools`` <- ``tools/``, ``agentrl.envs`` <- ``envs/``,
``agentrl.templates`` <- ``templates/``), which a plain ``sys.path`` entry cannot express.

``prepare()`` must run before anything imports agentrl. It

1. puts the repository root first on ``sys.path`` (so ``agentrl`` is this tree's, even where
   another copy is installed) and ``benchmarks/`` after it (for ``scripted_turns``);
2. registers each ``package-dir`` mapping of pyproject.toml as a package whose ``__path__`` is
   the mapped folder (its subpackages then import normally);
3. hides the modules named in ``hide`` (CI uses it to run the smoke test as the GPU machine
   would see it: without jsonschema, matplotlib, tensorboard, rich, vllm);
4. stands in for what agentrl needs but the machine may lack, and says so in a note:
   ``jsonschema`` (imported by ``agentrl.tool`` at module level: a minimal validator from
   ``jsonschema_lite``), ``matplotlib`` (``Trainer.train`` draws curves after every step: the
   drawing is skipped, see ``skip_plots``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

# Used when pyproject.toml cannot be read (Python 3.10 has no tomllib).
DEFAULT_PACKAGE_DIRS = {"agentrl.tools": "tools", "agentrl.envs": "envs", "agentrl.templates": "templates"}

# Modules absent from the GPU machine's preinstalled list that agentrl may import somewhere.
GPU_ABSENT = ("jsonschema", "matplotlib", "tensorboard", "rich", "vllm", "e2b_code_interpreter", "ddgs",
              "math_verify", "datasets", "selenium")

# What the code paths of this check import, and whether each is on the GPU machine's list.
PROBED = ("torch", "transformers", "tokenizers", "safetensors", "jinja2", "peft", "accelerate", "triton",
          "numpy", "yaml", "tqdm", "psutil", *GPU_ABSENT)


@dataclass
class ImportReport:
    """Where agentrl came from and what was missing or stood in for."""

    agentrl_file: str = ""
    mapped_packages: dict[str, str] = field(default_factory=dict)  # name -> folder it was loaded from
    available: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def package_dirs() -> dict[str, str]:
    """pyproject's ``[tool.setuptools] package-dir`` entries other than the identity ones."""
    try:
        import tomllib
    except ImportError:
        return dict(DEFAULT_PACKAGE_DIRS)
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    dirs = data.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    return {name: folder for name, folder in dirs.items() if name.replace(".", "/") != folder}


def _register_package(name: str, folder: Path) -> None:
    """Import ``folder/__init__.py`` as package ``name``, with ``folder`` as its ``__path__``."""
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(sys.modules[parent], child, module)


def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def prepare(hide: list[str] | tuple[str, ...] = ()) -> ImportReport:
    """Make ``import agentrl`` (and its mapped packages) load this tree; see the module docstring."""
    report = ImportReport(hidden=sorted(hide))
    for name in hide:
        # None in sys.modules: `import name` raises ModuleNotFoundError and importlib.util.find_spec
        # returns None, which is how transformers and agentrl probe optional packages.
        sys.modules[name] = None
    for p in (str(BENCHMARKS), str(REPO)):  # REPO ends up first
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    for name in PROBED:
        (report.available if _available(name) else report.missing).append(name)
    if "jsonschema" in report.missing:
        from gpu_check import jsonschema_lite

        sys.modules["jsonschema"] = jsonschema_lite
        report.notes.append("jsonschema is missing: agentrl.tool imports it at module level, so "
                            "benchmarks/gpu_check/jsonschema_lite.py stands in (type, properties, required, "
                            "additionalProperties, enum, items, anyOf: what @tool schemas use)")
    for mod in [m for m in sys.modules if m == "agentrl" or m.startswith("agentrl.")]:
        del sys.modules[mod]  # an installed copy imported earlier must not answer for this tree
    import agentrl

    report.agentrl_file = str(Path(agentrl.__file__).resolve())
    for name, folder in sorted(package_dirs().items()):  # parents before children
        _register_package(name, REPO / folder)
        report.mapped_packages[name] = str((REPO / folder).resolve())
    if "matplotlib" in report.missing:
        skip_plots()
        report.notes.append("matplotlib is missing: Trainer.train calls plot_curves after every step, which "
                            "imports it; the check replaces the trainer module's plot_curves with a no-op")
    if "tensorboard" in report.missing:
        report.notes.append("tensorboard is missing: MetricsWriter already skips TensorBoard files without it")
    return report


def skip_plots() -> None:
    """Replace ``plot_curves`` in the trainer's module (found through the public ``Trainer``)."""
    from agentrl import Trainer

    module = sys.modules[Trainer.__module__]
    if hasattr(module, "plot_curves"):
        module.plot_curves = lambda *args, **kwargs: None


def first_module(*names: str):
    """The first of ``names`` that imports: internals move between releases (``agentrl.update``
    became ``agentrl.algo.update``), and the check should run on either layout."""
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            errors.append(f"{name}: {e}")
    raise ModuleNotFoundError("; ".join(errors))
