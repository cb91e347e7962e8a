"""Every engine declares every member of ``agentrl.engines.base.Engine``.

Callers (the rollout runners, the endpoint, the trainer, the weight sync, the rollout thread)
use an engine only through the protocol and never probe it with getattr/hasattr, so an engine
missing a member would fail at its first use in a run; this test fails first. It covers the
registry's classes, the scripted engines and the benchmarks' wrappers: by the class (methods
and annotated attributes, also for vLLM, not installed here) and, where construction is
cheap, by the instance.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

import pytest

from agentrl.engines import ENGINES, engine_class
from agentrl.engines.base import Engine, EngineCapabilities, Generation, SamplingParams
from agentrl.engines.driver import BatcherStats
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_check.engines import FixedTokensEngine  # noqa: E402
from scripted_turns import ScriptedTurnsEngine  # noqa: E402

OPTIONAL = {"score": "can_score", "agenerate_stream": "streams"}  # declared only by the engines whose capability flag says so
PROTOCOL_MEMBERS = (set(Engine.__annotations__) | {n for n, v in vars(Engine).items()
                                                   if not n.startswith("_") and callable(v)}) - set(OPTIONAL)
METHODS = {"generate", "agenerate", "sync_weights", "sleep"}


def missing_members(cls: type) -> set[str]:
    """Protocol members ``cls`` neither defines nor annotates (on itself or a base class)."""
    declared = set(dir(cls)) | {n for c in cls.__mro__ for n in getattr(c, "__annotations__", {})}
    return PROTOCOL_MEMBERS - declared


ENGINE_CLASSES = [*(engine_class(name) for name in ENGINES), ScriptedEngine, PerRequestScriptedEngine,
                  ScriptedTurnsEngine, FixedTokensEngine]


def test_the_protocol_declares_what_callers_use():
    assert PROTOCOL_MEMBERS == {"capabilities", "policy_version", "batcher_stats", *METHODS}
    assert all(callable(vars(Engine)[name]) and hasattr(EngineCapabilities, flag) for name, flag in OPTIONAL.items())
    assert inspect.iscoroutinefunction(Engine.agenerate)


@pytest.mark.parametrize("cls", ENGINE_CLASSES, ids=lambda c: c.__name__)
def test_every_engine_class_declares_every_member(cls):
    assert missing_members(cls) == set()
    for name in METHODS:
        assert callable(inspect.getattr_static(cls, name)), name
    assert inspect.iscoroutinefunction(cls.agenerate)
    caps = inspect.getattr_static(cls, "capabilities")
    if isinstance(caps, EngineCapabilities):  # a wrapper's is the inner engine's (a property)
        for name, flag in OPTIONAL.items():  # what the flag promises is there
            assert not getattr(caps, flag) or callable(inspect.getattr_static(cls, name)), name


def test_hf_and_vllm_score_the_weights_they_sample_with():
    assert engine_class("hf").capabilities.can_score and engine_class("vllm").capabilities.can_score
    assert not ScriptedEngine.capabilities.can_score  # the weight-sync canary skips it


def test_only_the_hf_engine_decodes_under_a_grammar():
    """capabilities.constrained: the endpoint refuses response_format on the others (a 400)."""
    assert engine_class("hf").capabilities.constrained
    assert not engine_class("vllm").capabilities.constrained and not ScriptedEngine.capabilities.constrained


@pytest.mark.parametrize("name", list(ENGINES))
def test_registered_engines_build_from_a_run_config(name):
    cls = engine_class(name)
    assert isinstance(cls.capabilities, EngineCapabilities)
    assert inspect.ismethod(cls.from_run)  # a classmethod


def test_the_check_sees_a_missing_member():
    class NoSleep:
        capabilities = ScriptedEngine.capabilities
        policy_version: int
        batcher_stats = None
        generate = ScriptedEngine.generate
        agenerate = ScriptedEngine.agenerate
        sync_weights = ScriptedEngine.sync_weights

    assert missing_members(NoSleep) == {"sleep"}


def _check_instance(engine) -> None:
    for name in PROTOCOL_MEMBERS:
        # getattr_static: a wrapper's __getattr__ forwarding does not count as declaring
        inspect.getattr_static(engine, name)
    assert isinstance(engine.capabilities, EngineCapabilities)
    assert isinstance(engine.policy_version, int)
    assert engine.batcher_stats is None or isinstance(engine.batcher_stats, BatcherStats)
    engine.sleep()  # no engine here can sleep: a no-op
    version = engine.policy_version
    engine.sync_weights(None)
    assert engine.policy_version == version + 1


def test_scripted_engines_have_every_member():
    params = SamplingParams(max_new_tokens=4, stop_token_ids=[2])
    lockstep, per_request = ScriptedEngine([[5, 2]]), PerRequestScriptedEngine([[5, 2]])
    for engine in (lockstep, per_request):
        _check_instance(engine)
        assert engine.batcher_stats is None
    assert asyncio.run(per_request.agenerate([1], params)).token_ids == [5, 2]
    # calls of the lock-step engine are turns of one batch: served one by one they would be wrong
    assert not lockstep.capabilities.per_request_async
    with pytest.raises(NotImplementedError, match="ScriptedEngine does not serve requests one by one"):
        asyncio.run(lockstep.agenerate([1], params))


def test_benchmark_wrappers_have_every_member():
    inner = PerRequestScriptedEngine([[5, 2]])
    for engine in (ScriptedTurnsEngine(inner, None),
                   FixedTokensEngine(inner, plain_ids=10)):
        _check_instance(engine)
        assert inner.policy_version == engine.policy_version
    fixed = FixedTokensEngine(inner, plain_ids=10)
    params = SamplingParams(max_new_tokens=6)
    # the per-attempt loop gets the fixed tokens too, not the inner engine's
    for g in [*fixed.generate([[1], [2]], params), asyncio.run(fixed.agenerate([1], params))]:
        assert isinstance(g, Generation) and len(g.token_ids) == 6 and max(g.token_ids) < 10
    assert fixed.batcher_stats is None


def test_the_hf_engine_has_every_member():
    from agentrl.engines.hf import HFEngine
    from agentrl.models.tiny import ensure_tiny_model

    engine = HFEngine.from_pretrained(ensure_tiny_model())
    _check_instance(engine)
    assert isinstance(engine.batcher_stats, BatcherStats) and engine.capabilities.per_request_async
    # score: teacher-forced log-probs in the layout of the trainer's score_tokens (position 0 unscored)
    import torch

    from agentrl.algo.batching import MicroBatch, score_tokens

    seq = [1, 17, 250, 3, 99, 42]
    (row,) = engine.score([seq])
    ids = torch.tensor([seq])
    mask = torch.tensor([[0.0] + [1.0] * (len(seq) - 1)])
    with torch.no_grad():
        ref = score_tokens(engine.model, MicroBatch([0], ids, torch.ones_like(ids), mask, 0 * mask), 1.0)[0][0]
    assert row[0] == 0.0 and len(row) == len(seq) and (torch.tensor(row) - ref).abs().max().item() < 1e-5
