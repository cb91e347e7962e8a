"""``agentrl replay RUN --step N``: re-run a recorded step and say where it differs, if anywhere.

From the run's checkpoint at or before the policy that sampled step N (or its step-0 policy),
the replay rolls forward with *update replays* of the steps in between (each step's update
recomputed from its recorded trajectories: advantages, filters, the optimizer step), checking
each step's parameter digest against the tape. Then:

- **rollout replay**: step N's rollouts run again under the policy version that sampled them
  (``tape.sampled_under``; an asynchronous run's is older than N - 1), with the same seeds and
  batch composition, every tool call served from the tape (``--live-tools``: run again, and
  compared with the tape), the checker run again. Each attempt's token ids, sampler log-probs,
  mask, finish reason, tool calls and reward are compared with ``rollouts/step_N.jsonl``;
- **update replay**: step N's update recomputed from its recorded trajectories: loss, gradient
  norm and the parameter digest compared with the tape.

The first divergence of each attempt is reported: the token (position, kind, turn, recorded
vs replayed id, text and μ) or the tool call. What is guaranteed (docs/replay.md): on CPU, in one
process, with the run's thread count, the update replay is bit-exact, and so is the rollout
replay of the lock-step loop and of the per-attempt loop (the HF engine decodes each attempt's
rows with batch-invariant kernels on CPU; the report says so when it is not).

Example::

    from agentrl.run.replay import replay_step
    report = replay_step("runs/arithmetic-tiny", 12)            # doctest: +SKIP
    print(report.describe()); assert report.ok
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.run.checkpoint import list_checkpoints
from agentrl.scale import distributed as dist
from agentrl.run.config import ConfigError, load_config
from agentrl.run.tape import StepTape, UpdateRecord, config_text, params_digest, read_step_tape, run_hashes
from agentrl.toolbox.tape import CallDivergence, ToolTape
from agentrl.types import Trajectory, TrainerMarks, read_jsonl

# The per-attempt loop's sampler log-probs may differ from the recording's by float rounding:
# the continuous batcher groups attempts into decode batches by timing, and a CPU matmul's
# rounding depends on the batch's shape (docs/replay.md: measured max |Δμ| 5.7e-6 tiny, 1.5e-5 SmolLM2).
ATTEMPT_LOOP_TOL = 1e-4


@dataclass
class UpdateCheck:
    """One step's update, recomputed from its recorded trajectories, against the tape."""

    step: int
    recorded: UpdateRecord
    loss: float
    grad_norm: float
    params: str  # the digest after the replayed step (this rank's)
    rank: int = 0  # loss and grad norm are the whole step's; the digest is this rank's shard

    @property
    def equal(self) -> bool:
        return (self.loss == self.recorded.loss and self.grad_norm == self.recorded.grad_norm
                and self.params == self.recorded.params[self.rank])

    def describe(self) -> str:
        r = self.recorded
        mark = "equal" if self.equal else "DIFFERS"
        return (f"update of step {self.step}: {mark}  loss {r.loss!r} -> {self.loss!r}, grad norm "
                f"{r.grad_norm!r} -> {self.grad_norm!r}, parameters {r.params[self.rank]} -> {self.params}")


@dataclass
class AttemptDivergence:
    """The first place one attempt's replay differs from its recording."""

    group_id: str
    sample_index: int
    what: str  # "token", "logprob", "mask", "length", "finish_reason", "tool_call", "reward", "missing"
    position: int | None = None  # token index, where the difference is in the tokens
    kind: str | None = None  # the span kind there: model, tool, template, prompt
    turn: int | None = None  # the model turn (0-based) the position falls in
    recorded: str = ""
    replayed: str = ""

    def describe(self) -> str:
        where = f" at token {self.position} ({self.kind}, turn {self.turn})" if self.position is not None else ""
        return (f"attempt {self.group_id}/{self.sample_index}: {self.what} differs{where}\n"
                f"  recorded: {self.recorded}\n  replayed: {self.replayed}")


@dataclass
class RolloutCheck:
    """Step N's rollouts, run again, against the recorded ones."""

    step: int
    attempts: int  # recorded attempts compared
    equal: int  # of those, identical in every compared field
    sampled_under: int
    loop: str  # "attempt" or "lockstep"
    calls_served: int  # tool calls answered from the tape (0 with --live-tools)
    logprob_tol: float = 0.0  # |Δμ| allowed: 0 in the lock-step loop, ATTEMPT_LOOP_TOL in the per-attempt loop
    bit_exact: int = 0  # attempts whose log-probs are bit-equal too
    max_logprob_diff: float = 0.0  # max |Δμ| over the attempts whose token ids are equal
    divergences: list[AttemptDivergence] = field(default_factory=list)
    call_divergences: list[CallDivergence] = field(default_factory=list)
    extra: int = 0  # replayed attempts the recording does not hold (an async run's dropped stale ones)

    @property
    def ok(self) -> bool:
        return self.equal == self.attempts and not self.call_divergences

    def describe(self) -> str:
        tol = "bit-exact" if self.logprob_tol == 0 else f"within {self.logprob_tol:g}"
        lines = [f"rollout of step {self.step}: {self.equal}/{self.attempts} attempts identical "
                 f"(token ids, masks, tool calls and rewards equal, log-probs {tol}; {self.loop} loop, policy "
                 f"version {self.sampled_under}, {self.calls_served} tool calls served from the tape); "
                 f"{self.bit_exact} bit-exact, max |Δμ| {self.max_logprob_diff:.2e}"]
        lines += [d.describe() for d in self.divergences[:5]]
        if len(self.divergences) > 5:
            lines.append(f"... and {len(self.divergences) - 5} more attempts differ")
        lines += [d.describe() for d in self.call_divergences[:5]]
        return "\n".join(lines)


@dataclass
class ReplayReport:
    """One rank's replay (``ranks``: the other ranks' own, on rank 0 of a torchrun replay)."""

    step: int
    start: str  # the checkpoint the replay started from, or "step 0 (the base policy)"
    forward: list[UpdateCheck] = field(default_factory=list)  # update replays of the steps rolled forward
    rollout: RolloutCheck | None = None
    update: UpdateCheck | None = None
    notes: list[str] = field(default_factory=list)
    rank: int = 0
    ranks: list["ReplayReport"] = field(default_factory=list)
    every_rank_ok: bool | None = None  # set by the replay: the verdict of all ranks together

    @property
    def ok(self) -> bool:
        if self.every_rank_ok is not None:
            return self.every_rank_ok
        return (all(u.equal for u in self.forward) and (self.rollout is None or self.rollout.ok)
                and (self.update is None or self.update.equal) and all(r.ok for r in self.ranks))

    def describe(self) -> str:
        lines = [self._describe()]
        lines += [f"-- rank {r.rank} --\n{r._describe()}" for r in self.ranks]
        lines.append("replay: identical" if self.ok else "replay: DIVERGED")
        return "\n".join(lines)

    def _describe(self) -> str:
        lines = [f"replay of step {self.step} from {self.start}" + (f" (rank {self.rank})" if self.rank else ""),
                 *self.notes]
        bad = [u for u in self.forward if not u.equal]
        if self.forward:
            lines.append(f"rolled forward {len(self.forward)} steps by update replay: "
                         + ("every parameter digest equal" if not bad else bad[0].describe()))
        if self.rollout is not None:
            lines.append(self.rollout.describe())
        if self.update is not None:
            lines.append(self.update.describe())
        return "\n".join(lines)


def replay_step(run_dir: str | Path, step: int, *, live_tools: bool = False, rollout: bool = True,
                update: bool = True, log=print) -> ReplayReport:
    """Replay step ``step`` of the run in ``run_dir`` (module docstring)."""
    run_dir = Path(run_dir)
    tape = read_step_tape(run_dir, step)
    world = int(os.environ.get("WORLD_SIZE", "") or 1)
    if tape.world_size != world:
        raise ConfigError(f"step {step} ran on {tape.world_size} rank(s), this replay on {world}: each rank replays "
                          f"its own shard, so run `torchrun --nproc_per_node={tape.world_size} -m agentrl replay "
                          f"{run_dir} --step {step}`" if tape.world_size > 1 else
                          f"step {step} ran in one process: replay it without torchrun")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    recorded_cfg = load_config(str(saved), [])
    # the replay's own run directory, the same on every rank (rank 0 writes it), removed after
    scratch = Path(tempfile.gettempdir()) / f"agentrl-replay-{os.environ.get('TORCHELASTIC_RUN_ID') or os.getpid()}"
    try:
        return _replay(run_dir, step, tape, recorded_cfg, scratch, live_tools, rollout, update, log)
    finally:
        if int(os.environ.get("RANK", "") or 0) == 0:
            shutil.rmtree(scratch, ignore_errors=True)


def _replay(run_dir: Path, step: int, tape: StepTape, recorded_cfg, scratch: Path, live_tools: bool, rollout: bool,
            update: bool, log) -> ReplayReport:
    from agentrl.rollout.agent_runner import AgentRunner
    from agentrl.run.trainer import Trainer

    cfg = load_config(str(run_dir / "config.yaml"), [f"output_dir={scratch / 'run'}", "resume=false",
                                                      "train.tape=false", "eval.at_start=false"])
    target = tape.sampled_under  # the rollout's policy; the update's is step - 1
    start_step, ckpt = 0, None
    for s, path in list_checkpoints(run_dir):
        if s <= min(target, step - 1):
            start_step, ckpt = s, path
    trainer = Trainer(cfg, log=lambda *a, **k: None, start_from=ckpt)
    report = ReplayReport(step, str(ckpt) if ckpt else "step 0 (the base policy)", rank=trainer.dist.rank)
    if rollout and isinstance(trainer.runner, AgentRunner):
        report.notes.append("note: an agent written against the OpenAI API runs its own code again: its requests "
                            "sample with the recorded seeds, but its own tools are not on the tape (a deterministic "
                            "agent replays exactly; one that is not shows where it went another way)")
    _check_hashes(tape, recorded_cfg, trainer, report)
    _check_threads(tape, report)
    if rollout and cfg.model.sampler_dtype == "bfloat16" and getattr(trainer.runner, "uses_attempt_loop", True):
        report.notes.append(BF16_ATTEMPT_LOOP_NOTE)
    for s in range(start_step + 1, (target if rollout else step - 1) + 1):
        report.forward.append(_update(trainer, run_dir, s))
        if dist.max_floats([0.0 if report.forward[-1].equal else 1.0])[0]:  # every rank stops here together
            return _finish(report, trainer, log)
    if rollout:
        report.rollout = _rollout(trainer, run_dir, step, tape, live_tools)
    if update:
        for s in range(trainer.version + 1, step):  # an async step's rollout policy is older than step - 1
            report.forward.append(_update(trainer, run_dir, s))
        report.update = _update(trainer, run_dir, step)
    trainer.toolbox.tape = None
    return _finish(report, trainer, log)


# Measured on SmolLM2-135M: a row's bf16 logits alone and beside another row differ by up to
# 0.44 (float32: 2e-5); two runs of examples/smollm2_tir.yaml had 45 of 48 attempts equal at step 1.
BF16_ATTEMPT_LOOP_NOTE = (
    "note: model.sampler_dtype=bfloat16 under the per-attempt loop: a decode step's bfloat16 rounding depends "
    "on which attempts share it (SmolLM2: a row's logits alone and beside another row differ by up to 0.44, "
    "against 2e-5 in float32), so some token ids may differ; a run recorded with rollout.loop=lockstep "
    "replays its rollouts token-exact")


def _finish(report: ReplayReport, trainer, log) -> ReplayReport:
    """Rank 0 gathers every rank's report, prints it and returns it with the others in
    ``ranks``; every rank returns the same verdict (``ok``)."""
    parts = dist.gather_to_main(report)
    if parts is not None:
        report.ranks = parts[1:]
        log(report.describe())
    report.every_rank_ok = dist.broadcast_from_main(report.ok)
    if trainer.dist.world_size > 1:  # leave the group together (a rank that exits first may abort the others)
        dist.barrier()
        dist.shutdown()
    return report


def last_taped_step(run_dir: str | Path) -> int:
    """The newest step of the run that has a tape."""
    steps = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (Path(run_dir) / "tape").glob("step_*.json"))
    if not steps:
        raise ConfigError(f"{run_dir} has no tape/ (a run made with train.tape=false, or not a run directory)")
    return steps[-1]


def _recorded(run_dir: Path, tape: StepTape, rank: int = 0, world: int = 1) -> list[Trajectory]:
    """The tape's step's recorded trajectories of ``rank``: the groups its ``shard_whole_groups``
    slice of each draw's prompts made (the file holds every rank's, in rank order)."""
    step = tape.step
    path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: replay needs every step's rollouts (train.log_rollouts=true)")
    trajs = read_jsonl(str(path))
    if world == 1:
        return trajs
    mine = {f"{d.group_prefix}{task_id}" for d in tape.draws
            for task_id in dist.shard_whole_groups(d.task_ids, rank, world)}
    return [t for t in trajs if t.group_id in mine]


def _update(trainer, run_dir: Path, step: int) -> UpdateCheck:
    """Step ``step``'s update from its recorded trajectories (the trainer's marks recomputed)."""
    rank = trainer.dist.rank
    tape = read_step_tape(run_dir, step)
    trajs = _recorded(run_dir, tape, rank, trainer.dist.world_size)
    for t in trajs:
        t.trained = TrainerMarks()
    _, _, st = trainer.update(trajs)
    return UpdateCheck(step, tape.update, st.loss, st.grad_norm, params_digest(trainer.model), rank=rank)


def _rollout(trainer, run_dir: Path, step: int, tape: StepTape, live_tools: bool) -> RolloutCheck:
    box = trainer.runner.toolbox
    box.tape = ToolTape("live" if live_tools else "serve", tape.calls)
    assert trainer.version == tape.sampled_under, (trainer.version, tape.sampled_under)
    trainer.engine.policy_version = tape.sampled_under
    replayed, _ = trainer.collect(step)
    served = box.tape.served
    # an OpenAI-API agent's requests are served one by one, batched as they come: the attempt loop's case
    loop = "attempt" if getattr(trainer.runner, "uses_attempt_loop", True) else "lockstep"
    check = RolloutCheck(step=step, attempts=0, equal=0, sampled_under=tape.sampled_under, loop=loop,
                         calls_served=served, call_divergences=list(box.tape.divergences),
                         logprob_tol=ATTEMPT_LOOP_TOL if loop == "attempt" else 0.0)
    by_key = {_key(t): t for t in replayed}
    decode = trainer.tokenizer.decode
    for rec in _recorded(run_dir, tape, trainer.dist.rank, trainer.dist.world_size):
        check.attempts += 1
        rep = by_key.pop(_key(rec), None)
        d = compare_attempts(rec, rep, decode, check.logprob_tol)
        if d is None:
            check.equal += 1
        else:
            check.divergences.append(d)
        if rep is not None and rep.token_ids == rec.token_ids:
            diff = max((abs(x - y) for x, y in zip(rec.logprobs, rep.logprobs)), default=0.0)
            check.max_logprob_diff = max(check.max_logprob_diff, diff)
            check.bit_exact += diff == 0.0 and d is None
    check.extra = len(by_key)
    return check


def _key(t: Trajectory) -> tuple[str, int, int]:
    """An attempt's segment: an OpenAI-API agent's attempt (``AgentSegment``) or a compacted
    one (``CompactionSegment``) may be several."""
    part = t.agent or t.compaction
    return t.group_id, t.sample_index, part.index if part is not None else 0


def compare_attempts(rec: Trajectory, rep: Trajectory | None, decode,
                     logprob_tol: float = 0.0) -> AttemptDivergence | None:
    """The first difference between a recorded attempt and its replay; None when identical.

    Token ids first (the first index where they differ, or where one ends), then the sampler
    log-probs (``|Δμ| <= logprob_tol``; 0: bit-exact), the mask, the finish reason, the tool
    calls and the reward."""
    div = lambda what, **kw: AttemptDivergence(rec.group_id, rec.sample_index, what, **kw)  # noqa: E731
    if rep is None:
        return div("missing", recorded=f"{len(rec.token_ids)} tokens", replayed="(the replay has no such attempt)")
    a, b = rec.token_ids, rep.token_ids
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), None)
    if i is not None or len(a) != len(b):
        pos = i if i is not None else n
        where = _where(rec, pos)
        return div("token" if i is not None else "length", position=pos, kind=where[0], turn=where[1],
                   recorded=_token_text(a, pos, rec.logprobs, decode), replayed=_token_text(b, pos, rep.logprobs, decode))
    j = next((k for k in range(n) if abs(rec.logprobs[k] - rep.logprobs[k]) > logprob_tol), None)
    if j is not None:
        kind, turn = _where(rec, j)
        return div("logprob", position=j, kind=kind, turn=turn, recorded=repr(rec.logprobs[j]),
                   replayed=repr(rep.logprobs[j]))
    if rec.loss_mask != rep.loss_mask:
        j = next(k for k in range(n) if rec.loss_mask[k] != rep.loss_mask[k])
        return div("mask", position=j, recorded=str(rec.loss_mask[j]), replayed=str(rep.loss_mask[j]))
    if rec.finish_reason != rep.finish_reason:
        return div("finish_reason", recorded=rec.finish_reason, replayed=rep.finish_reason)
    for k, (c, d) in enumerate(zip(rec.tool_calls, rep.tool_calls)):
        if (c.name, c.arguments, c.result, c.error) != (d.name, d.arguments, d.result, d.error):
            return div("tool_call", recorded=f"call {k}: {c.name}({c.arguments}) -> {c.result[:200]!r} [{c.error}]",
                       replayed=f"call {k}: {d.name}({d.arguments}) -> {d.result[:200]!r} [{d.error}]")
    if len(rec.tool_calls) != len(rep.tool_calls):
        return div("tool_call", recorded=f"{len(rec.tool_calls)} calls", replayed=f"{len(rep.tool_calls)} calls")
    if rec.reward != rep.reward:
        return div("reward", recorded=repr(rec.reward), replayed=repr(rep.reward))
    return None


def _where(t: Trajectory, pos: int) -> tuple[str | None, int | None]:
    """The span kind at ``pos`` and the model turn it falls in (turns counted by model spans)."""
    turn = -1
    for s in t.spans:
        if s.kind == "model":
            turn += 1
        if s.start <= pos < s.end:
            return s.kind, max(turn, 0)
    return None, max(turn, 0)


def _token_text(ids: list[int], pos: int, lps: list[float], decode) -> str:
    if pos >= len(ids):
        return f"(ends at {len(ids)} tokens)"
    before = decode(ids[max(0, pos - 12):pos])
    return f"id {ids[pos]} {decode([ids[pos]])!r} (μ {lps[pos]!r}) after ...{before!r}"


def _check_hashes(tape: StepTape, cfg, trainer, report: ReplayReport) -> None:
    now = run_hashes(config_text(cfg), trainer.tokenizer, trainer.chat)
    for name in ("config", "tokenizer", "template"):
        if getattr(now, name) != getattr(tape.hashes, name):
            report.notes.append(f"note: the run's {name} changed since step {tape.step} was recorded "
                                f"({getattr(tape.hashes, name)} -> {getattr(now, name)}): a divergence may come from it")


def _check_threads(tape: StepTape, report: ReplayReport) -> None:
    import torch

    if torch.get_num_threads() != tape.num_threads:
        report.notes.append(f"note: the step ran with {tape.num_threads} CPU threads, the replay with "
                            f"{torch.get_num_threads()}: float sums may differ in the last bits")
