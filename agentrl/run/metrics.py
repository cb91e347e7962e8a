"""Run metrics: one JSONL line per step, TensorBoard scalars, and a PNG of the curves."""

from __future__ import annotations

import json
import math
from pathlib import Path

from agentrl.jsonl import MetricLine, scan_metrics  # noqa: F401  (the reader of metrics.jsonl)


class MetricsWriter:
    """Appends ``{"step": s, ...}`` lines to ``metrics.jsonl`` and mirrors them to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard is a core dependency; tolerate its absence anyway
                self._tb = None

    def log(self, step: int, values: dict[str, float]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in values.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(path: Path) -> list[dict]:
    """Every complete, valid row of a metrics file (a line cut by a kill is skipped)."""
    return [m.row for m in scan_metrics(path) if m.row is not None] if path.exists() else []


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep only valid lines with ``step <= last_step`` (resume after a crash)."""
    if not path.exists():
        return
    keep = [r for r in read_metrics(path) if r.get("step", 0) <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    tmp.replace(path)


def plot_curves(metrics_path: Path, out_png: Path, title: str = "") -> Path | None:
    """Reward (train) and held-out accuracy against step, as one PNG (None without matplotlib:
    the plot is a view of metrics.jsonl, never a reason for a run to fail)."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    tr = [(r["step"], r["reward/mean"]) for r in rows if r.get("reward/mean") is not None]
    sig = [(r["step"], 1 - r["groups/zero_variance_frac"]) for r in rows
           if r.get("groups/zero_variance_frac") is not None]
    ev = [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    if tr:
        ax[0].plot(*zip(*tr), label="train reward (mean)", color="tab:blue")
    if sig:
        ax[0].plot(*zip(*sig), label="groups with signal", color="tab:gray", alpha=0.6, lw=1)
    ax[0].set_xlabel("step")
    ax[0].set_ylim(-0.02, 1.02)
    ax[0].legend(loc="lower right", fontsize=8)
    ax[0].set_title("training")
    if ev:
        ax[1].plot(*zip(*ev), marker="o", color="tab:green", label="held-out accuracy")
        fams = sorted({k for r in rows for k in r if k.startswith("eval/accuracy/")})
        for k in fams:
            pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
            ax[1].plot(*zip(*pts), lw=0.8, alpha=0.6, label=k.split("/", 2)[2])
    ax[1].set_xlabel("step")
    ax[1].set_ylim(-0.02, 1.02)
    ax[1].legend(loc="lower right", fontsize=7)
    ax[1].set_title("evaluation (greedy)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
