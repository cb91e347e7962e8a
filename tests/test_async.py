"""Asynchronous rollouts (train.max_staleness): the bound, the weight hand-off, the producer's
lifecycle, and the trainer end to end.

- max_staleness=0 is the synchronous loop: a run equals, bit for bit, a hand-written
  sample -> update loop over the trainer's own pieces, and no rollout thread exists.
- With a tool that sleeps, the trainer's share of wall time spent waiting for data drops at
  max_staleness=1, and no trajectory older than the bound reaches the loss.
- The rollout thread samples from its own weight copies, never the trainer's storage.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agentrl.run.config import ConfigError, load_config
from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Score
from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.run.producer import (RolloutProducer, describe_async, oldest_allowed_version, resolve_async,
                              split_stale, staleness_metrics, with_lines)
from agentrl.toolbox import Tool, ToolContext
from agentrl.types import Span, Trajectory, read_jsonl
from agentrl.scale.weight_sync import WeightSlots

ROOT = Path(__file__).resolve().parents[1]
CI_CFG = ROOT / "examples" / "arithmetic_ci.yaml"
SLOW_TOOL_S = 0.4
THREAD_NAME = "agentrl-rollout-producer"


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def traj(version: int, group: str = "g", index: int = 0) -> Trajectory:
    return Trajectory(token_ids=[1, 2, 3], prompt_len=1, loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0],
                      spans=[Span(0, 1, "prompt"), Span(1, 3, "model")], messages=[], group_id=group,
                      sample_index=index, policy_version=version)


# -- the rules ---------------------------------------------------------------------------


def test_split_stale_keeps_the_bound_and_counts_the_rest():
    trajs = [traj(5), traj(4, index=1), traj(3, index=2), traj(1, index=3)]
    split = split_stale(trajs, trainer_version=5, max_staleness=1)
    assert [t.policy_version for t in split.kept] == [5, 4]
    assert split.staleness == [0, 1] and split.dropped == 2
    assert [t.trained.staleness for t in split.kept] == [0, 1]
    m = staleness_metrics(split, 1)
    assert m["async/dropped_stale"] == 2 and m["async/staleness_0"] == 1 and m["async/staleness_1"] == 1
    assert m["async/staleness_mean"] == 0.5 and m["async/staleness_max"] == 1
    with pytest.raises(RuntimeError, match="newer than the trainer"):
        split_stale([traj(6)], trainer_version=5, max_staleness=1)


def test_oldest_allowed_version_matches_the_staleness_definition():
    # a resumed run (start at step 11 with version 10): the trainer trains step s with v = s - 1
    for k in (1, 2, 3):
        for step in range(11, 20):
            u = oldest_allowed_version(step, first_step=11, start_version=10, max_staleness=k)
            assert (step - 1) - u == k


class _ForegroundOnly:  # an engine that cannot sample beside the trainer
    from agentrl.engines.base import EngineCapabilities
    capabilities = EngineCapabilities(shares_trainer_weights=False, background_sampling=False, can_sleep=False)


def test_resolve_async(monkeypatch):
    sync = load_config(CI_CFG)
    assert resolve_async(sync, world_size=4) == (sync, False)  # 0: nothing checked, nothing changed
    assert resolve_async(sync, 1)[0] is sync
    cfg, defaulted = resolve_async(load_config(CI_CFG, ["train.max_staleness=1"]), 1)
    assert defaulted and cfg.algo.is_level == "token"
    cfg, defaulted = resolve_async(load_config(CI_CFG, ["train.max_staleness=1", "algo.is_level=sequence"]), 1)
    assert not defaulted and cfg.algo.is_level == "sequence"
    with pytest.raises(ConfigError, match="torchrun"):
        resolve_async(load_config(CI_CFG, ["train.max_staleness=1"]), 2)
    cfg, _ = resolve_async(load_config(CI_CFG, ["train.max_staleness=1", "model.engine=vllm"]), 1)
    assert cfg.model.engine == "vllm"  # the rollout thread drives the trainer's own vLLM engine
    from agentrl.engines import ENGINES
    monkeypatch.setitem(ENGINES, "fg", f"{__name__}:_ForegroundOnly")
    with pytest.raises(ConfigError, match="model.engine=hf"):
        resolve_async(load_config(CI_CFG, ["train.max_staleness=1", "model.engine=fg"]), 1)
    with pytest.raises(ConfigError, match=">= 0"):
        resolve_async(load_config(CI_CFG, ["train.max_staleness=-1"]), 1)


def test_the_objective_block_states_the_data_flow():
    block = "── objective ──\n IS weight   off\n────"
    sync = with_lines(block, describe_async(load_config(CI_CFG), False))
    assert sync.splitlines()[-2].startswith(" rollouts    synchronous") and sync.endswith("────")
    cfg, defaulted = resolve_async(load_config(CI_CFG, ["train.max_staleness=2"]), 1)
    text = "\n".join(describe_async(cfg, defaulted))
    assert "max_staleness=2" in text and "<= 2" in text and "version s-3" in text
    assert "no partial rollouts" in text and "min(π_old/μ, 2.0) at token level (defaulted" in text


def test_weight_slots_never_write_the_slot_in_use():
    torch.manual_seed(0)
    policy = nn.Linear(4, 3)
    slots = WeightSlots(nn.Linear(4, 3), nn.Linear(4, 3), policy, version=0)
    live = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    for s in slots.slots:
        assert not {p.untyped_storage().data_ptr() for p in s.parameters()} & live
        assert all(not p.requires_grad for p in s.parameters())
    in_use, v = slots.acquire()
    frozen = in_use.weight.detach().clone()
    for version in (1, 2, 3):  # the sampler is slow: three publishes while it holds its slot
        with torch.no_grad():
            policy.weight.add_(1.0)
        slots.publish(policy, version)
        assert torch.equal(in_use.weight, frozen), "a publish wrote the slot the sampler reads"
    assert slots.version == 3
    newest, v = slots.acquire()
    assert v == 3 and newest is not in_use and torch.equal(newest.weight, policy.weight)


# -- the producer with a cheap collect -----------------------------------------------------


def _producer(collect, *, k: int, last: int = 8) -> tuple[RolloutProducer, nn.Module]:
    policy = nn.Linear(2, 2)
    slots = WeightSlots(nn.Linear(2, 2), nn.Linear(2, 2), policy, version=0)
    runner = SimpleNamespace(engine=ScriptedEngine([]))  # collect reads only engine.policy_version
    return RolloutProducer(collect, runner, slots, first_step=1, last_step=last, start_version=0,
                           max_staleness=k), policy


@pytest.mark.parametrize("k", [1, 2])
def test_producer_never_samples_beyond_the_bound(k):
    published = [0]  # the trainer's newest published version, as the producer could see it
    started: dict[int, tuple[int, int]] = {}

    def collect(step, runner):
        started[step] = (published[0], runner.engine.policy_version)
        return [traj(runner.engine.policy_version, f"s{step}", i) for i in range(2)], {}

    producer, policy = _producer(collect, k=k)
    producer.start()
    try:
        for step in range(1, 9):
            batch, _ = producer.next_batch(step)
            assert {t.policy_version for t in batch.trajectories} == {batch.policy_version}  # one version
            staleness = (step - 1) - batch.policy_version
            assert 0 <= staleness <= k
            time.sleep(0.05)  # a slow update: the producer runs as far ahead as the bound allows
            published[0] = step
            producer.publish(policy, step)
    finally:
        assert producer.stop()
    for step, (trainer_version, sampler_version) in started.items():
        assert trainer_version >= step - 1 - k and sampler_version >= step - 1 - k
    # the producer was never idle for lack of room and did use the slack the bound gives
    assert max((s - 1) - v for s, (_, v) in started.items()) == k


def test_producer_failure_reaches_the_trainer_and_stop_is_clean():
    def collect(step, runner):
        if step == 2:
            raise ValueError("prompt too long: raise rollout.max_total_tokens")
        return [traj(runner.engine.policy_version)], {}

    producer, policy = _producer(collect, k=1)
    producer.start()
    producer.next_batch(1)
    producer.publish(policy, 1)
    with pytest.raises(ValueError, match="raise rollout.max_total_tokens"):
        producer.next_batch(2)
    assert producer.stop(timeout=5)

    # a producer blocked at the bound (the trainer never publishes) stops promptly
    producer, _ = _producer(lambda step, runner: ([traj(runner.engine.policy_version)], {}), k=1)
    producer.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    assert producer.stop(timeout=5)
    assert time.perf_counter() - t0 < 5
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]


# -- the trainer --------------------------------------------------------------------------


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _parity_score(task, messages) -> Score:
    # the untrained tiny model never solves a task; reward every other attempt so steps have signal
    return Score(reward=float(len(messages[-1].content) % 2))


@pytest.mark.slow
def test_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path):
    from agentrl.algo.objective import Objective
    from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
    from agentrl.run.trainer import Trainer

    # The lock-step loop: the per-attempt loop's log-probs depend, in the last float bits, on
    # which attempts shared a decode batch, i.e. on tool timing (docs/agent_loop.md).
    over = ["train.steps=2", "eval.at_start=false", "eval.num_tasks=2", "train.checkpoint_every=100",
            "train.num_iterations=2", "algo.is_level=token", "rollout.loop=lockstep"]
    a = Trainer(load_config(CI_CFG, [*over, f"output_dir={tmp_path / 'a'}", "train.max_staleness=0"]))
    a.env.score = _parity_score
    threads_seen: list[str] = []
    step_fn = a.train_step

    def watched(step):
        threads_seen.extend(t.name for t in threading.enumerate())
        return step_fn(step)

    a.train_step = watched
    a.train()
    assert a.producer is None and THREAD_NAME not in threads_seen

    # the same pieces by hand: sample with the current weights, score, advantages, update, sync
    b = Trainer(load_config(CI_CFG, [*over, f"output_dir={tmp_path / 'b'}"]))
    b.env.score = _parity_score
    initial = {n: p.detach().clone() for n, p in b.model.named_parameters()}
    cfg = b.cfg
    for step in (1, 2):
        trajs, _ = b.collect(step)
        objective = Objective.from_config(cfg)
        adv, filt = compute_advantages(trajs, objective)
        grpo_update(b.model, b.optimizer, b.scheduler, trajs, filt.keep.tolist(), objective,
                    UpdateSettings(micro_batch_tokens=cfg.train.micro_batch_tokens,
                                   num_iterations=cfg.train.num_iterations, max_grad_norm=cfg.optim.max_grad_norm,
                                   pad_id=b.tokenizer.pad_token_id))
        b.sync(b.model)
        logged = read_jsonl(str(tmp_path / "a" / "rollouts" / f"step_{step:06d}.jsonl"))
        assert [t.token_ids for t in logged] == [t.token_ids for t in trajs]
        assert [t.logprobs for t in logged] == [t.logprobs for t in trajs]
        assert [t.old_logprobs for t in logged] == [t.old_logprobs for t in trajs]
        assert {t.policy_version for t in logged} == {step - 1}
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert all(torch.equal(pa[n], pb[n]) for n in pa), "max_staleness=0 must be the synchronous update exactly"
    assert not all(torch.equal(pa[n], initial[n]) for n in pa), "the run must train"
    rows = _rows(tmp_path / "a")
    assert all(not any(k.startswith("async/") for k in r) for r in rows)
    assert all(r["time/trainer_wait"] > 0 for r in rows if r["step"] > 0)


class SlowToolArithmetic(ArithmeticEnv):
    """The arithmetic environment whose python tool first sleeps ``SLOW_TOOL_S`` seconds (same
    name and schema, so the prompt is unchanged), scored by answer parity so every step has signal."""

    def tools(self):
        (inner,) = super().tools()

        async def python(code: str, context: ToolContext) -> str:
            await asyncio.sleep(SLOW_TOOL_S)
            return await inner.invoke({"code": code}, context)

        return [Tool(python, name="python", description=inner.description, parameters=inner.parameters,
                     timeout=inner.timeout)]

    def score(self, task, messages):
        return _parity_score(task, messages)


def _slow_run(tmp_path: Path, k: int) -> list[dict]:
    from agentrl.run.trainer import Trainer

    run = tmp_path / f"k{k}"
    cfg = load_config(CI_CFG, [
        f"output_dir={run}", f"env.name={__name__}:SlowToolArithmetic", "train.steps=4", f"train.max_staleness={k}",
        "train.num_iterations=3", "eval.at_start=false", "eval.num_tasks=2", "train.checkpoint_every=100",
        # a short warm start on tool-using demonstrations only (~20 s, cached per machine): the
        # model then calls the tool in most attempts; a call needs ~60 tokens of the tiny tokenizer
        "warmstart.enabled=true", "warmstart.num_demos=512", "warmstart.steps=200", "warmstart.lr=0.002",
        "warmstart.batch_size=16", "warmstart.corruption=0.0", "rollout.max_new_tokens=96",
        "rollout.max_total_tokens=600",
        # every attempt through the update: its time is what the rollout thread overlaps
        "train.skip_zero_advantage=false",
    ])
    trainer = Trainer(cfg)
    trainer.train()
    assert trainer.producer is None and THREAD_NAME not in [t.name for t in threading.enumerate()]
    return [r for r in _rows(run) if r["step"] > 0]


@pytest.mark.slow
def test_slow_tool_trainer_waits_less_and_staleness_stays_bounded(tmp_path):
    sync, lag = _slow_run(tmp_path, 0), _slow_run(tmp_path, 1)
    for rows in (sync, lag):
        assert min(r["time/tools"] for r in rows) >= SLOW_TOOL_S, "precondition: every step waits for the tool"

    def wait_frac(rows):
        return sum(r["time/trainer_wait"] for r in rows) / sum(r["time/step"] for r in rows)

    w0, w1 = wait_frac(sync), wait_frac(lag)
    print(f"\ntrainer waiting for data: {w0:.1%} of step time synchronous, {w1:.1%} at max_staleness=1; "
          f"step {sum(r['time/step'] for r in sync) / 4:.2f}s vs {sum(r['time/step'] for r in lag) / 4:.2f}s; "
          f"tools {sum(r['time/tools'] for r in sync) / 4:.2f}s/step")
    assert w1 < 0.6 * w0, (w0, w1)

    # every trajectory that reached the loss (π_old filled by the update) is within the bound
    trained = 0
    for step in range(1, 5):
        for t in read_jsonl(str(tmp_path / "k1" / "rollouts" / f"step_{step:06d}.jsonl")):
            if t.old_logprobs is not None:
                assert (step - 1) - t.policy_version <= 1
                assert t.trained.staleness == (step - 1) - t.policy_version
                trained += 1
    assert trained > 0
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_stale"] == 0 for r in lag)
    assert any(r["async/staleness_1"] > 0 for r in lag), "the rollout thread never ran ahead"
    stale = [r for r in lag if r["async/staleness_mean"] > 0]
    assert all(r["is/weight_max"] <= 2.0 + 1e-6 for r in stale)
    assert any(r["mismatch/abs_mean"] > 0 for r in stale), "a stale batch must differ from π_old"


@pytest.mark.slow
def test_async_sampler_owns_its_storage_resume_and_interrupt(tmp_path):
    from agentrl.run.trainer import Trainer

    over = [f"output_dir={tmp_path / 'run'}", "train.max_staleness=1", "eval.at_start=false", "eval.num_tasks=2",
            "train.checkpoint_every=1"]
    trainer = Trainer(load_config(CI_CFG, [*over, "train.steps=2"]))
    trainer.env.score = _parity_score
    producer = trainer._make_producer(1)
    live = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    for slot in producer.slots.slots:
        assert not {p.untyped_storage().data_ptr() for p in slot.parameters()} & live
    assert producer.engine.model in producer.slots.slots and producer.engine is not trainer.engine
    assert producer.runner.chat.tokenizer is not trainer.tokenizer  # HF fast tokenizers are not thread-safe

    # Ctrl-C in step 2: a checkpoint of step 1 is written and the rollout thread is stopped
    step_fn = trainer.train_step

    def interrupted(step):
        if step == 2:
            raise KeyboardInterrupt
        return step_fn(step)

    trainer.train_step = interrupted
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.producer is None and THREAD_NAME not in [t.name for t in threading.enumerate()]
    assert (tmp_path / "run" / "checkpoints" / "step_000001").exists()

    resumed = Trainer(load_config(CI_CFG, [*over, "train.steps=3", "resume=true"]))
    resumed.env.score = _parity_score
    resumed.train()
    rows = [r for r in _rows(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["async/staleness_0"] > 0  # the resumed queue starts empty: its first batch is fresh
    assert all(r["async/staleness_max"] <= 1 for r in rows)
