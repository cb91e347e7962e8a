"""Where the trajectories of an ``inspect`` PATH live: a run directory, a file, or a folder.

A run directory (written by the trainer) holds ``config.yaml``, ``metrics.jsonl`` and
``rollouts/step_000001.jsonl`` ...; a plain folder holds rollout ``*.jsonl`` files; a
single ``.jsonl`` file is read as is. Files are ordered by the step number in their
name (``step_000012.jsonl`` -> 12), then by name. The trainer writes its held-out
evaluation next to the training rollouts as ``eval_step_000010.jsonl`` (evaluated after
training step 10; never trained on): a file whose name starts with ``eval`` is an
evaluation file, labelled ``eval @ step 10``.

Example::

    import tempfile, pathlib
    d = pathlib.Path(tempfile.mkdtemp())
    (d / "rollouts").mkdir()
    (d / "rollouts" / "step_000002.jsonl").write_text("")
    (d / "rollouts" / "step_000001.jsonl").write_text("")
    (d / "rollouts" / "eval_step_000002.jsonl").write_text("")
    src = find_sources(str(d))
    assert [f.step for f in src.files] == [1, 2, 2] and src.is_run_dir
    assert [f.label for f in src.files] == ["step 1", "step 2", "eval @ step 2"]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_STEP_RE = re.compile(r"step[_-]?0*(\d+)")
_NOT_ROLLOUTS = {"metrics.jsonl", "eval.jsonl"}


class InspectError(Exception):
    """A user-causable problem with one clear message naming the fix."""


@dataclass(frozen=True)
class RolloutFile:
    """One JSONL file of trajectories and the training step it belongs to (if named)."""

    path: Path
    step: int | None

    @property
    def evaluation(self) -> bool:
        """Held-out evaluation rollouts (``eval_step_*.jsonl``): sampled, scored, never trained."""
        return is_eval_file(self.path)

    @property
    def label(self) -> str:
        if self.step is None:
            return self.path.name
        return f"eval @ step {self.step}" if self.evaluation else f"step {self.step}"


@dataclass(frozen=True)
class Sources:
    """Everything ``inspect`` reads for one PATH."""

    root: Path
    files: list[RolloutFile]
    metrics: Path | None  # metrics.jsonl of a run directory
    config: Path | None  # config.yaml of a run directory

    @property
    def is_run_dir(self) -> bool:
        return self.metrics is not None or self.config is not None or (self.root / "rollouts").is_dir()


def step_of(path: Path) -> int | None:
    """Training step encoded in a rollout file name, e.g. ``step_000012.jsonl`` -> 12."""
    m = _STEP_RE.search(path.stem)
    return int(m.group(1)) if m else None


def is_eval_file(path: Path) -> bool:
    """``eval_step_000010.jsonl`` (the trainer's evaluation rollouts) and other ``eval*`` files."""
    return path.name.lower().startswith("eval")


def _rollout_files(folder: Path) -> list[RolloutFile]:
    found = [p for p in folder.glob("*.jsonl") if p.name not in _NOT_ROLLOUTS and p.is_file()]
    files = [RolloutFile(p, step_of(p)) for p in found]
    # Unnumbered files sort after numbered ones, by name; at one step the training file comes
    # first (the trainer evaluates after the step's update).
    return sorted(files, key=lambda f: (f.step is None, f.step or 0, f.evaluation, f.path.name))


def find_sources(path: str) -> Sources:
    """Resolve PATH into rollout files (+ metrics and config for a run directory)."""
    root = Path(path)
    if not root.exists():
        raise InspectError(f"{path}: no such file or directory; pass a run directory or a rollouts .jsonl file")
    if root.is_file():
        return Sources(root=root.parent, files=[RolloutFile(root, step_of(root))], metrics=None, config=None)
    metrics = root / "metrics.jsonl"
    config = root / "config.yaml"
    rollouts = root / "rollouts"
    files = _rollout_files(rollouts if rollouts.is_dir() else root)
    src = Sources(
        root=root,
        files=files,
        metrics=metrics if metrics.is_file() else None,
        config=config if config.is_file() else None,
    )
    if not files and not src.is_run_dir:
        raise InspectError(
            f"{path}: no rollout files found; expected {path}/rollouts/step_*.jsonl "
            f"(a run directory) or *.jsonl files in {path}"
        )
    return src
