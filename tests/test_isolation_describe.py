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


def test_each_level_says_what_it_hides_of_the_hosts_files(monkeypatch):
    assert "sees only the system directories, the standard library and the allowed packages" in MEANINGS["bwrap"]
    assert "the same read-only view of the host as bwrap" in MEANINGS["unshare"]
    monkeypatch.setattr(isolation, "landlock_abi", lambda: 3)
    assert "Landlock keeps the host's files outside the view unreadable" in describe_level("rlimits")
    # A kernel without Landlock: the level cannot hide files, and the line says so plainly.
    monkeypatch.setattr(isolation, "landlock_abi", lambda: 0)
    text = describe_level("rlimits")
    assert "this kernel has no Landlock, so the code can read every file its uid may" in text
    assert "Landlock keeps" not in text


def test_landlock_probe_matches_the_kernel():
    # Either a version the rlimits level uses, or 0 (then describe_level says it hides nothing).
    abi = isolation.landlock_abi()
    assert isinstance(abi, int) and abi >= 0
    assert ("no Landlock" in describe_level("rlimits")) == (abi == 0)
