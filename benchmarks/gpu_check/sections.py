"""The sections, the child process (group) each runs in, and how one section is run.

A group is one child process: a crash there (a CUDA fault, an out-of-memory kill, the group's
time running out) ends only that group, and the parent records its unfinished sections and
goes on. Inside a child every section is timed and catches its own exception: a failed section
records the error and the next one runs (the policy sections share one trainer; when
``train_step`` could not build it, the others fail saying so).
"""

from __future__ import annotations

import gc
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from gpu_check.bootstrap import ImportReport
from gpu_check.policy import PolicyState
from gpu_check.profile import Profile
from gpu_check import results as R


@dataclass(frozen=True)
class Section:
    name: str
    group: str
    data_type: type
    what: str  # one line for --help and the docs


SECTIONS = (
    Section("setup", "models", R.SetupData, "versions, import shim, builds the Qwen2.5-1.5B-shaped and tiny models"),
    Section("sampling_tiny", "models", R.SamplingData, "HFEngine vs transformers generate, tiny model"),
    Section("sampling_qwen", "models", R.SamplingData, "HFEngine vs transformers generate, 1.5B-shaped model"),
    Section("train_step", "policy", R.TrainStepData, "Trainer.train_step on the 1.5B shape, python tool"),
    Section("logprob_match", "policy", R.LogprobData, "sampler μ vs trainer π_old on the same tokens"),
    Section("masks_spans", "policy", R.MasksData, "mask/span invariants, prompt re-rendered (Qwen2.5 tokenizer)"),
    Section("update", "policy", R.UpdateData, "GRPO update time per token, grad checkpointing on/off, peak memory"),
    Section("arithmetic", "arithmetic", R.ArithmeticData, "the arithmetic example, N GRPO steps, accuracy before/after"),
)
GROUPS = tuple(dict.fromkeys(s.group for s in SECTIONS))
R.DATA_TYPES.update({s.name: s.data_type for s in SECTIONS})


@dataclass
class ChildContext:
    """What the sections of one child process share."""

    profile: Profile
    work: Path
    imports: ImportReport
    policy: PolicyState = field(default_factory=PolicyState)

    @staticmethod
    def log(*args) -> None:
        print(*args, flush=True)


def _needs_trainer(ctx: ChildContext):
    if ctx.policy.trainer is None:
        raise RuntimeError("needs the trainer that train_step builds, and train_step did not build it")
    return ctx.policy.trainer


def _setup(ctx: ChildContext):
    from gpu_check.models import run_setup

    return run_setup(ctx.profile, ctx.work, ctx.imports)


def _sampling(which: str) -> Callable[[ChildContext], R.SamplingData]:
    def run(ctx: ChildContext) -> R.SamplingData:
        from agentrl import ensure_tiny_model
        from gpu_check.models import qwen_dir
        from gpu_check.sampling import run_sampling

        if which == "tiny":
            return run_sampling(ctx.profile, str(ensure_tiny_model()), "tiny")
        path = qwen_dir(ctx.work)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} holds no model: the setup section did not build it")
        return run_sampling(ctx.profile, str(path), "qwen2.5-1.5b-shaped")

    return run


def _train_step(ctx: ChildContext):
    from gpu_check.models import qwen_dir
    from gpu_check.policy import run_train_step

    return run_train_step(ctx.profile, ctx.work, qwen_dir(ctx.work), ctx.policy, ctx.log)


def _logprob_match(ctx: ChildContext):
    from gpu_check.checks import logprob_match

    _needs_trainer(ctx)
    return logprob_match(ctx.policy.free, ctx.profile.dtype, ctx.profile.logprob_tolerance)


def _masks_spans(ctx: ChildContext):
    from gpu_check.checks import masks_spans

    trainer = _needs_trainer(ctx)
    return masks_spans(ctx.policy.free + ctx.policy.scripted, trainer.chat, trainer.tokenizer,
                       trainer.toolbox.schemas() or None)


def _update(ctx: ChildContext):
    from gpu_check.update_timing import run_update

    return run_update(ctx.profile, _needs_trainer(ctx), first_step=3)  # train_step ran steps 1 and 2


def _arithmetic(ctx: ChildContext):
    from gpu_check.arithmetic import run_arithmetic

    return run_arithmetic(ctx.profile, ctx.work, ctx.log)


RUNNERS: dict[str, Callable[[ChildContext], object]] = {
    "setup": _setup, "sampling_tiny": _sampling("tiny"), "sampling_qwen": _sampling("qwen"),
    "train_step": _train_step, "logprob_match": _logprob_match, "masks_spans": _masks_spans,
    "update": _update, "arithmetic": _arithmetic,
}


def run_section(section: Section, ctx: ChildContext) -> R.SectionResult:
    """Time one section, catch its failure, and judge its figures (``problems()``)."""
    budget = ctx.profile.budgets[section.name]
    print(f"=== {section.name} (budget {budget:.0f} s)", flush=True)
    t0 = time.perf_counter()
    try:
        data = RUNNERS[section.name](ctx)
    except Exception as e:  # noqa: BLE001 - the point: record it and go on
        tb = traceback.format_exc()
        print(tb, flush=True)
        return R.SectionResult(section.name, "failed", time.perf_counter() - t0, budget,
                               error=f"{type(e).__name__}: {e}"[:2000], traceback=tb[-4000:])
    seconds = time.perf_counter() - t0
    problems = data.problems()
    notes = [f"over budget: {seconds:.1f} s > {budget:.0f} s"] if seconds > budget else []
    return R.SectionResult(section.name, "check_failed" if problems else "ok", seconds, budget,
                           error="; ".join(problems) or None, notes=notes, data=data)


def run_group(group: str, ctx: ChildContext, part: Path, only: set[str]) -> None:
    """Run the group's sections in order, rewriting ``part`` (JSON) after each."""
    import json

    done: list[R.SectionResult] = []
    for section in SECTIONS:
        if section.group != group or (only and section.name not in only):
            continue
        result = run_section(section, ctx)
        if section.name == "setup":
            result.notes += ctx.imports.notes
        done.append(result)
        part.write_text(json.dumps([asdict(r) for r in done], indent=1))
        gc.collect()
        _empty_cuda_cache()


def _empty_cuda_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
