"""Seconds per GRPO step with a real tool, agentrl against TRL's own tool loop (issue 16, 4c).

Question: on the same tool workload, how many seconds does one GRPO step take in agentrl
(per-attempt agent loop over the continuously batched ``hf`` engine) and in TRL 1.16's
``GRPOTrainer(tools=[f])`` (stock ``generate``, its tool-calling loop)? Goal: agentrl >= 2x faster.

Setup:
- Model: the offline tiny model (``agentrl.models.tiny``, real Qwen2.5-style byte-level BPE),
  built with an exact copy of TRL's bundled ``chat_templates/qwen2_5.jinja``, the template TRL
  recognises (``add_response_schema``) and parses tool calls with. Warm-started by SFT
  (``agentrl.run.warmstart.warm_start``, cached under ``<cache>/bench-tool-step``) on
  demonstrations: prompt with the tool schema -> ``<tool_call>`` multiply(a, b) -> tool result ->
  ``<answer>N</answer>`` (1,200 SFT steps; 10% of the mix skips the tool and guesses, so
  groups carry reward signal).
- Tool: ``tool_task.multiply``, a plain in-process Python function, the same on both sides; the
  prompts are token-identical (checked per prompt, reported).
- Same tasks in the same order per step, 8 prompts x G=8, temperature 1.0, learning rate, AdamW
  betas, clip, grad-clip, beta=0 (no reference model), float32, 1 torch thread and
  ``OMP_NUM_THREADS=1`` on both sides; model turns: agentrl ``rollout.max_turns=3`` = TRL
  ``max_tool_calling_iterations=2``; every sampled attempt takes part in the update on both sides
  (agentrl ``train.skip_zero_advantage=false``).
- Each side is a fresh interpreter, run one after the other; ``--steps`` steps each (default 7),
  median over the steps after the first 2 (warm-up).

    .venv/bin/python benchmarks/tool_step.py --rounds 2 --json /tmp/tool_step.json   # ~5 min
                                    # (+ ~4 min of warm start, once per machine)
    .venv/bin/python benchmarks/tool_step.py --no-trl --set train.share_prefix=true  # agentrl only

``--trl-python`` runs the TRL side under another interpreter (default: this one). Results and
settings: benchmarks/README.md, "GRPO step with a tool, against TRL's tool loop".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONFIG = HERE.parent / "examples" / "arithmetic_ci.yaml"
WARMUP = 2  # steps left out of the medians
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def trl_template(python: str) -> str:
    """TRL's bundled Qwen2.5 template, read from the TRL installation of ``python``."""
    code = "import pathlib, trl; print(pathlib.Path(trl.__file__).parent / 'chat_templates' / 'qwen2_5.jinja')"
    path = subprocess.run([python, "-c", code], check=True, text=True, capture_output=True).stdout.strip()
    return Path(path).read_text(encoding="utf-8")


def sft_settings():
    from agentrl.run.config import SFTSettings

    return SFTSettings(num_demos=4000, steps=1200, lr=2e-3, batch_size=16, corruption=0.1, corruption_kind="guess")


def prepare_model(template: str, cache: Path, log=print) -> Path:
    """Tiny model carrying ``template``, warm-started to call ``multiply`` (both cached by hash)."""
    from tool_task import MultiplyEnv

    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.run.warmstart import warm_start

    base = ensure_tiny_model(cache_dir=cache, chat_template=template)
    return warm_start(base, MultiplyEnv(seed=0), sft_settings(), cache_dir=cache, num_threads=2, log=log)


def build_config(args, model_dir: str, out_dir: str):
    from agentrl.run.config import load_config

    return load_config(CONFIG, [
        f"output_dir={out_dir}", f"model.path={model_dir}", "model.engine=hf", "model.num_threads=1",
        "env.name=tool_task:MultiplyEnv", f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}",
        f"algo.num_samples={args.G}", "algo.kl_coef=0.0", f"rollout.max_turns={args.max_turns}",
        f"rollout.max_new_tokens={args.turn_tokens}", "rollout.max_total_tokens=2048",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.loop=auto", f"optim.lr={args.lr}",
        "train.skip_zero_advantage=false", "train.checkpoint_every=1000", "eval.at_start=false", "eval.every=0",
        *args.set,
    ])


class _StatsRecorder:
    """Keeps each rollout batch's RolloutStats (engine compute time is not in the metrics)."""

    def __init__(self, runner):
        self.inner, self.stats = runner.run, []
        runner.run = self

    def __call__(self, *a, **k):
        batch = self.inner(*a, **k)
        self.stats.append(batch.stats)
        return batch


def agentrl_side(args, work: Path) -> None:
    """One agentrl run in this fresh process; writes ``agentrl.json`` (figures + the TRL spec)."""
    import torch

    from agentrl.run.trainer import Trainer
    from agentrl.types import Message, read_jsonl

    torch.set_num_threads(1)
    cfg = build_config(args, args.model_dir, str(work / "run"))
    trainer = Trainer(cfg, log=lambda *_: None)
    rec = _StatsRecorder(trainer.runner)
    steps = []
    for step in range(1, args.steps + 1):
        n0 = len(rec.stats)
        m = trainer.train_step(step)
        trajs = list(read_jsonl(str(trainer.run_dir / "rollouts" / f"step_{step:06d}.jsonl")))
        calls = [c for t in trajs for c in t.tool_calls]
        ran = [c for c in calls if c.error != "parse_error"]  # reached the function (TRL counts these)
        s = {"step_s": m["time/step"], "rollout_s": m["time/rollout"], "update_s": m["time/update"],
             "tools_s": m["time/tools"], "generate_s": sum(b.generate_s for b in rec.stats[n0:]),
             "sampled_tokens": sum(b.sampled_tokens for b in rec.stats[n0:]),
             "sequence_tokens": sum(len(t.token_ids) for t in trajs), "tool_calls": len(ran),
             "tool_failures": sum(c.error is not None for c in ran), "malformed_calls": len(calls) - len(ran),
             "attempts_with_call": sum(any(c.error != "parse_error" for c in t.tool_calls) for t in trajs),
             "attempts": len(trajs), "model_turns": sum(t.turns for t in trajs),
             "reward_mean": m["reward/mean"], "loop": rec.stats[-1].loop if rec.stats else "?"}
        steps.append(s)
        print(f"  agentrl step {step}: {s['step_s']:.2f} s (rollout {s['rollout_s']:.2f}, generate "
              f"{s['generate_s']:.2f}, update {s['update_s']:.2f}), tool calls {s['tool_calls']} "
              f"({s['attempts_with_call']}/{s['attempts']} attempts, {s['tool_failures']} failed, "
              f"{s['malformed_calls']} malformed), "
              f"reward {s['reward_mean']:.2f}, {s['sampled_tokens']} sampled tokens", flush=True)
    trainer.metrics.close()
    prompts, prompt_ids, answers = [], [], []
    tools = trainer.toolbox.schemas()
    for step in range(1, args.steps + 1):  # the tasks train_step drew (same seeded draw)
        for task in trainer.sample_tasks(step, cfg.train.prompts_per_step):
            msgs = [Message("system", trainer.env.system_prompt), Message("user", task.prompt)]
            prompts.append([m.to_chat() for m in msgs])
            prompt_ids.append(trainer.chat.encode_prompt(msgs, tools))
            answers.append(task.answer)
    spec = {"model_dir": trainer.model_path, "prompts": prompts, "prompt_ids": prompt_ids, "answers": answers,
            "num_generations": cfg.algo.num_samples, "prompts_per_step": cfg.train.prompts_per_step,
            "steps": args.steps, "lr": cfg.optim.lr, "betas": list(cfg.optim.betas),
            "weight_decay": cfg.optim.weight_decay, "max_grad_norm": cfg.optim.max_grad_norm,
            "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p, "epsilon": cfg.algo.eps_low,
            "seed": cfg.seed, "max_tool_calling_iterations": cfg.rollout.max_turns - 1,
            "max_completion_length": cfg.rollout.max_turns * cfg.rollout.max_new_tokens}
    out = {"steps": steps, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "threads": torch.get_num_threads(), "micro_batch_tokens": cfg.train.micro_batch_tokens,
           "share_prefix": cfg.train.share_prefix, "spec": spec}
    (work / "agentrl.json").write_text(json.dumps(out))


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, env={**os.environ, **ENV})


def med(steps: list[dict], key: str) -> float:
    timed = steps[WARMUP:] or steps
    return statistics.median(s[key] for s in timed)


def summarize(side: dict) -> dict:
    st = side["steps"]
    keys = ["step_s", "rollout_s", "generate_s", "update_s", "tool_calls", "attempts_with_call", "attempts",
            "tool_failures", "malformed_calls", "model_turns", "reward_mean", "sampled_tokens", "sequence_tokens"]
    return {**{k: med(st, k) for k in keys if all(k in s for s in st)}, "peak_rss_mb": side["peak_rss_mb"],
            "timed_steps": len(st[WARMUP:] or st)}


def print_table(a: dict, t: dict) -> None:
    rows = [("seconds / step (median)", "step_s", "{:.2f}"),
            ("rollout s (generation + tools + parsing)", "rollout_s", "{:.2f}"),
            ("of which model generation s", "generate_s", "{:.2f}"),
            ("update s (rest of the step)", "update_s", "{:.2f}"),
            ("tool calls run / step", "tool_calls", "{:.0f}"),
            ("attempts with a tool call run (of 64)", "attempts_with_call", "{:.0f}"),
            ("failed tool calls / step (of those run)", "tool_failures", "{:.0f}"),
            ("malformed tool calls / step (invalid JSON)", "malformed_calls", "{:.0f}"),
            ("model turns / step", "model_turns", "{:.0f}"), ("reward mean", "reward_mean", "{:.2f}"),
            ("sampled tokens / step", "sampled_tokens", "{:.0f}"), ("peak RSS MB", "peak_rss_mb", "{:.0f}")]
    print("| | agentrl | TRL |\n| --- | --- | --- |")
    for label, key, fmt in rows:
        cell = [fmt.format(x[key]) if x.get(key) is not None else "n/a" for x in (a, t)]
        print(f"| {label} | {cell[0]} | {cell[1]} |")
    print(f"\nspeed-up agentrl vs TRL per step: {t['step_s'] / a['step_s']:.2f}x (goal >= 2)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7, help=f"steps per side; the first {WARMUP} are warm-up")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=3, help="agentrl rollout.max_turns; TRL iterations = this - 1")
    ap.add_argument("--turn-tokens", type=int, default=64, help="agentrl tokens per turn; TRL budget = turns x this")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra agentrl override")
    ap.add_argument("--trl-python", default=sys.executable, help="interpreter with TRL installed")
    ap.add_argument("--cache", default=None, help="model cache (default <agentrl cache>/bench-tool-step)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-trl", action="store_true", help="the agentrl side only (e.g. with --set variants)")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--side-agentrl", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side_agentrl:
        agentrl_side(args, Path(args.side_agentrl))
        return
    from agentrl.models.cache import default_cache_dir

    cache = Path(args.cache) if args.cache else default_cache_dir() / "bench-tool-step"
    model_dir = prepare_model(trl_template(args.trl_python), cache)
    print(f"model: {model_dir}", flush=True)
    report = {"args": vars(args), "model_dir": str(model_dir), "rounds": []}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}: agentrl", flush=True)
        with tempfile.TemporaryDirectory(prefix="agentrl-toolstep-") as tmp:
            work = Path(tmp)
            _run([sys.executable, __file__, *sys.argv[1:], "--model-dir", str(model_dir), "--side-agentrl", tmp])
            ag = json.loads((work / "agentrl.json").read_text())
            if args.no_trl:
                ag.pop("spec")
                a = summarize(ag)
                print(" | ".join(f"{k} {v:.2f}" for k, v in a.items()), flush=True)
                report["rounds"].append({"agentrl": {**ag, "median": a}})
                continue
            print(f"round {r + 1}/{args.rounds}: TRL", flush=True)
            (work / "spec.json").write_text(json.dumps(ag["spec"]))
            _run([args.trl_python, str(HERE / "trl_tool_step.py"), "--spec", str(work / "spec.json"),
                  "--out", str(work / "trl.json"), "--output-dir", str(work / "trl_run")])
            trl = json.loads((work / "trl.json").read_text())
        a, t = summarize(ag), summarize(trl)
        print_table(a, t)
        print(f"TRL {trl['trl_version']} (transformers {trl['transformers_version']}): tools/call_frequency "
              f"{trl['call_frequency']}, tools/failure_frequency {trl['failure_frequency']}; prompts "
              f"token-identical to agentrl's: {trl['prompts_identical']}/{len(ag['spec']['prompts'])}")
        ag.pop("spec")
        report["rounds"].append({"agentrl": {**ag, "median": a}, "trl": {**trl, "median": t},
                                 "speedup": t["step_s"] / a["step_s"]})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
