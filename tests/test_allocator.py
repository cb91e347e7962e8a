"""agentrl train under jemalloc where it is installed (agentrl/run/allocator.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.allocator import CHOICE, REEXEC_GUARD, find_jemalloc, reexec_plan

ROOT = Path(__file__).resolve().parents[1]
LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_the_plan_preloads_once_and_keeps_what_was_preloaded():
    env = reexec_plan({"LD_PRELOAD": "/opt/libfoo.so", "PATH": "/bin"}, LIB)
    assert env["LD_PRELOAD"] == f"{LIB} /opt/libfoo.so" and env["PATH"] == "/bin" and env[REEXEC_GUARD] == "1"
    assert reexec_plan(env, LIB) is None  # restarted already: never twice
    assert reexec_plan({"LD_PRELOAD": LIB}, LIB) is None  # preloaded by the user
    assert reexec_plan({CHOICE: "system"}, LIB) is None
    assert reexec_plan({}, None) is None  # not installed: go on with malloc


def test_find_jemalloc_looks_in_the_library_directories(tmp_path):
    assert find_jemalloc((str(tmp_path),)) is None
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    assert find_jemalloc((str(tmp_path / "nope"), str(tmp_path))) == str(tmp_path / "libjemalloc.so.2")


def _train(tmp_path, env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (CHOICE, REEXEC_GUARD)}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-m", "agentrl", "train", str(ROOT / "examples" / "arithmetic_ci.yaml"),
                          f"output_dir={tmp_path}", "train.steps=1", "eval.every=0", "eval.at_start=false"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout + out.stderr


@pytest.mark.skipif(find_jemalloc() is None, reason="jemalloc is not installed (apt install libjemalloc2)")
def test_train_restarts_itself_under_jemalloc_and_says_so(tmp_path):
    assert "allocator: jemalloc" in _train(tmp_path / "a", {})
    assert "allocator: the C library's malloc" in _train(tmp_path / "b", {CHOICE: "system"})


def test_an_unknown_choice_is_refused_by_name(tmp_path):
    out = subprocess.run([sys.executable, "-m", "agentrl", "train", "x.yaml"], capture_output=True, text=True,
                         env={**os.environ, CHOICE: "tcmalloc"}, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and "AGENTRL_ALLOCATOR='tcmalloc'" in out.stderr
