"""env.name for a user's environment (issue 32, item 3): ``myenv:Env`` finds ``./myenv.py``,
a file loaded by path imports the modules beside it, and a name that is neither says both forms.

agentrl/run/build.py ``_import_module_or_file``. Each test writes its files under tmp_path, runs
there (monkeypatch.chdir) and restores sys.path and sys.modules afterwards.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.run.build import make_env
from agentrl.run.config import ConfigError, load_config

ENV = '''
from {helper} import reverse


class ReverseEnv:
    def __init__(self, word: str = "abc"):
        self.word = reverse(word)

    def later(self):
        import {lazy}  # an import inside a method, after the load
        return {lazy}.VALUE
'''


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _env(name: str, *args: str):
    return make_env(load_config(None, [f"env.name={name}", *args]))


def _files(folder: Path, stem: str) -> None:
    _write(folder / f"{stem}.py", ENV.format(helper=f"{stem}_helper", lazy=f"{stem}_lazy"))
    _write(folder / f"{stem}_helper.py", "def reverse(s):\n    return s[::-1]\n")
    _write(folder / f"{stem}_lazy.py", "VALUE = 7\n")


def test_module_name_finds_a_file_in_the_working_directory(tmp_path, monkeypatch, clean_imports):
    _files(tmp_path, "myenv32")
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) not in sys.path  # what the `agentrl` console script sees
    env = _env("myenv32:ReverseEnv", "env.args.word=hello")
    assert env.word == "olleh" and env.later() == 7
    assert type(env).__module__ == "myenv32"  # its real name: pickling and `import myenv32` agree


def test_dotted_name_finds_a_file_below_the_working_directory(tmp_path, monkeypatch, clean_imports):
    _write(tmp_path / "mypkg32" / "envs32.py", "class E:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert type(_env("mypkg32.envs32:E")).__name__ == "E"


def test_file_path_imports_its_sibling_modules(tmp_path, monkeypatch, clean_imports):
    _files(tmp_path / "project", "fileenv32")
    monkeypatch.chdir(tmp_path)
    env = _env("project/fileenv32.py:ReverseEnv")
    assert env.word == "cba" and env.later() == 7


def test_neither_a_module_nor_a_file_names_both_forms(tmp_path, monkeypatch, clean_imports):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        _env("nothere32:ReverseEnv")
    msg = str(err.value)
    assert "cannot import environment 'nothere32:ReverseEnv'" in msg
    assert f"no file {tmp_path / 'nothere32.py'}" in msg
    assert "mypackage.myenv:MyEnv" in msg and "path/to/nothere32.py:MyEnv" in msg
    with pytest.raises(ConfigError, match=r"no file .*missing32\.py \(a path relative to the working directory"):
        _env("missing32.py:ReverseEnv")
    with pytest.raises(ConfigError, match=r"'mypackage.myenv:MyEnv' \(a module.*'path/to/file.py:MyEnv' \(a file\)"):
        _env("nocolon32")


def test_a_missing_dependency_of_a_found_module_is_reported_as_itself(tmp_path, monkeypatch, clean_imports):
    _write(tmp_path / "depenv32.py", "import not_installed_dep32\n\nclass E:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="No module named 'not_installed_dep32'"):
        _env("depenv32:E")
    with pytest.raises(ConfigError, match="No module named 'not_installed_dep32'"):
        _env("depenv32.py:E")
    assert "agentrl_user_depenv32" not in sys.modules  # a failed load is not cached
