"""Benchmark the local search backend on a ~10,000-document corpus.

Reports: corpus load time, index build time (fresh, no cache), index size, single-threaded
queries per second (wall clock and CPU time) for three query kinds (question prompts, short title-like keyword
queries, adversarial text), search tool calls per second made directly and through
``ToolBox.execute`` with their ratio, and how often the gold document of a search_qa question is
in the top 1 / top 5 results for the question text.

Goals (issue 6): build < 30 s, >= 500 queries/s single-threaded. Issue 16: the ToolBox path at
>= 0.8 of the direct rate.

    python benchmarks/search.py                      # ovos_wiki if installed, else synthetic 10k
    python benchmarks/search.py --corpus synthetic   # a generated 10k corpus
    python benchmarks/search.py --corpus path/to/docs.jsonl --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.search_qa import SearchQAEnv, gold_in_top_k
from agentrl.toolbox import ToolBox
from agentrl.tools.corpus import Document, resolve_corpus, write_jsonl
from agentrl.tools.search import LocalBackend, search_tool
from agentrl.tools.search_index import SearchIndex

ADVERSARIAL = ['copper "bells', "NEAR(a b", "title:x OR *", "'; DROP TABLE documents; --", "\u202e\u200b🔔",
               "x" * 100_000, "AND OR NOT", '"' * 1000]


def synthetic_corpus(path: Path, n: int = 10_000, seed: int = 0) -> Path:
    """``n`` documents of Zipf-distributed made-up words (about 80 words each), as JSONL."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ra", "te", "su", "vin", "dor", "el", "an", "is", "ur", "bex", "qua", "zo"]
    vocab = list(dict.fromkeys("".join(rng.choice(syll) for _ in range(rng.randint(2, 4))) for _ in range(40_000)))
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    docs = []
    for i in range(n):
        title = " ".join(rng.choices(vocab[500:], k=2)).title() + f" {i}"
        words = rng.choices(vocab, weights=weights, k=rng.randint(40, 120))
        docs.append(Document(f"doc{i}", title, f"{title} is " + " ".join(words) + "."))
    write_jsonl(docs, path)
    return path


@dataclass
class PairedRates:
    """Search tool calls per second made directly and through ``ToolBox.execute``, measured in
    alternating rounds over the same queries: on a shared machine the load changes within a
    run, and pairing lets each round's ratio compare the two paths under the same load."""

    direct: float  # median over rounds, calls/s by wall clock
    toolbox: float
    ratio: float  # median of the per-round ratios toolbox / direct
    ratio_cpu: float  # the same by this process's CPU time (both threads): the cost, without scheduling waits
    rounds: int


@dataclass
class Throughput:
    """Queries per second by wall clock and by this process's CPU time (the fairer figure on a
    shared machine, where other processes take the cores)."""

    wall: float
    cpu: float


def rate(fn, queries: list[str]) -> Throughput:
    wall, cpu = time.perf_counter(), time.process_time()
    for q in queries:
        fn(q)
    return Throughput(len(queries) / (time.perf_counter() - wall), len(queries) / (time.process_time() - cpu))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="auto", help="auto | ovos_wiki | synthetic | path to JSONL")
    ap.add_argument("--queries", type=int, default=2000, help="queries per throughput measurement")
    ap.add_argument("--questions", type=int, default=200, help="search_qa questions for the top-k rates")
    ap.add_argument("--rounds", type=int, default=9, help="paired rounds of 100 tool calls (direct, ToolBox)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agentrl-search-bench-"))
    spec = args.corpus
    if spec == "auto":
        try:
            resolve_corpus("ovos_wiki")
            spec = "ovos_wiki"
        except ModuleNotFoundError:
            spec = "synthetic"
    if spec == "synthetic":
        spec = str(synthetic_corpus(work / "synthetic.jsonl"))
    corpus = resolve_corpus(spec)

    t = time.perf_counter()
    docs = corpus.load()
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    index = SearchIndex.build(docs, work / "bench.fts5.sqlite")
    build_s = time.perf_counter() - t

    env = SearchQAEnv(spec, cache_dir=work)
    tasks = env.tasks("train") + env.tasks("test")
    questions = random.Random(0).sample(tasks, min(args.questions, len(tasks)))
    rng = random.Random(1)
    prompts = [rng.choice(tasks).prompt for _ in range(args.queries)]
    keywords = [" ".join(rng.sample(d.title.split() + d.text.split()[:12], k=3))
                for d in rng.choices(docs, k=args.queries)]
    adversarial = [ADVERSARIAL[i % len(ADVERSARIAL)] for i in range(min(args.queries, 400))]

    search = lambda q: index.search(q, 5)  # noqa: E731
    search(prompts[0])  # warm the page cache once
    backend = LocalBackend(corpus, cache_dir=work)
    tool = search_tool(backend)
    box = ToolBox([tool])
    ctx = box.new_context("bench")

    def direct_calls(qs: list[str]) -> None:
        """The same tool called as a plain function: what the ToolBox path is measured against."""
        for q in qs:
            tool.fn(query=q)

    async def toolbox_calls(qs: list[str]) -> None:
        for q in qs:
            await box.execute("search", {"query": q}, ctx)

    async def paired(qs: list[str], rounds: int) -> PairedRates:
        """Alternate ``rounds`` rounds of each path over the same queries (one event loop)."""
        walls: dict[str, list[float]] = {"direct": [], "toolbox": []}
        cpus: dict[str, list[float]] = {"direct": [], "toolbox": []}
        await toolbox_calls(qs[:20])  # start the worker thread outside the timed rounds
        for r in range(2 * rounds):
            path = ("direct", "toolbox")[(r + r // 2) % 2]  # d t t d d t ...: neither always goes first
            wall, cpu = time.perf_counter(), time.process_time()
            if path == "direct":
                direct_calls(qs)
            else:
                await toolbox_calls(qs)
            walls[path].append(len(qs) / (time.perf_counter() - wall))
            cpus[path].append(len(qs) / max(time.process_time() - cpu, 1e-9))
        return PairedRates(
            direct=statistics.median(walls["direct"]), toolbox=statistics.median(walls["toolbox"]),
            ratio=statistics.median(t / d for d, t in zip(walls["direct"], walls["toolbox"])),
            ratio_cpu=statistics.median(t / d for d, t in zip(cpus["direct"], cpus["toolbox"])),
            rounds=rounds)

    one_sentence = SearchQAEnv(spec, cache_dir=work, clue_sentences=1)
    tasks1 = one_sentence.tasks("train") + one_sentence.tasks("test")
    questions1 = random.Random(0).sample(tasks1, min(args.questions, len(tasks1)))
    figures = {
        "corpus": corpus.name,
        "documents": len(docs),
        "load_s": round(load_s, 3),
        "build_s": round(build_s, 3),
        "index_mb": round(index.path.stat().st_size / 1e6, 1),
        **{f"qps_{name}{suffix}": round(getattr(r, field)) for name, r in
           (("question_prompts", rate(search, prompts)), ("keywords", rate(search, keywords)),
            ("adversarial", rate(search, adversarial)))
           for suffix, field in (("", "wall"), ("_cpu", "cpu"))},
        "tool_calls_per_s_direct": round((calls := asyncio.run(paired(prompts[:100], args.rounds))).direct),
        "tool_calls_per_s_toolbox": round(calls.toolbox),
        "toolbox_over_direct": round(calls.ratio, 2),  # goal (issue 16): >= 0.8
        "toolbox_over_direct_cpu": round(calls.ratio_cpu, 2),
        "tool_call_rounds": calls.rounds,
        "questions": len(questions),
        "gold_top1": round(gold_in_top_k(questions, backend, k=1), 3),
        "gold_top5": round(gold_in_top_k(questions, backend, k=5), 3),
        "gold_top5_clue_only": round(gold_in_top_k(questions, backend, k=5, query="clue"), 3),
        "gold_top5_one_sentence": round(gold_in_top_k(questions1, backend, k=5), 3),
    }
    width = max(map(len, figures))
    for k, v in figures.items():
        print(f"{k:<{width}}  {v}")
    goals_met = figures["build_s"] < 30 and figures["qps_question_prompts_cpu"] >= 500
    print(f"goals (build < 30 s, >= 500 q/s single-threaded on question prompts, CPU time): "
          f"{'met' if goals_met else 'NOT met'}; ToolBox over direct >= 0.8 (issue 16): "
          f"{'met' if figures['toolbox_over_direct'] >= 0.8 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
