"""Resuming a run keeps its settings (issue 32, item 1): a run stopped at step k resumes with
the command it printed, to its original steps and eval schedule; an override that would change
the objective or the data is refused; ``train.steps=N`` extends the run and is recorded."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from agentrl import cli
from agentrl.run.config import ConfigError, load_config
from agentrl.run.resume import RESUMABLE, changes, load_train_config, resume_command, resume_hint, run_dir_of
from agentrl.run.trainer import Trainer, train

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _stop_at(monkeypatch, step: int) -> None:
    """Ctrl-C as step ``step`` begins."""
    orig = Trainer.train_step

    def train_step(self, s):
        if s == step:
            raise KeyboardInterrupt
        return orig(self, s)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def _start_and_stop(tmp_path, monkeypatch, capsys, stop: int = 4) -> tuple[Path, str]:
    """The user's sequence: overrides on the command line, Ctrl-C at step ``stop``; returns the
    run dir and the printed resume command."""
    run = tmp_path / "runs" / "x"
    monkeypatch.chdir(tmp_path)
    _stop_at(monkeypatch, stop)
    rc = cli.main(["train", str(CI_CFG), "output_dir=runs/x", "train.steps=6", "eval.every=2",
                   "eval.at_start=false", "eval.num_tasks=2"])
    err = capsys.readouterr().err
    assert rc == 130
    line = next(x for x in err.splitlines() if x.startswith("stopped; resume with: "))
    command = line.removeprefix("stopped; resume with: ").split("  (")[0]
    assert command == "agentrl train runs/x/config.yaml resume=true", line
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    return run, command


@pytest.mark.slow
def test_printed_command_resumes_the_same_run_then_steps_extend_it(tmp_path, monkeypatch, capsys):
    run, command = _start_and_stop(tmp_path, monkeypatch, capsys, stop=4)
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]
    saved_before = (run / "config.yaml").read_text()

    argv = shlex.split(command)
    assert argv[0] == "agentrl" and cli.main(argv[1:]) == 0  # exactly as printed
    out = capsys.readouterr().out
    assert "resumed from" in out and "(step 3)" in out and "resume: train" not in out
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # the original train.steps
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2, 4, 6]  # the original eval.every
    saved = yaml.safe_load((run / "config.yaml").read_text())
    before = yaml.safe_load(saved_before)
    assert {k: v for k, v in saved.items() if k != "resume"} == {k: v for k, v in before.items() if k != "resume"}
    assert not (run / "resume.log").exists()

    # Extending: train.steps is the one setting a resume is for; it is printed and recorded.
    assert cli.main(["train", "runs/x", "resume=true", "train.steps=8"]) == 0
    out = capsys.readouterr().out
    assert "resume: train.steps: 6 -> 8 (recorded in runs/x/config.yaml)" in out
    assert [r["step"] for r in _rows(run)][-2:] == [7, 8]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 8
    assert "resumed at step 6: train.steps: 6 -> 8" in (run / "resume.log").read_text()


@pytest.mark.slow
def test_resume_refuses_overrides_that_change_the_run(tmp_path, monkeypatch, capsys):
    run, _ = _start_and_stop(tmp_path, monkeypatch, capsys, stop=2)
    saved = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError) as e:
        load_train_config("runs/x/config.yaml", ["resume=true", "eval.every=5", "optim.lr=0.1"])
    msg = str(e.value)
    assert "refused: optim.lr=0.1 (the run has 0.0001), eval.every=5 (the run has 2)" in msg
    assert "A resume may change only train.steps" in msg and "another output_dir" in msg
    # through the CLI: one error line, nothing written
    assert cli.main(["train", "runs/x", "resume=true", "algo.num_samples=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: resume keeps the run's settings")
    assert "algo.num_samples=8 (the run has 4)" in err
    # an override equal to the run's setting changes nothing and passes
    assert load_train_config("runs/x", ["resume=true", "eval.every=2"]).eval.every == 2
    assert (run / "config.yaml").read_text() == saved
    # the Python API is checked against the saved config too
    with pytest.raises(ConfigError, match=r"refused: eval.every=3 \(the run has 2\)"):
        train(load_config("runs/x/config.yaml", ["resume=true", "eval.every=3"]))
    assert (run / "config.yaml").read_text() == saved


@pytest.mark.slow
def test_the_original_config_file_finds_the_run_and_its_settings_win(tmp_path, monkeypatch, capsys):
    run, _ = _start_and_stop(tmp_path, monkeypatch, capsys, stop=3)
    # the user's second command: the example file (steps 2, eval.every 0) with only output_dir
    cfg = load_train_config(CI_CFG, ["output_dir=runs/x", "resume=true"], log=print)
    out = capsys.readouterr().out
    assert (cfg.train.steps, cfg.eval.every, cfg.eval.num_tasks) == (6, 2, 2)
    assert "differs in train.steps (2 there, 6 in the run), eval.every (0 there, 2 in the run)" in out
    with pytest.raises(ConfigError, match="names another directory"):
        load_train_config("runs/x/config.yaml", ["resume=true", "output_dir=runs/y"])
    with pytest.raises(ConfigError, match="already at step 2"):
        train(load_train_config(CI_CFG, ["output_dir=runs/x", "resume=true", "train.steps=1"]))
    with pytest.raises(ConfigError, match="resume it with `agentrl train runs/x/config.yaml resume=true`"):
        train(load_config(CI_CFG, ["output_dir=runs/x"]))


def test_run_paths_and_the_printed_command(tmp_path):
    run = tmp_path / "my runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: x\n")
    assert run_dir_of(run) == run and run_dir_of(run / "config.yaml") == run
    assert run_dir_of(CI_CFG) is None
    with pytest.raises(ConfigError, match="without a config.yaml"):
        run_dir_of(tmp_path)
    assert resume_hint(run).startswith(f"no checkpoint in {run} yet: nothing to resume")
    cmd = resume_command(run)
    assert shlex.split(cmd) == ["agentrl", "train", str(run / "config.yaml"), "resume=true"]


def test_changes_name_every_differing_key_and_the_allowed_list_is_deliberate():
    a = load_config(CI_CFG)
    b = load_config(CI_CFG, ["train.steps=9", "env.args.num_train=5", "resume=true"])
    assert changes(a, b) == [("env.args.num_train", 200, 5), ("train.steps", 2, 9)]
    # nothing that changes the objective, the data, the model or the evaluation may change
    assert all(k.split(".")[0] in ("train", "model", "alarms") for k in RESUMABLE)
    for key in ["train.prompts_per_step", "train.num_iterations", "train.max_staleness", "model.path", "seed"]:
        assert key not in RESUMABLE
