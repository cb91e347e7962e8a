"""The math environment: shipped problems, JSONL shapes, HF loading errors, scoring with a
real python tool call, and a 2-step CPU training run with void-turn filtering."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agentrl.envs.math import MathEnv, builtin_path, holdout, load_hf
from agentrl.types import Message, Task, ToolCall

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("math_verify")


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# -- shipped problems ----------------------------------------------------------------------


def test_builtin_problems_are_reproducible_from_the_generator():
    spec = importlib.util.spec_from_file_location("make_math_problems", ROOT / "benchmarks" / "make_math_problems.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render(gen.generate(100, seed=0)) == builtin_path().read_text(encoding="utf-8")


def test_builtin_worked_solutions_are_arithmetically_right():
    rows = [json.loads(x) for x in builtin_path().read_text().splitlines()]
    assert len(rows) == 100 and len({r["question"] for r in rows}) == 100
    assert set(Counter(r["family"] for r in rows).values()) == {10}
    checked = 0
    for r in rows:
        *steps, last = r["answer"].splitlines()
        assert re.fullmatch(r"#### \d+", last)
        for step in steps:  # every "a op b = c" in the worked solution is true
            for lhs, rhs in re.findall(r"([\d(][\d\s()+\-*/]*?)\s=\s(\d+(?:\.\d+)?)", step):
                assert abs(eval(lhs) - float(rhs)) < 1e-9, (step, lhs, rhs)
                checked += 1
        assert last.split()[-1] in steps[-1]  # the final step states the answer
    assert checked >= 250


def test_builtin_split_is_disjoint_stratified_and_deterministic():
    a, b, c = MathEnv(seed=0), MathEnv(seed=0), MathEnv(seed=1)
    train, test = a.tasks("train"), a.tasks("test")
    assert (len(train), len(test)) == (80, 20)
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert set(Counter(t.family for t in test).values()) == {2}  # 10 families, 2 each
    assert [t.prompt for t in test] == [t.prompt for t in b.tasks("test")]
    assert [t.prompt for t in test] != [t.prompt for t in c.tasks("test")]
    assert len({t.id for t in train + test}) == 100
    assert all(re.fullmatch(r"\d+", t.answer) for t in train + test)


def test_holdout_rejects_impossible_sizes():
    tasks = [Task(id=str(i), prompt=str(i), answer="1") for i in range(3)]
    with pytest.raises(ValueError, match="lower num_test"):
        holdout(tasks, 3, seed=0)


# -- data shapes ---------------------------------------------------------------------------


def test_jsonl_shapes_gsm8k_math_plain(tmp_path):
    rows = [
        {"question": "Q1", "answer": "4 * 300 = 1200\n#### 1,200"},  # GSM8K
        {"problem": "Q2", "solution": "So $x=\\boxed{\\frac{1}{2}}$.", "type": "Algebra"},  # MATH
        {"problem": "Q3", "solution": "... \\boxed{3}", "answer": "\\sqrt{2}"},  # MATH-500
        {"prompt": "Q4", "answer": 17, "id": "mine-4"},  # plain, numeric answer
    ]
    env = MathEnv(train=_write_jsonl(tmp_path / "d.jsonl", rows), num_test=0)
    tasks = env.tasks("train")
    assert [t.prompt for t in tasks] == ["Q1", "Q2", "Q3", "Q4"]
    assert [t.answer for t in tasks] == ["1200", "\\frac{1}{2}", "\\sqrt{2}", "17"]
    assert tasks[1].family == "Algebra" and tasks[3].metadata["source_id"] == "mine-4"
    as_list = tmp_path / "d.json"
    as_list.write_text(json.dumps(rows))
    assert [t.answer for t in MathEnv(train=str(as_list), num_test=1).tasks("train")] != []


def test_separate_test_source_and_disjointness(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"question": f"Q{i}", "answer": str(i)} for i in range(6)])
    test = _write_jsonl(tmp_path / "test.jsonl", [{"question": "Q5", "answer": "5"}, {"question": "T", "answer": "1"}])
    env = MathEnv(train=train, test=test, max_train=4)
    assert [t.prompt for t in env.tasks("test")] == ["Q5", "T"]
    assert [t.prompt for t in env.tasks("train")] == ["Q0", "Q1", "Q2", "Q3"]
    assert len(MathEnv(train=train, test=test).tasks("train")) == 5  # Q5 is test-only


@pytest.mark.parametrize("rows,match", [
    ([{"text": "Q", "answer": "1"}], "expected one of the fields question, problem, prompt"),
    ([{"question": "Q"}], "no gold answer"),
    ([{"problem": "Q", "solution": "no box here"}], "has no \\\\boxed"),
])
def test_bad_records_name_the_fix(tmp_path, rows, match):
    with pytest.raises(ValueError, match=match):
        MathEnv(train=_write_jsonl(tmp_path / "bad.jsonl", rows), num_test=0)


def test_bad_files_name_the_line_and_the_fix(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text('{"question": "Q", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not valid JSON"):
        MathEnv(train=str(p), num_test=0)
    with pytest.raises(ValueError, match="does not exist; pass a JSONL path"):
        MathEnv(train=str(tmp_path / "missing.jsonl"))


def test_hf_without_datasets_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match=r"pip install datasets.*to_json\('openai_gsm8k_train.jsonl'\)"):
        MathEnv(train="hf:openai/gsm8k", hf_config="main")


def test_hf_offline_is_one_clear_error():
    pytest.importorskip("datasets")
    # a subprocess, because the hub's offline switch is read when huggingface_hub is imported
    code = ("from agentrl.envs.math import MathEnv\n"
            "try:\n    MathEnv(train='hf:openai/gsm8k@test', hf_config='main')\n"
            "except ValueError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300).stdout
    assert "ERR cannot load Hugging Face dataset 'openai/gsm8k'" in out, out
    assert "load_dataset('openai/gsm8k', 'main', split='test').to_json('openai_gsm8k_test.jsonl')" in out
    assert "env.args.train (or test) = openai_gsm8k_test.jsonl" in out


def test_load_hf_message_names_split_and_config(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="split='validation'"):
        load_hf("some/name", "validation", "cfg")


# -- scoring -------------------------------------------------------------------------------


def _run_python(env: MathEnv, code: str) -> str:
    from agentrl.toolbox import ToolBox

    box = ToolBox(env.tools())
    ctx = box.new_context("t")
    try:
        return asyncio.run(box.execute("python", {"code": code}, ctx)).content
    finally:
        asyncio.run(box.close(ctx))


def test_score_with_a_real_tool_call_and_the_leak_case():
    env = MathEnv()
    task = env.tasks("test")[0]
    code = f"print('\\\\boxed{{' + str({task.answer}) + '}}')"  # the tool prints the answer, boxed
    out = _run_python(env, code)
    assert out.strip() == f"\\boxed{{{task.answer}}}"
    head = [Message("system", env.system_prompt), Message("user", task.prompt),
            Message("assistant", "", tool_calls=[ToolCall(name="python", arguments={"code": code})]),
            Message("tool", out, name="python")]
    leak = env.score(task, [*head, Message("assistant", "The tool printed it above.")])
    assert leak.reward == 0.0 and leak.info["has_answer"] is False and leak.info["used_tool"] is True
    good = env.score(task, [*head, Message("assistant", f"So the answer is <answer>{int(task.answer):,}</answer>")])
    assert good.reward == 1.0
    assert good.info["method"] == "numeric" and good.info["source"] == "tag"
    assert good.info["extracted"] == f"{int(task.answer):,}" and good.info["gold"] == task.answer
    assert good.info["tool_calls"] == 1 and good.info["family"] == task.family


def test_no_tool_control_and_boxed_prompt():
    env = MathEnv(use_tool=False, answer_tag=None)
    assert env.tools() == [] and "python" not in env.system_prompt and "\\boxed{}" in env.system_prompt
    task = env.tasks("train")[0]
    assert env.score(task, [Message("assistant", f"\\boxed{{{task.answer}}}")]).reward == 1.0
    assert env.score(task, [Message("assistant", f"<answer>{task.answer}</answer>")]).reward == 0.0


def test_built_through_the_config():
    from agentrl.run.build import make_env
    from agentrl.run.config import load_config

    cfg = load_config(ROOT / "examples" / "math_tiny.yaml")
    env = make_env(cfg)
    assert isinstance(env, MathEnv) and cfg.algo.drop_void_turns
    assert cfg.rollout.answer_pattern == env.answer_pattern


def test_gpu_example_config_is_valid(tmp_path):
    import inspect

    from agentrl.run.config import ConfigError, load_config
    from agentrl.envs.math_check import ANSWER_PATTERN

    path = ROOT / "examples" / "gpu_gsm8k_qwen2.5_1.5b.yaml"
    try:
        cfg = load_config(path)
    except ConfigError as e:  # model.engine arrives with the vLLM engine; check the rest now
        if "model.engine" not in str(e):
            raise
        stripped = tmp_path / "gpu.yaml"
        stripped.write_text(re.sub(r"\n  engine:[^\n]*", "", path.read_text()))
        cfg = load_config(stripped)
    assert cfg.env.name == "math" and cfg.algo.drop_void_turns
    assert cfg.rollout.answer_pattern == ANSWER_PATTERN
    inspect.signature(MathEnv).bind(**cfg.env.args)  # the args fit (not built: that needs the hub)


# -- training ------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_step_cpu_run_reports_void_turn_filtering(tmp_path):
    import torch

    from agentrl.run.config import load_config
    from agentrl.run.trainer import Trainer

    torch.set_num_threads(1)
    run = tmp_path / "run"
    Trainer(load_config(ROOT / "examples" / "math_tiny.yaml", [f"output_dir={run}"])).train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    n = 4 * 4  # prompts_per_step * num_samples
    for r in train_rows:
        assert "void_turns/frac" in r and "filter/dropped_void" in r
        # the filter is on: every attempt with a void turn left the loss
        assert r["filter/dropped_void"] == round(r["void_turns/frac"] * n)
        assert r["train/attempts"] == n - r["filter/dropped_void"]
    assert "eval/accuracy" in rows[-1]
    trajs = [json.loads(x) for x in (run / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajs) == n
    for t in trajs:  # every trajectory carries the checker's explanation
        assert {"extracted", "gold", "method", "reason"} <= set(t["score"])
