"""Injected infrastructure failures against training: no bias in the advantages, and the CPU
example's curve at 5% and 15% of tool calls failing against 0%, over seeds.

Each run is ``agentrl train CONFIG seed=S rollout.fault_rate=R`` in a fresh interpreter (the
fault-injection harness, docs/design.md "Failures": that share of python calls fails with an
injected infrastructure fault, seeded). From each run:

- ``adv_err``: over every step's rollouts, the largest |recorded advantage − the advantage
  recomputed by ``group_advantages`` from the attempts that ran alone| (groups with fewer than
  2 that ran dropped): 0 means the failures left no trace in any survivor's advantage;
- ``failed/step``, ``excluded/step``: injected failures per step (tries), attempts left out
  after the retries; ``fail%``: failed tries over attempts that called a tool;
- ``acc@5``, ``final``: held-out greedy accuracy; ``to0.9``: first evaluated step at or above
  0.9; ``reward@1-10``, ``reward@21-30``: mean training reward over those steps;
- ``groups_hit``, ``naive|dA|``, ``naive_max``: the share of groups with a standing failure (and
  2 or more survivors), and what scoring those failures 0 instead would have moved their
  survivors' advantages (mean and max |ΔA|).

    python benchmarks/infra_faults.py --seeds 0 1 2 --rates 0 0.05 0.15   # the figures of benchmarks/README.md
    python benchmarks/infra_faults.py --rates 0.15 rollout.infra_retries=0 tools.infra_retries=0  # failures stand
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(config: str, seed: int, rate: float, out: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "agentrl", "train", config, f"output_dir={out}", f"seed={seed}",
           f"rollout.fault_rate={rate}", "rollout.infra_backoff_s=0.1", *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                   stdout=subprocess.DEVNULL)


def advantage_error(run_dir: Path) -> tuple[float, int]:
    """Largest |recorded − recomputed-from-survivors| advantage over all steps; attempts checked."""
    import torch

    from agentrl.algo.grpo import group_advantages
    from agentrl.types import read_jsonl

    worst, checked = 0.0, 0
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        trajs = read_jsonl(str(path))
        ran: dict[str, list] = defaultdict(list)
        for t in trajs:
            if t.failure is None:
                ran[t.group_id].append(t)
        keep = [t for g, ts in ran.items() if len(ts) >= 2 for t in ts]
        if not keep:
            continue
        want = group_advantages(torch.tensor([t.reward for t in keep], dtype=torch.float64),
                                [t.group_id for t in keep]).advantages.tolist()
        for t, a in zip(keep, want):
            worst = max(worst, abs(t.advantage - a))
            checked += 1
        if any(t.advantage is not None for t in trajs if t not in keep):
            raise AssertionError(f"{path}: an excluded attempt has an advantage")
    return worst, checked


def naive_error(run_dir: Path) -> tuple[float, float, float]:
    """What scoring each standing failure as reward 0 (the common practice) would have done to
    the survivors of the groups it hit: mean and max |A_naive − A| over those survivors, and
    the share of groups hit."""
    import torch

    from agentrl.algo.grpo import group_advantages
    from agentrl.types import read_jsonl

    diffs, groups, hit = [], 0, 0
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        by: dict[str, list] = defaultdict(list)
        for t in read_jsonl(str(path)):
            by[t.group_id].append(t)
        for ts in by.values():
            groups += 1
            if not any(t.failure is not None for t in ts) or sum(t.failure is None for t in ts) < 2:
                continue
            hit += 1
            naive = group_advantages(torch.tensor([0.0 if t.failure else t.reward for t in ts], dtype=torch.float64),
                                     ["g"] * len(ts)).advantages.tolist()
            diffs += [abs(a - t.advantage) for t, a in zip(ts, naive) if t.failure is None]
    if not diffs:
        return 0.0, 0.0, 0.0
    return sum(diffs) / len(diffs), max(diffs), hit / max(1, groups)


def summarize(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = {int(r["step"]): r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    steps = [r for r in rows if "infra/failed" in r]
    calls = [r["tools/calls_per_traj"] for r in steps]
    to9 = next((s for s, a in sorted(evals.items()) if a >= 0.9), math.nan)
    err, checked = advantage_error(run_dir)
    naive_mean, naive_max, hit = naive_error(run_dir)
    rewards = [r["reward/mean"] for r in steps]
    return {"reward@1-10": sum(rewards[:10]) / len(rewards[:10]), "reward@21-30": sum(rewards[20:]) / max(1, len(rewards[20:])),
            "naive|dA|": naive_mean, "naive_max": naive_max, "groups_hit": hit,"acc@5": evals.get(5, math.nan), "acc@10": evals.get(10, math.nan), "final": evals[max(evals)],
            "to0.9": to9, "failed/step": sum(r["infra/failed"] for r in steps) / len(steps),
            "excluded/step": sum(r["infra/excluded"] for r in steps) / len(steps),
            "calls/traj": sum(calls) / len(calls), "adv_err": err, "checked": checked}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/arithmetic_tiny.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.05, 0.15])
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("extra", nargs="*", help="more config overrides for every run")
    args = ap.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="infra_faults_"))
    results = {}
    for seed in args.seeds:  # seed-major: load from other processes hits every rate alike
        for rate in args.rates:
            out = base / f"rate{rate:g}_seed{seed}"
            if not (out / "metrics.jsonl").exists():
                run(args.config, seed, rate, out, args.extra)
            results[(rate, seed)] = summarize(out)
            print(f"rate {rate:g} seed {seed}: {json.dumps(results[(rate, seed)])}", flush=True)
    cols = ["acc@5", "final", "to0.9", "reward@1-10", "reward@21-30", "failed/step", "excluded/step", "adv_err",
            "groups_hit", "naive|dA|", "naive_max"]
    print("\n| fault rate | seed | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 2))
    for (rate, seed), r in sorted(results.items()):
        print(f"| {rate:g} | {seed} | " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    print(f"\nruns in {base}")


def _fmt(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "—"
    return f"{x:.3g}" if isinstance(x, float) and x != int(x) else str(int(x)) if float(x).is_integer() else str(x)


if __name__ == "__main__":
    main()
