"""Real MCP servers from PyPI as tools: mcp-server-time and mcp-server-git (in the dev extra,
speaking the current protocol through mcp 2.x) and mcp-server-calculator (it pins mcp<2, so it
runs from a venv of its own: ``.venv-mcp``, made by ``make test``, or one this file builds
into the cache)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs the mcp package: pip install 'agentrl[mcp]'")

from agentrl.models.cache import default_cache_dir  # noqa: E402
from agentrl.toolbox import ToolBox  # noqa: E402
from agentrl.toolbox.mcp import McpServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CALCULATOR = "mcp-server-calculator==0.2.1"


def run(box: ToolBox, name: str, args: dict):
    return asyncio.run(box.execute(name, args, box.new_context("t")))


def installed(program: str) -> str:
    path = shutil.which(program, path=str(BIN)) or shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed: `pip install {program}` (the dev extra has it; make install)")
    return path


@pytest.fixture(scope="session")
def calculator_python() -> str:
    """A python that has mcp_server_calculator: the repository's .venv-mcp, else a cached venv."""
    def usable(python: Path) -> bool:
        return python.exists() and subprocess.run([str(python), "-c", "import mcp_server_calculator"],
                                                  capture_output=True).returncode == 0

    for python in (ROOT / ".venv-mcp" / "bin" / "python", default_cache_dir() / "mcp-calculator-venv" / "bin" / "python"):
        if usable(python):
            return str(python)
    venv = default_cache_dir() / "mcp-calculator-venv"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", CALCULATOR], check=True, timeout=600)
    assert usable(venv / "bin" / "python")
    return str(venv / "bin" / "python")


def test_time_server():
    box = ToolBox([McpServer(name="time", command=installed("mcp-server-time"), args=["--local-timezone", "UTC"])])
    try:
        assert list(box.tools) == ["get_current_time", "convert_time"]
        r = run(box, "get_current_time", {"timezone": "Asia/Tokyo"})
        assert r.error is None and json.loads(r.content)["timezone"] == "Asia/Tokyo"
        r = run(box, "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
        assert json.loads(r.content)["target"]["datetime"][11:16] == "21:00"
        r = run(box, "get_current_time", {"timezone": "Mars/Olympus"})  # the server's own error: the model's
        assert r.error == "exception" and "Mars/Olympus" in r.content and r.failure is None
        r = run(box, "get_current_time", {})  # refused by the server's schema before it is called
        assert r.error == "invalid_arguments" and "get_current_time(timezone: string)" in r.content
    finally:
        box.shutdown()


def test_git_server_on_a_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("first\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "the first commit"], check=True)
    box = ToolBox([McpServer(name="git", command=installed("mcp-server-git"), args=["--repository", str(repo)],
                             tools=["git_status", "git_log", "git_diff_unstaged", "git_show"])])
    try:
        assert list(box.tools) == ["git_status", "git_log", "git_diff_unstaged", "git_show"]
        assert "working tree clean" in run(box, "git_status", {"repo_path": str(repo)}).content
        assert "the first commit" in run(box, "git_log", {"repo_path": str(repo)}).content
        (repo / "notes.txt").write_text("first\nsecond\n")
        assert "+second" in run(box, "git_diff_unstaged", {"repo_path": str(repo)}).content
        r = run(box, "git_show", {"repo_path": str(repo), "revision": "no-such-revision"})
        assert r.error == "exception" and r.failure is None
    finally:
        box.shutdown()


def test_calculator_server_from_its_own_venv(calculator_python):
    box = ToolBox([McpServer(name="calculator", command=calculator_python, args=["-m", "mcp_server_calculator"])],
                  default_timeout=2)
    try:
        assert list(box.tools) == ["calculate"]
        assert run(box, "calculate", {"expression": "4821*367"}).content == "1769307"  # no {"result": ...} echo
        r = run(box, "calculate", {"expression": "1/0"})
        assert (r.error, r.content) == ("exception", "Error executing tool calculate: division by zero")
        t0 = time.monotonic()
        r = run(box, "calculate", {"expression": "9**9**9"})  # blocks the server: a policy timeout
        assert r.error == "timeout" and time.monotonic() - t0 < 4
        assert run(box, "calculate", {"expression": "2+2"}).content == "4"  # the wedged server was replaced
        assert box.sources[0].starts == 2
    finally:
        box.shutdown()
