"""The lexical part of an index: BM25 over the same passages as the vectors.

`bertkit index` builds it beside the vectors (unless `--no-lexical`), with
bm25s (the package `bertkit.retrieval.bm25` uses for its baseline): Lucene's
idf, k1 and b as `LexicalOptions` says (1.5, 0.75), tokens the lower-cased runs
of two or more word characters, English stop words removed, and **stemmed** by
PyStemmer's English (Porter 2) stemmer, MTEB's bm25s setting: stemming lets
"fractures" match "fracture" (on SciFact test, 0.662 -> 0.686 nDCG@10, issue 40).

On disk, `INDEX/lexical/`, as bm25s' `BM25.save` writes it: the eager score
matrix in CSC form (`data.csc.index.npy` float32 [nnz], `indices.csc.index.npy`
[nnz] passage rows, `indptr.csc.index.npy` [V + 1]: column t holds term t's BM25
weight in every passage that has it), `vocab.index.json` (token -> column) and
`params.index.json`. Only .npy and JSON: it is read back with
`allow_pickle=False`, memory-mapped, so nothing read can run code. Opening an
index holds the part without bm25s (`hold_lexical`: arrays mapped, the JSON
objects its check read, once, so it stays this build's); the retriever is made when a search first
needs it (`read_lexical`): a dense search never imports bm25s. The folder
is written as `lexical.tmp/` and renamed into place: whole or absent
(`bertkit.data.atomic.write_folder`). It takes
seconds to minutes (tokenizing is the cost), so a kill loses at most this one
step; `--resume` builds it again when it is absent and keeps it when present.
index.json's "lexical" records the settings. The retriever is made from bm25s' own fields, so the bm25s
releases whose layout that knows are the ones taken (`BM25S_RANGE`, 0.2 to 0.3); another is one line naming it.

A query's score for a passage is the sum of its tokens' weights there (a token
twice in the query counts twice, as in bm25s); a document scores its best
passage's (as in the dense run), and a document none of whose passages shares
a token with the query is not in the run.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from bertkit.data.atomic import room_for, write_folder
from bertkit.errors import BertkitError, MissingPackage
from bertkit.retrieval.bm25 import require_bm25s, stem_function
from bertkit.retrieval.config import LexicalOptions, options_of
from bertkit.retrieval.documents import best_first

LEXICAL_DIR = "lexical"
# what bm25s' BM25.save writes there (method lucene, no corpus), each checked when an index is opened
LEXICAL_FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "vocab.index.json",
                 "params.index.json")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s' (and scikit-learn's CountVectorizer's) default
# the bm25s releases [from, below) whose save layout and retriever fields `read_lexical` rebuilds: it makes the
# retriever from the files an index holds open, which bm25s' public BM25.load (it takes a folder's path) cannot,
# so it sets bm25s' own fields. Checked: 0.2.0, 0.2.5, 0.2.14, 0.3.0, 0.3.2 and 0.3.16 each reading its own build
# as its BM25.load does, and 0.2.0 and 0.3.16 each other's; pyproject's search extra asks for the same range.
BM25S_RANGE = ((0, 2), (0, 4))


BUILD_WITHOUT = "build it with --no-lexical (dense search only)"


def require_packages(options: LexicalOptions, instead: str | None = BUILD_WITHOUT) -> None:
    """bm25s and the stemmer `options` names, or one line naming the extra to install and what does without
    them (`instead`; None: nothing does): an index asks before it encodes anything, since its lexical part is
    built last; a search that reads the part, before its query encoder loads (`retrieval.index.Index.lexical`)."""
    try:
        require_bm25s()
        stem_function(options.stemmer)
    except MissingPackage as e:
        raise MissingPackage(f"the index's lexical part: {e}" + (f", or {instead}" if instead else "")) from None


def supported_bm25s():
    """bm25s, when its release is one `read_lexical` knows the layout of (`BM25S_RANGE`); else one line naming the
    installed release and the pip command, before anything is built or read with it."""
    bm25s = require_bm25s()
    release = tuple(int(part) for part in re.findall(r"\d+", getattr(bm25s, "__version__", ""))[:2])
    if not BM25S_RANGE[0] <= release < BM25S_RANGE[1]:
        raise MissingPackage(f"the index's lexical part is read with bm25s 0.2 to 0.3, whose saved layout bertkit "
                             f"rebuilds, and bm25s {getattr(bm25s, '__version__', '(no version)')} is installed: "
                             "pip install 'bm25s>=0.2,<0.4'")
    return bm25s


def tokenize(texts: list[str], options: LexicalOptions, *, ids: bool, progress: bool = False):
    """bm25s tokens of `texts` (ids=True: a Tokenized with its vocabulary, for indexing; else lists of strings)."""
    bm25s = require_bm25s()
    return bm25s.tokenize(list(texts), lower=True, token_pattern=TOKEN_PATTERN, stopwords=options.stopwords,
                          stemmer=stem_function(options.stemmer), return_ids=ids, show_progress=progress)


def in_sorted_order(tokenized):
    """The same tokens with the vocabulary numbered in sorted order. bm25s numbers words through a set, so
    its ids follow Python's string hashing, which differs between processes: without this, two builds of
    one corpus (one process, or several ranks) rank alike but write different bytes."""
    order = {word: i for i, word in enumerate(sorted(tokenized.vocab))}
    new_id = {old: order[word] for word, old in tokenized.vocab.items()}
    return type(tokenized)(ids=[[new_id[i] for i in doc] for doc in tokenized.ids], vocab=order)


def record(options: LexicalOptions, vocabulary: int) -> dict:
    """What index.json says about the lexical part."""
    return {**dataclasses.asdict(options), "method": "lucene", "token_pattern": TOKEN_PATTERN,
            "vocabulary": vocabulary, "directory": LEXICAL_DIR}


def lexical_bytes(tokenized) -> int:
    """A certain lower bound of the bytes BM25.save writes for `tokenized` passages: a float32 weight and an int32
    row per (token, passage) that occurs (the CSC matrix; lucene scores every occurrence above 0), 4 bytes per column
    boundary at least (indptr), and the vocabulary's words (vocab.index.json)."""
    pairs = sum(len(set(ids)) for ids in tokenized.ids)
    return 8 * pairs + 4 * (len(tokenized.vocab) + 1) + sum(len(word.encode("utf-8")) for word in tokenized.vocab)


def build_lexical(out: Path, texts: list[str], options: LexicalOptions, progress: bool = False) -> dict:
    """Write OUT/lexical/ for the passages `texts` (row order); returns its index.json record. A folder
    already there (a resumed build that got past this step) is kept."""
    options.validate()
    final = out / LEXICAL_DIR
    if not (final / "params.index.json").is_file():
        bm25s = supported_bm25s()
        retriever = bm25s.BM25(k1=options.k1, b=options.b, method="lucene")
        tokenized = in_sorted_order(tokenize(texts, options, ids=True, progress=progress))
        # refused before the matrix is made (the vectors stay: --resume builds this part once there is room)
        room_for(out, lexical_bytes(tokenized), "the BM25 files of the index's lexical part")
        retriever.index(tokenized, show_progress=progress)
        # a full disk or Ctrl-C leaves no half folder holding the room, and names the folder with the disk's reason
        # (numpy's was "2788 requested and 718 written")
        with write_folder(final) as tmp:
            retriever.save(str(tmp), allow_pickle=False)
    return record(options, len(json.loads((final / "vocab.index.json").read_text(encoding="utf-8"))))


def hold_lexical(directory: Path, objects: dict | None = None) -> dict:
    """An index folder's lexical part as opened, without bm25s: file name -> its .npy memory-mapped, or its
    .json's object (`objects`: as the index's check read them, once; None: read here), and "folder": where. What
    is held stays this build's when the folder is built again, so the retriever made from it later
    (`read_lexical`, when a search first needs it) is too; a dense search never imports bm25s."""
    folder = Path(directory) / LEXICAL_DIR
    return {"folder": folder} | {
        name: np.load(folder / name, mmap_mode="r", allow_pickle=False) if name.endswith(".npy")
        else json.loads((folder / name).read_bytes()) if objects is None else objects[name] for name in LEXICAL_FILES}


def read_lexical(held: dict):
    """The bm25s retriever of a held lexical part (`hold_lexical`), made as bm25s' `BM25.load` makes it from
    the folder (which takes only paths, and the path may hold another build by now): its settings from
    params.index.json, vocab_dict, the memory-mapped score matrix; method lucene keeps no non-occurrence
    array. Nothing unpickled."""
    bm25s = supported_bm25s()
    params, vocab = dict(held["params.index.json"]), held["vocab.index.json"]  # the held object stays as read
    version, num_docs = params.pop("version", None), params.pop("num_docs", None)
    try:
        retriever = bm25s.BM25(**params)
    except TypeError as err:  # a setting this bm25s does not have: another layout than BM25S_RANGE's
        raise BertkitError(f"{held['folder'] / 'params.index.json'} was written by bm25s {version}, and bm25s "
                           f"{bm25s.__version__} does not read it ({err}): build the index's lexical part again "
                           "with this bm25s, or install the one that wrote it") from None
    retriever.vocab_dict, retriever.unique_token_ids_set = vocab, set(vocab.values())
    retriever._original_version, retriever.nonoccurrence_array = version, None
    retriever.scores = {"data": held["data.csc.index.npy"], "indices": held["indices.csc.index.npy"],
                        "indptr": held["indptr.csc.index.npy"], "num_docs": num_docs}
    return retriever


def passage_scores(retriever, tokens: list[str]) -> np.ndarray | None:
    """BM25 score of every passage [N] for one query's tokens; None when no token is in the vocabulary."""
    ids = retriever.get_tokens_ids(tokens)
    return None if not ids else np.asarray(retriever.get_scores_from_ids(ids), dtype=np.float32)


def lexical_documents(retriever, info: dict, document: np.ndarray, queries: list[str],
                      k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per query, the rows of the best passages of its k best documents by BM25 and their scores, best
    first (a document by its best passage; only documents that share a token with the query)."""
    tokens = tokenize(queries, options_of(info), ids=False)
    depth = k * int(info["max_passages_per_document"])
    out_rows, out_scores = [], []
    for query_tokens in tokens:
        scores = passage_scores(retriever, query_tokens)
        rows, kept = best_first(scores, depth, document, k) if scores is not None else ([], [])
        out_rows.append(rows)
        out_scores.append(kept)
    return out_rows, out_scores
