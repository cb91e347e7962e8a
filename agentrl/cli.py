"""The ``agentrl`` command: train | eval | inspect | check-template | serve | audit-env | replay | config."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _cmd_train(args: argparse.Namespace) -> int:
    """CONFIG may be a YAML file, a run directory or a run's config.yaml; on ``resume=true``
    the run's saved config is used and only ``agentrl.run.resume.RESUMABLE`` overrides pass."""
    from agentrl.run.config import ConfigError
    from agentrl.run.report import run_report
    from agentrl.run.resume import load_train_config, resume_hint
    from agentrl.run.trainer import Trainer

    main_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 speaks for the run
    cfg = load_train_config(args.config, args.overrides, log=print if main_rank else (lambda *a: None))
    try:
        result = Trainer(cfg).train()
    except KeyboardInterrupt:
        if main_rank:
            print(run_report(cfg.run_dir), file=sys.stderr)
        print(f"stopped; {resume_hint(cfg.run_dir)}", file=sys.stderr)
        return 130
    except ConfigError:
        raise
    except Exception:  # a crash: say how to continue, then the traceback
        if main_rank:
            print(f"the run stopped on an error (traceback below); {resume_hint(cfg.run_dir)}", file=sys.stderr)
        raise
    if main_rank:
        print(run_report(result.run_dir))
        print(f"run written to {result.run_dir}  ({result.summary()})")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentrl.run.config import load_config
    from agentrl.run.eval_cli import run_eval_checkpoint

    cfg = load_config(args.config, args.overrides)
    res = run_eval_checkpoint(cfg, args.checkpoint)
    print(json.dumps(res.metrics(), indent=1))
    return 0


def _cmd_inspect(argv: list[str]) -> int:
    from agentrl.inspect.cli import run_inspect

    return run_inspect(argv)


def _cmd_check_template(args: argparse.Namespace) -> int:
    from agentrl.chat.check import run_check_corpus, run_check_template

    if args.corpus:
        return run_check_corpus(args.corpus, args.model)
    return run_check_template(args.model, args.template)


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentrl.run.serve_cli import serve

    return serve(args.model, host=args.host, port=args.port, template=args.template,
                 max_total_tokens=args.max_total_tokens, max_new_tokens=args.max_new_tokens)


def _cmd_audit_env(args: argparse.Namespace) -> int:
    from agentrl.run.audit import run_audit
    from agentrl.run.config import ConfigError

    try:
        env_args = json.loads(args.args)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--args must be a JSON object, e.g. '{{\"seed\": 1}}': {err}") from err
    if not isinstance(env_args, dict):
        raise ConfigError(f"--args must be a JSON object, got {args.args!r}")
    if args.tasks < 1:
        raise ConfigError(f"--tasks must be at least 1, got {args.tasks}")
    only = [n for n in (args.only or "").split(",") if n]
    return run_audit(args.env, num_tasks=args.tasks, env_args=env_args, as_json=args.json, only=only)


def _cmd_replay(args: argparse.Namespace) -> int:
    from agentrl.run.replay import last_taped_step, replay_step

    step = last_taped_step(args.run) if args.step == "last" else int(args.step)
    report = replay_step(args.run, step, live_tools=args.live_tools, rollout=not args.no_rollout,
                         update=not args.no_update)
    return 0 if report.ok else 1


def _cmd_config(args: argparse.Namespace) -> int:
    from agentrl.run.config_doc import render_markdown, render_text

    if args.markdown:
        if args.section:
            print("error: --markdown prints the whole reference (docs/config.md); drop SECTION", file=sys.stderr)
            return 2
        sys.stdout.write(render_markdown())
        return 0
    try:
        sys.stdout.write(render_text(args.section))
    except KeyError as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if from_command_line and argv[:1] == ["train"]:
        from agentrl.run.allocator import restart_with_jemalloc

        restart_with_jemalloc(argv)  # where jemalloc is installed: a lower peak (agentrl/run/allocator.py)
    if argv and argv[0] == "inspect":  # the inspector owns its own argument parser
        return _cmd_inspect(argv[1:])
    p = argparse.ArgumentParser(prog="agentrl", description="Train tool-using LLM agents with GRPO.")
    # agentrl.__version__ from the package, imported before any of its modules (an `import agentrl`
    # here would run sideways in the import graph: cli and agentrl share the top layer)
    p.add_argument("--version", action="version", version=f"agentrl {sys.modules['agentrl'].__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from a YAML config; key.sub=value overrides follow",
                       epilog="Every config key, its type, default and meaning: `agentrl config` "
                              "(one section: `agentrl config algo`), or docs/config.md.")
    t.add_argument("config")
    t.add_argument("overrides", nargs="*", help="e.g. train.steps=10 output_dir=/tmp/run resume=true "
                                                "(the keys: agentrl config)")
    t.set_defaults(fn=_cmd_train)
    e = sub.add_parser("eval", help="evaluate a checkpoint on the held-out split")
    e.add_argument("config")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--checkpoint", required=True,
                   help="checkpoints/step_XXXXXX directory (or a model dir, smollm2, a .gguf file)")
    e.set_defaults(fn=_cmd_eval)
    sub.add_parser("inspect", help="view masked trajectories (agentrl inspect --help)")
    c = sub.add_parser("check-template", help="check that a chat template is prefix-preserving for tool turns")
    c.add_argument("model", help="model name or local directory with a tokenizer, 'smollm2' or a .gguf file")
    c.add_argument("--template", default=None, help="template name in agentrl/templates or a .jinja file")
    c.add_argument("--corpus", metavar="DIR", default=None,
                   help="check every .jinja template in DIR with MODEL's tokenizer, one line each")
    c.set_defaults(fn=_cmd_check_template)
    s = sub.add_parser("serve", help="an OpenAI-compatible endpoint over a model or checkpoint")
    s.add_argument("model", help="a model directory, a checkpoint's HF directory, 'tiny', 'smollm2' or a .gguf file")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    s.add_argument("--template", default=None, help="chat template name or .jinja file (default: the tokenizer's)")
    s.add_argument("--max-total-tokens", type=int, default=4096, help="context: prompt + completion")
    s.add_argument("--max-new-tokens", type=int, default=1024, help="completion tokens when a request sets none")
    s.set_defaults(fn=_cmd_serve)
    a = sub.add_parser("audit-env", help="run known reward hacks against an environment; exit 1 if any earns reward",
                       epilog="The exploits and how to read the table: docs/reward_integrity.md.")
    a.add_argument("env", help="a built-in environment (arithmetic, math, ...) or module:Class / path/file.py:Class")
    a.add_argument("--tasks", type=int, default=3, help="train tasks tried per exploit (default 3)")
    a.add_argument("--args", default="{}", help="the environment's constructor arguments as JSON (env.args)")
    a.add_argument("--only", default=None, metavar="NAMES", help="comma-separated exploit names to run")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.set_defaults(fn=_cmd_audit_env)
    r = sub.add_parser("replay", help="re-run a recorded step from the run's tape; exit 1 where it differs",
                       epilog="What is recorded and what is guaranteed: docs/replay.md.")
    r.add_argument("run", help="the run directory")
    r.add_argument("--step", required=True, help="the step to replay (a number, or last)")
    r.add_argument("--live-tools", action="store_true",
                   help="run the tool calls again instead of serving them from the tape, and report where they differ")
    r.add_argument("--no-rollout", action="store_true", help="replay only the update")
    r.add_argument("--no-update", action="store_true", help="replay only the rollout")
    r.set_defaults(fn=_cmd_replay)
    g = sub.add_parser("config", help="the config reference: every key with its type, default and meaning")
    g.add_argument("section", nargs="?", default=None,
                   help="one section (model, env, rollout, algo, train, ...) or one key (algo.eps_high)")
    g.add_argument("--markdown", action="store_true", help="the whole reference as Markdown (docs/config.md)")
    g.set_defaults(fn=_cmd_config)
    args = p.parse_args(argv)
    from agentrl.run.config import ConfigError

    try:
        return args.fn(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
