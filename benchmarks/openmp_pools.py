"""Why a per-attempt rollout is served on the calling thread (``run_hosted``, engines/driver.py).

torch's libgomp gives every thread that runs OpenMP parallel regions a worker pool of its own.
Once the pools' threads outnumber the cores (the trainer's main thread has one; a driver
thread would be a second), libgomp "throttles" its workers: they sleep on a futex between
regions, so each parallel op pays a wake-up. This times the same SmolLM2 decode step (bf16
sampler) on the main thread, on a second thread while the main thread's pool exists, and on
a thread in a process whose main thread never ran a parallel op.

    python benchmarks/openmp_pools.py                # ~1 min; make smollm2 first
    python benchmarks/openmp_pools.py --rows 64 --model tiny
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import decode_ms  # noqa: E402


def step_ms(model, rows: int) -> float:
    """Median ms of one bf16-sampler decode step over a 200-token context, on the calling thread."""
    return decode_ms(model, rows, torch.bfloat16, steps=30)


def on_thread(fn, *args) -> float:
    out = []
    worker = threading.Thread(target=lambda: out.append(fn(*args)))
    worker.start()
    worker.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only-thread", action="store_true", help=argparse.SUPPRESS)  # the fresh process
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agentrl.engines.hf import HFEngine
    from agentrl.run.build import resolve_model_path
    from agentrl.run.config import Config, ModelConfig

    def load():
        return HFEngine.from_pretrained(resolve_model_path(Config(model=ModelConfig(path=args.model)))).model

    if args.only_thread:  # loading runs parallel ops too: on the thread, so the main thread has no pool
        print(f"{on_thread(lambda: step_ms(load(), args.rows)):.1f}")
        return
    model = load()
    main_ms = step_ms(model, args.rows)
    second_ms = on_thread(step_ms, model, args.rows)
    fresh = subprocess.run([sys.executable, __file__, "--model", args.model, "--rows", str(args.rows),
                            "--threads", str(args.threads), "--only-thread"], capture_output=True, text=True)
    fresh_ms = float(fresh.stdout.strip().splitlines()[-1])
    print(f"| where the decode step runs ({args.rows} rows, {args.threads} threads) | ms per step |")
    print("|---|---|")
    print(f"| the main thread | {main_ms:.1f} |")
    print(f"| a second thread, the main thread's pool alive | {second_ms:.1f} |")
    print(f"| a second thread, no pool on the main thread | {fresh_ms:.1f} |")


if __name__ == "__main__":
    main()
