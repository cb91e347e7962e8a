"""The limits of this machine, measured: matmul FLOP/s (float32, bfloat16) and memory bandwidth.

A roofline needs two ceilings, taken here rather than from a datasheet:

- **compute**: ``torch.matmul`` of [M, K] x [K, N] at the shapes a SmolLM2-135M step runs
  (hidden 576, MLP 1536, vocabulary 49152): decode (M = the rows in flight, 8-48), prefill and
  the update (M = 2048 tokens), on 1 and 2 threads, float32 and bfloat16. GFLOP/s = 2 M K N / s.
  Two shapes are also timed as ``F.linear`` with an [N, K] weight, as ``nn.Linear`` stores it:
  on oneDNN that layout is reordered at every call (the bf16 sampler packs it once instead,
  ``agentrl/engines/projection.py``; the trainer's forward pays it).
- **memory**: the bandwidth of reading a 512 MB tensor (``sum``) and of copying it
  (``copy_``, read + write), in GB/s; a decode step that reads every weight once is bound by it.

    python benchmarks/roofline.py            # ~1-2 min
    python benchmarks/roofline.py --json /tmp/roofline.json
    python benchmarks/roofline.py --decode smollm2 --threads 2   # + the HF engine's decode step

``--decode MODEL`` also times the HF engine's decode step (``FastDecoder.step``, 2 threads) with
1, 8 and 48 rows in flight over a 200-token context, on the model's float32 weights and on the
bfloat16 copies of ``model.sampler_dtype: bfloat16``: ms per step, against the bandwidth bound
(every weight read once per step) and the compute bound (2 x parameters FLOPs per row, at the
decode-shape matmul rates measured above).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

HIDDEN, MLP, VOCAB = 576, 1536, 49152  # SmolLM2-135M
SHAPES = {  # name -> (M, K, N)
    "decode 8 rows, MLP up": (8, HIDDEN, MLP),
    "decode 48 rows, MLP up": (48, HIDDEN, MLP),
    "decode 48 rows, LM head": (48, HIDDEN, VOCAB),
    "prefill/update 2048 tokens, MLP up": (2048, HIDDEN, MLP),
    "prefill/update 2048 tokens, attention proj": (2048, HIDDEN, HIDDEN),
    "update 2048 tokens, LM head": (2048, HIDDEN, VOCAB),
}

LINEAR_LAYOUT = ("decode 48 rows, MLP up", "prefill/update 2048 tokens, MLP up")  # also timed as F.linear


def _best_seconds(fn, min_time: float = 0.3, repeats: int = 5) -> float:
    """The fastest of ``repeats`` timings, each over enough calls to last ``min_time``."""
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time / repeats:
            break
        n *= 2
    best = t / n
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    s = _best_seconds(lambda: torch.matmul(a, b))
    return 2 * m * k * n / s / 1e9


def linear_gflops(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    """``F.linear`` with the weight as ``nn.Linear`` stores it, [N, K]: the layout the trainer's
    forward runs (the product reads it transposed; ``matmul_gflops`` reads a [K, N] matrix)."""
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    s = _best_seconds(lambda: torch.nn.functional.linear(x, w))
    return 2 * m * k * n / s / 1e9


def bandwidth_gbs(mb: int = 512) -> tuple[float, float]:
    """(read GB/s by a sum, copy GB/s counting read + write) over an ``mb``-MB float32 tensor."""
    x = torch.ones(mb * 1024 * 1024 // 4)
    y = torch.empty_like(x)
    read = _best_seconds(lambda: x.sum())
    copy = _best_seconds(lambda: y.copy_(x))
    nbytes = x.numel() * 4
    return nbytes / read / 1e9, 2 * nbytes / copy / 1e9


def decode_ms(model, rows: int, dtype: torch.dtype | None, context: int = 200, steps: int = 16) -> float:
    """Median ms of one FastDecoder step of ``model`` with ``rows`` rows over ``context`` tokens."""
    from agentrl.engines.decode import FastDecoder
    from agentrl.engines.sampler_dtype import CastWeights

    dec = FastDecoder(model, None, CastWeights(dtype))
    prompts = [[(7 * r + 3 * i) % 1000 + 10 for i in range(context)] for r in range(rows)]
    times = []
    with torch.inference_mode():
        dec.prefill(prompts, steps + 1)
        tok = torch.full((rows,), 42)
        for _ in range(steps):
            t0 = time.perf_counter()
            dec.step(tok)
            times.append(time.perf_counter() - t0)
    dec.release()
    return 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--json")
    ap.add_argument("--decode", metavar="MODEL", help="also time the decode step of this model (smollm2, a directory)")
    args = ap.parse_args()
    out: dict[str, dict] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        row: dict[str, float] = {}
        for name, (m, k, n) in SHAPES.items():
            for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
                row[f"{name} {tag}"] = matmul_gflops(m, k, n, dtype)
                if name in LINEAR_LAYOUT:
                    row[f"{name} {tag}, F.linear [N, K] weight"] = linear_gflops(m, k, n, dtype)
        row["read GB/s"], row["copy GB/s"] = bandwidth_gbs()
        out[f"{threads} thread(s)"] = row
    names = list(next(iter(out.values())))
    print("| measurement | " + " | ".join(out) + " |")
    print("|---|" + "---|" * len(out))
    for name in names:
        unit = "" if "GB/s" in name else " GFLOP/s"
        print(f"| {name}{unit} | " + " | ".join(f"{out[c][name]:.1f}" for c in out) + " |")
    if args.decode:
        from agentrl.engines.hf import HFEngine
        from agentrl.run.build import resolve_model_path
        from agentrl.run.config import Config, ModelConfig

        model = HFEngine.from_pretrained(resolve_model_path(Config(model=ModelConfig(path=args.decode)))).model
        out["decode ms"] = {}
        print("| rows in flight | float32 ms/step | bfloat16 ms/step | speed-up |")
        print("|---|---|---|---|")
        for rows in (1, 8, 48):
            f32, b16 = decode_ms(model, rows, None), decode_ms(model, rows, torch.bfloat16)
            out["decode ms"][str(rows)] = {"fp32": f32, "bf16": b16}
            print(f"| {rows} | {f32:.1f} | {b16:.1f} | {f32 / b16:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
