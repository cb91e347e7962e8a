"""The end-of-run summary: what a finished (or stopped) run did, read from its metrics.jsonl.

Printed by ``agentrl train`` when a run ends: held-out accuracy per task family at the first
and last evaluation, the training reward, the groups with signal, tool use, where the time
went, the infrastructure failures (when there were any), the health alarms that fired (the
``alarm/<name>`` keys, agentrl/run/alarms.py), warnings for a run that cannot have learned (no
group with signal, every tool call failing, accuracy that never moved), and the commands to look
further.

    >>> rows = [{"step": 0, "eval/accuracy": 0.0, "eval/accuracy/add": 0.0},
    ...         {"step": 1, "reward/mean": 0.25, "groups/with_signal": 3.0, "tools/calls_per_traj": 0.5,
    ...          "tools/error_rate": 0.0, "time/rollout": 1.0, "time/update": 2.0, "time/step": 3.5},
    ...         {"step": 1, "eval/accuracy": 0.5, "eval/accuracy/add": 0.5}]
    >>> print(summarize(rows, "runs/x"))  # doctest: +NORMALIZE_WHITESPACE
    ── run summary ─────────────────────────────────────────────
     held-out accuracy    step 0 -> step 1
       all                0.000 -> 0.500
       add                0.000 -> 0.500
     training reward      0.250 (step 1) -> 0.250 (step 1)
     groups with signal   3 at step 1, 3 at step 1 (mean 3.0 over 1 steps)
     tool calls/attempt   0.50 -> 0.50  (errors 0% -> 0%)
     time                 3.5 s in 1 steps: rollout 1.0 s, update 2.0 s, other 0.5 s
     next                 agentrl inspect runs/x --step last
                          agentrl inspect runs/x --html runs/x/inspect.html
                          curves: runs/x/plots/curves.png
    ────────────────────────────────────────────────────────────
"""

from __future__ import annotations

from pathlib import Path

from agentrl.run.alarms import ALARMS, SYNC_ALARMS
from agentrl.run.metrics import read_metrics

_RULE = "─" * 60


def run_report(run_dir: Path) -> str:
    """:func:`summarize` of the run directory's metrics.jsonl ('' when it has none)."""
    path = Path(run_dir) / "metrics.jsonl"
    return summarize(read_metrics(path), run_dir) if path.exists() else ""


def summarize(rows: list[dict], run_dir: Path | str) -> str:
    """The summary block of a run's metric rows (one per step, evaluations on their own rows)."""
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "reward/mean" in r]
    lines = ["── run summary " + "─" * 45]
    lines += _accuracy(evals)
    lines += _training(steps)
    lines += [f" {'alarm':<20} {a}" for a in alarms(rows)]
    lines += [f" {'warning':<20} {w}" for w in warnings(evals, steps, run_dir)]
    lines += [f" {'next':<20} agentrl inspect {run_dir} --step last",
              f" {'':<20} agentrl inspect {run_dir} --html {Path(run_dir) / 'inspect.html'}",
              f" {'':<20} curves: {Path(run_dir) / 'plots' / 'curves.png'}", _RULE]
    return "\n".join(lines)


def _accuracy(evals: list[dict]) -> list[str]:
    if not evals:
        return [f" {'held-out accuracy':<20} no evaluation ran (eval.every, eval.at_start)"]
    first, last = evals[0], evals[-1]
    families = sorted(k.removeprefix("eval/accuracy/") for k in last if k.startswith("eval/accuracy/"))
    out = [f" {'held-out accuracy':<20} step {first['step']} -> step {last['step']}",
           f"   {'all':<18} {first['eval/accuracy']:.3f} -> {last['eval/accuracy']:.3f}"]
    for fam in families:
        before = first.get(f"eval/accuracy/{fam}")
        out.append(f"   {fam:<18} {'  -  ' if before is None else f'{before:.3f}'} -> {last[f'eval/accuracy/{fam}']:.3f}")
    return out


def _training(steps: list[dict]) -> list[str]:
    if not steps:
        return [f" {'training':<20} no training step ran"]
    first, last = steps[0], steps[-1]
    signal = [r.get("groups/with_signal", 0.0) for r in steps]
    out = [f" {'training reward':<20} {first['reward/mean']:.3f} (step {first['step']}) -> "
           f"{last['reward/mean']:.3f} (step {last['step']})",
           f" {'groups with signal':<20} {signal[0]:.0f} at step {first['step']}, {signal[-1]:.0f} at step "
           f"{last['step']} (mean {sum(signal) / len(signal):.1f} over {len(steps)} steps)"]
    if "tools/calls_per_traj" in first:
        out.append(f" {'tool calls/attempt':<20} {first['tools/calls_per_traj']:.2f} -> {last['tools/calls_per_traj']:.2f}"
                   f"  (errors {first.get('tools/error_rate', 0):.0%} -> {last.get('tools/error_rate', 0):.0%})")
    out += _infrastructure(steps)
    total = sum(r.get("time/step", 0.0) for r in steps)
    rollout = sum(r.get("time/rollout", 0.0) for r in steps)
    update = sum(r.get("time/update", 0.0) for r in steps)
    out.append(f" {'time':<20} {total:.1f} s in {len(steps)} steps: rollout {rollout:.1f} s, update {update:.1f} s, "
               f"other {max(0.0, total - rollout - update):.1f} s")
    out += _memory(steps)
    return out


def _memory(steps: list[dict]) -> list[str]:
    """The run's peak resident memory, the phase it came in, and what was held
    (agentrl/run/memory.py); nothing for runs written before it was measured.

    >>> _memory([{"memory/peak_gb": 3.0, "memory/peak_update_gb": 3.0, "memory/peak_rollout_gb": 2.0,
    ...           "memory/weights_gb": 0.5, "memory/optimizer_gb": 1.0}])
    [' peak memory          3.00 GB (rollout 2.00, update 3.00); held: weights 0.50, optimizer 1.00 GB']
    """
    rows = [r for r in steps if r.get("memory/peak_gb") is not None]
    if not rows:
        return []
    top = max(rows, key=lambda r: r["memory/peak_gb"])
    phases = ", ".join(f"{p} {max(r.get(f'memory/peak_{p}_gb') or 0.0 for r in rows):.2f}"
                       for p in ("rollout", "update", "eval") if any(f"memory/peak_{p}_gb" in r for r in rows))
    held = ", ".join(f"{k} {top[f'memory/{k}_gb']:.2f}" for k in ("weights", "grads", "optimizer", "frozen",
                                                                "prefix_cache") if top.get(f"memory/{k}_gb"))
    return [f" {'peak memory':<20} {top['memory/peak_gb']:.2f} GB ({phases}); held: {held} GB"]


def _infrastructure(steps: list[dict]) -> list[str]:
    """Infrastructure failures over the run (docs/design.md, "Failures"); nothing when none."""
    failed = sum(r.get("infra/failed", 0.0) for r in steps)
    if not failed:
        return []
    total = {k: sum(r.get(f"infra/{k}", 0.0) for r in steps) for k in ("retried", "excluded", "groups_dropped")}
    causes: dict[str, float] = {}
    for r in steps:
        for k, v in r.items():
            if k.startswith("infra/cause/"):
                causes[k.removeprefix("infra/cause/")] = causes.get(k.removeprefix("infra/cause/"), 0.0) + v
    top = ", ".join(f"{c} {n:.0f}" for c, n in sorted(causes.items(), key=lambda kv: -kv[1])[:4])
    return [f" {'infrastructure':<20} {failed:.0f} failed tries ({top}): {total['retried']:.0f} retried, "
            f"{total['excluded']:.0f} attempts excluded, {total['groups_dropped']:.0f} groups dropped"]


def alarms(rows: list[dict]) -> list[str]:
    """One line per alarm that fired (an ``alarm/<name>`` key in a row), with its steps.

    >>> alarms([{"step": 3, "alarm/no_signal": 1.0}, {"step": 4}, {"step": 9, "alarm/no_signal": 1.0}])
    ['no_signal at steps 3, 9: no group with signal (nothing to learn from); docs/alarms.md']
    """
    steps: dict[str, list[int]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("alarm/") and v:
                steps.setdefault(k.removeprefix("alarm/"), []).append(int(r["step"]))
    return [f"{name} at step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}: "
            f"{ALARMS.get(name) or SYNC_ALARMS.get(name, 'see the console')}; docs/alarms.md" for name, at in steps.items()]


def warnings(evals: list[dict], steps: list[dict], run_dir: Path | str = "RUN") -> list[str]:
    """Signs that a run cannot have learned, each with what to do."""
    out = []
    distilled = any("distill/reverse_kl" in r for r in steps)  # a teacher's signal needs no group
    if steps and not distilled and all(r.get("groups/with_signal", 0.0) == 0 for r in steps):
        out.append("no group had signal in any step: all G attempts of every task got the same reward, so "
                   "GRPO had nothing to learn from (loss 0). A model that never succeeds needs demonstrations "
                   "and a warm start (docs/custom_env.md); one that always succeeds, harder tasks")
    calling = [r for r in steps if r.get("tools/calls_per_traj", 0.0) > 0]
    if calling and all(r.get("tools/error_rate", 0.0) >= 1.0 for r in calling):
        out.append(f"every tool call failed (tools/error_rate 1.0 in every step with calls): look at the "
                   f"observations with agentrl inspect {run_dir} --tool-error")
    if len(evals) >= 2 and all(r["eval/accuracy"] == evals[0]["eval/accuracy"] for r in evals) and steps:
        out.append(f"held-out accuracy never moved from {evals[0]['eval/accuracy']:.3f}")
    return out
