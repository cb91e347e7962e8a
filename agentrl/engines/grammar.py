"""Constrained decoding: a JSON schema (or "any JSON object") as a per-row token mask.

A request whose ``SamplingParams.grammar`` is set samples every token from the model's
distribution *restricted to the tokens the grammar allows next* (llguidance computes that set,
``A_t``, from the text so far; ``benchmarks/constrained_decoding.py`` says why llguidance):

    μ(y_t) = exp(z_y / T) / Σ_{v ∈ A_t} exp(z_v / T)            (z: the logits, T: the temperature)
    log μ(y_t) = log π_T(y_t) − log Z_t,   Z_t = Σ_{v ∈ A_t} π_T(v) ≤ 1

That masked, renormalised log-prob is what the engine records (``Generation.logprobs``): it
is the distribution the token was drawn from, the true sampler μ. The trainer's π_old is the
unconstrained policy (``score_tokens`` knows nothing of the grammar), so on a constrained token

    π_old(y_t) / μ(y_t) = Z_t ≤ 1

(at T = 1): the truncated importance weight of docs/design.md ("Asynchronous / stale
sampler") is then exactly the importance weight of the masked sampler against the policy,
and ``mismatch/abs_mean`` measures −log Z_t, how much the grammar overrode the model. A token
the grammar forces (|A_t| = 1) has μ = 1, log μ = 0. Greedy (T = 0) records the T = 1 masked
log-prob, as unconstrained greedy records the T = 1 one.

The rows of a batch are masked one by one: a row without a grammar is not touched, so it
samples exactly what it samples without constrained rows beside it.

JSON is written compactly, with no whitespace between tokens (``{"a":1,"b":[2,3]}``): a model,
above all an untrained one, could otherwise spend its whole budget on whitespace that any JSON
parser skips. Properties come out in the schema's order.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

INSTALL = "constrained decoding needs llguidance: pip install 'agentrl[serve]' (or pip install llguidance)"
# Compact JSON, no free whitespace (see the module docstring); the rest of the schema is the caller's.
_OVERRIDES = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    """What a constrained request's output must be: JSON matching ``schema`` (JSON text).

    >>> Grammar.json_object().schema
    '{"type": "object"}'
    >>> Grammar.json_schema({"type": "integer"}).kind
    'json_schema'
    """

    kind: str  # "json_schema" or "json_object" (the response_format types it comes from)
    schema: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> "Grammar":
        return cls("json_schema", json.dumps(schema))  # key order kept: properties come out in it

    @classmethod
    def json_object(cls) -> "Grammar":
        return cls("json_object", json.dumps({"type": "object"}))


class GrammarError(ValueError):
    """A schema the grammar library cannot compile (the message says what it refused)."""


def masked_logprob(logits: Tensor, allowed: Tensor, token: int, temperature: float) -> float:
    """log μ(token): the log-prob of ``token`` under softmax(logits / T) restricted to the
    ``allowed`` (bool, same shape) tokens and renormalised; T = 0 is taken as T = 1 (greedy
    records the T = 1 log-prob). What a constrained row records (module docstring).

    >>> import math
    >>> lg, ok = torch.tensor([0.0, math.log(3.0), 5.0]), torch.tensor([True, True, False])
    >>> round(masked_logprob(lg, ok, 1, 1.0), 6) == round(math.log(3 / 4), 6)
    True
    """
    if not bool(allowed[token]):
        raise ValueError(f"token {token} is not allowed by the mask: it has no probability under μ")
    t = temperature if temperature > 0 else 1.0
    z = (logits.double() / t).masked_fill(~allowed, float("-inf"))
    return float(z[token] - torch.logsumexp(z, dim=-1))


def _llguidance():
    try:
        import llguidance
        import llguidance.hf
    except ImportError as e:
        raise ImportError(INSTALL) from e
    return llguidance


def check_grammar(grammar: Grammar) -> None:
    """Raise :class:`GrammarError` when ``grammar``'s schema cannot be compiled (no tokenizer
    needed: the endpoint checks a request before it samples). ImportError without llguidance.

    >>> check_grammar(Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    >>> try:
    ...     check_grammar(Grammar("json_schema", '{"type": "nonsense"}'))
    ... except GrammarError as e:
    ...     print(e)
    the schema cannot be compiled: Invalid type: nonsense
    """
    llg = _llguidance()
    err = llg.LLMatcher.validate_grammar(_compile(llg, grammar), None)
    if err:
        raise GrammarError(f"the schema cannot be compiled: {err}")


def _compile(llg, grammar: Grammar) -> str:
    try:
        return llg.LLMatcher.grammar_from_json_schema(grammar.schema, overrides=_OVERRIDES)
    except (ValueError, RuntimeError) as e:
        raise GrammarError(f"the schema cannot be compiled: {e}") from None


class RowMatcher:
    """One row's grammar state: which tokens may come next, and the tokens so far.

    ``stop_ids`` are the request's stop tokens: allowed exactly when the JSON is complete
    (then only they are), so a constrained turn ends with its end-of-turn token."""

    def __init__(self, matcher, vocab: int):
        self.matcher = matcher
        self.vocab = vocab

    def fill(self, bitmask: Tensor, index: int) -> None:
        """Write the allowed set into row ``index`` of an int32 bitmask (llguidance's layout)."""
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {self.matcher.get_error()}")
        self.matcher.unsafe_compute_mask_ptr(bitmask[index].data_ptr(), bitmask[index].numel() * 4)

    def advance(self, token: int) -> None:
        """The row sampled ``token`` (drawn under the mask, so the grammar accepts it)."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar rejected token {token}, which was sampled under its mask: "
                               f"{self.matcher.get_error()}")


class Constrainer:
    """Builds :class:`RowMatcher` objects for one tokenizer and logits width (the HF engine
    keeps one). llguidance's tokenizer view is built once per set of stop ids."""

    def __init__(self, tokenizer, vocab: int):
        self.tokenizer, self.vocab = tokenizer, vocab
        self._views: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    def matcher(self, grammar: Grammar, stop_ids: list[int]) -> RowMatcher:
        if not stop_ids:
            raise ValueError("a constrained request needs stop_token_ids (the end-of-turn token the grammar "
                             "allows once the JSON is complete)")
        llg = _llguidance()
        key = tuple(sorted(set(stop_ids)))
        with self._lock:
            view = self._views.get(key)
            if view is None:
                view = self._views[key] = llg.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab,
                                                                eos_token=list(key))
        m = llg.LLMatcher(view, _compile(llg, grammar))
        if m.is_error():
            raise GrammarError(f"the schema cannot be compiled: {m.get_error()}")
        return RowMatcher(m, self.vocab)


def mask_rows(logits: Tensor, rows: list[int], matchers: list[RowMatcher]) -> None:
    """Set to -inf, in place, every logit of ``logits[rows[i]]`` that ``matchers[i]`` forbids
    (other rows untouched). Then sampling the row draws from μ and returns log μ (sample_tokens
    renormalises over what is left)."""
    if not rows:
        return
    vocab = logits.shape[1]
    bitmask = torch.empty(len(rows), (vocab + 31) // 32, dtype=torch.int32)
    for i, m in enumerate(matchers):
        m.fill(bitmask, i)
    forbidden = forbidden_tokens(bitmask.to(logits.device), vocab)
    for i, j in enumerate(rows):  # in place on each row's view: no copy of the batch's logits
        logits[j].masked_fill_(forbidden[i], float("-inf"))


_BITS: dict[torch.device, Tensor] = {}


def forbidden_tokens(bitmask: Tensor, vocab: int) -> Tensor:
    """(B, ceil(V/32)) int32, bit k of word w set = token 32w + k allowed -> (B, V) bool, True
    where forbidden. (llguidance's own ``apply_token_bitmask_inplace`` is ``torch.compile``d:
    seconds of compilation on first use.)

    >>> forbidden_tokens(torch.tensor([[0b101]], dtype=torch.int32), 3).tolist()
    [[False, True, False]]
    """
    bits = _BITS.get(bitmask.device)
    if bits is None:  # 1 << k as int32 (bit 31 is the sign bit)
        bits = _BITS[bitmask.device] = torch.tensor([1 << k if k < 31 else -(1 << 31) for k in range(32)],
                                                    dtype=torch.int32, device=bitmask.device)
    return (bitmask[:, :, None] & bits).eq(0).view(bitmask.shape[0], -1)[:, :vocab]


def unpack_bitmask(bitmask: Tensor, vocab: int) -> Tensor:
    """The allowed tokens of a bitmask, (B, V) bool (the complement of :func:`forbidden_tokens`).

    >>> unpack_bitmask(torch.tensor([[0b101]], dtype=torch.int32), 3).tolist()
    [[True, False, True]]
    """
    return ~forbidden_tokens(bitmask, vocab)
