"""Sampling speed (the offline tiny model, or ``--model smollm2``): HFEngine's fast decoder vs
the stock paths.

Prints tokens/s and milliseconds per decode step (best wall time of the whole call, over
round-robin repeats, divided by the number of steps, prefill included) for a batch of ragged
chat prompts, for:

- ``engine/fast``   HFEngine with the hand-written Qwen2 decoder (the default for this model)
- ``engine/stock``  HFEngine driving the model's own forward with a DynamicCache (the fallback)
- ``hf.generate``   transformers ``model.generate`` on the left-padded batch
- ``vllm``          VLLMEngine on the same model and prompts (``--paths fast,generate,vllm``, in
  a venv with vLLM; float32, one engine per process)

and for each torch thread count asked for. Every row runs the full ``--new`` tokens (no stop
tokens) so the paths do the same work.

    python benchmarks/engine.py                    # batch 64, 128 new tokens, 1 and 2 threads
    python benchmarks/engine.py --group 8          # GRPO-like: 8 prompts x 8 samples
    python benchmarks/engine.py --model smollm2 --batch 16 --new 64 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass

import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder
from agentrl.engines.stock_decoder import StockDecoder
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


def engine_run(engine: HFEngine, decoder, prompts, new: int):
    """A timed-call closure for HFEngine driving ``decoder``."""
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)

    def run() -> float:
        engine._decoder = decoder
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        assert all(len(g.token_ids) == new for g in out)
        return time.perf_counter() - start

    return run


def hf_generate_run(model, prompts, new: int):
    """A timed-call closure for transformers' ``generate`` on the left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cfg = copy.deepcopy(model.generation_config)
    cfg.update(eos_token_id=None, do_sample=True, top_p=1.0, top_k=0, max_new_tokens=new)

    def run() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, generation_config=cfg)
            seconds = time.perf_counter() - start
        assert out.shape[1] == width + new
        return seconds

    return run


_VLLM = {}


def vllm_run(path: str, engine: HFEngine, prompts, new: int, threads: int):
    """A timed-call closure for VLLMEngine (built once per process) on the same prompts."""
    from agentrl.engines.vllm import VLLMEngine

    if "engine" not in _VLLM:
        _VLLM["engine"] = VLLMEngine(path, engine.tokenizer, model=engine.model, seed=0, dtype="float32",
                                     num_threads=threads, max_model_len=2048, kv_cache_memory_bytes=1 << 30)
    vllm = _VLLM["engine"]
    vllm.num_threads = threads
    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)

    def run() -> float:
        start = time.perf_counter()
        out = vllm.generate(prompts, params)
        assert all(len(g.token_ids) == new for g in out)
        return time.perf_counter() - start

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=128, help="new tokens per row")
    ap.add_argument("--group", type=int, default=1, help="rows sharing one prompt (GRPO group size)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--paths", default="fast,stock,generate")
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, a .gguf file or an HF directory")
    args = ap.parse_args()

    if args.model == "tiny":
        path = str(ensure_tiny_model())
    else:
        from agentrl.run.build import resolve_model_path
        from agentrl.run.config import Config, ModelConfig

        path = resolve_model_path(Config(model=ModelConfig(path=args.model)))
    engine = HFEngine.from_pretrained(path)
    prompts = make_prompts(engine.tokenizer, args.batch, args.group)
    lengths = sorted(len(p) for p in prompts)
    print(f"{args.model} model, batch {args.batch}, prompt lengths {lengths[0]}..{lengths[-1]}, "
          f"{args.new} new tokens per row, group {args.group}")
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        engine.num_threads = threads  # the engine sets (and restores) threads per call
        runs = {}
        for which in args.paths.split(","):
            if which == "fast":
                runs["engine/fast"] = engine_run(engine, FastDecoder(engine.model), prompts, args.new)
            elif which == "stock":
                runs["engine/stock"] = engine_run(engine, StockDecoder(engine.model), prompts, args.new)
            elif which == "vllm":
                runs["vllm"] = vllm_run(path, engine, prompts, args.new, threads)
            else:
                runs["hf.generate"] = hf_generate_run(engine.model, prompts, args.new)
        best = {name: float("inf") for name in runs}
        # Round-robin so that a load change on the shared machine hits every path alike.
        for _ in range(args.repeats + 1):  # the first round warms up
            for name, run in runs.items():
                best[name] = min(best[name], run())
        for name, seconds in best.items():
            results.append(Result(name, threads, seconds, args.batch * args.new, args.new))
            print(results[-1].line(), flush=True)
    fast = {r.threads: r.seconds for r in results if r.path == "engine/fast"}
    for r in results:
        if r.path != "engine/fast" and r.threads in fast:
            print(f"engine/fast is {r.seconds / fast[r.threads]:.1f}x faster than {r.path} at {r.threads} thread(s)")


if __name__ == "__main__":
    main()
