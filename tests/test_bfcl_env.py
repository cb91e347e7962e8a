"""The BFCL environment: data, split, tool schemas, the one-request agent, scoring, a 1-step run."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs.bfcl import CATEGORIES, BFCLEnv, to_tool_schema
from agentrl.types import ConfigError, Message, ToolCall

ROOT = Path(__file__).resolve().parents[1]
HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None

HYPOT = {"name": "math.hypot", "description": "Norm of (x, y).", "parameters": {"type": "dict", "properties": {
    "x": {"type": "float", "description": "x."}, "y": {"type": "integer", "description": "y."},
    "tags": {"type": "array", "items": {"type": "float"}, "description": "t."},
    "opts": {"type": "dict", "description": "o.", "properties": {"k": {"type": "tuple", "description": "k."}}},
    "any": {"type": "any", "description": "a."}}, "required": ["x", "y"]}}


def write_data(root: Path, n: int = 10) -> Path:
    """A BFCL-shaped folder: simple_python and irrelevance, n questions each."""
    (root / "possible_answer").mkdir(parents=True)
    simple = [{"id": f"simple_python_{i}", "question": [[{"role": "user", "content": f"hypot of {i} and 4"}]],
               "function": [HYPOT]} for i in range(n)]
    answers = [{"id": f"simple_python_{i}", "ground_truth": [{"math.hypot": {"x": [float(i)], "y": [4]}}]}
               for i in range(n)]
    irrelevant = [{"id": f"irrelevance_{i}", "question": [[{"role": "user", "content": "Who wrote Hamlet?"}]],
                   "function": [HYPOT]} for i in range(n)]
    for path, rows in [(root / "BFCL_v4_simple_python.json", simple), (root / "BFCL_v4_irrelevance.json", irrelevant),
                       (root / "possible_answer" / "BFCL_v4_simple_python.json", answers)]:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def env(tmp_path):
    return BFCLEnv(categories=["simple", "irrelevance"], data_dir=str(write_data(tmp_path)), test_fraction=0.3)


def reply(*calls, text=""):
    return [Message("user", "q"), Message("assistant", text, tool_calls=[ToolCall(n, a) for n, a in calls])]


def test_split_is_seeded_stratified_disjoint_and_interleaved(tmp_path):
    root = str(write_data(tmp_path))
    env = BFCLEnv(categories=["simple_python", "irrelevance"], data_dir=root, test_fraction=0.3, seed=1)
    test, train = env.tasks("test"), env.tasks("train")
    assert len(test) == 6 and len(train) == 14 and not {t.id for t in test} & {t.id for t in train}
    assert [t.family for t in test[:4]] == ["simple_python", "irrelevance"] * 2
    again = BFCLEnv(categories=["simple_python", "irrelevance"], data_dir=root, test_fraction=0.3, seed=1)
    other = BFCLEnv(categories=["simple_python", "irrelevance"], data_dir=root, test_fraction=0.3, seed=2)
    assert [t.id for t in again.tasks("test")] == [t.id for t in test]
    assert [t.id for t in other.tasks("test")] != [t.id for t in test]


def test_user_errors_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown BFCL categories.*live_simple.*choose from simple_python"):
        BFCLEnv(categories=["live_simple"], data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="pip install --no-deps bfcl-eval"):
        BFCLEnv(categories=["multiple"], data_dir=str(tmp_path))  # a folder without that category
    with pytest.raises(ConfigError, match="test_fraction=1.5"):
        BFCLEnv(categories=["simple"], data_dir=str(write_data(tmp_path / "d")), test_fraction=1.5)
    (tmp_path / "d" / "possible_answer" / "BFCL_v4_simple_python.json").unlink()
    with pytest.raises(ConfigError, match="no possible answers"):
        BFCLEnv(categories=["simple"], data_dir=str(tmp_path / "d"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="bfcl-eval package, which is not installed: pip install --no-deps"):
        BFCLEnv()


def test_tool_schemas_are_converted_as_bfcl_converts_them():
    tool = to_tool_schema(HYPOT)["function"]
    props = tool["parameters"]["properties"]
    assert tool["name"] == "math_hypot" and tool["description"].endswith("in Python 3 syntax.")
    assert tool["parameters"]["type"] == "object" and tool["parameters"]["required"] == ["x", "y"]
    assert props["x"] == {"type": "number", "description": "x. This is a float type value.", "format": "float"}
    assert props["y"]["type"] == "integer" and props["any"]["type"] == "string"
    assert props["tags"]["items"] == {"type": "number"}
    assert props["opts"]["type"] == "object" and props["opts"]["properties"]["k"]["type"] == "array"
    assert HYPOT["parameters"]["type"] == "dict"  # the task's own document is left as BFCL wrote it
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(tool["parameters"])


def test_the_agent_sends_one_request_with_the_tasks_tools(env):
    task = env.tasks("train")[0]
    sent = []

    class Completions:
        async def create(self, **kw):
            sent.append(kw)

    client = type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})()})()
    assert asyncio.run(env.agent(client, task)) is None  # the endpoint's captured reply is the attempt
    assert len(sent) == 1 and sent[0]["tools"] == task.metadata["tools"]
    assert sent[0]["messages"] == [{"role": "user", "content": task.prompt}]
    env.system_prompt = "Call functions."
    asyncio.run(env.agent(client, task))
    assert sent[1]["messages"][0] == {"role": "system", "content": "Call functions."}
    assert env.tools() == []


def test_score_is_bfcls_verdict_on_the_replys_calls(env):
    simple = next(t for t in env.tasks("train") if t.family == "simple_python")
    irrelevant = next(t for t in env.tasks("train") if t.family == "irrelevance")
    x = simple.metadata["possible_answer"][0]["math.hypot"]["x"][0]
    right = env.score(simple, reply(("math_hypot", {"x": int(x), "y": 4})))
    assert right.reward == 1.0 and right.info == {"category": "simple_python", "valid": True, "error_type": "",
                                                  "calls": 1}
    assert env.score(simple, reply(("math_hypot", {"x": x, "y": 5}))).info["error_type"] == "value_error:others"
    assert env.score(simple, reply(text=f"math_hypot(x={x}, y=4)")).reward == 0.0  # text is no call
    assert env.score(irrelevant, reply(text="Shakespeare.")).reward == 1.0
    assert env.score(irrelevant, reply(("math_hypot", {"x": 1.0, "y": 4}))).reward == 0.0


def test_only_the_models_own_last_reply_counts(env):
    simple = next(t for t in env.tasks("train") if t.family == "simple_python")
    x = simple.metadata["possible_answer"][0]["math.hypot"]["x"][0]
    good = ToolCall("math_hypot", {"x": x, "y": 4})
    # a right call in an earlier turn, a tool result or the user's message does not count
    earlier = [Message("user", "q"), Message("assistant", "", tool_calls=[good]), Message("tool", "ok"),
               Message("assistant", "done")]
    assert env.score(simple, earlier).reward == 0.0
    assert env.score(simple, [Message("user", json.dumps({"name": "math_hypot", "arguments": {"x": x, "y": 4}}))]).reward == 0.0


@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)")
def test_the_installed_package_gives_all_1240_questions():
    env = BFCLEnv(seed=0)
    tasks = env.tasks("train") + env.tasks("test")
    assert len(tasks) == 1240 and len(env.tasks("test")) == 248
    assert {t.family for t in tasks} == set(CATEGORIES)


@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)")
def test_example_config_trains_one_step(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "agentrl", "train", str(ROOT / "examples" / "bfcl_tiny.yaml"),
                           f"output_dir={run}", "train.steps=1", "eval.num_tasks=5"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trajs = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert len(trajs) == 16
    for t in trajs:
        assert t["score"]["category"] in CATEGORIES and t["score"]["valid"] == (t["reward"] == 1.0)
        assert t["agent"] is not None and t["messages"][-1]["role"] == "assistant"  # the one reply, scored
    evals = [json.loads(line) for line in (run / "rollouts" / "eval_step_000000.jsonl").read_text().splitlines()]
    assert {e["family"] for e in evals} == set(CATEGORIES)  # test tasks interleave the categories


def test_a_call_written_by_the_model_is_parsed_by_the_endpoint_and_scored(env):
    """End to end, real endpoint and SDK: the task's functions reach the chat template, the
    model's hermes call comes back as a tool call, and the checker scores it."""
    pytest.importorskip("openai")
    from transformers import AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.engines.scripted import PerRequestScriptedEngine
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.rollout import RolloutConfig
    from agentrl.rollout.agent_runner import AgentRunner, AgentSettings
    from agentrl.run.scoring import score_all

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    simple = next(t for t in env.tasks("train") if t.family == "simple_python")
    irrelevant = next(t for t in env.tasks("train") if t.family == "irrelevance")
    x = simple.metadata["possible_answer"][0]["math.hypot"]["x"][0]
    call = f'<tool_call>\n{{"name": "math_hypot", "arguments": {{"x": {int(x)}, "y": 4}}}}\n</tool_call>'
    seen = []

    def script(prompt, _k):
        seen.append(tok.decode(prompt))
        return tok.encode(call, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]

    runner = AgentRunner(PerRequestScriptedEngine(script), ChatTemplate(tok), env.agent,
                         RolloutConfig(max_new_tokens=64, max_total_tokens=1024), AgentSettings(timeout_s=30))
    try:
        batch = runner.run([simple, irrelevant], 1)
    finally:
        runner.close()
    assert all("math_hypot" in p for p in seen)  # the task's own function is offered
    trajs = batch.trajectories
    score_all(env, {t.id: t for t in (simple, irrelevant)}, trajs)
    assert [t.messages[-1].tool_calls[0].name for t in trajs] == ["math_hypot"] * 2
    assert [t.verdict.reward for t in trajs] == [1.0, 0.0]  # right for the question, wrong for irrelevance
