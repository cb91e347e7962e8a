"""The per-attempt agent loop and the continuously batched engine under it.

- continuous batching: requests arriving at different decode steps get the tokens (and, to
  float rounding, the log-probs) they get when run alone; stops, cancellation, prefix reuse;
- the per-attempt rollout: the same trajectories as the lock-step loop on a scripted engine,
  a slow tool in one attempt does not hold the others back (recorded timestamps), and on the
  real tiny model an attempt's tokens do not depend on which attempts share its batches.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig, RolloutRunner, attempt_seed
from agentrl.toolbox import ToolBox, tool
from agentrl.types import Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from scripted_turns import ScriptedTurnsEngine, TurnScript  # noqa: E402


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine.from_pretrained(ensure_tiny_model(), seed=0)


LONG = list(range(20, 60))  # longer than a prefix-cache block
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [3, 3, 3], [1, 2, 3, 4, 5, 6, 7]]


def params(i: int, temperature: float = 1.0, **kw) -> SamplingParams:
    # The first request is the longest, so the later ones join while it runs.
    return SamplingParams(max_new_tokens=40 - 3 * i, temperature=temperature, seed=100 + i, **kw)


async def until(predicate, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the batcher"
        await asyncio.sleep(0.0005)


async def staggered(engine: HFEngine, requests: list[tuple[list[int], SamplingParams]], gap_steps: int = 2):
    """Submit request i once the batcher has run i * gap_steps decode steps since the first."""
    base = engine.batcher_stats.steps

    async def one(i, prompt, p):
        if i:
            await until(lambda: engine.batcher_stats.steps >= base + i * gap_steps)
        return await engine.agenerate(prompt, p)

    return await asyncio.gather(*(one(i, prompt, p) for i, (prompt, p) in enumerate(requests)))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_joining_requests_get_the_tokens_they_get_alone(engine, temperature):
    requests = [(p, params(i, temperature)) for i, p in enumerate(PROMPTS)]
    engine.clear_prefix_cache()
    alone = [engine.generate([p], sp)[0] for p, sp in requests]
    joins = engine.batcher_stats.joins
    engine.clear_prefix_cache()
    together = asyncio.run(staggered(engine, requests))
    assert engine.batcher_stats.joins - joins >= 2  # rows really joined running batches
    for a, b in zip(alone, together):
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason == "length"
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_stops_and_prefix_reuse_inside_the_batcher(engine):
    probe = engine.generate([PROMPTS[0]], params(0))[0].token_ids
    stop_id = probe[4]  # the 5th sampled token: this request must stop there
    first = probe.index(stop_id) + 1
    text = engine.tokenizer.decode(probe[:7], skip_special_tokens=False)
    requests = [(PROMPTS[0], params(0, stop_token_ids=[stop_id])),
                (PROMPTS[0], params(0, stop_strings=[text[-3:]])),
                (LONG, params(1))]
    out = asyncio.run(staggered(engine, requests, gap_steps=1))
    assert out[0].token_ids == probe[:first] and out[0].finish_reason == "stop"
    assert out[1].finish_reason == "stop" and len(out[1].token_ids) <= 7
    assert engine.tokenizer.decode(out[1].token_ids, skip_special_tokens=False).endswith(text[-3:]) or \
        text[-3:] in engine.tokenizer.decode(out[1].token_ids, skip_special_tokens=False)
    # A follow-up turn extends a finished request: its KV comes from the prefix cache.
    follow = LONG + out[2].token_ids[:-1]
    alone = engine.generate([follow], params(3))[0]
    computed = []
    decoder_cls = type(engine.decoder)
    real_prefill = decoder_cls.prefill

    def counting(self, prompts, max_new):
        logits = real_prefill(self, prompts, max_new)
        computed.append(self.computed_tokens)
        return logits

    decoder_cls.prefill = counting
    try:
        again = asyncio.run(staggered(engine, [(follow, params(3))]))[0]
    finally:
        decoder_cls.prefill = real_prefill
    assert again.token_ids == alone.token_ids
    assert computed and computed[0] < len(follow)


def test_a_cancelled_request_leaves_the_batch_and_frees_its_slot(engine):
    async def scenario():
        long = asyncio.ensure_future(engine.agenerate(PROMPTS[2], SamplingParams(max_new_tokens=2000, seed=1)))
        await until(lambda: len(engine._batcher.rows) == 1)
        steps = engine.batcher_stats.steps
        short = asyncio.ensure_future(engine.agenerate(PROMPTS[1], SamplingParams(max_new_tokens=1000, seed=1)))
        await until(lambda: len(engine._batcher.rows) == 2)
        long.cancel()
        await until(lambda: len(engine._batcher.rows) == 1)  # its slot is gone...
        left = engine.batcher_stats.steps - steps
        result = await short  # ... while the other row still ran
        return left, result, long.cancelled()

    left, short, cancelled = asyncio.run(scenario())
    assert cancelled and left < 1000 and len(short.token_ids) == 1000
    assert short.token_ids == engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=1000, seed=1))[0].token_ids


def test_requests_from_two_event_loops_share_the_batch(engine):
    """Two threads, each with its own event loop (e.g. the async producer beside an
    evaluation): both are served, each request with the tokens it gets alone."""
    requests = [(p, params(i)) for i, p in enumerate(PROMPTS)]
    alone = [engine.generate([p], sp)[0].token_ids for p, sp in requests]
    out: dict[int, list] = {}

    def side(k: int) -> None:
        out[k] = asyncio.run(staggered(engine, requests[k::2]))

    threads = [threading.Thread(target=side, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert [g.token_ids for g in out[0]] == alone[0::2]
    assert [g.token_ids for g in out[1]] == alone[1::2]


# -- the rollout ------------------------------------------------------------------------------


@tool
def wait(key: str) -> str:
    """Look a key up (slowly for the key "slow").

    Args:
        key: what to look up.
    """
    start = time.monotonic()
    if key == "late" and LATE_AFTER:  # return once the others' next turn is a few steps in
        stats, begun = LATE_AFTER[0], LATE_AFTER[0].steps
        while stats.steps < begun + 3 and time.monotonic() - start < 10:
            time.sleep(0.001)
    else:
        time.sleep(1.0 if key == "slow" else 0.02)
    CALLS.append((key, start, time.monotonic()))
    return f"{key} = 42"


CALLS: list[tuple[str, float, float]] = []
LATE_AFTER: list = []  # the batcher stats a "late" call watches


def call_script(tok, tool_turns: int):
    """Each attempt calls ``wait`` ``tool_turns`` times (key from its task's prompt), then answers."""
    call_tag = tok.convert_tokens_to_ids("<tool_call>")
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def script(prompt: list[int], turn: int) -> list[int]:
        key = "slow" if "SLOW" in tok.decode(prompt) else "fast"
        if prompt.count(call_tag) < tool_turns:
            body = "<tool_call>\n" + json.dumps({"name": "wait", "arguments": {"key": key}}) + "\n</tool_call>"
        else:
            body = "<answer>42</answer>"
        return tok.encode(body, add_special_tokens=False) + [end]

    return script


def tasks(n: int, slow: int | None = None) -> list[Task]:
    return [Task(id=f"t{i}", prompt=f"question {i}{' SLOW' if i == slow else ''}", answer="42") for i in range(n)]


def test_attempt_loop_gives_the_lockstep_trajectories_on_a_script(engine):
    tok = engine.tokenizer
    chat = ChatTemplate(tok)
    box = ToolBox([wait], tokenizer=tok)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=64)
    script = call_script(tok, tool_turns=2)
    lock = RolloutRunner(ScriptedEngine(script), chat, box, cfg).run(tasks(3), 2, "sys")
    runner = RolloutRunner(PerRequestScriptedEngine(script), chat, box, cfg)
    assert runner.uses_attempt_loop
    per = runner.run(tasks(3), 2, "sys")
    assert per.stats.loop == "attempt" and lock.stats.loop == "lockstep"
    for a, b in zip(lock.trajectories, per.trajectories):
        b.check()
        assert (b.token_ids, b.loss_mask, b.logprobs, b.spans) == (a.token_ids, a.loss_mask, a.logprobs, a.spans)
        assert [(c.name, c.arguments, c.result, c.turn) for c in b.tool_calls] == \
            [(c.name, c.arguments, c.result, c.turn) for c in a.tool_calls]
        assert (b.finish_reason, b.turns, b.group_id, b.sample_index) == (a.finish_reason, a.turns, a.group_id,
                                                                          a.sample_index)
    # Attempts interleave: the second request of some attempt arrives before the last first request.
    assert per.stats.turns == sum(t.turns for t in per.trajectories) == 18


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_a_slow_tool_holds_back_only_its_own_attempt(engine, loop):
    tok = engine.tokenizer
    cfg = RolloutConfig(max_turns=4, max_new_tokens=64, loop=loop)
    script = call_script(tok, tool_turns=3)
    eng = PerRequestScriptedEngine(script) if loop == "attempt" else ScriptedEngine(script)
    CALLS.clear()
    batch = RolloutRunner(eng, ChatTemplate(tok), ToolBox([wait], tokenizer=tok), cfg).run(tasks(4, slow=0), 2)
    assert all(len(t.tool_calls) == 3 and t.finish_reason == "stop" for t in batch.trajectories)
    first_slow_end = min(end for key, _, end in CALLS if key == "slow")
    fast_done = max(end for key, _, end in CALLS if key == "fast")
    if loop == "attempt":  # every fast attempt made all its calls while the first slow one ran
        assert fast_done < first_slow_end
    else:  # lock-step: the fast attempts' second calls wait for the slow first one
        assert fast_done > first_slow_end


def scripted_real(engine: HFEngine, tool_turns: int = 2, turn_tokens: int = 24,
                  late_task: str | None = None) -> tuple[ScriptedTurnsEngine, ChatTemplate, ToolBox]:
    """``late_task``: that task's calls return only after the batcher has stepped 3 more times,
    so its next turn joins a running batch whatever the machine's load."""
    tok = engine.tokenizer

    def call(text: str) -> str:
        first = "<tool_call>" not in text  # only the first call: later, the others may be done
        key = "late" if late_task and late_task in text and first else "fast"
        return json.dumps({"name": "wait", "arguments": {"key": key}})

    script = TurnScript(tok, turn_tokens=turn_tokens, tool_turns=tool_turns, call=call,
                        answer=lambda text, sampled: "42")
    return ScriptedTurnsEngine(engine, script), ChatTemplate(tok), ToolBox([wait], tokenizer=tok)


def test_an_attempt_samples_the_same_tokens_whatever_shares_its_batches(engine):
    """Real sampling on the tiny model: attempt (task, sample) gets the same ids in a batch of
    4 tasks x 3 as in a batch of 1 task x 3 (its own random streams), through tool turns that
    make attempts join and leave the decode batch at different steps."""
    scripted, chat, box = scripted_real(engine, turn_tokens=48, late_task="question 1")
    LATE_AFTER[:] = [engine.batcher_stats]
    CALLS.clear()
    cfg = RolloutConfig(max_turns=3, max_new_tokens=48, max_total_tokens=4096)
    runner = RolloutRunner(scripted, chat, box, cfg)
    joins = engine.batcher_stats.joins
    big = runner.run(tasks(4), 3, seed=5)
    assert sum(key == "late" for key, _, _ in CALLS) == 3  # t1's first calls
    assert engine.batcher_stats.joins > joins
    small = runner.run(tasks(4)[2:3], 3, seed=5)
    mine = [t for t in big.trajectories if t.task_id == "t2"]
    for a, b in zip(mine, small.trajectories):
        b.check()
        assert a.token_ids == b.token_ids and a.sample_index == b.sample_index
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert len({tuple(t.token_ids) for t in mine}) == 3  # the G attempts differ
    assert attempt_seed(5, "t2", 0, 0) != attempt_seed(5, "t2", 1, 0)


def test_every_attempt_waiting_on_its_tool_does_not_deadlock(engine):
    """Every attempt calls a tool at the same moment: the batch empties, the driver stops,
    and restarts when the tools return."""
    scripted, chat, box = scripted_real(engine, tool_turns=3)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=24, max_total_tokens=4096)
    batch = asyncio.run(asyncio.wait_for(RolloutRunner(scripted, chat, box, cfg).arun(tasks(2), 2, seed=1), 120))
    assert all(t.finish_reason == "stop" and len(t.tool_calls) == 3 for t in batch.trajectories)
    assert batch.stats.tools_s > 0 and batch.stats.generate_s > 0


def test_a_failing_decode_step_fails_every_waiter_and_the_next_request_works(engine, monkeypatch):
    from agentrl.engines.decode import FastDecoder

    def broken(self, tokens):
        raise RuntimeError("decode step broke")

    async def two():
        return await asyncio.gather(engine.agenerate(PROMPTS[0], params(0)), engine.agenerate(PROMPTS[1], params(1)),
                                    return_exceptions=True)

    with monkeypatch.context() as m:
        m.setattr(FastDecoder, "step", broken)
        out = asyncio.run(asyncio.wait_for(two(), 60))
    assert all(isinstance(e, RuntimeError) and "decode step broke" in str(e) for e in out)
    assert asyncio.run(engine.agenerate(PROMPTS[1], params(1))).token_ids == \
        engine.generate([PROMPTS[1]], params(1))[0].token_ids


def test_turn_script_counts_tool_call_tags_written_as_plain_text():
    """Where "<tool_call>" is plain text (Mistral v3 here, SmolLM2 in the benchmark), the script
    still finds the calls it wrote in the prompt; a sampled head never keeps a "<", so the
    text a real model imitates from its context cannot open a tag of its own."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(__file__).parent / "fixtures" / "tokenizers" / "mistral-v3")
    script = TurnScript(tok, turn_tokens=40, tool_turns=2, call=lambda text: '{"name": "wait", "arguments": {}}',
                        answer=lambda text, sampled: "42", turn_end="</s>", decode_prompt=False)
    assert len(script.call_ids) > 1  # not one token in this vocabulary
    sampled = tok.encode("x <tool_call> y <answer>" * 8, add_special_tokens=False)[:40]
    prompt = tok.encode("user: what is 6 x 7?", add_special_tokens=False)
    observation = tok.encode("\ntool: 42\n", add_special_tokens=False)
    turns = []
    for _ in range(3):
        ids = script.ids(prompt, sampled)
        assert len(ids) == 40 and ids[-1] == tok.convert_tokens_to_ids("</s>")
        turns.append(tok.decode(ids))
        prompt = prompt + ids + observation
    assert [t.count("<tool_call>") for t in turns] == [1, 1, 0]
    assert "<answer>" not in turns[0] and turns[2].count("<answer>42</answer>") == 1
    assert script.turn_of(prompt) == 2


_EXIT_SCRIPT = """
import asyncio, threading, time
import torch
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.tiny import ensure_tiny_model
torch.set_num_threads(1)
engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
def client():  # a caller that never collects its result: a script ending mid-rollout
    asyncio.run(engine.agenerate([5, 6, 7], SamplingParams(max_new_tokens=100000, seed=1)))
threading.Thread(target=client, daemon=True).start()
while engine.batcher_stats.steps < 50:
    time.sleep(0.01)
print("exiting while the driver decodes", flush=True)
"""


def test_interpreter_exit_while_the_driver_decodes_is_clean(tmp_path):
    """A script that exits with a request in flight: the driver is closed at exit and leaves
    its busy period, instead of being killed inside a torch call (abort, exit status 134:
    "terminate called without an active exception", seen 4 times in 4 before the fix)."""
    import subprocess

    script = tmp_path / "exit_mid_decode.py"
    script.write_text(_EXIT_SCRIPT)
    for _ in range(2):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "exiting while the driver decodes" in out.stdout and "terminate called" not in out.stderr


def test_closing_a_driver_fails_its_requests_and_stops_it(engine):
    """``DriverThread.close`` (what the exit hook calls): the running request fails with a
    clear error at the next step, and the thread is gone."""
    result: dict = {}

    def client():
        try:
            asyncio.run(engine.agenerate([5, 6, 7], SamplingParams(max_new_tokens=100000, seed=1)))
        except RuntimeError as err:
            result["error"] = str(err)

    thread = threading.Thread(target=client)
    thread.start()
    start = engine.batcher_stats.steps
    while engine.batcher_stats.steps < start + 20:
        time.sleep(0.01)
    driver = engine._batcher.driver
    driver.close()
    thread.join(60)
    assert not thread.is_alive() and "closed" in result["error"]
    assert driver._thread is None and engine._batcher.rows == []
    driver.closing = False  # the module's engine serves the remaining tests
    assert len(asyncio.run(engine.agenerate([5, 6], SamplingParams(max_new_tokens=4, seed=2))).token_ids) == 4
