"""Real web search through the ``ddgs`` package (optional extra: ``pip install 'agentrl[search]'``).

``ddgs`` is imported when a :class:`DdgsBackend` is made, never at module import. Every call
runs in a daemon thread under one deadline (``timeout`` seconds for the whole call, retries
included), so a network that drops packets cannot hold a rollout longer than that. Rate limits,
timeouts and connection failures are retried with exponential backoff while the deadline
allows, then raise :class:`SearchUnavailable`, an :class:`agentrl.InfraError` whose cause is
``web_search_<kind>`` (``network``, ``rate_limited``, ``timeout``, ``error``): the web failing
is not the model's fault, so the run retries the attempt instead of scoring it. "No results"
is the model's query, and an empty list. Opening a page is the model's choice of URL (one
that does not resolve is its doing, not the network's), so a page that cannot be fetched
raises :class:`DocumentUnavailable`, whose message the ``open`` tool returns as the
observation; a network that is down fails the search that found the URL first. Results are normalized to :class:`SearchHit`, the
shape the ``local`` backend returns.

Example (needs network; without it the call raises SearchUnavailable within ``timeout``)::

    from agentrl.tools.search_ddgs import DdgsBackend
    backend = DdgsBackend(timeout=8)
    hits = backend.search("Level 4 vital articles", top_k=3)
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

from agentrl.tools.corpus import Document, DocumentUnavailable, SearchHit, SearchUnavailable

T = TypeVar("T")
FailureKind = Literal["no_results", "rate_limited", "timeout", "network", "error"]
RETRYABLE: frozenset[str] = frozenset({"rate_limited", "timeout", "network"})

MAX_QUERY_CHARS = 500  # web engines reject or truncate longer queries anyway
MAX_SNIPPET_CHARS = 1000
_NETWORK_WORDS = re.compile(r"dns|resolv|connect|network|unreachable|refused|proxy|ssl|tls|reset", re.I)
_RATE_LIMIT = re.compile(r"rate.?limit|\b429\b|too many requests", re.I)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]+")


@dataclass(frozen=True)
class Failure:
    """A failed attempt: what kind, and a short detail for logs and the observation."""

    kind: FailureKind
    detail: str


def classify(exc: BaseException) -> Failure:
    """Map an exception from ``ddgs`` (or its HTTP client) to a failure kind.

    >>> classify(RuntimeError("DNSError: error resolving DNS")).kind
    'network'
    >>> classify(RuntimeError("No results found.")).kind
    'no_results'
    """
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if _RATE_LIMIT.search(text):
        kind: FailureKind = "rate_limited"
    elif "Timeout" in name or "timed out" in text.lower() or "timeout" in text.lower():
        kind = "timeout"
    elif "No results found" in text:
        kind = "no_results"
    elif _NETWORK_WORDS.search(text):
        kind = "network"
    else:
        kind = "error"
    return Failure(kind, " ".join(text.split())[:200])


def observation(failure: Failure, attempts: int, elapsed_s: float) -> str:
    """The message of the :class:`SearchUnavailable` raised when web search could not answer
    (the attempt's failure record, and the ToolBox's error text)."""
    tried = f"{attempts} attempt{'s' if attempts != 1 else ''} in {elapsed_s:.1f}s"
    if failure.kind == "network":
        return (f"Web search is unavailable: no network connection (could not reach the search service; "
                f"{tried}; {failure.detail}). Check this machine's network access or the proxy (DDGS_PROXY).")
    if failure.kind == "rate_limited":
        return (f"Web search is rate-limited right now ({tried}; {failure.detail}). Fewer concurrent rollouts "
                "or a larger backoff help.")
    if failure.kind == "timeout":
        return f"Web search timed out ({tried}; {failure.detail})."
    return f"Web search failed ({tried}): {failure.detail}"


def page_observation(url: str, failure: Failure) -> str:
    """What the model reads when the page it chose to open could not be fetched.

    >>> page_observation("https://a.example/", Failure("network", "DNSError: no records"))
    'Could not open https://a.example/: the site could not be reached (DNSError: no records). Use another result.'
    """
    why = {"network": "the site could not be reached", "timeout": "the site did not answer in time",
           "rate_limited": "the site refused: too many requests"}.get(failure.kind, "the page could not be fetched")
    return f"Could not open {url[:200]}: {why} ({failure.detail}). Use another result."


class _Attempt:
    """One call in a daemon thread, so the caller can stop waiting at the deadline."""

    def __init__(self, fn: Callable[[], object]):
        self.value: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self._thread = threading.Thread(target=self._run, name="agentrl-ddgs", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller, never lost
            self.error = e

    def wait(self, seconds: float) -> bool:
        self._thread.join(max(0.0, seconds))
        return not self._thread.is_alive()


def call_with_retries(
    fn: Callable[[float], T],
    *,
    timeout: float,
    max_attempts: int = 3,
    backoff: float = 0.5,
    empty: T,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn(seconds_left)`` until it succeeds, within ``timeout`` seconds overall.

    Attempt i (0-based) that fails with a retryable kind waits ``backoff * 2**i`` seconds
    before the next, if that wait and some time to work still fit before the deadline.
    A "no results" failure returns ``empty``; anything else raises :class:`SearchUnavailable`
    with cause ``web_search_<kind>``.
    """
    start = clock()
    deadline = start + timeout
    failure = Failure("timeout", "no attempt fit in the time limit")
    attempts = 0
    while attempts < max_attempts:
        left = deadline - clock()
        if left <= 0:
            break
        attempts += 1
        attempt = _Attempt(lambda left=left: fn(left))
        if not attempt.wait(left):
            failure = Failure("timeout", f"no answer within {timeout:.1f}s")
            break  # the deadline is spent; the thread is abandoned (daemon)
        if attempt.error is None:
            return attempt.value
        failure = classify(attempt.error)
        if failure.kind == "no_results":
            return empty
        if failure.kind not in RETRYABLE:
            break
        delay = backoff * 2 ** (attempts - 1)
        if clock() + delay >= deadline - 0.05:
            break
        sleep(delay)
    error = SearchUnavailable(observation(failure, attempts, clock() - start), cause=f"web_search_{failure.kind}")
    error.failure = failure  # type: ignore[attr-defined]  # the kind and detail, for callers that word it their way
    raise error


def clean_query(query: str) -> str:
    """Drop control and invisible characters, squeeze spaces, cut to ``MAX_QUERY_CHARS``.

    >>> clean_query("caf\\u00e9\\u200b\\x00  au   lait")
    'café au lait'
    """
    return " ".join(_CONTROL.sub(" ", query[: MAX_QUERY_CHARS * 4]).split())[:MAX_QUERY_CHARS].strip()


def normalize_results(raw: object, top_k: int) -> list[SearchHit]:
    """ddgs result dicts (text: ``title/href/body``; news: ``title/url/body/source``) as hits.

    Entries that are not dicts or have no URL are skipped, repeated URLs are kept once,
    whitespace is squeezed and the score is the reciprocal rank 1/(i+1).

    >>> normalize_results([{"title": " Ada ", "href": "https://a.org", "body": "x\\n y"}], 5)[0].snippet
    'x y'
    """
    hits: list[SearchHit] = []
    seen: set[str] = set()
    for r in raw if isinstance(raw, list) else []:
        if not isinstance(r, dict):
            continue
        url = str(r.get("href") or r.get("url") or "").strip()
        if not url or url in seen:
            continue
        seen.add(url)
        title = " ".join(str(r.get("title") or url).split())
        body = " ".join(str(r.get("body") or r.get("snippet") or r.get("description") or "").split())
        hits.append(SearchHit(id=url, title=title, snippet=body[:MAX_SNIPPET_CHARS], url=url,
                              score=1.0 / (len(hits) + 1)))
        if len(hits) >= top_k:
            break
    return hits


def _import_ddgs() -> Any:
    try:
        from ddgs import DDGS
    except ImportError:
        raise ModuleNotFoundError(
            "the ddgs search backend needs the ddgs package: pip install 'agentrl[search]' (or pip install ddgs)"
        ) from None
    return DDGS


class DdgsBackend:
    """Web search via ``ddgs`` with a hard overall ``timeout`` per call (seconds).

    Args:
        timeout: seconds for one search or open, retries included.
        max_attempts: tries per call for retryable failures (rate limit, timeout, network).
        backoff: first wait between tries in seconds; doubles each time.
        region, safesearch, engines: passed to ``DDGS.text`` (``engines`` is its ``backend``).
        proxy: passed to ``DDGS`` (also read from ``DDGS_PROXY`` by ddgs itself).
    """

    name = "ddgs"

    def __init__(self, timeout: float = 10.0, max_attempts: int = 3, backoff: float = 0.5,
                 region: str = "us-en", safesearch: str = "moderate", engines: str = "auto",
                 proxy: str | None = None):
        if timeout <= 0 or max_attempts < 1 or backoff < 0:
            raise ValueError("DdgsBackend needs timeout > 0, max_attempts >= 1 and backoff >= 0")
        self._ddgs = _import_ddgs()
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.region, self.safesearch, self.engines, self.proxy = region, safesearch, engines, proxy

    def _client(self, seconds_left: float) -> Any:
        return self._ddgs(proxy=self.proxy, timeout=max(1, int(seconds_left)))

    def search(self, query: str, top_k: int = 5) -> list[SearchHit]:
        """Up to ``top_k`` web results; raises :class:`SearchUnavailable` when the web cannot answer."""
        q = clean_query(query)
        if not q:
            return []

        def once(left: float) -> list[dict]:
            return self._client(left).text(q, region=self.region, safesearch=self.safesearch,
                                           max_results=top_k, backend=self.engines)

        raw = call_with_retries(once, timeout=self.timeout, max_attempts=self.max_attempts,
                                backoff=self.backoff, empty=[])
        return normalize_results(raw, top_k)

    def get(self, doc_id: str) -> Document | None:
        """The text of the web page at URL ``doc_id`` (None when ``doc_id`` is not an http(s) URL);
        raises :class:`DocumentUnavailable` when the page cannot be fetched."""
        url = doc_id.strip()
        if not re.match(r"https?://[^\s]+$", url) or len(url) > 2000:
            return None

        def once(left: float) -> dict:
            return self._client(left).extract(url, fmt="text_plain")

        try:
            page = call_with_retries(once, timeout=self.timeout, max_attempts=self.max_attempts,
                                     backoff=self.backoff, empty={})
        except SearchUnavailable as exc:
            failure: Failure = getattr(exc, "failure", Failure("error", str(exc)))
            raise DocumentUnavailable(page_observation(url, failure)) from exc
        content = page.get("content", "") if isinstance(page, dict) else ""
        if isinstance(content, bytes):
            content = content.decode("utf-8", "replace")
        return Document(id=url, title=url, text=str(content), url=url)
