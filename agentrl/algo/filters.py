"""Which attempts enter the loss: the optional GRPO filters of docs/design.md ("The objective"),
each counted.

- ``drop_zero_variance`` (DAPO dynamic sampling): drop every attempt of a group whose
  rewards were all equal. Such attempts have advantage 0 anyway; dropping them keeps them
  out of the loss denominators, so they no longer dilute the signal of the other groups.
- ``mask_truncated`` (DAPO overlong filtering): exclude attempts that ran out of budget
  (finish reason in ``truncated_reasons``): a cut-off attempt is not evidence that its
  reasoning was wrong.
- ``drop_void_turns``: exclude attempts with a turn that made neither a tool call nor an
  answer.

Advantages are computed *before* filtering, so the group baseline still includes every
attempt. Excluded attempts leave the batch entirely: ``update.grpo_update`` trains only on
kept attempts that have at least one masked (model) token, and passes the loss
``total_seqs`` = the number of those attempts and ``total_tokens`` = their masked tokens, both
summed over all ranks. So ``total_seqs`` is not ``result.num_kept``: it is lower when a kept
attempt has no model token, and counts every rank's attempts under torchrun.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.algo.grpo import GroupAdvantages
from agentrl.types import FINISH_REASONS


@dataclass
class FilterResult:
    """``keep`` [N] bool: the attempts that enter the loss; counts for the metrics.

    Each ``dropped_*`` / ``masked_*`` count is the number of attempts that filter alone
    removes (an attempt failing two filters is counted by both); it is 0 when the filter
    is off. ``zero_variance_groups`` is always counted (groups that gave no signal).
    """

    keep: Tensor
    zero_variance_groups: int
    dropped_zero_variance: int
    masked_truncated: int
    dropped_void: int
    # infrastructure failures (algo.update.compute_advantages): attempts whose failure stood,
    # plus the attempts of groups left with fewer than 2 that ran; and those groups
    excluded_infra: int = 0
    dropped_infra_groups: int = 0

    @property
    def num_kept(self) -> int:
        return int(self.keep.sum())


def filter_attempts(
    advantages: GroupAdvantages,
    finish_reasons: Sequence[str],
    has_void_turn: Sequence[bool],
    *,
    drop_zero_variance: bool = False,
    mask_truncated: bool = False,
    drop_void_turns: bool = False,
    truncated_reasons: Collection[str] = ("length", "max_turns"),
) -> FilterResult:
    """Decide which attempts enter the loss; all filters off keeps everything.

    >>> from agentrl.algo.grpo import group_advantages
    >>> adv = group_advantages(torch.tensor([[1., 0], [1, 1]]))
    >>> r = filter_attempts(adv, ["stop", "length", "stop", "stop"], [False] * 4,
    ...                     drop_zero_variance=True, mask_truncated=True)
    >>> r.keep.tolist(), r.dropped_zero_variance, r.masked_truncated
    ([True, False, False, False], 2, 1)
    """
    n = advantages.advantages.numel()
    if len(finish_reasons) != n or len(has_void_turn) != n:
        raise ValueError(
            f"need one finish reason and one void flag per attempt: {n} attempts, "
            f"{len(finish_reasons)} finish reasons, {len(has_void_turn)} void flags"
        )
    unknown = sorted({f for f in finish_reasons if f not in FINISH_REASONS}
                    | {f for f in truncated_reasons if f not in FINISH_REASONS})
    if unknown:
        raise ValueError(f"unknown finish reasons {unknown}; valid: {', '.join(FINISH_REASONS)}")
    device = advantages.advantages.device
    in_zero_var = advantages.zero_variance[advantages.group_index]
    truncated = torch.tensor([f in truncated_reasons for f in finish_reasons], dtype=torch.bool, device=device)
    void = torch.tensor([bool(v) for v in has_void_turn], dtype=torch.bool, device=device)

    off = torch.zeros(n, dtype=torch.bool, device=device)
    drop_zv = in_zero_var if drop_zero_variance else off
    drop_tr = truncated if mask_truncated else off
    drop_vd = void if drop_void_turns else off
    return FilterResult(
        keep=~(drop_zv | drop_tr | drop_vd),
        zero_variance_groups=int(advantages.zero_variance.sum()),
        dropped_zero_variance=int(drop_zv.sum()),
        masked_truncated=int(drop_tr.sum()),
        dropped_void=int(drop_vd.sum()),
    )
