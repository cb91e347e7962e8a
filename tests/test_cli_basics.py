"""What a new user reaches for first (issue 32, item 9): ``agentrl --version``, and the config
reference ``agentrl config [SECTION]`` generated from the config dataclasses, which
``docs/config.md`` is a copy of and ``agentrl train --help`` points at."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.cli import main
from agentrl.run.config import Config
from agentrl.run.config_doc import config_keys, render_markdown

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "run `agentrl config --markdown > docs/config.md` (from the repository root)"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        is_section = isinstance(v, dict) and prefix == ""  # sections hold no sections
        out.update(_flat(v, f"{k}.") if is_section else {prefix + k: v})
    return out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"agentrl {agentrl.__version__}\n"
    out = subprocess.run([sys.executable, "-m", "agentrl", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"agentrl {agentrl.__version__}"


def test_config_prints_a_section_or_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "algo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algo  (AlgoConfig): The GRPO objective")
    assert "  algo.eps_high: float = 0.2\n      DAPO clip-higher: 0.28\n" in out
    assert "train.steps" not in out
    assert main(["config", "rollout.max_turns"]) == 0
    assert capsys.readouterr().out == "rollout  (RolloutConfig): Budgets and sampling of a multi-turn rollout.\n" \
                                      "  rollout.max_turns: int = 4\n      model turns per attempt\n"
    assert main(["config"]) == 0
    whole = capsys.readouterr().out
    assert whole.startswith("top level  (Config)\n  name: str = \"run\"\n")
    assert all(f"  {k.key}: " in whole for k in config_keys())


def test_config_names_the_sections_for_anything_else(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "algos"]) == 2
    err = capsys.readouterr().err
    assert "no config section or key 'algos'; sections: model, env, tools, rollout, algo, optim" in err


def test_reference_covers_every_key_with_a_description() -> None:
    keys = config_keys()
    assert [k.key for k in keys] == list(_flat(dataclasses.asdict(Config())))
    undocumented = [k.key for k in keys if not k.description]
    assert undocumented == [], ("give these config fields a comment (on the field's line or the line above); "
                                f"it is their description in the reference, then {REGENERATE}")
    by_key = {k.key: k for k in keys}
    assert (by_key["optim.schedule"].type, by_key["optim.schedule"].default) == (
        'Literal["constant", "cosine", "linear"]', '"constant"')
    assert (by_key["optim.betas"].default, by_key["model.template"].default) == ("[0.9, 0.99]", "null")
    # a comment block above the field and one on its line are joined
    assert by_key["algo.kl_coef"].description == "KL to the frozen reference: L_t += β·KL_t — β; 0 loads no reference model"
    assert by_key["warmstart.corruption"].description == "share of the mix made deliberately wrong"  # inherited field


def test_docs_config_md_is_the_generated_reference() -> None:
    page = ROOT / "docs" / "config.md"
    assert page.exists(), f"docs/config.md is missing: {REGENERATE}"
    assert page.read_text() == render_markdown(), f"docs/config.md is out of date: {REGENERATE}"


def test_train_help_points_at_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Every config key, its type, default and meaning: `agentrl config`" in out and "docs/config.md" in out
