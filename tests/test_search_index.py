"""SQLite FTS5 index: safe queries for any model text, BM25 ranking, caching and rebuilds."""

from __future__ import annotations

import hashlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.tools.corpus import Corpus, Document, resolve_corpus, write_jsonl
from agentrl.tools.search_index import (
    MAX_QUERY_TERMS,
    MAX_RANKED_TERMS,
    MAX_TERM_CHARS,
    MAX_TOP_K,
    SearchIndex,
    clamp_top_k,
    index_path_for,
    match_expression,
    open_cached_index,
    query_words,
    select_terms,
)

# Every kind of text a model might put in a query. Each must give a list (maybe empty), never
# an sqlite3 error.
ADVERSARIAL = {
    "quotes": '"copper bells"',
    "unbalanced_quote": 'copper "bells',
    "lone_quote": '"',
    "many_quotes": '""""""',
    "and": "copper AND bells",
    "or": "copper OR",
    "not": "NOT copper",
    "bare_operators": "AND OR NOT",
    "near_open": "NEAR(copper bells",
    "near_full": "NEAR(copper bells, 2)",
    "star": "*",
    "prefix_star": "copp*",
    "caret": "^copper",
    "column_filter": "title:copper",
    "column_set": "{title text}: copper",
    "unknown_column": "nosuchcolumn: copper",
    "minus_plus": "-copper +bells",
    "parens": ") OR (",
    "sql_injection": "'; DROP TABLE documents; --",
    "sql_tautology": "1' OR '1'='1",
    "sql_select": "SELECT * FROM documents WHERE 1=1 UNION SELECT sqlite_version()",
    "nul_inside": "copper\x00bells",
    "nul_only": "\x00",
    "controls": "\x01\x02copper\x1b[31m",
    "rtl_override": "\u202ecopper\u202c",
    "rtl_arabic": "بحث عن النحاس",
    "rtl_hebrew": "חיפוש נחושת \u200f",
    "zero_width_inside": "cop\u200bper",
    "zero_width_only": "\u200b\u200c\u200d\ufeff",
    "emoji": "🔔🔔🔔",
    "emoji_mixed": "copper 🔔 bells 👨‍👩‍👧",
    "fullwidth": "ｃｏｐｐｅｒ",
    "lone_surrogate": "copper \ud800 bells",
    "empty": "",
    "spaces": " \n\t ",
    "huge_repeated_100kB": "copper bells " * 8000,
    "huge_one_token_100kB": "x" * 100_000,
    "huge_quotes_100kB": '"' * 100_000,
    "huge_parens_100kB": "(" * 100_000,
    "huge_distinct_words": " ".join(f"w{i}" for i in range(20_000)),
}


def _docs() -> list[Document]:
    return [
        Document("vell", "Vell", "Vell is a river town famous for its copper bells.", "https://x.example/vell"),
        Document("orsk", "Orsk River", "The Orsk flows past Vell and carries tin and copper.", None),
        Document("mara", "Mara Quill", "Mara Quill was a poet who wrote about bells and rivers.", None),
        Document("salt", "Salt Ledger", "A chronicle of salt panning in the marsh towns.", None),
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> SearchIndex:
    return SearchIndex.build(_docs(), tmp_path_factory.mktemp("idx") / "tiny.sqlite")


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> SearchIndex:
    return open_cached_index(resolve_corpus("mini_wiki"), tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_query_gives_a_list_never_an_error(mini, name):
    hits = mini.search(ADVERSARIAL[name], top_k=5)
    assert isinstance(hits, list) and len(hits) <= 5
    assert all(h.id and isinstance(h.snippet, str) for h in hits)


@pytest.mark.parametrize("name", ["quotes", "unbalanced_quote", "and", "near_open", "column_filter",
                                  "nul_inside", "rtl_override", "zero_width_inside", "fullwidth",
                                  "emoji_mixed", "lone_surrogate", "huge_repeated_100kB"])
def test_operator_and_unicode_noise_search_the_words_themselves(tiny, name):
    # Syntax is searched as words: the copper documents still come first.
    assert tiny.search(ADVERSARIAL[name], top_k=2)[0].id in {"vell", "orsk"}


@pytest.mark.parametrize("name", ["empty", "spaces", "star", "lone_quote", "nul_only", "emoji", "zero_width_only"])
def test_queries_without_words_give_empty_list(tiny, name):
    assert tiny.search(ADVERSARIAL[name]) == []


def test_queries_never_write_the_index(mini):
    before = hashlib.sha256(mini.path.read_bytes()).hexdigest()
    for q in ADVERSARIAL.values():
        mini.search(q)
        mini.get(q[:100])
    assert hashlib.sha256(mini.path.read_bytes()).hexdigest() == before
    assert mini.search("copper")  # still answers


def test_query_connection_is_read_only(tiny):
    with tiny._conn() as conn, pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM documents")


def test_query_words_sanitizes_and_bounds():
    assert query_words('NEAR(a OR "b" AND title:c*') == ["b", "title", "c"]  # a/or/and/near are stopwords here
    assert query_words("the of and") == ["the", "of", "and"]  # only stopwords: keep them
    assert query_words("se\u200barch\x00engine") == ["search", "engine"]
    words = query_words(ADVERSARIAL["huge_distinct_words"])
    assert len(words) == MAX_QUERY_TERMS and words[0] == "w0"
    assert query_words("y" * 100_000) == ["y" * MAX_TERM_CHARS]


def test_match_expression_quotes_every_term():
    expr = match_expression(["near", "and", "x"])
    assert expr == '"near" OR "and" OR "x"'
    assert match_expression([]) is None


def test_select_terms_keeps_the_rarest_and_drops_very_common():
    df = {f"w{i}": i for i in range(30)}
    df["common"] = 10_000
    terms = select_terms(["common"] + [f"w{i}" for i in range(29, -1, -1)], df, num_docs=20_000)
    assert terms == [f"w{i}" for i in range(MAX_RANKED_TERMS)]
    assert select_terms(["common"], df, num_docs=20_000) == ["common"]  # nothing rarer: keep it


def test_bm25_ranks_title_and_rare_terms_first(tiny):
    assert tiny.search("Salt Ledger")[0].id == "salt"
    hits = tiny.search("poet bells")
    assert hits[0].id == "mara" and hits[0].score >= hits[-1].score


def test_stemming_matches_other_word_forms(tiny):
    assert tiny.search("chronicles")[0].id == "salt"


@pytest.mark.parametrize("given,expected", [(10**9, MAX_TOP_K), (0, 1), (-5, 1), ("3", 3), (None, 5), (2.7, 2)])
def test_clamp_top_k(given, expected):
    assert clamp_top_k(given) == expected


def test_top_k_is_clamped_in_search(mini):
    assert len(mini.search("the", top_k=10**9)) == MAX_TOP_K  # "the" is in every document
    assert len(mini.search("town", top_k=-1)) == 1


def test_snippets_are_bounded(tmp_path):
    long = Document("long", "Long", " ".join(["copper"] + ["filler"] * 5000))
    index = SearchIndex.build([long], tmp_path / "l.sqlite")
    (hit,) = index.search("copper")
    assert len(hit.snippet.split()) <= 41  # SNIPPET_TOKENS words plus the ellipsis


def test_get_by_id(tiny):
    assert tiny.get("vell").url == "https://x.example/vell"
    assert tiny.get("nope") is None
    assert tiny.get("'; DROP TABLE documents; --") is None
    assert tiny.get("\ud800") is None
    assert tiny.get("x" * 100_000) is None


def test_duplicate_ids_are_a_clear_error(tmp_path):
    docs = _docs() + [Document("vell", "Again", "again")]
    with pytest.raises(ValueError, match="duplicate document id 'vell'"):
        SearchIndex.build(docs, tmp_path / "d.sqlite")
    assert not list(tmp_path.iterdir())  # no temp file left behind


def test_parallel_queries_from_many_threads(mini):
    queries = ["copper bells", "river town", "festival", "poet", "salt"] * 20
    expected = [[h.id for h in mini.search(q)] for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: [h.id for h in mini.search(q)], queries))
    assert got == expected


# -- caching -------------------------------------------------------------------------------


def _corpus(path: Path, docs: list[Document]) -> Corpus:
    write_jsonl(docs, path)
    return resolve_corpus(path)


def test_index_is_cached_next_to_a_writable_corpus_and_reused(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl", _docs())
    first = open_cached_index(corpus)
    assert first.path == tmp_path / "c.jsonl.fts5.sqlite"
    stamp = first.path.stat().st_mtime_ns
    again = open_cached_index(corpus)
    assert again.path.stat().st_mtime_ns == stamp and again.num_docs == 4


def test_index_is_rebuilt_when_the_corpus_changes(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl", _docs())
    assert open_cached_index(corpus).get("new") is None
    _corpus(tmp_path / "c.jsonl", _docs() + [Document("new", "New", "a brand new zeppelin")])
    index = open_cached_index(corpus)
    assert index.get("new") is not None and index.search("zeppelin")[0].id == "new"


def test_corrupt_cache_file_is_rebuilt(tmp_path):
    corpus = _corpus(tmp_path / "c.jsonl", _docs())
    index_path_for(corpus).write_bytes(b"not a database" * 100)
    assert open_cached_index(corpus).search("copper")


def test_installed_package_data_is_cached_outside_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "lib" / "site-packages" / "somepkg" / "data"
    data.mkdir(parents=True)
    corpus = _corpus(data / "c.jsonl", _docs())
    index = open_cached_index(corpus)
    assert index.path.parent == tmp_path / "cache" / "search"
    assert list(data.iterdir()) == [data / "c.jsonl"]


def test_explicit_cache_dir_wins_and_names_differ_per_corpus(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = _corpus(tmp_path / "a" / "c.jsonl", _docs()), _corpus(tmp_path / "b" / "c.jsonl", _docs())
    pa, pb = index_path_for(a, tmp_path / "cache"), index_path_for(b, tmp_path / "cache")
    assert pa.parent == pb.parent == tmp_path / "cache" and pa != pb


def test_missing_index_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="SearchIndex.build"):
        SearchIndex(tmp_path / "none.sqlite")
