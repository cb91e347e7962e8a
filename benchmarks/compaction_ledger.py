"""Trained compaction vs its baselines on the ledger (docs/results.md, "Context compaction").

Four variants of examples/compaction_tiny.yaml, the same warm start, steps and seeds:
``summarize`` (the summary is trained), ``frozen_summary`` (written by the policy, masked out),
``truncate`` (the oldest pages dropped) at the 350-token budget, and ``unlimited``
(no compaction, no budget: the ceiling). Each run evaluates greedily on the held-out ledgers
before and after training, at its own budget and compaction.

    python benchmarks/compaction_ledger.py run --steps 40 --seeds 0 1 2 --out runs/compaction
    python benchmarks/compaction_ledger.py table --out runs/compaction --plot docs/compaction_curve.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "summarize": ["rollout.compaction=summarize"],
    "frozen_summary": ["rollout.compaction=frozen_summary"],
    "truncate": ["rollout.compaction=truncate"],
    "unlimited": ["rollout.compaction=none", "rollout.context_budget=null"],
}
CONFIG = "examples/compaction_tiny.yaml"


def run(args) -> None:
    for seed in args.seeds:
        for name in args.variants:
            overrides = VARIANTS[name]
            out = Path(args.out) / f"{name}_seed{seed}"
            if (out / "metrics.jsonl").exists() and not args.force:
                continue
            t0 = time.time()
            cmd = [sys.executable, "-m", "agentrl", "train", CONFIG, f"seed={seed}", f"train.steps={args.steps}",
                   f"eval.every={args.eval_every}", f"eval.num_tasks={args.eval_tasks}", f"output_dir={out}", *overrides,
                   *args.extra]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"{name} seed {seed}: {time.time() - t0:.0f} s", flush=True)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if x.strip()]


def attempts_of(path: Path) -> list[list[dict]]:
    """The training attempts of a run, each its segments in order."""
    by: dict[tuple[str, int], list[dict]] = {}
    for f in sorted((path / "rollouts").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            by.setdefault((d["group_id"], d["sample_index"]), []).append(d)
    return list(by.values())


def summary_tokens(segments: list[dict]) -> list[int]:
    """Tokens of each summary an attempt wrote: the last sampled span of every segment but the last."""
    out = []
    for d in segments[:-1]:
        spans = [s for s in d["spans"] if s["kind"] in ("model", "summary")]
        if spans:
            out.append(spans[-1]["end"] - spans[-1]["start"])
    return out


def summaries_keep(segments: list[dict]) -> list[bool]:
    """For each summary an attempt wrote: does it list exactly the codes its segment read, in order?"""
    out = []
    for d in segments[:-1]:
        msgs = d["messages"]
        if len(msgs) < 2 or msgs[-1]["role"] != "assistant" or msgs[-2]["role"] != "user":
            continue  # truncate: no summary
        read = [m for t in msgs if t["role"] == "tool" for m in re.findall(r"\ncode (\d+)", t["content"])]
        got = re.search(r"codes ([\d ]+?)(?: next|$)", msgs[-1]["content"] or "")
        out.append(got is not None and got.group(1).split() == read)
    return out


def fmt(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def table(args) -> None:
    curves: dict[str, list[list[float]]] = {}
    print("| variant | held-out success, before | after | train reward, steps 1-5 | last 5 steps | "
          "segments per attempt | summary tokens | summaries keeping every code read | attempts ended by compaction failure |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        runs = sorted(Path(args.out).glob(f"{name}_seed*"))
        if not runs:
            continue
        before, after, first, last, segs, stoks, failed, keeps = [], [], [], [], [], [], [], []
        for r in runs:
            rows = rows_of(r)
            ev = [x["eval/accuracy"] for x in rows if x.get("eval/accuracy") is not None]
            before.append(ev[0])
            after.append(ev[-1])
            rewards = [x["reward/mean"] for x in rows if "reward/mean" in x]
            first.append(statistics.mean(rewards[:5]))
            last.append(statistics.mean(rewards[-5:]))
            curves.setdefault(name, []).append([(x["step"], x["eval/accuracy"]) for x in rows
                                                if x.get("eval/accuracy") is not None])
            att = attempts_of(r)
            segs.append(statistics.mean(len(a) for a in att))
            stoks += [n for a in att for n in summary_tokens(a)]
            keeps += [k for a in att for k in summaries_keep(a)]
            failed.append(sum(bool((a[-1].get("compaction") or {}).get("error")) for a in att) / len(att))
        st = f"{statistics.mean(stoks):.1f}" if stoks and name != "truncate" else "—"
        kept = f"{statistics.mean(keeps):.3f}" if keeps else "—"
        print(f"| {name} ({len(runs)} seeds) | {fmt(before)} | {fmt(after)} | {fmt(first)} | {fmt(last)} | "
              f"{statistics.mean(segs):.2f} | {st} | {kept} | {statistics.mean(failed):.3f} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, cs in curves.items():
            n = min(len(c) for c in cs)
            steps = [c[0] for c in cs[0][:n]]
            mean = [statistics.mean(c[i][1] for c in cs) for i in range(n)]
            ax.plot(steps, mean, marker="o", label=name)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("held-out success, greedy (mean of seeds)")
        ax.set_title("ledger: 350-token context budget (unlimited: no budget)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--steps", type=int, default=40)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--eval-tasks", type=int, default=64)
    r.add_argument("--eval-every", type=int, default=10)
    r.add_argument("--out", default="runs/compaction")
    r.add_argument("--force", action="store_true")
    r.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    r.add_argument("extra", nargs="*", help="more config overrides")
    t = sub.add_parser("table")
    t.add_argument("--out", default="runs/compaction")
    t.add_argument("--plot", default=None)
    a = p.parse_args()
    run(a) if a.cmd == "run" else table(a)


if __name__ == "__main__":
    main()
