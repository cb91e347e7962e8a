"""``run_hosted`` (agentrl/engines/driver.py): while a per-attempt rollout runs, the calling
(main) thread serves the continuous batcher, so torch's OpenMP keeps one thread pool instead
of two (with two on 2 cores every parallel op paid a futex wake-up: a SmolLM2 decode step went
from 78 to 125 ms). What is computed does not change; where it runs does."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentrl.chat import ChatTemplate
from agentrl.engines.base import SamplingParams
from agentrl.engines.decode import FastDecoder
from agentrl.engines.driver import run_hosted
from agentrl.engines.hf import HFEngine
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.toolbox import ToolBox, tool
from agentrl.types import Task


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine.from_pretrained(ensure_tiny_model(), seed=0)


@tool
def echo(text: str) -> str:
    """Echo.

    Args:
        text: what to echo
    """
    return text


def _stepping_threads(monkeypatch) -> set[str]:
    """Names of the threads that run decode steps from now on."""
    seen: set[str] = set()
    inner = FastDecoder.step

    def step(self, tokens):
        seen.add(threading.current_thread().name)
        return inner(self, tokens)

    monkeypatch.setattr(FastDecoder, "step", step)
    return seen


def test_a_per_attempt_rollout_decodes_on_the_calling_thread(engine, monkeypatch):
    seen = _stepping_threads(monkeypatch)
    chat = ChatTemplate(engine.tokenizer)
    tasks = [Task(id=f"t{i}", prompt=f"What is {i}+1?", answer=str(i + 1)) for i in range(3)]
    for loop, where in (("attempt", threading.main_thread().name), ("lockstep", threading.main_thread().name)):
        seen.clear()
        runner = RolloutRunner(engine, chat, ToolBox([echo], tokenizer=engine.tokenizer),
                               RolloutConfig(max_turns=2, max_new_tokens=12, loop=loop))
        batch = runner.run(tasks, num_samples=2, seed=3)
        assert len(batch.trajectories) == 6 and batch.stats.loop == loop
        assert seen == {where}, (loop, seen)
    # the same attempts, the batcher on a thread of its own (plain asyncio.run): the same tokens
    runner = RolloutRunner(engine, chat, ToolBox([echo], tokenizer=engine.tokenizer),
                           RolloutConfig(max_turns=2, max_new_tokens=12, loop="attempt"))
    hosted = runner.run(tasks, num_samples=2, seed=3)
    seen.clear()
    own = asyncio.run(runner.arun(tasks, num_samples=2, seed=3))
    assert seen == {"agentrl-batcher"}
    assert [t.token_ids for t in hosted.trajectories] == [t.token_ids for t in own.trajectories]


def test_a_driver_thread_left_from_before_hands_its_work_to_the_host(engine, monkeypatch):
    """A driver thread still waiting out its idle period when hosting starts exits instead of
    serving (its OpenMP pool would be the second); requests reach the host."""
    asyncio.run(engine.agenerate([5, 6, 7], SamplingParams(max_new_tokens=3, seed=1)))
    driver = engine._batcher.driver
    monkeypatch.setattr(driver, "idle_exit_s", 60.0)  # so that the thread is surely still idling below
    asyncio.run(engine.agenerate([5, 6, 7], SamplingParams(max_new_tokens=3, seed=1)))  # leaves an idle thread
    assert driver._thread is not None and driver._thread.name == "agentrl-batcher"
    seen = _stepping_threads(monkeypatch)

    async def two():
        return await asyncio.gather(*(engine.agenerate([5, 6, k], SamplingParams(max_new_tokens=6, seed=k))
                                      for k in (8, 9)))

    out = run_hosted(two())
    assert [len(g.token_ids) for g in out] == [6, 6]
    assert seen == {threading.main_thread().name}


def test_errors_propagate_and_requests_after_hosting_get_a_thread(engine):
    async def boom():
        await engine.agenerate([5, 6], SamplingParams(max_new_tokens=2, seed=1))
        raise KeyError("from the rollout")

    with pytest.raises(KeyError, match="from the rollout"):
        run_hosted(boom())
    # no host any more: a request from another thread is served by a driver thread of its own
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("g", asyncio.run(
        engine.agenerate([5, 6], SamplingParams(max_new_tokens=3, seed=2)))))
    worker.start()
    worker.join(60)
    assert len(result["g"].token_ids) == 3


def test_off_the_main_thread_it_is_plain_asyncio_run(engine):
    seen = {}

    async def where():
        seen["loop thread"] = threading.current_thread().name
        return await engine.agenerate([5, 6], SamplingParams(max_new_tokens=2, seed=1))

    worker = threading.Thread(target=lambda: run_hosted(where()), name="a-rollout-thread")
    worker.start()
    worker.join(60)
    assert seen["loop thread"] == "a-rollout-thread"


@pytest.mark.parametrize("while_", ["serving", "waiting"])
def test_ctrl_c_stops_the_rollout_and_propagates(engine, while_):
    """Ctrl-C on the hosting thread, inside a decode step or while it waits for requests: the
    coroutine is cancelled (or its request failed) and unwinds, then the interrupt propagates."""
    import _thread

    state = {"unwound": False}
    entered = threading.Event()

    async def long():
        entered.set()
        try:
            if while_ == "waiting":
                await asyncio.sleep(600)
            await engine.agenerate([5, 6], SamplingParams(max_new_tokens=100_000, seed=1))
        except (asyncio.CancelledError, RuntimeError):
            state["unwound"] = True
            raise

    start = engine.batcher_stats.steps

    def interrupt():
        entered.wait(60)  # the rollout is running under run_hosted
        deadline = time.monotonic() + 60
        while while_ == "serving" and engine.batcher_stats.steps < start + 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2 if while_ == "waiting" else 0)
        _thread.interrupt_main()

    began = time.monotonic()
    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_hosted(long())
    assert state["unwound"] and time.monotonic() - began < 60
    # the engine serves on afterwards
    assert len(asyncio.run(engine.agenerate([5, 6], SamplingParams(max_new_tokens=3, seed=2))).token_ids) == 3
