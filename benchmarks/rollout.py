"""Multi-turn rollout throughput vs single-turn batched generation (the tiny model, or ``--model``).

Question: do tool turns destroy batching, and does tool latency overlap? Both sides sample
the same number of tokens with the same engine over the same 8 prompts x G=8 = 64 rows:

- ``multi-turn``: ``RolloutRunner`` with ``--tool-turns`` turns that each call a tool
  sleeping ``--tool-ms`` (a plain sync function, run by the ToolBox), then one answer turn;
  measured with the per-attempt loop (``attempt``: one coroutine per attempt over the
  continuously batched engine) and with the ``lockstep`` loop (every row generates, then every
  tool runs). ``--long-tail`` makes every 16th tool call take 1.0 s instead.
  Every turn samples ``--turn-tokens`` real tokens per row (``ScriptedTurnsEngine``: real
  generation on the real growing prompts, scripted content so the random model "calls" the
  tool; see ``scripted_turns.py``). Time = the whole ``runner.run`` (generation, tools,
  template continuation, parsing, bookkeeping).
- ``single-turn``: one ``engine.generate`` over the 64 initial prompts with
  ``max_new_tokens = (tool_turns + 1) * turn_tokens`` and stops disabled, i.e. exactly the
  same sampled-token count in one batched call.

The ratio is multi-turn tokens/s over single-turn tokens/s (goals: >= 0.85, and >= 0.7 with
the long tail). "wall/busy" is each path's wall time over the seconds the engine computed
(the continuous batcher's ``busy_s`` per attempt; the generation calls in the other paths):
how much of the rollout the engine spent waiting on tools and Python.

    python benchmarks/rollout.py                     # 8 prompts x 8, 3 tool turns, 50 ms tool
    python benchmarks/rollout.py --long-tail         # every 16th call takes 1.0 s
    python benchmarks/rollout.py --threads 2 --repeats 5
    python benchmarks/rollout.py --model smollm2 --repeats 1   # SmolLM2-135M (make smollm2)
    python benchmarks/rollout.py --model smollm2 --long-tail --threads 2 --sampler-dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted_turns import ScriptedTurnsEngine, TurnScript  # noqa: E402

from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.base import SamplingParams  # noqa: E402
from agentrl.engines.driver import run_hosted  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.envs.arithmetic import ArithmeticEnv  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.rollout import RolloutConfig, RolloutRunner  # noqa: E402
from agentrl.toolbox import ToolBox, tool  # noqa: E402
from agentrl.types import Message  # noqa: E402

SYSTEM = "Look values up with the lookup tool, then reply <answer>N</answer>."


def make_lookup(delay_s: float, slow_every: int = 0, slow_s: float = 1.0):
    """The tool: sleeps ``delay_s``, or ``slow_s`` on every ``slow_every``-th call (0: never)."""
    calls = itertools.count(1)

    @tool
    def lookup(key: str) -> str:
        """Look up a stored value (a stand-in for a slow API: it sleeps, then answers).

        Args:
            key: what to look up.
        """
        n = next(calls)  # itertools.count is atomic under the GIL
        time.sleep(slow_s if slow_every and n % slow_every == 0 else delay_s)
        return f"{key} = 42"

    return lookup


@dataclass
class Timing:
    seconds: float
    tokens: int
    generate_s: float = 0.0
    tools_s: float = 0.0
    prefill_s: float = 0.0  # part of generate_s spent in the decoder's prefill
    prefill_tokens: int = 0  # prompt tokens the prefill ran (after prefix-cache hits and de-duplication)
    loop_cpu_s: float = 0.0  # CPU seconds of the rollout's own thread (templates, parsing, bookkeeping)
    # seconds the engine computed (prefill, sampling, decode steps, the batcher's cache moves):
    # the continuous batcher's busy_s per attempt; the generation calls themselves otherwise
    engine_busy_s: float = 0.0
    # of engine_busy_s (per attempt only): admissions (prefill + join), the decode steps' forward
    # passes, and the copies of the running KV cache at joins and compactions
    admit_s: float = 0.0
    step_s: float = 0.0
    copy_s: float = 0.0
    steps: int = 0  # decode steps the batcher ran (per attempt only)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


class PrefillClock:
    """Times every prefill of the engine's decoder class (the batch path's, and the batcher's
    admissions and joins) and counts the prompt tokens it ran through the model, after prefix
    cache hits and de-duplication (instrumentation only; the work is unchanged)."""

    def __init__(self, engine: HFEngine):
        self.seconds, self.tokens = 0.0, 0
        cls = type(engine.decoder)
        inner = cls.prefill
        clock = self

        def timed(decoder, prompts, max_new_tokens):
            start = time.perf_counter()
            out = inner(decoder, prompts, max_new_tokens)
            clock.seconds += time.perf_counter() - start
            ran = getattr(decoder, "computed_tokens", None)
            clock.tokens += ran if ran is not None else sum(len(p) for p in {tuple(p) for p in prompts})
            return out

        cls.prefill = timed

    def take(self) -> tuple[float, int]:
        out, self.seconds, self.tokens = (self.seconds, self.tokens), 0.0, 0
        return out


def run_multi_turn(runner: RolloutRunner, tasks, group: int, seed: int, tool_turns: int) -> Timing:
    stats = runner.engine.batcher_stats
    before = dataclasses.replace(stats)
    async def timed():  # the CPU time of the thread the attempts run on (not the engine's)
        cpu = time.thread_time()
        out = await runner.arun(tasks, group, SYSTEM, seed=seed)
        return out, time.thread_time() - cpu

    # as runner.run: per attempt, this thread serves the engine (engines/driver.py, run_hosted)
    batch, cpu = run_hosted(timed()) if runner.uses_attempt_loop else asyncio.run(timed())
    busy = stats.busy_s - before.busy_s
    for t in batch.trajectories:  # the script really drove every attempt through its tool turns
        ok = t.finish_reason == "stop" and len(t.tool_calls) == tool_turns and not any(c.error for c in t.tool_calls)
        assert ok, (t.finish_reason, t.tool_calls)
    s = batch.stats
    if runner.config.loop != "attempt":
        return Timing(s.total_s, s.sampled_tokens, s.generate_s, s.tools_s, loop_cpu_s=cpu, engine_busy_s=s.generate_s)
    return Timing(s.total_s, s.sampled_tokens, s.generate_s, s.tools_s, loop_cpu_s=cpu, engine_busy_s=busy,
                  admit_s=stats.admit_s - before.admit_s, step_s=stats.step_s - before.step_s,
                  copy_s=stats.copy_s - before.copy_s, steps=stats.steps - before.steps)


def run_single_turn(engine: HFEngine, prompts: list[list[int]], new_tokens: int, seed: int) -> Timing:
    start = time.perf_counter()
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed))
    seconds = time.perf_counter() - start
    return Timing(seconds, sum(len(g.token_ids) for g in gens), seconds, 0.0, engine_busy_s=seconds)


def median_timing(runs: list[Timing]) -> Timing:
    """The run with the median wall time (its breakdown stays consistent)."""
    return sorted(runs, key=lambda t: t.seconds)[len(runs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="G attempts per prompt")
    ap.add_argument("--tool-turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=40, help="sampled tokens per turn per row")
    ap.add_argument("--tool-ms", type=float, default=50.0)
    ap.add_argument("--long-tail", action="store_true", help="every 16th tool call takes 1.0 s")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the 2 cores here are shared)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per side after a warm-up; median reported")
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, a .gguf file or an HF directory")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--sampler-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="model.sampler_dtype: bfloat16 samples from bf16 copies of the weights")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.model == "tiny":
        path = str(ensure_tiny_model())
    else:
        from agentrl.run.build import resolve_model_path
        from agentrl.run.config import Config, ModelConfig

        path = resolve_model_path(Config(model=ModelConfig(path=args.model)))
    from agentrl.engines.sampler_dtype import sampler_dtype

    engine = HFEngine.from_pretrained(path, seed=0, sampler_dtype=sampler_dtype(args.sampler_dtype))
    tok = engine.tokenizer
    # The tiny model's template renders tools and detects its format; a template without tool
    # support (SmolLM2's) still renders tool messages, and the script writes Hermes calls.
    chat = ChatTemplate(tok) if args.model == "tiny" else ChatTemplate(tok, tool_call_format="hermes")
    toolbox = ToolBox([make_lookup(args.tool_ms / 1000, 16 if args.long_tail else 0)], tokenizer=tok)
    tasks = ArithmeticEnv(seed=0, num_train=args.prompts, num_test=0).tasks("train")
    script = TurnScript(tok, turn_tokens=args.turn_tokens, tool_turns=args.tool_turns,
                        call=lambda text: json.dumps({"name": "lookup", "arguments": {"key": "x"}}),
                        answer=lambda text, sampled: "42", decode_prompt=False)
    scripted = ScriptedTurnsEngine(engine, script)
    turns = args.tool_turns + 1
    runners = {loop: RolloutRunner(scripted, chat, toolbox, RolloutConfig(
        max_turns=turns, max_new_tokens=args.turn_tokens, max_total_tokens=8192, temperature=1.0, loop=loop))
        for loop in ("attempt", "lockstep")}
    prompts = [chat.encode_prompt([Message("system", SYSTEM), Message("user", t.prompt)], toolbox.schemas())
               for t in tasks for _ in range(args.group)]
    new_tokens = turns * args.turn_tokens

    # Warm-up every path (decoder probe, allocator, tokenizer caches), then alternate sides.
    for runner in runners.values():
        run_multi_turn(runner, tasks[:1], 2, seed=1, tool_turns=args.tool_turns)
    run_single_turn(engine, prompts[:2], 4, seed=1)
    clock = PrefillClock(engine)
    timings: dict[str, list[Timing]] = {"single-turn": [], "attempt": [], "lockstep": []}
    for r in range(args.repeats):
        for loop, runner in runners.items():
            timings[loop].append(run_multi_turn(runner, tasks, args.group, seed=100 + r, tool_turns=args.tool_turns))
            timings[loop][-1].prefill_s, timings[loop][-1].prefill_tokens = clock.take()
        timings["single-turn"].append(run_single_turn(engine, prompts, new_tokens, seed=100 + r))
        timings["single-turn"][-1].prefill_s, timings["single-turn"][-1].prefill_tokens = clock.take()
    med = {name: median_timing(runs) for name, runs in timings.items()}
    s = med["single-turn"]
    assert all(t.tokens == s.tokens for t in med.values()), {k: t.tokens for k, t in med.items()}
    rows = len(prompts)
    ratios = {loop: med[loop].tok_s / s.tok_s for loop in runners}
    lens = [len(t.token_ids) for t in runners["attempt"].run(tasks, args.group, SYSTEM, seed=7).trajectories]

    tail = ", every 16th call 1.0 s" if args.long_tail else ""
    print(f"{args.model} model, {args.prompts} prompts x G={args.group} = {rows} rows, {args.tool_turns} tool turns "
          f"+ 1 answer turn x {args.turn_tokens} sampled tokens, tool sleeps {args.tool_ms:g} ms{tail}, "
          f"torch threads {args.threads}, median of {args.repeats}")
    print(f"prompt {len(prompts[0])} tokens; final multi-turn sequence {min(lens)}..{max(lens)} tokens")
    print(f"{'path':<12} {'sampled':>8} {'wall s':>7} {'tok/s':>6} {'generate s':>11} {'(prefill s':>11} "
          f"{'prefill tok)':>13} {'tools s':>8} {'loop cpu s':>10} {'engine busy s':>14} {'wall/busy':>9}")
    for name, t in med.items():
        print(f"{name:<12} {t.tokens:>8} {t.seconds:>7.2f} {t.tok_s:>6.0f} {t.generate_s:>11.2f} {t.prefill_s:>11.2f} "
              f"{t.prefill_tokens:>13} {t.tools_s:>8.2f} {t.loop_cpu_s:>10.2f} {t.engine_busy_s:>14.2f} "
              f"{t.seconds / max(t.engine_busy_s, 1e-9):>9.2f}")
    a = med["attempt"]
    print(f"per attempt, the engine's busy {a.engine_busy_s:.2f} s: admissions (prefill + join) {a.admit_s:.2f} s, "
          f"decode steps {a.step_s:.2f} s, the rest (sampling, bookkeeping, compactions) "
          f"{a.engine_busy_s - a.admit_s - a.step_s:.2f} s; of all of it, KV cache copies {a.copy_s:.2f} s; "
          f"{a.steps} decode steps, {a.tokens / max(a.steps, 1):.1f} rows a step on average "
          f"(lock-step: {(args.tool_turns + 1) * args.turn_tokens} steps of {rows} rows)")
    print("(tools s: wall time with a tool call in flight; per attempt it overlaps generation. loop cpu s: CPU "
          "time of the rollout's thread, which shares the GIL with the thread serving the engine; lock-step "
          "generates on that thread too)")
    goal = 0.7 if args.long_tail else 0.85
    print(f"ratio multi-turn / single-turn tokens/s: per attempt {ratios['attempt']:.2f} (goal >= {goal}), "
          f"lock-step {ratios['lockstep']:.2f}; per attempt / lock-step "
          f"{med['lockstep'].seconds / med['attempt'].seconds:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "ratio": ratios["attempt"], "ratio_lockstep": ratios["lockstep"],
            **{name: vars(t) for name, t in med.items()}, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
