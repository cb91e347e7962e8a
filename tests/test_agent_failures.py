"""OpenAI-API agents that fail before their first completion are never dropped silently: each
such attempt is an empty trajectory with its error and reward 0 (counted in its group, in
``agent/errors``), and a run whose every attempt fails stops after ``agent.max_failed_steps``
consecutive steps with the agents' errors. Real endpoint, real openai SDK, a real run."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")

from agentrl.algo.objective import Objective  # noqa: E402
from agentrl.algo.update import compute_advantages  # noqa: E402
from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.env import Score  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.rollout import RolloutConfig  # noqa: E402
from agentrl.rollout.agent_runner import (AgentRunner, AgentSettings, AgentStopError, agent_failures,  # noqa: E402
                                          agent_metrics, failed_step_streak)
from agentrl.run.retry import RetryPolicy, rollout_scored  # noqa: E402
from agentrl.types import Task, read_jsonl, write_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


class Env:
    system_prompt = None

    def score(self, task, messages):
        return Score(1.0 if messages and "<answer>42</answer>" in messages[-1].content else 0.0)


def test_attempts_that_fail_before_any_completion_are_recorded_and_count_as_zero(tok, tmp_path):
    end = tok.convert_tokens_to_ids("<|im_end|>")
    answer = tok.encode("<answer>42</answer>", add_special_tokens=False) + [end]
    engine = PerRequestScriptedEngine(lambda _p, _k: answer)
    calls: dict[str, int] = {}

    async def agent(client, task):
        calls[task.id] = calls.get(task.id, 0) + 1
        messages = [{"role": "user", "content": task.prompt}]
        if task.id == "flaky" and calls[task.id] == 1:
            raise ValueError("the agent's first plan did not parse")
        if task.id == "silent":
            return "no model needed"
        if task.id == "refused":  # a 400 from the endpoint, left to raise: the agent's own error
            await client.chat.completions.create(model="m", messages=messages, response_format={"type": "json_object"})
        r = await client.chat.completions.create(model="m", messages=messages)
        return r.choices[0].message.content

    runner = AgentRunner(engine, ChatTemplate(tok), agent, RolloutConfig(max_new_tokens=16),
                         AgentSettings(timeout_s=20))
    tasks = [Task("flaky", "q", "42"), Task("silent", "q", "42"), Task("refused", "q", "42")]
    try:
        batch = rollout_scored(runner, Env(), {t.id: t for t in tasks}, tasks, 2, None, seed=0, group_prefix="",
                               policy=RetryPolicy(retries=1, backoff_s=0.0))
    finally:
        runner.close()
    trajs = batch.trajectories
    ids = ("flaky", "silent", "refused")
    assert [(t.task_id, t.sample_index) for t in trajs] == [(i, k) for i in ids for k in (0, 1)]
    by = {(t.task_id, t.sample_index): t for t in trajs}
    early = by[("flaky", 0)]
    assert early.agent.error == "ValueError: the agent's first plan did not parse"
    assert early.reward == 0.0 and early.failure is None and early.outcome == "policy" and not early.retried
    assert early.token_ids == [] and early.finish_reason == "error" and sum(early.loss_mask) == 0
    assert by[("flaky", 1)].reward == 1.0 and by[("flaky", 1)].agent.error is None
    for k in (0, 1):
        assert "without a completion" in by[("silent", k)].agent.error and by[("silent", k)].reward == 0.0
        err = by[("refused", k)].agent.error
        assert err.startswith("BadRequestError") and "response_format" in err and "constrained decoding" in err
    for t in trajs:
        t.check()
    assert agent_metrics(trajs)["agent/errors"] == pytest.approx(5 / 6)
    assert agent_failures(trajs)[:2] == (5, 6)
    # the early failure is in its group's baseline: r = [0, 1] -> A = [-1, +1]; it trains no token
    compute_advantages(trajs, Objective())
    assert (early.advantage, by[("flaky", 1)].advantage) == pytest.approx((-1.0, 1.0))
    write_jsonl(str(tmp_path / "r.jsonl"), trajs)
    back = read_jsonl(str(tmp_path / "r.jsonl"))[0]
    assert (back.agent.error, back.reward, back.outcome, back.token_ids) == (early.agent.error, 0.0, "policy", [])


def test_the_stop_rule_counts_consecutive_steps_where_every_attempt_failed():
    errs = ["ValueError: x"] * 3 + ["KeyError: 'k'"]
    assert failed_step_streak(0, 4, 4, 3, 1, errs) == 1
    assert failed_step_streak(1, 4, 4, 3, 2, errs) == 2
    assert failed_step_streak(2, 3, 4, 3, 3, errs) == 0  # one attempt ran: the streak starts again
    assert failed_step_streak(0, 0, 0, 3, 3, []) == 0
    assert failed_step_streak(10, 4, 4, 0, 11, errs) == 11  # 0: never stop
    with pytest.raises(AgentStopError, match=r"step 3: every attempt's agent failed in 3 consecutive steps "
                                             r"\(agent.max_failed_steps=3\), 4 of 4 this step; its errors: "
                                             r"3 x ValueError: x; 1 x KeyError: 'k'") as got:
        failed_step_streak(2, 4, 4, 3, 3, errs)
    assert got.value.errors == errs


class EarlyRaisingAgentEnv:
    """The arithmetic tasks, with an agent that raises before its first request."""

    name = "early-raising-agent"

    def __init__(self, **args):
        from agentrl.envs.arithmetic import ArithmeticEnv

        self._env = ArithmeticEnv(num_train=20, num_test=4)
        self.system_prompt = ""

    async def agent(self, client, task):
        raise FileNotFoundError("agent.toml: the agent cannot read its own config")

    def tools(self):
        return []

    def tasks(self, split):
        return self._env.tasks(split)

    def score(self, task, messages):
        return self._env.score(task, messages)


def test_a_run_whose_agent_always_fails_stops_with_its_error(tmp_path, monkeypatch, capsys):
    """`agentrl train` on an agent that raises before its first request: every step's attempts
    are recorded with the error (agent/errors 1, reward 0, never nan), the first error is
    printed each step, and after agent.max_failed_steps=2 steps the run stops (an exception
    out of cli.main: exit 1 from the command line) with the agent's error."""
    from pathlib import Path

    from agentrl import cli
    from agentrl.run.metrics import read_metrics

    monkeypatch.chdir(tmp_path)
    example = Path(__file__).resolve().parents[1] / "examples" / "openai_agent_tiny.yaml"
    with pytest.raises(AgentStopError, match=r"step 2: every attempt's agent failed in 2 consecutive steps .*"
                                             r"4 x FileNotFoundError: agent.toml: the agent cannot read its own "
                                             r"config"):
        cli.main(["train", str(example), "output_dir=runs/a", f"env.name={__name__}:EarlyRaisingAgentEnv",
                  "warmstart.enabled=false", "train.steps=4", "train.prompts_per_step=2", "algo.num_samples=2",
                  "eval.at_start=false", "eval.every=0", "eval.num_tasks=2", "train.checkpoint_every=1"])
    captured = capsys.readouterr()
    assert "step 1: 4 of 4 agent attempts failed (agent/errors 1.00); first: FileNotFoundError: agent.toml" \
        in captured.out
    assert "the run stopped on an error" in captured.err
    rows = read_metrics(tmp_path / "runs" / "a" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1]  # step 2 stopped before its update
    assert rows[0]["agent/errors"] == 1.0 and rows[0]["reward/mean"] == 0.0
    (t, *_) = read_jsonl(str(tmp_path / "runs" / "a" / "rollouts" / "step_000001.jsonl"))
    assert t.agent.error.startswith("FileNotFoundError") and t.reward == 0.0
