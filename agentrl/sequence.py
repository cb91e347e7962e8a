"""Growing one attempt's token sequence, with its mask, sampler log-probs and spans.

Every append names the kind of the tokens; the mask and spans follow from the kind, so
they cannot disagree: ``model`` tokens get mask 1 and their sampler log-probs, every
other kind gets mask 0 and log-prob 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.types import SPAN_KINDS, Span


@dataclass
class TokenSequence:
    """Token ids with per-token mask and log-probs; spans merge adjacent same-kind appends."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def append(self, ids: list[int], kind: str, logprobs: list[float] | None = None) -> None:
        if kind not in SPAN_KINDS:
            raise ValueError(f"unknown span kind {kind!r}; expected one of {SPAN_KINDS}")
        if not ids:
            return
        if kind == "model":
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("model tokens need one sampler log-prob each")
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(float(x) for x in logprobs)
        else:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        if self.spans and self.spans[-1].kind == kind:
            self.spans[-1].end = len(self.token_ids)
        else:
            self.spans.append(Span(start=start, end=len(self.token_ids), kind=kind))
