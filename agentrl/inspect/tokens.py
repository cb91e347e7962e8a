"""Per-token facts both viewers show: kind, mask, sampler/trainer log-probs, ratio.

The importance ratio shown per trained token is the one the trainer's truncated-IS
correction uses (docs/design.md, "Asynchronous / stale sampler"):

    ρ_t = π_old(y_t) / μ(y_t) = exp(old_logprobs[t] - logprobs[t])    (loss_mask[t] == 1)

where μ is the sampler and π_old the trainer's policy before the update. ρ ≈ 1 means the
trainer scores the tokens as the sampler did; a ρ far from 1 points at a mismatch
(re-tokenization drift, a stale engine, different numerics).

Example::

    from agentrl.types import Span, TrainerMarks, Trajectory
    t = Trajectory([5, 6, 7], 1, [0, 1, 1], [0.0, -1.0, -2.0],
                   [Span(0, 1, "prompt"), Span(1, 3, "model")], [],
                   trained=TrainerMarks(old_logprobs=[0.0, -1.0, -1.5]))
    assert token_kinds(t) == ["prompt", "model", "model"]
    r = ratios(t)
    assert r[0] is None and r[1] == 1.0 and abs(r[2] - 1.6487) < 1e-4
    s = ratio_stats(t)
    assert s.tokens == 2 and s.outside_clip == 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl.types import Trajectory

CLIP_EPS = 0.2  # the default ε of the clipped surrogate: ratios outside [1-ε, 1+ε] are clipped


def token_kinds(t: Trajectory) -> list[str]:
    """Kind of every token from the spans; tokens no span covers are ``unknown``."""
    n = len(t.token_ids)
    kinds = ["unknown"] * n
    for s in t.spans:
        for i in range(max(0, s.start), min(n, s.end)):
            kinds[i] = s.kind
    return kinds


def _at(xs: list | None, i: int, default=None):
    return xs[i] if xs is not None and 0 <= i < len(xs) else default


def ratios(t: Trajectory) -> list[float | None]:
    """ρ_t = exp(old_t - sampler_t) for trained tokens when old_logprobs exist, else None."""
    n = len(t.token_ids)
    if t.old_logprobs is None:
        return [None] * n
    out: list[float | None] = []
    for i in range(n):
        old, lp = _at(t.old_logprobs, i), _at(t.logprobs, i)
        if _at(t.loss_mask, i, 0) != 1 or old is None or lp is None:
            out.append(None)
        else:
            out.append(math.exp(max(-50.0, min(50.0, old - lp))))
    return out


@dataclass(frozen=True)
class RatioStats:
    """Summary of ρ over trained tokens (``tokens`` == 0 when no old_logprobs)."""

    tokens: int
    mean: float
    max_abs_log: float  # max |log ρ_t|
    outside_clip: int  # tokens with ρ outside [1-ε, 1+ε]


def ratio_stats(t: Trajectory, eps: float = CLIP_EPS) -> RatioStats:
    rs = [r for r in ratios(t) if r is not None]
    if not rs:
        return RatioStats(0, 1.0, 0.0, 0)
    return RatioStats(
        tokens=len(rs),
        mean=sum(rs) / len(rs),
        max_abs_log=max(abs(math.log(r)) for r in rs),
        outside_clip=sum(1 for r in rs if not (1 - eps <= r <= 1 + eps)),
    )


EVAL_NOTE = "evaluation: never trained"
ZERO_ADVANTAGE_NOTE = "not scored: advantage 0, skipped by the update (train.skip_zero_advantage)"


def old_logprobs_note(t: Trajectory, evaluation: bool = False) -> str | None:
    """Why the trainer's log-probs π_old are absent, in the trainer's terms; None when present.

    With no KL term an attempt of advantage 0 has exactly zero gradient, so the update skips
    it (``train.skip_zero_advantage``) and never scores it (agentrl/algo/update.py).

    >>> from agentrl.types import TrainerMarks
    >>> t = Trajectory([1, 2], 1, [0, 1], [0.0, -1.0], [], [], trained=TrainerMarks(advantage=0.0))
    >>> old_logprobs_note(t)
    'not scored: advantage 0, skipped by the update (train.skip_zero_advantage)'
    """
    if evaluation:
        return EVAL_NOTE
    if t.old_logprobs is not None:
        return None
    if t.failure is not None:
        return "not scored: an infrastructure failure, excluded from its group and the loss"
    if t.trained.filtered:
        return "not scored: kept out of the loss by the objective's filter"
    if not any(x == 1 for x in t.loss_mask):
        return "not scored: no trained token"
    if t.advantage is not None and t.advantage == 0:
        return ZERO_ADVANTAGE_NOTE
    return "trainer log-probs not recorded"


@dataclass(frozen=True)
class SpanFacts:
    """One span as the terminal shows it: range, kind, whether trained, log-prob summary."""

    start: int
    end: int
    kind: str
    trained: int  # tokens with loss_mask == 1 inside the span
    mean_logprob: float | None  # over trained tokens
    min_logprob: float | None


def span_facts(t: Trajectory) -> list[SpanFacts]:
    """Facts of each span, clipped to the sequence (spans may be wrong: we are a viewer)."""
    n = len(t.token_ids)
    out = []
    for s in t.spans:
        lo, hi = max(0, s.start), min(n, s.end)
        lps = [_at(t.logprobs, i, 0.0) for i in range(lo, hi) if _at(t.loss_mask, i, 0) == 1]
        out.append(SpanFacts(
            start=s.start,
            end=s.end,
            kind=s.kind,
            trained=len(lps),
            mean_logprob=sum(lps) / len(lps) if lps else None,
            min_logprob=min(lps) if lps else None,
        ))
    return out


def tiling_segments(t: Trajectory) -> list[tuple[int, int, str]]:
    """(start, end, kind) blocks covering every token exactly once, in order.

    Spans are taken as written, clipped to the sequence; gaps and overlaps (a broken
    trajectory) become ``unknown`` blocks or are cut, so a viewer renders each token once.

    >>> from agentrl.types import Span
    >>> tiling_segments(Trajectory([1, 2, 3, 4], 1, [0, 1, 0, 0], [0.0] * 4, [Span(0, 1, "prompt"), Span(1, 2, "model")], []))
    [(0, 1, 'prompt'), (1, 2, 'model'), (2, 4, 'unknown')]
    """
    n = len(t.token_ids)
    out: list[tuple[int, int, str]] = []
    pos = 0
    for s in sorted(t.spans, key=lambda s: (s.start, s.end)):
        a, b = max(s.start, pos), min(s.end, n)
        if a > pos:
            out.append((pos, min(a, n), "unknown"))
        if b > a:
            out.append((a, b, s.kind))
        pos = max(pos, b, min(a, n))
    if pos < n:
        out.append((pos, n, "unknown"))
    return out
