"""Benchmark the python tool's local sandbox.

Reports, per isolation level available here: latency p50/p95 of ``print(1)`` per call in
fresh mode through the warm fork server (``fork``, the default as root) and with one
interpreter per call (``percall``, ``fork_server=False``), and in stateful mode (executor and
through a ToolBox); calls per second with 8 concurrent callers (async, through the ToolBox,
the default pool); and, where ``perf`` is installed, the CPU time one fresh call costs the
whole machine (trainer + sandbox processes: ``perf stat -e task-clock`` follows every child),
measured as the marginal cost between two runs of different length so start-up is excluded.
Plus a bare ``python -I -S -c pass`` spawn for reference, and the HumanEval checker's time
per check. Every figure comes from one run; compare columns, not runs on a shared machine.

    python benchmarks/sandbox.py                 # every level available
    python benchmarks/sandbox.py --levels bwrap --n 200 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
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


def concurrent_calls(mode: str, level: str, callers: int, per_caller: int, fork_server: bool = True) -> float:
    tool = python_tool(mode=mode, isolation=level, timeout=10, fork_server=fork_server)
    box = ToolBox([tool])

    async def caller(i: int) -> None:
        ctx = box.new_context(f"c{i}")
        for _ in range(per_caller):
            r = await box.execute("python", {"code": "print(1)"}, ctx)
            assert r.content == "1\n", r.content
        await box.close(ctx)

    async def main() -> float:
        # Warm-up round: stateful workers exist, fork servers are started (one per pool slot);
        # then the calls are measured, not the starts.
        warm = [box.new_context(f"w{i}") for i in range(callers)]
        await asyncio.gather(*[box.execute("python", {"code": "pass"}, c) for c in warm])
        for c in warm:
            await box.close(c)
        t = time.perf_counter()
        await asyncio.gather(*[caller(i) for i in range(callers)])
        return callers * per_caller / (time.perf_counter() - t)

    rate = asyncio.run(main())
    tool.executor.close()  # type: ignore[attr-defined]
    return rate


def cpu_ms_per_call(level: str, fork_server: bool, callers: int, calls: int) -> float | None:
    """Marginal CPU milliseconds per fresh call at ``callers`` concurrency, all processes
    counted (``perf stat`` inherits into every child); None without perf."""
    if shutil.which("perf") is None:
        return None
    used = []
    for n in (callers * 2, callers * 2 + calls):
        with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
            cmd = ["perf", "stat", "-x,", "-e", "task-clock", "-o", out.name, sys.executable, __file__,
                   "--burst", level, "1" if fork_server else "0", str(n), str(callers)]
            if subprocess.run(cmd, capture_output=True).returncode != 0:
                return None
            used.append(float(out.read().strip().splitlines()[-1].split(",")[0]))
    return round((used[1] - used[0]) / calls, 2)


def bench_level(level: str, n: int, callers: int) -> dict[str, object]:
    out: dict[str, object] = {"level": level}
    for fork in (True, False):
        ex = LocalExecutor(SandboxConfig(isolation=level, fork_server=fork))  # type: ignore[arg-type]
        ex.run("pass")
        name = "fork" if ex.uses_fork_server else "percall"
        out[f"fresh_{name}"] = summary(timed(lambda: ex.run("print(1)"), n))
        ex.close()
        box = ToolBox([python_tool(mode="fresh", isolation=level, fork_server=fork)])
        ctx = box.new_context("b")
        box.tools["python"].executor.run("pass")  # type: ignore[attr-defined]
        out[f"tool_fresh_{name}"] = summary(timed(lambda: asyncio.run(box.execute("python", {"code": "print(1)"}, ctx)), n))
        box.tools["python"].executor.close()  # type: ignore[attr-defined]
        out[f"calls_per_s_fresh_{name}_{callers}"] = round(concurrent_calls("fresh", level, callers, max(4, n // callers), fork), 1)
        out[f"cpu_ms_per_call_fresh_{name}"] = cpu_ms_per_call(level, fork, callers, max(8 * callers, n))
    ex = LocalExecutor(SandboxConfig(isolation=level))  # type: ignore[arg-type]
    with ex.session() as s:
        s.run("pass")
        out["stateful"] = summary(timed(lambda: s.run("print(1)"), n * 4))
    out[f"calls_per_s_stateful_{callers}"] = round(concurrent_calls("stateful", level, callers, max(20, 4 * n // callers)), 1)
    return out


def burst(level: str, fork_server: bool, calls: int, callers: int) -> None:
    """``--burst``: ``calls`` fresh calls from ``callers`` concurrent callers, then exit (run under perf)."""
    concurrent_calls("fresh", level, callers, max(1, calls // callers), fork_server)


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
    ap.add_argument("--burst", nargs=4, metavar=("LEVEL", "FORK", "CALLS", "CALLERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.burst:
        level, fork, calls, callers = args.burst
        burst(level, fork == "1", int(calls), int(callers))
        return
    results: dict[str, object] = {"bare_python_spawn": bare_spawn(args.n), "levels": []}
    for level in args.levels:
        try:
            results["levels"].append(bench_level(level, args.n, args.callers))  # type: ignore[union-attr]
        except RuntimeError as exc:
            print(f"{level}: not available ({str(exc)[:120]}...)")
    results["humaneval_check"] = bench_checker(min(args.n, 40))
    print(f"bare python -I -S spawn: {results['bare_python_spawn']}")
    for r in results["levels"]:  # type: ignore[union-attr]
        print(f"{r['level']}:")
        for name in ("fork", "percall"):
            if f"fresh_{name}" in r:
                print(f"  fresh ({name:7s}) executor {r[f'fresh_{name}']}  tool {r[f'tool_fresh_{name}']}  "
                      f"{args.callers} callers {r[f'calls_per_s_fresh_{name}_{args.callers}']} calls/s  "
                      f"CPU {r[f'cpu_ms_per_call_fresh_{name}']} ms/call")
        print(f"  stateful          executor {r['stateful']}  {args.callers} callers {r[f'calls_per_s_stateful_{args.callers}']} calls/s")
    print(f"HumanEval check (canonical, per problem): {results['humaneval_check']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
