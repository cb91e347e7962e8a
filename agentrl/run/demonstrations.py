"""The warm start's data: an environment's demonstrations, a share of them made wrong on
purpose, each tokenized the way the rollout builds a trajectory (``loss_mask`` 1 on the
tokens the policy writes). ``agentrl.run.warmstart`` fine-tunes on them; see its docstring
for why some are wrong.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.run.config import CORRUPTION_KINDS, SFTSettings
from agentrl.types import Message

if TYPE_CHECKING:
    from agentrl.chat import ChatTemplate
    from agentrl.env import Environment


@dataclass
class Demonstration:
    """One conversation for the warm start; ``corrupted`` marks a deliberately wrong one."""

    messages: list[Message]
    corrupted: bool = False


@dataclass
class EncodedDemo:
    """One demonstration as the rollout would build it; ``loss_mask`` 1 on assistant tokens."""

    token_ids: list[int]
    loss_mask: list[int]
    corrupted: bool = False


# -- deliberate imperfection --------------------------------------------------------------


def corrupt_text(text: str, rng: random.Random, changes: int) -> str:
    """Change ``changes`` distinct characters: digits to other digits, letters to letters.

    >>> corrupt_text("12345", random.Random(0), 1) != "12345"
    True
    """
    positions = [i for i, ch in enumerate(text) if ch.isdigit() or ch.isalpha()]
    if not positions:
        return text + "0"  # nothing to alter: appending still makes it wrong
    chars = list(text)
    for i in rng.sample(positions, min(changes, len(positions))):
        pool = "0123456789" if chars[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
        chars[i] = rng.choice([c for c in pool if c != chars[i].lower()])
    return "".join(chars)


def _replace_answer(content: str, rng: random.Random, fraction: float) -> str:
    start, end = content.rfind("<answer>"), content.rfind("</answer>")
    if start < 0 or end < start:
        return content + "<answer>?</answer>"
    inner = content[start + len("<answer>"):end]
    changes = max(1, round(fraction * sum(ch.isalnum() for ch in inner)))
    return content[:start + len("<answer>")] + corrupt_text(inner, rng, changes) + content[end:]


def corrupt_demonstration(messages: list[Message], kind: str, rng: random.Random) -> list[Message]:
    """A deliberately wrong version of a demonstration (the original is not modified).

    ``guess``: drop every tool call and result; the final answer keeps its shape with about
    half its characters changed. ``miscopy``: keep the tool use; one character of the
    final answer changed.

    >>> demo = [Message("user", "2*3=?"), Message("assistant", "<answer>6</answer>")]
    >>> corrupt_demonstration(demo, "miscopy", random.Random(0))[-1].content != "<answer>6</answer>"
    True
    """
    if kind not in CORRUPTION_KINDS:
        raise ValueError(f"corruption kind {kind!r}; use one of {', '.join(CORRUPTION_KINDS)}")
    last = messages[-1]
    if last.role != "assistant":
        raise ValueError("a demonstration must end with an assistant turn holding the answer")
    if kind == "guess":
        head = [m for m in messages if m.role in ("system", "user")]
        return [*head, Message("assistant", _replace_answer(last.content, rng, 0.5))]
    return [*messages[:-1], Message("assistant", _replace_answer(last.content, rng, 0.0))]


def make_demonstrations(env: "Environment", settings: SFTSettings) -> list[Demonstration]:
    """The environment's demonstrations with a share ``settings.corruption`` made wrong.

    Exactly ``round(corruption * num_demos)`` demonstrations are corrupted, chosen at random
    (seeded), so every task family gets its share of wrong ones.
    """
    settings.check()
    demos = env.demonstrations(settings.num_demos, seed=settings.seed)  # type: ignore[attr-defined]
    rng = random.Random(f"warmstart-corrupt-{settings.seed}")
    bad = set(rng.sample(range(len(demos)), round(settings.corruption * len(demos))))
    return [Demonstration(corrupt_demonstration(d, settings.corruption_kind, rng), True) if i in bad
            else Demonstration(d) for i, d in enumerate(demos)]


# -- tokenization, as the rollout does it --------------------------------------------------


def encode_demonstration(chat: "ChatTemplate", messages: list[Message], tools: list[dict] | None,
                         corrupted: bool = False) -> EncodedDemo:
    """Ids and loss mask of a finished conversation, built as a rollout would build it.

    The leading system/user messages go through ``chat.encode_prompt``; each assistant
    turn is the template's rendering of that message after the generation prompt, up to
    and including the end-of-turn token (what a sampler emits; mask 1); the messages
    between assistant turns come from ``chat.continuation`` (mask 0).
    """
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a demonstration needs a prompt (system/user) followed by an assistant turn")
    history = list(messages[:first])
    ids = chat.encode_prompt(history, tools)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        m = messages[i]
        if m.role == "assistant":
            before = chat.render(history, tools, add_generation_prompt=True)
            after = chat.render(history + [m], tools)
            if not after.startswith(before):
                raise ValueError("the chat template renders an assistant turn that does not extend the "
                                 "generation prompt; use a prefix-preserving template (agentrl check-template)")
            text = after[len(before):]
            end = text.find(chat.turn_end)
            turn = chat.encode_template(text[: end + len(chat.turn_end)] if end >= 0 else text)
            ids += turn
            mask += [1] * len(turn)
            history.append(m)
            i += 1
            continue
        j = i
        while j < len(messages) and messages[j].role != "assistant":
            j += 1
        for seg in chat.continuation(history, messages[i:j], tools, sampled_end=chat.turn_end):
            ids += seg.token_ids
            mask += [0] * len(seg.token_ids)
        history += messages[i:j]
        i = j
    return EncodedDemo(ids, mask, corrupted)
