"""The ledger environment (envs/ledger.py) at the context budget of examples/compaction_tiny.yaml:
the ideal policy solves it in one context and with a summary, not with truncation; and the
warm start's demonstrations are token for token what the rollout builds, summary turn included."""

from __future__ import annotations

import re

import pytest

from agentrl import ChatTemplate, RolloutConfig, RolloutRunner, ToolBox
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine
from agentrl.envs.ledger import LedgerEnv, page_code, parse_codes
from agentrl.run.config import load_config
from agentrl.run.demonstrations import encode_demonstration
from agentrl.run.scoring import score_all
from agentrl.types import Message

EXAMPLE = "examples/compaction_tiny.yaml"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


@pytest.fixture(scope="module")
def env():
    return LedgerEnv(seed=0, num_train=20, num_test=4)


def ideal(tok, env):
    """The demonstrations' policy, reading its context: the pages it sees, or its summary."""
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def script(prompt: list[int], _call: int) -> list[int]:
        text = tok.decode(prompt)
        seen = re.findall(r"\ncode (\d+)", text)
        if text.endswith(f"{env.compaction_prompt}<|im_end|>\n<|im_start|>assistant\n"):
            return enc(f"codes {' '.join(seen)} next {len(seen) + 1}<|im_end|>")
        summary = re.search(r"codes ([\d ]+) next (\d+)", text)
        have = (summary.group(1).split() if summary else []) + seen
        if len(have) == env.pages:
            return enc(f"<answer>{' '.join(have)}</answer><|im_end|>")
        call = {"name": "read", "arguments": {"page": len(have) + 1}}
        return enc(f"<tool_call>\n{call}\n</tool_call><|im_end|>".replace("'", '"'))
    return script


def rollout(tok, env, compaction: str, loop: str = "attempt"):
    cfg = load_config(EXAMPLE).rollout
    budget = cfg.context_budget if compaction != "none" else None
    config = RolloutConfig(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                           max_total_tokens=cfg.max_total_tokens, compaction=compaction, context_budget=budget,
                           compaction_prompt=env.compaction_prompt, loop=loop)
    engine = (PerRequestScriptedEngine if loop == "attempt" else ScriptedEngine)(ideal(tok, env))
    runner = RolloutRunner(engine, ChatTemplate(tok), ToolBox(env.tools(), tokenizer=tok), config)
    tasks = env.tasks("test")
    trajs = runner.run(tasks, 1, env.system_prompt).trajectories
    score_all(env, {t.id: t for t in tasks}, trajs)
    return trajs


@pytest.mark.parametrize("compaction, solved, segments", [("none", 1.0, 1), ("summarize", 1.0, 2),
                                                          ("frozen_summary", 1.0, 2), ("truncate", 0.0, None)])
def test_only_a_summary_carries_the_first_page_across_the_budget(tok, env, compaction, solved, segments):
    trajs = rollout(tok, env, compaction)
    for t in trajs:
        t.check()
    last = {t.group_id: t for t in trajs}
    assert [t.reward for t in last.values()] == [solved] * len(env.tasks("test"))
    if segments is not None:
        assert len(trajs) == segments * len(last)
    if compaction != "none":
        assert all(len(t.token_ids) <= load_config(EXAMPLE).rollout.context_budget for t in trajs)


def test_the_lockstep_loop_compacts_the_same_way(tok, env):
    a, b = rollout(tok, env, "summarize"), rollout(tok, env, "summarize", loop="lockstep")
    assert [(t.token_ids, t.loss_mask) for t in a] == [(t.token_ids, t.loss_mask) for t in b]


def test_demonstrations_are_the_rollouts_segments(tok, env):
    """Each segment of the ideal summarized attempt is, token for token and mask for mask,
    the demonstration of its shape (the summary turn trained in the first)."""
    first, second = [t for t in rollout(tok, env, "summarize") if t.task_id == env.tasks("test")[0].id]
    _, demo_first, demo_last = env.demonstration(env.tasks("test")[0])
    chat, tools = ChatTemplate(tok), [t.schema() for t in env.tools()]
    for traj, demo in ((first, demo_first), (second, demo_last)):
        enc = encode_demonstration(chat, demo, tools)
        assert enc.token_ids == traj.token_ids and enc.loss_mask == traj.loss_mask


def test_demonstrations_cycle_through_the_three_shapes(env):
    demos = env.demonstrations(6, seed=0)
    assert [d[-1].content.startswith("<answer>") for d in demos] == [True, False, True] * 2
    assert all(d[-2] == Message("user", env.compaction_prompt) for d in demos[1::3])
    assert all("Summary of your work so far:\ncodes " in d[1].content for d in demos[2::3])


def test_codes_are_read_not_guessed(env):
    task = env.tasks("test")[0]
    ledger = task.metadata["ledger"]
    assert task.answer.split() == [str(page_code(0, ledger, p)) for p in (1, 2, 3)]
    assert parse_codes("47, 12 83") == [47, 12, 83] and parse_codes("47 12 x") is None
    score = env.score(task, [Message("assistant", f"<answer>{task.answer}</answer>")])
    assert score.reward == 1.0 and score.info["codes_right"] == 3
    shifted = " ".join(task.answer.split()[1:] + task.answer.split()[:1])
    assert env.score(task, [Message("assistant", f"<answer>{shifted}</answer>")]).reward == 0.0
