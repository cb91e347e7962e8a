"""The surrogates of ``algo.loss`` on the CPU example: steps to held-out accuracy >= 0.9, the
final accuracy and the training reward, per surrogate and seed.

Each run is ``agentrl train CONFIG algo.loss=L seed=S [overrides]`` in a fresh interpreter. With
the example's one optimizer step per batch (``train.num_iterations=1``) π_θ = π_old in the
update, so every ratio is 1: ``clip``, ``gspo``, ``gspo_token`` and ``sapo`` then have the same
gradient (the plain policy gradient, sequence-mean token-mean), and only ``cispo`` (token-mean)
differs (it runs with the paper's ``algo.agg=token-mean``). ``train.num_iterations=4`` lets the
ratios move, where the surrogates part.

    python benchmarks/surrogates.py --seeds 0 1 2                            # the example as is
    python benchmarks/surrogates.py --seeds 0 train.num_iterations=4         # off-policy passes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ("clip", "gspo", "gspo_token", "cispo", "sapo")
# each surrogate as its paper aggregates it (the others keep GRPO's seq-mean-token-mean)
PAPER_SETTINGS = {"cispo": ["algo.agg=token-mean"]}


def run(config: str, loss: str, seed: int, out: Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "agentrl", "train", config, f"output_dir={out}", f"seed={seed}", f"algo.loss={loss}",
           *PAPER_SETTINGS.get(loss, []), *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def summarize(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = {int(r["step"]): r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    return {"to0.9": next((s for s, a in sorted(evals.items()) if a >= 0.9), math.nan),
            "acc@5": evals.get(5, math.nan), "final": evals[max(evals)],
            "reward@21-30": sum(rewards[20:30]) / max(1, len(rewards[20:30])),
            "clip_frac": sum(r.get("clip_frac", 0.0) for r in rows if "loss" in r) / max(1, len(rewards))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/arithmetic_tiny.yaml")
    ap.add_argument("--losses", nargs="+", default=list(LOSSES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("extra", nargs="*", help="more config overrides for every run")
    args = ap.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="surrogates_"))
    results = {}
    for seed in args.seeds:  # seed-major: load from other processes hits every surrogate alike
        for loss in args.losses:
            out = base / f"{loss}_seed{seed}"
            wall = run(args.config, loss, seed, out, args.extra) if not (out / "metrics.jsonl").exists() else math.nan
            results[(loss, seed)] = {**summarize(out), "wall_s": wall}
            print(f"{loss} seed {seed}: {json.dumps(results[(loss, seed)])}", flush=True)
    cols = ["to0.9", "acc@5", "final", "reward@21-30", "clip_frac", "wall_s"]
    print("\n| algo.loss | seed | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 2))
    for (loss, seed), r in sorted(results.items()):
        print(f"| {loss} | {seed} | " + " | ".join("—" if isinstance(r[c], float) and math.isnan(r[c])
                                                   else f"{r[c]:.3g}" for c in cols) + " |")
    print(f"\nruns in {base}")


if __name__ == "__main__":
    main()
