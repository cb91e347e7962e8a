"""What packing the bf16 sampler's weights for oneDNN buys on a decode step's matrix products.

A decode step runs each of SmolLM2's 30 layers' projections once, on weights streamed from
memory (they do not stay in cache between steps). ``F.linear`` on a plain bf16 [N, K] matrix
has oneDNN reorder it into its blocked layout at every call; ``agentrl/engines/projection.py``
packs it once per weight version (``torch.ops.mkldnn._reorder_linear_weight``) and calls
``torch.ops.mkldnn._linear_pointwise``. This times both over 30 distinct matrices of each of
SmolLM2's projection shapes (the fused q/k/v and gate/up included), at 1, 8 and 48 rows, and
checks the two give the same bits.

    python benchmarks/packed_linear.py            # ~1 min, 2 threads
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import _best_seconds  # noqa: E402

SHAPES = {  # name -> (K, N, matrices a step)
    "q/k/v fused, 576 -> 960": (576, 960, 30),
    "o, 576 -> 576": (576, 576, 30),
    "gate/up fused, 576 -> 3072": (576, 3072, 30),
    "down, 1536 -> 576": (1536, 576, 30),
    "LM head, 576 -> 49152": (576, 49152, 1),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from agentrl.engines.projection import PACK_ROWS_HINT, packing_works

    if not packing_works(torch.bfloat16):
        raise SystemExit("oneDNN does not run packed bfloat16 products on this CPU or build: nothing to compare")
    print(f"| shape (x matrices a step) | rows | F.linear ms | packed ms | speed-up | packed GB/s | same bits |")
    print("|---|---|---|---|---|---|---|")
    for name, (k, n, count) in SHAPES.items():
        weights = [torch.randn(n, k).bfloat16() for _ in range(count)]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT) for w in weights]
        for rows in (1, 8, 48):
            x = torch.randn(rows, k).bfloat16()
            plain = 1000 * _best_seconds(lambda: [F.linear(x, w) for w in weights])
            fast = 1000 * _best_seconds(
                lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in packed])
            same = torch.equal(torch.ops.mkldnn._linear_pointwise(x, packed[0], None, "none", [], ""),
                               F.linear(x, weights[0]))
            gbs = count * n * k * 2 / fast / 1e6
            print(f"| {name} (x{count}) | {rows} | {plain:.2f} | {fast:.2f} | {plain / fast:.2f}x | {gbs:.1f} | {same} |")


if __name__ == "__main__":
    main()
