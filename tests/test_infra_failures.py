"""Infrastructure failures never become rewards (docs/design.md, "Failures"): retried with a
new seed stream, then excluded from the group baseline and the loss; counted; a step with too
many stops the run. Real runner, real tools, real checker calls; hand numbers for the math."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest
import torch

from agentrl import InfraError
from agentrl.algo.grpo import group_advantages
from agentrl.algo.objective import Objective
from agentrl.algo.update import compute_advantages
from agentrl.chat import ChatTemplate
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine
from agentrl.env import Score
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.run.collect import intact_groups, signal_groups
from agentrl.run.retry import InfraStopError, RetryPolicy, check_failure_rate, infra_metrics, rollout_scored
from agentrl.toolbox import ToolBox, ToolContext, tool
from agentrl.toolbox.faults import FaultPlan
from agentrl.types import Failure, Message, Task, Trajectory, Verdict
from fixture_paths import QWEN25

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'
FAILS: Counter = Counter()  # (trajectory id, rollout seed) -> infrastructure failures to raise
SEEN: list[tuple[str, int | None]] = []  # (trajectory id, rollout seed) of every call


@tool
def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up in a backend that may be down.

    Args:
        key: what to look up
    """
    SEEN.append((ctx.trajectory_id, ctx.seed))
    if FAILS[(ctx.trajectory_id, None)] > 0:  # down for good
        raise InfraError("the lookup backend answered 503", cause="backend_unavailable")
    if FAILS[(ctx.trajectory_id, ctx.seed)] > 0:
        FAILS[(ctx.trajectory_id, ctx.seed)] -= 1
        raise InfraError("the lookup backend answered 503", cause="backend_unavailable")
    return "42"


class AnswerEnv:
    system_prompt = "Look it up, then answer."

    def __init__(self, raise_times: int = 0):
        self.raise_times = raise_times  # the checker raises on its first calls

    def score(self, task: Task, messages: list[Message]) -> Score:
        if self.raise_times > 0:
            self.raise_times -= 1
            raise InfraError("the judge service timed out", cause="judge_timeout")
        said = [m.content for m in messages if m.role == "assistant"]
        return Score(1.0 if said and "<answer>42</answer>" in said[-1] else 0.0)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN25)


def make_runner(tok, loop: str, faults: FaultPlan | None = None, call_retries: int = 0) -> RolloutRunner:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = tok.encode(CALL, add_special_tokens=False) + [end]
    answer = tok.encode("<answer>42</answer>", add_special_tokens=False) + [end]

    def script(prompt: list[int], _call: int) -> list[int]:  # call the tool, answer once it replied
        return answer if prompt.count(end) > 2 else call  # system and user turns end in the prompt

    eng = PerRequestScriptedEngine(script) if loop == "attempt" else ScriptedEngine(script)
    box = ToolBox([lookup], tokenizer=tok, faults=faults, infra_retries=call_retries, infra_backoff_s=0.0)
    return RolloutRunner(eng, ChatTemplate(tok, "hermes"), box, RolloutConfig(max_turns=3, loop=loop))


TASKS = [Task(id="a", prompt="what is x?", answer="42"), Task(id="b", prompt="and y?", answer="42")]
BY_ID = {t.id: t for t in TASKS}


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_a_tool_outage_ends_the_attempt_and_its_retry_takes_its_place(tok, loop):
    FAILS.clear(), SEEN.clear()
    FAILS[("p/a/1", 11)] = 1  # attempt 1 of task a: the backend is down on its first try only
    FAILS[("p/b/2", 11)] = 1  # attempt 2 of task b: down on its first try, and on each retry (a
    FAILS[("p/b/0", 11 + 104_729)] = FAILS[("p/b/0", 11 + 2 * 104_729)] = 1  # retry runs as attempt 0)
    naps: list[float] = []
    batch = rollout_scored(make_runner(tok, loop), AnswerEnv(), BY_ID, TASKS, 3, "sys", seed=11, group_prefix="p/",
                           policy=RetryPolicy(retries=2, backoff_s=0.25), sleep=naps.append)
    trajs = batch.trajectories
    assert [(t.group_id, t.sample_index) for t in trajs] == [(f"p/{g}", i) for g in "ab" for i in range(3)]
    a1, b2 = trajs[1], trajs[5]
    assert a1.failure is None and a1.reward == 1.0 and a1.outcome == "ok"
    assert [(f.source, f.cause) for f in a1.retried] == [("tool:lookup", "backend_unavailable")]
    assert b2.failure == Failure("tool:lookup", "backend_unavailable", "the lookup backend answered 503")
    assert len(b2.retried) == 2 and b2.verdict is None and b2.reward is None and b2.outcome == "infra"
    # the failed try ended at the outage: the model never read the error as an observation
    assert b2.finish_reason == "error" and b2.tool_calls[-1].error == "infra" and b2.turns == 1
    assert all(t.kind != "tool" for t in b2.spans)
    assert naps == [0.25, 0.5]  # exponential backoff, one wait per round
    # every retry sampled a new seed stream
    seeds = [s for tid, s in SEEN if tid == "p/b/0"]
    assert len(set(seeds)) == 3 and seeds[0] == 11
    for t in trajs:
        t.check()
    m = infra_metrics(trajs, excluded=1, groups_dropped=0)
    assert (m["infra/failed"], m["infra/retried"], m["infra/excluded"]) == (4.0, 3.0, 1.0)
    assert m["infra/source/tool_lookup"] == 4.0 and m["infra/cause/backend_unavailable"] == 4.0


def test_a_checker_outage_is_scored_again_without_a_new_rollout(tok):
    FAILS.clear(), SEEN.clear()
    batch = rollout_scored(make_runner(tok, "lockstep"), AnswerEnv(raise_times=2), BY_ID, TASKS, 2, "sys", seed=3,
                           group_prefix="q/", policy=RetryPolicy(retries=1, backoff_s=0.0))
    assert len(SEEN) == 4  # one call per attempt: nothing was rolled out again
    assert all(t.failure is None and t.reward == 1.0 for t in batch.trajectories)
    assert [len(t.retried) for t in batch.trajectories] == [1, 1, 0, 0]
    assert batch.trajectories[0].retried[0].source == "checker"


def _traj(group: str, i: int, reward: float | None, failed: bool = False) -> Trajectory:
    t = Trajectory(token_ids=[1, 2, 3], prompt_len=1, loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5], spans=[],
                   messages=[], group_id=group, sample_index=i)
    t.verdict = None if reward is None else Verdict(reward)
    t.failure = Failure("tool:python", "sandbox_died", "gone") if failed else None
    return t


def test_survivors_get_exactly_the_advantages_of_their_group_without_the_failures():
    """Hand numbers: group g = rewards 1, 0, 1 and one failure. Without the failure: mean 2/3,
    population std sqrt(2)/3, so A = +1/sqrt(2) for the successes and -sqrt(2) for the failure
    that ran. Scored as 0, the failed attempt would have given mean 1/2, std 1/2: A = +1, -1."""
    trajs = [_traj("g", 0, 1.0), _traj("g", 1, 0.0), _traj("g", 2, 1.0), _traj("g", 3, None, failed=True),
             _traj("h", 0, 1.0), _traj("h", 1, None, failed=True), _traj("h", 2, None, failed=True),
             _traj("k", 0, 0.0), _traj("k", 1, 1.0)]
    adv, filt = compute_advantages(trajs, Objective())
    got = [t.advantage for t in trajs]
    s = 1 / math.sqrt(2)
    assert got[:3] == pytest.approx([s, -2 * s, s], abs=1e-12) and got[3] is None
    assert got[4:7] == [None, None, None]  # h: one attempt ran; the group is dropped whole
    assert got[7:] == [-1.0, 1.0]
    alone = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64), ["g", "g", "g", "k", "k"])
    assert [got[i] for i in (0, 1, 2, 7, 8)] == alone.advantages.tolist()  # bit for bit
    assert filt.keep.tolist() == [True, True, True, False, False, False, False, True, True]
    assert (filt.excluded_infra, filt.dropped_infra_groups) == (4, 1)
    assert adv.group_keys == ["g", "k"] and adv.zero_variance.tolist() == [False, False]
    assert intact_groups(trajs) == 2 and signal_groups(trajs) == 2


def test_a_failure_in_a_split_attempt_excludes_every_segment():
    segs = [_traj("g", 0, 1.0), _traj("g", 0, 1.0), _traj("g", 1, None, failed=True), _traj("g", 1, None, True),
            _traj("g", 2, 0.0)]
    _, filt = compute_advantages(segs, Objective())
    assert filt.keep.tolist() == [True, True, False, False, True] and filt.excluded_infra == 1
    assert [t.advantage for t in segs] == [1.0, 1.0, None, None, -1.0]


def test_no_failure_leaves_compute_advantages_unchanged():
    trajs = [_traj("g", i, r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    adv, filt = compute_advantages(trajs, Objective())
    assert [t.advantage for t in trajs] == [1.0, -1.0, -1.0, 1.0] and filt.excluded_infra == 0
    assert filt.keep.all()


def test_too_many_standing_failures_stop_with_the_causes():
    trajs = [_traj("g", 0, 1.0), _traj("g", 1, None, failed=True), _traj("g", 2, None, failed=True)]
    check_failure_rate(trajs, 0.7, step=4)  # 2 of 3 is under 0.7
    with pytest.raises(InfraStopError, match=r"step 4: 2 of 3 attempts failed .*tool:python \(sandbox_died\): 2. "
                                             r"First: gone") as e:
        check_failure_rate(trajs, 0.5, step=4)
    assert len(e.value.failures) == 2


def test_fault_injection_is_seeded_and_every_failure_is_recorded(tok):
    plan = FaultPlan(rate=0.3, seed=5)
    runs = []
    for _ in range(2):
        FAILS.clear()
        many = [Task(id=f"t{i}", prompt=f"what is x{i}?", answer="42") for i in range(16)]
        batch = make_runner(tok, "attempt", plan).run(many, 4, "sys", seed=9, group_prefix="f/")
        runs.append([(t.group_id, t.sample_index, None if t.failure is None else t.failure.cause)
                     for t in batch.trajectories])
    assert runs[0] == runs[1]  # the same faults run to run, whatever the order of the calls
    injected = [c for *_, c in runs[0] if c is not None]
    assert injected and set(injected) == {"injected"} and len(injected) < len(runs[0])
    draws = [plan.fails(ToolContext(f"g/{i}", seed=1), 0) for i in range(20_000)]
    assert abs(sum(draws) / len(draws) - 0.3) < 0.015  # the rate asked for (4.6 standard errors)


def test_the_inspector_shows_a_standing_failure_and_the_retries(tmp_path, capsys):
    """Terminal and HTML: the failure that stood, its source and cause, that it was excluded,
    and the failed tries before a retried attempt."""
    from agentrl.inspect.cli import run_inspect
    from agentrl.types import Span, write_jsonl

    def traj(i: int, reward: float | None) -> Trajectory:
        t = Trajectory(token_ids=[1, 2, 3], prompt_len=1, loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5],
                       spans=[Span(0, 1, "prompt"), Span(1, 3, "model")], messages=[], group_id="s1d0/a",
                       sample_index=i)
        t.verdict = None if reward is None else Verdict(reward)
        return t

    stood, retried = traj(0, None), traj(1, 1.0)
    stood.failure = Failure("tool:python", "sandbox_died", "server died")
    retried.retried = [Failure("tool:search", "index_unreadable", "x"), Failure("checker", "keyerror", "y")]
    path = tmp_path / "step_000001.jsonl"
    write_jsonl(str(path), [stood, retried, traj(2, 0.0)])
    assert run_inspect([str(path), "--index", "0", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert ("infrastructure failure (tool:python, sandbox_died): server died — excluded: no reward, no advantage, "
            "not trained") in out
    assert "not scored: an infrastructure failure, excluded from its group and the loss" in out
    assert run_inspect([str(path), "--index", "1", "--no-color"]) == 0
    assert ("retried 2 times after infrastructure failures: tool:search (index_unreadable), checker (keyerror)"
            in capsys.readouterr().out)
    html = tmp_path / "page.html"
    assert run_inspect([str(path), "--index", "0", "--html", str(html)]) == 0
    assert "infrastructure failure (tool:python, sandbox_died)" in html.read_text()


def _recomputed_from_survivors(trajs: list[Trajectory]) -> dict[tuple[str, int], float]:
    """The advantages the attempts that ran would get with no failure ever sampled: groups of
    at least 2 survivors, by the same ``group_advantages``."""
    ran: dict[str, list[Trajectory]] = {}
    for t in trajs:
        if t.failure is None:
            ran.setdefault(t.group_id, []).append(t)
    keep = [t for ts in ran.values() if len(ts) >= 2 for t in ts]
    adv = group_advantages(torch.tensor([t.reward for t in keep], dtype=torch.float64), [t.group_id for t in keep])
    return {(t.group_id, t.sample_index): a for t, a in zip(keep, adv.advantages.tolist())}


# the warm start of tests/test_async.py (cached per machine): the model calls the tool
TOOL_WARM_START = ["warmstart.enabled=true", "warmstart.num_demos=512", "warmstart.steps=200", "warmstart.lr=0.002",
                   "warmstart.batch_size=16", "warmstart.corruption=0.0", "rollout.max_new_tokens=96",
                   "rollout.max_total_tokens=600"]
RUNS = {  # (example config, its overrides, the source its injected faults have)
    "native": ("arithmetic_ci.yaml", TOOL_WARM_START, "tool:python"),
    "async": ("arithmetic_ci.yaml", [*TOOL_WARM_START, "train.max_staleness=1"], "tool:python"),
    "agent": ("openai_agent_tiny.yaml", ["train.prompts_per_step=8"], "agent"),  # its own warm start (CI has it)
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(RUNS))
def test_a_real_run_with_injected_faults_trains_on_the_survivors_alone(tmp_path, kind):
    """Injected faults at 30% with no retry, in the native runner (synchronous and with the
    rollout thread) and in the OpenAI-API agent runner: every surviving attempt's recorded
    advantage is exactly the one computed from the survivors alone; failures are recorded,
    counted and never rewarded."""
    import json
    from pathlib import Path

    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer
    from agentrl.types import read_jsonl

    example, overrides, source = RUNS[kind]
    run = tmp_path / kind
    cfg = load_config(Path(__file__).resolve().parents[1] / "examples" / example, [
        f"output_dir={run}", "train.steps=3", "eval.at_start=false", "eval.num_tasks=8", "eval.every=0",
        "train.checkpoint_every=100", "rollout.fault_rate=0.3", "rollout.infra_retries=0", "tools.infra_retries=0",
        *overrides])
    Trainer(cfg).train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "infra/failed" in r]
    assert len(steps) == 3 and sum(r["infra/excluded"] for r in steps) > 0
    assert all(r["infra/retried"] == 0 and r["infra/failed"] == r.get("infra/cause/injected", 0) for r in steps)
    failed = 0
    for path in sorted((run / "rollouts").glob("step_*.jsonl")):
        trajs = read_jsonl(str(path))
        want = _recomputed_from_survivors(trajs)
        for t in trajs:
            if (t.group_id, t.sample_index) in want:
                assert t.advantage == want[(t.group_id, t.sample_index)], path  # exactly
            else:  # failed, or in a group left with fewer than 2 that ran
                assert t.advantage is None and t.old_logprobs is None
            if t.failure is not None:
                failed += 1
                assert t.reward is None and t.failure.source == source and t.failure.cause == "injected"
                assert t.finish_reason == "error" and (source == "agent" or t.tool_calls[-1].error == "infra")
    assert failed == sum(r["infra/excluded"] for r in steps) - sum(  # the dropped groups' survivors aside
        1 for p in sorted((run / "rollouts").glob("step_*.jsonl")) for t in read_jsonl(str(p))
        if t.failure is None and t.advantage is None)


def test_a_group_dropped_for_failures_is_refilled(tok):
    """With algo.refill_batch, a group left with fewer than 2 attempts that ran is replaced by a
    new draw of prompts (here: both attempts of task a fail for good in the first draw)."""
    from pathlib import Path

    from agentrl.run.collect import collect_step
    from agentrl.run.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "examples" / "arithmetic_ci.yaml", [
        "algo.num_samples=2", "train.prompts_per_step=2", "rollout.infra_retries=0", "algo.refill_batch=true"])
    FAILS.clear()
    FAILS[("s1d0/a/0", None)] = FAILS[("s1d0/a/1", None)] = 1
    trajs, timing = collect_step(cfg, AnswerEnv(), TASKS, BY_ID, make_runner(tok, "lockstep"), step=1)
    assert timing["batch/draws"] == 2.0 and intact_groups(trajs) == 3
    _, filt = compute_advantages(trajs, Objective())
    assert (filt.excluded_infra, filt.dropped_infra_groups) == (2, 1)
    cfg = load_config(Path(__file__).resolve().parents[1] / "examples" / "arithmetic_ci.yaml", [
        "algo.num_samples=2", "train.prompts_per_step=2", "rollout.infra_retries=0"])
    assert collect_step(cfg, AnswerEnv(), TASKS, BY_ID, make_runner(tok, "lockstep"), step=1)[1]["batch/draws"] == 1


def test_a_stateless_call_is_retried_in_place_and_the_attempt_goes_on(tok):
    """A retryable InfraError runs the same call again: the attempt continues as if nothing
    failed (same tokens as an attempt that never failed), the retried failure is on the call's
    record and counted; a non-retryable one ends the attempt at once."""
    FAILS.clear(), SEEN.clear()
    clean = make_runner(tok, "lockstep").run(TASKS[:1], 1, "sys", seed=2, group_prefix="c/").trajectories[0]
    FAILS[("c/a/0", 2)] = 1  # the backend fails the first call of the attempt once
    runner = make_runner(tok, "lockstep", call_retries=2)
    (t,) = runner.run(TASKS[:1], 1, "sys", seed=2, group_prefix="c/").trajectories
    assert t.failure is None and t.token_ids == clean.token_ids and t.loss_mask == clean.loss_mask
    (call,) = t.tool_calls
    assert call.error is None and [f.cause for f in call.retried] == ["backend_unavailable"]
    assert infra_metrics([t], 0, 0)["infra/retried"] == 1.0
    assert Trajectory.from_json(t.to_json()).tool_calls[0].retried == call.retried

    @tool
    def stateful(key: str) -> str:
        """A notebook whose worker died.

        Args:
            key: what to look up
        """
        raise InfraError("the worker died and took the session's state", cause="worker_died", retryable=False)

    box = ToolBox([stateful], infra_retries=2, infra_backoff_s=0.0)
    res = asyncio.run(box.execute("stateful", {"key": "x"}, box.new_context("s")))
    assert res.error == "infra" and res.retried == [] and res.failure.cause == "worker_died"
