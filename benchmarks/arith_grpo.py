"""The arithmetic example's acceptance figures: seeds, control run, wall clock.

Runs the given config (default ``examples/arithmetic_tiny.yaml``) once per seed (run, env
and warm-start seed together) and once with the tool removed (``env.args.use_tool=false``,
same budget), then prints held-out greedy accuracy before/after, the eval curve, the
first/last share of groups with signal and the seconds of each run (warm start included
when it was not cached; pass ``--cold`` to time it with an empty cache).

    python benchmarks/arith_grpo.py --seeds 0 1 2 --out /tmp/arith-accept
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def summarize(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "reward/mean" in r]
    fams = {k.split("/")[-1]: (evals[0][k], evals[-1][k]) for k in evals[-1] if k.startswith("eval/accuracy/")}
    return {
        "before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"],
        "curve": [(r["step"], r["eval/accuracy"]) for r in evals],
        "families": fams,
        "signal_first_last": (train[0].get("groups/with_signal"), train[-1].get("groups/with_signal")) if train else None,
        "tool_calls_first_last": (train[0].get("tools/calls_per_traj"), train[-1].get("tools/calls_per_traj"))
        if train else None,
        "steps": train[-1]["step"] if train else 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", nargs="?", default="examples/arithmetic_tiny.yaml")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument("--cold", action="store_true", help="empty model/warm-start cache for every run")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", default=[], help="extra key=value config overrides")
    args = ap.parse_args()

    from agentrl import load_config, train

    out = Path(args.out or tempfile.mkdtemp(prefix="arith-grpo-"))
    runs = [(f"seed{s}", [f"seed={s}", f"env.args.seed={s}", f"warmstart.seed={s}"]) for s in args.seeds]
    if not args.no_control:
        runs.append(("control", [f"seed={args.seeds[0]}", f"env.args.seed={args.seeds[0]}",
                                 f"warmstart.seed={args.seeds[0]}", "env.args.use_tool=false"]))
    table = {}
    for name, overrides in runs:
        if args.cold:
            os.environ["AGENTRL_CACHE"] = str(out / f"cache-{name}")
        cfg = load_config(args.config, [*overrides, *args.overrides, f"output_dir={out / name}"])
        t0 = time.perf_counter()
        train(cfg)
        row = summarize(out / name)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        table[name] = row
        print(f"{name}: before {row['before']:.3f} after {row['after']:.3f} in {row['seconds']}s "
              f"({row['steps']} steps) curve {row['curve']}", flush=True)
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
