"""Health alarms: rules over a run's per-step metric rows that catch a run training on nothing.

A run can look fine and learn nothing: every group without signal (loss 0, every attempt
skipped), a tool failing on every call, a model that stops calling its tools, a policy whose
entropy collapsed. Each rule below reads the history of metric rows (the lines of
``metrics.jsonl``, evaluation rows included) and says whether its condition holds at the last
row. :func:`check` returns the alarms that *start* at the last row: an alarm fires once when
its condition begins to hold, not again while it keeps holding, and again only after it
cleared. :class:`AlarmMonitor` is what the trainer calls once per step: it prints each alarm,
marks it in that step's metrics row as ``alarm/<name>`` = 1.0 (so metrics.jsonl and
TensorBoard carry it and the end-of-run summary lists it), and under
``alarms.on_alarm=stop`` raises :class:`AlarmStop`. docs/alarms.md lists the rules.

    >>> rows = [{"step": s, "reward/mean": 0.0, "groups/with_signal": 0.0} for s in (1, 2, 3)]
    >>> [a.name for a in check(rows, AlarmsConfig())]
    ['no_signal']
    >>> check(rows + [{"step": 4, "reward/mean": 0.0, "groups/with_signal": 0.0}], AlarmsConfig())
    []
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal

from agentrl.run.metrics import read_metrics
from agentrl.types import ConfigError

# What each alarm means, in a few words: the end-of-run summary prints it beside the step.
ALARMS: dict[str, str] = {
    "no_signal": "no group with signal (nothing to learn from)",
    "tool_errors": "most tool calls failed",
    "infra_failures": "many infrastructure failures",
    "tool_calls_collapse": "the model stopped calling its tools",
    "entropy_collapse": "policy entropy collapsed",
    "mismatch": "sampler and trainer log-probs disagree",
    "reward_vs_eval": "training reward up, held-out accuracy down",
}
# ... and those over the figures of the weight-sync canary (agentrl/run/canary.py), which the
# trainer measures after each sync; checked, printed, logged and disabled like the others
SYNC_ALARMS: dict[str, str] = {"weight_sync": "the engine does not sample the trainer's weights"}


@dataclass(frozen=True)
class Alarm:
    """One alarm as it fires: what happened (with the figures) and what to do."""

    name: str  # a key of ALARMS; logged as alarm/<name>
    step: int
    message: str
    fix: str

    def text(self) -> str:
        """The console line, e.g. ``ALARM no_signal (step 3): ... Fix: ...``."""
        return f"ALARM {self.name} (step {self.step}): {self.message}. Fix: {self.fix}"


class AlarmStop(RuntimeError):
    """Raised under ``alarms.on_alarm=stop``; the trainer checkpoints the step, then re-raises
    (the run exits 1 and resumes from that checkpoint). ``alarms``: the ones that fired."""

    def __init__(self, alarms: list[Alarm]) -> None:
        super().__init__("the run stopped on alarms.on_alarm=stop:\n" + "\n".join(a.text() for a in alarms))
        self.alarms = alarms


@dataclass
class AlarmsConfig:
    """Health alarms over the per-step metrics: printed, logged as alarm/<name>, listed in the
    end-of-run summary."""

    # warn: print and log the alarm; stop: also end the run (exit 1) after checkpointing the step
    on_alarm: Literal["warn", "stop"] = "warn"
    # steps a condition must hold in a row, and the window its figures are averaged over
    steps: int = 3
    disable: list[str] = field(default_factory=list)  # alarm names to leave off (docs/alarms.md)
    tool_error_rate: float = 0.5  # tool_errors: tools/error_rate above this in each step
    infra_excluded_frac: float = 0.1  # infra_failures: share of attempts excluded in each step ...
    infra_failed_per_attempt: float = 0.5  # ... or failed tries (retried ones included) per attempt
    tool_calls_frac: float = 0.25  # tool_calls_collapse: calls per attempt below this share of the start ...
    tool_calls_min: float = 0.2  # ... when the start (first steps' mean) had at least this many
    entropy_min: float = 0.01  # entropy_collapse: mean entropy (nats/token) below this ...
    entropy_frac: float = 0.05  # ... or below this share of the first steps' mean
    # mismatch (asynchronous rollouts, vLLM; ~1e-7 with the synchronous HF engine): the mean
    # |log π_old - log μ| per token above this ...
    mismatch_max: float = 0.1
    mismatch_growth: float = 10.0  # ... or above this many times the first steps' mean and above mismatch_max / 10
    eval_window: int = 3  # reward_vs_eval: over the last this many evaluations ...
    eval_drop: float = 0.05  # ... held-out accuracy never rose and fell by more than this ...
    reward_rise: float = 0.05  # ... while the training reward's fitted trend rose by more than this
    # weight_sync (agentrl/run/canary.py): after each weight sync a fixed sequence of this many
    # token ids is scored by the trainer and by the engine (engines with capabilities.can_score)
    canary_tokens: int = 32
    # the largest |log-prob gap| per canary token allowed when both compute in float32 and the
    # engine is the HF one (the same forward on the same weights: under 1e-6 measured) ...
    canary_tol: float = 1e-3
    # ... and otherwise: bfloat16 on either side (parallel.mixed_precision, train.autocast) or an
    # engine with its own kernels and weights (vLLM)
    canary_tol_loose: float = 0.5
    # ... and with a bfloat16 sampler (model.sampler_dtype): the engine's whole forward runs on
    # bfloat16 weights against the trainer's float32 (SmolLM2, 25 steps: max 0.61, mean 0.05-0.10
    # per canary token); an engine that is not synced is caught by the moved/still rule anyway
    canary_tol_narrow: float = 1.5
    # the update moved the trainer's canary log-probs by more than this (max per token) while the
    # engine's moved less than 1% of that: the new weights never reached the engine (verl#7495)
    canary_moved: float = 1e-4

    def __post_init__(self) -> None:
        unknown = sorted(set(self.disable) - set(ALARMS) - set(SYNC_ALARMS))
        if unknown:
            raise ConfigError(f"alarms.disable: {unknown} not among the alarms {[*ALARMS, *SYNC_ALARMS]}")
        if self.on_alarm not in ("warn", "stop"):  # the loader checks the Literal; this is for direct constructions
            raise ConfigError(f"alarms.on_alarm={self.on_alarm!r}: use 'warn' or 'stop'")
        for key, ok, valid in [("steps", self.steps >= 1, ">= 1"), ("eval_window", self.eval_window >= 2, ">= 2"),
                               ("mismatch_growth", self.mismatch_growth > 1, "> 1"),
                               ("canary_tokens", self.canary_tokens >= 2, ">= 2"),
                               ("canary_tol", self.canary_tol > 0, "> 0"),
                               ("canary_tol_loose", self.canary_tol_loose > 0, "> 0"),
                               ("canary_moved", self.canary_moved > 0, "> 0")]:
            if not ok:
                raise ConfigError(f"alarms.{key}={getattr(self, key)!r} is out of range: use {valid}")


# -- the rules: each reads the history and returns its alarm when its condition holds at the end --

Rows = list[dict]


def _train_rows(history: Rows) -> Rows:
    return [r for r in history if r.get("reward/mean") is not None]


def _tail(rows: Rows, k: int) -> Rows | None:
    return rows[-k:] if len(rows) >= k else None


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def _measured(r: dict) -> bool:
    """The update's token figures (entropy, mismatch) are means over the tokens that went through
    the model; a step whose attempts were all skipped (advantage 0) logs 0.0 for them, unmeasured."""
    return r.get("train/attempts", 1.0) - r.get("train/skipped_zero_adv", 0.0) > 0


def _figures(xs: list[float]) -> str:
    return ", ".join(f"{x:.2g}" for x in xs)


def no_signal(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """``groups/with_signal`` == 0 in each of the last ``steps`` steps; the cause from ``reward/mean``."""
    last = _tail([r for r in _train_rows(history) if "groups/with_signal" in r], cfg.steps)
    if last is None or any(r["groups/with_signal"] > 0 for r in last):
        return None
    rewards = [r["reward/mean"] for r in last]
    if all(x <= 0 for x in rewards):
        cause = ("no attempt succeeded (reward/mean 0): the tasks are too hard for the starting model, it had no "
                 "warm start (no demonstrations), or the checker never accepts")
        fix = ("give the environment demonstrations() and set warmstart.enabled=true, or use easier tasks; "
               "check that the checker accepts a right answer (docs/custom_env.md, \"When a run learns nothing\")")
    elif all(x >= 1 for x in rewards):
        cause = ("every attempt succeeded (reward/mean 1): the tasks are too easy for the warm start, or the "
                 "checker accepts anything")
        fix = ("harder tasks, a shorter warm start (warmstart.steps) or more warmstart.corruption; "
               "`agentrl audit-env ENV` checks what the checker accepts (docs/reward_integrity.md)")
    else:
        cause = (f"each task's attempts all got the same reward (reward/mean {_figures(rewards)}): every task is "
                 "always or never solved")
        fix = "tasks of middling difficulty, more attempts per task (algo.num_samples), or rollout.temperature 1.0"
    length = _mean(r.get("finish/length_frac", 0.0) for r in last)
    if length > 0.5:
        cause += (f"; {length:.0%} of the attempts ran out of tokens (finish/length_frac), so raise "
                  "rollout.max_new_tokens")
    return Alarm("no_signal", history[-1]["step"],
                 f"no group with signal for {cfg.steps} steps (groups/with_signal 0: all G attempts of every task "
                 f"got the same reward, loss 0, nothing learned): {cause}", fix)


def tool_errors(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """``tools/error_rate`` above ``tool_error_rate`` in each of the last ``steps`` steps with calls."""
    last = _tail(_train_rows(history), cfg.steps)
    if last is None or not all(r.get("tools/calls_per_traj", 0.0) > 0 and r.get("tools/error_rate", 0.0)
                               > cfg.tool_error_rate for r in last):
        return None
    rates = [r["tools/error_rate"] for r in last]
    return Alarm("tool_errors", history[-1]["step"],
                 f"tool calls failed for {cfg.steps} steps (tools/error_rate {_figures(rates)}, above "
                 f"{cfg.tool_error_rate}): the model learns from error messages, not from tool results",
                 "read the failing calls with `agentrl inspect RUN --tool-error`; check the tool's arguments and "
                 "schema, tools.timeout, and that the tool runs in its sandbox (docs/custom_env.md)")


def infra_failures(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """Standing infrastructure failures (``infra/excluded`` per attempt) above ``infra_excluded_frac``,
    or failed tries (``infra/failed``) per attempt above ``infra_failed_per_attempt``, in each of the
    last ``steps`` steps. Warns before ``train.max_infra_fail_frac`` stops the run."""
    last = _tail(_train_rows(history), cfg.steps)
    if last is None:
        return None
    # the attempts of a step: those in the loss plus those excluded for a standing failure
    att = [max(1.0, r.get("train/attempts", 0.0) + r.get("infra/excluded", 0.0)) for r in last]
    excluded = [r.get("infra/excluded", 0.0) / a for r, a in zip(last, att)]
    failed = [r.get("infra/failed", 0.0) / a for r, a in zip(last, att)]
    if all(x > cfg.infra_excluded_frac for x in excluded):
        what = f"{_figures(excluded)} of the attempts excluded (above {cfg.infra_excluded_frac})"
    elif all(x > cfg.infra_failed_per_attempt for x in failed):
        what = f"{_figures(failed)} failed tries per attempt (above {cfg.infra_failed_per_attempt}), retried"
    else:
        return None
    return Alarm("infra_failures", history[-1]["step"],
                 f"infrastructure failures for {cfg.steps} steps: {what}; the run stops when a step's excluded "
                 "share passes train.max_infra_fail_frac",
                 "the sources and causes are infra/source/* and infra/cause/* in metrics.jsonl; fix the failing "
                 "service or sandbox (docs/failures.md), or raise rollout.infra_retries for transient faults")


def tool_calls_collapse(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """The mean ``tools/calls_per_traj`` of the last ``steps`` steps below ``tool_calls_frac`` of the
    first ``steps`` steps' mean, when that was at least ``tool_calls_min``."""
    calls = [r["tools/calls_per_traj"] for r in _train_rows(history) if "tools/calls_per_traj" in r]
    k = cfg.steps
    if len(calls) < 2 * k:  # the two windows must not overlap
        return None
    start, now = _mean(calls[:k]), _mean(calls[-k:])
    if start < cfg.tool_calls_min or now >= cfg.tool_calls_frac * start:
        return None
    return Alarm("tool_calls_collapse", history[-1]["step"],
                 f"tool calls per attempt fell from {start:.2f} (first {k} steps) to {now:.2f} (last {k} steps), "
                 f"under {cfg.tool_calls_frac:.0%} of the start: the model is learning to answer without its "
                 "tools, as small models do when a call rarely pays (verl PR#4998)",
                 "tasks that need the tool (answers it cannot guess), a lower optim.lr, or a KL term "
                 "(algo.kl_coef); compare rewarded attempts with and without calls (`agentrl inspect RUN`)")


def entropy_collapse(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """The mean ``entropy`` of the last ``steps`` measured steps below ``entropy_min``, or below
    ``entropy_frac`` of the first ``steps`` measured steps' mean."""
    ent = [r["entropy"] for r in _train_rows(history) if r.get("entropy") is not None and _measured(r)]
    k = cfg.steps
    if len(ent) < k:
        return None
    now = _mean(ent[-k:])
    start = _mean(ent[:k]) if len(ent) >= 2 * k else None
    if not (now < cfg.entropy_min or (start is not None and now < cfg.entropy_frac * start)):
        return None
    was = f" ({start:.3f} over the first {k})" if start is not None else ""
    return Alarm("entropy_collapse", history[-1]["step"],
                 f"policy entropy fell to {now:.4f} nats/token over the last {k} steps{was}: a task's attempts "
                 "become identical, so groups lose their signal and exploration stops",
                 "a higher rollout.temperature, a lower optim.lr, clip-higher (algo.eps_high, DAPO) or a KL term "
                 "(algo.kl_coef); if reward/mean is near 1 the tasks are solved: make them harder")


def mismatch(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """The mean ``mismatch/abs_mean`` of the last ``steps`` measured steps above ``mismatch_max``, or
    above ``mismatch_growth`` x the first steps' mean and ``mismatch_max / 10`` (steady growth)."""
    mis = [r["mismatch/abs_mean"] for r in _train_rows(history)
           if r.get("mismatch/abs_mean") is not None and _measured(r)]
    k = cfg.steps
    if len(mis) < k:
        return None
    now = _mean(mis[-k:])
    start = _mean(mis[:k]) if len(mis) >= 2 * k else None
    grew = start is not None and now > cfg.mismatch_max / 10 and now > cfg.mismatch_growth * start
    if not (now > cfg.mismatch_max or grew):
        return None
    was = f", {start:.2g} over the first {k}" if start is not None else ""
    return Alarm("mismatch", history[-1]["step"],
                 f"the sampler's log-probs drift from the trainer's: mismatch/abs_mean {now:.3g} over the last {k} "
                 f"steps{was}; the update corrects less and less for the policy that sampled (tinker-cookbook "
                 "PR#822)",
                 "a lower train.max_staleness, the IS correction (algo.is_level=token), and a check that the "
                 "engine receives the new weights each step and samples in the trainer's dtype (docs/async.md)")


def reward_vs_eval(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """Over the last ``eval_window`` evaluations held-out accuracy never rose and fell by more than
    ``eval_drop``, while ``reward/mean`` over the training steps since the first of them rose (least
    squares trend over the window) by more than ``reward_rise``. Decided at evaluation rows only, so
    it changes state (and fires) at most once per evaluation."""
    at = [i for i, r in enumerate(history) if r.get("eval/accuracy") is not None]
    if len(at) < cfg.eval_window:
        return None
    window = [history[i] for i in at[-cfg.eval_window:]]
    acc = [r["eval/accuracy"] for r in window]
    s0, s1 = window[0]["step"], window[-1]["step"]
    if any(b > a for a, b in zip(acc, acc[1:])) or acc[0] - acc[-1] <= cfg.eval_drop:
        return None
    pts = [(r["step"], r["reward/mean"]) for r in _train_rows(history[: at[-1] + 1]) if s0 < r["step"] <= s1]
    if len(pts) < 2:
        return None
    mx, my = _mean(p[0] for p in pts), _mean(p[1] for p in pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    rise = (sum((x - mx) * (y - my) for x, y in pts) / var) * (pts[-1][0] - pts[0][0]) if var else 0.0
    if rise <= cfg.reward_rise:
        return None
    return Alarm("reward_vs_eval", history[-1]["step"],
                 f"training reward rose by {rise:.2f} over steps {s0}-{s1} while held-out accuracy fell "
                 f"({_figures(acc)}): the policy learns something the held-out tasks do not reward, a reward "
                 "hack or overfitting to the training tasks",
                 "look at what is rewarded (`agentrl inspect RUN --reward '==1'`), run `agentrl audit-env ENV` "
                 "(docs/reward_integrity.md), use more training tasks; keep the checkpoint of the best evaluation")


STILL_FRAC = 0.01  # weight_sync: an engine whose canary moved less than this share of the trainer's did not move


def weight_sync(history: Rows, cfg: AlarmsConfig) -> Alarm | None:
    """At the last training step (no window: a broken sync is broken at its first step), from the
    canary figures ``sync/*`` (agentrl/run/canary.py): the engine's canary log-probs differ from
    the trainer's by more than ``sync/canary_tol`` (``canary_tol`` or ``canary_tol_loose``), or
    the update moved the trainer's by more than ``canary_moved`` and the engine's by less than
    ``STILL_FRAC`` of that."""
    rows = _train_rows(history)
    r = rows[-1] if rows else {}
    gap, tol = r.get("sync/canary_abs_max"), r.get("sync/canary_tol")
    if gap is None or tol is None:
        return None
    trainer, engine = r.get("sync/trainer_moved"), r.get("sync/engine_moved")
    still = trainer is not None and engine is not None and trainer > cfg.canary_moved and engine < STILL_FRAC * trainer
    if not still and gap <= tol:
        return None
    if still:
        what = (f"the update moved the trainer's canary log-probs by {trainer:.3g} and the engine's by {engine:.3g}: "
                "the new weights did not reach the engine (a sync skipped, a LoRA adapter not merged: verl#7495, "
                "which looks like staleness)")
    else:
        what = (f"the engine's canary log-probs differ from the trainer's by {gap:.3g} (max per token, tolerance "
                f"{tol:.3g}): it samples other weights than the trainer's (a stale or partial copy, another dtype)")
    mis = r.get("mismatch/abs_max")
    seen = f"; this step's rollout had mismatch/abs_max {mis:.3g}" if mis is not None and _measured(r) else ""
    return Alarm("weight_sync", r["step"], f"after the weight sync, {what}{seen}",
                 "check that the engine gets every parameter after every step, LoRA merged, in the trainer's dtype "
                 "(agentrl/scale/weight_sync.py); raise alarms.canary_tol(_loose) only for a gap that is numerics")


RULES: dict[str, Callable[[Rows, AlarmsConfig], Alarm | None]] = {
    "no_signal": no_signal, "tool_errors": tool_errors, "infra_failures": infra_failures,
    "tool_calls_collapse": tool_calls_collapse, "entropy_collapse": entropy_collapse, "mismatch": mismatch,
    "reward_vs_eval": reward_vs_eval,
}
SYNC_RULES: dict[str, Callable[[Rows, AlarmsConfig], Alarm | None]] = {"weight_sync": weight_sync}
assert list(RULES) == list(ALARMS) and list(SYNC_RULES) == list(SYNC_ALARMS)


def check(history: Rows, cfg: AlarmsConfig) -> list[Alarm]:
    """The alarms that start at the last row of ``history``: their condition holds there and did
    not hold one row earlier (so each fires once, when it starts, and again only after clearing).
    Rows are metric rows with a ``step``, values numbers (a missing key never makes an alarm fire).

    >>> ok = {"reward/mean": 0.5, "groups/with_signal": 4.0}
    >>> rows = [{"step": 1, **ok}] + [{"step": s, "reward/mean": 1.0, "groups/with_signal": 0.0} for s in (2, 3, 4)]
    >>> (a,) = check(rows, AlarmsConfig())
    >>> a.name, a.step, "every attempt succeeded" in a.message
    ('no_signal', 4, True)
    >>> check(rows, AlarmsConfig(disable=["no_signal"]))
    []
    """
    if not history:
        return []
    out = []
    for name, rule in {**RULES, **SYNC_RULES}.items():
        if name in cfg.disable:
            continue
        alarm = rule(history, cfg)
        if alarm is not None and rule(history[:-1], cfg) is None:
            out.append(alarm)
    return out


# -- what the trajectories add: the text of the step's first failure --------------------------


def first_tool_error(trajectories) -> str | None:
    """``name: error: observation`` of the step's first failed tool call (the observation cut to 200
    characters), or None."""
    for t in trajectories:
        for c in getattr(t, "tool_calls", ()):
            if c.error:
                seen = " ".join(str(c.result).split())[:200]
                return f"{c.name}: {c.error}" + (f": {seen}" if seen else "")
    return None


def first_infra_failure(trajectories) -> str | None:
    """``source (cause): message`` of the step's first infrastructure failure, retried or not."""
    for t in trajectories:
        tries = [*getattr(t, "retried", ()), *[f for c in getattr(t, "tool_calls", ()) for f in c.retried]]
        if getattr(t, "failure", None) is not None:
            tries.append(t.failure)
        if tries:
            f = tries[0]
            return f"{f.source} ({f.cause}): {f.message[:200]}"
    return None


def _numbers(row: dict) -> dict:
    """``row`` without its None values (metrics.jsonl writes a non-finite value as null): the
    rules read a missing key as unknown."""
    return {k: v for k, v in row.items() if v is not None}


class AlarmMonitor:
    """The trainer's alarms: call :meth:`step` once per step with its metrics row, before the row
    is logged; then :meth:`stop_if_asked` with what it returned, after the row is logged.

    The history starts with the rows already in ``metrics_path`` before the first step seen
    (the step-0 evaluation, or the steps before a resume), so a resumed run neither forgets its
    first steps nor fires again an alarm that was already firing.

    >>> seen = []
    >>> mon = AlarmMonitor(AlarmsConfig(steps=2), log=seen.append)
    >>> rows = [{"reward/mean": 0.0, "groups/with_signal": 0.0} for _ in range(3)]
    >>> [[a.name for a in mon.step(s, r)] for s, r in enumerate(rows, 1)]
    [[], ['no_signal'], []]
    >>> rows[1]["alarm/no_signal"], "alarm/no_signal" in rows[2], seen[0].startswith("ALARM no_signal (step 2)")
    (1.0, False, True)
    """

    def __init__(self, cfg: AlarmsConfig, log: Callable[[str], object] = print,
                 metrics_path: Path | str | None = None) -> None:
        self.cfg = cfg
        self.log = log
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.history: Rows = []
        self.fired: list[Alarm] = []  # every alarm of this session, in order
        self._started = False

    def step(self, step: int, row: dict, trajectories=()) -> list[Alarm]:
        """Check the history with ``row`` appended; print each alarm that starts, add
        ``alarm/<name>`` = 1.0 to ``row`` for it, and return them."""
        if not self._started:
            self._started = True
            if self.metrics_path is not None:
                self.history = [_numbers(r) for r in read_metrics(self.metrics_path) if r.get("step", 0) < step]
        self.history.append(_numbers({**row, "step": step}))
        fired = [self._detail(a, trajectories) for a in check(self.history, self.cfg)]
        for a in fired:
            self.log(a.text())
            row[f"alarm/{a.name}"] = 1.0
        self.fired += fired
        return fired

    def stop_if_asked(self, fired: list[Alarm]) -> None:
        """Raise :class:`AlarmStop` when alarms fired and ``on_alarm`` is ``stop``."""
        if fired and self.cfg.on_alarm == "stop":
            raise AlarmStop(fired)

    @staticmethod
    def _detail(a: Alarm, trajectories) -> Alarm:
        """The step's first failure text on the alarms about failures (the metrics only count them)."""
        first = {"tool_errors": first_tool_error, "infra_failures": first_infra_failure}.get(a.name)
        text = first(trajectories) if first else None
        return replace(a, message=f"{a.message}; first this step: {text}") if text else a
