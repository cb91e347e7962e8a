"""A full-text index over a corpus: SQLite FTS5 with BM25 ranking, built once and cached.

The index file holds a ``documents`` table (id lookup for ``open``) and an external-content
FTS5 table over ``title`` and ``text`` (porter stemming over unicode61, diacritics folded).
Ranking is BM25 with the title weighted ``TITLE_WEIGHT`` times the text.

Any text a model writes is a safe query: :func:`query_words` keeps only word tokens and
:func:`match_expression` quotes each one, so FTS5 operators (``AND``, ``OR``, ``NOT``,
``NEAR(``, ``*``, ``column:``), quotes and SQL-looking text are searched as plain words and
never reach the FTS5 parser as syntax. The query is a bound parameter, never SQL text.
:func:`select_terms` keeps the rarest words so one query costs about the same at any length.

Caching: :func:`open_cached_index` stores the index next to the corpus when that directory is
writable and not inside an installed package, else in ``search/`` under agentrl's cache
(:func:`agentrl.models.cache.default_cache_dir`: ``$AGENTRL_CACHE``, default ``~/.cache/agentrl``). The index records a fingerprint of the corpus file (its SHA-256
and the index schema version) and is rebuilt when the corpus changes. Builds write a
temporary file and rename it into place, so concurrent builders and readers never see a
half-written index. Queries run on pooled read-only connections. An index that cannot be read
at query time (deleted, replaced, truncated, corrupt) raises
:class:`~agentrl.tools.corpus.SearchUnavailable` (an :class:`agentrl.InfraError`, cause
``search_index_unreadable``), never a result the model would take for "nothing found".

Example::

    from agentrl.tools.corpus import Document
    from agentrl.tools.search_index import SearchIndex
    import tempfile, pathlib
    path = pathlib.Path(tempfile.mkdtemp()) / "idx.sqlite"
    index = SearchIndex.build([Document("a", "Vell", "Vell is a river town.")], path)
    assert index.search('river "town', top_k=3)[0].id == "a"
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import sqlite3
import tempfile
import unicodedata
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from agentrl.tools.corpus import Corpus, Document, SearchHit, SearchUnavailable

SCHEMA_VERSION = "1"  # bump when the tables, tokenizer or ranking change: cached indexes rebuild
TITLE_WEIGHT = 2.0
MAX_QUERY_CHARS = 4096  # longer queries are cut before tokenizing (a 100 kB query costs no more)
MAX_QUERY_TERMS = 64  # distinct words looked up per query
MAX_RANKED_TERMS = 8  # rarest words actually ranked with (bounds BM25 cost per query)
COMMON_FRACTION = 0.1
COMMON_MIN_DF = 500
MAX_TERM_CHARS = 64
SNIPPET_TOKENS = 40  # FTS5 snippet() hard limit is 64
MAX_TOP_K = 50

_TOKENIZER = "porter unicode61 remove_diacritics 2"
# Word tokens as unicode61 sees them: letters and digits; '_' and punctuation separate words.
_WORD_RE = re.compile(r"[^\W_]+")
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHAR_MAP = {"Cf": "", "Cc": " "}  # unicode category -> replacement
STOPWORDS = frozenset(
    "a an and are as at be by for from has have he her his in is it its of on or she that the "
    "their they this to was were which who with what when where how not near".split()
)


def query_words(text: str) -> list[str]:
    """The distinct searchable words of any text, in order: the query sanitizer.

    Zero-width and bidi marks (unicode Cf) vanish so ``"se\\u200barch"`` is ``"search"``;
    control characters (NUL included) split words; text is NFKC-normalized, lowercased, cut to
    ``MAX_QUERY_CHARS``; a word is a run of letters or digits (as FTS5's unicode61 tokenizer
    sees it), at most ``MAX_TERM_CHARS`` long; stopwords go unless nothing else is left; at
    most ``MAX_QUERY_TERMS`` words are kept.

    >>> query_words('NEAR(cats dogs) AND "title:x* OR 1=1; DROP TABLE documents;--')
    ['cats', 'dogs', 'title', 'x', '1', 'drop', 'table', 'documents']
    """
    words = _words(text[: MAX_QUERY_CHARS * 2])
    content = [w for w in words if w not in STOPWORDS]
    return list(dict.fromkeys(content or words))[:MAX_QUERY_TERMS]


def _words(text: str) -> list[str]:
    if text.isascii():  # the common case, without a per-character category lookup
        text = _ASCII_CONTROL.sub(" ", text)
    else:
        text = "".join(_CHAR_MAP.get(unicodedata.category(ch), ch) for ch in text)
    text = unicodedata.normalize("NFKC", text)[:MAX_QUERY_CHARS]
    return [w[:MAX_TERM_CHARS] for w in _WORD_RE.findall(text.lower())]


def select_terms(words: Sequence[str], doc_freq: Mapping[str, int], num_docs: int) -> list[str]:
    """The words worth ranking with: the ``MAX_RANKED_TERMS`` rarest, very common ones dropped.

    BM25 cost grows with the documents a term matches while a common term adds little to the
    score (idf = ln((N - n + 0.5) / (n + 0.5)) is small for large n), so terms with document
    frequency n > max(``COMMON_MIN_DF``, ``COMMON_FRACTION`` * N) are dropped unless every term
    is that common, in which case the rarest ones stay. Unknown words (n = 0) stay: through
    stemming they may still match.

    >>> select_terms(["the", "zebra", "river"], {"the": 900, "zebra": 2, "river": 40}, 1000)
    ['zebra', 'river']
    >>> select_terms(["the", "of"], {"the": 900, "of": 800}, 1000)
    ['of', 'the']
    """
    ranked = sorted(words, key=lambda w: doc_freq.get(w, 0))  # stable: ties keep query order
    cap = max(COMMON_MIN_DF, COMMON_FRACTION * num_docs)
    rare = [w for w in ranked if doc_freq.get(w, 0) <= cap]
    return (rare or ranked)[:MAX_RANKED_TERMS]


def match_expression(terms: Sequence[str]) -> str | None:
    """OR of double-quoted terms: each is a literal string to FTS5, never an operator.

        q = "t1" OR "t2" OR ... OR "tn"

    >>> match_expression(["near", "and"])
    '"near" OR "and"'
    """
    if not terms:
        return None
    # Terms hold no '"' (only letters and digits survive query_words), so quoting is sound.
    return " OR ".join(f'"{t}"' for t in terms)


def clamp_top_k(top_k: object, default: int = 5, maximum: int = MAX_TOP_K) -> int:
    """Clamp a model-given ``top_k`` to ``[1, maximum]``; non-numbers give ``default``.

    >>> clamp_top_k(10**9, maximum=10), clamp_top_k(-3), clamp_top_k("7"), clamp_top_k(None)
    (10, 1, 7, 5)
    """
    try:
        k = int(top_k)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        k = default
    return max(1, min(k, maximum))


class SearchIndex:
    """A built FTS5 index file, queried through a pool of read-only connections (thread-safe)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no search index at {self.path}; build one with SearchIndex.build(docs, path)")
        self._uri = self.path.resolve().as_uri() + "?mode=ro"
        self._pool: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self.num_docs = int(self._meta("num_docs") or 0)

    @classmethod
    def build(cls, docs: Sequence[Document], path: str | Path, fingerprint: str = "") -> "SearchIndex":
        """Index ``docs`` into ``path`` (replaced atomically) and open it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            _write_index(docs, Path(tmp), fingerprint)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return cls(path)

    @contextmanager
    def _conn(self) -> Iterator[sqlite3.Connection]:
        # A pool, not one connection per thread: tool calls each run in a fresh thread.
        conn: sqlite3.Connection | None
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            conn = None
        try:
            if conn is None:
                conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
                conn.execute("PRAGMA query_only = 1")
            yield conn
        except sqlite3.Error as exc:  # queries are bound parameters of sanitized words: the file failed
            if conn is not None:
                conn.close()  # in doubt: not back into the pool
                conn = None
            raise SearchUnavailable(
                f"the search index {self.path} cannot be read ({type(exc).__name__}: {exc}): it is missing, "
                "replaced or corrupt. The local search backend rebuilds it on its next call; for an index of "
                "your own, rebuild it with SearchIndex.build(docs, path)", cause="search_index_unreadable"
            ) from exc
        finally:
            if conn is not None:
                self._pool.put(conn)

    def _meta(self, key: str) -> str | None:
        with self._conn() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def search(self, query: str, top_k: int = 5) -> list[SearchHit]:
        """Top ``top_k`` documents (clamped to ``[1, MAX_TOP_K]``) by BM25 for any query text."""
        words = query_words(query)
        match = match_expression(select_terms(words, self._doc_freq(words), self.num_docs))
        if match is None:
            return []
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT d.id, d.title, d.url, snippet(fts, 1, '', '', ' … ', ?), rank "
                "FROM fts JOIN documents d ON d.rowid = fts.rowid "
                "WHERE fts MATCH ? ORDER BY rank LIMIT ?",
                (SNIPPET_TOKENS, match, clamp_top_k(top_k)),
            ).fetchall()
        # FTS5 rank is BM25 negated (lower = better); flip it so higher is better for callers.
        return [SearchHit(id=r[0], title=r[1], url=r[2], snippet=r[3], score=-float(r[4])) for r in rows]

    def _doc_freq(self, words: Sequence[str]) -> dict[str, int]:
        if not words:
            return {}
        marks = ",".join("?" * len(words))
        with self._conn() as conn:
            rows = conn.execute(f"SELECT word, df FROM word_df WHERE word IN ({marks})", list(words)).fetchall()
        return dict(rows)

    def get(self, doc_id: str) -> Document | None:
        """The document with this id, or None (also for ids no stored text can equal)."""
        doc_id = str(doc_id)
        if not _encodable(doc_id):  # lone surrogates (valid JSON "\\ud800") cannot be bound
            return None
        with self._conn() as conn:
            row = conn.execute("SELECT id, title, text, url FROM documents WHERE id = ?", (doc_id,)).fetchone()
        return None if row is None else Document(id=row[0], title=row[1], text=row[2], url=row[3])

    def fingerprint(self) -> str:
        return self._meta("fingerprint") or ""

    def close(self) -> None:
        """Close the pooled connections (the index reopens them on the next query)."""
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _write_index(docs: Sequence[Document], path: Path, fingerprint: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = OFF")  # a fresh temp file: nothing to roll back to
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE documents (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
            "title TEXT NOT NULL, text TEXT NOT NULL, url TEXT)"
        )
        conn.execute(
            "CREATE VIRTUAL TABLE fts USING fts5(title, text, content='documents', "
            f"content_rowid='rowid', tokenize='{_TOKENIZER}')"
        )
        try:
            conn.executemany(
                "INSERT INTO documents (id, title, text, url) VALUES (?, ?, ?, ?)",
                ((d.id, d.title, d.text, d.url) for d in docs),
            )
        except sqlite3.IntegrityError:
            dup = _first_duplicate(docs)
            raise ValueError(f"duplicate document id {dup!r}; ids must be unique within a corpus") from None
        conn.execute("CREATE TABLE word_df (word TEXT PRIMARY KEY, df INTEGER NOT NULL) WITHOUT ROWID")
        conn.executemany("INSERT INTO word_df VALUES (?, ?)", _document_frequencies(docs).items())
        conn.execute("INSERT INTO fts(fts) VALUES ('rebuild')")
        conn.execute("INSERT INTO fts(fts) VALUES ('optimize')")
        conn.execute("INSERT INTO fts(fts, rank) VALUES ('rank', ?)", (f"bm25({TITLE_WEIGHT}, 1.0)",))
        count = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
        conn.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("schema", SCHEMA_VERSION), ("fingerprint", fingerprint), ("num_docs", str(count))],
        )
        conn.commit()
    finally:
        conn.close()


def _document_frequencies(docs: Sequence[Document]) -> Counter[str]:
    """Documents containing each surface word (as :func:`query_words` splits text)."""
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(_words(d.title + " " + d.text)))
    return df


def _first_duplicate(docs: Sequence[Document]) -> str:
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            return d.id
        seen.add(d.id)
    return ""


def corpus_fingerprint(corpus: Corpus) -> str:
    """SHA-256 of the corpus file, its format and the index schema: equal means the index is current."""
    h = hashlib.sha256(f"{SCHEMA_VERSION}|{corpus.format}|{corpus.lang}|".encode())
    with corpus.path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``search/`` in agentrl's cache (``$AGENTRL_CACHE``, default ``~/.cache/agentrl``)."""
    from agentrl.models.cache import default_cache_dir as agentrl_cache

    return agentrl_cache() / "search"


def index_path_for(corpus: Corpus, cache_dir: str | Path | None = None) -> Path:
    """Where the index of ``corpus`` lives.

    Next to the corpus (``<file>.fts5.sqlite``) when its directory is writable and is not part
    of an installed package; otherwise in ``cache_dir`` (default :func:`default_cache_dir`),
    named after the corpus and a hash of its path so two corpora never share a file.
    """
    if cache_dir is None:
        parent = corpus.path.parent
        installed = any(p in ("site-packages", "dist-packages") for p in parent.parts)
        if not installed and os.access(parent, os.W_OK):
            return corpus.path.with_name(corpus.path.name + ".fts5.sqlite")
        cache_dir = default_cache_dir()
    tag = hashlib.sha256(str(corpus.path).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{corpus.name}-{tag}.fts5.sqlite"


def open_cached_index(corpus: Corpus, cache_dir: str | Path | None = None) -> SearchIndex:
    """Open the cached index of ``corpus``, building it first if missing, stale or unreadable."""
    path = index_path_for(corpus, cache_dir)
    want = corpus_fingerprint(corpus)
    if path.is_file():
        try:
            index = SearchIndex(path)
            if index.fingerprint() == want:
                return index
            index.close()
        except SearchUnavailable:
            pass  # a corrupt or foreign file: rebuild over it
    try:
        return SearchIndex.build(corpus.load(), path, fingerprint=want)
    except PermissionError:
        raise PermissionError(
            f"cannot write the search index to {path.parent}; pass cache_dir=... or set AGENTRL_CACHE "
            "to a writable directory"
        ) from None
