"""Import agentrl from this working tree, on a machine where nothing can be installed.

The GPU machine has the repository and a fixed set of packages (torch, transformers, peft,
accelerate, safetensors, tokenizers, jinja2, triton and what they pull in: numpy, pyyaml,
tqdm, psutil, huggingface_hub). agentrl is not pip-installed there, and pyproject maps three
packages from other folders (``agentrl.tools`` <- ``tools/``, ``agentrl.envs`` <- ``envs/``,
``agentrl.templates`` <- ``templates/``), which a plain ``sys.path`` entry cannot express.

``prepare()`` must run before anything imports agentrl. It

1. puts the repository root first on ``sys.path`` (so ``agentrl`` is this tree's, even where
   another copy is installed) and ``benchmarks/`` after it (for ``scripted_turns``);
2. puts a finder first on ``sys.meta_path`` that loads each ``package-dir`` entry of
   pyproject.toml from its folder (``WorkingTreeFinder``);
3. hides the modules named in ``hide`` (CI uses it to run the smoke test as the GPU machine
   would see it: without jsonschema, matplotlib, tensorboard, rich, vllm);
4. stands in for what agentrl needs but the machine may lack, and says so in a note:
   ``jsonschema`` (imported by ``agentrl.toolbox`` at module level: a minimal validator from
   ``jsonschema_lite``), ``matplotlib`` (``Trainer.train`` draws curves after every step: the
   drawing is skipped, see ``skip_plots``).
"""

from __future__ import annotations

import importlib
import importlib.abc
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
    """pyproject's ``[tool.setuptools] package-dir``: package name -> folder in the repository."""
    try:
        import tomllib
    except ImportError:
        return {"agentrl": "agentrl", **DEFAULT_PACKAGE_DIRS}
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(data.get("tool", {}).get("setuptools", {}).get("package-dir", {})) or {
        "agentrl": "agentrl", **DEFAULT_PACKAGE_DIRS}


class WorkingTreeFinder(importlib.abc.MetaPathFinder):
    """Finds each package of ``package-dir`` in its folder of this repository, first of all
    finders (an installed agentrl, editable or not, never answers for it). Subpackages and
    modules below them are found through the package's ``__path__`` as usual, and the
    packages import lazily, in whatever order their code imports each other."""

    def __init__(self, dirs: dict[str, str]):
        self.dirs = {name: REPO / folder for name, folder in dirs.items()}

    def find_spec(self, fullname, path=None, target=None):
        folder = self.dirs.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


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
        report.notes.append("jsonschema is missing: agentrl.toolbox imports it at module level, so "
                            "benchmarks/gpu_check/jsonschema_lite.py stands in (type, properties, required, "
                            "additionalProperties, enum, items, anyOf: what @tool schemas use)")
    for mod in [m for m in sys.modules if m == "agentrl" or m.startswith("agentrl.")]:
        del sys.modules[mod]  # an installed copy imported earlier must not answer for this tree
    dirs = package_dirs()
    sys.meta_path.insert(0, WorkingTreeFinder(dirs))
    import agentrl

    report.agentrl_file = str(Path(agentrl.__file__).resolve())
    for name in sorted(dirs):
        if name != "agentrl":
            report.mapped_packages[name] = str(Path(importlib.import_module(name).__path__[0]).resolve())
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
