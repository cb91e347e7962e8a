"""The update's time and peak memory against train.micro_batch_tokens, on a recorded step.

Each setting runs in a fresh process: a Trainer built from the run's own config (the
overrides below on top), the step's recorded trajectories (``<run>/rollouts/step_N.jsonl``),
and ``--repeats`` updates on them; reported are the median update time and the update's peak
resident set (agentrl/run/memory.py), beside the process's resident set before the first.

    python benchmarks/update_memory.py runs/smollm2-tir --step 2 --tokens 8192 4096 2048

Settings are interleaved (8192, 4096, 2048, 8192, ...) over ``--rounds`` so that machine
noise falls on all of them; compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(run: Path, step: int, tokens: int, repeats: int, extra: list[str]) -> dict:
    from agentrl.run.config import load_config
    from agentrl.run.memory import MemoryMeter, resident_bytes
    from agentrl.run.trainer import Trainer
    from agentrl.types import read_jsonl

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(run / "config.yaml", [f"output_dir={out}", f"train.micro_batch_tokens={tokens}",
                                                "train.tape=false", *extra])
        trainer = Trainer(cfg, log=lambda *a, **k: None)
        trajs = read_jsonl(str(run / "rollouts" / f"step_{step:06d}.jsonl"))
        meter, times = MemoryMeter(), []
        before = resident_bytes()
        for _ in range(repeats):
            t0 = time.perf_counter()
            with meter.phase("update"):
                trainer.update(trajs)
            times.append(time.perf_counter() - t0)
        trained = sum(sum(t.loss_mask) for t in trajs if t.reward is not None)
        return {"tokens": tokens, "update_s": statistics.median(times), "peak_gb": meter.run_peak / 1e9,
                "before_gb": before / 1e9, "trained_tokens": trained, "attempts": len(trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 4096, 2048])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--override", nargs="*", default=[], help="more config overrides, key=value")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.run, args.step, args.one, args.repeats, args.override)))
        return
    results: dict[int, list[dict]] = {t: [] for t in args.tokens}
    for _ in range(args.rounds):
        for t in args.tokens:
            cmd = [sys.executable, __file__, str(args.run), "--step", str(args.step), "--one", str(t),
                   "--repeats", str(args.repeats), "--override", *args.override]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[t].append(json.loads(out.strip().splitlines()[-1]))
            print(results[t][-1], flush=True)
    base = statistics.median(r["update_s"] for r in results[args.tokens[0]])
    print(f"| train.micro_batch_tokens | update (median) | vs {args.tokens[0]} | update's peak resident memory |")
    print("|---|---|---|---|")
    for t, rs in results.items():
        s = statistics.median(r["update_s"] for r in rs)
        print(f"| {t} | {s:.1f} s | {s / base:.2f}x | {max(r['peak_gb'] for r in rs):.2f} GB |")


if __name__ == "__main__":
    main()
