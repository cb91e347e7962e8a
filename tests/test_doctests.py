"""Every ``>>>`` example in a docstring of agentrl, agentrl.tools, agentrl.envs and
agentrl.templates runs here, one test per docstring.

Modules are found by walking the installed packages (pyproject maps ``agentrl.tools`` to
``tools/``, ``agentrl.envs`` to ``envs/``, ...) and imported under those real names, so an
example sees the same module objects as user code; pytest's ``--doctest-modules`` would
import ``tools/x.py`` as ``tools.x``, a second copy. An example that needs a network, a GPU,
an API key or more than ~10 s of CPU carries ``# doctest: +SKIP`` in its docstring; everything
else runs.
"""

from __future__ import annotations

import copy
import doctest
import importlib
import importlib.util
import pkgutil

import pytest

ROOTS = ("agentrl", "agentrl.tools", "agentrl.envs", "agentrl.templates")
# Importing ``agentrl.__main__`` runs the CLI.
NOT_IMPORTED = {"agentrl.__main__"}
# Docstrings whose examples use an optional extra: {docstring: (import name, extra)}. They
# are skipped, saying so, only where that package is missing (``make install`` has them all).
# Every module imports without the extras (they are imported lazily).
NEEDS = {
    "agentrl.scale.parallel.AdapterDisabledReference": ("peft", "lora"),
    "agentrl.envs.math": ("math_verify", "math"),
    "agentrl.envs.math_check": ("math_verify", "math"),
    "agentrl.envs.math_check.check_equivalence": ("math_verify", "math"),
    "agentrl.envs.reasoning_gym": ("reasoning_gym", "reasoning-gym"),
    "agentrl.engines.grammar.check_grammar": ("llguidance", "serve"),
    "agentrl.serve.structured": ("llguidance", "serve"),
}
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _reraise(name: str) -> None:
    raise  # walk_packages calls this inside its ``except ImportError``: a package that fails to import fails here


def _module_names() -> list[str]:
    names = set()
    for root in ROOTS:
        names.add(root)
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, root + ".", onerror=_reraise):
            if info.name not in NOT_IMPORTED:
                names.add(info.name)
    return sorted(names)


ALL_SKIPPED: list[str] = []


def _collect() -> list:
    params = []
    finder = doctest.DocTestFinder()
    for name in _module_names():
        module = importlib.import_module(name)
        # The finder keeps only objects defined in ``module``, so each docstring comes once.
        for test in finder.find(module, name):
            if not test.examples:
                continue
            if all(ex.options.get(doctest.SKIP) for ex in test.examples):
                ALL_SKIPPED.append(test.name)  # needs vLLM or minutes of CPU: nothing here to run
                continue
            marks = []
            if test.name in NEEDS:
                package, extra = NEEDS[test.name]
                marks.append(pytest.mark.skipif(importlib.util.find_spec(package) is None,
                                                reason=f"needs {package}: pip install 'agentrl[{extra}]'"))
            params.append(pytest.param(test, id=test.name, marks=marks))
    return params


_TESTS = _collect()


def test_modules_found() -> None:
    names = _module_names()
    for expected in ("agentrl.algo.grpo", "agentrl.tools.search", "agentrl.envs.arithmetic", "agentrl.engines.hf"):
        assert expected in names
    assert not any(n.startswith(("tools.", "envs.")) for n in names)
    assert len(_TESTS) > 50
    assert set(NEEDS) <= {p.id for p in _TESTS}, "NEEDS names a docstring that has no examples any more"
    # Whole docstrings left out must stay the documented exceptions (a GPU engine, a long SFT).
    assert set(ALL_SKIPPED) <= {"agentrl.engines.vllm.VLLMEngine", "agentrl.run.warmstart.warm_start"}, ALL_SKIPPED


@pytest.mark.parametrize("test", _TESTS)
def test_docstring_examples(test: doctest.DocTest) -> None:
    test = copy.copy(test)
    test.globs = dict(test.globs)  # the run clears its globals; keep the collected test reusable
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    if result.failed:
        pytest.fail("".join(report), pytrace=False)
