"""Synchronous vs asynchronous rollouts on the CPU arithmetic example: seconds per step and
held-out accuracy for ``train.max_staleness`` 0, 1 and 2, side by side.

Each run is ``agentrl train CONFIG train.max_staleness=K ...`` in a fresh interpreter, with
the same seed, steps and evaluation; ``--rounds R`` repeats the set round-robin (K=0, 1, 2,
K=0, ...) so that load from other processes on a shared machine hits every setting alike.
From each run's ``metrics.jsonl``:

- ``step_s``: mean ``time/step`` over steps 2..N (step 1 of an asynchronous run also waits
  for the pipeline to fill), i.e. the training loop's wall clock per step without the
  evaluations and checkpoints, which are the same work in every setting;
- ``wait``: the share of that time the trainer spent waiting for data (synchronous: the
  whole rollout); ``rollout_s``, ``tools_s``, ``update_s``: per-step means;
- ``acc0`` / ``acc``: held-out greedy accuracy before training and after the last step;
- the staleness actually trained on, the truncated IS weight (mean, max, truncated share)
  and ``|log π_old - log μ|``.

    python benchmarks/async_staleness.py --steps 30 --rounds 3  # the figures of docs/async.md
    python benchmarks/async_staleness.py --steps 30 --tool-delay 0.5   # a tool that waits (a remote one)

``--tool-delay S`` makes every python call first wait S seconds without using the CPU (an
asyncio sleep), as a remote sandbox or a web search would: the part of a rollout that an
asynchronous trainer can hide even when the CPU is saturated.

Without ``--config``: ``examples/arithmetic_ci.yaml`` with ``RECIPE`` on top, the CPU
example's recipe the figures of docs/async.md were measured with (``--config
examples/arithmetic_tiny.yaml`` runs the example's current one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.toolbox import Tool, ToolContext

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RunResult:
    staleness_bound: int
    round: int
    steps: int
    step_s: float
    wait: float
    rollout_s: float
    tools_s: float
    update_s: float
    acc0: float | None
    acc: float | None
    reward: float
    staleness_mean: float
    is_weight_mean: float
    is_weight_max: float
    is_trunc_frac: float
    mismatch: float
    process_s: float


class DelayedToolArithmetic(ArithmeticEnv):
    """The arithmetic environment whose python tool first waits ``tool_delay`` seconds (same
    name and schema, so the prompts and the warm start are unchanged)."""

    def __init__(self, tool_delay: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.tool_delay = tool_delay

    def tools(self):
        (inner,) = super().tools()
        delay = self.tool_delay

        async def python(code: str, context: ToolContext) -> str:
            await asyncio.sleep(delay)
            return await inner.invoke({"code": code}, context)

        return [Tool(python, name="python", description=inner.description, parameters=inner.parameters,
                     timeout=inner.timeout)]


RECIPE = [  # tiny model, tool-using warm start with 60% guesses, 16 prompts x 8 attempts
    "model.num_threads=1", "env.args.num_train=2000", "env.args.num_test=200",
    "warmstart.enabled=true", "warmstart.num_demos=2000", "warmstart.steps=500", "warmstart.lr=0.002",
    "warmstart.batch_size=16", "warmstart.corruption=0.6", "rollout.max_turns=3", "rollout.max_new_tokens=64",
    "rollout.max_total_tokens=512", "algo.num_samples=8", "optim.lr=0.0002", "optim.warmup_steps=10",
    "train.prompts_per_step=16", "eval.every=0", "eval.num_tasks=200",
]


def default_config() -> tuple[Path, list[str]]:
    return ROOT / "examples" / "arithmetic_ci.yaml", list(RECIPE)


def _mean(rows: list[dict], key: str, default: float = 0.0) -> float:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else default


def summarize(metrics: Path, k: int, rnd: int, process_s: float) -> RunResult:
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r["step"] > 0 and "time/step" in r]
    steady = steps[1:] or steps
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    acc0 = next((r["eval/accuracy"] for r in evals if r["step"] == 0), None)
    wait = sum(r["time/trainer_wait"] for r in steady) / sum(r["time/step"] for r in steady)
    return RunResult(
        staleness_bound=k, round=rnd, steps=len(steps), step_s=_mean(steady, "time/step"), wait=wait,
        rollout_s=_mean(steps, "time/rollout"), tools_s=_mean(steps, "time/tools"),
        update_s=_mean(steps, "time/update"), acc0=acc0, acc=evals[-1]["eval/accuracy"] if evals else None,
        reward=_mean(steps, "reward/mean"), staleness_mean=_mean(steps, "async/staleness_mean"),
        is_weight_mean=_mean(steps, "is/weight_mean", 1.0), is_weight_max=max(
            [r.get("is/weight_max") or 1.0 for r in steps], default=1.0),
        is_trunc_frac=_mean(steps, "is/trunc_frac"), mismatch=_mean(steps, "mismatch/abs_mean"),
        process_s=process_s)


def run_one(config: Path, k: int, rnd: int, steps: int, extra: list[str], out_root: Path) -> RunResult:
    run_dir = out_root / f"k{k}_r{rnd}"
    cmd = [sys.executable, "-m", "agentrl", "train", str(config), f"output_dir={run_dir}",
           f"train.max_staleness={k}", f"train.steps={steps}", "train.checkpoint_every=1000", *extra]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return summarize(run_dir / "metrics.jsonl", k, rnd, time.perf_counter() - t0)


def table(results: list[RunResult]) -> str:
    head = ("| max_staleness | step s (2..N) | trainer waiting | rollout s | tools s | update s | acc start | "
            "acc end | train reward | staleness | IS w mean / max | IS truncated | abs(log π_old - log μ) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k in sorted({r.staleness_bound for r in results}):
        rs = [r for r in results if r.staleness_bound == k]

        def m(attr):
            vals = [getattr(r, attr) for r in rs if getattr(r, attr) is not None]
            return statistics.fmean(vals) if vals else float("nan")

        lines.append(
            f"| {k} | {m('step_s'):.2f} | {m('wait'):.0%} | {m('rollout_s'):.2f} | {m('tools_s'):.2f} | "
            f"{m('update_s'):.2f} | {m('acc0'):.3f} | {m('acc'):.3f} | {m('reward'):.3f} | "
            f"{m('staleness_mean'):.2f} | {m('is_weight_mean'):.3f} / {max(r.is_weight_max for r in rs):.2f} | "
            f"{m('is_trunc_frac'):.1%} | {m('mismatch'):.4f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tool-delay", type=float, default=0.0, help="seconds each tool call waits first")
    ap.add_argument("--set", dest="overrides", nargs="*", default=[], help="extra key=value overrides")
    ap.add_argument("--out", type=Path, default=None, help="write the per-run results as JSON")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = ap.parse_args()
    config, extra = (args.config, []) if args.config else default_config()
    if args.tool_delay > 0:
        extra += ["env.name=async_staleness:DelayedToolArithmetic", f"env.args.tool_delay={args.tool_delay}"]
    extra += args.overrides
    out_root = args.keep or Path(tempfile.mkdtemp(prefix="async-staleness-"))
    results = []
    for rnd in range(args.rounds):
        for k in args.staleness:
            r = run_one(config, k, rnd, args.steps, extra, out_root)
            print(f"round {rnd} max_staleness={k}: {r.step_s:.2f} s/step, waiting {r.wait:.0%}, "
                  f"acc {r.acc0} -> {r.acc}", flush=True)
            results.append(r)
    print(f"\n{config.name} {' '.join(extra)}, {args.steps} steps, {args.rounds} round(s)\n")
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))


if __name__ == "__main__":
    main()
