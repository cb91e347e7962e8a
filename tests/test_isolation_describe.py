"""The run's ``tool isolation:`` line says what each level means and how to get bubblewrap."""

from __future__ import annotations

from agentrl.tools.sandbox import isolation
from agentrl.tools.sandbox.isolation import LEVELS, MEANINGS, describe_level


def test_every_level_has_a_meaning():
    assert set(LEVELS) | {"e2b"} == set(MEANINGS)
    for level in MEANINGS:
        assert describe_level(level).startswith(f"{level} (")


def test_below_bwrap_the_line_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    for level in ("unshare", "rlimits"):
        assert "install bubblewrap (sudo apt-get install bubblewrap)" in describe_level(level)
    assert "install" not in describe_level("bwrap") and "install" not in describe_level("e2b")
    monkeypatch.setattr(isolation.shutil, "which", lambda name: "/usr/bin/" + name)
    assert "python_tool(isolation='bwrap') raises with the reason" in describe_level("unshare")
