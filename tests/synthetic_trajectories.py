"""SYNTHETIC trajectories for the viewer's tests: hand-written, not from any run.

(The README's screenshot is of a real run: examples/make_inspect_screenshot.py.)

Builds a GRPO group of tool-using arithmetic attempts in the Qwen2.5 / Hermes chat
format, tokenized with any ``encode(text) -> ids`` function (e.g. a Hugging Face
tokenizer's ``encode(text, add_special_tokens=False)``). Spans and masks follow
docs/design.md: the model's turns (including their ``<|im_end|>``) are trained, the
template scaffolding and tool output are not. Log-probs are synthetic but seeded.

Example::

    encode = lambda s: [ord(c) for c in s]          # a character "tokenizer"
    group = arithmetic_group(encode)
    assert [t.reward for t in group] == [1.0, 0.0, 1.0, 0.0]
    for t in group:
        t.check()
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.types import Message, Span, ToolCall, ToolCallRecord, TrainerMarks, Trajectory, Verdict

Encode = Callable[[str], list[int]]

SYSTEM = (
    "You are a careful assistant. Use the python tool for arithmetic. "
    "Put the final answer inside <answer></answer>.\n\n# Tools\n\n<tools>\n"
    '{"type": "function", "function": {"name": "python", "description": "Run Python code and return '
    'what it prints.", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, '
    '"required": ["code"]}}}\n</tools>'
)
QUESTION = "A shop sells 17 boxes of 23 pencils and 4 loose pencils. How many pencils is that?"


@dataclass(frozen=True)
class Turn:
    """One assistant turn and, if it called a tool, what the tool returned."""

    text: str
    code: str | None = None  # python tool call
    result: str | None = None
    error: str | None = None
    latency_s: float = 0.05


def _call_json(code: str) -> str:
    return json.dumps({"name": "python", "arguments": {"code": code}})


class _Builder:
    """Appends segments as token ids with their span kind, mask and log-probs."""

    def __init__(self, encode: Encode, rng: random.Random):
        self.encode, self.rng = encode, rng
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.lps: list[float] = []
        self.old: list[float] = []
        self.spans: list[Span] = []

    def add(self, kind: str, text: str) -> None:
        ids = self.encode(text)
        if not ids:
            return
        start = len(self.ids)
        trained = kind == "model"
        for _ in ids:
            # Most sampled tokens are likely; a few are surprising (long tail).
            lp = -abs(self.rng.gauss(0.0, 0.35)) if self.rng.random() > 0.08 else -self.rng.uniform(1.5, 6.0)
            drift = self.rng.gauss(0.0, 0.015) if self.rng.random() > 0.02 else self.rng.choice([-0.4, 0.35])
            self.lps.append(lp if trained else 0.0)
            self.old.append(min(0.0, lp + drift) if trained else 0.0)
        self.ids += ids
        self.mask += [1 if trained else 0] * len(ids)
        if self.spans and self.spans[-1].kind == kind:
            self.spans[-1].end = len(self.ids)
        else:
            self.spans.append(Span(start, len(self.ids), kind))


def build_trajectory(encode: Encode, turns: list[Turn], *, question: str = QUESTION, reward: float,
                     finish_reason: str = "stop", group_id: str = "demo", sample_index: int = 0,
                     seed: int = 0) -> Trajectory:
    """A multi-turn tool-using trajectory in the Qwen2.5 format from assistant turns."""
    b = _Builder(encode, random.Random(seed))
    b.add("prompt", f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    prompt_len = len(b.ids)
    messages = [Message("system", SYSTEM), Message("user", question)]
    records = []
    for k, turn in enumerate(turns):
        if k:
            b.add("template", "<|im_start|>assistant\n")
        last = k == len(turns) - 1
        body = turn.text + (f"\n<tool_call>\n{_call_json(turn.code)}\n</tool_call>" if turn.code else "")
        b.add("model", body + ("" if last and finish_reason == "length" else "<|im_end|>"))
        calls = [ToolCall("python", {"code": turn.code})] if turn.code else []
        messages.append(Message("assistant", turn.text, tool_calls=calls))
        if turn.code is None:
            continue
        observation = turn.result or ""
        records.append(ToolCallRecord("python", {"code": turn.code}, observation, turn.error, turn.latency_s, k))
        messages.append(Message("tool", observation, name="python"))
        b.add("template", "\n<|im_start|>user\n<tool_response>\n")
        b.add("tool", observation)
        b.add("template", "\n</tool_response><|im_end|>\n")
    return Trajectory(
        token_ids=b.ids, prompt_len=prompt_len, loss_mask=b.mask, logprobs=b.lps, spans=b.spans,
        messages=messages, tool_calls=records, verdict=Verdict(reward), group_id=group_id,
        sample_index=sample_index, finish_reason=finish_reason, policy_version=3,
        trained=TrainerMarks(old_logprobs=b.old),
    )


def group_advantages(rewards: list[float]) -> list[float]:
    """A_i = (r_i - mean r) / std r (population std); 0 for a zero-variance group."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [0.0 if std < 1e-6 else (r - mean) / std for r in rewards]


def arithmetic_group(encode: Encode, group_id: str = "step3/pencils") -> list[Trajectory]:
    """Four attempts at one question: tool use, mental slip, tool error then fix, truncation."""
    attempts = [
        ([Turn("I'll compute 17 × 23 + 4 with the tool.", "print(17 * 23 + 4)", "395"),
          Turn("The tool printed 395.\n<answer>395</answer>")], 1.0, "stop"),
        ([Turn("17 × 23 = 381, and 381 + 4 = 385.\n<answer>385</answer>")], 0.0, "stop"),
        ([Turn("Let me check with python.", "prnt(17 * 23 + 4)",
               'Traceback (most recent call last):\n  File "<cell>", line 1, in <module>\n'
               "NameError: name 'prnt' is not defined", "NameError", 0.03),
          Turn("Typo; again.", "print(17 * 23 + 4)", "395", None, 0.04),
          Turn("<answer>395</answer>")], 1.0, "stop"),
        ([Turn("First, 17 boxes. Each box has 23 pencils. So 17 boxes have 17 times 23 pencils, which is "
               "10 times 23 plus 7 times 23, that is 230 plus 161, hmm, let me redo: 7 times 23")], 0.0, "length"),
    ]
    rewards = [r for _, r, _ in attempts]
    out = []
    for i, ((turns, reward, finish), adv) in enumerate(zip(attempts, group_advantages(rewards))):
        t = build_trajectory(encode, turns, reward=reward, finish_reason=finish, group_id=group_id,
                             sample_index=i, seed=i)
        t.trained.advantage = adv
        out.append(t)
    return out


def long_trajectory(encode: Encode, turns: int = 20, min_tokens: int = 8000, seed: int = 0) -> Trajectory:
    """A ``turns``-turn tool-using trajectory of at least ``min_tokens`` tokens (for load tests)."""
    rng = random.Random(seed)
    per_turn = max(1, min_tokens // turns)

    def filler(n_tokens: int, make: Callable[[int], str]) -> str:
        text, k = "", 0
        while len(encode(text)) < n_tokens:
            text += make(k)
            k += 1
        return text

    steps = []
    for k in range(turns):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        text = filler(per_turn // 2, lambda j: f"Step {k}.{j}: combine {a + j} and {b - j}, then carry the "
                                              f"remainder into the running total. ")
        code = f"total = {a} * {b}\nfor i in range({k + 3}):\n    total += i * {a}\nprint(total)"
        result = filler(per_turn // 2, lambda j: f"partial[{j}] = {a * b + j * a}\n")
        steps.append(Turn(text, code, result))
    steps.append(Turn("<answer>done</answer>"))
    t = build_trajectory(encode, steps, reward=1.0, group_id="long", seed=seed)
    t.trained.advantage = 0.5
    return t


@dataclass(frozen=True)
class KnownExample:
    """A 15-token trajectory with a fixed vocabulary, for exact rendering tests."""

    trajectory: Trajectory
    vocab: dict[int, str]


def known_example() -> KnownExample:
    """Prompt, a tool call, the tool's answer, the final answer; old_logprobs recorded."""
    pieces = [  # (id, text, kind)
        (100, "<|im_start|>", "prompt"), (101, "user\n", "prompt"), (102, "2+3?", "prompt"),
        (103, "<|im_end|>\n", "prompt"), (100, "<|im_start|>", "prompt"), (104, "assistant\n", "prompt"),
        (105, "<tool_call>", "model"), (106, "add(2,3)", "model"), (107, "</tool_call>", "model"),
        (108, "<|im_end|>", "model"), (109, "\n<tool_response>", "template"), (110, "5", "tool"),
        (111, "</tool_response>\n", "template"), (112, "<answer>5</answer>", "model"), (108, "<|im_end|>", "model"),
    ]
    spans: list[Span] = []
    for i, (_, _, kind) in enumerate(pieces):
        if spans and spans[-1].kind == kind:
            spans[-1].end = i + 1
        else:
            spans.append(Span(i, i + 1, kind))
    mask = [1 if k == "model" else 0 for _, _, k in pieces]
    lps = [-0.25 * (i % 3) - 0.01 if m else 0.0 for i, m in enumerate(mask)]
    old = [lp + (0.5 if i == 13 else 0.0) if m else 0.0 for i, (lp, m) in enumerate(zip(lps, mask))]
    t = Trajectory(
        token_ids=[p[0] for p in pieces], prompt_len=6, loss_mask=mask, logprobs=lps, spans=spans,
        messages=[Message("user", "2+3?"), Message("assistant", "", tool_calls=[ToolCall("add", {"a": 2, "b": 3})]),
                  Message("tool", "5", name="add"), Message("assistant", "<answer>5</answer>")],
        tool_calls=[ToolCallRecord("add", {"a": 2, "b": 3}, "5", None, 0.125, 0)],
        verdict=Verdict(1.0), trained=TrainerMarks(advantage=1.5, old_logprobs=old), group_id="g-known",
        sample_index=2, finish_reason="stop", policy_version=7,
    )
    return KnownExample(t, {i: text for i, text, _ in pieces})


def seeded_update_batch(rewards: list[list[float]], seed: int = 0) -> list[Trajectory]:
    """Seeded trajectories for update tests, one group per row of ``rewards``: a prompt, a model
    turn, 3 tool tokens (untrained), a model turn; synthetic sampler log-probs."""
    rng, out = random.Random(seed), []
    for g, group in enumerate(rewards):
        prompt = [1] + [rng.randrange(11, 1000) for _ in range(5)]
        for i, r in enumerate(group):
            ids, mask = list(prompt), [0] * len(prompt)
            for kind, n in (("model", rng.randint(3, 8)), ("tool", 3), ("model", rng.randint(2, 5))):
                ids += [rng.randrange(11, 1000) for _ in range(n)]
                mask += [int(kind == "model")] * n
            lps = [-rng.uniform(0.1, 3.0) if k else 0.0 for k in mask]
            out.append(Trajectory(ids, len(prompt), mask, lps, [Span(0, len(prompt), "prompt")], [],
                                  verdict=Verdict(r), group_id=f"g{g}", sample_index=i, task_id=f"t{g}"))
    return out
