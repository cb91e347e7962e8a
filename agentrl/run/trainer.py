"""The GRPO training loop: sample -> verify -> reinforce, with a run directory you can read.

Example (a 1-step run of the arithmetic example on the tiny model)::

    from agentrl import load_config, train
    cfg = load_config("examples/arithmetic_ci.yaml", ["train.steps=1", "output_dir=/tmp/agentrl-doc"])
    result = train(cfg)
    print(result.run_dir, result.final_eval)

The same config runs on N processes with ``torchrun --nproc_per_node=N -m agentrl train CFG``
(docs/scaling.md): each rank rolls out its share of whole groups, the update is FSDP2-sharded
and equals the single-process update, and rank 0 alone writes the run directory.
"""

from __future__ import annotations

import copy
import os
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from agentrl.algo.objective import Objective
from agentrl.algo.filters import FilterResult
from agentrl.algo.grpo import GroupAdvantages
from agentrl.algo.update import UpdateSettings, UpdateStats, compute_advantages, grpo_update
from agentrl.run.build import build_runtime, make_env, resolve_fused_head, resolve_model_path
from agentrl.run.checkpoint import TrainState, load_checkpoint_state, save_checkpoint
from agentrl.run.collect import collect_step, draw_tasks, step_metrics
from agentrl.run.config import Config, ConfigError, config_to_dict, save_config
from agentrl.run.evaluate import EvalResult, evaluate
from agentrl.rollout.agent_runner import AgentStopError, agent_metrics
from agentrl.run.metrics import MetricsWriter, plot_curves, read_metrics, truncate_metrics
from agentrl.run.optim import build_optimizer
from agentrl.run.producer import RolloutProducer, batch_metrics, describe_async, resolve_async, split_stale, with_lines
from agentrl.scale import distributed as dist
from agentrl.run.checkpoint_dcp import (is_sharded, load_sharded_checkpoint, load_unsharded_into_sharded,
                                          save_sharded_checkpoint)
from agentrl.scale.parallel import describe_plan, resolve_plan
from agentrl.run.rank_merge import StepShard, merge_eval_results, merge_step_shards
from agentrl.run.reference import build_reference, build_teacher, check_distill
from agentrl.run.alarms import AlarmMonitor, AlarmStop
from agentrl.run.allocator import current_allocator
from agentrl.run.canary import WeightCanary
from agentrl.run.retry import InfraStopError, RetryPolicy, stop_on_infra_failures
from agentrl.run.tape import TapeRecorder
from agentrl.run.memory import Holdings, MemoryMeter
from agentrl.run.resume import find_resume_checkpoint
from agentrl.scale.weight_sync import WeightSlots, WeightSync
from agentrl.types import Task, Trajectory, write_jsonl

@dataclass
class TrainResult:
    """What a run did. The evaluations are read back from the run's metrics.jsonl, so a
    resumed run (or one with ``eval.at_start=false``) still reports its first one."""

    run_dir: Path
    steps_done: int
    first_eval: float | None  # held-out accuracy of the run's first evaluation
    final_eval: float | None  # ... and of its last
    first_eval_step: int | None = None
    final_eval_step: int | None = None
    peak_memory_gb: float | None = None  # this process's peak resident set (agentrl.run.memory)

    def summary(self) -> str:
        """One line for the terminal, e.g. ``eval accuracy 0.000 (step 0) -> 1.000 (step 30)``
        (the peak memory is in the run summary block and in ``peak_memory_gb``)."""
        if self.first_eval is None or self.final_eval is None:
            return "no evaluation ran (set eval.every or eval.at_start=true)"
        return (f"eval accuracy {self.first_eval:.3f} (step {self.first_eval_step}) -> "
                f"{self.final_eval:.3f} (step {self.final_eval_step})")


class Trainer:
    """Owns the model, engine, environment and run directory of one training run."""

    def __init__(self, cfg: Config, *, log=print, start_from: Path | None = None):
        """``start_from``: a checkpoint to start from instead of the run's own (``agentrl replay``)."""
        self._init_process(cfg, log)
        ckpt = start_from if start_from is not None else self._find_checkpoint()
        self._build_policy(ckpt)
        self._build_reference(ckpt)
        self._load_tasks()
        self._build_optimizer()
        if ckpt is not None:
            self._restore(ckpt)
        self._open_run_dir()
        dist.barrier()

    # -- the phases of __init__, in order ---------------------------------------------------

    def _init_process(self, cfg: Config, log) -> None:
        """Resolve the config, lay out the ranks, seed, build the environment."""
        world = int(os.environ.get("WORLD_SIZE", "") or 1)
        # max_staleness > 0: checked, and the IS weight defaulted to token level; 0: cfg untouched
        cfg, self._is_defaulted = resolve_async(cfg, world)
        self.cfg = cfg
        self.objective = Objective.from_config(cfg)  # what the update optimizes and the run prints
        self._teacher_note = check_distill(cfg)  # algo.distill without a teacher: refused before anything loads
        self.producer: RolloutProducer | None = None  # the rollout thread (max_staleness > 0)
        # True when that thread drives the trainer's own engine (vLLM: one engine per process)
        self._producer_owns_engine = False
        self.version = 0  # the trainer's policy version: optimizer steps taken
        self.plan = resolve_plan(cfg.parallel, cfg.lora, world, cfg.model.device)
        self._own_group = self.plan.fsdp and not dist.is_initialized()
        self.dist = dist.init_distributed(cfg.model.device, single_rank_group=self.plan.fsdp)
        self.main = self.dist.is_main
        self.log = log if self.main else (lambda *a, **k: None)
        self.sharded_ckpt = self.plan.fsdp or self.plan.lora  # torch.distributed.checkpoint format
        self.run_dir = cfg.run_dir
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.env = make_env(cfg)
        self.state = TrainState(step=0, policy_version=0)
        self.memory = MemoryMeter()  # peak resident memory per phase (agentrl.run.memory)

    def _find_checkpoint(self) -> Path | None:
        """The checkpoint to resume from (``resume=true``: only agentrl.run.resume.RESUMABLE
        settings may differ from the run's saved config); refuses to overwrite a run's checkpoints."""
        return find_resume_checkpoint(self.cfg, self.log, self.main)

    def _build_policy(self, ckpt: Path | None) -> None:
        """Policy, tokenizer, engine, chat template, tools, rollout runner and weight sync."""
        # A checkpoint's model/ holds the full policy (LoRA merged); a sharded one's dcp/ then
        # overwrites every parameter, adapters and base weights included.
        self.model_path = str(ckpt / "model") if ckpt else self._base_model_path()
        rt = build_runtime(self.cfg, self.env, self.model_path, self.plan, self.dist.device)
        self.model, self.tokenizer, self.engine = rt.model, rt.tokenizer, rt.engine
        self.chat, self.toolbox, self.runner = rt.chat, rt.toolbox, rt.runner
        caps = self.engine.capabilities
        # The engine can take the trainer's module as is: it reads its tensors (HF), or it
        # streams plain (non-LoRA) weights in itself; FSDP shards and LoRA adapters need export.
        self.sync = WeightSync(self.engine, rt.sampler,
                               shared=not self.plan.fsdp and (caps.shares_trainer_weights or not self.plan.lora))

    def _build_reference(self, ckpt: Path | None) -> None:
        """The frozen models the update scores (agentrl.run.reference): the KL term's reference, the
        policy at step 0 (None when β = 0), and the distillation teacher (None without algo.distill)."""
        base = self._base_model_path if ckpt else (lambda: self.model_path)
        self.ref_model = build_reference(self.objective, self.plan, self.model, base, self.dist.device)
        self.teacher_model = build_teacher(self.cfg, self.plan, self.tokenizer, self.model, self.dist.device,
                                           self.main, self.log)
        if self._teacher_note:
            self.log(self._teacher_note)

    def _load_tasks(self) -> None:
        self.train_tasks: list[Task] = self.env.tasks("train")
        self.test_tasks: list[Task] = self.env.tasks("test")[: self.cfg.eval.num_tasks]
        self.tasks_by_id = {t.id: t for t in self.train_tasks}
        self.test_by_id = {t.id: t for t in self.test_tasks}

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        self.optimizer, self.scheduler = build_optimizer(cfg, self.model)
        self.update_settings = UpdateSettings(
            micro_batch_tokens=cfg.train.micro_batch_tokens, num_iterations=cfg.train.num_iterations,
            max_grad_norm=cfg.optim.max_grad_norm, pad_id=self.tokenizer.pad_token_id, device=self.dist.device,
            skip_zero_advantage=cfg.train.skip_zero_advantage, autocast=cfg.train.autocast,
            share_prefix=cfg.train.share_prefix, fused_head=resolve_fused_head(cfg.train.fused_head, self.model))
        if cfg.train.share_prefix and (self.dist.world_size > 1 or self.plan.grad_checkpointing):
            raise ConfigError("train.share_prefix runs two forwards per micro-batch (the prompt, then the rest), "
                              "which FSDP ranks and gradient checkpointing cannot follow; set train.share_prefix=false")

    def _restore(self, ckpt: Path) -> None:
        """Optimizer, scheduler, RNG and step from ``ckpt``, in whichever format it was written."""
        if is_sharded(ckpt):
            self.state = load_sharded_checkpoint(ckpt, self.model, self.optimizer, self.scheduler,
                                                 lora=self.plan.lora)
        elif self.sharded_ckpt:
            self.state = load_unsharded_into_sharded(ckpt, self.model, self.optimizer, self.scheduler)
        else:
            self.state = load_checkpoint_state(ckpt, self.optimizer, self.scheduler)
        self.engine.policy_version = self.version = self.state.policy_version
        if self.main:
            self._drop_after(self.state.step)
        self.log(f"resumed from {ckpt} (step {self.state.step})")

    def _open_run_dir(self) -> None:
        """Rank 0 writes config.yaml and the tokenizer, and opens the metrics writer."""
        self.metrics = None
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "rollouts").mkdir(exist_ok=True)
            save_config(self.cfg, self.run_dir / "config.yaml")
            self.tokenizer.save_pretrained(self.run_dir / "tokenizer")  # lets `agentrl inspect` decode ids
            self.metrics = MetricsWriter(self.run_dir)
        # health alarms (docs/alarms.md): their history starts from metrics.jsonl, so a resumed
        # run does not fire again what was already firing
        self.alarms = AlarmMonitor(self.cfg.alarms, self.log, self.run_dir / "metrics.jsonl")
        self.canary = WeightCanary.for_trainer(self)  # does the engine sample the trainer's weights?
        self.canary.baseline(self.model)  # engine and trainer hold the same weights here
        self.step_trajectories: list[Trajectory] = []  # the last step's, merged: alarms quote them
        # the step tape (agentrl/run/tape.py): what `agentrl replay` needs besides the rollouts
        self.tape = TapeRecorder(self.cfg, self.tokenizer, self.chat, self.train_tasks) if self.cfg.train.tape else None
        if self.tape is not None:
            self.tape.attach(self.toolbox)

    def _base_model_path(self) -> str:
        """The step-0 policy; rank 0 builds any cached artifact (tiny model, warm start) first."""
        if self.main:
            path = resolve_model_path(self.cfg, self.env)
        dist.barrier()
        if not self.main:
            path = resolve_model_path(self.cfg, self.env)
        return path

    # -- bookkeeping ----------------------------------------------------------------------

    def _drop_after(self, step: int) -> None:
        """Forget what a killed run wrote after its last checkpoint."""
        truncate_metrics(self.run_dir / "metrics.jsonl", step)
        for p in [*(self.run_dir / "rollouts").glob("*step_*.jsonl"), *(self.run_dir / "tape").glob("step_*.json")]:
            if int(p.stem.rsplit("_", 1)[1]) > step:
                p.unlink()

    def _checkpoint(self) -> Path:
        import yaml

        text = yaml.safe_dump(config_to_dict(self.cfg), sort_keys=False)
        if self.sharded_ckpt:
            return save_sharded_checkpoint(self.run_dir, self.state, self.model, self.tokenizer, self.optimizer,
                                           self.scheduler, text, lora=self.plan.lora,
                                           keep=self.cfg.train.keep_checkpoints,
                                           export_dtype=self.plan.compute_dtype)
        return save_checkpoint(self.run_dir, self.state, self.model, self.tokenizer, self.optimizer,
                               self.scheduler, text, keep=self.cfg.train.keep_checkpoints)

    # -- phases ---------------------------------------------------------------------------

    def sample_tasks(self, step: int, n: int, draw: int = 0) -> list[Task]:
        """The ``n`` training prompts of ``step`` (``agentrl.run.collect.draw_tasks``)."""
        return draw_tasks(self.train_tasks, self.cfg.seed, step, n, draw)

    def collect(self, step: int, runner=None) -> tuple[list[Trajectory], dict[str, float]]:
        """The step's scored rollouts on this rank (``agentrl.run.collect.collect_step``).
        ``runner``: the rollout thread's own (asynchronous rollouts); default the trainer's."""
        return collect_step(self.cfg, self.env, self.train_tasks, self.tasks_by_id, runner or self.runner, step,
                            self.dist.rank, self.dist.world_size)

    def run_eval(self, step: int) -> EvalResult | None:
        """Each rank evaluates its slice of the held-out tasks; the merged result on rank 0 (None elsewhere)."""
        e = self.cfg.eval
        mine = dist.shard_whole_groups(self.test_tasks, self.dist.rank, self.dist.world_size)
        retry = RetryPolicy(self.cfg.rollout.infra_retries, self.cfg.rollout.infra_backoff_s)
        res = evaluate(self.runner, self.env, mine, greedy=e.greedy, pass_k=e.pass_k,
                       seed=self.cfg.seed + 17, retry=retry) if mine else EvalResult(0.0, {})
        parts = dist.gather_to_main(res)
        if parts is None:
            return None
        res = merge_eval_results(parts, self.test_by_id)
        write_jsonl(str(self.run_dir / "rollouts" / f"eval_step_{step:06d}.jsonl"), res.trajectories)
        return res

    def _write_rollouts(self, step: int, trajs: list[Trajectory]) -> None:
        if self.cfg.train.log_rollouts:
            write_jsonl(str(self.run_dir / "rollouts" / f"step_{step:06d}.jsonl"), trajs)

    def train_step(self, step: int) -> dict[str, float]:
        """One step on every rank; the metrics of the whole step on rank 0 ({} elsewhere)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        extra: dict[str, float] = {}
        if self.producer is None:  # synchronous: sample with the current weights, then update
            with self.memory.phase("rollout"):
                trajs, timing = self.collect(step)
            waited = time.perf_counter() - t0
        else:  # the rollout thread sampled this batch ahead; drop what the bound forbids
            batch, waited = self.producer.next_batch(step)
            split = split_stale(batch.trajectories, self.version, cfg.train.max_staleness)
            trajs, timing = split.kept, batch.timing
            extra = batch_metrics(batch, split, cfg.train.max_staleness)
        if not self._producer_owns_engine:
            # vLLM with enable_sleep_mode frees its GPU memory; the HF engine, its bf16 copies
            self.engine.sleep()
        stop_on_infra_failures(trajs, cfg.train.max_infra_fail_frac, step,
                               lambda all_trajs: self._write_rollouts(step, all_trajs))
        t1 = time.perf_counter()
        with self.memory.phase("update"):
            adv, filt, st = self.update(trajs)
        t_update = time.perf_counter() - t1
        if not self._producer_owns_engine:  # the weight_sync alarm's figures (agentrl/run/canary.py)
            extra.update(self.canary.after_sync(self.model))
        if self.producer is not None:  # the rollout thread takes these weights at its next batch
            extra["async/weight_copy_s"] = self.producer.publish(self.model, self.version)
        if self.tape is not None:  # one version sampled the whole batch (async runs too)
            extra.update(self.tape.step_done(step, trajs[0].policy_version if trajs else self.version - 1,
                                             int(timing["batch/draws"]), st.loss, st.grad_norm,
                                             self.scheduler.get_last_lr()[0], self.model))
        shards = dist.gather_to_main(StepShard(
            trajectories=trajs, zero_variance_groups=int(adv.zero_variance.sum()), groups=len(adv.zero_variance),
            dropped_zero_variance=filt.dropped_zero_variance, masked_truncated=filt.masked_truncated,
            dropped_void=filt.dropped_void, time_rollout=timing["time/rollout"], time_tools=timing["time/tools"],
            draws=int(timing["batch/draws"]), excluded_infra=filt.excluded_infra,
            dropped_infra_groups=filt.dropped_infra_groups))
        if shards is None:
            return {}
        shard = merge_step_shards(shards)
        self.step_trajectories = shard.trajectories
        self._write_rollouts(step, shard.trajectories)
        m = step_metrics(shard, st, self.scheduler.get_last_lr()[0], self.version)
        m.update({"time/rollout": shard.time_rollout, "time/tools": shard.time_tools,
                  "batch/draws": float(shard.draws), "time/update": t_update})
        m.update(extra)
        m.update(agent_metrics(shard.trajectories))  # agents written against the OpenAI API
        m["time/step"] = time.perf_counter() - t0
        # the trainer idled waiting for data: the whole rollout when synchronous
        m["time/trainer_wait"] = waited
        m["time/trainer_wait_frac"] = waited / m["time/step"]
        return m

    def update(self, trajs: list[Trajectory]) -> tuple[GroupAdvantages, FilterResult, UpdateStats]:
        """Advantages, the objective's filters, one optimizer step on this rank's ``trajs``
        (whole groups); then the engine samples the new weights and the version goes up."""
        adv, filt = compute_advantages(trajs, self.objective)
        keep = filt.keep.tolist()
        for t, k in zip(trajs, keep):
            if not k and t.failure is None:
                t.trained.filtered = True
        st = grpo_update(self.model, self.optimizer, self.scheduler, trajs, keep, self.objective,
                         self.update_settings, ref_model=self.ref_model, teacher_model=self.teacher_model)
        if self._producer_owns_engine:  # the rollout thread pushes published weights itself
            self.version += 1
        else:
            self.sync(self.model)
            self.version = self.engine.policy_version
        return adv, filt, st

    # -- the loop -------------------------------------------------------------------------

    def _make_producer(self, first_step: int) -> RolloutProducer:
        """The rollout thread of ``max_staleness > 0``: its own model (two weight slots, in the
        trainer's compute dtype), tokenizer, template, tools and runner. It never reads the
        trainer's parameters; ``publish`` copies them after each optimizer step."""
        version = self.version
        if self.engine.capabilities.shares_trainer_weights:
            rt = build_runtime(self.cfg, self.env, self.model_path, None, self.dist.device)
            rt.model.to(self.plan.compute_dtype)
            slots = WeightSlots(rt.model, copy.deepcopy(rt.model), self.model, version=version)
            runner = rt.runner
            if self.tape is not None:  # its calls are the step's data too
                self.tape.attach(rt.toolbox)
        else:  # vLLM: one engine per process, driven by the rollout thread; slots in host memory
            if not self.plan.plain:
                raise ConfigError("train.max_staleness > 0 with an engine that keeps its own weights (vLLM) needs "
                                  "full fine-tuning in one process (no FSDP, LoRA or gradient checkpointing); "
                                  "set train.max_staleness=0")
            first, second = (copy.deepcopy(self.model).to("cpu").requires_grad_(False) for _ in range(2))
            slots = WeightSlots(first, second, self.model, version=version)
            runner, self._producer_owns_engine = self.runner, True
        return RolloutProducer(self.collect, runner, slots, first_step=first_step, last_step=self.cfg.train.steps,
                               start_version=version, max_staleness=self.cfg.train.max_staleness)

    @contextmanager
    def _engine_for_eval(self):
        """Evaluation samples the trainer's current weights. When the rollout thread drives the
        trainer's own engine (vLLM), it is held between batches and the weights pushed in; it
        pushes its own slot back at its next batch."""
        if self.producer is None or not self._producer_owns_engine:
            yield
            return
        with self.producer.paused():
            self.sync(self.model)
            yield

    def train(self) -> TrainResult:
        cfg = self.cfg
        self.log(with_lines(self.objective.describe(), describe_async(cfg, self._is_defaulted)))
        self.log(f"layout: {describe_plan(self.plan, self.dist.world_size)}; allocator: {current_allocator()}")
        iso = {t.isolation_level for t in self.runner.toolbox.tools.values()} - {None}
        if iso:
            from agentrl.tools.sandbox.isolation import describe_level  # what each level means

            self.log("tool isolation: " + "; ".join(describe_level(level) for level in sorted(iso)))
        final = None
        start = self.state.step + 1
        if start == 1 and cfg.eval.at_start:
            res = self.run_eval(0)
            if res is not None:
                self.metrics.log(0, res.metrics())
                self.log(f"step 0 eval/accuracy={res.accuracy:.3f} "
                         + " ".join(f"{k}={v:.2f}" for k, v in sorted(res.by_family.items())))
        bar = tqdm(range(start, cfg.train.steps + 1), desc="GRPO", unit="step", dynamic_ncols=True,
                   initial=start - 1, total=cfg.train.steps, disable=not self.main)
        if cfg.train.max_staleness > 0 and start <= cfg.train.steps:
            self.producer = self._make_producer(start)  # a resumed run starts with an empty queue
            self.producer.start()
        try:
            for step in bar:
                m = self.train_step(step)
                self.state = TrainState(step=step, policy_version=self.version)
                is_last = step == cfg.train.steps
                if (cfg.eval.every and step % cfg.eval.every == 0) or is_last:
                    with self._engine_for_eval(), self.memory.phase("eval"):
                        res = self.run_eval(step)
                    if res is not None:
                        m.update(res.metrics())
                        final = res.accuracy
                fired = []
                if self.main:
                    m.update(self.memory.step_metrics(self._holdings()))
                    fired = self.alarms.step(step, m, self.step_trajectories)
                    self.metrics.log(step, m)
                    bar.set_postfix(reward=f"{m['reward/mean']:.2f}", step_s=f"{m['time/step']:.1f}",
                                    **({"eval": f"{final:.2f}"} if final is not None else {}))
                self.alarms.stop_if_asked(dist.broadcast_from_main(fired))  # alarms.on_alarm=stop
                if step % max(1, cfg.train.checkpoint_every) == 0 or is_last:
                    self._checkpoint()
                if self.main:
                    plot_curves(self.run_dir / "metrics.jsonl", self.run_dir / "plots" / "curves.png", cfg.name)
        except (InfraStopError, AgentStopError):  # the step changed nothing: its start is a clean resume point
            if self.dist.world_size == 1 and self.state.step > 0:
                self._checkpoint()
            raise
        except AlarmStop:  # every rank stops at the same step (the decision is broadcast)
            if self.state.step > 0:
                self._checkpoint()
            raise
        except KeyboardInterrupt:
            if self.dist.world_size > 1:  # ranks stop at different points: a collective save could hang
                self.log(f"interrupted: resume from the last checkpoint (step {self.state.step} was not saved)")
            else:
                self.log(f"interrupted: saving a checkpoint of step {self.state.step}")
                if self.state.step > 0:
                    self._checkpoint()
            raise
        finally:
            if self.producer is not None:
                if not self.producer.stop():
                    self.log("the rollout thread is still finishing its batch; left to end with the process")
                elif self.producer.runner.toolbox is not self.toolbox:
                    self.producer.runner.toolbox.shutdown()
                self.producer = None
            bar.close()
            if self.metrics is not None:
                self.metrics.close()
            self.toolbox.shutdown()  # tool processes the run started (MCP servers)
        evals = dist.broadcast_from_main(self._evaluations() if self.main else [])
        if self._own_group:
            dist.shutdown()
        (s0, first), (s1, final) = (evals[0], evals[-1]) if evals else ((None, None), (None, None))
        self.log(self.memory.summary(self._holdings()))
        return TrainResult(self.run_dir, self.state.step, first, final, s0, s1, self.memory.run_peak / 1e9)

    def _holdings(self) -> Holdings:
        """What the run holds between phases (agentrl.run.memory)."""
        frozen = [self.ref_model, self.teacher_model, getattr(self.engine, "model", None)]
        return Holdings.of(self.model, self.optimizer, frozen, self.engine)

    def _evaluations(self) -> list[tuple[int, float]]:
        """(step, held-out accuracy) of every evaluation in the run directory, this session's
        and those before a resume."""
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        return [(int(r["step"]), float(r["eval/accuracy"])) for r in rows
                if r.get("eval/accuracy") is not None and int(r["step"]) <= self.state.step]


def train(cfg: Config) -> TrainResult:
    """Build everything from ``cfg`` and train; returns where the run was written."""
    return Trainer(cfg).train()

