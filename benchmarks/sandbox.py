"""Benchmark the python tool's local sandbox.

Reports, per isolation level available here: latency p50/p95 of ``print(1)`` per call in
fresh-process mode and in stateful mode (executor and through a ToolBox), and calls per
second with 8 concurrent callers (async, through the ToolBox, pool size = CPU count); plus a
bare ``python -I -S -c pass`` spawn for reference, and the HumanEval checker's time per check.

    python benchmarks/sandbox.py                 # every level available
    python benchmarks/sandbox.py --levels bwrap --n 200 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time

from agentrl.toolbox import ToolBox
from agentrl.tools.python import python_tool
from agentrl.tools.sandbox import LocalExecutor, SandboxConfig
from agentrl.tools.sandbox.isolation import LEVELS, PYTHON


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs) * 1e3, 2), "p95_ms": round(pct(xs, 0.95) * 1e3, 2)}


def timed(fn, n: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bare_spawn(n: int) -> dict[str, float]:
    return summary(timed(lambda: subprocess.run([PYTHON, "-I", "-S", "-c", "pass"], check=True), n))


def concurrent_calls(mode: str, level: str, callers: int, per_caller: int) -> float:
    tool = python_tool(mode=mode, isolation=level, timeout=10)
    box = ToolBox([tool])

    async def caller(i: int) -> None:
        ctx = box.new_context(f"c{i}")
        for _ in range(per_caller):
            r = await box.execute("python", {"code": "print(1)"}, ctx)
            assert r.content == "1\n", r.content
        await box.close(ctx)

    async def main() -> float:
        if mode == "stateful":  # start the workers first: measure calls, not interpreter starts
            warm = [box.new_context(f"w{i}") for i in range(callers)]
            await asyncio.gather(*[box.execute("python", {"code": "pass"}, c) for c in warm])
            for c in warm:
                await box.close(c)
        t = time.perf_counter()
        await asyncio.gather(*[caller(i) for i in range(callers)])
        return callers * per_caller / (time.perf_counter() - t)

    return asyncio.run(main())


def bench_level(level: str, n: int, callers: int) -> dict[str, object]:
    ex = LocalExecutor(SandboxConfig(isolation=level))  # type: ignore[arg-type]
    ex.run("pass")
    fresh = timed(lambda: ex.run("print(1)"), n)
    with ex.session() as s:
        s.run("pass")
        stateful = timed(lambda: s.run("print(1)"), n * 4)
    box = ToolBox([python_tool(mode="fresh", isolation=level)])
    ctx = box.new_context("b")
    tool_fresh = timed(lambda: asyncio.run(box.execute("python", {"code": "print(1)"}, ctx)), n)
    return {
        "level": level,
        "fresh": summary(fresh),
        "stateful": summary(stateful),
        "tool_fresh": summary(tool_fresh),
        "calls_per_s_fresh_8": round(concurrent_calls("fresh", level, callers, max(4, n // callers)), 1),
        "calls_per_s_stateful_8": round(concurrent_calls("stateful", level, callers, max(20, 4 * n // callers)), 1),
    }


def bench_checker(n: int) -> dict[str, float] | None:
    try:
        from agentrl.envs.code_check import CodeChecker
        from agentrl.envs.humaneval import humaneval_problems
    except ImportError:
        return None
    problems = humaneval_problems()[:n]
    checker = CodeChecker()
    times = []
    for p in problems:
        t = time.perf_counter()
        assert checker.check(p, p.prompt + p.canonical_solution).passed
        times.append(time.perf_counter() - t)
    return summary(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", nargs="*", default=list(LEVELS))
    ap.add_argument("--n", type=int, default=100, help="calls per latency measurement")
    ap.add_argument("--callers", type=int, default=8)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    results: dict[str, object] = {"bare_python_spawn": bare_spawn(args.n), "levels": []}
    for level in args.levels:
        try:
            results["levels"].append(bench_level(level, args.n, args.callers))  # type: ignore[union-attr]
        except RuntimeError as exc:
            print(f"{level}: not available ({str(exc)[:120]}...)")
    results["humaneval_check"] = bench_checker(min(args.n, 40))
    print(f"bare python -I -S spawn: {results['bare_python_spawn']}")
    for r in results["levels"]:  # type: ignore[union-attr]
        print(
            f"{r['level']:8s} fresh {r['fresh']}  stateful {r['stateful']}  tool(fresh) {r['tool_fresh']}  "
            f"{args.callers} callers: fresh {r['calls_per_s_fresh_8']} calls/s, stateful {r['calls_per_s_stateful_8']} calls/s"
        )
    print(f"HumanEval check (canonical, per problem): {results['humaneval_check']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
