"""The frozen models the update scores but never trains: the KL reference and the distillation teacher.

Both go through the same path: loaded with the policy's own loading code
(:func:`agentrl.run.build.load_model_and_tokenizer`: ``from_pretrained``, the clear offline
error), frozen and laid out like the policy (:func:`agentrl.scale.parallel.prepare_reference`:
sharded under FSDP), then run by ``grpo_update`` as one forward per micro-batch per step
(:func:`agentrl.algo.batching.score_tokens`), never sampled.

- the **reference** of the KL term (``algo.kl_coef`` > 0): the step-0 policy (with LoRA, the
  policy's own base model with the adapter off: no second copy);
- the **teacher** of on-policy distillation (``algo.distill``, ``model.teacher_path``): any
  model with the student's tokenizer, named as ``model.path`` is (a directory, a hub name,
  ``tiny``, ``smollm2``, a ``.gguf`` file) or by a training checkpoint (its ``model/``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from agentrl.algo.objective import Objective
from agentrl.run.build import load_model_and_tokenizer
from agentrl.run.config import Config, ConfigError
from agentrl.scale import distributed as dist
from agentrl.scale.parallel import AdapterDisabledReference, ParallelPlan, prepare_reference


def check_distill(cfg: Config) -> str | None:
    """Refuse ``algo.distill`` without a teacher (ConfigError naming the key and the fix), before
    anything loads; the note to print when a teacher is named but distillation is off (it is
    then not loaded), else None."""
    if cfg.algo.distill and not cfg.model.teacher_path:
        raise ConfigError("algo.distill=true needs a teacher: set model.teacher_path to a model with the student's "
                          "tokenizer (a model directory, a hub name, or a training checkpoint such as "
                          "runs/NAME/checkpoints/step_000030), or set algo.distill=false")
    if cfg.model.teacher_path and not cfg.algo.distill:
        return (f"model.teacher_path={cfg.model.teacher_path!r} is not loaded: algo.distill is false "
                "(set algo.distill=true to distill from it)")
    return None


def build_reference(objective: Objective, plan: ParallelPlan, policy: torch.nn.Module, base_path: Callable[[], str],
                    device: str) -> torch.nn.Module | AdapterDisabledReference | None:
    """The frozen reference of the KL term, None when β = 0. ``base_path()``: the step-0 policy's path."""
    if not objective.uses_reference:
        return None
    if plan.lora:  # the base model, adapter off: no second copy
        return AdapterDisabledReference(policy)
    ref = load_model_and_tokenizer(base_path(), "cpu" if plan.fsdp else device)[0]
    return prepare_reference(ref, plan, device)


def teacher_model_path(cfg: Config) -> str:
    """The directory or hub name behind ``model.teacher_path``: shortcuts resolved as for
    ``model.path`` (``tiny`` with ``model.tiny_seed``, ``smollm2``, a ``.gguf`` file), a training
    checkpoint (``checkpoints/step_XXXXXX``) to its ``model/``, anything else as it is."""
    from agentrl.models.names import resolve_shortcut

    name = cfg.model.teacher_path
    path = resolve_shortcut(name, tiny_seed=cfg.model.tiny_seed)
    if path == name and (Path(name) / "model" / "config.json").exists():  # a training checkpoint: its model
        path = str(Path(name) / "model")
    return path


def _output_rows(model: torch.nn.Module) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def check_same_tokenizer(teacher_tok, student_tok, teacher: torch.nn.Module, student: torch.nn.Module,
                         teacher_name: str) -> None:
    """Refuse a teacher that cannot score the student's token ids: a different tokenizer (the same id
    would be another piece of text), or an output layer smaller than the student's (an id the
    student can sample would have no teacher log-prob). A larger one is fine: padded vocabularies
    (Qwen2.5's 151936 and 152064 rows) share one tokenizer."""
    mine, theirs = student_tok.get_vocab(), teacher_tok.get_vocab()
    if mine != theirs:
        differ = sorted(t for t in set(mine) | set(theirs) if mine.get(t) != theirs.get(t))
        raise ConfigError(
            f"model.teacher_path={teacher_name!r} has another tokenizer than the student's (model.path): "
            f"{len(differ)} tokens differ (e.g. {differ[:3]}; the student has {len(mine)} tokens, the teacher "
            f"{len(theirs)}). Distillation scores the student's token ids under the teacher, so both must share "
            "one tokenizer: use a teacher of the student's model family, or a student of the teacher's")
    rows_t, rows_s = _output_rows(teacher), _output_rows(student)
    if rows_t < rows_s:
        raise ConfigError(
            f"model.teacher_path={teacher_name!r} scores {rows_t} token ids and the student samples from {rows_s}: "
            "the teacher's output layer must cover the student's; use a teacher with at least as many rows")


def build_teacher(cfg: Config, plan: ParallelPlan, student_tok, student: torch.nn.Module, device: str,
                  is_main: bool, log: Callable[[str], None] = print) -> torch.nn.Module | None:
    """The frozen teacher of ``algo.distill`` (None when it is off), checked against the student's
    tokenizer. Rank 0 builds any cached artifact of the name (tiny, a GGUF conversion) first."""
    if not cfg.algo.distill:
        return None
    if is_main:
        path = teacher_model_path(cfg)
    dist.barrier()
    if not is_main:
        path = teacher_model_path(cfg)
    try:
        teacher, tok = load_model_and_tokenizer(path, "cpu" if plan.fsdp else device)
    except ConfigError as e:  # the loader's message, with the fix; for this key, not model.path's
        fix = str(e).replace("model.path=", "model.teacher_path=")
        raise ConfigError(f"model.teacher_path={cfg.model.teacher_path!r}: {fix}") from e
    check_same_tokenizer(tok, student_tok, teacher, student, cfg.model.teacher_path)
    log(f"teacher: {path} ({sum(p.numel() for p in teacher.parameters()) / 1e6:.2f}M parameters, frozen; "
        "scored once per step on the sampled tokens)")
    return prepare_reference(teacher, plan, device)
