"""Seconds per update token of the GRPO update on one model: float32, bfloat16 autocast, and
each with the shared prompt run once per micro-batch (``train.share_prefix``), and LoRA
(r=16 on every linear layer, bf16 autocast, shared prefix) with ``--lora``.

One update step = forward (LM head only at trained positions), the clipped objective,
backward and an AdamW step, on ``--rows`` sequences of ``--prompt`` prompt tokens and
``--completion`` trained tokens; the rows share their prompt, as the G attempts of a task do.
All modes run in the same process, alternating, and the ratios of their medians to float32
are reported (the machine is noisy; compare ratios).

    python benchmarks/update_speed.py --model smollm2 --rows 8 --prompt 150 --completion 100
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentrl.algo.batching import MicroBatch, score_tokens
from agentrl.algo.objective import Objective


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, a .gguf file or an HF directory")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=150)
    ap.add_argument("--completion", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora", action="store_true", help="also time LoRA (needs peft)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from agentrl.run.build import resolve_model_path
    from agentrl.run.config import Config, ModelConfig

    path = resolve_model_path(Config(model=ModelConfig(path=args.model)))
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    lora = lora_opt = None
    if args.lora:
        import copy

        from agentrl.run.config import LoRAConfig
        from agentrl.scale.parallel import apply_lora

        lora = apply_lora(copy.deepcopy(model), LoRAConfig(enabled=True))
        lora_opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-7)
    g = torch.Generator().manual_seed(0)
    T = args.prompt + args.completion
    ids = torch.randint(0, model.config.vocab_size, (args.rows, T), generator=g)
    ids[:, :args.prompt] = ids[0, :args.prompt]  # one task's G attempts: one prompt
    mask = torch.zeros(args.rows, T)
    mask[:, args.prompt:] = 1.0
    mb = MicroBatch(list(range(args.rows)), ids, torch.ones_like(ids), mask, torch.zeros(args.rows, T))
    objective = Objective()
    adv = torch.linspace(-1, 1, args.rows)
    tokens = int(mask.sum())

    def step(mode: tuple[str, bool, bool]) -> float:
        net, o = (lora, lora_opt) if mode[2] else (model, opt)
        t0 = time.perf_counter()
        o.zero_grad(set_to_none=True)
        lp, _ = score_tokens(net, mb, 1.0, mode[0], share_prefix=mode[1])
        out = objective.policy_loss(lp, lp.detach(), adv, mask, total_seqs=args.rows, total_tokens=tokens)
        out.loss.backward()
        o.step()
        return time.perf_counter() - t0

    modes = {"float32": ("none", False, False), "float32 + shared prefix": ("none", True, False),
             "bf16 autocast": ("bf16", False, False), "bf16 autocast + shared prefix": ("bf16", True, False)}
    if lora is not None:
        modes["LoRA r=16, bf16 + shared prefix"] = ("bf16", True, True)
    times: dict[str, list[float]] = {name: [] for name in modes}
    for mode in modes.values():  # warm-up of every path
        step(mode)
    for _ in range(args.repeats):
        for name, mode in modes.items():
            times[name].append(step(mode))
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"{args.rows} rows x ({args.prompt} shared prompt + {args.completion} trained) tokens, {args.model}")
    for m, s in med.items():
        print(f"{m:>30}: {s:6.2f} s/step  {1e3 * s / tokens:6.2f} ms per trained token  "
              f"x{med['float32'] / s:.2f} vs float32")


if __name__ == "__main__":
    main()
