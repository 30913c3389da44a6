"""An index in Qdrant: for a corpus that one machine cannot serve, on an engine that shards it.

`export` writes an index's vectors into a Qdrant collection (cosine distance),
one point per passage (an index that stores only compact codes, `bertkit index
--vectors int8|binary`: the vectors its codes stand for, what its own search rescores with): the point id is the passage's row, the payload its
record (`id`, `doc_id`, `title`, `start`, `end`, `text`) and its document
number; the collection's metadata keeps the index's index.json, so a query is
embedded by the model that made the vectors and another model is refused, as
for the index itself (`bertkit.retrieval.index.check_model`).

`search` asks Qdrant for the `k x max_passages_per_document` nearest passages
and keeps each document's best, as `bertkit.retrieval.search` does: the same
answers as the exact search when Qdrant's search is exact, which its local mode
(a folder on disk, in-process, what the tests use) is; a server (`http://...`)
searches its own HNSW graph, approximate.

Hybrid (an index with a lexical part): each point also carries the named sparse
vector "bm25", its passage's BM25 weights as the index stores them (the column
of the bm25s score matrix: idf(t) x the saturated term frequency, k1 and b
applied), indexed by the term's column; the vocabulary (term -> column) and the
lexical settings go into the collection's metadata. A query's sparse vector is
its terms' counts, so Qdrant's sparse dot product is the BM25 score bertkit
computes (no IDF modifier: the weights hold it). `search` then asks Qdrant's
Query API for both runs as prefetches and fuses them there: "rrf" is Qdrant's
RRF with its k' = k + 1 (its formula 1 / (k' + rank - 1), see
`bertkit.retrieval.fusion`), "dbsf" Qdrant's DBSF; Qdrant weighs the runs
equally (its RRF weights divide the rank, not the score), so alpha must be 0.5,
and it has no min-max fusion. Its fused score is the runs' unweighted sum, twice
bertkit's with alpha 0.5: `search` reports it x 0.5, so a hybrid hit scores as
`bertkit search INDEX` scores it. Qdrant fuses passages and bertkit documents (each
by its best passage): the answers are the same where a document is one passage
(the test), and may differ in order where documents have several.

qdrant-client is optional (`pip install 'bertkit[search]'`) and imported only here.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sqlite3
import warnings

import numpy as np
from tqdm import tqdm

from bertkit.errors import BertkitError, MissingPackage
from bertkit.retrieval.codes_file import rows_or_decoded
from bertkit.retrieval.config import FusionOptions, options_of
from bertkit.retrieval.lexical import tokenize
from bertkit.retrieval.documents import first_per_document
from bertkit.retrieval.search import (Hit, check_k, embed_queries, fusion_options, query_encoder,
                                      warn_mixed_precision)

METADATA_KEY = "bertkit_index"  # the collection's metadata entry holding index.json
VOCABULARY_KEY = "bertkit_vocabulary"  # with a lexical part: term -> sparse index
SPARSE = "bm25"  # the sparse vector's name


def require_qdrant():
    """qdrant_client and its models, or one line naming the extra to install."""
    try:
        import qdrant_client
        from qdrant_client import models
    except ImportError:
        raise MissingPackage("--qdrant needs qdrant-client: pip install 'bertkit[search]'") from None
    return qdrant_client, models


def connect(location: str):
    """A client: a URL (http:// or https://) reaches a server, anything else is a local-mode folder."""
    qdrant_client, _ = require_qdrant()
    if location.startswith(("http://", "https://")):
        return qdrant_client.QdrantClient(url=location)
    return qdrant_client.QdrantClient(path=location)


def export(index, location: str, collection: str, *, batch_size: int = 1024, progress: bool = True,
           resume: bool = False, overwrite: bool = False) -> int:
    """Write every passage of `index` (a `bertkit.retrieval.index.Index`: named, not imported, the caller
    opens it) into a new collection (with its BM25 weights as sparse vectors when
    the index has a lexical part); returns the number of points. resume: finish the interrupted export of
    this index into `collection` (the batches whose points are all there are skipped); overwrite: replace
    the collection first."""
    _, models = require_qdrant()
    client = connect(location)
    try:
        lexical = index.lexical() if index.info.get("lexical") else None
        if _prepare(client, location, collection, index.info, resume, overwrite):
            metadata = {METADATA_KEY: index.info} | ({} if lexical is None else {VOCABULARY_KEY: lexical.vocab_dict})
            client.create_collection(collection, vectors_config=models.VectorParams(
                size=int(index.info["dim"]), distance=models.Distance.COSINE), metadata=metadata,
                sparse_vectors_config=None if lexical is None else {SPARSE: models.SparseVectorParams()})
        rows_terms = None if lexical is None else passage_terms(lexical.scores)
        n = len(index)
        with tqdm(total=n, disable=not progress, desc="exporting", unit="passage") as bar:
            for start in range(0, n, batch_size):
                rows = range(start, min(start + batch_size, n))
                if resume and len(client.retrieve(collection, ids=list(rows), with_payload=False)) == len(rows):
                    bar.update(len(rows))  # written before the interruption
                    continue
                payloads = [{**p, "document": int(index.document[r])} for r, p in zip(rows, index.passages(rows))]
                dense = rows_or_decoded(index, start, rows.stop).tolist()
                if rows_terms is None:
                    points = models.Batch(ids=list(rows), vectors=dense, payloads=payloads)
                else:
                    points = [models.PointStruct(id=r, payload=payload, vector={"": vector, SPARSE: models.SparseVector(
                        indices=rows_terms[0][r].tolist(), values=rows_terms[1][r].tolist())})
                        for r, vector, payload in zip(rows, dense, payloads)]
                client.upsert(collection, points=points)
                bar.update(len(rows))
        return n
    except sqlite3.OperationalError as err:  # a local store (a folder) keeps its points in SQLite
        raise _store_refused(err, location) from err
    finally:
        client.close()


def _store_refused(err, location: str) -> Exception:
    """SQLite's error writing Qdrant's local store said for a person: a full disk is the OSError ENOSPC naming the
    folder (the CLI's one line, with --resume), a write SQLite could not make (a file-size limit, a failing disk:
    it keeps no errno) a BertkitError naming it; any other error (a store another process holds) as it was.
    Both ended in a traceback ("sqlite3.OperationalError: database or disk is full"). SQLite's transactions keep
    the store whole: --resume finishes the export."""
    name = getattr(err, "sqlite_errorname", "")  # Python 3.11 and later; the message before
    if name == "SQLITE_FULL" or "disk is full" in str(err):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), location)
    if name.startswith("SQLITE_IOERR") or "disk I/O error" in str(err):
        return BertkitError(f"{location}: Qdrant's local store could not be written ({err}: a full disk, a "
                            "file-size limit or a failing disk); once it can, --resume finishes the export")
    return err


def _prepare(client, location: str, collection: str, info: dict, resume: bool, overwrite: bool) -> bool:
    """Whether the collection is to be created: new, or replaced (overwrite); an existing one is refused in
    one line unless it is this index's interrupted export and `resume` finishes it."""
    if resume and overwrite:
        raise BertkitError("--resume continues an interrupted export and --overwrite starts it again: give one")
    exists = client.collection_exists(collection)
    if exists and overwrite:
        client.delete_collection(collection)
        return True
    if not exists:
        if resume:
            raise BertkitError(f"--resume: there is no collection {collection!r} in {location} to finish; export "
                               "without --resume")
        return True
    made = (client.get_collection(collection).config.metadata or {}).get(METADATA_KEY)
    if made is None:
        raise BertkitError(f"collection {collection!r} already exists in {location} and was not written by bertkit "
                           "index export: choose another name, or pass --overwrite to replace it")
    if resume and _same_index(made, info):
        return False
    if resume:
        raise BertkitError(f"--resume: collection {collection!r} in {location} was exported from another index "
                           f"({made.get('corpus')}, {made.get('passages')} passages): pass --overwrite to replace it")
    held = _points(client, collection)
    if held < made.get("passages", 0):
        raise BertkitError(f"collection {collection!r} in {location} holds {held} of its index's {made['passages']} "
                           "passages (an export that was interrupted): pass --resume to finish exporting this index "
                           "into it, --overwrite to replace it, or choose another name")
    raise BertkitError(f"collection {collection!r} already exists in {location}: choose another name, or pass "
                       "--overwrite to replace it")


def _same_index(made: dict, info: dict) -> bool:
    """Whether a collection's recorded index.json is `info`'s index (the fusion `--tune` may have added aside)."""
    return {k: v for k, v in made.items() if k != "fusion"} == {k: v for k, v in info.items() if k != "fusion"}


def _points(client, collection: str) -> int:
    return client.count(collection, exact=True).count


def passage_terms(scores: dict) -> tuple[list, list]:
    """Per passage row, its terms' columns and BM25 weights, from bm25s' CSC score matrix (a column per
    term, holding the passage rows that have it): the matrix read by rows."""
    data, rows, indptr = np.asarray(scores["data"]), np.asarray(scores["indices"]), np.asarray(scores["indptr"])
    terms = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))  # the column of each stored weight
    order = np.argsort(rows, kind="stable")  # by passage, terms ascending within it
    starts = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=scores["num_docs"]))])
    return ([terms[order[a:b]] for a, b in zip(starts[:-1], starts[1:])],
            [data[order[a:b]] for a, b in zip(starts[:-1], starts[1:])])


def search(location: str, collection: str, queries: list[str], k: int = 10, *, model=None, device=None,
           dtype=None, batch_size: int = 32, fusion: FusionOptions | dict | None = None,
           fast=True) -> list[list[Hit]]:
    """For each query, the k best documents of the collection with their best passages, best first.
    fusion: the mode (default dense) and, for hybrid, Qdrant's fusion (see the module docstring), or a dict of
    the settings given, the rest as for the collection's index (`collection_fusion`); fast: the query encoder's
    fast-path settings."""
    check_k(k)
    client = connect(location)
    try:
        info = _collection_info(client, location, collection)
        mode = fusion.get("mode") if isinstance(fusion, dict) else fusion and fusion.mode
        if mode in ("hybrid", "lexical") and not info.get("lexical"):  # the index's line would say "bertkit index
            # add INDEX", which leaves this collection without sparse vectors: refused again, the same line
            raise BertkitError(f"collection {collection!r} in {location} has no BM25 sparse vectors (its index had no "
                               "lexical part: --no-lexical, or a bertkit before lexical parts): search it with --mode "
                               "dense, or add one with bertkit index add INDEX and export it again with --overwrite")
        fusion = (FusionOptions(mode="dense") if fusion is None else fusion if isinstance(fusion, FusionOptions)
                  else collection_fusion(info, fusion))
        if fusion.mode is None:  # as for an index: hybrid when it has a lexical part
            fusion = dataclasses.replace(fusion, mode="hybrid" if info.get("lexical") else "dense")
        if fusion.mode != "dense":
            check_fusion(info, fusion)
        vectors = None
        if fusion.mode != "lexical":
            loaded = query_encoder(info, model, device, dtype, fast)
            warn_mixed_precision(info, loaded)  # the collection's info is its index's: the passages' precision
            vectors = embed_queries(info, loaded, list(queries), batch_size)
        if fusion.mode == "dense":
            return _answers(client, collection, info, vectors, k)
        return _fused_answers(client, collection, info, vectors, list(queries), k, fusion)
    finally:
        client.close()


def collection_fusion(info: dict, given: dict) -> FusionOptions:
    """The settings a search of the collection runs with, resolved as for its index (`fusion_options`: the
    defaults, under the fusion `evaluate retrieval --tune` wrote into the index.json the collection keeps, under
    `given`). A tuned alpha or min-max, which Qdrant cannot compute (it weighs the runs equally), gives way to
    equal weights and dbsf, said in one line; given ones are refused (`check_fusion`). Before, the tuning was
    ignored: a collection of an index tuned to rrf k 2 was fused by dbsf, unsaid."""
    options = fusion_options(info, given)
    given = {name for name, value in given.items() if value is not None}
    fixes = {**({"alpha": 0.5} if "alpha" not in given and options.alpha != 0.5 else {}),
             **({"fusion": "dbsf"} if "fusion" not in given and options.fusion == "minmax" else {})}
    if options.mode == "hybrid" and fixes:
        tuned = info.get("fusion") or {}
        warnings.warn(f"the index's fusion ({options.fusion}, alpha {options.alpha:g}, chosen by evaluate retrieval "
                      f"--tune on {tuned.get('tuned_on', 'a split')}) is not one Qdrant computes: fusing by Qdrant's "
                      f"{fixes.get('fusion', options.fusion)} with equal weights (bertkit search INDEX runs the "
                      "tuned one)", stacklevel=3)
        options = dataclasses.replace(options, **fixes)
    return options


def check_fusion(info: dict, fusion: FusionOptions) -> None:
    """Refuse, in one line, what Qdrant's fusion cannot do as bertkit does."""
    options_of(info)  # a collection of an index without a lexical part has no sparse vectors
    if fusion.mode == "hybrid" and (fusion.fusion == "minmax" or fusion.alpha != 0.5
                                    or (fusion.fusion == "rrf" and fusion.rrf_k != int(fusion.rrf_k))):
        raise BertkitError(f"--qdrant fuses by Qdrant's rrf (a whole k) or dbsf with equal weights (alpha 0.5), not "
                           f"{fusion.fusion} with alpha {fusion.alpha}, k {fusion.rrf_k:g}: e.g. --fusion rrf "
                           "--alpha 0.5")


def _sparse_queries(client, collection: str, info: dict, queries: list[str], models) -> list:
    """Each query's terms (their counts) as a sparse vector over the collection's vocabulary."""
    vocabulary = client.get_collection(collection).config.metadata[VOCABULARY_KEY]
    out = []
    for tokens in tokenize(queries, options_of(info), ids=False):
        counts: dict[int, int] = {}
        for token in tokens:
            if token in vocabulary:
                counts[vocabulary[token]] = counts.get(vocabulary[token], 0) + 1
        out.append(models.SparseVector(indices=list(counts), values=[float(c) for c in counts.values()]))
    return out


def _fused_answers(client, collection: str, info: dict, vectors, queries: list[str], k: int,
                   fusion: FusionOptions) -> list[list[Hit]]:
    _, models = require_qdrant()
    per_document = int(info["max_passages_per_document"])
    depth = max(k, fusion.depth) * per_document
    fused_by = (models.RrfQuery(rrf=models.Rrf(k=int(fusion.rrf_k) + 1)) if fusion.fusion == "rrf"
                else models.FusionQuery(fusion=models.Fusion.DBSF))
    answers = []
    for i, sparse in enumerate(_sparse_queries(client, collection, info, queries, models)):
        if fusion.mode == "lexical":
            points = client.query_points(collection, query=sparse, using=SPARSE, limit=k * per_document,
                                         with_payload=True).points
            points = [p for p in points if p.score > 0]
        else:
            prefetch = [models.Prefetch(query=[float(x) for x in vectors[i]], limit=depth),
                        models.Prefetch(query=sparse, using=SPARSE, limit=depth)]
            points = client.query_points(collection, prefetch=prefetch, query=fused_by, limit=depth,
                                         with_payload=True).points
            for point in points:  # Qdrant sums the runs unweighted; bertkit weighs each by its share, alpha = 0.5
                point.score *= fusion.alpha  # here (check_fusion): the fused score `bertkit search INDEX` prints
        answers.append(_hits(first_per_document(points, lambda point: point.payload["document"], k)))
    return answers


def _hits(points) -> list[Hit]:
    return [Hit(p.payload["id"], p.payload["doc_id"], float(p.score), p.payload["text"], p.payload["title"],
                p.payload["start"], p.payload["end"]) for p in points]


def search_vectors(location: str, collection: str, query_vectors, k: int = 10) -> list[list[Hit]]:
    """`search` for queries already embedded (unit vectors [Q, D], by the model that made the
    collection: nothing here can check that), as `bertkit.retrieval.search.search_vectors`."""
    check_k(k)
    client = connect(location)
    try:
        return _answers(client, collection, _collection_info(client, location, collection), query_vectors, k)
    finally:
        client.close()


def _collection_info(client, location: str, collection: str) -> dict:
    """The index.json that `export` kept in the collection's metadata."""
    if not client.collection_exists(collection):
        raise BertkitError(f"no collection {collection!r} in {location}: export one with bertkit index export "
                           f"INDEX --qdrant {location} --collection {collection}")
    info = (client.get_collection(collection).config.metadata or {}).get(METADATA_KEY)
    if info is None:
        raise BertkitError(f"collection {collection!r} was not written by bertkit index export: it does not say "
                           "which model made its vectors")
    held = _points(client, collection)
    if held != info["passages"]:  # an export killed half-way answers from the passages it wrote, silently
        raise BertkitError(f"collection {collection!r} in {location} holds {held} of its index's {info['passages']} "
                           f"passages: its export did not finish; finish it with bertkit index export INDEX --qdrant "
                           f"{location} --collection {collection} --resume")
    return info


def _answers(client, collection: str, info: dict, vectors, k: int) -> list[list[Hit]]:
    depth = k * int(info["max_passages_per_document"])
    answers = []
    for vector in vectors:
        points = client.query_points(collection, query=[float(x) for x in vector], limit=depth,
                                     with_payload=True).points
        answers.append(_hits(first_per_document(points, lambda point: point.payload["document"], k)))
    return answers
