"""One ``Trainer`` on the Qwen2.5-1.5B-shaped model, shared by the sections of the policy group.

The trainer is built from ``examples/arithmetic_ci.yaml`` with the model swapped for the
Qwen-shaped directory, bf16 through FSDP2 (one rank), gradient checkpointing on, and the
python tool isolated without bubblewrap (the GPU machine has none). Two steps run:

1. ``free``: the random model writes its own text (never a tool call). Its trajectories carry
   the sampler's log-probs μ and, written by the update, the trainer's π_old on the same
   tokens: the data of ``logprob_match``.
2. ``scripted-tools``: ``ScriptedTurnsEngine`` (benchmarks/scripted_turns.py) forces each turn
   to end in a python tool call (the task's expression), then an answer, at the real cost of
   sampling; the tool really runs. This is the timed "full train_step with the python tool",
   and its trajectories have tool and template spans for ``masks_spans``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_check.bootstrap import REPO
from gpu_check.profile import Profile
from gpu_check.results import StepTiming, TrainStepData

CONFIG = REPO / "examples" / "arithmetic_ci.yaml"
_EXPR = re.compile(r"^[0-9+\-*/() ]+$")


@dataclass
class PolicyState:
    """What the policy sections share inside their child process."""

    trainer: object = None  # agentrl.Trainer
    isolation_level: str = ""
    build_s: float = 0.0
    free: list = field(default_factory=list)  # Trajectory, step 1
    scripted: list = field(default_factory=list)  # Trajectory, step 2


def no_bwrap_python_tool():
    """The python tool at the strongest level the GPU machine has: unshare, else rlimits."""
    from agentrl.tools import python_tool

    errors = []
    for level in ("unshare", "rlimits"):
        try:
            return python_tool(mode="fresh", isolation=level)
        except Exception as e:  # noqa: BLE001 - a level that cannot work here raises at construction
            errors.append(f"{level}: {e}")
    raise RuntimeError("no python tool isolation level works here: " + "; ".join(errors))


def use_tool_without_bwrap(trainer) -> str:
    """Swap the environment's python tool for ``no_bwrap_python_tool()``; same ToolBox limits."""
    from agentrl import ToolBox

    box = trainer.runner.toolbox
    tool = no_bwrap_python_tool()
    new = ToolBox([tool], tokenizer=box.tokenizer, default_timeout=box.default_timeout,
                  max_output_tokens=box.max_output_tokens)
    trainer.runner.toolbox = new
    trainer.toolbox = new
    return tool.isolation_level


def build_trainer(profile: Profile, work: Path, model_dir: Path, log) -> tuple[object, str]:
    """The shared trainer and the isolation level of its python tool."""
    from agentrl import Trainer, load_config

    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no model: the setup section did not build it")
    cfg = load_config(CONFIG, [
        f"output_dir={work / 'policy_run'}", f"model.path={model_dir}", f"model.device={profile.device}",
        "parallel.fsdp=true", "parallel.mixed_precision=bf16", "parallel.grad_checkpointing=true",
        f"train.prompts_per_step={profile.policy_prompts}", f"algo.num_samples={profile.policy_samples}",
        f"rollout.max_turns={profile.scripted_tool_turns + 1}", f"rollout.max_new_tokens={profile.free_new_tokens}",
        "rollout.max_total_tokens=2048", f"train.micro_batch_tokens={profile.update_micro_batch_tokens}",
        "eval.at_start=false", "eval.every=0", "train.checkpoint_every=1000", "optim.lr=1e-6",
        "train.skip_zero_advantage=false",  # the log-prob check needs π_old of every attempt
    ])
    trainer = Trainer(cfg, log=log)
    return trainer, use_tool_without_bwrap(trainer)


def arithmetic_script(trainer, turn_tokens: int, tool_turns: int):
    """Forced turns for the arithmetic tasks: ``print(<expression>)`` in the python tool, then an
    answer copying the tool's output, made wrong on an odd coin so that groups carry signal."""
    from agentrl import Message
    from scripted_turns import TurnScript, answer_from_tool_output

    # Qwen2.5's template spells out <tool_call> in its system prompt: count only the calls after it.
    probe = trainer.chat.encode_prompt([Message("system", trainer.env.system_prompt), Message("user", "1+1=?")],
                                       trainer.toolbox.schemas() or None)

    class QwenTurnScript(TurnScript):
        base = 0

        def turn_of(self, prompt: list[int]) -> int:
            return super().turn_of(prompt) - self.base

    def call(text: str) -> str:
        user = text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
        expr = user.strip().removesuffix("=?").strip()
        code = f"print({expr})" if _EXPR.match(expr) else "print(6 * 7)"
        return json.dumps({"name": "python", "arguments": {"code": code}})

    script = QwenTurnScript(trainer.tokenizer, turn_tokens=turn_tokens, tool_turns=tool_turns, call=call,
                            answer=answer_from_tool_output)
    script.base = script.turn_of(probe)  # base is 0 here: the tags the system prompt spells out
    return script


def step_timing(kind: str, m: dict[str, float]) -> StepTiming:
    """The figures of one ``train_step`` metrics dict."""
    return StepTiming(kind=kind, step_s=m["time/step"], rollout_s=m["time/rollout"], tools_s=m["time/tools"],
                      update_s=m["time/update"], trajectories=int(m["train/attempts"]),
                      trained_tokens=int(m["train/tokens"]), tool_calls_per_traj=m["tools/calls_per_traj"],
                      reward_mean=m["reward/mean"], mismatch_abs_max=m["mismatch/abs_max"])


def run_train_step(profile: Profile, work: Path, model_dir: Path, state: PolicyState, log) -> TrainStepData:
    """Build the trainer, then one free step and one step with forced python tool calls."""
    import torch

    from agentrl import read_jsonl
    from gpu_check.engines import runner_engine
    from scripted_turns import ScriptedTurnsEngine

    on_cuda = profile.device.startswith("cuda")
    t0 = time.perf_counter()
    state.trainer, state.isolation_level = build_trainer(profile, work, model_dir, log)
    state.build_s = time.perf_counter() - t0
    trainer = state.trainer
    data = TrainStepData(isolation_level=state.isolation_level, build_s=state.build_s,
                         layout=f"fsdp={trainer.plan.fsdp} {trainer.plan.mixed_precision} "
                                f"grad_ckpt={trainer.plan.grad_checkpointing}")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    rollouts = trainer.run_dir / "rollouts"
    data.steps.append(step_timing("free", trainer.train_step(1)))
    state.free = read_jsonl(str(rollouts / "step_000001.jsonl"))
    script = arithmetic_script(trainer, profile.scripted_turn_tokens, profile.scripted_tool_turns)
    with runner_engine(trainer, ScriptedTurnsEngine(trainer.runner.engine, script)):
        data.steps.append(step_timing("scripted-tools", trainer.train_step(2)))
    state.scripted = read_jsonl(str(rollouts / "step_000002.jsonl"))
    if on_cuda:
        data.peak_gpu_gb = torch.cuda.max_memory_allocated() / 2**30
    return data
