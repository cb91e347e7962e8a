"""The ddgs web-search backend: failures become observations within the timeout; normalization.

The network tests are real: requests go through ddgs to a local port that refuses connections
(no network) or to a local server that accepts and never answers (a black hole), so they
behave the same on any machine. One test also calls the real web and accepts either outcome.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import pytest

from agentrl.tools.corpus import SearchUnavailable
from agentrl.tools.search_ddgs import (
    Failure,
    call_with_retries,
    classify,
    clean_query,
    normalize_results,
    observation,
)

# Shapes ddgs 9 returns (TextResult: title/href/body; NewsResult: date/title/body/url/image/source),
# including the noise a real engine produces: duplicates, missing fields, non-dicts.
RECORDED_TEXT = [
    {"title": "Python (programming language) - Wikipedia",
     "href": "https://en.wikipedia.org/wiki/Python_(programming_language)",
     "body": "Python is a high-level,  general-purpose programming language.\n"
             "Its design philosophy emphasizes code readability."},
    {"title": "Welcome to Python.org", "href": "https://www.python.org/",
     "body": "The official home of the Python Programming Language."},
    {"title": "Duplicate of the first", "href": "https://en.wikipedia.org/wiki/Python_(programming_language)",
     "body": "dup"},
    {"title": "", "href": "https://docs.python.org/3/", "body": ""},
    {"title": "No link at all", "href": "", "body": "skipped"},
    "not a dict",
    {"title": "Python Tutorial - W3Schools", "href": "https://www.w3schools.com/python/", "body": "x" * 5000},
]
RECORDED_NEWS = [
    {"date": "2025-06-01T10:00:00+00:00", "title": "Python 3.14 released", "body": "The new version ...",
     "url": "https://news.example.com/py314", "image": "https://news.example.com/i.png", "source": "Example News"},
]


def test_normalize_recorded_text_results():
    hits = normalize_results(RECORDED_TEXT, top_k=10)
    assert [h.url for h in hits] == [
        "https://en.wikipedia.org/wiki/Python_(programming_language)",
        "https://www.python.org/",
        "https://docs.python.org/3/",
        "https://www.w3schools.com/python/",
    ]
    first = hits[0]
    assert first.id == first.url and first.title == "Python (programming language) - Wikipedia"
    assert first.snippet == ("Python is a high-level, general-purpose programming language. "
                             "Its design philosophy emphasizes code readability.")
    assert hits[2].title == "https://docs.python.org/3/"  # no title: the URL stands in
    assert len(hits[3].snippet) == 1000
    assert [h.score for h in hits] == [1.0, 0.5, 1 / 3, 0.25]


def test_normalize_news_results_and_top_k():
    (hit,) = normalize_results(RECORDED_NEWS, top_k=5)
    assert hit.url == "https://news.example.com/py314" and hit.title == "Python 3.14 released"
    assert len(normalize_results(RECORDED_TEXT, top_k=2)) == 2
    assert normalize_results(None, 5) == [] and normalize_results({"a": 1}, 5) == []


def test_classify_real_error_texts():
    dns = RuntimeError("DNSError: error sending request for url (https://html.duckduckgo.com/html/) > "
                       "error resolving DNS > DNS error: no records found")
    refused = RuntimeError("ConnectError: error sending request > Connection refused (os error 111)")
    assert classify(dns).kind == classify(refused).kind == "network"
    assert classify(RuntimeError("operation timed out")).kind == "timeout"
    assert classify(RuntimeError("202 Ratelimit")).kind == "rate_limited"
    assert classify(RuntimeError("No results found.")).kind == "no_results"
    assert classify(ValueError("something odd")).kind == "error"


def test_classify_ddgs_exception_classes():
    exc = pytest.importorskip("ddgs.exceptions")
    assert classify(exc.RatelimitException("x")).kind == "rate_limited"
    assert classify(exc.TimeoutException("x")).kind == "timeout"
    assert classify(exc.DDGSException("No results found.")).kind == "no_results"


def test_observations_are_clear():
    text = observation(Failure("network", "DNSError"), attempts=3, elapsed_s=1.5)
    assert text.startswith("Web search is unavailable: no network connection") and "3 attempts" in text
    assert "rate-limited" in observation(Failure("rate_limited", ""), 1, 0.1)
    assert "timed out" in observation(Failure("timeout", ""), 1, 0.1)


def test_clean_query():
    assert clean_query("a\x00b\u200b  c\n") == "a b c"
    assert len(clean_query("word " * 10_000)) <= 500


class Flaky:
    """Fails with the given errors in order, then returns ``value``."""

    def __init__(self, errors: list[BaseException], value: object):
        self.errors, self.value, self.calls = list(errors), value, 0

    def __call__(self, seconds_left: float) -> object:
        self.calls += 1
        assert seconds_left > 0
        if self.errors:
            raise self.errors.pop(0)
        return self.value


def test_retries_rate_limits_then_succeeds():
    fn = Flaky([RuntimeError("Ratelimit"), RuntimeError("timed out")], value=["ok"])
    assert call_with_retries(fn, timeout=5, max_attempts=3, backoff=0.01, empty=[]) == ["ok"]
    assert fn.calls == 3


def test_gives_up_after_max_attempts_with_the_last_reason():
    fn = Flaky([RuntimeError("Ratelimit")] * 5, value=None)
    with pytest.raises(SearchUnavailable, match="rate-limited.*3 attempts"):
        call_with_retries(fn, timeout=5, max_attempts=3, backoff=0.01, empty=[])


def test_no_results_is_an_empty_list_and_other_errors_do_not_retry():
    assert call_with_retries(Flaky([RuntimeError("No results found.")], None), timeout=5, empty=[]) == []
    fn = Flaky([ValueError("bad response")], value=None)
    with pytest.raises(SearchUnavailable, match="Web search failed .*bad response"):
        call_with_retries(fn, timeout=5, backoff=0.01, empty=[])
    assert fn.calls == 1


def test_backoff_never_outlasts_the_timeout():
    fn = Flaky([RuntimeError("Ratelimit")] * 50, value=None)
    start = time.monotonic()
    with pytest.raises(SearchUnavailable):
        call_with_retries(fn, timeout=0.5, max_attempts=50, backoff=0.2, empty=[])
    assert time.monotonic() - start <= 0.5 + 0.25  # the bound is the configured timeout


def test_a_hung_call_is_abandoned_at_the_deadline():
    def hang(seconds_left: float) -> list:
        time.sleep(30)
        return []

    start = time.monotonic()
    with pytest.raises(SearchUnavailable, match="timed out"):
        call_with_retries(hang, timeout=0.3, empty=[])
    assert time.monotonic() - start <= 0.3 + 0.25


# -- real ddgs calls -----------------------------------------------------------------------


def _refusing_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


@pytest.fixture
def black_hole():
    """A local proxy that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_no_network_is_an_infrastructure_failure_within_the_timeout():
    pytest.importorskip("ddgs")
    from agentrl.toolbox import ToolBox
    from agentrl.tools.search import search_tool

    tool = search_tool("ddgs", timeout=3.0, backoff=0.1, proxy=f"http://127.0.0.1:{_refusing_port()}")
    assert tool.timeout == 3.0 + 2.0  # the ToolBox waits longer than the backend's own bound
    box = ToolBox([tool])
    start = time.monotonic()
    r = asyncio.run(box.execute("search", {"query": "python programming"}, box.new_context("t")))
    elapsed = time.monotonic() - start
    assert r.error == "infra" and r.failure is not None  # not the model's fault: the run retries the attempt
    assert r.failure.cause == "web_search_network" and r.failure.source == "tool:search"
    assert r.failure.message.startswith("Web search is unavailable: no network connection"), r.failure.message
    assert elapsed <= 3.0 + 0.5


def test_black_hole_network_is_cut_at_the_timeout(black_hole):
    pytest.importorskip("ddgs")
    from agentrl.tools.search_ddgs import DdgsBackend

    backend = DdgsBackend(timeout=1.0, proxy=black_hole)
    start = time.monotonic()
    with pytest.raises(SearchUnavailable) as info:
        backend.search("python", top_k=3)
    elapsed = time.monotonic() - start
    assert elapsed <= 1.0 + 0.5
    assert str(info.value).startswith("Web search")


def test_real_network_either_answers_or_explains_within_the_timeout():
    pytest.importorskip("ddgs")
    from agentrl.tools.search_ddgs import DdgsBackend

    backend = DdgsBackend(timeout=5.0, backoff=0.1)
    start = time.monotonic()
    try:
        hits = backend.search("python programming language", top_k=3)
        assert all(h.url and h.url.startswith("http") for h in hits)
    except SearchUnavailable as e:
        assert str(e).startswith("Web search")
    assert time.monotonic() - start <= 5.0 + 0.5


def test_open_by_url_without_network_and_non_urls():
    """The URL is the model's choice (one that does not resolve is its doing): a page that
    cannot be fetched is an observation, not an infrastructure failure."""
    pytest.importorskip("ddgs")
    from agentrl.tools.corpus import DocumentUnavailable
    from agentrl.tools.search_ddgs import DdgsBackend

    backend = DdgsBackend(timeout=2.0, backoff=0.1, proxy=f"http://127.0.0.1:{_refusing_port()}")
    assert backend.get("not a url") is None and backend.get("file:///etc/passwd") is None
    with pytest.raises(DocumentUnavailable, match=r"Could not open https://example.com/: the site could not be reached"):
        backend.get("https://example.com/")


def test_missing_package_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "ddgs", None)  # what Python does for an absent package
    from agentrl.tools.search_ddgs import DdgsBackend

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'agentrl\[search\]'"):
        DdgsBackend()
