"""Searching an index: the best documents for a query, each with its best passage.

A query is embedded by the model that made the index (`bertkit.retrieval.index`
records it and refuses another), the way the passages were: the same pooling,
unit length, truncated at the model's max length. Exact cosine top-k then scans
the memory-mapped vectors in blocks (`bertkit.retrieval.exact.top_k`): memory
stays about `query_block x block_size x 13` bytes for the scores and their
merge (`QUERY_BLOCK`) plus `block_size x D x 4` for one block of vectors,
whatever the number N of passages.

A document scores its best passage's score (MaxP). Ranking documents by that is
ranking passages and keeping each document's first: the top
`k x max_passages_per_document` passages always hold k documents (or all of
them), so one scan gives the exact answer.

With `ann=True` the HNSW graph built beside the vectors (`bertkit.retrieval.ann`)
gives the passages instead: faster on millions of vectors, and approximate.

Reranking the answers with a cross-encoder is `bertkit.tasks.rerank` (it
runs a fine-tuned model, a layer above retrieval).

An answer is, per query, a best-first list of hits:

    {"id": "4983#0", "doc_id": "4983", "score": 0.8123, "text": "..."}   (`Hit.to_dict`; a Hit also
                                                                        has the title and the span)
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError, int_at_least, refuse_unneeded, say_cut
from bertkit.embeddings.features import load_encoder
from bertkit.runtime.loading import Loaded
from bertkit.retrieval.ann import ann_top_k
from bertkit.retrieval.compact import compact_top_k
from bertkit.retrieval.config import FUSION_NEEDS, FusionOptions, options_of
from bertkit.retrieval.encoding import EncodingSettings, encode
from bertkit.retrieval.documents import first_of_each
from bertkit.retrieval.exact import top_k
from bertkit.retrieval.fusion import fuse, hybrid_weights
from bertkit.retrieval.index import Index, check_model, open_index
from bertkit.retrieval.lexical import lexical_documents, require_packages

DEFAULT_BLOCK = 16384  # vectors per block of the scan: 16384 x 384 x 4 bytes = 24 MiB
# queries scored together: the score tile and exact.top_k's merge buffers take about
# query_block x block_size x 13 bytes (float32 scores, argpartition's int64 output, the boolean tie
# check), 13 MiB here, beside the block; each further query block reads the vectors again
QUERY_BLOCK = 64
SHALLOW = 3  # passages per document the exact scan looks at first (best_documents)
RUN_BLOCK = 1024  # queries ranked together (`ranked_rows`): their deep runs, before fusion keeps k, are held at once


@dataclass
class Hit:
    """One document in an answer, by its best passage."""

    id: str  # the passage
    doc_id: str
    score: float
    text: str
    title: str
    start: int
    end: int

    def to_dict(self) -> dict:
        """The answer's shape: what `bertkit search --json` prints per hit (and a /search route would)."""
        return {"id": self.id, "doc_id": self.doc_id, "score": self.score, "text": self.text}


def check_k(k) -> None:
    int_at_least(k, 1, "k", says="at least {least}")


def query_encoder(info: dict, model=None, device=None, dtype=None, fast=True) -> Loaded:
    """The model that made an index (`info`: its index.json; model None: the directory it names), checked
    against it; `fast`: the fast path's settings (`bertkit.runtime.loading.load`). Where the directory it
    names is gone (an index copied to another machine, or made in another environment, whose default model
    lives elsewhere), the default model when its weights are those, else one line asking for --model."""
    made = info["model"]
    gone = model is None and not Path(made["directory"]).is_dir()
    try:
        loaded = load_encoder(None if gone else made["directory"] if model is None else model, device, dtype,
                              fast=fast)
        check_model(info, loaded)
    except BertkitError:
        if not gone:
            raise
        raise BertkitError(f"this index was made by the model in {made['directory']} (weights "
                           f"{made['fingerprint'][:12]}), which is not there now: pass --model DIR, that model's "
                           "folder where it is now (its weights are checked against the index's)") from None
    return loaded


def mixed_precision(info: dict, loaded: Loaded) -> str | None:
    """One line when `loaded` embeds queries in another precision than the index's passages were made in
    (`info`: its index.json), else None. Nothing is wrong with it, but the scores are neither precision's own:
    a bfloat16 index queried in float32 moved cosines by about 1e-3 and reordered near ties in the top 10
    (docs/search.md), which a user comparing answers across machines should know; evaluate retrieval --index
    prints both precisions, and search and serve said neither."""
    made = info["model"].get("precision")
    if made is None or made == loaded.precision:
        return None
    fix = f" (--dtype {made} embeds them as the passages were)" if made in ("float32", "bfloat16") else ""
    return f"queries are embedded in {loaded.precision}, the index's passages were in {made}{fix}"


def warn_mixed_precision(info: dict, loaded: Loaded) -> None:
    """`mixed_precision`'s line as a warning (the CLI prints it as `bertkit: warning: ...`): for every search
    that embeds its queries, over an index folder or the Qdrant collection exported from one."""
    mixed = mixed_precision(info, loaded)
    if mixed:
        warnings.warn(mixed, stacklevel=3)


def check_queries(queries: list) -> None:
    """Refuse no queries, or one that is no text or only spaces, in every mode: a lexical search answered
    `search INDEX "  " --mode lexical` with nothing (exit 0) where a dense one refused it."""
    if not queries or any(not isinstance(q, str) or not q.strip() for q in queries):
        raise BertkitError("every query needs some text")


def _say_cut(tok, queries: list[str], length: int | None) -> None:
    """Warn that queries longer than the index's max length are cut there, as its passages were: a pasted
    paragraph was searched by its first tokens alone, without a word. (Tokenised one piece past the cut.)"""
    if not length or not hasattr(tok, "ids_lists"):  # a static table's index: no cut
        return
    cut = sum(len(ids) > length - 2 for ids in tok.ids_lists(list(queries), length - 1))  # [CLS], [SEP]
    say_cut([("queries", cut, len(queries))], length, "as the index's passages were (BM25, in hybrid and "
            "lexical search, reads them whole)", stacklevel=3)


def embed_queries(info: dict, loaded: Loaded, queries: list[str], batch_size: int = 32, names=None) -> np.ndarray:
    """Unit query vectors [Q, D], made as the index's passages were (`info`: its index.json); names(i) names
    query i in an error about it (a query without tokens: its file and line, its id; default "queries[i]")."""
    check_queries(queries)
    made = info["model"]
    _say_cut(loaded.tokenizer, queries, made["max_length"])
    settings = EncodingSettings(made["directory"], made["pooling"], made["max_length"], loaded.precision)
    return encode(list(queries), loaded, settings, batch_size=batch_size, names=names or (lambda i: f"queries[{i}]"))


def best_documents(index: Index, query_vectors: np.ndarray, k: int = 10, *, block_size: int = DEFAULT_BLOCK,
                   query_block: int = QUERY_BLOCK, ann: bool = False,
                   ef_search: int | None = None) -> tuple[list[list[int]], list[list[float]]]:
    """Per query, the rows of the best passages of the k best documents and their scores, best first.

    ann: walk the index's HNSW graph (`bertkit.retrieval.ann`, keeping `ef_search` candidates;
    default: as the index was built) instead of the exact scan. The exact scan looks SHALLOW x k passages
    deep first, and the full k x max_passages_per_document only for the queries whose first ones hold fewer
    than k documents: a ranking's first m passages are the first m of any deeper one (ties go to the lower
    row), so its first k documents are the same (a hybrid search asks for 100 documents: 300 passages
    instead of 1,500 on SciFact)."""
    check_k(k)
    full = min(len(index), k * int(index.info["max_passages_per_document"]))
    exact = not ann and index.codes is None
    depth = min(full, SHALLOW * k) if exact else full
    out_rows, out_scores = _first_documents(index.document, *_passages(
        index, query_vectors, depth, block_size, query_block, ann, ef_search), k)
    deeper = [i for i, found in enumerate(out_rows) if len(found) < k] if depth < full else []
    if deeper:
        again = _first_documents(index.document, *_passages(
            index, query_vectors[deeper], full, block_size, query_block, ann, ef_search), k)
        for i, r, s in zip(deeper, *again):
            out_rows[i], out_scores[i] = r, s
    return out_rows, out_scores


def _first_documents(document: np.ndarray, scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[list, list]:
    """Per query's best-first passages (scores, rows; -1: the graph found fewer), its first k documents'."""
    out_rows, out_scores = [], []
    for q_scores, q_rows in zip(scores, rows):
        found = q_rows >= 0
        q_rows, q_scores = q_rows[found], q_scores[found]
        first = first_of_each(q_rows, document, k)
        out_rows.append(q_rows[first].tolist())
        out_scores.append(q_scores[first].tolist())
    return out_rows, out_scores


def _passages(index: Index, query_vectors: np.ndarray, depth: int, block_size: int, query_block: int, ann: bool,
              ef_search: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The `depth` best passages of each query (scores, rows), best first: by the HNSW graph, the compact
    codes rescored, or the exact scan."""
    if ann:
        graph = index.graph()  # read once, from the file opened with the index
        ef = ef_search if ef_search is not None else index.info.get("ann", {}).get("ef_search", 128)
        return ann_top_k(graph, query_vectors, depth, ef)
    if index.codes is not None:  # --vectors int8|binary: candidates by the codes, rescored on the float rows
        # when the index kept them (--keep-float), its int8 rows (--rescore-with int8), else the decoded codes
        return compact_top_k(query_vectors, index.codes, index.info["vectors"]["kind"], depth,
                             ranges=index.ranges, oversampling=int(index.info["vectors"]["oversampling"]),
                             block_size=block_size,
                             rescore_rows=index.vectors if index.vectors is not None else index.rescore)
    return top_k(query_vectors, index.vectors, depth, block_size=block_size, query_block=query_block,
                 normalized=True)


def _hits(index: Index, rows: list[int], scores: list[float]) -> list[Hit]:
    return [Hit(p["id"], p["doc_id"], s, p["text"], p["title"], p["start"], p["end"])
            for p, s in zip(index.passages(rows), scores)]


def fusion_options(info: dict, given: dict | None = None) -> FusionOptions:
    """The settings a search of this index runs with: the defaults, under the index's own (index.json's
    "fusion", written by `bertkit evaluate retrieval --tune`), under `given`; the mode resolved (hybrid
    when the index has a lexical part, else dense) and checked against what the index holds. A setting given
    that this search would not use (--alpha for a dense search, --rrf-k beside dbsf) is refused."""
    given = {name: v for name, v in (given or {}).items() if v is not None}
    values = {**dataclasses.asdict(FusionOptions()), **_tuned(info)}
    values.update(given)
    options = FusionOptions(**{f.name: values[f.name] for f in dataclasses.fields(FusionOptions)})
    options.validate()
    if options.mode is None:
        options = dataclasses.replace(options, mode="hybrid" if info.get("lexical") else "dense")
    elif options.mode != "dense" and not info.get("lexical"):
        options_of(info)  # the one-line refusal: the index has no lexical part
    refuse_unneeded(FUSION_NEEDS, given, {"mode": options.mode, "fusion": options.fusion})
    return options


def search_options(index: Index, given: dict | None = None, dense_hint: bool = True,
                   ann: bool = False) -> FusionOptions:
    """`fusion_options` of an open index, what the search reads read now: its lexical part when the mode needs it
    (hybrid, lexical), its HNSW graph when it walks one (`ann`). A missing bm25s, PyStemmer or FAISS (a base install
    searching an index built where the search extra is, hybrid by default), or a missing graph, is one line before
    a query encoder or reranker loads, not after the queries were embedded (a server started and answered every
    /search with an internal error; a reranker trained for hours first).
    dense_hint: the line offers --mode dense (a server, hybrid by default, has no such way round)."""
    options = fusion_options(index.info, given)
    if options.mode != "dense":  # the stemmer too: bm25s alone reads the part, a query's words are stemmed later
        require_packages(options_of(index.info), f"search {index.directory} with --mode dense" if dense_hint else None)
        index.lexical()
    if ann and options.mode != "lexical":  # (a lexical search with ann is refused by its caller)
        index.graph()
    return options


def _tuned(info: dict) -> dict:
    """index.json's "fusion" (what `evaluate retrieval --tune` wrote), checked as such: a hand-edited value was
    refused as if the command line had given it ("unknown fusion 'rrff'"), index.json unnamed."""
    tuned = info.get("fusion") or {}
    try:
        if not isinstance(tuned, dict):
            raise BertkitError(f"it is {tuned!r}, not an object")
        FusionOptions(**{f.name: tuned.get(f.name, getattr(FusionOptions(), f.name))
                         for f in dataclasses.fields(FusionOptions)}).validate()
    except BertkitError as err:
        raise BertkitError(f"index.json's \"fusion\" (written by bertkit evaluate retrieval --tune): {err}; tune it "
                           "again (--tune SPLIT) or delete \"fusion\" from index.json") from None
    return tuned


def search(index: Index, queries: list[str], k: int = 10, *, model=None, device=None, dtype=None,
           batch_size: int = 32, block_size: int = DEFAULT_BLOCK, ann: bool = False,
           ef_search: int | None = None, fusion: FusionOptions | dict | None = None, fast=True,
           names=None) -> list[list[Hit]]:
    """For each query, the k best documents of `index` (`open_index(folder)`, or the folder) with their best
    passages, best first. queries: a str or an iterable of them (a list, a generator, a numpy column).

    model: the query encoder (None: the one that made the index; another is refused).
    ann: search the HNSW graph built with the index instead of every vector (see `best_documents`).
    fusion: the mode (hybrid, dense, lexical) and how hybrid fuses (`FusionOptions`, or a dict of the
    settings given: the rest as `fusion_options` says). fast: the query encoder's fast-path settings.
    names: names(i) names query i in an error about it (`embed_queries`).
    """
    check_k(k)
    if isinstance(index, (str, Path)):  # the index's folder, as `bertkit search INDEX` takes it
        index = open_index(index)
    if not isinstance(index, Index):
        raise BertkitError(f"index must be an index folder or open_index(folder), got {type(index).__name__}")
    # read once: the vectors and BM25 both need them (a generator read twice gave hybrid an empty lexical run)
    queries = [queries] if isinstance(queries, str) else _listed(queries)
    check_queries(queries)
    options = fusion if isinstance(fusion, FusionOptions) else search_options(index, fusion, ann=ann)
    if ann and options.mode == "lexical":  # it was ignored: BM25 alone ranks a lexical search
        raise BertkitError("ann=True walks the HNSW graph of the dense vectors, and a lexical search ranks by BM25 "
                           "alone: leave ann out, or search with mode dense or hybrid")
    vectors = None
    if options.mode != "lexical":
        loaded = query_encoder(index.info, model, device, dtype, fast)
        warn_mixed_precision(index.info, loaded)
        vectors = embed_queries(index.info, loaded, queries, batch_size, names)
    return search_vectors(index, vectors, k, block_size=block_size, ann=ann, ef_search=ef_search,
                          queries=queries, fusion=options)


def _listed(queries) -> list:
    """`queries` (a list, a generator, a numpy or pandas column) as a list, or one line saying what they must be."""
    try:
        return list(queries)
    except TypeError:
        raise BertkitError(f"queries must be a str or a list of str, got {type(queries).__name__}") from None


def search_vectors(index: Index, query_vectors: np.ndarray | None, k: int = 10, *, block_size: int = DEFAULT_BLOCK,
                   ann: bool = False, ef_search: int | None = None, queries: list[str] | None = None,
                   fusion: FusionOptions | None = None) -> list[list[Hit]]:
    """`search` for queries already embedded (unit vectors [Q, D], as `embed_queries` makes them):
    what a server calls once its own batching has embedded the queries. Lexical and hybrid need the
    query texts too (`queries`); fusion None: dense (the vectors alone)."""
    return [_hits(index, [r for r, _ in run], [s for _, s in run]) for run in ranked_rows(
        index, query_vectors, k, block_size=block_size, ann=ann, ef_search=ef_search, queries=queries, fusion=fusion)]


def ranked_rows(index: Index, query_vectors: np.ndarray | None, k: int = 10, *, block_size: int = DEFAULT_BLOCK,
                ann: bool = False, ef_search: int | None = None, queries: list[str] | None = None,
                fusion: FusionOptions | None = None) -> list[list[tuple[int, float]]]:
    """`search_vectors`'s answers before their passages are read: per query, best-first (row of a document's
    best passage, score). What scoring a run needs (`index.document` names the documents); reading each hit's
    line of passages.jsonl for an evaluation of thousands of queries took half its time."""
    options = fusion or FusionOptions(mode="dense")
    answers = []
    for b in range(0, len(query_vectors if query_vectors is not None else queries), RUN_BLOCK):
        answers += _fused(index, None if query_vectors is None else query_vectors[b : b + RUN_BLOCK],
                          None if queries is None else queries[b : b + RUN_BLOCK], k, options,
                          block_size=block_size, ann=ann, ef_search=ef_search)
    return answers


def _fused(index: Index, query_vectors, queries, k: int, options: FusionOptions, **scan) -> list:
    """`ranked_rows` of one block of queries: hybrid fuses each query's `options.depth` best documents of
    each run, held for the block only (every query's at once was ~25 KB a query, to keep k of them)."""
    dense, lexical = ranked_runs(index, query_vectors, queries, max(k, options.depth) if options.mode == "hybrid"
                                 else k, options.mode, **scan)
    if options.mode != "hybrid":
        return dense or lexical
    answers = []
    for dense_run, lexical_run in zip(dense, lexical):
        dense_docs, lexical_docs = by_document(index, dense_run), by_document(index, lexical_run)
        row_of = {d: r for (d, _), (r, _) in zip(lexical_docs + dense_docs, lexical_run + dense_run)}  # dense's first
        fused = fuse([dense_docs, lexical_docs], hybrid_weights(options.alpha), options.fusion, options.rrf_k)[:k]
        answers.append([(row_of[d], s) for d, s in fused])
    return answers


def by_document(index: Index, run: list) -> list:
    """(document number, score) for a run of (passage row, score): one gather from the document column."""
    documents = index.document[np.array([r for r, _ in run], dtype=np.int64)].tolist()
    return [(d, s) for d, (_, s) in zip(documents, run)]


def ranked_runs(index: Index, query_vectors: np.ndarray | None, queries: list[str] | None, k: int, mode: str, *,
                block_size: int = DEFAULT_BLOCK, ann: bool = False, ef_search: int | None = None):
    """(dense, lexical): per query, a best-first list of (row of a document's best passage, score) for its
    k best documents, from the vectors and from BM25; None for a run the mode does not need."""
    dense = lexical = None
    if mode != "lexical":
        if query_vectors is None:
            raise BertkitError(f"--mode {mode} needs the query vectors")
        rows, scores = best_documents(index, query_vectors, k, block_size=block_size, ann=ann, ef_search=ef_search)
        dense = [list(zip(r, s)) for r, s in zip(rows, scores)]
    if mode != "dense":
        if queries is None:
            raise BertkitError(f"--mode {mode} needs the query texts")
        rows, scores = lexical_documents(index.lexical(), index.info, index.document, queries, k)
        lexical = [list(zip(r, s)) for r, s in zip(rows, scores)]
    return dense, lexical
