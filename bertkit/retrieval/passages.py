"""Passages: a corpus of documents cut into pieces an encoder reads whole.

A bi-encoder reads at most its `max_seq_length` tokens (256 for the default
all-MiniLM-L6-v2) and drops the rest, so a long document is cut into
overlapping passages by tokens (`bertkit.text.windows.spans`: windows of
`passage_tokens - 2` word pieces, [CLS] and [SEP] taking the other two, sharing
`stride` pieces, the overlap, as everywhere in bertkit; default: half a window,
`bertkit.text.windows.half_window`), and a
document is later scored by its best passage (the "MaxP" of Dai and Callan
2019, what dense retrievers over long documents do).

A document's text is its title and text joined by one space
(`bertkit.data.beir.document_text`); a passage keeps its document's id and
title and its character span in that text, so `text == document[start:end]`:

    Passage(id="4983#1", doc_id="4983", title="...", start=812, end=1990, text=...)

The span runs from the first character of the window's first piece to the last
character of its last piece. A window that begins inside a word (on a `##`
piece) begins at the next word instead (`word_start`), so no passage, and no
snippet shown from it, starts mid-word ("ate to reduce the risk"); the pieces
skipped are the previous window's last ones, which it shares when `stride`
covers them. The encoder re-tokenises the passage text, which can differ from
the window by a piece at the end, and truncates at the passage length.

Corpora (`read_documents`): a BEIR `corpus.jsonl` or `corpus.jsonl.gz` (or the folder holding it),
a TSV whose header names `id` (or `_id`), `text` and optionally `title`, or a
folder of .txt files (the id is the file's path under the folder without
`.txt`, no title; hidden files and folders, and a tokenizer's vocab.txt, skipped, as `corpus_files` skips
them: the index warns naming each vocab.txt it skipped).

An index stores its passages as passages.jsonl (`passage_lines`), one JSON object a line, and its build
plan their SHA-256 (`passages_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from bertkit.errors import BertkitError
from bertkit.data.beir import document_text, is_corpus_jsonl, read_corpus
from bertkit.data.textfiles import existing_file, hidden_in, open_text, read_text, tokenizer_vocab, tsv_rows
from bertkit.text.windows import half_window, spans


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Passage:
    """A window of a document: `text` is `document_text(doc)[start:end]`."""

    id: str  # "<doc_id>#<k>": the k-th passage of its document
    doc_id: str
    title: str
    start: int
    end: int
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


# --- reading a corpus -----------------------------------------------------------------------

def _read_tsv(path: Path, dedupe: bool) -> list[Document]:
    with open_text(path, "corpus") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        key = next((c for c in ("id", "_id") if c in header), None)
        if key is None or "text" not in header:
            missing = ", ".join(c for c, ok in (("id", key), ("text", "text" in header)) if not ok)
            raise BertkitError(f"{path} has no {missing} column (header: {' '.join(header) or 'empty'}): a corpus "
                               "TSV needs a header naming id, text and optionally title")
        where = {c: header.index(c) for c in (key, "text", "title") if c in header}
        docs, lines = [], {}
        for number, cells in tsv_rows(f, path, len(header)):
            title = cells[where["title"]] if "title" in where else ""
            docs.append(Document(cells[where[key]], title, cells[where["text"]]))
            first = lines.setdefault(docs[-1].id, number)
            if first != number and not dedupe:  # named by its lines, as the BEIR reader names them
                raise BertkitError(f"{path}: id {docs[-1].id!r} appears on line {first} and again on line {number}: "
                                   "ids must be unique; fix the file, or pass --dedupe to keep the first of each")
    return docs


def _read_folder(folder: Path) -> list[Document]:
    # the files vocab train and pretrain prepare read from a folder (`corpus_files`): no hidden file, nor a
    # .ipynb_checkpoints copy of each text, read as one more document (each such text found twice in a search),
    # nor a tokenizer's vocab.txt (`vocab train corpus -o corpus/v1`), whose "[PAD] [UNK] [CLS]" lines a search found
    files = sorted(p for p in folder.rglob("*.txt") if p.is_file() and not hidden_in(p, folder))
    vocabularies = [p for p in files if tokenizer_vocab(p)]
    if vocabularies:
        names = ", ".join(p.relative_to(folder).as_posix() for p in vocabularies)
        warnings.warn(f"corpus {folder}: skipped {len(vocabularies)} tokenizer vocab.txt file(s) ({names}): a "
                      "tokenizer_config.json or config.json beside each says it is a vocabulary, not a document; "
                      "move it out of the folder, or rename it, to have it indexed", stacklevel=3)
        files = [p for p in files if p not in vocabularies]
    return [Document(p.relative_to(folder).with_suffix("").as_posix(), "", read_text(p, "corpus file"))
            for p in files]


def read_documents(path, dedupe: bool = False) -> list[Document]:
    """The documents of a corpus (see the module docstring), in file order; ids must be unique
    (`dedupe`: the first document of each id is kept, the others dropped with a warning)."""
    path = Path(path)
    if is_corpus_jsonl(path):
        docs = [Document(i, d["title"], d["text"]) for i, d in read_corpus(path, dedupe).items()]
    elif path.is_dir():
        docs = _read_folder(path)
        if not docs:
            raise BertkitError(f"{path} holds no corpus.jsonl and no .txt files: pass a BEIR folder, a corpus.jsonl, "
                               "a TSV (id, title, text) or a folder of .txt files")
    elif path.suffix.lower() == ".tsv":
        docs = _read_tsv(existing_file(path, "corpus"), dedupe)
    else:
        existing_file(path, "corpus")
        raise BertkitError(f"corpus {path}: use a BEIR corpus.jsonl (or its folder), a .tsv with id, title, text "
                           "columns, or a folder of .txt files")
    if not docs:
        raise BertkitError(f"corpus {path} holds no documents")
    seen, unique = set(), []
    for d in docs:
        if d.id in seen and not dedupe:
            raise BertkitError(f"corpus {path}: document id {d.id!r} appears twice; ids must be unique (or pass "
                               "--dedupe to keep the first of each)")
        if d.id not in seen:
            seen.add(d.id)
            unique.append(d)
    if len(unique) < len(docs):
        warnings.warn(f"corpus {path}: {len(docs) - len(unique)} document(s) repeat an earlier id and were dropped "
                      "(--dedupe keeps the first)", stacklevel=2)
    return unique


# --- cutting --------------------------------------------------------------------------------

def default_stride(passage_tokens: int) -> int:
    """Half a window of word pieces (`bertkit.text.windows.half_window`)."""
    return half_window(passage_tokens - 2)


def cut(doc: Document, tokenizer, passage_tokens: int, stride: int) -> tuple[list[Passage], list[int]]:
    """A document's passages (windows of `passage_tokens - 2` pieces sharing `stride`) and the word
    pieces of each; ([], []) when the text has no tokens (only characters BERT drops)."""
    text = document_text({"title": doc.title, "text": doc.text})
    if not text.strip():
        return [], []
    encoded = tokenizer.encode(text, truncation=False, add_special_tokens=False)
    offsets = encoded.offsets  # [T] (start, end)
    if not offsets:
        return [], []
    passages, pieces = [], []
    for k, (s, e) in enumerate(spans(len(offsets), passage_tokens - 2, stride)):
        s = word_start(encoded.tokens, s, e)
        start, end = offsets[s][0], offsets[e - 1][1]
        passages.append(Passage(f"{doc.id}#{k}", doc.id, doc.title, start, end, text[start:end]))
        pieces.append(e - s)
    return passages, pieces


def word_start(tokens: list[str], s: int, e: int) -> int:
    """The first piece in tokens[s:e] that begins a word (not a `##` continuation); `s` when the window
    lies inside one long word."""
    for i in range(s, e):
        if not tokens[i].startswith("##"):
            return i
    return s


def cut_all(docs: Iterable[Document], tokenizer, passage_tokens: int,
            stride: int) -> tuple[list[Passage], list[int], int]:
    """(every document's passages in document order, the word pieces of each, how many documents
    had no tokens)."""
    if isinstance(passage_tokens, bool) or not isinstance(passage_tokens, int) or passage_tokens < 3:
        raise BertkitError(f"--passage-tokens {passage_tokens}: a passage needs at least 3 tokens ([CLS], one "
                           "word piece, [SEP])")
    if isinstance(stride, bool) or not isinstance(stride, int) or not 0 <= stride < passage_tokens - 2:
        raise BertkitError(f"--stride {stride}: consecutive passages share 0 to {passage_tokens - 3} word pieces (fewer than "
                           f"the {passage_tokens - 2} of a passage of {passage_tokens} tokens)")
    passages, pieces, empty = [], [], 0
    for doc in docs:
        more, counts = cut(doc, tokenizer, passage_tokens, stride)
        empty += not more
        passages.extend(more)
        pieces.extend(counts)
    return passages, pieces, empty


# --- passages.jsonl ----------------------------------------------------------------------------

def passage_lines(passages: list[Passage]) -> list[bytes]:
    """An index's passages.jsonl (`bertkit.retrieval.index`) as its lines: one JSON object per passage."""
    return [json.dumps(p.to_dict(), ensure_ascii=False).encode() + b"\n" for p in passages]


def passages_sha256(lines: list[bytes]) -> str:
    """The SHA-256 of passages.jsonl's bytes, its `lines` joined (build.json's passages_sha256), taken a line at
    a time: hashing b"".join(lines) held a second copy of every passage beside the lines (same digest)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line)
    return digest.hexdigest()
