"""From a Config to live objects: model, tokenizer, engine, chat template, environment, tools."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentrl.env import HasAgent, HasAnswerPattern, HasCompactionPrompt, HasDemonstrations
from agentrl.envs import BUILTIN_ENVS, ENV_PREFIXES
from agentrl.run.config import Config, ConfigError

if TYPE_CHECKING:  # types only: build_runtime imports what it builds when it builds it
    from agentrl.chat import ChatTemplate
    from agentrl.engines.base import Engine
    from agentrl.rollout.base import Runner
    from agentrl.toolbox import ToolBox



def set_threads(num_threads: int | None, model: torch.nn.Module | None = None) -> int:
    """Set torch's CPU threads deliberately: on few shared cores, oversubscription is ~30x slower.

    ``None`` picks 1 thread for a small model (its ops are too short to split: on 2 cores a
    tiny-model GRPO step took 1.4 s with 1 thread and 3.8 s with 2), otherwise the cores,
    split between the ranks torchrun started on this machine.
    """
    if num_threads is None and model is not None:
        from agentrl.engines.hf import default_threads

        num_threads = default_threads(model, next(model.parameters()).device)
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "") or 1))
    n = num_threads or max(1, min(2, (os.cpu_count() or 1) // local_ranks))
    torch.set_num_threads(n)
    return n


def _import_module_or_file(name: str):
    """A module by dotted name, or a Python file by path (both relative to the working directory).

    - ``pkg.myenv``: imported from sys.path; when it is not there but ``./pkg/myenv.py`` (or a
      package ``./pkg/myenv/``) is, the working directory goes first on sys.path and it is
      imported from there (the ``agentrl`` script, unlike ``python -m``, does not put the working
      directory on sys.path), so ``env.name=myenv:MyEnv`` loads ``./myenv.py``;
    - ``path/to/myenv.py``: loaded from that file; its folder goes first on sys.path (as
      ``python path/to/myenv.py`` would put it) and stays there, so the file can import the
      modules beside it, at import time and later inside its methods.
    """
    def put_first_on_path(folder: Path) -> None:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))

    cwd = Path.cwd()
    if not name.endswith(".py"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            # Only the module itself (or its package) being absent falls back to the working
            # directory; a module that is found but fails on an import of its own says so as is.
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise
            local = cwd.joinpath(*name.split("."))
            if not (local.with_suffix(".py").is_file() or (local / "__init__.py").is_file()):
                raise ImportError(
                    f"no module named {name!r} on sys.path, and no file {local.with_suffix('.py')}; give "
                    f"an importable module (mypackage.myenv:MyEnv) or a file path (path/to/{local.name}.py:MyEnv)"
                ) from None
            put_first_on_path(cwd)
            importlib.invalidate_caches()
            return importlib.import_module(name)

    path = Path(name).resolve()
    if not path.is_file():
        raise ImportError(f"no file {path} (a path relative to the working directory {cwd})")
    mod_name = f"agentrl_user_{path.stem}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    put_first_on_path(path.parent)  # its sibling modules import by their plain names
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]  # a failed load is not cached: fixing the file and retrying works
        raise
    return module


def make_env(cfg: Config):
    """Instantiate the environment named in ``cfg.env`` with ``cfg.env.args``; a name
    ``PREFIX:SPEC`` with a prefix of ``ENV_PREFIXES`` passes SPEC as that class's keyword."""
    target, args = BUILTIN_ENVS.get(cfg.env.name, cfg.env.name), dict(cfg.env.args)
    prefix, sep, spec = cfg.env.name.partition(":")
    if sep and prefix in ENV_PREFIXES:
        target, keyword = ENV_PREFIXES[prefix]
        if keyword in args:
            raise ConfigError(f"env.name={cfg.env.name!r} names the {keyword} and env.args.{keyword} does too; keep one")
        args[keyword] = spec
    if ":" not in target:
        raise ConfigError(
            f"env.name={cfg.env.name!r} is not a built-in environment ({', '.join(BUILTIN_ENVS)}), "
            f"a family ({', '.join(f'{p}:NAME' for p in ENV_PREFIXES)}) "
            "nor an import path like 'mypackage.myenv:MyEnv' (a module, also found as ./mypackage/myenv.py) "
            "or 'path/to/file.py:MyEnv' (a file)"
        )
    mod_name, cls_name = target.rsplit(":", 1)
    try:
        cls = getattr(_import_module_or_file(mod_name), cls_name)
    except (ImportError, AttributeError, OSError) as e:
        raise ConfigError(f"cannot import environment {target!r}: {e}") from e
    if "tool_timeout" in cfg.env.args:
        raise ConfigError("env.args.tool_timeout is no longer read: a tool call's time limit has one "
                          "source, tools.timeout (e.g. `tools: {timeout: 10}`); move the value there")
    try:
        return cls(**args)
    except TypeError as e:
        raise ConfigError(f"env.args do not fit {cls_name}: {e}") from e


def resolve_model_path(cfg: Config, env=None) -> str:
    """The directory or hub name to load; builds the tiny model, converts a GGUF file (once,
    into the cache) and builds the warm start when asked."""
    from agentrl.models.names import resolve_shortcut

    path = resolve_shortcut(cfg.model.path, tiny_seed=cfg.model.tiny_seed, gguf_file=cfg.model.gguf_file)
    if cfg.warmstart.enabled:
        if not isinstance(env, HasDemonstrations):
            raise ConfigError(
                f"warmstart.enabled needs an environment with demonstrations(); {cfg.env.name!r} has none"
            )
        from agentrl.models.names import cached_snapshot, is_hub_name
        from agentrl.run.warmstart import warm_start

        if is_hub_name(path):  # the warm start reads a directory: the cached copy, or the fix at once
            path = cached_snapshot(path)
        ws = cfg.warmstart
        servers, demo_env = mcp_servers(cfg), env
        if servers:  # the demonstrations' prompts list the tools the rollouts will, MCP ones included
            demo_env = copy.copy(env)
            demo_env.tools = lambda: [*env.tools(), *servers]
        try:
            path = str(warm_start(path, demo_env, ws.settings(), tool_timeout=cfg.tools.timeout))
        finally:
            for server in servers:
                server.close()
    return path


def load_model_and_tokenizer(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """``from_pretrained`` with one clear message when the model cannot be had offline.

    A hub name loads from the local Hugging Face cache without asking the hub when
    ``HF_HUB_OFFLINE`` is set or the hub does not answer within seconds, and fails at once
    when it is not cached (``agentrl.models.names``), instead of after a minute of retries."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models.names import from_pretrained

    try:
        tok = from_pretrained(AutoTokenizer, path)
        model = from_pretrained(AutoModelForCausalLM, path, dtype=dtype)
    except ConfigError:  # a hub name that cannot be had offline: its own message, with the fix
        raise
    except (OSError, ValueError) as e:  # transformers raises ValueError for a folder without a tokenizer
        local = Path(path).exists()
        hint = (
            f"the directory {path} exists but holds no loadable model/tokenizer"
            if local
            else f"'{path}' is not a local directory and could not be fetched from the Hugging Face hub "
            "(offline or unknown name). Download it where you have network "
            "(`hf download NAME --local-dir DIR`) and set model.path=DIR, "
            "or use model.path=tiny for the offline tiny model"
        )
        raise ConfigError(f"cannot load model: {hint}. ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model.to(device), tok


@dataclass
class Runtime:
    """The live objects one run needs: policy, tokenizer, sampler, template, tools, rollout."""

    model: torch.nn.Module
    tokenizer: object
    engine: Engine
    chat: ChatTemplate
    toolbox: ToolBox
    runner: Runner  # a RolloutRunner, or an AgentRunner for an environment with its own agent
    sampler: torch.nn.Module | None = None  # the HF engine's own full-weight copy (FSDP runs)


def make_engine(cfg: Config, model, tokenizer, model_path: str):
    """The generation backend named by ``model.engine`` (see :data:`agentrl.engines.ENGINES`)."""
    from agentrl.engines import engine_class

    return engine_class(cfg.model.engine).from_run(cfg, model, tokenizer, model_path)


def configured_tools(cfg: Config, env) -> list:
    """The environment's tools with the run's tool settings applied (``tools.fork_server``), then
    the MCP servers of ``tools.mcp`` (tool sources: the ToolBox lists their tools)."""
    from agentrl.tools.python import PythonTool

    return [t.with_settings(fork_server=False) if isinstance(t, PythonTool) and not cfg.tools.fork_server else t
            for t in env.tools()] + mcp_servers(cfg)


def mcp_servers(cfg: Config) -> list:
    """One ``agentrl.toolbox.mcp.McpServer`` per ``tools.mcp`` entry (not started yet)."""
    if not cfg.tools.mcp:
        return []
    try:
        from agentrl.toolbox.mcp import McpServer
    except ImportError as exc:  # the mcp extra is not installed: one line, with the install
        raise ConfigError(f"tools.mcp lists {len(cfg.tools.mcp)} server(s), but {exc}") from None

    return [McpServer(spec) for spec in cfg.tools.mcp]


def build_runtime(cfg: Config, env, model_path: str, plan=None, device: str | None = None) -> Runtime:
    """Load the model at ``model_path`` and wire engine, chat template, tools and rollout.

    ``plan`` (an ``agentrl.scale.parallel.ParallelPlan``) lays the policy out for training (LoRA,
    gradient checkpointing, FSDP2); under FSDP an engine that reads the trainer's weights (HF) gets its own full-weight copy
    (``Runtime.sampler``) that ``agentrl.scale.weight_sync.WeightSync`` refreshes after each step.
    ``device`` overrides ``cfg.model.device`` (e.g. ``cuda:3`` for local rank 3).
    """
    from agentrl.chat import ChatTemplate
    from agentrl.rollout import RolloutRunner
    from agentrl.toolbox import ToolBox
    from agentrl.toolbox.faults import FaultPlan

    device = device or cfg.model.device
    sampler = None
    if plan is None or plan.plain:
        model, tok = load_model_and_tokenizer(model_path, device)
    else:
        from agentrl.scale.parallel import prepare_policy

        # FSDP moves each shard to the device itself: the full model never sits on one GPU.
        model, tok = load_model_and_tokenizer(model_path, "cpu" if plan.fsdp else device)
        from agentrl.engines import engine_class

        if plan.fsdp and engine_class(cfg.model.engine).capabilities.shares_trainer_weights:
            # FSDP shards the trainer's weights: an engine that reads them needs a full copy
            sampler = load_model_and_tokenizer(model_path, device, plan.compute_dtype)[0]
            sampler.requires_grad_(False).eval()
        model = prepare_policy(model, plan, cfg.lora, device)
    set_threads(cfg.model.num_threads, model)
    engine = make_engine(cfg, sampler if sampler is not None else model, tok, model_path)
    chat = ChatTemplate(tok, cfg.model.template, tool_call_format=cfg.model.tool_call_format,
                        lenient_tool_calls=cfg.model.lenient_tool_calls)
    faults = FaultPlan(cfg.rollout.fault_rate, cfg.seed) if cfg.rollout.fault_rate > 0 else None
    box = ToolBox(configured_tools(cfg, env), tokenizer=tok, default_timeout=cfg.tools.timeout,
                  max_output_tokens=cfg.tools.max_output_tokens, faults=faults,
                  infra_retries=cfg.tools.infra_retries, infra_backoff_s=cfg.tools.infra_backoff_s)
    rollout_cfg = cfg.rollout
    if rollout_cfg.answer_pattern is None and isinstance(env, HasAnswerPattern) and env.answer_pattern:
        rollout_cfg = dataclasses.replace(rollout_cfg, answer_pattern=env.answer_pattern)
    if rollout_cfg.compaction_prompt is None and isinstance(env, HasCompactionPrompt) and env.compaction_prompt:
        rollout_cfg = dataclasses.replace(rollout_cfg, compaction_prompt=env.compaction_prompt)
    if isinstance(env, HasAgent) and rollout_cfg.compaction != "none":
        raise ConfigError(f"rollout.compaction={rollout_cfg.compaction} compacts the built-in runner's attempts; "
                          f"{type(env).__name__} runs an OpenAI-API agent, which compacts by itself (a rewritten "
                          "history becomes a new segment): set rollout.compaction=none")
    if isinstance(env, HasAgent):  # user code against the OpenAI API runs the attempts
        from agentrl.rollout.agent_runner import AgentRunner

        runner = AgentRunner(engine, chat, env.agent, rollout_cfg, cfg.agent, toolbox=box, faults=faults)
    else:
        runner = RolloutRunner(engine, chat, box, rollout_cfg)
    return Runtime(model, tok, engine, chat, box, runner, sampler)


def resolve_fused_head(setting: str, model) -> bool:
    """``train.fused_head`` for this policy: "off" never; "on" always (an error where the
    head cannot be fused); "auto" where it can and the vocabulary is large enough for the
    [rows, V] logits to matter (``FUSED_HEAD_MIN_VOCAB``)."""
    from agentrl.algo.batching import FUSED_HEAD_MIN_VOCAB, FUSED_HEAD_TYPES, fused_head_parts

    if setting == "off":
        return False
    parts = fused_head_parts(model)
    if setting == "on" and parts is None:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ConfigError(f"train.fused_head=on needs a plain (not LoRA-wrapped, not sharded) causal LM of "
                          f"{', '.join(FUSED_HEAD_TYPES)} with a bias-free LM head; this policy is {kind}: "
                          "set train.fused_head=auto or off")
    return parts is not None and (setting == "on" or parts[1].shape[0] >= FUSED_HEAD_MIN_VOCAB)
