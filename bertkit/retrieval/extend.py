"""Adding to a finished index what is made from its own files: an HNSW graph, a lexical part.

`bertkit index` builds the graph (`--ann hnsw`) and the lexical part (unless
`--no-lexical`) after the vectors, from the vectors and the passages alone; the
encoding before them is what takes minutes to hours. So a finished index that
lacks one gets it from what it holds, without the corpus or the model:

    bertkit index add INDEX --ann hnsw        the graph, from vectors.safetensors (`bertkit.retrieval.ann`)
    bertkit index add INDEX                   the lexical part, from passages.jsonl, if it was built with
                                              --no-lexical (`bertkit.retrieval.lexical`)

The same functions write the same files as a build that asked for them at once
(the test compares the bytes): the graph of the same vectors with the same M and
efConstruction, the lexical part of the same passages with the same settings.
index.json gains the part's record last, atomically, so a kill before that
leaves the index as it was (the lexical folder, renamed into place whole, is kept
and recorded by the next run). An existing graph is built again only with
`overwrite`. The folder is locked meanwhile (`bertkit.data.lock`); a server that
has the index open goes on answering from the build it opened
(`bertkit.retrieval.index.Index`).
"""

from __future__ import annotations

from pathlib import Path

from bertkit.data.lock import folder_lock
from bertkit.errors import BertkitError
from bertkit.retrieval.ann import HNSW_FILE, build_measured, check_kind, faiss_module
from bertkit.retrieval.config import LexicalOptions
from bertkit.retrieval.index import open_index, update_info
from bertkit.retrieval.lexical import build_lexical, require_packages


def add_parts(directory, *, ann: str | None = None, ann_m: int = 32, ef_construction: int = 200,
              ef_search: int = 128, lexical: LexicalOptions | None = LexicalOptions(), overwrite: bool = False,
              progress: bool = True) -> dict:
    """Build into the finished index `directory` the HNSW graph (`ann` "hnsw": M `ann_m`, `ef_construction`,
    searched with `ef_search`) and the lexical part (`lexical`'s settings; None: not) that it lacks; returns
    index.json's records of what was added. An existing graph is built again only with `overwrite`."""
    if ann is not None:
        check_kind(ann, ann_m, ef_construction, ef_search)
        faiss_module()  # a missing package is said before anything is read
    if lexical is not None:
        lexical.validate()
    directory = Path(directory)
    with folder_lock(directory, "bertkit index add"):
        index = open_index(directory)
        made, added = index.info, {}
        if lexical is not None and not made.get("lexical"):  # bm25s is needed only to build a missing part: an index
            require_packages(lexical)  # that has one was refused a graph without it; said before the graph is built
        if ann is not None and made.get("ann") and not overwrite:
            have = made["ann"]
            raise BertkitError(f"{directory} has an HNSW graph already (M {have['m']}, efConstruction "
                               f"{have['ef_construction']}): pass --overwrite to build it again with these settings")
        if ann is not None:
            added["ann"] = build_measured(index.float_rows("--ann hnsw"), directory / HNSW_FILE, m=ann_m,
                                          ef_construction=ef_construction, ef_search=ef_search, progress=progress)
        if lexical is not None and not made.get("lexical"):
            texts = [p["text"] for p in index.passages(range(len(index)))]
            added["lexical"] = build_lexical(directory, texts, lexical, progress=progress)
        if not added:
            raise BertkitError(f"nothing to add: {directory} has its lexical part already (or --no-lexical was "
                               "given) and no --ann was asked for: bertkit index add INDEX --ann hnsw adds a graph")
        update_info(directory, **added)  # last: until now the index is the one it was
    return added
