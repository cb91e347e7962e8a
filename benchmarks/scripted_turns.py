"""An engine wrapper that forces a tool-calling turn structure at the real cost of sampling.

A random-weight tiny model never writes a tool call, so a multi-turn benchmark on it would
measure one-turn rollouts. ``ScriptedTurnsEngine`` keeps everything that costs time real and
scripts only the *content* of each turn:

- every turn, the wrapped engine samples exactly ``turn_tokens`` tokens per row (stop tokens
  and stop strings disabled) over the row's real, growing prompt: real prefill, real KV-cached
  decode steps, real batch shrinking when rows finish at different turns;
- the turn the rollout receives is then: the row's own sampled ids (any added or special
  token among them, or any token holding a "<", swapped for a plain one, so the sampled text
  cannot open a tag or end a turn),
  cut to make room for a scripted tail: a tool call (turns before ``tool_turns``) or a final
  ``<answer>`` (the last turn), then the turn-end token. Exactly ``turn_tokens`` ids in all.
  The rollout parses it, runs the tool, appends the observation through the chat template,
  and the next turn's prompt is longer; the G attempts of a task diverge as real ones do.

The returned log-probs are those of the sampled tokens, so they are wrong on the scripted
tail and the swapped tokens (sampler/trainer mismatch metrics mean nothing under this
wrapper); the compute is unaffected.

Example::

    script = TurnScript(tokenizer, turn_tokens=40, tool_turns=3,
                        call=lambda prompt: '{"name": "wait", "arguments": {"key": "a"}}',
                        answer=lambda prompt, sampled: "42")
    engine = ScriptedTurnsEngine(HFEngine.from_pretrained(ensure_tiny_model()), script)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

from agentrl.engines.base import Generation, SamplingParams

_TOOL_OUT = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


def answer_from_tool_output(text: str, sampled: list[int]) -> str:
    """The answer turn of the scripted arithmetic workloads: the last tool result, made wrong
    (+1) on attempts whose first sampled token is odd, so groups have reward variance."""
    outs = _TOOL_OUT.findall(text)
    value = outs[-1].strip() if outs else "0"
    if sampled and sampled[0] % 2 and value.lstrip("-").isdigit():
        value = str(int(value) + 1)
    return value


@dataclass
class TurnScript:
    """What each forced turn says. ``call`` and ``answer`` get the decoded prompt of the row.

    ``call(prompt_text)`` returns the JSON object of a Hermes tool call; ``answer(prompt_text,
    sampled_ids)`` the text put inside ``<answer></answer>`` (the ids the model really sampled
    this turn can serve as a coin, so that some attempts of a group are right and some wrong). The turn of a row is the number of ``<tool_call>`` tags already in
    its prompt (the system prompt must have none: the tiny model's template renders tool
    schemas as JSON, not tags; SmolLM2's renders no tools).
    """

    tokenizer: object
    turn_tokens: int
    tool_turns: int
    call: Callable[[str], str]
    answer: Callable[[str, list[int]], str]
    turn_end: str = "<|im_end|>"
    # False: ``call``/``answer`` get "" instead of the decoded prompt (decoding a whole growing
    # conversation every turn is the script's cost, not the rollout's; skip it when unused).
    decode_prompt: bool = True

    def __post_init__(self) -> None:
        tok = self.tokenizer
        # The ids of "<tool_call>": one added token (Qwen), or plain text pieces (SmolLM2).
        self.call_ids = tok.encode("<tool_call>", add_special_tokens=False)
        self.end_id = tok.convert_tokens_to_ids(self.turn_end)
        self.plain = tok.encode("a", add_special_tokens=False)[0]
        self.banned = set(getattr(tok, "added_tokens_decoder", {}) or {}) | set(tok.all_special_ids)
        # A real model imitates the calls in its context: where tags are plain text (SmolLM2),
        # a sampled "<" could open a tag of its own; every token holding one is swapped too.
        pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
        self.banned |= {i for i, piece in enumerate(pieces) if piece and "<" in piece}

    def turn_of(self, prompt: list[int]) -> int:
        """Tool calls already in ``prompt``: occurrences of the "<tool_call>" ids (the rollout
        appends this script's ids verbatim, so they are found exactly)."""
        n, k, i = 0, len(self.call_ids), 0
        first = self.call_ids[0]
        while True:
            try:
                i = prompt.index(first, i)
            except ValueError:
                return n
            if prompt[i: i + k] == self.call_ids:
                n, i = n + 1, i + k
            else:
                i += 1

    def ids(self, prompt: list[int], sampled: list[int]) -> list[int]:
        """Exactly ``turn_tokens`` ids: sampled text, then the call or the answer, then the turn end."""
        text = self.tokenizer.decode(prompt, skip_special_tokens=False) if self.decode_prompt else ""
        if self.turn_of(prompt) < self.tool_turns:
            body = f"<tool_call>\n{self.call(text)}\n</tool_call>"
        else:
            body = f"<answer>{self.answer(text, sampled)}</answer>"
        tail = self.tokenizer.encode(body, add_special_tokens=False) + [self.end_id]
        room = self.turn_tokens - len(tail)
        if room < 0:
            raise ValueError(f"a scripted turn needs {len(tail)} tokens; raise turn_tokens (now {self.turn_tokens})")
        head = [self.plain if t in self.banned else t for t in sampled[:room]]
        return head + tail


class WrappedEngine:
    """An engine that changes what is sampled and nothing else: the protocol's bookkeeping
    (capabilities, policy version, weight sync, sleep, batcher counters) and every attribute
    the wrapper does not define (``tokenizer``, ...) are the ``inner`` engine's."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def capabilities(self):
        return self.inner.capabilities

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.inner.policy_version = value

    @property
    def batcher_stats(self):
        return self.inner.batcher_stats

    def sync_weights(self, model=None) -> None:
        self.inner.sync_weights(model)

    def sleep(self) -> None:
        self.inner.sleep()


class ScriptedTurnsEngine(WrappedEngine):
    """Samples for real with ``inner``, returns the script's ids (see the module docstring)."""

    def __init__(self, inner, script: TurnScript):
        super().__init__(inner)
        self.script = script

    def _forced(self, params: SamplingParams) -> SamplingParams:
        return replace(params, max_new_tokens=self.script.turn_tokens, stop_token_ids=[], stop_strings=[])

    def _scripted(self, prompt: list[int], g: Generation) -> Generation:
        if len(g.token_ids) != self.script.turn_tokens:
            raise RuntimeError(f"the inner engine sampled {len(g.token_ids)} tokens, expected {self.script.turn_tokens}")
        return Generation(self.script.ids(prompt, g.token_ids), list(g.logprobs), "stop")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        gens = self.inner.generate(prompts, self._forced(params))
        return [self._scripted(p, g) for p, g in zip(prompts, gens)]

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Generation:
        return self._scripted(prompt, await self.inner.agenerate(prompt, self._forced(params)))
