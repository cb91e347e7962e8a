"""pyproject.toml lists every package and data file of the tree, so a wheel (a non-editable
install) holds what the editable install sees, and setuptools prints no "absent from the
packages configuration" warning (it did for envs/data, a folder without __init__.py)."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return out.splitlines()


def _package_dirs(cfg: dict) -> dict[str, Path]:
    """Every directory under a mapped root that holds a tracked file -> its package name."""
    found = {}
    tracked = _tracked()
    for root_pkg, folder in cfg["package-dir"].items():
        for name in tracked:
            path = Path(name)
            if path.parts[0] != folder or not (ROOT / path).exists():
                continue
            rel = path.parent.relative_to(folder)
            found[".".join([root_pkg, *rel.parts])] = ROOT / path.parent
    return found


def test_every_folder_of_the_tree_is_a_listed_package():
    cfg = _setuptools_config()
    assert sorted(set(_package_dirs(cfg)) - set(cfg["packages"])) == []


def test_every_tracked_data_file_is_in_package_data():
    cfg = _setuptools_config()
    data = cfg.get("package-data", {})
    missing, tracked = [], set(_tracked())
    for pkg, folder in _package_dirs(cfg).items():
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.suffix != ".py" and str(f.relative_to(ROOT)) in tracked:
                if not any(fnmatch.fnmatch(f.name, g) for g in data.get(pkg, [])):
                    missing.append(f"{pkg}: {f.name}")
    assert missing == []


@pytest.mark.slow
def test_the_wheel_builds_without_warnings_and_holds_the_data(tmp_path):
    """A non-editable wheel of a copy of the tree (the checkout gets no build/ folder)."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for folder in set(_setuptools_config()["package-dir"].values()):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "absent from the `packages` configuration" not in run.stdout + run.stderr
    (wheel,) = (tmp_path / "wheel").glob("agentrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"agentrl/envs/data/math_word_problems.jsonl", "agentrl/envs/data/mini_wiki.jsonl",
            "agentrl/templates/hermes.jinja", "agentrl/toolbox/__init__.py", "agentrl/chat/formats/__init__.py",
            "agentrl/rollout/__init__.py", "agentrl/tools/python.py"} <= names
