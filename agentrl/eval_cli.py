"""``agentrl eval CONFIG --checkpoint DIR``: the trainer's evaluation, offline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentrl.build import load_model_and_tokenizer, make_env, set_threads
from agentrl.chat import ChatTemplate
from agentrl.config import Config
from agentrl.engines.hf import HFEngine
from agentrl.evaluate import EvalResult, evaluate
from agentrl.rollout import RolloutRunner
from agentrl.tool import ToolBox


def run_eval_checkpoint(cfg: Config, checkpoint: str | Path) -> EvalResult:
    """Evaluate the model in ``checkpoint`` (a checkpoint dir with ``model/``, or a model dir)."""
    ckpt = Path(checkpoint)
    model_dir = ckpt / "model" if (ckpt / "model").is_dir() else ckpt
    threads = set_threads(cfg.model.num_threads)
    env = make_env(cfg)
    model, tok = load_model_and_tokenizer(str(model_dir), cfg.model.device)
    engine = HFEngine(model, tok, seed=cfg.seed, num_threads=threads)
    chat = ChatTemplate(tok, cfg.model.template)
    box = ToolBox(env.tools(), tokenizer=tok, default_timeout=cfg.tools.timeout,
                  max_output_tokens=cfg.tools.max_output_tokens)
    runner = RolloutRunner(engine, chat, box, dataclasses.replace(cfg.rollout))
    tasks = env.tasks("test")[: cfg.eval.num_tasks]
    return evaluate(runner, env, tasks, greedy=cfg.eval.greedy, pass_k=cfg.eval.pass_k, seed=cfg.seed + 17)
