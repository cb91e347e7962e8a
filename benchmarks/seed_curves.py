"""Several runs of one config (seeds) on one figure, and the table docs/results.md quotes.

    python benchmarks/seed_curves.py runs/rg_seed0 runs/rg_seed1 runs/rg_seed2 \
        --plot docs/smollm2_reasoning_gym_curves.png --title "SmolLM2-135M on reasoning-gym chain_sum"

Prints, per run: held-out accuracy at every evaluation, the first evaluation reaching double
the first one and +0.2 absolute (the bar of issue 31), the training loop's and the run's wall
time (the sum of metrics.jsonl's ``time/step``; the run's wall time from its config.yaml, written
once the model is loaded, to its last metrics line), and the peak memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentrl.run.metrics import read_metrics


def summary(run: Path) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    evals = [(int(r["step"]), float(r["eval/accuracy"])) for r in rows if r.get("eval/accuracy") is not None]
    steps = [r for r in rows if r.get("reward/mean") is not None]
    first = evals[0][1] if evals else None
    bar = next((s for s, a in evals[1:] if first is not None and a >= 2 * first and a >= first + 0.2), None)
    loop_s = sum(r.get("time/step", 0.0) for r in steps)
    files = [run / "config.yaml", run / "metrics.jsonl"]
    wall_s = files[1].stat().st_mtime - files[0].stat().st_mtime if all(f.exists() for f in files) else None
    peak = max((r.get("memory/peak_gb") or 0.0 for r in steps), default=0.0)
    return {"run": run.name, "evals": evals, "bar_step": bar, "loop_min": loop_s / 60,
            "wall_min": None if wall_s is None else wall_s / 60, "peak_gb": peak, "rows": rows}


def plot(runs: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, s in enumerate(runs):
        color = f"C{i}"
        tr = [(r["step"], r["reward/mean"]) for r in s["rows"] if r.get("reward/mean") is not None]
        if tr:
            ax[0].plot(*zip(*tr), color=color, label=s["run"])
        if s["evals"]:
            ax[1].plot(*zip(*s["evals"]), marker="o", color=color, label=s["run"])
    for a, name in zip(ax, ("training reward (mean)", "held-out accuracy (greedy)")):
        a.set_xlabel("step")
        a.set_ylim(-0.02, 1.02)
        a.set_title(name)
        a.legend(loc="lower right", fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    runs = [summary(r) for r in args.runs]
    print("| run | held-out accuracy by step | doubles and +0.2 at | training loop | run, wall | peak memory |")
    print("|---|---|---|---|---|---|")
    for s in runs:
        ev = ", ".join(f"{a:.3f} ({st})" for st, a in s["evals"])
        wall = "-" if s["wall_min"] is None else f"{s['wall_min']:.1f} min"
        print(f"| {s['run']} | {ev} | {'step ' + str(s['bar_step']) if s['bar_step'] is not None else 'not reached'} "
              f"| {s['loop_min']:.1f} min | {wall} | {s['peak_gb']:.2f} GB |")
    if args.plot:
        plot(runs, args.plot, args.title)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
