"""Measure a warm start on the arithmetic environment: coverage per family before any RL.

Runs (or reuses) the warm start, then on held-out tasks reports per family: greedy
accuracy, and at a sampling temperature the success rate, the tool-use rate and the share
of G-sample groups with any signal (some but not all attempts right).

    python benchmarks/arith_warmstart.py --steps 500 --corruption 0.75 --temps 0.7 1.0

Threads: torch runs with 1 thread (``--threads``) since the 2 cores are shared.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from agentrl.chat import ChatTemplate
from agentrl.engines.hf import HFEngine
from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.toolbox import ToolBox
from agentrl.run.config import SFTSettings
from agentrl.run.warmstart import warm_start


def measure(model_dir, env: ArithmeticEnv, *, num_tasks: int, group: int, temps: list[float], seed: int,
            greedy: bool) -> dict:
    engine = HFEngine.from_pretrained(str(model_dir), seed=seed)
    chat = ChatTemplate(engine.tokenizer)
    toolbox = ToolBox(env.tools(), tokenizer=engine.tokenizer)
    tasks = env.tasks("test")[:num_tasks]
    out: dict = {}
    for temp in [0.0] * greedy + temps:
        cfg = RolloutConfig(max_turns=3, max_new_tokens=48, max_total_tokens=512, temperature=temp)
        runner = RolloutRunner(engine, chat, toolbox, cfg)
        g = 1 if temp == 0 else group
        t0 = time.perf_counter()
        batch = runner.run(tasks, num_samples=g, system_prompt=env.system_prompt, seed=seed)
        secs = time.perf_counter() - t0
        by_task = {t.id: t for t in tasks}
        fam = defaultdict(lambda: {"n": 0, "ok": 0, "tool": 0, "answer": 0, "groups": 0, "signal": 0})
        groups: dict[str, list[float]] = defaultdict(list)
        for tr in batch.trajectories:
            task = by_task[tr.group_id]
            s = env.score(task, tr.messages)
            f = fam[task.family]
            f["n"] += 1
            f["ok"] += s.reward
            f["tool"] += bool(s.info["used_tool"])
            f["answer"] += bool(s.info["has_answer"])
            groups[tr.group_id].append(s.reward)
        for gid, rs in groups.items():
            f = fam[by_task[gid].family]
            f["groups"] += 1
            f["signal"] += 0 < sum(rs) < len(rs)
        rows = {k: {"acc": v["ok"] / v["n"], "tool": v["tool"] / v["n"], "answer": v["answer"] / v["n"],
                    "signal": v["signal"] / v["groups"]} for k, v in sorted(fam.items())}
        total = sum(v["ok"] for v in fam.values()) / sum(v["n"] for v in fam.values())
        out[f"T={temp}"] = {"acc": total, "seconds": secs, "families": rows}
        print(f"T={temp} G={g}: acc {total:.3f} ({secs:.1f}s)")
        for k, r in rows.items():
            print(f"   {k:10s} acc {r['acc']:.2f} tool {r['tool']:.2f} answer {r['answer']:.2f} signal {r['signal']:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--num-demos", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--corruption", type=float, default=0.75)
    ap.add_argument("--kind", default="guess")
    ap.add_argument("--clean-steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env-seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=200, help="held-out tasks for greedy")
    ap.add_argument("--sample-tasks", type=int, default=40, help="held-out tasks sampled G times")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--temps", type=float, nargs="*", default=[1.0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--no-tool", action="store_true", help="measure the control condition")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = ArithmeticEnv(seed=args.env_seed)
    t0 = time.perf_counter()
    settings = SFTSettings(num_demos=args.num_demos, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                           corruption=args.corruption, corruption_kind=args.kind, clean_steps=args.clean_steps,
                           warmup_steps=args.warmup, seed=args.seed)
    path = warm_start(ensure_tiny_model(), env, settings, cache_dir=args.cache)
    print(f"warm start {path} in {time.perf_counter() - t0:.1f}s")
    eval_env = ArithmeticEnv(seed=args.env_seed, use_tool=not args.no_tool)
    res = measure(path, eval_env, num_tasks=args.tasks, group=1, temps=[], seed=args.seed,
                  greedy=True)
    res.update(measure(path, eval_env, num_tasks=args.sample_tasks, group=args.group, temps=args.temps,
                       seed=args.seed, greedy=False))
    print(json.dumps({"args": vars(args), "results": res}))


if __name__ == "__main__":
    main()
