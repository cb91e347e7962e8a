"""Config loading, overrides, and the errors a user sees."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from agentrl.algo.batching import collate, plan_micro_batches
from agentrl.run.config import Config, ConfigError, load_config, save_config
from agentrl.algo.objective import describe_objective
from agentrl.types import Span, Trajectory


def test_defaults_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nalgo:\n  num_samples: 4\n  eps_high: 0.28\nenv:\n  args: {seed: 1, num_test: 5}\n")
    cfg = load_config(p, ["algo.eps_low=0.1", "train.steps=3", "env.args.seed=7", "output_dir=/tmp/r"])
    assert isinstance(cfg, Config)
    assert cfg.name == "x" and cfg.algo.num_samples == 4
    assert cfg.algo.eps_high == 0.28 and cfg.algo.eps_low == 0.1
    assert cfg.train.steps == 3
    assert cfg.env.args == {"seed": 7, "num_test": 5}
    assert str(cfg.run_dir) == "/tmp/r"
    assert load_config(None).run_dir.as_posix() == "runs/run"


def test_int_accepted_for_float_and_null_for_optional():
    cfg = load_config(None, ["optim.lr=1", "algo.dual_clip=3", "algo.dual_clip=null"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.algo.dual_clip is None


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    cfg = load_config(None, ["optim.lr=1e-6", "algo.std_floor=5E-3"])
    assert cfg.optim.lr == 1e-6 and isinstance(cfg.optim.lr, float) and cfg.algo.std_floor == 5e-3
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  lr: 3e-5\n")
    assert load_config(p).optim.lr == 3e-5
    with pytest.raises(ConfigError, match="optim.lr: expected float, got str 'fast'"):
        load_config(None, ["optim.lr=fast"])


@pytest.mark.parametrize("override, needle", [
    (["algo.nope=1"], "valid keys here: num_samples"),
    (["nosection.x=1"], "unknown config key 'nosection'"),
    (["algo.num_samples=many"], "algo.num_samples: expected int"),
    (["algo.agg=sum"], "not one of ['seq-mean-token-mean'"),
    (["resume=yes please"], "expected true/false"),
    (["train.steps"], "must look like key.sub=value"),
])
def test_errors_name_the_fix(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, override)
    assert needle in str(e.value)


def test_saved_config_reloads_identically(tmp_path):
    cfg = load_config(None, ["algo.kl_coef=0.01", "rollout.stop_strings=['</answer>']"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_objective_block_states_the_objective():
    text = describe_objective(load_config(None, ["algo.agg=token-mean", "algo.eps_high=0.28",
                                                  "algo.drop_zero_variance=true"]))
    for needle in ["(r_i - mean(r)) / std(r)", "std=population", "1-0.2, 1+0.28", "token-mean, DAPO",
                   "β = 0, no reference model", "drop zero-variance groups", "IS weight   off"]:
        assert needle in text


def test_micro_batches_bound_padded_tokens():
    lengths = [10, 50, 12, 48, 11, 100, 9]
    plan = plan_micro_batches(lengths, 100)
    assert sorted(i for b in plan for i in b) == list(range(7))
    for b in plan:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 100
    assert [5] in plan  # a row as long as the budget is alone


def test_collate_pads_right_and_keeps_mask():
    t = Trajectory(token_ids=[1, 2, 3], prompt_len=1, loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0],
                   spans=[Span(0, 1, "prompt"), Span(1, 3, "model")], messages=[])
    u = Trajectory(token_ids=[4, 5], prompt_len=1, loss_mask=[0, 1], logprobs=[0.0, -0.5],
                   spans=[Span(0, 1, "prompt"), Span(1, 2, "model")], messages=[])
    mb = collate([t, u], [1, 0], pad_id=0)
    assert mb.input_ids.tolist() == [[4, 5, 0], [1, 2, 3]]
    assert mb.attention_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert mb.loss_mask.tolist() == [[0, 1, 0], [0, 1, 1]]
    assert mb.sampler_logprobs.tolist() == [[0.0, -0.5, 0.0], [0.0, -1.0, -2.0]]


def test_objective_is_resolved_once_from_the_config():
    from agentrl.algo.objective import Objective

    default = Objective.from_config(load_config(None))
    # The objective's own defaults are the config's (norm_len resolved to the token budget).
    assert dataclasses.replace(default, sampling="") == Objective(norm_len=load_config(None).rollout.max_total_tokens)
    cfg = load_config(None, ["algo.agg=seq-mean-token-sum-norm", "rollout.max_total_tokens=300", "algo.kl_coef=0.1"])
    obj = Objective.from_config(cfg)
    assert obj.norm_len == 300 and obj.uses_reference and "(G · 300)" in obj.describe()
    assert describe_objective(cfg) == obj.describe()


def _another_value(tp, value):
    """A valid value of the annotation ``tp`` other than ``value``."""
    if typing.get_origin(tp) is typing.Literal:
        return next(a for a in typing.get_args(tp) if a != value)
    if value is None:
        return 3  # dual_clip, norm_len
    if isinstance(value, bool):
        return not value
    return value + "x" if isinstance(value, str) else value + 1


def test_every_algo_key_reaches_the_objective_and_its_printed_block():
    """The algo section and the objective are one definition (Objective extends AlgoConfig):
    from_config keeps every key, and changing any key changes the printed block, so a new
    field cannot be left out of the objective or of what a run prints."""
    from agentrl.algo.objective import Objective
    from agentrl.run.config import AlgoConfig

    keys = [f.name for f in dataclasses.fields(AlgoConfig)]
    assert [f.name for f in dataclasses.fields(Objective)] == keys + ["temperature", "sampling"]
    # every variant on, so the keys that only show with another (is_cap, refill_batch, ...) show
    base = load_config(None, ["algo.agg=seq-mean-token-sum-norm", "algo.norm_len=1000", "algo.kl_coef=0.1",
                              "algo.is_level=token", "algo.drop_zero_variance=true"])
    not_printed = {"max_refills"}  # the bound of agentrl.run.collect's refill loop, not the loss
    hints = typing.get_type_hints(AlgoConfig)
    for key in keys:
        cfg = dataclasses.replace(base, algo=dataclasses.replace(
            base.algo, **{key: _another_value(hints[key], getattr(base.algo, key))}))
        obj = Objective.from_config(cfg)
        assert all(getattr(obj, k) == getattr(cfg.algo, k) for k in keys), key
        assert (obj.describe() != describe_objective(base)) == (key not in not_printed), key


class EchoEngine:
    """A hypothetical new engine: the members of ``agentrl.engines.base.Engine`` and from_run."""

    from agentrl.engines.base import EngineCapabilities

    capabilities = EngineCapabilities(shares_trainer_weights=False, background_sampling=False, can_sleep=False)
    policy_version = 0
    batcher_stats = None

    @classmethod
    def from_run(cls, cfg, model, tokenizer, model_path):
        engine = cls()
        engine.seed, engine.model_path = cfg.seed, model_path
        return engine

    def generate(self, prompts, params):
        from agentrl.engines.base import Generation

        return [Generation([], [], "length") for _ in prompts]

    async def agenerate(self, prompt, params):
        from agentrl.engines.base import not_per_request

        raise not_per_request(self)

    def sync_weights(self, model=None):
        self.policy_version += 1

    def sleep(self):
        pass


def test_a_new_engine_is_one_class_and_one_registry_line(monkeypatch):
    """The trainer, the weight sync and the rollout thread read capabilities, never names."""
    from agentrl import engines
    from agentrl.run.build import make_engine
    from agentrl.run.producer import resolve_async

    monkeypatch.setitem(engines.ENGINES, "echo", f"{__name__}:EchoEngine")
    cfg = load_config(None, ["model.engine=echo", "seed=5"])
    engine = make_engine(cfg, None, None, "/some/model")
    assert isinstance(engine, EchoEngine) and (engine.seed, engine.model_path) == (5, "/some/model")
    with pytest.raises(ConfigError, match="model.engine=echo cannot.*model.engine=hf"):
        resolve_async(load_config(None, ["model.engine=echo", "train.max_staleness=1"]), 1)
    with pytest.raises(ConfigError, match=r"model.engine: 'sglang' is not one of \['hf', 'vllm', 'echo'\]"):
        load_config(None, ["model.engine=sglang"])


def test_tools_fork_server_switch_reaches_the_python_tool():
    from agentrl.run.build import configured_tools, make_env

    for on in (True, False):
        cfg = load_config(None, [f"tools.fork_server={str(on).lower()}"])
        (python,) = configured_tools(cfg, make_env(cfg))
        assert python.executor.config.fork_server is on
