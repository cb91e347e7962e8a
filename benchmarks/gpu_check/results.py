"""What the check measured, as dataclasses: one ``*Data`` class per section, the
``SectionResult`` around it, and the ``Report`` that becomes ``gpu_check.json``.

Each ``*Data`` has ``summary()`` (one line for the markdown table) and ``problems()`` (figures
that are not sane, or checks outside their tolerance; a section with problems gets status
``check_failed``). Children write their sections as JSON; the parent reads them back into
these classes with ``from_dict``, so the report is always written from dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from gpu_check.bootstrap import REPO, ImportReport

STATUSES = ("ok", "check_failed", "failed", "timeout", "skipped")


def _finite_positive(name: str, value: float | None) -> list[str]:
    if value is None or not math.isfinite(value) or value <= 0:
        return [f"{name} = {value} is not a finite positive number"]
    return []


@dataclass
class SetupData:
    """The machine, the packages, where agentrl came from, the models built."""

    profile: str = ""
    device: str = ""
    device_name: str = ""
    python: str = ""
    torch: str = ""
    cuda: str | None = None
    transformers: str = ""
    imports: ImportReport = field(default_factory=ImportReport)
    qwen_dir: str = ""
    qwen_params_m: float = 0.0
    qwen_config: dict[str, int] = field(default_factory=dict)  # the dimensions actually built
    vocab_size: int = 0
    tokenizer_len: int = 0
    tiny_dir: str = ""
    build_s: float = 0.0

    def summary(self) -> str:
        return (f"{self.device_name or self.device}, torch {self.torch}, transformers {self.transformers}; "
                f"Qwen2.5-1.5B-shaped model {self.qwen_params_m:.0f}M params built in {self.build_s:.1f} s")

    def problems(self) -> list[str]:
        out = _finite_positive("qwen_params_m", self.qwen_params_m)
        tree = str(REPO)
        for name, where in [("agentrl", self.imports.agentrl_file), *self.imports.mapped_packages.items()]:
            if not where.startswith(tree):
                out.append(f"{name} was imported from {where}, not from this working tree ({tree})")
        return out


@dataclass
class SamplingRow:
    batch: int
    path: str  # "engine" (HFEngine) or "generate" (transformers model.generate)
    seconds: float
    new_tokens: int
    tokens_per_s: float
    ms_per_step: float
    peak_gpu_gb: float | None = None


@dataclass
class SamplingData:
    """HFEngine against ``model.generate`` on the same prompts, every row running all tokens."""

    model: str = ""
    params_m: float = 0.0
    dtype: str = ""
    prompt_tokens: list[int] = field(default_factory=list)  # min, max
    rows: list[SamplingRow] = field(default_factory=list)

    def speedup(self, batch: int) -> float | None:
        """engine tokens/s over generate tokens/s at ``batch``."""
        by = {r.path: r for r in self.rows if r.batch == batch}
        if "engine" in by and "generate" in by:
            return by["engine"].tokens_per_s / by["generate"].tokens_per_s
        return None

    def summary(self) -> str:
        parts = []
        for b in sorted({r.batch for r in self.rows}):
            tps = {r.path: r.tokens_per_s for r in self.rows if r.batch == b}
            parts.append(f"batch {b}: engine {tps.get('engine', 0):,.0f} tok/s, generate "
                         f"{tps.get('generate', 0):,.0f} tok/s ({self.speedup(b) or 0:.2f}x)")
        return f"{self.model} {self.dtype}: " + "; ".join(parts)

    def problems(self) -> list[str]:
        out = [] if self.rows else ["no sampling row"]
        for r in self.rows:
            out += _finite_positive(f"{r.path} batch {r.batch} tokens/s", r.tokens_per_s)
        return out


@dataclass
class StepTiming:
    kind: str  # "free" (the model's own text) or "scripted-tools" (forced python tool calls)
    step_s: float
    rollout_s: float
    tools_s: float
    update_s: float
    trajectories: int
    trained_tokens: int
    tool_calls_per_traj: float
    reward_mean: float
    mismatch_abs_max: float


@dataclass
class TrainStepData:
    """``Trainer.train_step`` on the Qwen2.5-1.5B-shaped model with the python tool."""

    layout: str = ""
    isolation_level: str = ""
    build_s: float = 0.0
    steps: list[StepTiming] = field(default_factory=list)
    peak_gpu_gb: float | None = None

    def summary(self) -> str:
        parts = [f"{s.kind}: {s.step_s:.1f} s (rollout {s.rollout_s:.1f}, tools {s.tools_s:.1f}, "
                 f"update {s.update_s:.1f}), {s.tool_calls_per_traj:.1f} calls/traj" for s in self.steps]
        return f"isolation {self.isolation_level}; " + "; ".join(parts)

    def problems(self) -> list[str]:
        out = [] if len(self.steps) == 2 else [f"{len(self.steps)} steps ran, expected 2"]
        for s in self.steps:
            out += _finite_positive(f"{s.kind} step_s", s.step_s)
        scripted = [s for s in self.steps if s.kind == "scripted-tools"]
        if scripted and scripted[0].tool_calls_per_traj <= 0:
            out.append("the scripted step made no tool call")
        if self.isolation_level == "bwrap":
            out.append("the python tool ran under bwrap; the GPU machine has none (unshare/rlimits expected)")
        return out


@dataclass
class LogprobData:
    """Sampler log-probs μ against the trainer's π_old on the same sampled tokens."""

    dtype: str = ""
    tokens: int = 0
    mean_abs: float = 0.0
    max_abs: float = 0.0
    p99_abs: float = 0.0
    tol_mean: float = 0.0
    tol_max: float = 0.0
    logprob_std: float = 0.0  # spread of the sampled tokens' log-probs: the check is not vacuous
    shifted_mean_abs: float = 0.0  # negative control: μ against π_old one token later

    def summary(self) -> str:
        return (f"{self.tokens} tokens, abs Δ mean {self.mean_abs:.2e} max {self.max_abs:.2e} "
                f"(tolerance {self.tol_mean:g} / {self.tol_max:g} nats, {self.dtype}); "
                f"shifted control {self.shifted_mean_abs:.2e}")

    def problems(self) -> list[str]:
        out = [] if self.tokens > 0 else ["no sampled token to compare"]
        if self.mean_abs > self.tol_mean:
            out.append(f"mean |Δ| {self.mean_abs:.3g} > {self.tol_mean:g}")
        if self.max_abs > self.tol_max:
            out.append(f"max |Δ| {self.max_abs:.3g} > {self.tol_max:g}")
        if self.shifted_mean_abs <= 5 * self.tol_mean:
            out.append(f"the shifted control differs by only {self.shifted_mean_abs:.3g}: this check could not "
                       "tell misaligned tokens apart")
        return out


@dataclass
class MasksData:
    """Mask and span invariants of the trajectories, and the prompt re-rendered by the template."""

    trajectories: int = 0
    with_tool_calls: int = 0
    span_tokens: dict[str, int] = field(default_factory=dict)  # kind -> tokens
    prompts_rerendered: int = 0
    problems_found: list[str] = field(default_factory=list)  # the first few

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.span_tokens.items()))
        return (f"{self.trajectories} trajectories ({self.with_tool_calls} with tool calls), tokens by span: "
                f"{kinds}; {self.prompts_rerendered} prompts re-rendered; {len(self.problems_found)} problems")

    def problems(self) -> list[str]:
        out = list(self.problems_found)
        if self.trajectories == 0:
            out.append("no trajectory checked")
        if self.with_tool_calls == 0:
            out.append("no trajectory with a tool call: tool spans untested")
        return out


@dataclass
class UpdateRow:
    grad_checkpointing: bool
    checkpointing_active: bool | None  # what the model reports after the switch
    seconds: float
    trained_tokens: int
    sequence_tokens: int
    us_per_trained_token: float
    us_per_sequence_token: float
    peak_gpu_gb: float | None = None


@dataclass
class UpdateData:
    """``grpo_update`` on a fixed synthetic batch, with and without gradient checkpointing."""

    layout: str = ""
    micro_batch_tokens: int = 0
    rows: list[UpdateRow] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"ckpt {'on' if r.grad_checkpointing else 'off'}: {r.us_per_trained_token:.1f} µs/trained token "
                 f"({r.seconds:.2f} s for {r.trained_tokens}), peak "
                 + (f"{r.peak_gpu_gb:.1f} GB" if r.peak_gpu_gb is not None else "n/a") for r in self.rows]
        return "; ".join(parts)

    def problems(self) -> list[str]:
        out = [] if len(self.rows) == 2 else [f"{len(self.rows)} update rows, expected 2"]
        for r in self.rows:
            out += _finite_positive(f"update s (ckpt {r.grad_checkpointing})", r.seconds)
            if r.checkpointing_active is not None and r.checkpointing_active != r.grad_checkpointing:
                out.append(f"asked for gradient checkpointing {r.grad_checkpointing}, the model reports "
                           f"{r.checkpointing_active}")
        return out


@dataclass
class ArithmeticData:
    """The arithmetic example (tiny model, warm start, python tool), N GRPO steps."""

    device: str = ""
    isolation_level: str = ""
    steps_done: int = 0
    steps_asked: int = 0
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    eval_tasks: int = 0
    setup_s: float = 0.0  # Trainer construction, warm start included
    train_s: float = 0.0
    median_step_s: float = 0.0
    reward_first: float | None = None
    reward_last: float | None = None
    mismatch_abs_max: float | None = None

    def summary(self) -> str:
        return (f"{self.steps_done} steps on {self.device}: held-out accuracy {self.accuracy_before} -> "
                f"{self.accuracy_after} ({self.eval_tasks} tasks); setup {self.setup_s:.0f} s, "
                f"train {self.train_s:.0f} s, median step {self.median_step_s:.2f} s")

    def problems(self) -> list[str]:
        out = []
        if self.steps_done != self.steps_asked:
            out.append(f"{self.steps_done} of {self.steps_asked} steps done")
        for name in ("accuracy_before", "accuracy_after"):
            v = getattr(self, name)
            if v is None or not 0.0 <= v <= 1.0:
                out.append(f"{name} = {v} is not an accuracy")
        return out


SectionData = Union[SetupData, SamplingData, TrainStepData, LogprobData, MasksData, UpdateData, ArithmeticData]


@dataclass
class SectionResult:
    name: str
    status: str  # one of STATUSES
    seconds: float
    budget_s: float
    error: str | None = None
    traceback: str | None = None
    notes: list[str] = field(default_factory=list)
    data: SectionData | None = None

    def line(self) -> str:
        """The markdown table row."""
        what = self.data.summary() if self.data is not None and self.status in ("ok", "check_failed") else ""
        why = self.error or ""
        text = "; ".join(x for x in (what, why) if x).replace("|", "/")
        return f"| {self.name} | {self.status} | {self.seconds:.1f} / {self.budget_s:.0f} | {text} |"


@dataclass
class Meta:
    command: str
    profile: str
    started_utc: str
    git_commit: str
    git_dirty: bool
    total_budget_s: float
    wall_s: float = 0.0


@dataclass
class Report:
    meta: Meta
    sections: list[SectionResult] = field(default_factory=list)

    def markdown(self) -> str:
        """A short table: one row per section, then the sampling and update figures."""
        m = self.meta
        lines = [f"# gpu_check ({m.profile}) {m.started_utc}, commit {m.git_commit}{' (dirty)' if m.git_dirty else ''}",
                 f"wall {m.wall_s:.0f} s of {m.total_budget_s:.0f} s budget", "",
                 "| section | status | s / budget | figures |", "|---|---|---|---|"]
        lines += [s.line() for s in self.sections]
        rows = [(s.data, r) for s in self.sections if isinstance(s.data, SamplingData) for r in s.data.rows]
        if rows:
            lines += ["", "| model | batch | path | tok/s | ms/step | peak GPU GB |", "|---|---|---|---|---|---|"]
            lines += [f"| {d.model} | {r.batch} | {r.path} | {r.tokens_per_s:,.0f} | {r.ms_per_step:.2f} | "
                      f"{'n/a' if r.peak_gpu_gb is None else f'{r.peak_gpu_gb:.1f}'} |" for d, r in rows]
        ups = [r for s in self.sections if isinstance(s.data, UpdateData) for r in s.data.rows]
        if ups:
            lines += ["", "| grad ckpt | s | trained tok | µs/trained tok | µs/seq tok | peak GPU GB |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {'on' if r.grad_checkpointing else 'off'} | {r.seconds:.2f} | {r.trained_tokens} | "
                      f"{r.us_per_trained_token:.1f} | {r.us_per_sequence_token:.1f} | "
                      f"{'n/a' if r.peak_gpu_gb is None else f'{r.peak_gpu_gb:.1f}'} |" for r in ups]
        return "\n".join(lines) + "\n"


DATA_TYPES: dict[str, type] = {}  # section name -> its data class (filled by sections.py)


def from_dict(cls: Any, value: Any) -> Any:
    """Rebuild a dataclass (nested dataclasses, lists, optionals) from ``dataclasses.asdict`` output."""
    if value is None:
        return None
    origin = typing.get_origin(cls)
    if origin in (Union, types.UnionType):
        arms = [a for a in typing.get_args(cls) if a is not type(None)]
        return from_dict(arms[0], value) if len(arms) == 1 else value
    if origin is list:
        (item,) = typing.get_args(cls)
        return [from_dict(item, v) for v in value]
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in value:
                continue
            if cls is SectionResult and f.name == "data":
                kind = DATA_TYPES.get(value["name"])
                if kind is None and value["data"] is not None:
                    raise KeyError(f"no data class for section {value['name']!r} (import gpu_check.sections first)")
                kwargs["data"] = from_dict(kind, value["data"])
            else:
                kwargs[f.name] = from_dict(hints[f.name], value[f.name])
        return cls(**kwargs)
    return value
