"""``agentrl eval CONFIG --checkpoint DIR``: the trainer's evaluation, offline."""

from __future__ import annotations

from pathlib import Path

from agentrl.run.build import build_runtime, make_env
from agentrl.run.config import Config
from agentrl.run.evaluate import EvalResult, evaluate


def run_eval_checkpoint(cfg: Config, checkpoint: str | Path) -> EvalResult:
    """Evaluate the model in ``checkpoint`` (a checkpoint dir with ``model/``, a model dir, or a
    GGUF model: ``smollm2`` or a ``.gguf`` file, converted once into the cache)."""
    from agentrl.models.gguf import resolve_gguf

    ckpt = Path(checkpoint)
    model_dir = ckpt / "model" if (ckpt / "model").is_dir() else resolve_gguf(str(checkpoint)) or ckpt
    env = make_env(cfg)
    rt = build_runtime(cfg, env, str(model_dir))
    tasks = env.tasks("test")[: cfg.eval.num_tasks]
    return evaluate(rt.runner, env, tasks, greedy=cfg.eval.greedy, pass_k=cfg.eval.pass_k, seed=cfg.seed + 17)
