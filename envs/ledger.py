"""A ledger of pages that only fits the context two pages at a time: an environment where
context compaction matters (docs/compaction.md).

Each task names a ledger (a 3-digit id) of ``pages`` pages. The ``read(page)`` tool returns
one page of the attempt's own ledger (the tool finds the task by the attempt's id, its
``ToolContext``, so the model never has to copy the ledger's number into a call): a block of boilerplate with the page's 2-digit code in it. The answer is every
code, in page order: ``<answer>47 12 83</answer>``. A page's code is a seeded hash of the
ledger and the page, so it cannot be guessed or learned, only read.

Why it needs compaction: at the context budget of ``examples/compaction_tiny.yaml`` an attempt
holds two pages' results and the summary of them, not three. With ``rollout.compaction:
truncate`` the first page is gone by the time the model answers; with ``summarize`` the policy
writes the codes it has read into its summary ("codes 47 12 next 3") and the next segment, which
starts from the task and that summary, reads the last page and answers.

Every page is the same number of tokens for the tiny model's digit-level tokenizer, so each
copy (a code into the summary or the answer) is at a fixed distance:
what a ~0.5M-parameter model learns by SFT (see ``ArithmeticEnv``'s ``answer_width``). The
demonstrations (``demonstrations``) cover both shapes of a solved attempt: the whole ledger in
one context, and the two segments of a summarized one, the summary turn included.

Answer format: the last assistant turn holds ``<answer>C1 C2 ...</answer>``, the codes separated
by spaces or commas; only the model's own text counts (a code seen in a tool result does not),
several different tags are no answer, and digits other than ASCII ``0-9`` are refused.

Example::

    >>> from agentrl.types import Message
    >>> env = LedgerEnv(seed=0, num_train=4, num_test=2)
    >>> task = env.tasks("test")[0]
    >>> env.score(task, [Message("assistant", f"<answer>{task.answer}</answer>")]).reward
    1.0
    >>> [m.role for m in env.demonstrations(3, seed=0)[1]]   # a summarized attempt's first segment
    ['system', 'user', 'assistant', 'tool', 'assistant', 'tool', 'user', 'assistant']
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import TYPE_CHECKING

from agentrl.env import Score, Split, final_answer, foreign_digits, resume_messages, select_split
from agentrl.toolbox import ToolContext, tool  # at module level: the tool's type hints name ToolContext
from agentrl.types import Message, Task, ToolCall

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

SYSTEM_PROMPT = "Read each page, then reply <answer>codes</answer>."
COMPACTION_PROMPT = "Summarize."
# The boilerplate of a page: it is what fills the context (fixed text, fixed length).
FILLER = "entries carried forward, balance checked"


def page_code(seed: int, ledger: int, page: int) -> int:
    """The 2-digit code (10-99) of one page: a seeded hash, not learnable from the ids.

    >>> page_code(0, 123, 1) == page_code(0, 123, 1), 10 <= page_code(0, 123, 2) <= 99
    (True, True)
    """
    digest = hashlib.blake2b(f"ledger/{seed}/{ledger}/{page}".encode(), digest_size=4).digest()
    return 10 + int.from_bytes(digest, "little") % 90


def page_text(ledger: int, page: int, pages: int, code: int) -> str:
    """What ``read`` returns for one page (every page the same length).

    >>> page_text(123, 2, 3, 47).splitlines()[0]
    'ledger 123 page 2 of 3'
    """
    return f"ledger {ledger} page {page} of {pages}\n{FILLER}\ncode {code}"


def task_of(trajectory_id: str) -> str:
    """The task id in an attempt's id (the runner's ``<group prefix><task id>/<sample>``; task
    ids here hold no slash).

    >>> task_of("s3d0/train-5/2"), task_of("eval/test-1/0"), task_of("train-5/0")
    ('train-5', 'test-1', 'train-5')
    """
    return trajectory_id.rsplit("/", 2)[-2] if "/" in trajectory_id else trajectory_id


def parse_codes(text: str | None) -> list[int] | None:
    """The codes of an answer, separated by spaces or commas; None when it is not such a list.

    >>> parse_codes("47 12, 83"), parse_codes("47 x"), parse_codes("")
    ([47, 12, 83], None, None)
    """
    parts = [p for p in re.split(r"[\s,]+", text or "") if p]
    if not parts or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        return None
    return [int(p) for p in parts]


class LedgerEnv:
    """Read a ledger page by page and report every page's code, in order.

    Args:
        seed: fixes both splits and the codes.
        num_train, num_test: split sizes (distinct ledgers; at most 900 together).
        pages: pages per ledger.
        compaction_prompt: the instruction that asks a compacting attempt for its summary
            (``rollout.compaction_prompt`` defaults to it).
    """

    name = "ledger"

    def __init__(self, seed: int = 0, num_train: int = 600, num_test: int = 100, pages: int = 3,
                 compaction_prompt: str = COMPACTION_PROMPT):
        if num_train < 0 or num_test < 0 or num_train + num_test > 900:
            raise ValueError(f"num_train={num_train}, num_test={num_test}: use >= 0 each, at most 900 together "
                             "(there are 900 3-digit ledger ids)")
        if pages < 2:
            raise ValueError(f"pages={pages}: a ledger needs at least 2 pages")
        self.seed, self.pages = seed, pages
        self.system_prompt = SYSTEM_PROMPT
        self.compaction_prompt = compaction_prompt
        ids = random.Random(f"ledger-{seed}").sample(range(100, 1000), num_train + num_test)
        self._splits: dict[str, list[Task]] = {
            "test": [self._task("test", i, ledger) for i, ledger in enumerate(ids[:num_test])],
            "train": [self._task("train", i, ledger) for i, ledger in enumerate(ids[num_test:])],
        }
        self._ledger_of = {t.id: int(t.metadata["ledger"]) for ts in self._splits.values() for t in ts}

    # -- Environment protocol ------------------------------------------------------------

    def tools(self) -> list["Tool"]:
        seed, pages, ledger_of = self.seed, self.pages, self._ledger_of

        @tool
        def read(page: int, ctx: ToolContext) -> str:
            """Read one page of the ledger.

            Args:
                page: the page number, from 1
            """
            ledger = ledger_of.get(task_of(ctx.trajectory_id))
            if ledger is None:
                return f"Error: this attempt has no ledger (attempt {ctx.trajectory_id!r})"
            if not 1 <= page <= pages:
                return f"Error: no page {page} (pages 1-{pages})"
            return page_text(ledger, page, pages, page_code(seed, ledger, page))

        return [read]

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def score(self, task: Task, messages: list[Message]) -> Score:
        got = final_answer(messages)
        codes = None if foreign_digits(got) else parse_codes(got)
        want = [int(c) for c in task.answer.split()]
        right = 0 if codes is None else sum(a == b for a, b in zip(codes, want))
        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        return Score(reward=1.0 if codes == want else 0.0,
                     info={"has_answer": got is not None, "codes_right": right, "tool_calls": calls})

    # -- demonstrations for the warm start -----------------------------------------------

    def demonstrations(self, n: int, seed: int) -> list[list[Message]]:
        """``n`` correct conversations from train ledgers, cycling through three shapes: the
        whole ledger in one context; the first segment of a summarized attempt (pages 1 to
        pages-1, the compaction request, the summary "codes C1 C2 next K"); its last segment
        (task + summary, the last page, the answer)."""
        pool = self._splits["train"]
        if n > 0 and not pool:
            raise ValueError("demonstrations need train tasks; construct the env with num_train > 0")
        rng = random.Random(f"ledger-demo-{self.seed}-{seed}")
        out = []
        for i in range(n):
            task = rng.choice(pool)
            whole, first, last = self.demonstration(task)
            out.append((whole, first, last)[i % 3])
        return out

    def demonstration(self, task: Task) -> tuple[list[Message], list[Message], list[Message]]:
        """The ideal attempt at one task: in one context, and as a summarized attempt's two segments."""
        ledger = int(task.metadata["ledger"])
        codes = task.answer.split()
        head = [Message("system", self.system_prompt), Message("user", task.prompt)]
        answer = Message("assistant", f"<answer>{task.answer}</answer>")

        def read(page: int) -> list[Message]:
            call = ToolCall(name="read", arguments={"page": page})
            return [Message("assistant", "", tool_calls=[call]),
                    Message("tool", page_text(ledger, page, self.pages, int(codes[page - 1])), name="read")]

        pages = [m for p in range(1, self.pages + 1) for m in read(p)]
        whole = [*head, *pages, answer]
        summary = f"codes {' '.join(codes[:-1])} next {self.pages}"
        first = [*head, *pages[:-2], Message("user", self.compaction_prompt), Message("assistant", summary)]
        last = [*resume_messages(head, summary), *read(self.pages), answer]
        return whole, first, last

    def _task(self, split: str, i: int, ledger: int) -> Task:
        codes = [page_code(self.seed, ledger, p) for p in range(1, self.pages + 1)]
        prompt = f"Ledger {ledger}, {self.pages} pages: report each code."
        return Task(id=f"{split}-{i}", prompt=prompt, answer=" ".join(map(str, codes)), family=f"pages_{self.pages}",
                    metadata={"ledger": ledger})
