"""Canaries on the weights the sampler uses: after every weight sync, does the engine sample with
the trainer's weights?

A sampler that never receives the new weights looks like staleness in every other metric
(verl#7495: a LoRA adapter never synced to the rollout engine cost two months). So after each
sync a fixed canary sequence (``alarms.canary_tokens`` ids, chosen once per run: the first
training prompt's tokens, then a seeded pseudo-random tail) is scored twice, teacher-forced at
T = 1: by the trainer's model (``agentrl.algo.batching.score_tokens``, as π_old is scored) and by
the engine (``Engine.score``, a forward on the weights it samples with). Logged each step:

- ``sync/canary_abs_max``, ``sync/canary_abs_mean``: |engine − trainer| per canary token;
  ``sync/canary_tol``: the tolerance that applies to the run (``alarms.canary_tol`` when both
  compute in float32 on the HF engine, ``alarms.canary_tol_narrow`` with a bfloat16 sampler,
  ``model.sampler_dtype``, else ``alarms.canary_tol_loose``);
- ``sync/trainer_moved``, ``sync/engine_moved``: the largest change per token of each one's
  canary log-probs since the last reading (the session's first is taken before its first
  update);
- ``time/canary``: the seconds both forwards took.

The ``weight_sync`` alarm (agentrl/run/alarms.py) reads them: a gap above the tolerance, or a
trainer that moved while the engine did not. ``mismatch/abs_mean`` and ``mismatch/abs_max``
(the update's |log π_old − log μ| on the step's trained tokens) say the same one step later:
they compare the sampler of this step's rollout with the trainer before the update.

Engines without ``capabilities.can_score`` skip the canary (no ``sync/*`` keys), and so does
``alarms.disable: [weight_sync]``. With asynchronous rollouts (``train.max_staleness > 0``) it
checks the trainer's own engine (the one evaluation samples), not the rollout thread's weight
slots, and it is skipped where that thread drives the trainer's engine (vLLM). Every rank
scores (the trainer's forward is collective under FSDP, and each rank's engine has its own
weights); the figures are the worst rank's (the largest gap, the engine that moved least).

Cost on the tiny model (2 loaded CPU cores): 4-6 ms a step (``time/canary``), under 1% of a
step of the CPU example (0.6-1.8 s).

    >>> compare([0.0, -1.0, -2.0], [0.0, -1.0, -2.5])
    {'sync/canary_abs_max': 0.5, 'sync/canary_abs_mean': 0.25}
"""

from __future__ import annotations

import random
import time

import torch

from agentrl.algo.batching import MicroBatch, score_tokens
from agentrl.scale.distributed import max_floats


def canary_ids(tokenizer, text: str, n: int, vocab: int, seed: int) -> list[int]:
    """``n`` token ids: those of ``text`` (a training prompt), then ids drawn from ``range(vocab)``
    by a generator of its own seeded with ``seed`` (the run's random streams are not touched).

    >>> class Tok:
    ...     def encode(self, text, add_special_tokens=False): return [ord(c) for c in text]
    >>> ids = canary_ids(Tok(), "ab", 5, 100, seed=0)
    >>> ids[:2], len(ids), ids == canary_ids(Tok(), "ab", 5, 100, seed=0), max(ids[2:]) < 100
    ([97, 98], 5, True, True)
    """
    ids = [i for i in tokenizer.encode(text, add_special_tokens=False) if 0 <= i < vocab][:n]
    rng = random.Random(f"agentrl-canary/{seed}")
    return ids + [rng.randrange(vocab) for _ in range(n - len(ids))]


def compare(trainer: list[float], engine: list[float]) -> dict[str, float]:
    """The gap per canary token (position 0 is never scored)."""
    gaps = [abs(a - b) for a, b in zip(trainer[1:], engine[1:])]
    return {"sync/canary_abs_max": max(gaps), "sync/canary_abs_mean": sum(gaps) / len(gaps)}


def moved(before: list[float], after: list[float]) -> float:
    """The largest change per token between two readings of the same canary."""
    return max(abs(a - b) for a, b in zip(before[1:], after[1:]))


@torch.no_grad()
def trainer_scores(model, ids: list[int], device, autocast: str = "none") -> list[float]:
    """The canary's log-probs at T = 1 under ``model``, as the update scores π_old (eval mode for
    the forward, the model's mode restored after)."""
    t = torch.tensor([ids], device=device)
    mask = torch.ones(t.shape, dtype=torch.float32, device=device)
    mask[0, 0] = 0.0
    mb = MicroBatch([0], t, torch.ones_like(t), mask, torch.zeros_like(mask))
    was = model.training
    model.eval()
    try:
        return score_tokens(model, mb, 1.0, autocast)[0][0].tolist()
    finally:
        model.train(was)
        # FSDP2 keeps the root's parameters unsharded after a forward that no backward follows:
        # left so, the next clip_grad_norm_ meets plain tensors beside DTensors
        if hasattr(model, "reshard"):
            model.reshard()


def low_precision(cfg, plan, model) -> bool:
    """Whether the trainer, or an HF engine on its weights (or on a copy in ``plan.compute_dtype``),
    computes in bfloat16 or another dtype than float32."""
    return (plan.compute_dtype != torch.float32 or cfg.train.autocast == "bf16"
            or cfg.model.sampler_dtype != "float32" or any(p.dtype != torch.float32 for p in model.parameters()))


class WeightCanary:
    """The trainer's canary: :meth:`baseline` before the session's first update, :meth:`after_sync`
    after each weight sync (both on every rank); the figures go into the step's metrics row.

    ``enabled`` False (an engine without ``score``, or the alarm disabled) makes both no-ops.
    """

    def __init__(self, engine, ids: list[int], *, tol: float, device, autocast: str = "none",
                 enabled: bool = True):
        self.engine, self.ids, self.tol = engine, ids, tol
        self.device, self.autocast, self.enabled = device, autocast, enabled
        self.last: tuple[list[float], list[float]] | None = None  # (trainer, engine) at the last reading

    @classmethod
    def for_trainer(cls, trainer) -> "WeightCanary":
        """The canary of a :class:`agentrl.run.trainer.Trainer`'s run (after its policy and tasks)."""
        cfg, a = trainer.cfg, trainer.cfg.alarms
        enabled = trainer.engine.capabilities.can_score and "weight_sync" not in a.disable
        if not enabled:
            return cls(trainer.engine, [], tol=a.canary_tol, device=trainer.dist.device, enabled=False)
        vocab = min(len(trainer.tokenizer), trainer.model.get_input_embeddings().num_embeddings)
        text = trainer.train_tasks[0].prompt if trainer.train_tasks else ""
        ids = canary_ids(trainer.tokenizer, text, a.canary_tokens, vocab, cfg.seed)
        exact = trainer.engine.capabilities.shares_trainer_weights and not low_precision(cfg, trainer.plan,
                                                                                         trainer.model)
        tol = (a.canary_tol if exact else a.canary_tol_narrow if cfg.model.sampler_dtype != "float32"
               else a.canary_tol_loose)
        return cls(trainer.engine, ids, tol=tol, device=trainer.dist.device, autocast=cfg.train.autocast)

    def read(self, model) -> tuple[list[float], list[float]]:
        """(trainer's, engine's) canary log-probs now."""
        return trainer_scores(model, self.ids, self.device, self.autocast), self.engine.score([self.ids])[0]

    def baseline(self, model) -> None:
        """The reading the first sync of the session is compared with (a no-op once there is one)."""
        if self.enabled and self.last is None:
            self.last = self.read(model)

    def after_sync(self, model) -> dict[str, float]:
        """Score the canary on both sides; the ``sync/*`` figures and ``time/canary``."""
        if not self.enabled:
            return {}
        t0 = time.perf_counter()
        trainer, engine = self.read(model)
        m = compare(trainer, engine)
        if self.last is not None:
            # the engine that moved least: negated, so that one maximum over ranks gives every worst case
            m["sync/trainer_moved"], m["sync/engine_moved"] = moved(self.last[0], trainer), -moved(self.last[1], engine)
        m = dict(zip(m, max_floats(list(m.values()))))  # the worst rank
        if "sync/engine_moved" in m:
            m["sync/engine_moved"] = -m["sync/engine_moved"]
        self.last = (trainer, engine)
        m["sync/canary_tol"] = self.tol
        m["time/canary"] = time.perf_counter() - t0
        return m
