"""Each phase of a SmolLM2 GRPO step against the ceiling that binds it, measured in one run.

``roofline.py`` measures the machine's ceilings; this times the phases that it leaves out and
sets each beside its ceiling, measured in the same process (2 threads):

- **prefill**: ``FastDecoder.prefill`` of 8 prompts x 200 tokens (bfloat16 copies, as
  ``model.sampler_dtype: bfloat16``): useful work 2 x 106.2M non-embedding parameters per
  token, plus the LM head for the last position of each row; bound: the bf16 matmul rate of
  [1600 x 576] x [576 x 1536];
- **log-prob forward** (π_old, a reference, a teacher: ``score_tokens`` without gradient)
  and **forward + backward** (the update) of one micro-batch of 4 rows x 256 tokens of which
  64 per row are trained, under bf16 autocast, with materialized logits and with
  ``train.fused_head``: useful work 2 (forward) or 6 (forward + backward) x (106.2M x tokens
  + 28.3M x trained tokens); bound: the same matmul rate;
- **optimizer**: ``clip_grad_norm_`` and ``AdamW.step`` on the 134.5M float32 parameters:
  bytes moved, at least 4 B x (read θ, g, m, v; write θ, m, v) = 28 B per parameter (and 4
  B read for the norm); bound: the measured copy bandwidth.

    python benchmarks/phase_roofline.py              # SmolLM2-135M, ~2 min
    python benchmarks/phase_roofline.py --model DIR

Prints a markdown table: ms, achieved GFLOP/s or GB/s, the ceiling, and the fraction.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from roofline import bandwidth_gbs, matmul_gflops


def _median_s(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from agentrl.algo.batching import MicroBatch, score_tokens
    from agentrl.engines.decode import FastDecoder
    from agentrl.engines.hf import HFEngine
    from agentrl.engines.sampler_dtype import CastWeights
    from agentrl.run.build import resolve_model_path
    from agentrl.run.config import Config, ModelConfig

    model = HFEngine.from_pretrained(resolve_model_path(Config(model=ModelConfig(path=args.model)))).model
    n_params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    body = n_params - head  # tied: the embedding table is the head
    V, H = model.get_output_embeddings().weight.shape
    peak = matmul_gflops(1600, H, model.config.intermediate_size, torch.bfloat16)
    _, copy_bw = bandwidth_gbs()
    rows: list[tuple[str, float, str, str]] = []

    # prefill: 8 prompts of 200 tokens on the bf16 copies
    dec = FastDecoder(model, None, CastWeights(torch.bfloat16))
    prompts = [[(7 * r + 3 * i) % 1000 + 10 for i in range(200)] for r in range(8)]

    def prefill():
        with torch.inference_mode():
            dec.prefill(prompts, 2)
        dec.release()

    s = _median_s(prefill)
    work = 2 * (body * 1600 + head * 8) / 1e9
    rows.append(("prefill, 8 x 200 tokens (bf16 sampler)", s, f"{work / s:.0f} GFLOP/s", f"{peak:.0f} GFLOP/s"))

    # the trainer's scoring forward and the update's forward + backward, 4 rows x 256 tokens
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (4, 256), generator=g)
    mask = torch.zeros(4, 256)
    mask[:, -64:] = 1.0
    mb = MicroBatch([0, 1, 2, 3], ids, torch.ones_like(ids), mask, torch.zeros(4, 256))
    tokens, trained = 4 * 256, 4 * 64
    for fused in (False, True):
        tag = "fused head" if fused else "materialized logits"

        def forward():
            with torch.no_grad():
                score_tokens(model, mb, 1.0, "bf16", fused_head=fused)

        def fwd_bwd():
            lp, _ = score_tokens(model, mb, 1.0, "bf16", fused_head=fused)
            (lp * mask).sum().backward()
            model.zero_grad(set_to_none=True)

        s = _median_s(forward)
        work = 2 * (body * tokens + head * trained) / 1e9
        rows.append((f"log-prob forward, 4 x 256 tokens, {tag}", s, f"{work / s:.0f} GFLOP/s", f"{peak:.0f} GFLOP/s"))
        s = _median_s(fwd_bwd)
        rows.append((f"forward + backward, same, {tag}", s, f"{3 * work / s:.0f} GFLOP/s", f"{peak:.0f} GFLOP/s"))

    # the optimizer: clip + AdamW step over every float32 parameter
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
    opt.step()  # allocates the moments

    def step():
        torch.nn.utils.clip_grad_norm_(list(m.parameters()), 1.0)
        opt.step()

    s = _median_s(step)
    nbytes = 32 * n_params / 1e9
    rows.append(("grad clip + AdamW step, all parameters", s, f"{nbytes / s:.1f} GB/s", f"{copy_bw:.1f} GB/s"))

    print(f"| phase ({args.threads} threads) | ms | achieved | ceiling | fraction |")
    print("|---|---|---|---|---|")
    for name, s, got, ceil in rows:
        frac = float(got.split()[0]) / float(ceil.split()[0])
        print(f"| {name} | {1000 * s:.1f} | {got} | {ceil} | {100 * frac:.0f}% |")


if __name__ == "__main__":
    main()
