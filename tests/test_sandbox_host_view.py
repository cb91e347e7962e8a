"""What sandboxed code sees of the host's files, at every isolation level (docs/sandbox.md).

The rule: the system directories, the Python installation and the allowed packages, read-only;
nothing else. Probed from inside the sandbox, never printing a file's content (only whether it
could be read): the checkout and its environment data, home directories, a planted ``.env``
in a checkout the test makes, another package's data file in a site-packages directory (a
planted one outside /tmp, and the base interpreter's real one, which lies inside the shown
Python installation), while the standard library and the allowed packages still import.

At bwrap and unshare the hidden paths do not exist (a new root holds only the view: a
directory on the way to a shown path lists only that way). At rlimits Landlock makes them
unreadable (``PermissionError``), and names inside site-packages directories stay listable,
as :func:`describe_level` says; on a kernel without Landlock that level hides nothing, says
so, and the test asserts exactly that. Unshare and rlimits run here through the rerun in a
private mount namespace at the end, as root where bubblewrap is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import private_mount
import pytest
from isolation_levels import level_params

from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
from agentrl.tools.sandbox.config import DEFAULT_PACKAGES
from agentrl.tools.sandbox.isolation import describe_level, landlock_abi

REPO = Path(__file__).resolve().parents[1]
ALLOWED = ("agentrl_probe_ok", "agentrl_probe_single", "agentrl_probe_tmp")
CFG = SandboxConfig(timeout=10.0, uid_base=1_550_000, uid_count=128, max_output_chars=200_000,
                    packages=(*DEFAULT_PACKAGES, *ALLOWED))
STDLIB = ("json", "math", "collections", "decimal", "fractions", "itertools", "re", "datetime", "statistics",
          "random", "heapq", "sqlite3", "hashlib", "ctypes", "csv", "textwrap", "unicodedata", "zlib")

# Run in the sandbox: for each path, what the code gets (never the content).
PROBE = r'''
import json, os
def probe(path):
    try:
        if os.path.isdir(path):
            return ["listed", sorted(os.listdir(path))]
        with open(path, "rb") as f:
            return ["read", len(f.read())]
    except FileNotFoundError:
        return ["absent"]
    except PermissionError:
        return ["denied"]
    except OSError as e:
        return [type(e).__name__]
print(json.dumps({p: probe(p) for p in %r}))
'''


@dataclass(frozen=True)
class Planted:
    checkout: Path  # a project folder (pyproject.toml) with a .env: the trainer's cwd in the tests
    site: Path  # a site-packages folder outside /tmp: one allowed package, one environment's data
    tmp_site: Path  # one under /tmp (private there at the namespace levels): an allowed module


@pytest.fixture(scope="module")
def planted() -> Iterator[Planted]:
    # Outside /tmp where possible (next to the checkout), so that at the namespace levels only
    # the view hides it, not the private /tmp; world-searchable, as the rlimits uid must reach it.
    try:
        top = Path(tempfile.mkdtemp(prefix=".agentrl-hostview-", dir=REPO.parent))
    except OSError:
        top = Path(tempfile.mkdtemp(prefix="agentrl-hostview-"))
    tmp_top = Path(tempfile.mkdtemp(prefix="agentrl-hostview-"))
    try:
        checkout, site, tmp_site = top / "checkout", top / "lib" / "site-packages", tmp_top / "site-packages"
        for d in (checkout, site / "agentrl_probe_ok", site / "agentrl_probe_env" / "data", tmp_site):
            d.mkdir(parents=True)
        (checkout / "pyproject.toml").write_text("[project]\nname = 'probe'\n")
        (checkout / ".env").write_text("API_KEY=planted-by-the-test\n")
        (site / "agentrl_probe_ok" / "__init__.py").write_text("VALUE = 42\n")
        (site / "agentrl_probe_single.py").write_text("VALUE = 43\n")
        (site / "agentrl_probe_env" / "__init__.py").write_text("")
        (site / "agentrl_probe_env" / "data" / "answers.jsonl").write_text('{"answer": "planted"}\n')
        (tmp_site / "agentrl_probe_tmp.py").write_text("VALUE = 44\n")
        for d in (top, tmp_top):
            for p in [d, *d.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        yield Planted(checkout, site, tmp_site)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(tmp_top, ignore_errors=True)


@pytest.fixture(params=[(lvl, fork) for lvl in level_params() for fork in ("fork", "percall")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def ex(request: pytest.FixtureRequest, planted: Planted, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalExecutor]:
    level, mode = request.param
    monkeypatch.syspath_prepend(str(planted.tmp_site))
    monkeypatch.syspath_prepend(str(planted.site))
    monkeypatch.chdir(planted.checkout)  # the trainer runs from a checkout holding a .env
    try:
        e = LocalExecutor(dataclasses.replace(CFG, isolation=level, fork_server=mode == "fork"))
    except RuntimeError as exc:
        pytest.skip(f"isolation level {level} not available here: {exc}")
    yield e
    e.close()


def hides(ex: LocalExecutor) -> bool:
    """Whether this level hides files here: every level but rlimits on a kernel without Landlock."""
    if ex.isolation_level == "rlimits" and landlock_abi() < 1:
        assert "this kernel has no Landlock, so the code can read every file its uid may" in describe_level("rlimits")
        return False
    return True


def probe(ex: LocalExecutor, paths: list[str]) -> dict[str, list]:
    r = ex.run(PROBE % (paths,))
    assert r.exit_code == 0, r.observation()
    return json.loads(r.output)


def on_the_way(ex: LocalExecutor, directory: str) -> set[str]:
    """Names a namespace level may list in ``directory``: the way to a shown path, nothing else."""
    view = ex.isolation.view
    below = [p for p in (*view.shown, *view.masks, *view.sys_path) if p.startswith(directory.rstrip("/") + "/")]
    return {p[len(directory.rstrip("/")) + 1:].split("/")[0] for p in below}


def assert_hidden(ex: LocalExecutor, seen: dict[str, list]) -> None:
    for path, got in seen.items():
        if ex.isolation_level == "rlimits":
            assert got == ["denied"], (path, got)
        elif got[0] == "listed":
            assert set(got[1]) <= on_the_way(ex, path), (path, got)
        else:
            assert got == ["absent"], (path, got)


def secret_paths(planted: Planted) -> list[str]:
    paths = [REPO, REPO / "pyproject.toml", REPO / "agentrl" / "__init__.py", REPO / "envs" / "data",
             planted.checkout, planted.checkout / ".env", planted.site / "agentrl_probe_env" / "data" / "answers.jsonl",
             planted.site / "agentrl_probe_env" / "__init__.py"]
    paths += sorted((REPO / "envs" / "data").glob("*"))[:2]  # an environment's own data files
    for home in [Path("/root"), *sorted(Path("/home").glob("*"))]:  # entries of homes, not on the way to Python
        paths.append(home)
        try:
            paths += sorted(e for e in home.iterdir() if not str(sys.base_prefix).startswith(str(e) + "/"))[:6]
        except OSError:
            pass
    return [str(p) for p in paths if os.path.lexists(p)]


def test_checkout_homes_env_and_other_packages_are_hidden(ex: LocalExecutor, planted: Planted) -> None:
    paths = secret_paths(planted)
    assert str(planted.checkout / ".env") in paths and str(REPO / "pyproject.toml") in paths
    seen = probe(ex, paths)
    if hides(ex):
        assert_hidden(ex, seen)
    else:  # the stated behaviour without Landlock: the files are readable
        assert seen[str(planted.checkout / ".env")][0] == "read"


def test_a_site_directory_shows_only_the_allowed_packages(ex: LocalExecutor, planted: Planted) -> None:
    site, data = str(planted.site), str(planted.site / "agentrl_probe_env" / "data")
    answers = data + "/answers.jsonl"
    seen = probe(ex, [site, data, answers])
    if not hides(ex):
        assert seen[answers][0] == "read"
    elif ex.isolation_level == "rlimits":  # Landlock: the import system must list it, so names show
        assert seen == {site: ["listed", sorted(os.listdir(site))], data: ["listed", ["answers.jsonl"]], answers: ["denied"]}
    else:
        assert seen == {site: ["listed", ["agentrl_probe_ok", "agentrl_probe_single.py"]], data: ["absent"], answers: ["absent"]}


def test_the_base_interpreters_site_packages_is_hidden_inside_the_shown_python(ex: LocalExecutor) -> None:
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["purelib"]
    allowed = [s for s in ex.isolation.view.shown if s.startswith(base + "/")]  # packages bound back into it
    files = [str(p) for p in sorted(Path(base).glob("*/*.py")) if not any(str(p).startswith(s + "/") for s in allowed)][:3]
    if not files:
        pytest.skip(f"the base interpreter's site-packages ({base}) holds no package that is not allowed")
    seen = probe(ex, [base, *files])
    if not hides(ex):
        return
    if ex.isolation_level == "rlimits":  # names listable (the standard library above it must be), contents not
        assert seen.pop(base)[0] == "listed"
    else:
        assert seen.pop(base) == ["listed", []]
    assert_hidden(ex, seen)


def _others_can_enter(path: str) -> bool:
    """Every folder above ``path`` lets other users through (o+x): at rlimits the sandbox's uid
    meets the host's permissions (mktemp -d makes a 0700 folder, as .ci/run's fresh clone is)."""
    import os
    import stat

    parts = os.path.abspath(path).split(os.sep)
    return all(os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & stat.S_IXOTH for i in range(1, len(parts)))


def test_standard_library_and_allowed_packages_import(ex: LocalExecutor) -> None:
    wanted = [m for m in DEFAULT_PACKAGES if importlib.util.find_spec(m) is not None]  # installed here
    if ex.isolation_level == "rlimits" and not all(_others_can_enter(importlib.util.find_spec(m).origin)
                                                   for m in wanted):
        pytest.skip("at rlimits the sandbox's uid cannot enter a 0700 folder above the packages (host permissions)")
    code = (f"import importlib, sys\nfor m in {[*STDLIB, *wanted]!r}:\n    importlib.import_module(m)\n"
            "import agentrl_probe_ok, agentrl_probe_single, agentrl_probe_tmp\n"
            "print(agentrl_probe_ok.VALUE, agentrl_probe_single.VALUE, agentrl_probe_tmp.VALUE)\n")
    if "numpy" in wanted:
        code += "import numpy; print(int(numpy.arange(10).sum()))\n"
    if "sympy" in wanted:
        code += "import sympy; print(sympy.sqrt(8))\n"
    r = ex.run(code)
    assert r.exit_code == 0, r.observation()
    assert r.output.splitlines()[0] == "42 43 44"
    assert ("45" in r.output.split()) == ("numpy" in wanted) and ("2*sqrt(2)" in r.output) == ("sympy" in wanted)


def test_other_installed_packages_do_not_import(ex: LocalExecutor) -> None:
    # pytest runs this test, so it is installed; neither is in the allow-list. (At rlimits the
    # import system may still find the name in a listable site-packages, then may not read it:
    # PermissionError; or not find it at all, e.g. a site directory under /tmp.)
    refused = ("ModuleNotFoundError",) if ex.isolation_level != "rlimits" else ("PermissionError",
                                                                                "ModuleNotFoundError")
    for name in ("agentrl_probe_env", "pytest"):
        out = ex.run(f"import {name}").output
        assert any(r in out for r in refused) or not hides(ex), (name, out)


@pytest.mark.slow
def test_host_view_without_bubblewrap() -> None:
    """Unshare and rlimits, which bubblewrap (and, as root, an unreachable /root) hide from the
    runs above, in a private mount namespace with bubblewrap hidden."""
    if not private_mount.available():
        pytest.skip("needs root and mount namespaces (run as root to test every isolation level)")
    if "unshare" in level_params() and "rlimits" in level_params():
        pytest.skip("both levels already ran above")
    out = private_mount.rerun_pytest(f"{__file__} -k 'not without_bubblewrap'")
    for level in ("unshare", "rlimits"):
        assert len(re.findall(rf"\[{level}-(fork|percall)\] PASSED", out)) >= 8, f"the {level} level did not run:\n{out[-3000:]}"
        assert not re.search(rf"\[{level}-\w+\] FAILED", out), out[-3000:]
        # the one skip allowed: a checkout under a 0700 folder, which the rlimits uid cannot enter
        skipped = re.findall(rf"\[{level}-\w+\] SKIPPED", out)
        assert not skipped or (level == "rlimits" and "0700 folder" in out), out[-3000:]
