"""GPU acceptance check: the GPU paths of agentrl measured in one command (issue 20).

    timeout 540 python benchmarks/gpu_check OUT_DIR          # one GPU, ≤ 8 minutes (470 s budget)
    python benchmarks/gpu_check OUT_DIR --smoke              # CPU, tiny sizes, same code paths

Writes ``OUT_DIR/gpu_check.json`` (every figure, from the dataclasses in ``results.py``),
``OUT_DIR/gpu_check.md`` (a short table) and ``OUT_DIR/logs/<group>.log``. The sections run in
three child processes (``models``, ``policy``, ``arithmetic``), each with the sum of its
sections' budgets as a hard time limit, capped by what is left of the total budget; the report
is rewritten after every group, so whatever ran is on disk even if the command is killed.
Exit status 0 when every section is ``ok``, else 1.

Nothing is installed: agentrl is imported from this working tree (``bootstrap.py``). Large
files (the 1.5B-shaped model, run directories) go to ``--work`` (default: a temporary
directory, removed at the end), never to OUT_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python benchmarks/gpu_check`: sys.path[0] is this folder, whose module names
# (models, profile, ...) must not shadow anything; import the package from its parent instead.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path.pop(0)
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402

from gpu_check.bootstrap import GPU_ABSENT, REPO  # noqa: E402
from gpu_check.profile import PROFILES  # noqa: E402
from gpu_check.results import Meta, Report, SectionResult, from_dict  # noqa: E402
from gpu_check.sections import GROUPS, SECTIONS  # noqa: E402

REPORT_JSON, REPORT_MD = "gpu_check.json", "gpu_check.md"
END_RESERVE_S = 5.0  # kept back from the total budget to write the report


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="sections: " + "; ".join(f"{s.name} ({s.group}): {s.what}" for s in SECTIONS))
    ap.add_argument("out", type=Path, help="folder for gpu_check.json, gpu_check.md and logs/")
    ap.add_argument("--smoke", action="store_true", help="CPU profile: tiny sizes, same code paths")
    ap.add_argument("--work", type=Path, help="folder for models and run directories (default: a temporary one)")
    ap.add_argument("--keep-work", action="store_true", help="do not delete the --work folder at the end")
    ap.add_argument("--only", default="", help="comma-separated section names to run (default: all)")
    ap.add_argument("--hide", default=None,
                    help="comma-separated modules to treat as not installed; default for --smoke: the ones the GPU "
                         f"machine lacks ({','.join(GPU_ABSENT)}), none otherwise")
    ap.add_argument("--child", choices=GROUPS, help=argparse.SUPPRESS)
    ap.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def hidden(args: argparse.Namespace) -> list[str]:
    if args.hide is None:
        return list(GPU_ABSENT) if args.smoke else []
    return [m for m in args.hide.split(",") if m]


def child_main(args: argparse.Namespace) -> int:
    """One group of sections in this process (started by ``run_group_process``)."""
    from gpu_check import bootstrap

    imports = bootstrap.prepare(hidden(args))
    from gpu_check.sections import ChildContext, run_group

    profile = PROFILES["smoke" if args.smoke else "gpu"]
    ctx = ChildContext(profile=profile, work=args.work, imports=imports)
    run_group(args.child, ctx, args.part, set(filter(None, args.only.split(","))))
    return 0


def _git(*cmd: str) -> str:
    try:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_group_process(args: argparse.Namespace, group: str, timeout: float, work: Path) -> list[SectionResult]:
    """Start the child of ``group``, wait at most ``timeout`` s, and read back its sections."""
    part = work / f"part_{group}.json"
    part.unlink(missing_ok=True)
    log_path = args.out / "logs" / f"{group}.log"
    cmd = [sys.executable, str(_HERE), str(args.out), "--child", group, "--part", str(part), "--work", str(work),
           "--only", args.only, "--hide", ",".join(hidden(args))] + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"}
    env.setdefault("AGENTRL_CACHE", str(work / "cache"))  # tiny model and warm start: built here, once
    timed_out = False
    with open(log_path, "w") as log:
        # Its own session: on timeout the whole tree goes (sandboxed tool processes included).
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    done = [from_dict(SectionResult, d) for d in json.loads(part.read_text())] if part.exists() else []
    names = {r.name for r in done}
    tail = log_path.read_text(errors="replace")[-1500:]
    for s in SECTIONS:
        if s.group != group or s.name in names or (args.only and s.name not in args.only.split(",")):
            continue
        budget = PROFILES["smoke" if args.smoke else "gpu"].budgets[s.name]
        if timed_out:
            done.append(SectionResult(s.name, "timeout", 0.0, budget,
                                      error=f"the {group} process passed its {timeout:.0f} s limit and was killed"))
        else:
            done.append(SectionResult(s.name, "failed", 0.0, budget,
                                      error=f"the {group} process exited with status {rc} before this section",
                                      traceback=tail))
    return done


def write_report(report: Report, out: Path) -> None:
    (out / REPORT_JSON).write_text(json.dumps(asdict(report), indent=1, ensure_ascii=False))
    (out / REPORT_MD).write_text(report.markdown(), encoding="utf-8")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    profile = PROFILES["smoke" if args.smoke else "gpu"]
    only = set(filter(None, args.only.split(",")))
    unknown = only - {s.name for s in SECTIONS}
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; known: {[s.name for s in SECTIONS]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report = Report(Meta(command=" ".join([Path(sys.executable).name, *sys.argv]), profile=profile.name,
                         started_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         git_commit=_git("rev-parse", "--short", "HEAD") or "unknown",
                         git_dirty=bool(_git("status", "--porcelain", "--untracked-files=no")),
                         total_budget_s=profile.total_budget_s))
    try:
        for group in GROUPS:
            names = [s.name for s in SECTIONS if s.group == group and (not only or s.name in only)]
            if not names:
                continue
            left = profile.total_budget_s - (time.monotonic() - t0) - END_RESERVE_S
            want = profile.child_startup_s + sum(profile.budgets[n] for n in names)
            if left < profile.child_startup_s:
                report.sections += [SectionResult(n, "skipped", 0.0, profile.budgets[n],
                                                  error="the total time budget is spent") for n in names]
                continue
            print(f"--- group {group}: {', '.join(names)} (limit {min(want, left):.0f} s)", flush=True)
            report.sections += run_group_process(args, group, min(want, left), work)
            report.meta.wall_s = time.monotonic() - t0
            write_report(report, args.out)
    finally:
        report.meta.wall_s = time.monotonic() - t0
        write_report(report, args.out)
        if args.work is None and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    print(report.markdown(), flush=True)
    return 0 if all(s.status == "ok" for s in report.sections) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
