"""How fast does the warm start learn to copy? Teacher-forced probes during SFT.

Every ``--every`` steps, on held-out *clean* demonstrations (test-split expressions), with
teacher forcing and argmax: ``code`` = share whose whole tool-call turn is right (the
expression copied into ``print(...)``), ``answer`` = share whose whole final answer turn is
right (the tool's result copied), ``p_tool`` = mean probability of ``<tool_call>`` as the
first assistant token. Per family, so a copy habit that works for one length only shows.

    python benchmarks/arith_sft_curve.py --steps 600 --batch-size 8 --lr 2e-3

Threads: 1 (``--threads``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.chat import ChatTemplate
from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.models.tiny import ensure_tiny_model
from agentrl.run.config import SFTSettings
from agentrl.run.demonstrations import encode_demonstration, make_demonstrations
from agentrl.run.warmstart import sft


def turns(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    out, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


@torch.no_grad()
def probe(model, probes, tool_id: int) -> dict[str, dict[str, float]]:
    stats: dict[str, dict[str, float]] = defaultdict(lambda: {"n": 0, "code": 0, "answer": 0, "p_tool": 0.0,
                                                                    "digits": 0.0})
    for family, enc in probes:
        ids = torch.tensor([enc.token_ids])
        logits = model(input_ids=ids).logits[0]
        pred = logits.argmax(-1)
        (a0, a1), (b0, b1) = turns(enc.loss_mask)
        s = stats[family]
        s["n"] += 1
        s["code"] += bool((pred[a0 - 1:a1 - 1] == ids[0, a0:a1]).all())
        s["answer"] += bool((pred[b0 - 1:b1 - 1] == ids[0, b0:b1]).all())
        s["p_tool"] += torch.softmax(logits[a0 - 1], -1)[tool_id].item()
        s["digits"] += (pred[b0 - 1:b1 - 1] == ids[0, b0:b1]).float().mean().item()
    return {f: {k: v / s["n"] for k, v in s.items() if k != "n"} for f, s in sorted(stats.items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--num-demos", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--corruption", type=float, default=0.75)
    ap.add_argument("--kind", default="guess")
    ap.add_argument("--clean-steps", type=int, default=None)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kw = {} if (args.layers, args.hidden) == (2, 128) else {"num_layers": args.layers, "hidden_size": args.hidden,
                                                            "intermediate_size": 3 * args.hidden}
    base = ensure_tiny_model(**kw)
    env = ArithmeticEnv(seed=0)
    tok = AutoTokenizer.from_pretrained(base)
    chat = ChatTemplate(tok)
    tools = [t.schema() for t in env.tools()]
    settings = SFTSettings(num_demos=args.num_demos, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                           warmup_steps=args.warmup, corruption=args.corruption, corruption_kind=args.kind,
                           clean_steps=args.clean_steps)
    encoded = [encode_demonstration(chat, d.messages, tools, d.corrupted) for d in make_demonstrations(env, settings)]
    probes = [(t.family, encode_demonstration(chat, env.demonstration(t), tools))
              for t in env.tasks("test")[: args.probes]]
    model = AutoModelForCausalLM.from_pretrained(base)
    tool_id = tok.convert_tokens_to_ids("<tool_call>")
    t0 = time.perf_counter()

    def report(step: int) -> None:
        if step % args.every:
            return
        model.eval()
        res = probe(model, probes, tool_id)
        model.train()
        line = " ".join(f"{f}:{r['code']:.2f}/{r['answer']:.2f}/{r['p_tool']:.2f}/{r['digits']:.2f}"
                        for f, r in res.items())
        print(f"step {step:4d} {time.perf_counter() - t0:6.0f}s  code/answer/p_tool/answer-token-acc  {line}", flush=True)

    sft(model, encoded, settings, tok.pad_token_id, log=print, callback=report)


if __name__ == "__main__":
    main()
