"""A run's tape: per step, what decided its data that is not a function of the weights.

``<run>/tape/step_XXXXXX.json`` (``train.tape``, on by default) holds, beside the step's
``rollouts/step_XXXXXX.jsonl`` (token ids, the engine's log-probs μ, the policy version that
sampled each attempt, the tool calls as the model saw them, the checker's verdict):

- ``draws``: the batch composition — each draw's rollout seed, group prefix and prompt ids
  (refills are draws 1, 2, ...); the attempt-turn seeds follow from them
  (``agentrl.engines.base.attempt_seed``);
- ``calls``: every tool call the step's rollouts ran, failed tries and retried attempts
  included, with its output, error kind, timing and failure (``agentrl.toolbox.tape``);
- ``sampled_under``: the policy version that sampled the batch (async runs: older than the step);
- ``update``: the loss, gradient norm and learning rate of the step, and a blake2b digest
  of the trainable parameters after it, one per rank (each rank's own shard under FSDP);
- ``hashes`` of the config, the tokenizer and the chat template, ``world_size`` and
  ``num_threads`` (the float order of a CPU matmul depends on the thread count).

``agentrl replay`` (``agentrl.run.replay``) reads it back. Example::

    from agentrl.run.tape import read_step_tape
    tape = read_step_tape("runs/arithmetic-tiny", 3)           # doctest: +SKIP
    print(tape.sampled_under, len(tape.calls), tape.update.params[0][:12])
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from agentrl.run.config import ConfigError
from agentrl.toolbox.tape import CallRecord

TAPE_FORMAT = 1
_STEP_ID = re.compile(r"^s(\d+)d\d+/")  # the group prefix of a training step's attempts: s<step>d<draw>/


def step_of(trajectory_id: str) -> int | None:
    """The training step an attempt id belongs to (``s12d0/t3/1`` -> 12); None for others
    (evaluation attempts)."""
    m = _STEP_ID.match(trajectory_id)
    return int(m.group(1)) if m else None


@dataclass
class DrawRecord:
    """One rollout of the step's prompts (draw 0; DAPO refills are draws 1, 2, ...)."""

    draw: int
    seed: int  # rank 0's rollout seed; rank r samples with seed + RANK_SEED_STRIDE * r
    group_prefix: str
    task_ids: list[str]  # the prompts of every rank, in order (rank r rolls out its shard_whole_groups slice)


@dataclass
class UpdateRecord:
    """What the step's optimizer step did."""

    loss: float
    grad_norm: float  # before clipping
    lr: float  # the learning rate after the scheduler step
    params: list[str]  # blake2b of the trainable parameters after the step, per rank (its FSDP shard)


@dataclass
class RunHashes:
    """What must be the same for a replay to mean anything."""

    config: str
    tokenizer: str
    template: str


@dataclass
class StepTape:
    """Everything of one step that ``rollouts/step_XXXXXX.jsonl`` does not hold (module docstring)."""

    step: int
    sampled_under: int
    world_size: int
    num_threads: int
    hashes: RunHashes
    draws: list[DrawRecord]
    calls: list[CallRecord] = field(default_factory=list)
    update: UpdateRecord | None = None
    format: int = TAPE_FORMAT

    def to_json(self) -> str:
        d = {"format": self.format, "step": self.step, "sampled_under": self.sampled_under,
             "world_size": self.world_size, "num_threads": self.num_threads, "hashes": asdict(self.hashes),
             "draws": [asdict(x) for x in self.draws],
             "update": None if self.update is None else asdict(self.update),
             "calls": [c.to_dict() for c in self.calls]}
        return json.dumps(d, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "StepTape":
        d = json.loads(text)
        if d.get("format") != TAPE_FORMAT:
            raise ConfigError(f"tape format {d.get('format')!r}; this agentrl reads format {TAPE_FORMAT}")
        u = d.get("update")
        return StepTape(step=int(d["step"]), sampled_under=int(d["sampled_under"]), world_size=int(d["world_size"]),
                        num_threads=int(d["num_threads"]), hashes=RunHashes(**d["hashes"]),
                        draws=[DrawRecord(**x) for x in d["draws"]],
                        calls=[CallRecord.from_dict(c) for c in d.get("calls", [])],
                        update=None if u is None else UpdateRecord(**u))


def tape_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "tape" / f"step_{step:06d}.json"


def write_step_tape(run_dir: str | Path, tape: StepTape) -> int:
    """Write the step's tape (atomically: a killed run leaves the old file or the new); its bytes."""
    path = tape_path(run_dir, tape.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = tape.to_json()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return len(text.encode())


def read_step_tape(run_dir: str | Path, step: int) -> StepTape:
    path = tape_path(run_dir, step)
    if not path.is_file():
        raise ConfigError(f"no tape for step {step} in {run_dir} ({path} is missing): the run was made with "
                          "train.tape=false, before step {step}, or by an agentrl without tapes")
    return StepTape.from_json(path.read_text(encoding="utf-8"))


def params_digest(model: torch.nn.Module) -> str:
    """blake2b of this rank's trainable parameters (name order; an FSDP shard's local part):
    equal digests mean bit-equal weights."""
    from torch.distributed.tensor import DTensor

    h = hashlib.blake2b(digest_size=16)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if not p.requires_grad:
            continue
        t = p.detach()
        t = t.to_local() if isinstance(t, DTensor) else t
        h.update(name.encode())
        if t.numel():
            h.update(t.cpu().contiguous().view(torch.uint8).numpy())
    return h.hexdigest()


def config_text(cfg) -> str:
    """The config as the tape hashes it: every setting but the ones that only locate the run
    (``output_dir``, ``resume``), so a replay's own output directory does not change it."""
    import yaml

    from agentrl.run.config import config_to_dict

    d = {k: v for k, v in config_to_dict(cfg).items() if k not in ("output_dir", "resume")}
    return yaml.safe_dump(d, sort_keys=True)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def run_hashes(config_yaml: str, tokenizer, chat) -> RunHashes:
    """Digests of the run's config (its saved YAML), tokenizer (the fast tokenizer's JSON, or
    the vocabulary) and chat template (its source and tool-call format)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    tok_text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    tok_text += json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str)
    return RunHashes(config=_digest(config_yaml), tokenizer=_digest(tok_text),
                     template=_digest(f"{chat.source}\n{chat.tool_call_format}"))


class TapeRecorder:
    """Writes a run's tape, step by step. Every rank calls :meth:`step_done` (it gathers each
    rank's tool calls and parameter digest to rank 0, which writes the file)."""

    def __init__(self, cfg, tokenizer, chat, pool: list):
        from agentrl.toolbox.tape import ToolTape

        self.cfg = cfg
        self.pool = pool  # the training tasks the step's prompts are drawn from
        self.hashes = run_hashes(config_text(cfg), tokenizer, chat)
        # shared by the trainer's toolbox and the rollout thread's; evaluations' calls are not kept
        self.tools = ToolTape("record", record_if=lambda tid: step_of(tid) is not None)

    def attach(self, toolbox) -> None:
        toolbox.tape = self.tools

    def step_done(self, step: int, sampled_under: int, draws: int, loss: float, grad_norm: float, lr: float,
                  model: torch.nn.Module) -> dict[str, float]:
        """Write ``tape/step_XXXXXX.json``; the step's ``tape/bytes`` and ``time/tape`` (rank 0)."""
        import time

        from agentrl.run.collect import draw_seed, draw_tasks
        from agentrl.scale import distributed as dist

        t0 = time.perf_counter()
        calls = self.tools.take(lambda tid: step_of(tid) == step)
        parts = dist.gather_to_main((calls, params_digest(model)))
        if parts is None:
            return {}
        cfg = self.cfg
        records = []
        for d in range(draws):
            tasks = draw_tasks(self.pool, cfg.seed, step, cfg.train.prompts_per_step, d)
            records.append(DrawRecord(draw=d, seed=draw_seed(cfg, step, d), group_prefix=f"s{step}d{d}/",
                                      task_ids=[t.id for t in tasks]))
        tape = StepTape(step=step, sampled_under=sampled_under, world_size=len(parts),
                        num_threads=torch.get_num_threads(), hashes=self.hashes, draws=records,
                        calls=[c for rank_calls, _ in parts for c in rank_calls],
                        update=UpdateRecord(loss=loss, grad_norm=grad_norm, lr=lr, params=[h for _, h in parts]))
        size = write_step_tape(cfg.run_dir, tape)
        return {"tape/bytes": float(size), "time/tape": time.perf_counter() - t0}
