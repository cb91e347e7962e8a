"""Bad input stops with one message that names the place and the fix (issue 32, item 8):
malformed YAML (file, line, column), a bad override, an out-of-range number, a checker that
raises (environment, task, original exception), and a crash (the resume command)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentrl import cli
from agentrl.algo.objective import Objective
from agentrl.rollout.base import RolloutConfig
from agentrl.run.config import ConfigError, load_config
from agentrl.run.retry import InfraStopError
from agentrl.run.scoring import score_all
from agentrl.types import Message, Task, Trajectory

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ntrain:\n  steps: 3\n   prompts_per_step: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}, line 4, column 20: mapping values are not allowed here; fix the YAML")
    assert e.value.__cause__ is None and e.value.__suppress_context__
    p.write_text("rollout:\n  stop_strings: [a, b\n")
    with pytest.raises(ConfigError, match=r"line 3, column 1: expected ',' or '\]'.*sequence that starts at line 2"):
        load_config(p)


def test_an_override_with_bad_yaml_names_the_override():
    with pytest.raises(ConfigError, match=r"override 'rollout.stop_strings=\[</answer>': the value is not valid YAML"):
        load_config(None, ["rollout.stop_strings=[</answer>"])


@pytest.mark.parametrize("override, needle", [
    ("train.steps=-3", "train.steps=-3 is out of range: use >= 1"),
    ("train.steps=0", "train.steps=0 is out of range"),
    ("train.prompts_per_step=0", "train.prompts_per_step=0 is out of range: use >= 1"),
    ("train.max_staleness=-1", "train.max_staleness=-1 is out of range: use >= 0"),
    ("eval.every=-1", "eval.every=-1 is out of range: use >= 0"),
    ("eval.num_tasks=-2", "eval.num_tasks=-2"),
    ("algo.num_samples=1", "algo.num_samples=1 is out of range: use >= 2"),
    ("algo.kl_coef=-0.1", "algo.kl_coef=-0.1"),
    ("algo.dual_clip=0.5", "algo.dual_clip=0.5 is out of range: use > 1"),
    ("algo.std_floor=0", "algo.std_floor=0.0"),
    ("optim.lr=0", "optim.lr=0.0 is out of range: use > 0"),
    ("optim.lr=-1e-4", "optim.lr=-0.0001"),
    ("optim.betas=[0.9, 1.5]", "optim.betas=[0.9, 1.5]"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm=0.0"),
    ("rollout.max_turns=0", "rollout.max_turns=0 is out of range: use >= 1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0"),
    ("rollout.max_total_tokens=-5", "rollout.max_total_tokens=-5"),
    ("rollout.temperature=-1", "rollout.temperature=-1.0"),
    ("rollout.top_p=0", "rollout.top_p=0.0 is out of range: use a value in (0, 1]"),
    ("tools.timeout=0", "tools.timeout=0.0 is out of range: use > 0"),
    ("tools.max_output_tokens=0", "tools.max_output_tokens=0"),
    ("model.num_threads=0", "model.num_threads=0"),
])
def test_out_of_range_numbers_name_the_key_and_the_range(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_validation_keeps_valid_edges_and_direct_constructions():
    cfg = load_config(None, ["eval.every=0", "eval.num_tasks=0", "train.checkpoint_every=0", "algo.kl_coef=0",
                             "rollout.temperature=0", "train.steps=1", "algo.num_samples=2"])
    assert cfg.train.steps == 1
    for name in ["arithmetic_ci", "arithmetic_tiny", "math_tiny", "search_tiny", "smollm2_tir", "openai_agent_tiny",
                 "gpu_fsdp_qwen2.5_1.5b", "gpu_gsm8k_qwen2.5_1.5b", "gpu_qwen2.5_1.5b_python", "gpu_search_qwen2.5_3b"]:
        load_config(ROOT / "examples" / f"{name}.yaml")
    assert Objective().num_samples == 8 and Objective(kl_coef=0.05, norm_len=512).uses_reference
    with pytest.raises(ConfigError, match="algo.num_samples=1"):
        Objective(num_samples=1)
    with pytest.raises(ConfigError, match="algo.eps_high=-0.1"):
        dataclasses.replace(Objective(), eps_high=-0.1)
    assert dataclasses.replace(RolloutConfig(), temperature=0.0).temperature == 0.0
    with pytest.raises(ConfigError, match="rollout.max_turns=0"):
        RolloutConfig(max_turns=0)


def test_cli_prints_one_error_line_for_a_bad_number(capsys):
    assert cli.main(["train", str(CI_CFG), "train.steps=-3"]) == 2
    err = capsys.readouterr().err
    assert err == "error: train.steps=-3 is out of range: use >= 1 (to evaluate without training: agentrl eval)\n"


class _BrokenEnv:
    def score(self, task, messages):
        return int(messages[-1].content)  # the checker's bug: assumes a bare number


def _traj(task_id: str, text: str) -> Trajectory:
    return Trajectory(token_ids=[1, 2], prompt_len=1, loss_mask=[0, 1], logprobs=[0.0, -1.0], spans=[],
                      messages=[Message("user", "q"), Message("assistant", text)], task_id=task_id,
                      group_id="g0", sample_index=3)


def test_a_checker_that_raises_names_the_environment_the_task_and_the_cause():
    """Not a crash and not a reward: an infrastructure failure of the attempt, whose message
    names the checker, the task, the attempt and the cause."""
    tasks = {"arith-17": Task("arith-17", "What is 2+2?", "4")}
    t = _traj("arith-17", "<answer>4</answer>")
    score_all(_BrokenEnv(), tasks, [t])
    assert t.verdict is None and t.reward is None and t.outcome == "infra"
    assert (t.failure.source, t.failure.cause) == ("checker", "valueerror")
    msg = t.failure.message
    assert msg.startswith("_BrokenEnv.score raised on task 'arith-17' (attempt 3 of group 'g0'): ValueError: "
                          "invalid literal for int()")
    assert "fix it: score(task, messages) must return a Score" in msg and "'<answer>4</answer>'" in msg


@pytest.mark.slow
def test_a_crash_during_training_prints_the_resume_command(tmp_path, monkeypatch, capsys):
    """A checker that raises mid-run: the error names the task, and the last checkpoint's
    resume command is printed before the traceback."""
    from agentrl.envs.arithmetic import ArithmeticEnv

    orig, calls = ArithmeticEnv.score, []

    def score(self, task, messages):
        calls.append(task.id)
        if len(calls) > 2 * 16:  # step 3 (4 prompts x 4 samples a step)
            raise KeyError("answer")
        return orig(self, task, messages)

    monkeypatch.setattr(ArithmeticEnv, "score", score)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InfraStopError, match=r"step 3: 16 of 16 attempts failed .* checker \(keyerror\): 16.*"
                                             r"ArithmeticEnv.score raised on task '[^']+' .*KeyError: 'answer'"):
        cli.main(["train", str(CI_CFG), "output_dir=runs/c", "train.steps=4", "eval.at_start=false",
                  "eval.num_tasks=2", "rollout.infra_backoff_s=0"])
    err = capsys.readouterr().err
    assert ("the run stopped on an error (traceback below); resume with: agentrl train runs/c/config.yaml "
            "resume=true  (last checkpoint: step_000002)") in err
