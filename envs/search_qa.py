"""Search-agent question answering: name the document a masked description comes from.

Every task is built from one document of a corpus (:func:`agentrl.tools.corpus.resolve_corpus`:
``"mini_wiki"``, ``"ovos_wiki"`` or a JSONL path): its first ``clue_sentences`` sentences with
the title, and each longer word of the title, replaced by ``___``. The agent searches the
corpus (tools ``search`` and ``open``), finds the described document and answers with its title.
The answer is verifiable (the title), needs the tool (the clue names no title) and is solvable:
:func:`gold_in_top_k` measures how often the gold document is among the top results for the
question text itself (``benchmarks/search.py`` reports it).

Answer format: the last assistant turn contains ``<answer>Title</answer>``. Comparison is exact
match after normalization (:func:`normalize_answer`: case, accents, punctuation, underscores
and the articles a/an/the are ignored). An answer that appears only in a tool result scores 0,
as do several different tags and digits the title does not hold (``１１`` for ``11``).

Splits: a document goes to ``test`` when a hash of (seed, document id) falls below
``test_fraction``, so splits are disjoint, deterministic and stable when documents are added.

Example::

    >>> from agentrl.types import Message
    >>> env = SearchQAEnv("mini_wiki", num_test=5)
    >>> task = env.tasks("test")[0]
    >>> "___" in task.prompt and task.answer not in task.prompt
    True
    >>> env.score(task, [Message("assistant", f"<answer>{task.answer.upper()}</answer>")]).reward
    1.0
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from agentrl.env import Score, Split, final_answer, foreign_digits, select_split
from agentrl.tools.corpus import Corpus, Document, resolve_corpus
from agentrl.tools.search_index import STOPWORDS
from agentrl.types import Message, Task, ToolCall

if TYPE_CHECKING:
    from agentrl.toolbox import Tool
    from agentrl.tools.search import SearchBackend

SYSTEM_PROMPT = (
    "You answer questions about a collection of documents. Use the search tool to find "
    "documents (open reads one by its id), then reply with the exact title inside <answer></answer>."
)
MASK = "___"
DEMO_QUERY_WORDS = 8  # demonstrations search with this many keywords of the clue
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_DISAMBIGUATOR = re.compile(r"\s*\([^)]*\)\s*$")
_WORD = re.compile(r"[^\W_]+")
_NON_WORD = re.compile(r"[\W_]+")
_MASK_RUN = re.compile(rf"{MASK}(?:[\s\-]+{MASK})+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, strip accents, punctuation, underscores and articles, squeeze spaces.

    >>> normalize_answer("  The Eiffel_Tower! "), normalize_answer("Ängström  (unit)")
    ('eiffel tower', 'angstrom unit')
    """
    if not text.isascii():
        text = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    text = _NON_WORD.sub(" ", text.lower())
    return " ".join(_ARTICLES.sub(" ", text).split())


def masked_clue(doc: Document, sentences: int = 2) -> str:
    """The first ``sentences`` sentences of ``doc.text`` with its title masked.

    Masked, case-insensitively and on word boundaries: the whole title (without a trailing
    ``(disambiguator)``), every title word of 4 or more letters or digits, and a one-word
    title of any length. Runs of masks collapse into one ``___``.

    >>> masked_clue(Document("v", "Vell of Harbour", "Vell of Harbour is a port. Vell trades tin. Later."), 2)
    '___ is a port. ___ trades tin.'
    """
    parts = _SENTENCE_END.split(doc.text.strip())
    clue = " ".join(parts[: max(1, sentences)])
    base = _DISAMBIGUATOR.sub("", doc.title).strip()
    phrase = [w.lower() for w in _WORD.findall(base)]
    single = {w for w in phrase if len(w) >= 4 or len(phrase) == 1}
    tokens = list(_WORD.finditer(clue))
    lowered = [m.group().lower() for m in tokens]
    out, pos, i, n = [], 0, 0, len(phrase)
    while i < len(tokens):
        width = n if n and lowered[i : i + n] == phrase else 1 if lowered[i] in single else 0
        if width:
            out += [clue[pos : tokens[i].start()], MASK]
            pos = tokens[i + width - 1].end()
        i += width or 1
    clue = "".join(out) + clue[pos:]
    # "___ ___" reveals how many words the title has; collapse runs of masks into one.
    return _MASK_RUN.sub(MASK, clue)


def keyword_query(clue: str, max_words: int = DEMO_QUERY_WORDS) -> str:
    """The first ``max_words`` distinct non-stopwords of a clue, as written: a short query.

    >>> keyword_query("___ is a port town of Vyfel at the mouth of the Dravmoum.", 4)
    'port town Vyfel mouth'
    """
    words = [w for w in _WORD.findall(clue) if w.lower() not in STOPWORDS]
    return " ".join(list(dict.fromkeys(words))[:max_words])


def question(clue: str) -> str:
    """The user prompt for one clue (kept short: its words are part of every search query)."""
    return f"Which entry is this? {clue}"


def in_test_split(doc_id: str, seed: int, test_fraction: float) -> bool:
    """Stable split: the hash of (seed, id) as a number in [0, 1) below ``test_fraction``."""
    h = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < test_fraction


def gold_in_top_k(tasks: Sequence[Task], backend: "SearchBackend", k: int = 5, query: str = "prompt") -> float:
    """Fraction of ``tasks`` whose gold document is in the top ``k`` hits for the task's
    ``prompt`` (``query="prompt"``) or its bare clue (``query="clue"``)."""
    if not tasks:
        return 0.0
    found = 0
    for t in tasks:
        text = t.prompt if query == "prompt" else str(t.metadata["clue"])
        found += any(h.id == t.metadata["doc_id"] for h in backend.search(text, k))
    return found / len(tasks)


class SearchQAEnv:
    """Name the document a masked description comes from, with search tools.

    Args:
        corpus: ``"mini_wiki"`` (shipped), ``"ovos_wiki"``/``"ovos_wiki:<lang>"`` or a JSONL path.
        backend: ``"local"`` (BM25 over the same corpus) or ``"ddgs"`` (the web).
        clue_sentences: how many leading sentences of a document form the clue.
        test_fraction: share of documents in the test split.
        num_train, num_test: caps on the split sizes (None: all); a seeded subset is kept.
        seed: fixes the split and the subsets.
        min_clue_words: documents whose clue has fewer words are skipped.
        top_k, max_top_k: default and maximum results per search call.
        max_open_chars: cap on the text the open tool returns.
        cache_dir: where the local index is cached (default: next to the corpus or ~/.cache/agentrl).
        ddgs_timeout: seconds per web search call, retries included (backend="ddgs").
    """

    name = "search_qa"
    system_prompt = SYSTEM_PROMPT

    def __init__(self, corpus: str | Path = "mini_wiki", *, backend: str = "local", clue_sentences: int = 2,
                 test_fraction: float = 0.2, num_train: int | None = None, num_test: int | None = None,
                 seed: int = 0, min_clue_words: int = 6, top_k: int = 5, max_top_k: int = 10,
                 max_open_chars: int = 2000, cache_dir: str | Path | None = None, ddgs_timeout: float = 10.0):
        if backend not in ("local", "ddgs"):
            raise ValueError(f"backend must be 'local' or 'ddgs', got {backend!r}")
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
        if clue_sentences < 1:
            raise ValueError(f"clue_sentences must be at least 1, got {clue_sentences}")
        self.corpus: Corpus = resolve_corpus(corpus)
        self.backend_name = backend
        self.seed = seed
        self.top_k, self.max_top_k, self.max_open_chars = top_k, max_top_k, max_open_chars
        self.cache_dir = cache_dir
        self.ddgs_timeout = ddgs_timeout
        self._backend: SearchBackend | None = None
        self._tools: list[Tool] | None = None
        splits: dict[str, list[Task]] = {"train": [], "test": []}
        for doc in _unambiguous(self.corpus.load()):
            clue = masked_clue(doc, clue_sentences)
            if len(clue.split()) < min_clue_words or _mentions(clue, doc.title):
                continue
            split = "test" if in_test_split(doc.id, seed, test_fraction) else "train"
            splits[split].append(Task(id=f"{split}-{doc.id}", prompt=question(clue), answer=doc.title,
                                      family="masked_title", metadata={"doc_id": doc.id, "clue": clue}))
        self._splits = {s: _subset(ts, cap, f"{seed}-{s}") for (s, ts), cap in
                        zip(splits.items(), (num_train, num_test))}

    # -- Environment protocol ------------------------------------------------------------

    def tools(self) -> list["Tool"]:
        if self._tools is None:
            from agentrl.tools.search import open_tool, search_tool  # lazy: tasks need no index

            b = self.backend()
            self._tools = [search_tool(b, default_top_k=self.top_k, max_top_k=self.max_top_k),
                           open_tool(b, max_chars=self.max_open_chars)]
        return list(self._tools)

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def score(self, task: Task, messages: list[Message]) -> Score:
        got = final_answer(messages)
        # NFKD folds look-alike digits (４, ²) into ASCII: refuse those the title does not hold
        correct = (got is not None and not foreign_digits(got) - foreign_digits(task.answer)
                   and normalize_answer(got) == normalize_answer(task.answer))
        calls = [c.name for m in messages if m.role == "assistant" for c in m.tool_calls]
        return Score(reward=1.0 if correct else 0.0,
                     info={"has_answer": got is not None, "tool_calls": len(calls),
                           "searches": calls.count("search"), "opens": calls.count("open")})

    # -- backend and demonstrations --------------------------------------------------------

    def backend(self) -> "SearchBackend":
        """The search backend the tools use (opened once; the local index is cached on disk)."""
        if self._backend is None:
            from agentrl.tools.search import make_backend

            if self.backend_name == "local":
                self._backend = make_backend("local", corpus=self.corpus, cache_dir=self.cache_dir)
            else:
                self._backend = make_backend("ddgs", timeout=self.ddgs_timeout)
        return self._backend

    def demonstrations(self, n: int, seed: int) -> list[list[Message]]:
        """``n`` correct conversations in rollout shape, from train tasks the search solves.

        system, user, assistant calling ``search(query=<keywords of the clue>)`` (see
        :func:`keyword_query`), the real observation, assistant ``<answer>Title</answer>``.
        Tasks whose gold document is not in the results are skipped, so no demonstration
        answers from nowhere. When ``n`` exceeds the solvable train tasks they repeat, in order.
        """
        search = self.tools()[0]
        pool = list(self._splits["train"])
        random.Random(f"searchqa-demo-{self.seed}-{seed}").shuffle(pool)
        out: list[list[Message]] = []
        for task in pool:
            if len(out) >= n:
                break
            observation = search.fn(query=keyword_query(task.metadata["clue"]), top_k=self.top_k)
            if f"(id: {task.metadata['doc_id']})" in observation:
                out.append(self.demonstration(task, observation))
        if n > 0 and not out:
            raise ValueError("no train task is solved by one keyword search; check the corpus and num_train")
        return [out[i % len(out)] for i in range(n)]

    def demonstration(self, task: Task, observation: str) -> list[Message]:
        """The ideal conversation for ``task`` given the search tool's ``observation``."""
        call = ToolCall(name="search", arguments={"query": keyword_query(task.metadata["clue"])})
        return [Message("system", self.system_prompt), Message("user", task.prompt),
                Message("assistant", "", tool_calls=[call]),
                Message("tool", observation, name="search"),
                Message("assistant", f"<answer>{task.answer}</answer>")]


def _mentions(clue: str, title: str) -> bool:
    """Whether the clue still names the title (after masking, e.g. through other spellings)."""
    return f" {normalize_answer(title)} " in f" {normalize_answer(clue)} "


def _unambiguous(docs: list[Document]) -> list[Document]:
    """Documents whose normalized title is unique: a clue must have exactly one right answer."""
    counts: dict[str, int] = {}
    for d in docs:
        key = normalize_answer(d.title)
        counts[key] = counts.get(key, 0) + 1
    return [d for d in docs if counts[normalize_answer(d.title)] == 1 and normalize_answer(d.title)]


def _subset(tasks: list[Task], cap: int | None, seed: str) -> list[Task]:
    if cap is None or cap >= len(tasks):
        return tasks
    if cap < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {cap}")
    keep = set(random.Random(seed).sample(range(len(tasks)), cap))
    return [t for i, t in enumerate(tasks) if i in keep]
