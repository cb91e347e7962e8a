"""Sampling speed on the offline tiny model: HFEngine's fast decoder vs the stock paths.

Prints tokens/s and milliseconds per decode step (wall time of the whole call divided by the
number of steps, prefill included) for a batch of ragged chat prompts, for:

- ``engine/fast``   HFEngine with the hand-written Qwen2 decoder (the default for this model)
- ``engine/stock``  HFEngine driving the model's own forward with a DynamicCache (the fallback)
- ``hf.generate``   transformers ``model.generate`` on the left-padded batch

and for each torch thread count asked for. Every row runs the full ``--new`` tokens (no stop
tokens) so the paths do the same work.

    python benchmarks/engine.py                    # batch 64, 128 new tokens, 1 and 2 threads
    python benchmarks/engine.py --group 8          # GRPO-like: 8 prompts x 8 samples
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass

import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder, StockDecoder
from agentrl.engines.hf import HFEngine
from agentrl.models.tiny import ensure_tiny_model


@dataclass
class Result:
    path: str
    threads: int
    seconds: float
    tokens: int
    steps: int

    def line(self) -> str:
        return (f"{self.path:<14} threads={self.threads}  {self.tokens / self.seconds:9.0f} tok/s  "
                f"{1000 * self.seconds / self.steps:7.2f} ms/step  ({self.seconds:.2f} s)")


def make_prompts(tokenizer, batch: int, group: int) -> list[list[int]]:
    questions = [f"What is {17 * i + 3} * {i % 13 + 2}? Think step by step, then use the python tool."
                 + " Please be careful." * (i % 5) for i in range(max(1, batch // group))]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             return_dict=False) for q in questions]
    return [prompts[i // group] for i in range(batch)]


def time_engine(engine: HFEngine, prompts, new: int, repeats: int) -> float:
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
    engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        best = min(best, time.perf_counter() - start)
        assert all(len(g.token_ids) == new for g in out)
    return best


def time_hf_generate(model, prompts, new: int, repeats: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cfg = copy.deepcopy(model.generation_config)
    cfg.eos_token_id = None
    best = float("inf")
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, generation_config=cfg)
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=True, top_p=1.0,
                                 top_k=0, generation_config=cfg)
            best = min(best, time.perf_counter() - start)
            assert out.shape[1] == width + new
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=128, help="new tokens per row")
    ap.add_argument("--group", type=int, default=1, help="rows sharing one prompt (GRPO group size)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--paths", default="fast,stock,generate")
    args = ap.parse_args()

    engine = HFEngine.from_pretrained(ensure_tiny_model())
    prompts = make_prompts(engine.tokenizer, args.batch, args.group)
    lengths = sorted(len(p) for p in prompts)
    print(f"tiny model, batch {args.batch}, prompt lengths {lengths[0]}..{lengths[-1]}, "
          f"{args.new} new tokens per row, group {args.group}")
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for path in args.paths.split(","):
            engine.num_threads = threads  # the engine sets (and restores) threads per call
            if path == "fast":
                engine._decoder = FastDecoder(engine.model)
                seconds = time_engine(engine, prompts, args.new, args.repeats)
                name = "engine/fast"
            elif path == "stock":
                engine._decoder = StockDecoder(engine.model)
                seconds = time_engine(engine, prompts, args.new, args.repeats)
                name = "engine/stock"
            else:
                seconds = time_hf_generate(engine.model, prompts, args.new, args.repeats)
                name = "hf.generate"
            results.append(Result(name, threads, seconds, args.batch * args.new, args.new))
            print(results[-1].line(), flush=True)
    fast = {r.threads: r.seconds for r in results if r.path == "engine/fast"}
    for r in results:
        if r.path != "engine/fast" and r.threads in fast:
            print(f"engine/fast is {r.seconds / fast[r.threads]:.1f}x faster than {r.path} at {r.threads} thread(s)")


if __name__ == "__main__":
    main()
