"""Asynchronous rollouts: a producer thread samples the next batches while the trainer updates.

With ``train.max_staleness = K > 0`` the trainer no longer waits for the slowest rollout of
each step: a background thread runs ``collect`` (rollout + scoring, DAPO refills included)
for steps ``s, s+1, ...`` into a bounded queue, on its **own** full-weight copy of the policy
(``agentrl.scale.weight_sync.WeightSlots``), never on the trainer's live parameters. The rules:

- **Versions.** The trainer's policy version ``v`` counts its optimizer steps (one per training
  step). Every trajectory records the version that sampled it (``Trajectory.policy_version``).
  ``staleness = v_trainer - v_sampler`` at the moment the trajectory is trained on
  (synchronous training: always 0).
- **One version per batch.** The producer takes new weights only between batches, so a batch
  (all its turns and refills) is sampled by one version; partial rollouts across a weight
  update do not exist.
- **The bound.** The batch of step ``s`` is not started until the newest published weights
  are at least ``v0 + (s - s0) - K`` (``s0``/``v0``: the first step and the version at the
  start of this process), the version the trainer will hold when it trains step ``s``
  minus ``K``. So no trajectory is older than the bound by construction; the trainer checks
  again (``split_stale``) and drops, counting them, any that would be.
- **Weight hand-off.** After each optimizer step the trainer copies its weights into the slot
  the producer is not reading (``publish``); the producer swaps to the newest slot at its next
  batch boundary. Each side waits for the other at most one copy.

Example (the trainer drives it; see ``agentrl.run.trainer``)::

    producer = RolloutProducer(trainer.collect, runner, slots, first_step=1, last_step=10,
                               start_version=0, max_staleness=1)
    producer.start()
    for step in range(1, 11):
        batch, waited_s = producer.next_batch(step)
        ...                                          # update on batch.trajectories
        producer.publish(model, version=step)        # after the optimizer step
    producer.stop()
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from agentrl.run.config import Config, ConfigError
from agentrl.types import Trajectory
from agentrl.scale.weight_sync import WeightSlots

Collect = Callable[[int, object], tuple[list[Trajectory], dict[str, float]]]  # (step, runner) -> batch


# -- pure rules --------------------------------------------------------------------------


def oldest_allowed_version(step: int, *, first_step: int, start_version: int, max_staleness: int) -> int:
    """The oldest policy version that may sample the batch of ``step``.

    The trainer trains step ``s`` with version ``v0 + (s - s0)``; a sampler version ``u`` has
    staleness ``v0 + (s - s0) - u``, which must be ``<= K``:  ``u >= v0 + (s - s0) - K``.

    >>> oldest_allowed_version(5, first_step=1, start_version=0, max_staleness=1)  # trains with v4
    3
    """
    return start_version + (step - first_step) - max_staleness


@dataclass
class StalenessSplit:
    """The trajectories a step may train on, and what the bound removed."""

    kept: list[Trajectory]
    staleness: list[int]  # of each kept trajectory, in order
    dropped: int  # trajectories older than the bound


def split_stale(trajs: list[Trajectory], trainer_version: int, max_staleness: int) -> StalenessSplit:
    """Keep trajectories with ``staleness = trainer_version - policy_version <= max_staleness``.

    Each kept trajectory gets its ``staleness`` (shown by the rollout files). A
    trajectory from a *newer* version than the trainer's is a bookkeeping error and raises.

    >>> from agentrl.types import Span, Trajectory
    >>> t = lambda v: Trajectory([1, 2], 1, [0, 1], [0.0, -1.0], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
    ...                          policy_version=v)
    >>> r = split_stale([t(3), t(2), t(1)], trainer_version=3, max_staleness=1)
    >>> r.staleness, r.dropped
    ([0, 1], 1)
    """
    kept, stale, dropped = [], [], 0
    for t in trajs:
        s = trainer_version - t.policy_version
        if s < 0:
            raise RuntimeError(f"trajectory {t.group_id}/{t.sample_index} was sampled by policy version "
                               f"{t.policy_version}, newer than the trainer's {trainer_version}")
        if s > max_staleness:
            dropped += 1
            continue
        t.trained.staleness = s
        kept.append(t)
        stale.append(s)
    return StalenessSplit(kept, stale, dropped)


def staleness_metrics(split: StalenessSplit, max_staleness: int) -> dict[str, float]:
    """``async/staleness_mean|max``, ``async/staleness_<k>`` (trajectories per value, 0..K),
    ``async/dropped_stale``.

    >>> staleness_metrics(StalenessSplit([], [0, 1, 1], 2), 1)["async/staleness_1"]
    2.0
    """
    counts = Counter(split.staleness)
    n = len(split.staleness)
    out = {"async/staleness_mean": sum(split.staleness) / n if n else 0.0,
           "async/staleness_max": float(max(split.staleness, default=0)),
           "async/dropped_stale": float(split.dropped)}
    out.update({f"async/staleness_{k}": float(counts.get(k, 0)) for k in range(max_staleness + 1)})
    return out


def resolve_async(cfg: Config, world_size: int) -> tuple[Config, bool]:
    """Check an asynchronous config; returns it with ``algo.is_level`` defaulted to ``token``
    when it was ``none`` (and whether that default was applied). ``max_staleness == 0``
    returns ``cfg`` itself, untouched."""
    k = cfg.train.max_staleness
    if k < 0:
        raise ConfigError(f"train.max_staleness={k} must be >= 0 (0 = synchronous rollouts)")
    if k == 0:
        return cfg, False
    if world_size > 1:
        raise ConfigError(
            f"train.max_staleness={k} runs rollouts in a thread beside a single-process trainer; under "
            f"torchrun ({world_size} ranks) the rollout's collectives would interleave with FSDP's. "
            "Set train.max_staleness=0 for multi-rank runs, or run one process")
    from agentrl.engines import ENGINES, engine_class

    if not engine_class(cfg.model.engine).capabilities.background_sampling:
        able = [name for name in ENGINES if engine_class(name).capabilities.background_sampling]
        raise ConfigError(
            f"train.max_staleness={k} needs an engine that can sample in a thread beside the trainer; "
            f"model.engine={cfg.model.engine} cannot (it also serves the trainer's evaluation). "
            f"Set train.max_staleness=0, or {' or '.join(f'model.engine={n}' for n in able)}")
    if cfg.algo.is_level != "none":
        return cfg, False
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, is_level="token")), True


def describe_async(cfg: Config, is_defaulted: bool) -> list[str]:
    """The objective block's lines on how data reaches the trainer."""
    k = cfg.train.max_staleness
    if k == 0:
        return [" rollouts    synchronous (train.max_staleness=0): every batch is sampled by the current policy"]
    return [
        f" rollouts    asynchronous, train.max_staleness={k}: a rollout thread samples ahead on its own weights",
        f"             staleness = trainer version - sampler version <= {k} (batch s starts once version "
        f"s-{k + 1} is out);",
        "             older trajectories are dropped and counted; one version per batch (no partial rollouts)",
        f"             π_old is recomputed by the trainer; IS weight min(π_old/μ, {cfg.algo.is_cap}) at "
        f"{cfg.algo.is_level} level" + (" (defaulted: max_staleness > 0)" if is_defaulted else ""),
    ]


def with_lines(block: str, lines: list[str]) -> str:
    """``block`` (ending with a rule line) with ``lines`` inserted before its last line."""
    head, _, rule = block.rpartition("\n")
    return "\n".join([head, *lines, rule])


# -- the producer ------------------------------------------------------------------------


@dataclass
class ProducedBatch:
    """One step's batch as the producer made it."""

    step: int
    policy_version: int  # the single version that sampled every trajectory of the batch
    trajectories: list[Trajectory]
    timing: dict[str, float]  # collect()'s: time/rollout, time/tools, batch/draws
    idle_s: float  # the producer idled before this batch: room in the queue, then weights recent enough
    swap_s: float  # taking the newest weights (slot swap, engine switch)


def batch_metrics(batch: ProducedBatch, split: StalenessSplit, max_staleness: int) -> dict[str, float]:
    """A step's ``async/*`` metrics: the staleness trained on and the rollout thread's side."""
    m = staleness_metrics(split, max_staleness)
    m.update({"async/sampler_version": float(batch.policy_version),
              "async/producer_wait_s": batch.idle_s, "async/weight_swap_s": batch.swap_s})
    return m


@dataclass
class _Failure:
    step: int
    error: BaseException


class RolloutProducer:
    """Runs ``collect(step, runner)`` for ``first_step..last_step`` in a daemon thread.

    ``runner``'s engine must sample from the slots of ``slots`` (it is switched to the newest
    one before every batch with ``engine.sync_weights(slot)``).
    """

    def __init__(self, collect: Collect, runner, slots: WeightSlots, *, first_step: int, last_step: int,
                 start_version: int, max_staleness: int):
        if max_staleness < 1:
            raise ValueError(f"max_staleness={max_staleness}: a producer runs ahead by at least one step")
        self.collect = collect
        self.runner = runner
        self.engine = runner.engine
        self.slots = slots
        self.first_step, self.last_step = first_step, last_step
        self.start_version = start_version
        self.max_staleness = max_staleness
        # the gate keeps at most K finished batches ahead of the one being trained
        self._queue: queue.Queue = queue.Queue(maxsize=max_staleness + 1)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._busy = threading.Lock()  # held while a batch is sampled (paused() waits for it)
        self._thread = threading.Thread(target=self._run, name="agentrl-rollout-producer", daemon=True)

    # -- trainer side ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def publish(self, model: nn.Module, version: int) -> float:
        """After an optimizer step: hand the new weights over; returns the copy's seconds."""
        seconds = self.slots.publish(model, version)
        with self._cond:
            self._cond.notify_all()
        return seconds

    @contextmanager
    def paused(self):
        """Hold the rollout thread between batches (the one in progress finishes first), so that
        the trainer may use an engine it shares with the thread (evaluation on vLLM)."""
        with self._busy:
            yield

    def next_batch(self, step: int) -> tuple[ProducedBatch, float]:
        """The batch of ``step`` and how long the trainer waited for it; re-raises the
        producer's exception if it failed."""
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the rollout producer stopped before producing step {step}") from None
        if isinstance(item, _Failure):
            raise item.error
        if item.step != step:
            raise RuntimeError(f"the rollout producer delivered step {item.step} when step {step} was due")
        return item, time.perf_counter() - t0

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the batch in progress (a generation cannot be interrupted); True if the
        thread ended within ``timeout`` seconds (it is a daemon either way)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:  # make room so a blocked put() returns
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.1)
        return not self._thread.is_alive()

    # -- producer side --------------------------------------------------------------------

    def _wait_for_weights(self, step: int) -> float:
        need = oldest_allowed_version(step, first_step=self.first_step, start_version=self.start_version,
                                      max_staleness=self.max_staleness)
        t0 = time.perf_counter()
        with self._cond:
            while self.slots.version < need and not self._stop.is_set():
                self._cond.wait(timeout=0.5)
        return time.perf_counter() - t0

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        step = self.first_step
        done = time.perf_counter()  # when the previous batch was finished
        try:
            for step in range(self.first_step, self.last_step + 1):
                self._wait_for_weights(step)
                if self._stop.is_set():
                    return
                with self._busy:
                    t0 = time.perf_counter()
                    slot, version = self.slots.acquire()
                    # the HF engine adopts the slot (a no-op if it is the same); vLLM loads its weights
                    self.engine.sync_weights(slot)
                    self.engine.policy_version = version
                    t1 = time.perf_counter()
                    trajs, timing = self.collect(step, self.runner)
                idle, done = t0 - done, time.perf_counter()
                if any(t.policy_version != version for t in trajs):  # one version per batch, always
                    raise RuntimeError(f"step {step}: a trajectory was not sampled by version {version}")
                self._put(ProducedBatch(step, version, trajs, timing, idle, t1 - t0))
        except BaseException as e:  # delivered to the trainer, which re-raises it
            self._put(_Failure(step, e))
