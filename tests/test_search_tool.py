"""The search and open tools as the agent calls them, through a real ToolBox."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.toolbox import ToolBox
from agentrl.tools.corpus import Document, SearchHit
from agentrl.tools.search import (
    EMPTY_QUERY,
    NO_RESULTS,
    LocalBackend,
    format_document,
    format_hits,
    make_backend,
    open_tool,
    search_tool,
    search_tools,
)


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> LocalBackend:
    return LocalBackend("mini_wiki", cache_dir=tmp_path_factory.mktemp("cache"))


def _call(box: ToolBox, name: str, args: dict):
    return asyncio.run(box.execute(name, args, box.new_context("t")))


def _result_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line[:1].isdigit())


def test_search_then_open_finds_a_document(backend):
    box = ToolBox(search_tools(backend))
    found = _call(box, "search", {"query": "copper bells festival"})
    assert found.error is None and found.content.startswith("1. ")
    doc_id = found.content.split("(id: ", 1)[1].split(")", 1)[0]
    opened = _call(box, "open", {"id": doc_id})
    assert opened.error is None and backend.get(doc_id).text in opened.content


def test_top_k_is_clamped_to_max_top_k(backend):
    box = ToolBox([search_tool(backend, max_top_k=7)])
    assert _result_count(_call(box, "search", {"query": "the", "top_k": 10**6}).content) == 7
    assert _result_count(_call(box, "search", {"query": "the", "top_k": -4}).content) == 1
    assert _result_count(_call(box, "search", {"query": "the"}).content) == 5


def test_snippets_and_titles_are_capped(backend):
    box = ToolBox([search_tool(backend, max_snippet_chars=30)])
    out = _call(box, "search", {"query": "town river", "top_k": 10}).content
    snippets = [line.strip() for line in out.splitlines() if not line[:1].isdigit()]
    assert snippets and all(len(s) <= 30 for s in snippets)


def test_empty_and_wordless_queries_are_observations(backend):
    box = ToolBox([search_tool(backend)])
    assert _call(box, "search", {"query": "   "}).content == EMPTY_QUERY
    r = _call(box, "search", {"query": '🔔 "* ( \u200b'})
    assert r.error is None and r.content == NO_RESULTS


def test_huge_query_is_fine(backend):
    r = _call(ToolBox([search_tool(backend)]), "search", {"query": "copper bells " * 8000})
    assert r.error is None and r.content.startswith("1. ")


def test_open_caps_text_and_rejects_unknown_ids(backend):
    box = ToolBox([open_tool(backend, max_chars=40)])
    doc = backend.index.search("copper")[0]
    out = _call(box, "open", {"id": doc.id}).content
    assert "more characters not shown" in out and len(out) < 40 + 200
    unknown = _call(box, "open", {"id": "no-such-doc\x00" + "x" * 100_000})
    assert unknown.error is None and unknown.content.startswith("No document with id") and len(unknown.content) < 300
    assert _call(box, "open", {"id": " "}).content.startswith("Empty id")
    assert _call(box, "open", {"id": "\ud800"}).content.startswith("No document with id")


def test_open_tool_can_be_named_read(backend):
    box = ToolBox([open_tool(backend, name="read")])
    assert box.schemas()[0]["function"]["name"] == "read"


def test_schema_tells_the_model_the_range(backend):
    t = search_tool(backend, max_top_k=8)
    params = t.schema()["function"]["parameters"]
    assert params["required"] == ["query"] and "1 to 8" in params["properties"]["top_k"]["description"]
    assert t.timeout is None  # local search uses the ToolBox default


def test_format_hits_and_document():
    hits = [SearchHit("a", "T" * 500, "word " * 200, None, 1.0)]
    text = format_hits(hits, max_snippet_chars=50)
    head, snippet = text.splitlines()
    assert len(head) < 260 and len(snippet.strip()) <= 50
    assert format_hits([], 50) == NO_RESULTS
    doc = Document("u", "Page", "body", url="https://e.org/p")
    assert format_document(doc, 100) == "Page\nhttps://e.org/p\n\nbody"


def test_unknown_backend_and_bad_options_are_clear_errors(backend):
    with pytest.raises(ValueError, match="choose one of local, ddgs"):
        make_backend("bing")
    with pytest.raises(TypeError, match="only when the backend is given by name"):
        make_backend(backend, corpus="mini_wiki")
    with pytest.raises(ValueError, match="default_top_k"):
        search_tool(backend, default_top_k=20, max_top_k=10)
