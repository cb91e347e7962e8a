"""The surrogate objectives, one module each, selected by ``algo.loss`` (docs/objectives.md).

A module holds its pure loss function on tensors (the equation in its docstring), its config
fields with their defaults (a frozen dataclass that :class:`agentrl.algo.settings.AlgoConfig`
inherits, so the keys sit flat under ``algo:``, prefixed by the surrogate's name), their range
rules, the shared options it refuses, its line of the printed objective, and what its metrics
mean; it ends with ``SURROGATE = TheClass()``. :func:`agentrl.algo.grpo.surrogate_policy_loss`
adds what they all share (IS weight, KL, aggregation, metrics).

Adding a surrogate: its module here, its test in tests/test_surrogates.py, and its name on one
line of ``_MODULES`` below (then regenerate docs/config.md if it has keys).

    >>> list(SURROGATES)[:2], SURROGATES["clip"].reads
    (['clip', 'cispo'], ('eps_low', 'eps_high', 'dual_clip'))
"""

from __future__ import annotations

import importlib
from typing import Literal

from agentrl.algo.surrogates.base import Surrogate

# The registry: one line per surrogate module, named as algo.loss names it. The order is the
# order of the config reference, and of the Literal below: tests/test_config.py switches
# algo.loss to the second entry on a config with every shared option on, so the second must
# combine with all of them (cispo does).
_MODULES: tuple[str, ...] = (
    "clip",
    "cispo",
    "gspo",
    "gspo_token",
    "sapo",
)

SURROGATES: dict[str, Surrogate] = {m: importlib.import_module(f"{__name__}.{m}").SURROGATE for m in _MODULES}
SurrogateName = Literal[tuple(SURROGATES)]  # type: ignore[valid-type]  # the values of algo.loss
# The dataclasses of their own keys, in registry order (AlgoConfig's bases).
FIELD_CLASSES: tuple[type, ...] = tuple(dict.fromkeys(s.fields for s in SURROGATES.values() if s.fields))

__all__ = ["FIELD_CLASSES", "SURROGATES", "Surrogate", "SurrogateName"]
