"""The ``search`` and ``open`` tools: find documents by keywords, then read one by id.

Two backends behind one interface (:class:`SearchBackend`):

- ``local`` (default): BM25 over a SQLite FTS5 index of a corpus (:mod:`agentrl.tools.search_index`),
  offline and deterministic; ``corpus`` is ``"mini_wiki"``, ``"ovos_wiki"`` or a JSONL path
  (:func:`agentrl.tools.corpus.resolve_corpus`).
- ``ddgs``: real web search (:mod:`agentrl.tools.search_ddgs`, optional extra ``agentrl[search]``).

A query that finds nothing is the observation ``NO_RESULTS``. A backend that cannot answer (no
network, a rate limit, a timeout, an index that cannot be read) raises
:class:`~agentrl.tools.corpus.SearchUnavailable`, an :class:`agentrl.InfraError`: the tools let
it through, the ToolBox reports error ``infra`` and the run retries the attempt, so the model is
never scored for the backend's failure. The ``local`` backend reopens (rebuilding if need be)
an index that failed on its next call.

Any query text is safe; ``top_k`` is clamped to ``[1, max_top_k]``; snippets, titles and opened
documents are capped in characters (the ToolBox caps the whole observation in tokens as well).

Example::

    import asyncio
    from agentrl.toolbox import ToolBox
    from agentrl.tools.search import search_tools

    box = ToolBox(search_tools("local", corpus="mini_wiki"))
    ctx = box.new_context("t0")
    out = asyncio.run(box.execute("search", {"query": 'copper "bells AND NEAR(', "top_k": 99}, ctx))
    assert out.error is None and out.content.startswith("1. ")
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from agentrl.toolbox import Tool, tool
from agentrl.tools.corpus import Corpus, Document, DocumentUnavailable, SearchHit, SearchUnavailable, resolve_corpus
from agentrl.tools.search_index import SearchIndex, clamp_top_k, open_cached_index

T = TypeVar("T")

BACKENDS = ("local", "ddgs")
MAX_TITLE_CHARS = 200
MAX_ID_CHARS = 512  # a longer id cannot exist; cut before lookup and before echoing it back
NO_RESULTS = "No results. Try different or fewer keywords."
EMPTY_QUERY = "Empty query: write a few keywords to search for."


class SearchBackend(Protocol):
    """What a search backend provides: ranked hits for a query, a document by id."""

    name: str

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        """Best ``top_k`` hits (empty when nothing matches); raises :class:`SearchUnavailable`
        when the backend cannot answer."""
        ...

    def get(self, doc_id: str) -> Document | None:
        """The full document, None when the id is unknown; raises :class:`DocumentUnavailable`
        when that document cannot be fetched (its own fault: the observation), and
        :class:`SearchUnavailable` when the backend cannot answer."""
        ...


class LocalBackend:
    """BM25 search over a corpus, with its FTS5 index built once and cached (see search_index).

    An index that fails a query (:class:`SearchUnavailable`, cause ``search_index_unreadable``)
    is dropped; the next call opens it again through :func:`open_cached_index`, which rebuilds
    a missing, stale or corrupt one (``search_index_unavailable`` when that fails too).
    """

    name = "local"

    def __init__(self, corpus: str | Path | Corpus = "mini_wiki", cache_dir: str | Path | None = None):
        self.corpus = corpus if isinstance(corpus, Corpus) else resolve_corpus(corpus)
        self.cache_dir = cache_dir
        self._lock = threading.Lock()
        self.index: SearchIndex | None = open_cached_index(self.corpus, cache_dir)  # None after a failure

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        return self._query(lambda index: index.search(query, top_k))

    def get(self, doc_id: str) -> Document | None:
        return self._query(lambda index: index.get(doc_id))

    def _query(self, fn: Callable[[SearchIndex], T]) -> T:
        index = self.index or self._reopen()
        try:
            return fn(index)
        except SearchUnavailable:
            with self._lock:
                if self.index is index:
                    self.index = None
            index.close()
            raise

    def _reopen(self) -> SearchIndex:
        with self._lock:
            if self.index is None:
                try:
                    self.index = open_cached_index(self.corpus, self.cache_dir)
                except Exception as exc:  # noqa: BLE001 - whatever stops the rebuild, the model did not cause it
                    raise SearchUnavailable(
                        f"the search index of corpus {self.corpus.name!r} ({self.corpus.path}) could not be "
                        f"reopened or rebuilt ({type(exc).__name__}: {exc}); check that the corpus file and "
                        "the index directory are readable and writable", cause="search_index_unavailable"
                    ) from exc
            return self.index


def make_backend(backend: str | SearchBackend = "local", **kwargs: Any) -> SearchBackend:
    """A backend by name (``"local"`` takes ``corpus``, ``cache_dir``; ``"ddgs"`` takes
    ``timeout``, ``max_attempts``, ``backoff``, ``region``, ``safesearch``, ``engines``,
    ``proxy``), or ``backend`` itself when it is already one."""
    if not isinstance(backend, str):
        if kwargs:
            raise TypeError(f"backend options {sorted(kwargs)} apply only when the backend is given by name")
        return backend
    if backend == "local":
        return LocalBackend(**kwargs)
    if backend == "ddgs":
        from agentrl.tools.search_ddgs import DdgsBackend  # lazy: ddgs is an optional extra

        return DdgsBackend(**kwargs)
    raise ValueError(f"unknown search backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def cap_chars(text: str, max_chars: int, note: str = "…") -> str:
    """``text`` cut to at most ``max_chars`` characters, ending in ``note`` when cut.

    >>> cap_chars("abcdef", 4)
    'abc…'
    """
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - len(note))] + note


def format_hits(hits: list[SearchHit], max_snippet_chars: int) -> str:
    """The observation for a result list: numbered title and id, then the capped snippet.

    >>> print(format_hits([SearchHit("vell", "Vell", "A river town.", None, 3.2)], 80))
    1. Vell (id: vell)
       A river town.
    """
    if not hits:
        return NO_RESULTS
    blocks = []
    for i, h in enumerate(hits, start=1):
        head = f"{i}. {cap_chars(h.title, MAX_TITLE_CHARS)} (id: {cap_chars(h.id, MAX_ID_CHARS)})"
        snippet = cap_chars(" ".join(h.snippet.split()), max_snippet_chars)
        blocks.append(f"{head}\n   {snippet}" if snippet else head)
    return "\n".join(blocks)


def format_document(doc: Document, max_chars: int) -> str:
    """The observation for an opened document: title, url when known, text capped at ``max_chars``."""
    head = cap_chars(doc.title, MAX_TITLE_CHARS) + (f"\n{doc.url}" if doc.url and doc.url != doc.id else "")
    text = doc.text
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n...[{len(doc.text) - max_chars} more characters not shown]"
    return f"{head}\n\n{text}"


def search_tool(
    backend: str | SearchBackend = "local",
    *,
    default_top_k: int = 5,
    max_top_k: int = 10,
    max_snippet_chars: int = 300,
    name: str = "search",
    tool_timeout: float | None = None,
    **backend_kwargs: Any,
) -> Tool:
    """The ``search(query, top_k)`` tool over a backend (a name plus its options, or an instance).

    ``tool_timeout`` defaults to the ToolBox default for ``local`` and to the backend's own
    overall ``timeout`` plus 2 s for ``ddgs``, so its observation arrives before the ToolBox
    gives up. ``search_tool("ddgs", timeout=5)`` sets that backend timeout.
    """
    if not 1 <= default_top_k <= max_top_k:
        raise ValueError(f"need 1 <= default_top_k <= max_top_k, got {default_top_k} and {max_top_k}")
    b = make_backend(backend, **backend_kwargs)

    def search(query: str, top_k: int = default_top_k) -> str:
        text = str(query)
        if not text.strip():
            return EMPTY_QUERY
        hits = b.search(text, clamp_top_k(top_k, default_top_k, max_top_k))  # SearchUnavailable: infra, let through
        return format_hits(hits, max_snippet_chars)

    search.__doc__ = f"""Search {_what(b)} and return the best matches: title, id and a snippet of each.

        Args:
            query: keywords to search for.
            top_k: how many results to return (1 to {max_top_k}).
        """
    return tool(search, name=name, timeout=tool_timeout if tool_timeout is not None else _default_timeout(b))


def open_tool(
    backend: str | SearchBackend = "local",
    *,
    max_chars: int = 4000,
    name: str = "open",
    tool_timeout: float | None = None,
    **backend_kwargs: Any,
) -> Tool:
    """The ``open(id)`` tool: the text of a document found by search (``read`` with ``name="read"``)."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, got {max_chars}")
    b = make_backend(backend, **backend_kwargs)

    def open_document(id: str) -> str:  # noqa: A002 - "id" is the word the model sees in results
        doc_id = str(id).strip()[:MAX_ID_CHARS]
        if not doc_id:
            return "Empty id: pass an id exactly as shown in search results."
        try:
            doc = b.get(doc_id)  # SearchUnavailable: infra, let through
        except DocumentUnavailable as e:  # the page the model chose failed: its observation
            return str(e)
        if doc is None:
            return f"No document with id {cap_chars(doc_id, 100)!r}. Use an id exactly as shown in search results."
        return format_document(doc, max_chars)

    open_document.__doc__ = f"""Read the full text of a document from {_what(b)} by its id.

        Args:
            id: the id of a search result, exactly as shown by the search tool.
        """
    return tool(open_document, name=name, timeout=tool_timeout if tool_timeout is not None else _default_timeout(b))


def search_tools(backend: str | SearchBackend = "local", *, max_top_k: int = 10,
                 max_snippet_chars: int = 300, max_chars: int = 4000, **backend_kwargs: Any) -> list[Tool]:
    """``[search, open]`` over one shared backend (one index opened, one ddgs client config)."""
    b = make_backend(backend, **backend_kwargs)
    return [search_tool(b, max_top_k=max_top_k, max_snippet_chars=max_snippet_chars),
            open_tool(b, max_chars=max_chars)]


def _what(b: SearchBackend) -> str:
    return "the web" if b.name == "ddgs" else "the document collection"


def _default_timeout(b: SearchBackend) -> float | None:
    seconds = getattr(b, "timeout", None)
    return float(seconds) + 2.0 if isinstance(seconds, (int, float)) else None
