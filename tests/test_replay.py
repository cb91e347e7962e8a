"""The tape and `agentrl replay`: real runs of the CPU example recorded, then replayed.

Each run is 3 steps of the CI example with the warm start of tests/test_async.py (its model
calls the python tool, so the tape holds real calls). A replay must give the same token ids,
log-probs (bit-exact in the lock-step loop, within ATTEMPT_LOOP_TOL in the per-attempt loop),
tool calls, rewards, loss, gradient norm and parameter digest; a tampered tape or rollout
must be reported at the exact attempt, token or call.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.tape import CallRecord, StepTape, read_step_tape, step_of, tape_path
from agentrl.toolbox import ToolBox, tool
from agentrl.toolbox.tape import ToolTape
from agentrl.types import Failure, read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"
TOOL_WARM_START = ["warmstart.enabled=true", "warmstart.num_demos=512", "warmstart.steps=200", "warmstart.lr=0.002",
                   "warmstart.batch_size=16", "warmstart.corruption=0.0", "rollout.max_new_tokens=96",
                   "rollout.max_total_tokens=600"]


def _train(run: Path, *overrides: str) -> Path:
    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    cfg = load_config(CI_CFG, [f"output_dir={run}", "train.steps=3", "eval.at_start=false", "eval.every=0",
                               "eval.num_tasks=4", "train.checkpoint_every=2", "train.keep_checkpoints=0",
                               *TOOL_WARM_START, *overrides])
    Trainer(cfg).train()
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    return {"attempt": _train(d / "attempt"), "lockstep": _train(d / "lockstep", "rollout.loop=lockstep")}


def _replay(run: Path, step: int, **kw):
    from agentrl.run.replay import replay_step

    lines: list[str] = []
    report = replay_step(run, step, log=lines.append, **kw)
    return report, "\n".join(lines)


# -- the tape ---------------------------------------------------------------------------------


def test_the_tape_holds_the_steps_draws_calls_and_update(runs):
    run = runs["attempt"]
    for step in (1, 2, 3):
        tape = read_step_tape(run, step)
        rollouts = read_jsonl(str(run / "rollouts" / f"step_{step:06d}.jsonl"))
        assert tape.step == step and tape.sampled_under == step - 1 and tape.world_size == 1
        first = [t for t in rollouts if t.group_id.startswith(f"s{step}d0/")]
        assert tape.draws[0].task_ids == [t.task_id for t in first if t.sample_index == 0]
        assert [d.group_prefix for d in tape.draws] == [f"s{step}d{k}/" for k in range(len(tape.draws))]
        # every call the trajectories show is on the tape, with what the model read (a call the
        # model wrote that could not be parsed never reaches a tool: its tokens say it all)
        seen = {(t.group_id, t.sample_index, k): c for t in rollouts
                for k, c in enumerate(x for x in t.tool_calls if x.error != "parse_error")}
        taped = {(c.trajectory_id.rsplit("/", 1)[0], int(c.trajectory_id.rsplit("/", 1)[1]), c.index): c
                 for c in tape.calls}
        assert seen and seen.keys() == taped.keys()
        for k, c in seen.items():
            assert (taped[k].name, taped[k].arguments, taped[k].content, taped[k].error) == \
                (c.name, c.arguments, c.result, c.error)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tape/bytes"] == tape_path(run, r["step"]).stat().st_size for r in rows)
    assert tape.update.params[0] != read_step_tape(run, 2).update.params[0]  # the step changed the weights


def test_tape_json_round_trip_keeps_failures_and_retries():
    rec = CallRecord("s2d1/t0/3", 7, 1, "python", {"code": "print(1)"}, "Error: outage", "infra", 0.5,
                     failure=Failure("tool:python", "sandbox_killed", "killed"),
                     retried=[Failure("tool:python", "injected", "x")])
    tape = StepTape.from_json(StepTape(step=2, sampled_under=1, world_size=1, num_threads=1,
                                       hashes=_hashes(), draws=[], calls=[rec]).to_json())
    assert tape.calls == [rec]
    assert step_of("s12d0/t3/1") == 12 and step_of("eval/t3/0") is None


def _hashes():
    from agentrl.run.tape import RunHashes

    return RunHashes("a", "b", "c")


@tool
def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: x
        b: y
    """
    return a + b


def test_tool_tape_serves_numbered_calls_and_reports_every_kind_of_divergence():
    box = ToolBox([add])
    box.tape = ToolTape(record_if=lambda tid: step_of(tid) is not None)
    ctx = box.new_context("s1d0/t0/0", 5)
    for a in (1, 2):
        asyncio.run(box.execute("add", {"a": a, "b": 10}, ctx))
    asyncio.run(box.execute("add", {"a": 9, "b": 9}, box.new_context("s1d0/t0/0", 6)))  # a retry round's seed
    asyncio.run(box.execute("add", {"a": 0, "b": 0}, box.new_context("eval/t0/0", 5)))
    calls = box.tape.take(lambda tid: step_of(tid) == 1)
    assert [(c.seed, c.index, c.content) for c in calls] == [(5, 0, "11"), (5, 1, "12"), (6, 0, "18")]

    box.tape = ToolTape("serve", [*calls[:1], CallRecord(**{**calls[1].__dict__, "content": "999"}), calls[2]])
    ctx = box.new_context("s1d0/t0/0", 5)
    assert asyncio.run(box.execute("add", {"a": 1, "b": 10}, ctx)).content == "11"
    assert asyncio.run(box.execute("add", {"a": 2, "b": 10}, ctx)).content == "999"  # served, not run
    r = asyncio.run(box.execute("add", {"a": 3, "b": 10}, ctx))  # a third call the tape does not have
    assert r.error == "infra" and r.failure.cause == "not_on_tape"
    assert [(d.index, d.what) for d in box.tape.divergences] == [(2, "missing")]
    asyncio.run(box.execute("add", {"a": 1, "b": 1}, box.new_context("s1d0/t0/0", 6)))
    assert box.tape.divergences[-1].what == "call" and "{'a': 9, 'b': 9}" in box.tape.divergences[-1].recorded

    box.tape = ToolTape("live", calls[:2])
    ctx = box.new_context("s1d0/t0/0", 5)
    asyncio.run(box.execute("add", {"a": 1, "b": 10}, ctx))
    box.tape._calls[("s1d0/t0/0", 5, 1)].content = "13"
    assert asyncio.run(box.execute("add", {"a": 2, "b": 10}, ctx)).content == "12"  # live: run again
    d = box.tape.divergences
    assert [(x.index, x.what, x.recorded, x.replayed) for x in d] == [(1, "content", "13", "12")]


def test_params_digest_sees_one_bit():
    import torch

    from agentrl.run.tape import params_digest

    m = torch.nn.Linear(3, 2)
    before = params_digest(m)
    with torch.no_grad():
        w = m.weight.view(-1)
        w[0] = torch.nextafter(w[0], torch.tensor(1e9))
    assert params_digest(m) != before


# -- replays of real runs -------------------------------------------------------------------------


def test_lockstep_replay_is_bit_exact(runs):
    report, text = _replay(runs["lockstep"], 3)
    assert report.ok, text
    r = report.rollout
    assert r.loop == "lockstep" and r.attempts == 16 and r.bit_exact == 16 and r.max_logprob_diff == 0.0
    assert r.calls_served > 0 and not r.call_divergences
    assert report.update.equal and report.start.endswith("step_000002") and report.forward == []
    assert "replay: identical" in text


def test_attempt_loop_replay_has_the_tokens_and_the_update_exactly(runs):
    from agentrl.run.replay import ATTEMPT_LOOP_TOL

    report, text = _replay(runs["attempt"], 3)
    assert report.ok, text
    r = report.rollout
    assert r.loop == "attempt" and r.equal == r.attempts == 16 and r.max_logprob_diff <= ATTEMPT_LOOP_TOL
    assert report.update.equal
    assert report.start.endswith("step_000002") and report.forward == []  # the checkpoint of step 2


def test_replay_from_the_base_policy_rolls_forward_by_update_replay(runs):
    report, text = _replay(runs["lockstep"], 2)
    assert report.ok, text
    assert report.start == "step 0 (the base policy)" and [u.step for u in report.forward] == [1]
    assert report.rollout.bit_exact == 16


def test_an_async_run_replays_under_its_own_policy_version(tmp_path):
    run = _train(tmp_path / "async", "train.max_staleness=1", "train.checkpoint_every=100")
    assert [read_step_tape(run, s).sampled_under for s in (1, 2, 3)] == [0, 0, 1]
    report, text = _replay(run, 3)
    assert report.ok, text
    assert report.rollout.sampled_under == 1 and report.rollout.equal == 16
    # rolled forward to version 1 for the rollout, then to 2 for the update of step 3
    assert [u.step for u in report.forward] == [1, 2] and report.update.equal


def test_infrastructure_faults_and_their_retries_replay_from_the_tape(tmp_path):
    run = _train(tmp_path / "faults", "rollout.fault_rate=0.3", "rollout.infra_backoff_s=0", "tools.infra_backoff_s=0",
                 "tools.infra_retries=1", "train.checkpoint_every=100", "train.steps=2")
    tape = read_step_tape(run, 2)
    assert any(c.error == "infra" for c in tape.calls) and any(c.retried for c in tape.calls)
    report, text = _replay(run, 2)
    assert report.ok, text


# -- divergences are found where they are -------------------------------------------------------


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_changed_tool_output_is_reported_at_its_observation_token(runs, tmp_path):
    run = _copy_run(runs["lockstep"], tmp_path / "run")
    path = tape_path(run, 3)
    tape = read_step_tape(run, 3)
    victim = next(c for c in tape.calls if c.error is None)
    victim.content = "77777777\n"
    path.write_text(tape.to_json())
    report, text = _replay(run, 3, update=False)
    assert not report.ok and "replay: DIVERGED" in text
    gid, idx = victim.trajectory_id.rsplit("/", 1)
    hit = [d for d in report.rollout.divergences if (d.group_id, d.sample_index) == (gid, int(idx))]
    assert hit and hit[0].what == "token" and hit[0].kind == "tool", text


def test_a_changed_sampled_token_is_reported_at_its_position(runs, tmp_path):
    run = _copy_run(runs["lockstep"], tmp_path / "run")
    path = run / "rollouts" / "step_000003.jsonl"
    trajs = read_jsonl(str(path))
    t = trajs[5]
    pos = next(i for i, m in enumerate(t.loss_mask) if m) + 1
    t.token_ids[pos] = (t.token_ids[pos] + 1) % 50
    write_jsonl(str(path), trajs)
    report, text = _replay(run, 3, update=False)
    (d,) = report.rollout.divergences
    assert (d.group_id, d.sample_index, d.what, d.position, d.kind) == (t.group_id, t.sample_index, "token", pos,
                                                                         "model"), text
    assert report.rollout.equal == 15


def test_a_changed_update_is_reported(runs, tmp_path):
    run = _copy_run(runs["lockstep"], tmp_path / "run")
    path = tape_path(run, 3)
    tape = read_step_tape(run, 3)
    tape.update.params = ["0" * 32]
    path.write_text(tape.to_json())
    report, text = _replay(run, 3, rollout=False)
    assert not report.ok and not report.update.equal and "update of step 3: DIFFERS" in text


def test_live_tools_report_where_the_tools_now_answer_otherwise(runs, tmp_path):
    run = _copy_run(runs["lockstep"], tmp_path / "run")
    path = tape_path(run, 3)
    tape = read_step_tape(run, 3)
    victim = next(c for c in tape.calls if c.error is None)
    real = victim.content
    victim.content = "not what the tool says\n"
    path.write_text(tape.to_json())
    report, text = _replay(run, 3, live_tools=True, update=False)
    (d,) = report.rollout.call_divergences
    assert (d.trajectory_id, d.index, d.what, d.replayed) == (victim.trajectory_id, victim.index, "content", real)
    assert report.rollout.calls_served == 0 and report.rollout.equal == 16  # the live outputs are the recorded ones


def test_cli_replay_exit_codes(runs, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "agentrl", "replay", str(runs["lockstep"]), "--step", "last",
                         "--no-rollout"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "replay: identical" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "agentrl", "replay", str(tmp_path), "--step", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "no tape for step 1" in bad.stderr


def _torchrun(args: list[str], nproc: int, cwd: Path) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 \
        else [sys.executable]
    return subprocess.run([*head, "-m", "agentrl", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_two_rank_fsdp_run_replays_rank_by_rank(tmp_path):
    """torchrun, 2 ranks, FSDP2: each rank's calls and parameter shard digest are on the tape;
    a replay on 2 ranks gives every rank's tokens and shard bit for bit; one process is refused."""
    run = tmp_path / "fsdp"
    train = _torchrun(["train", str(CI_CFG), f"output_dir={run}", "train.steps=2", "eval.at_start=false",
                       "eval.every=0", "eval.num_tasks=4", "train.checkpoint_every=100", "rollout.loop=lockstep",
                       *TOOL_WARM_START], 2, ROOT)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    tape = read_step_tape(run, 2)
    assert tape.world_size == 2 and len(set(tape.update.params)) == 2  # two different shards
    assert {int(c.seed) for c in tape.calls} >= {read_step_tape(run, 2).draws[0].seed}
    alone = _torchrun(["replay", str(run), "--step", "2"], 1, ROOT)
    assert alone.returncode == 2 and "torchrun --nproc_per_node=2" in alone.stderr
    both = _torchrun(["replay", str(run), "--step", "2"], 2, ROOT)
    assert both.returncode == 0, both.stdout[-3000:] + both.stderr[-3000:]
    out = both.stdout
    assert "replay: identical" in out and "-- rank 1 --" in out and out.count("update of step 2: equal") == 2
    assert out.count("rollout of step 2: 8/8 attempts identical") == 2  # 16 attempts, half on each rank


def test_an_openai_api_agents_run_replays_its_requests(tmp_path):
    """The agent's own code runs again against the endpoint; its requests sample with the
    recorded per-request seeds, so the captured segments come back token for token."""
    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    run = tmp_path / "agent"
    cfg = load_config(ROOT / "examples" / "openai_agent_tiny.yaml", [
        f"output_dir={run}", "train.steps=2", "eval.at_start=false", "eval.every=0", "eval.num_tasks=4",
        "train.prompts_per_step=4", "algo.num_samples=4", "train.checkpoint_every=100"])
    Trainer(cfg).train()
    report, text = _replay(run, 2)
    assert report.ok, text
    assert report.rollout.attempts == report.rollout.equal >= 16 and report.update.equal
    assert "runs its own code again" in text


def test_a_run_resumed_after_a_kill_drops_and_rewrites_the_lost_steps_tape(runs, tmp_path):
    """Killed after step 3 was taped but before its checkpoint: the resume drops step 3's tape
    with its rollouts, reruns the step from checkpoint 2, and tapes the same step again."""
    import shutil

    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    run = _copy_run(runs["lockstep"], tmp_path / "run")
    before = read_step_tape(run, 3)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(rows[:2]) + "\n")
    dropped = []
    real_unlink = Path.unlink

    def unlink(self, *a, **k):
        dropped.append(self.name)
        return real_unlink(self, *a, **k)

    Path.unlink = unlink
    try:
        Trainer(load_config(run / "config.yaml", [f"output_dir={run}", "resume=true"])).train()
    finally:
        Path.unlink = real_unlink
    assert {"step_000003.json", "step_000003.jsonl"} <= set(dropped)
    after = read_step_tape(run, 3)
    assert after.update == before.update and after.draws == before.draws
    strip = lambda calls: [(c.key, c.name, c.arguments, c.content, c.error) for c in calls]  # noqa: E731
    assert strip(after.calls) == strip(before.calls)  # everything but the latencies


@pytest.mark.slow
def test_a_compacted_async_run_trains_and_replays(tmp_path):
    """rollout.compaction=summarize on the ledger example with the rollout thread: the run
    trains on compacted attempts (segments recorded), and a step replays segment by segment."""
    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    run = tmp_path / "compaction"
    cfg = load_config(ROOT / "examples" / "compaction_tiny.yaml", [
        f"output_dir={run}", "train.steps=2", "eval.at_start=false", "eval.every=0", "eval.num_tasks=4",
        "train.prompts_per_step=4", "algo.num_samples=4", "train.checkpoint_every=100", "train.max_staleness=1",
        "warmstart.num_demos=400", "warmstart.steps=150"])
    Trainer(cfg).train()
    trajs = [t for s in (1, 2) for t in read_jsonl(str(run / "rollouts" / f"step_{s:06d}.jsonl"))]
    compacted = [t for t in trajs if t.compaction is not None and t.compaction.segments > 1]
    assert compacted and {t.compaction.index for t in compacted} >= {0, 1}
    report, text = _replay(run, 2)
    assert report.ok, text
    assert report.rollout.attempts == report.rollout.equal == len([t for t in trajs if t.group_id.startswith("s2")])


def test_a_bf16_sampler_runs_attempt_loop_replay_says_its_tokens_may_differ(tmp_path):
    """The bf16 sampler's rounding depends on the decode batch's make-up: the replay of a
    per-attempt run says so (a lock-step run's does not)."""
    from agentrl.run.replay import BF16_ATTEMPT_LOOP_NOTE

    for loop in ("attempt", "lockstep"):
        run = _train(tmp_path / loop, "model.sampler_dtype=bfloat16", "train.steps=1", f"rollout.loop={loop}")
        report, text = _replay(run, 1, update=False)
        assert (BF16_ATTEMPT_LOOP_NOTE in report.notes) == (loop == "attempt"), text
        if loop == "lockstep":
            assert report.ok, text  # the same batches: token-exact in bfloat16 too
