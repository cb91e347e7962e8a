"""Seconds per GRPO step on the tiny model with the python tool, and the TRL peer side by side.

agentrl side: ``agentrl.run.trainer.Trainer`` built from ``examples/arithmetic_ci.yaml`` with
8 prompts x G=8, ``--tool-turns`` tool turns + 1 answer turn of ``--turn-tokens`` sampled
tokens each (``--policy scripted``, the default: real sampling cost, scripted tool calls that
run the real python tool, see ``scripted_turns.py``), or whatever the random tiny model writes
(``--policy free``). Each step runs ``Trainer.train_step`` (rollout, tools, rewards,
advantages, update, rollout JSONL); no eval and no checkpoint. Reported: the median over the
steps after the first (warm-up) of step / rollout (= generate + tools + other) / update
seconds, and the peak RSS (``ru_maxrss``) of the training process. Each run is a fresh
interpreter (as the TRL side is).

``--compare-trl PYTHON`` then runs ``trl_grpo.py`` with that interpreter (a separate virtualenv
holding TRL) on the same model, the same rendered prompts (the tasks of the same steps), G,
learning rate, temperature, torch threads, and as many sampled tokens per step (TRL is
single-turn: ``max_completion_length = min_new_tokens =`` agentrl's sampled tokens per
trajectory). ``--rounds 2`` repeats the pair (agentrl, then TRL, one after the other).

    python benchmarks/train_step.py
    python benchmarks/train_step.py --compare-trl /work/trl-venv/bin/python --rounds 2
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from scripted_turns import ScriptedTurnsEngine, TurnScript, answer_from_tool_output  # noqa: E402

from agentrl.run.config import Config, load_config  # noqa: E402
from agentrl.run.trainer import Trainer  # noqa: E402
from agentrl.types import Message  # noqa: E402

CONFIG = HERE.parent / "examples" / "arithmetic_ci.yaml"
_USER_EXPR = re.compile(r"<\|im_start\|>user\n(.*?)=\?<\|im_end\|>", re.DOTALL)


@dataclass
class StepTiming:
    step_s: float
    rollout_s: float  # whole rollout: generation + tools + template/parse/bookkeeping
    generate_s: float
    tools_s: float
    update_s: float
    sampled_tokens: int
    sequence_tokens: int  # all tokens the update scores (prompt, tool output, template, sampled)

    @property
    def other_s(self) -> float:
        return self.rollout_s - self.generate_s - self.tools_s


@dataclass
class AgentrlResult:
    steps: list[StepTiming]
    peak_rss_mb: float
    tool_calls_per_traj: float
    reward_mean: float
    config: dict = field(default_factory=dict)

    def median(self, key: str) -> float:
        """Median over the steps after the first (the warm-up)."""
        return statistics.median(getattr(s, key) for s in self.steps[1:] or self.steps)


def arithmetic_script(tokenizer, tool_turns: int, turn_tokens: int) -> TurnScript:
    """Each tool turn runs the task's expression in the python tool; the answer copies the
    last tool output, made wrong on an odd coin so that groups carry signal."""

    def call(text: str) -> str:
        exprs = _USER_EXPR.findall(text)
        expr = exprs[-1] if exprs else "1+1"
        return json.dumps({"name": "python", "arguments": {"code": f"print({expr})"}})

    return TurnScript(tokenizer, turn_tokens=turn_tokens, tool_turns=tool_turns, call=call,
                      answer=answer_from_tool_output)


def build_config(args, out_dir: str) -> Config:
    return load_config(CONFIG, [
        f"output_dir={out_dir}", f"train.steps={args.steps}", "train.prompts_per_step=8",
        "algo.num_samples=8", f"rollout.max_turns={args.tool_turns + 1}",
        f"rollout.max_new_tokens={args.turn_tokens}", "rollout.max_total_tokens=2048",
        f"model.num_threads={args.threads}", "eval.at_start=false", "eval.every=0", *args.set,
    ])


class _StatsRecorder:
    """Wraps ``runner.run`` to keep each batch's RolloutStats (generation time is not in metrics)."""

    def __init__(self, runner):
        self.inner = runner.run
        self.stats = []
        runner.run = self

    def __call__(self, *a, **k):
        batch = self.inner(*a, **k)
        self.stats.append(batch.stats)
        return batch


def _swap_tool(trainer: Trainer, size: int | None, fork_server: bool) -> None:
    """Swap the env's python tool for one whose sandbox pool runs ``size`` calls at once
    (None: the library default) and that forks fresh calls from warm servers or not. Same
    tool otherwise."""
    from agentrl.toolbox import ToolBox
    from agentrl.tools.python import python_tool

    box = trainer.runner.toolbox
    tool = python_tool(mode="fresh", max_concurrency=size, fork_server=fork_server)  # the time limit: the ToolBox's default
    trainer.runner.toolbox = ToolBox([tool], tokenizer=box.tokenizer, default_timeout=box.default_timeout,
                                     max_output_tokens=box.max_output_tokens)


def run_agentrl(args, out_dir: str) -> tuple[AgentrlResult, Trainer]:
    cfg = build_config(args, out_dir)
    trainer = Trainer(cfg, log=lambda *_: None)
    if args.tool_concurrency or args.no_fork_server:
        _swap_tool(trainer, args.tool_concurrency or None, fork_server=not args.no_fork_server)
    if args.policy == "scripted":
        script = arithmetic_script(trainer.tokenizer, args.tool_turns, args.turn_tokens)
        trainer.runner.engine = ScriptedTurnsEngine(trainer.engine, script)
    rec = _StatsRecorder(trainer.runner)
    steps, calls, rewards = [], [], []
    for step in range(1, args.steps + 1):
        n0 = len(rec.stats)
        m = trainer.train_step(step)
        batch_stats = rec.stats[n0:]
        steps.append(StepTiming(
            step_s=m["time/step"], rollout_s=m["time/rollout"], tools_s=m["time/tools"],
            generate_s=sum(s.generate_s for s in batch_stats), update_s=m["time/update"],
            sampled_tokens=sum(s.sampled_tokens for s in batch_stats),
            sequence_tokens=_sequence_tokens(trainer, step)))
        calls.append(m["tools/calls_per_traj"])
        rewards.append(m["reward/mean"])
        print(f"  agentrl step {step}: {m['time/step']:.2f} s (rollout {m['time/rollout']:.2f}, "
              f"tools {m['time/tools']:.2f}, update {m['time/update']:.2f}), reward {m['reward/mean']:.2f}, "
              f"tool calls/traj {m['tools/calls_per_traj']:.1f}", flush=True)
    trainer.metrics.close()
    kb_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return AgentrlResult(steps, kb_self / 1024, statistics.mean(calls),
                         statistics.mean(rewards)), trainer


def _sequence_tokens(trainer: Trainer, step: int) -> int:
    from agentrl.types import read_jsonl

    path = trainer.run_dir / "rollouts" / f"step_{step:06d}.jsonl"
    return sum(len(t.token_ids) for t in read_jsonl(str(path))) if path.exists() else 0


def trl_spec(args, trainer: Trainer, completion_tokens: int) -> dict:
    """What the TRL script needs to run the same steps: rendered prompts, answers, budgets."""
    tools = trainer.toolbox.schemas() or None
    prompts, prompt_ids, answers = [], [], []
    for step in range(1, args.steps + 1):
        for task in trainer.sample_tasks(step, trainer.cfg.train.prompts_per_step):
            ids = trainer.chat.encode_prompt([Message("system", trainer.env.system_prompt),
                                              Message("user", task.prompt)], tools)
            prompt_ids.append(ids)
            prompts.append(trainer.tokenizer.decode(ids, skip_special_tokens=False))
            answers.append(task.answer)
    cfg = trainer.cfg
    return {
        "model_dir": trainer.model_path, "prompts": prompts, "prompt_ids": prompt_ids, "answers": answers,
        "num_generations": cfg.algo.num_samples, "prompts_per_step": cfg.train.prompts_per_step,
        "completion_tokens": completion_tokens, "steps": args.steps, "lr": cfg.optim.lr,
        "betas": list(cfg.optim.betas), "weight_decay": cfg.optim.weight_decay,
        "max_grad_norm": cfg.optim.max_grad_norm, "temperature": cfg.rollout.temperature,
        "epsilon": cfg.algo.eps_low, "threads": args.threads, "seed": cfg.seed, "micro_batch": args.trl_batch,
    }


def run_trl(python: str, spec: dict, work: Path) -> dict:
    spec_path, out_path = work / "trl_spec.json", work / "trl_result.json"
    cmd = [python, str(HERE / "trl_grpo.py"), "--spec", str(spec_path), "--out", str(out_path),
           "--output-dir", str(work / "trl_run")]
    proc = subprocess.run(cmd, text=True, capture_output=True)
    for line in proc.stdout.splitlines():
        if line.startswith("  trl"):
            print(line, flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(out_path.read_text())


def print_agentrl(res: AgentrlResult, args) -> None:
    med = res.median
    other = med("other_s")
    print(f"agentrl: median of {max(1, len(res.steps) - 1)} steps after a warm-up, {args.policy} policy, "
          f"torch threads {args.threads}")
    print(f"  {'step s':>7} {'rollout s':>10} {'generate s':>11} {'tools s':>8} {'other s':>8} {'update s':>9} "
          f"{'sampled tok':>12} {'seq tok':>8} {'peak RSS MB':>12}")
    print(f"  {med('step_s'):>7.2f} {med('rollout_s'):>10.2f} {med('generate_s'):>11.2f} {med('tools_s'):>8.2f} "
          f"{other:>8.2f} {med('update_s'):>9.2f} {med('sampled_tokens'):>12.0f} {med('sequence_tokens'):>8.0f} "
          f"{res.peak_rss_mb:>12.0f}")
    print(f"  tool calls per trajectory {res.tool_calls_per_traj:.2f}; reward mean {res.reward_mean:.2f}; "
          f"tools {100 * med('tools_s') / med('step_s'):.0f}% of the step "
          f"({'one interpreter per call' if args.no_fork_server else 'fork server where available'})")


def agentrl_side(args, work: Path) -> None:
    """One agentrl run in this (fresh) process; writes its figures and the TRL spec to ``work``."""
    res, trainer = run_agentrl(args, str(work / "run"))
    per_traj = round(res.median("sampled_tokens") / (trainer.cfg.train.prompts_per_step * trainer.cfg.algo.num_samples))
    (work / "agentrl.json").write_text(json.dumps(asdict(res)))
    (work / "trl_spec.json").write_text(json.dumps(trl_spec(args, trainer, per_traj)))


def run_agentrl_process(argv: list[str], work: Path) -> AgentrlResult:
    """A fresh interpreter per run, like TRL's, so peak RSS and warm-up are measured alike."""
    subprocess.run([sys.executable, __file__, *argv, "--side-agentrl", str(work)], check=True)
    d = json.loads((work / "agentrl.json").read_text())
    d["steps"] = [StepTiming(**s) for s in d["steps"]]
    return AgentrlResult(**d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is a warm-up")
    ap.add_argument("--policy", choices=["scripted", "free"], default="scripted")
    ap.add_argument("--tool-turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=40, help="rollout.max_new_tokens (sampled per turn when scripted)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--tool-concurrency", type=int, default=0,
                    help="python sandbox pool size (0 = the library default, the CPU count)")
    ap.add_argument("--no-fork-server", action="store_true",
                    help="fresh python-tool calls start one interpreter each (fork_server=False), as before the fork server")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra agentrl config override, e.g. --set train.micro_batch_tokens=40000")
    ap.add_argument("--compare-trl", metavar="PYTHON", help="interpreter of a virtualenv with TRL installed")
    ap.add_argument("--trl-batch", type=int, default=64, help="TRL per_device_train_batch_size (64 = no accumulation)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the agentrl (+ TRL) measurement")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--side-agentrl", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side_agentrl:
        agentrl_side(args, Path(args.side_agentrl))
        return
    argv = [a for a in sys.argv[1:]]

    report = {"args": vars(args), "rounds": []}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
            res = run_agentrl_process(argv, Path(tmp))
            print_agentrl(res, args)
            entry = {"agentrl": asdict(res)}
            if args.compare_trl:
                spec = json.loads((Path(tmp) / "trl_spec.json").read_text())
                trl = run_trl(args.compare_trl, spec, Path(tmp))
                ratio = trl["median_step_s"] / res.median("step_s")
                print(f"TRL {trl['trl_version']} (transformers {trl['transformers_version']}), torch threads "
                      f"{trl['threads']}: median step {trl['median_step_s']:.2f} s (generate "
                      f"{trl['median_generate_s']:.2f}, rest {trl['median_step_s'] - trl['median_generate_s']:.2f}), "
                      f"{trl['sampled_tokens_per_step']:.0f} sampled tokens/step "
                      f"({spec['completion_tokens']} per completion), peak RSS {trl['peak_rss_mb']:.0f} MB, "
                      f"prompt {trl['prompt_tokens_mean']:.0f} tokens (agentrl {trl['agentrl_prompt_tokens_mean']:.0f})")
                print(f"speed-up agentrl vs TRL per step: {ratio:.2f}x (goal >= 2); "
                      f"agentrl less its tool time: {trl['median_step_s'] / (res.median('step_s') - res.median('tools_s')):.2f}x",
                      flush=True)
                entry.update(trl=trl, speedup=ratio)
            report["rounds"].append(entry)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
