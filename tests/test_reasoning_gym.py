"""The reasoning_gym environment: env.name resolution, seeded disjoint splits, per-dataset
configs and families, reasoning-gym's scorers behind the hedge guard, the exploit audit, and
one clear message for each user error."""

from __future__ import annotations

import builtins
import sys

import pytest

pytest.importorskip("reasoning_gym")

from agentrl.envs.reasoning_gym import ReasoningGymEnv, answer_is_phrases, hedge_reason, split_seeds  # noqa: E402
from agentrl.run.build import make_env  # noqa: E402
from agentrl.run.config import Config, EnvConfig  # noqa: E402
from agentrl.types import ConfigError, Message, Task, ToolCall  # noqa: E402


def _env(name: str, **args):
    return make_env(Config(env=EnvConfig(name=name, args=args)))


def _reply(env, task, text: str):
    return env.score(task, [Message("system", env.system_prompt), Message("user", task.prompt),
                            Message("assistant", text)])


def test_env_name_prefix_builds_the_named_datasets():
    env = _env("reasoning_gym:chain_sum, leg_counting", num_train=10, num_test=4)
    assert isinstance(env, ReasoningGymEnv) and env.datasets == ["chain_sum", "leg_counting"]
    # round-robin: the first eval.num_tasks test tasks cover every dataset equally
    assert [t.family for t in env.tasks("test")[:4]] == ["chain_sum", "leg_counting"] * 2
    assert len(env.tasks("test")) == 8 and len(env.tasks("train")) == 20
    assert env.tools() == [] and "python" not in env.system_prompt


def test_env_name_and_args_cannot_both_name_the_datasets():
    with pytest.raises(ConfigError, match="keep one"):
        _env("reasoning_gym:chain_sum", datasets="leg_counting")


def test_unknown_dataset_names_the_closest_ones():
    with pytest.raises(ConfigError, match=r"unknown reasoning-gym dataset 'chain_sums'; did you mean chain_sum"):
        _env("reasoning_gym:chain_sums")
    with pytest.raises(ConfigError, match="no reasoning-gym dataset named"):
        _env("reasoning_gym:")


def test_missing_package_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_rg(name, *a, **k):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ImportError("No module named 'reasoning_gym'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_rg)
    monkeypatch.delitem(sys.modules, "reasoning_gym", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[reasoning-gym\]'"):
        ReasoningGymEnv("chain_sum")


def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"configs.chain_sum: .*min_termz.*takes \['min_terms'"):
        ReasoningGymEnv("chain_sum", configs={"chain_sum": {"min_termz": 2}})
    with pytest.raises(ConfigError, match="set by the splits"):
        ReasoningGymEnv("chain_sum", configs={"chain_sum": {"size": 5}})
    with pytest.raises(ConfigError, match="which env.name does not list"):
        ReasoningGymEnv("chain_sum", configs={"leg_counting": {}})
    with pytest.raises(ConfigError, match=r"unknown tool\(s\) \['bash'\]"):
        ReasoningGymEnv("chain_sum", tools=["bash"])
    with pytest.raises(ConfigError, match="only .* distinct questions"):  # 1-digit a+b: under 200 questions
        ReasoningGymEnv("chain_sum", num_train=500, num_test=10,
                        configs={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}})


def test_dataset_config_reaches_the_generator():
    env = ReasoningGymEnv("chain_sum", num_train=20, num_test=10,
                          configs={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3}})
    for t in env.tasks("test") + env.tasks("train"):
        numbers = [w for w in t.prompt.split(":")[-1].replace("=", " ").split() if w.isdigit()]
        assert len(numbers) == 2 and all(len(n) == 3 for n in numbers), t.prompt


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_splits_are_disjoint_by_question_and_seeded(seed):
    env = ReasoningGymEnv("chain_sum,spell_backward", seed=seed, num_train=300, num_test=64)
    train, test = env.tasks("train"), env.tasks("test")
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert len({t.prompt for t in test}) == len(test) and len({t.prompt for t in train}) == len(train)
    again = ReasoningGymEnv("chain_sum,spell_backward", seed=seed, num_train=300, num_test=64)
    assert [(t.id, t.prompt, t.answer) for t in again.tasks("test")] == [(t.id, t.prompt, t.answer) for t in test]
    other = ReasoningGymEnv("chain_sum,spell_backward", seed=seed + 100, num_train=300, num_test=64)
    assert [t.prompt for t in other.tasks("test")] != [t.prompt for t in test]


def test_nearby_seeds_would_share_items_so_the_splits_seeds_are_far_apart():
    # reasoning-gym draws item i of seed s from Random(s + i): seeds 0 and 1 share all but one item
    import reasoning_gym

    a, b = reasoning_gym.create_dataset("chain_sum", seed=0, size=20), reasoning_gym.create_dataset("chain_sum", seed=1, size=20)
    assert a[1]["question"] == b[0]["question"]
    test, train = split_seeds(0, "chain_sum")
    assert train - test >= 1 << 30 and split_seeds(0, "chain_sum") != split_seeds(0, "leg_counting")


def test_correct_answers_score_in_every_accepted_format():
    env = ReasoningGymEnv("chain_sum,word_sorting,spell_backward", num_train=5, num_test=3)
    for task in env.tasks("test"):
        for text in (f"<answer>{task.answer}</answer>", f"<answer> {task.answer} </answer>",
                     f"Let me see.\nThe answer is {task.answer}.", f"<answer>\\boxed{{{task.answer}}}</answer>"):
            s = _reply(env, task, text)
            assert s.reward == 1.0, (task.family, text, s.info)
            assert s.info["family"] == task.family and s.info["score"] == 1.0
        assert _reply(env, task, "<answer>zzz</answer>").reward == 0.0


def test_hedges_are_refused_before_the_scorer():
    # gsm_symbolic's scorer reads the first number of the answer: "882 or 881" would earn 1.0
    env = ReasoningGymEnv("gsm_symbolic", num_train=5, num_test=2)
    task = env.tasks("test")[0]
    assert env._items[task.id].dataset.score_answer(f"{task.answer} or 1", env._items[task.id].entry) == 1.0
    s = _reply(env, task, f"<answer>{task.answer} or 1</answer>")
    assert s.reward == 0.0 and s.info["reason"].startswith("refused: 2 numbers")
    fullwidth = task.answer.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
    assert _reply(env, task, f"<answer>{fullwidth}</answer>").info["reason"].startswith("refused: digits")
    # without the guard the hedge earns the scorer's full marks: the guard is what stops it
    loose = ReasoningGymEnv("gsm_symbolic", num_train=5, num_test=2, hedge_guard=False)
    assert _reply(loose, loose.tasks("test")[0], f"<answer>{task.answer} or 1</answer>").reward == 1.0


def test_hedge_rules():
    assert hedge_reason("1,234", "1234") == "" and hedge_reason("2 × 2 × 3", "2 × 2 × 3") == ""
    assert hedge_reason("a" * 40, "abc").startswith("40 characters")
    assert answer_is_phrases("The answer is 4.\nFinal answer: 5") == ["4", "5"]


def test_a_prefix_of_the_gold_does_not_reach_full_marks_by_float_error():
    # spell_backward adds 1/len per matching leading letter: 9 letters sum to 1.0000000000000002
    env = ReasoningGymEnv("spell_backward", num_train=2, num_test=60)
    task = next(t for t in env.tasks("test") if len(t.answer) == 9)
    raw = env._items[task.id].dataset.score_answer(task.answer + " x", env._items[task.id].entry)
    assert raw > 1.0
    s = _reply(env, task, f"<answer>{task.answer} x</answer>")
    assert s.reward == 0.0 and s.info["reason"].startswith("scorer gave")
    # several "the answer is" phrases on one line disagree: no answer
    assert _reply(env, task, f"The answer is {task.answer} x. The answer is {task.answer}.").info["source"] == "ambiguous"


def test_partial_credit_passes_the_scorers_value_through():
    strict = ReasoningGymEnv("spell_backward", num_train=2, num_test=4)
    partial = ReasoningGymEnv("spell_backward", num_train=2, num_test=4, partial_credit=True)
    task = strict.tasks("test")[0]
    half = task.answer[: len(task.answer) // 2] + "#" * (len(task.answer) - len(task.answer) // 2)
    assert _reply(strict, task, f"<answer>{half}</answer>").reward == 0.0
    assert 0.0 < _reply(partial, partial.tasks("test")[0], f"<answer>{half}</answer>").reward < 1.0


def test_only_the_last_assistant_turn_counts():
    env = ReasoningGymEnv("chain_sum", num_train=2, num_test=2, tools=["python"])
    task = env.tasks("test")[0]
    call = ToolCall("python", {"code": "print(1)"})
    msgs = [Message("user", task.prompt), Message("assistant", f"<answer>{task.answer}</answer>"),
            Message("assistant", "", tool_calls=[call]), Message("tool", f"<answer>{task.answer}</answer>", name="python"),
            Message("assistant", "see above")]
    s = env.score(task, msgs)
    assert s.reward == 0.0 and s.info["used_tool"] is True and s.info["has_answer"] is False


def test_a_scorer_that_raises_scores_zero(monkeypatch):
    env = ReasoningGymEnv("chain_sum", num_train=2, num_test=2)
    task = env.tasks("test")[0]

    def boom(answer, entry):
        raise KeyError("x")

    monkeypatch.setattr(env._items[task.id].dataset, "score_answer", boom)
    s = _reply(env, task, f"<answer>{task.answer}</answer>")
    assert s.reward == 0.0 and "raised KeyError" in s.info["reason"]


def test_a_task_from_elsewhere_is_refused():
    env = ReasoningGymEnv("chain_sum", num_train=2, num_test=2)
    with pytest.raises(ValueError, match="not one of this environment's tasks"):
        env.score(Task(id="test-0", prompt="2+2?", answer="4"), [Message("assistant", "<answer>4</answer>")])


def test_python_tool_and_demonstrations():
    env = ReasoningGymEnv("chain_sum", num_train=8, num_test=2, tools=["python"])
    assert [t.name for t in env.tools()] == ["python"] and "python tool" in env.system_prompt
    demos = env.demonstrations(3, seed=0)
    train = {t.prompt: t for t in env.tasks("train")}
    for d in demos:
        assert [m.role for m in d] == ["system", "user", "assistant"] and d[1].content in train
        assert env.score(train[d[1].content], d).reward == 1.0


def test_eval_reports_accuracy_per_dataset():
    from agentrl.run.evaluate import accuracy_of
    from agentrl.types import Trajectory, Verdict

    env = ReasoningGymEnv("chain_sum,leg_counting", num_train=2, num_test=2)
    tasks = env.tasks("test")
    trajs = []
    for t in tasks:
        trajs.append(Trajectory(token_ids=[], prompt_len=0, loss_mask=[], logprobs=[], spans=[], messages=[],
                                task_id=t.id, verdict=Verdict(1.0 if t.family == "chain_sum" else 0.0)))
    metrics = accuracy_of(trajs, {t.id: t for t in tasks}).metrics()
    assert metrics["eval/accuracy/chain_sum"] == 1.0 and metrics["eval/accuracy/leg_counting"] == 0.0


# Exploits that must apply (not N/A): the audit really tried them on these datasets.
MUST_TRY = {"several_tags_gold_last", "candidates_in_one_tag", "hedged_or", "buried_in_numbers", "boxed_spam",
            "answer_is_spam", "fullwidth_digits", "answer_only_in_tool_output", "answer_printed_by_code_block"}


@pytest.mark.parametrize("dataset", ["gsm_symbolic", "spell_backward", "number_sorting", "chain_sum"])
def test_every_exploit_earns_nothing(dataset):
    from agentrl.run.audit import audit_env

    env = ReasoningGymEnv(dataset, num_train=10, num_test=4, tools=["python"])
    report = audit_env(env, name=dataset, num_tasks=2)
    assert report.passed, report.table()
    assert report.control.mean_reward == 1.0, report.table()
    tried = {r.exploit for r in report.results if r.verdict != "N/A"}
    assert MUST_TRY - ({"fullwidth_digits"} if dataset == "spell_backward" else set()) <= tried, report.table()


def test_the_bare_family_name_says_how_to_name_datasets():
    with pytest.raises(ConfigError, match=r"a family \(reasoning_gym:NAME\)"):
        _env("reasoning_gym")
