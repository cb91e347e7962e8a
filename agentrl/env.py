"""The environment protocol: tasks, system prompt, tools, and the checker.

An environment is one short file. It says where tasks come from (``train`` and ``test``
splits), what the system prompt is, which tools the agent gets, and how a finished
conversation is scored. The checker must read only what the model wrote: use
:func:`final_answer`, which looks at the last assistant turn only, so an answer that
appears only in a tool result never counts.

A walk-through, from a blank file to a custom environment with its own tool that learns on
the tiny model on CPU (tasks, checker, ``@tool``, demonstrations and the warm start, naming the
file in ``env.name``, reading a run that has no signal): docs/custom_env.md.

Final-answer format (documented for every built-in environment): the last assistant
turn contains ``<answer>...</answer>``; the text inside it is the answer. A turn whose tags
disagree (``<answer>41</answer> <answer>42</answer>``) has not committed to one answer and has
none; tags that repeat one answer count once (docs/reward_integrity.md).

Example::

    from agentrl.env import Score, final_answer
    from agentrl.types import Message, Task

    class Echo:
        name = "echo"
        system_prompt = "Repeat the word inside <answer></answer>."
        def tools(self):
            return []
        def tasks(self, split):
            return [Task(id="0", prompt="Say: hi", answer="hi")]
        def score(self, task, messages):
            got = final_answer(messages)
            return Score(reward=float(got == task.answer), info={"has_answer": got is not None})

    env = Echo()
    msgs = [Message("user", "Say: hi"), Message("assistant", "<answer>hi</answer>")]
    assert env.score(env.tasks("train")[0], msgs).reward == 1.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from agentrl.types import Message, Task

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

Split = Literal["train", "test"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class Score:
    """A checker's verdict. ``reward`` is in [0, 1]; ``info`` feeds per-run metrics."""

    reward: float
    info: dict[str, float | int | bool | str] = field(default_factory=dict)


class Environment(Protocol):
    """What every environment provides."""

    name: str
    system_prompt: str

    def tools(self) -> list["Tool"]:
        """The tools the agent may call (may be empty)."""
        ...

    def tasks(self, split: Split) -> list[Task]:
        """All tasks of a split; ``train`` and ``test`` must be disjoint."""
        ...

    def score(self, task: Task, messages: list[Message]) -> Score:
        """Score a finished conversation, reading only assistant-written text."""
        ...


@runtime_checkable
class HasDemonstrations(Protocol):
    """An environment that can write correct worked conversations: what the SFT warm start
    (``warmstart.enabled``) trains on. A randomly initialised model (``model.path: tiny``)
    needs them: without, all G attempts of every task get reward 0, GRPO has no signal
    (``groups/with_signal`` 0) and nothing is learned (docs/custom_env.md)."""

    def demonstrations(self, n: int, seed: int) -> list[list[Message]]:
        """``n`` conversations (system, user, assistant tool calls, tool results, answer)."""
        ...


@runtime_checkable
class HasAnswerPattern(Protocol):
    """An environment whose answers have a marker: a turn without a tool call that does not
    match ``answer_pattern`` (a regex) is a void turn (``rollout.answer_pattern`` defaults to it)."""

    answer_pattern: str


@runtime_checkable
class HasCompactionPrompt(Protocol):
    """An environment with its own instruction for the summary a compacting attempt writes
    (``rollout.compaction``: summarize, frozen_summary; ``rollout.compaction_prompt`` defaults
    to it; docs/compaction.md)."""

    compaction_prompt: str


@runtime_checkable
class HasAgent(Protocol):
    """An environment whose attempts are run by user code written against the OpenAI API:
    ``await agent(client, task)`` gets an ``openai.AsyncOpenAI`` client pointed at the trainer's
    endpoint (one per attempt) and returns its final answer (text) or its final messages (a
    list of OpenAI message dicts); ``score`` reads them as the last assistant message. See
    ``agentrl.rollout.agent_runner``."""

    async def agent(self, client, task: Task): ...


# Context compaction (agentrl.rollout.compaction, docs/compaction.md): the new context of a
# summarized attempt, here so that an environment's demonstrations can write it the same way.
DEFAULT_COMPACTION_PROMPT = ("Your context is full. Summarize what you have found so far and what is left "
                             "to do: the summary replaces the conversation.")
SUMMARY_HEADER = "Summary of your work so far:\n"


def resume_messages(head: list[Message], summary: str) -> list[Message]:
    """A summarized attempt's new context: the system prompt and the task, the summary added to
    the task's user message (one user turn: templates that require alternating roles render it).

    >>> [m.content for m in resume_messages([Message("user", "Add 3 pages.")], "total 12")]
    ['Add 3 pages.\\n\\nSummary of your work so far:\\ntotal 12']
    """
    *system, task = head
    return [*system, Message("user", f"{task.content}\n\n{SUMMARY_HEADER}{summary}")]


def select_split(splits: dict[str, list[Task]], split: str) -> list[Task]:
    """A copy of one split's tasks, with one clear error for a split that does not exist."""
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'test'")
    return list(splits[split])


def last_assistant_text(messages: list[Message]) -> str | None:
    """Content of the last assistant message, or None if the model never spoke."""
    for m in reversed(messages):
        if m.role == "assistant":
            return m.content
    return None


def answer_tags(text: str | None) -> list[str]:
    """The stripped contents of every ``<answer>...</answer>`` in ``text``, in order.

    >>> answer_tags("<answer> 41 </answer> or <answer>42</answer>")
    ['41', '42']
    """
    return [a.strip() for a in _ANSWER_RE.findall(text or "")]


def final_answer(messages: list[Message], *, strict: bool = True) -> str | None:
    """The text inside the ``<answer>...</answer>`` of the last assistant turn.

    Tool messages and earlier turns are ignored on purpose: a checker that read them
    would reward an answer the model merely saw. ``strict`` (the default): a turn with
    several tags that differ is a hedge, not an answer, and gives None (tags repeating the
    same answer count once); ``strict=False`` takes the last tag.

    >>> from agentrl.types import Message
    >>> final_answer([Message("assistant", "<answer>41</answer> <answer>42</answer>")]) is None
    True
    >>> final_answer([Message("assistant", "<answer>41</answer> <answer>42</answer>")], strict=False)
    '42'
    """
    found = answer_tags(last_assistant_text(messages))
    if not found or (strict and len(set(found)) > 1):
        return None
    return found[-1]


def foreign_digits(text: str | None) -> set[str]:
    """The digit characters of ``text`` that are not ASCII ``0-9`` (full-width ``４``,
    Arabic-Indic ``٤``, superscript ``⁴``...). A checker that refuses an answer holding digits
    the gold does not hold cannot be passed by a look-alike spelling (``int("４２") == 42``).

    >>> sorted(foreign_digits("４2٤²")), foreign_digits("42")
    (['²', '٤', '４'], set())
    """
    return {ch for ch in text or "" if ch.isdigit() and not "0" <= ch <= "9"}
