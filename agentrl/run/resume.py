"""Resuming a run: its saved ``config.yaml`` is the config of the resumed run.

``agentrl train runs/x/config.yaml resume=true`` (what a stopped run prints; ``runs/x`` alone,
or the original CONFIG with the same ``output_dir``, find the same run) continues ``runs/x``
from its last checkpoint with the settings it was started with. The CONFIG file is read only
to find the run; where it differs from the run's settings the run's win, and a line says so.

A resume may change only the keys of :data:`RESUMABLE`, which change neither the objective
nor the data: ``train.steps`` (extend a run, or stop it earlier, never before its last
checkpoint), ``train.checkpoint_every``, ``train.keep_checkpoints``, ``train.log_rollouts``, ``train.tape``,
``train.micro_batch_tokens`` (memory; the same update up to float order) and
``model.num_threads`` (speed), ``alarms.on_alarm`` and ``alarms.disable`` (go on after an
alarm stopped the run). ``resume`` and ``output_dir`` only locate the run. Any other
override that changes a setting stops with one :class:`ConfigError` naming it; start a new
run (another ``output_dir``) to change those. An allowed change is printed, written to the
run's ``config.yaml`` and appended to ``resume.log`` in the run directory.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from agentrl.run.checkpoint import latest_checkpoint, list_checkpoints
from agentrl.run.config import Config, ConfigError, config_to_dict, load_config, parse_overrides

RESUMABLE: dict[str, str] = {
    "train.steps": "the run's length (extend it; not below its last checkpoint)",
    "train.checkpoint_every": "how often checkpoints are written",
    "train.keep_checkpoints": "how many checkpoints are kept",
    "train.log_rollouts": "whether step rollouts are written",
    "train.tape": "whether the step tape (agentrl replay) is written",
    "train.micro_batch_tokens": "memory per forward (the same update up to float order)",
    "train.fused_head": "the LM head's memory and speed (the same update up to float order)",
    "model.num_threads": "CPU threads (speed only)",
    "alarms.on_alarm": "whether an alarm stops the run (go on after alarms.on_alarm=stop)",
    "alarms.disable": "alarms not checked",
}
LOCATING = ("resume", "output_dir")  # find the run; never change what it computes

_MISSING = "<unset>"


def resume_command(run_dir: Path) -> str:
    """The command that resumes ``run_dir`` exactly: its own config.yaml, nothing else."""
    return f"agentrl train {shlex.quote(str(Path(run_dir) / 'config.yaml'))} resume=true"


def resume_hint(run_dir: Path) -> str:
    """What to print when a run stops: the resume command, or that there is nothing to resume."""
    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        return f"no checkpoint in {run_dir} yet: nothing to resume (rerun the same command to start again)"
    return f"resume with: {resume_command(run_dir)}  (last checkpoint: {ckpt.name})"


def run_dir_of(path: str | Path) -> Path | None:
    """The run directory that ``path`` names: the directory itself, or the directory of a
    run's ``config.yaml``; None for a plain config file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.yaml").is_file():
            raise ConfigError(f"{p} is a directory without a config.yaml; pass a YAML config or a run directory")
        return p
    if p.name == "config.yaml" and ((p.parent / "checkpoints").is_dir() or (p.parent / "metrics.jsonl").exists()):
        return p.parent
    return None


def saved_config_path(run_dir: Path) -> Path | None:
    """The run's config.yaml, else (an older run) the one inside its last checkpoint."""
    if (run_dir / "config.yaml").is_file():
        return run_dir / "config.yaml"
    ckpt = latest_checkpoint(run_dir)
    return ckpt / "config.yaml" if ckpt is not None and (ckpt / "config.yaml").is_file() else None


def _same_dir(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def changes(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(key, old, new) of every setting that differs; ``output_dir`` compared as a directory."""
    a, b = _flat(config_to_dict(old)), _flat(config_to_dict(new))
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        x, y = a.get(key, _MISSING), b.get(key, _MISSING)
        if key == "resume" or x == y or (key == "output_dir" and _same_dir(old.run_dir, new.run_dir)):
            continue
        out.append((key, x, y))
    return out


def _allowed() -> str:
    return (f"A resume may change only {', '.join(RESUMABLE)} (and {', '.join(LOCATING)} locate the run); "
            "to change anything else, start a new run with another output_dir")


def _refuse(diffs: list[tuple[str, Any, Any]], saved_path: Path) -> None:
    refused = [(k, x, y) for k, x, y in diffs if k not in RESUMABLE and k not in LOCATING]
    if refused:
        listed = ", ".join(f"{k}={y} (the run has {x})" for k, x, y in refused)
        raise ConfigError(f"resume keeps the run's settings ({saved_path}); refused: {listed}. {_allowed()}")


def _load_saved(path: Path) -> Config:
    try:
        return load_config(path)
    except ConfigError as e:
        raise ConfigError(f"the run's saved config {path} cannot be read: {e}") from None


def load_train_config(path: str | Path, overrides: list[str] | None = None, log=print) -> Config:
    """The config ``agentrl train PATH OVERRIDES`` runs: PATH + overrides, except on a resume
    of a run that has a checkpoint, where it is the run's saved config + overrides (checked
    against :data:`RESUMABLE`). PATH may be a run directory or a run's config.yaml."""
    overrides = list(overrides or [])
    run = run_dir_of(path)
    source = run / "config.yaml" if run is not None else Path(path)
    cfg = load_config(source, overrides)
    if not cfg.resume:
        return cfg
    if run is not None and "output_dir" in parse_overrides(overrides) and not _same_dir(cfg.run_dir, run):
        raise ConfigError(f"{path} is the run {run} but output_dir={cfg.output_dir} names another directory; "
                          "drop output_dir to resume that run")
    run_dir = run if run is not None else cfg.run_dir
    saved_path = saved_config_path(run_dir)
    if saved_path is None or latest_checkpoint(run_dir) is None:
        return cfg  # nothing to resume: the trainer starts fresh and says so
    saved = _load_saved(saved_path)
    resumed = load_config(saved_path, overrides)  # the saved file reads: an error here is an override's
    out_dir = saved.output_dir if _same_dir(saved.run_dir, run_dir) else str(run_dir)
    resumed = dataclasses.replace(resumed, resume=True, output_dir=out_dir)
    _refuse(changes(saved, resumed), saved_path)
    if run is None:  # a plain config file found the run: say which of its settings are not used
        unused = [(k, x, y) for k, x, y in changes(resumed, cfg) if k not in LOCATING]
        if unused:
            listed = ", ".join(f"{k} ({y} there, {x} in the run)" for k, x, y in unused[:6])
            more = f" and {len(unused) - 6} more" if len(unused) > 6 else ""
            hint = " (pass train.steps=N to extend the run)" if any(k == "train.steps" for k, _, _ in unused) else ""
            log(f"resume: the settings of {run_dir} come from {saved_path}; {path} differs in {listed}{more}, "
                f"which stay as the run has them{hint}")
    return resumed


def find_resume_checkpoint(cfg: Config, log, main: bool = True) -> Path | None:
    """The checkpoint a run starts from: the last one of ``cfg.run_dir`` when ``resume=true``,
    after checking ``cfg`` against the run's saved config (only :data:`RESUMABLE` keys may
    differ; each change is logged and, on rank 0, appended to ``resume.log``). Without
    ``resume``, a run directory that holds checkpoints is refused with the resume command."""
    run_dir = cfg.run_dir
    if not cfg.resume:
        if (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
            raise ConfigError(f"{run_dir} already holds checkpoints; resume it with `{resume_command(run_dir)}`, "
                              "or pass output_dir=... for a new run")
        return None
    found = list_checkpoints(run_dir)
    if not found:
        log(f"resume: no checkpoint in {run_dir}; starting fresh")
        return None
    step, ckpt = found[-1]
    saved_path = saved_config_path(run_dir)
    if saved_path is None:
        return ckpt
    diffs = changes(_load_saved(saved_path), cfg)
    _refuse(diffs, saved_path)
    if cfg.train.steps < step:
        raise ConfigError(f"train.steps={cfg.train.steps}: {run_dir} is already at step {step} (its last "
                          f"checkpoint); pass train.steps >= {step}")
    lines = []
    for key, old, new in diffs:
        note = ""
        if key == "train.steps" and cfg.optim.schedule != "constant":
            note = f"; the {cfg.optim.schedule} learning-rate schedule now spans {new} steps"
        lines.append(f"{key}: {old} -> {new}{note}")
    for line in lines:
        log(f"resume: {line} (recorded in {run_dir / 'config.yaml'})")
    if main and lines:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(run_dir / "resume.log", "a", encoding="utf-8") as f:
            f.writelines(f"{stamp} resumed at step {step}: {line}\n" for line in lines)
    return ckpt
