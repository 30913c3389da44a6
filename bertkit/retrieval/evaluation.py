"""Evaluating an embedding model: retrieval on a BEIR set, and semantic similarity (STS).

Retrieval (BEIR, Thakur et al. 2021; MTEB's retrieval tasks): embed the corpus
(title and text joined) and the split's queries (`bertkit.retrieval.encoding`),
rank the corpus for each query by exact cosine (`bertkit.retrieval.exact`, top
100), and score the ranking against the qrels with trec_eval's rules
(`bertkit.metrics.retrieval`): nDCG@10, MRR@10, MAP@100, Recall@10, Recall@100.
With `bm25=True` the same split is also ranked by BM25 (`bertkit.retrieval.bm25`)
and its figures are reported under "bm25", for the same table.

Through an index (`index=`: a folder written by `bertkit index` from the same
corpus): the queries are answered as `bertkit search` and the server's /search
answer them (`bertkit.retrieval.search`: passages, a document scored by its best
passage, the HNSW graph with `ann=True`), and `rerank`, a function (query, hits)
-> hits such as `bertkit.tasks.rerank.rerank` bound to a cross-encoder (the
layer above hands it in), re-orders each answer; the figures of the same answers
before reranking come back beside, under "before_rerank". The run keeps the cosine scores;
a reranked answer mixes cross-encoder and cosine scores, so its run scores each
document by its place instead (depth - rank): trec_eval then ranks as served.

STS (SemEval STS benchmark; sentence-transformers' `EmbeddingSimilarityEvaluator`):
the cosine of each pair's two sentence vectors, correlated with the gold scores:
Spearman (the figure papers report) and Pearson; a model that gives every pair
the same cosine has no correlation: both are None (null in JSON, not NaN) and a
warning says so.

Both run in float32 unless asked otherwise, and the result records the model,
precision, max length (and split), so a figure says what it measured.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import numpy as np
from tqdm import tqdm

from bertkit.errors import BertkitError, read_score, say_cut
from bertkit.metrics.tasks import pearson, spearman
from bertkit.data.beir import document_text, load_beir
from bertkit.retrieval.bm25 import B, K1, STOPWORDS, bm25_run, require_bm25s, stem_function
from bertkit.retrieval.encoding import encode, encoder_and_settings, has_tokens
from bertkit.retrieval.exact import top_k
from bertkit.retrieval.config import FUSION_FLAGS, FusionOptions, LexicalOptions, options_of
from bertkit.retrieval.index import document_ids, open_index, update_info
from bertkit.metrics.retrieval import DEFAULT_MEASURES, evaluate_run, evaluate_runs
from bertkit.retrieval.search import (by_document, embed_queries, fusion_options, query_encoder, ranked_rows,
                                      ranked_runs, search_options, search_vectors)
from bertkit.retrieval.tuning import fused_run, record, tune
from bertkit.data.tables import ReadReport, read_rows

STS_COLUMNS = ("sentence1", "sentence2", "score")
RUN_DEPTH = 100  # documents retrieved per query: enough for every measure's cut-off
TOP = 10  # the cut-off of the @10 figures, and bertkit search's default k
BEFORE_RERANK = "before rerank"  # the run of the reranked mode's first stage


def dense_run(query_vectors: np.ndarray, query_ids: list, doc_vectors: np.ndarray, doc_ids: list,
              k: int = RUN_DEPTH, normalized: bool = True) -> dict[str, dict[str, float]]:
    """query id -> {doc id: cosine} of each query's `k` nearest documents (a run for `metrics`); normalized:
    the document vectors are unit vectors already (else `top_k` normalises them, as it does the queries)."""
    scores, rows = top_k(query_vectors, doc_vectors, k=k, normalized=normalized)
    return {q: {doc_ids[r]: float(s) for r, s in zip(rows[i], scores[i])} for i, q in enumerate(query_ids)}


def served_run(query_ids: list, answers: list, ranked: bool = False) -> dict[str, dict[str, float]]:
    """query id -> {doc id: score} of search answers (per query, best-first (doc id, score) pairs); ranked:
    score each document by its place (depth - rank) instead of its own score (see the module docstring)."""
    return {q: {d: float(len(found) - rank) if ranked else float(s) for rank, (d, s) in enumerate(found)}
            for q, found in zip(query_ids, answers)}


def evaluate_retrieval(model=None, directory=None, split: str = "test", *, batch_size: int = 32,
                       max_length: int | None = None, dtype: str = "float32", bm25: bool = False,
                       measures=DEFAULT_MEASURES, progress: bool = True, index=None, ann: bool = False,
                       rerank=None, rerank_top: int = 50, rerank_model: str | None = None,
                       dimensions=None, mode: str | None = None, fusion: dict | None = None,
                       tune: str | None = None, max_queries: int | None = None, dedupe: bool = False,
                       fast=True) -> dict:
    """Retrieval figures of `model` on a BEIR folder's `split` (see the module docstring).

    Returns {"ndcg@10": ..., "mrr@10", "map@100", "recall@10", "recall@100", "model", "precision",
    "max_length", "split", "dataset", "queries", "documents", "encode_seconds"} and, with bm25=True,
    "bm25": {the same measures, "k1", "b"}.
    index: an index folder of the corpus, searched as served (the model: the index's; `max_length`
    does not apply); ann: through its HNSW graph; rerank: (query, hits) -> hits re-scoring the best
    `rerank_top` (the cross-encoder `rerank_model`, for the record; the pairs it reads cut, its callers count with
    `bertkit.tasks.rerank.PairsCut` as its on_cut, and say).
    The result then also has "index" and "search_seconds".
    mode: "dense", "lexical", "hybrid" (the figures of that search; with an index, default as `bertkit
    search`: hybrid when it has a lexical part; without, dense) or "all" (each under "modes", the top
    level hybrid's); fusion: hybrid's settings given (`FusionOptions` names). Without an index, lexical
    is BM25 over whole documents (stemmed, as an index's; mode "lexical" alone loads no model: "model" is
    None) and dense the model over documents truncated.
    fast: the encoder's fast-path settings (`bertkit.runtime.loading.load`).
    max_queries: score the split's first N judged queries only (the qrels file's order), against the
    whole corpus. dedupe: keep the first line of a repeated corpus or query id (`bertkit index --dedupe`).
    tune: a split whose judged queries choose hybrid's fusion (`bertkit.retrieval.tuning`) before
    `split` is scored; with an index, the choice is written into its index.json. The table: "tuning".
    dimensions: also score the vectors cut to each of these leading dimensions and renormalised
    (Matryoshka's truncate-then-renormalise), under "dimensions": {"64": {measures}, ...}; one encoding
    serves them all.
    """
    dimensions = _check_request(directory, split, tune, index, sorted(set(dimensions or ())), mode, fusion, bm25)
    data = load_beir(directory, split, dedupe).head(max_queries)  # read and checked before the model loads
    tuning_data = load_beir(directory, tune, dedupe) if tune is not None else None
    if index is not None:
        if max_length is not None:
            raise BertkitError("--max-length does not apply with --index: queries are cut where the index's "
                               "passages were")
        result = _evaluate_index(open_index(index), data, model, batch_size, dtype, measures, progress, ann,
                                 rerank, rerank_top, rerank_model, mode, fusion, tuning_data, fast=fast)
    else:
        if rerank is not None or ann:
            raise BertkitError("reranking and --ann need --index INDEX")
        result = _evaluate_lexical(data, measures) if mode == "lexical" else _evaluate_model(
            data, model, batch_size, max_length, dtype, measures, progress, dimensions, mode, fusion, tuning_data,
            fast=fast)
    result["split"] = split
    if bm25:
        documents = {d: document_text(data.corpus[d]) for d in data.corpus}
        lexical_run = bm25_run(documents, data.queries, RUN_DEPTH, progress=progress)
        result["bm25"] = {**evaluate_run(data.qrels, lexical_run, measures), "k1": K1, "b": B,
                          "stopwords": STOPWORDS, "stemmer": None}
    return result


def _check_request(directory, split: str, tune, index, dimensions: list, mode, fusion, bm25: bool) -> list:
    """`evaluate_retrieval`'s arguments refused in one line before anything is read or loaded; the dimensions."""
    if directory is None:
        raise BertkitError("evaluate_retrieval needs a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    if tune == split and index is None:  # an index may be tuned on its one split for serving; a figure may not
        raise BertkitError(f"--tune {tune} is the split being scored: its figures would be fitted to it; tune on "
                           "another split (e.g. --tune train) and score this one")
    if dimensions and (index is not None or mode == "lexical" or min(dimensions) < 1):
        raise BertkitError("dimensions need the model's own vectors (not --index, nor --mode lexical) and must be "
                           f"positive, got {dimensions}")
    if mode is not None and mode != "all":
        FusionOptions(mode=mode).validate()  # an unknown mode, or fusion setting, said before anything loads
    fusion_options({"lexical": True}, {**(fusion or {}), "mode": "hybrid"})
    if index is None and mode != "all":  # dense by default here; with an index its mode is known once it is open
        fusion_options({"lexical": True}, {**(fusion or {}), "mode": mode or "dense"})
    if tune is not None and index is None and mode not in ("hybrid", "all"):  # the pick was printed and not scored
        raise BertkitError(f"--tune {tune} chooses hybrid's fusion, and without --index this evaluation scores "
                           f"{mode or 'dense'} only: give --mode hybrid or all (with --index INDEX the pick is "
                           "written into it for search and serve)")
    chosen = [FUSION_FLAGS[name] for name in ("fusion", "alpha", "rrf_k") if (fusion or {}).get(name) is not None]
    if tune is not None and chosen:  # the pick replaced them without an index, and they replaced the pick with one
        raise BertkitError(f"{' and '.join(chosen)} and --tune {tune} both choose hybrid's fusion (--tune picks "
                           "--fusion, --alpha and --rrf-k on that split's queries): give one or the other")
    if bm25 or mode not in (None, "dense") or tune:
        require_bm25s()  # a missing package is said before the corpus is embedded, not after
    if mode not in (None, "dense") or tune:  # ... and the stemmer of the lexical runs (--bm25's stems nothing)
        stem_function(LexicalOptions().stemmer)
    return dimensions


def index_answers(index, queries: list[str], depth: int, batch_size: int = 32, dtype: str = "float32") -> list:
    """Per query, the doc ids of its `depth` best documents in the index folder `index`, best first, searched
    as `bertkit search` does (its default mode): a first stage's candidates, for mining."""
    opened = open_index(index)
    options = search_options(opened)  # a missing bm25s said before the encoder loads
    loaded = query_encoder(opened.info, None, None, dtype)
    vectors = embed_queries(opened.info, loaded, queries, batch_size) if options.mode != "lexical" else None
    doc_ids = document_ids(opened)  # the documents alone: no passage read (`ranked_rows`)
    return [[d for d, _ in _documents(opened, doc_ids, run)]
            for run in ranked_rows(opened, vectors, depth, queries=queries, fusion=options)]


def check_same_corpus(index, data) -> None:
    """Refuse an index of another corpus than the BEIR folder's: a document the corpus has and the index lacks
    can never be found, and one the index holds beyond the corpus competes with its documents, so either way
    the figures would measure something else, silently (an index of another set scored 0 everywhere). The
    corpus's documents without any token are left out of an index (`documents_without_tokens`): so many may
    be missing. Returns the index's document ids by document number (`document_ids`)."""
    held = document_ids(index)
    extra = [d for d in held if d not in data.corpus]
    missing = len(data.corpus) - (len(held) - len(extra))
    if not extra and missing <= int(index.info.get("documents_without_tokens", 0)):
        return held
    example = extra[0] if extra else next(d for d in data.corpus if d not in set(held))
    what = (f"{len(extra)} of its {len(held)} documents are not in {data.directory}/corpus.jsonl (e.g. {example!r})"
            if extra else f"it lacks {missing} of the {len(data.corpus)} documents of {data.directory}/corpus.jsonl "
            f"(e.g. {example!r})")
    raise BertkitError(f"{index.directory} was built from {index.info.get('corpus', 'another corpus')}, not this "
                       f"corpus: {what}, so its figures would not be this set's: build the index from this folder "
                       f"(bertkit index {data.directory} -o INDEX), or evaluate with the index of this corpus")


def check_index_of(index, directory, split: str = "test") -> None:
    """Refuse, before a job that ends by evaluating through it (`finetune rerank --dev DIR --index INDEX`), an
    index folder built from another corpus than the BEIR folder `directory`'s (`check_same_corpus`), or one whose
    default search cannot run here (its lexical part without bm25s: the evaluation failed after the training)."""
    opened = open_index(index)
    check_same_corpus(opened, load_beir(directory, split))
    search_options(opened)


def _index_modes(info: dict, mode: str | None) -> list[str]:
    if mode == "all":
        options_of(info)  # refused in one line when the index has no lexical part
        return ["dense", "lexical", "hybrid"]
    return [mode or ("hybrid" if info.get("lexical") else "dense")]


def _evaluate_index(index, data, model, batch_size, dtype, measures, progress, ann, rerank, rerank_top,
                    rerank_model, mode=None, fusion=None, tuning_data=None, fast=True) -> dict:
    doc_ids = check_same_corpus(index, data)
    query_ids = list(data.queries)
    texts = [data.queries[q] for q in query_ids]
    depth = RUN_DEPTH if rerank is None else max(RUN_DEPTH, rerank_top)
    modes = _index_modes(index.info, mode)
    # fusion's settings go to the hybrid search (with --mode all, not to the dense and lexical rows beside it)
    given = {m: {**((fusion or {}) if m == "hybrid" or len(modes) == 1 else {}), "mode": m} for m in modes}
    for m in modes:  # a setting this search would not use, a missing bm25s or graph, refused before the model loads
        search_options(index, given[m], ann=ann)
    # a lexical search embeds no query: its model is not needed (nor there, for an index copied elsewhere)
    loaded = query_encoder(index.info, model, None, dtype, fast) if modes != ["lexical"] or tuning_data else None
    tuned = None
    if tuning_data is not None:
        options = search_options(index, {**(fusion or {}), "mode": "hybrid"})
        dense, lexical = index_runs(index, loaded, tuning_data.queries, options.depth, ann, batch_size,
                                    query_names(tuning_data.directory, list(tuning_data.queries)))
        tuned = tune_on(tuning_data, dense, lexical, options.depth)
        update_info(index.directory, command="bertkit evaluate retrieval --tune", opened=index,
                    fusion=record(tuned[0], tuning_data.split, tuned[1]))
        index.info["fusion"] = record(tuned[0], tuning_data.split, tuned[1])
    runs, fusions, named, started = {}, {}, query_names(data.directory, query_ids), time.perf_counter()
    for m in modes:
        options = fusion_options(index.info, given[m])
        fusions[m] = _described(options)
        vectors = embed_queries(index.info, loaded, texts, batch_size, named) if m != "lexical" else None
        asked = dict(k=_asked(m, depth, options, rerank_top if rerank else 0), ann=ann, queries=texts, fusion=options)
        if rerank is not None and m == modes[-1]:  # the cross-encoder reads the passages' texts
            answers = search_vectors(index, vectors, **asked)
            runs[BEFORE_RERANK] = served_run(query_ids, [_found(hits) for hits in answers], ranked=m == "hybrid")
            answers = [_found(rerank(q, hits)) for q, hits in tqdm(list(zip(texts, answers)), desc="rerank",
                                                                   unit="query", disable=not progress)]
        else:  # documents and scores alone: no passage read (`ranked_rows`)
            answers = [_documents(index, doc_ids, run[:RUN_DEPTH]) for run in ranked_rows(index, vectors, **asked)]
        # a fused or reranked answer is scored in the order served (its scores tie, or mix two scales)
        runs[m] = served_run(query_ids, answers, ranked=rerank is not None or m == "hybrid")
    seconds = time.perf_counter() - started
    scored = evaluate_runs(data.qrels, runs, measures)  # every run judged at once
    figures = {m: {**scored[m], "fusion": fusions[m]} for m in modes}
    made = index.info["model"]
    # the precision the queries ran in, not --dtype: "auto" resolved, and an int8 model's folder runs in int8
    result = {**figures[modes[-1]], "model": made["directory"], "precision": loaded and loaded.precision,
              "mode": modes[-1],
              "max_length": made["max_length"], "pooling": made["pooling"], "dataset": str(data.directory),
              "queries": len(query_ids), "documents": len(data.corpus),
              "index": {"directory": str(index.directory), "passages": index.info["passages"],
                        "documents": index.info["documents"], "passage_tokens": index.info["passage_tokens"],
                        "precision": made["precision"], "ann": ann, "lexical": index.info.get("lexical"),
                        "rerank": None if rerank is None else {"model": rerank_model, "top": rerank_top}},
              "search_seconds": round(seconds, 2)}
    if rerank is not None:  # the same first stage's figures before its answers were reranked
        result["before_rerank"] = {**scored[BEFORE_RERANK], "fusion": fusions[modes[-1]]}
    return _with_modes(result, figures, tuned)


def _documents(index, doc_ids: list, run: list) -> list:
    """(doc id, score) pairs of a (row, score) run: its document numbers (`by_document`) named."""
    return [(doc_ids[d], s) for d, s in by_document(index, run)]


def _found(hits: list) -> list:
    """The first RUN_DEPTH of search answers' hits as (doc id, score) pairs, what a run scores."""
    return [(h.doc_id, h.score) for h in hits[:RUN_DEPTH]]


def _asked(mode: str, depth: int, options, rerank_top: int) -> int:
    """Documents an evaluation asks of a search of `mode` (`depth`: enough for every figure). A hybrid search
    fuses each run's best max(k, fusion depth), so asked `depth` of a shallower fusion it fused `depth` deep: the
    figures of --fusion-depth 10 (or a tuned depth) were depth 100's. It asks what `bertkit search` fuses with its
    default k (TOP) or --rerank-top, and the figures past that cut-off see only so many documents."""
    return depth if mode != "hybrid" else min(depth, max(options.depth, TOP, rerank_top))


def _described(options) -> dict:
    return {"mode": options.mode, **({} if options.mode != "hybrid" else {
        "fusion": options.fusion, "alpha": options.alpha, "depth": options.depth,
        **({"rrf_k": options.rrf_k} if options.fusion == "rrf" else {})})}


def _with_modes(result: dict, figures: dict, tuned) -> dict:
    if len(figures) > 1:
        result["modes"] = figures
    if tuned is not None:
        result["tuning"] = {"split": tuned[2], "pick": _described(tuned[0]), "table": tuned[1]}
    return result


def tune_on(data, dense: list, lexical: list, depth: int):
    """(the pick, the table, the split) of `bertkit.retrieval.tuning.tune` on `data`'s judged queries, from
    their (dense, lexical) runs: per query in `data.queries`' order, best-first (doc id, score) lists."""
    pick, table = tune(data.qrels, list(data.queries), dense, lexical, depth)
    return pick, table, data.split


def query_names(directory, query_ids: list):
    """names(i): the i-th query in an error about it (one without tokens), by its id in the folder's queries."""
    return lambda i: f"{directory}/queries.jsonl _id {query_ids[i]!r}"


def index_runs(index, loaded, queries: dict, depth: int, ann: bool, batch_size: int, names=None):
    """(dense, lexical): per query, best-first (doc id, score) of its `depth` best documents in the index;
    names(i) names query i in an error about it."""
    texts = list(queries.values())
    vectors = embed_queries(index.info, loaded, texts, batch_size, names)
    dense, lexical = ranked_runs(index, vectors, texts, depth, "hybrid", ann=ann)
    doc_ids = document_ids(index)
    return ([[(doc_ids[int(index.document[r])], s) for r, s in run] for run in runs] for runs in (dense, lexical))


def _evaluate_model(data, model, batch_size, max_length, dtype, measures, progress, dimensions=(), mode=None,
                    fusion=None, tuning_data=None, fast=True) -> dict:
    loaded, settings = encoder_and_settings(model, max_length, dtype, fast)
    width = loaded.model.config.hidden_size
    if dimensions and dimensions[-1] > width:  # said before the corpus is embedded
        raise BertkitError(f"dimension {dimensions[-1]} is more than the model's {width}")
    texts = {d: document_text(data.corpus[d]) for d in data.corpus}
    # a document without any token (no title or text, or only characters BERT drops) has nothing to embed: it is
    # left out of the ranking (never found) and counted, as `bertkit index` leaves it out of an index, so the
    # figures with and without --index rank the same documents (refusing it stopped a whole BEIR set for one line)
    doc_ids = [d for d in data.corpus if has_tokens(texts[d], loaded.tokenizer)]
    query_ids = list(data.queries)
    started, cut = time.perf_counter(), {}  # documents, queries -> how many the model read cut at max_length
    doc_vectors = encode([texts[d] for d in doc_ids], loaded, settings, batch_size=batch_size, progress=progress,
                         names=lambda i: f"{data.directory}/corpus.jsonl _id {doc_ids[i]!r}",
                         on_cut=lambda n, _: cut.setdefault("documents", n))
    query_vectors = encode([data.queries[q] for q in query_ids], loaded, settings, batch_size=batch_size,
                           names=query_names(data.directory, query_ids), on_cut=lambda n, _: cut.setdefault("queries", n))
    seconds = time.perf_counter() - started
    say_cut([("documents", cut["documents"], len(doc_ids)), ("queries", cut["queries"], len(query_ids))],
            settings.max_length, RETRIEVAL_CUT)
    options = fusion_options({"lexical": True}, {**(fusion or {}), "mode": "hybrid"})

    def runs_of(queries: dict):  # (dense, lexical): per query, best-first (doc id, score)
        vectors = query_vectors if queries is data.queries else encode(list(queries.values()), loaded, settings,
                                                                       batch_size=batch_size)
        dense = dense_run(vectors, list(queries), doc_vectors, doc_ids, k=max(RUN_DEPTH, options.depth))
        lexical = bm25_run(texts, queries, max(RUN_DEPTH, options.depth), stemmer=LexicalOptions().stemmer)
        return ([sorted(run[q].items(), key=lambda item: -item[1]) for q in queries] for run in (dense, lexical))

    tuned = None
    if tuning_data is not None:
        dense, lexical = runs_of(tuning_data.queries)
        tuned = tune_on(tuning_data, dense, lexical, options.depth)
    options = tuned[0] if tuned is not None else options
    modes = ["dense", "lexical", "hybrid"] if mode == "all" else [mode or "dense"]
    if modes != ["dense"]:
        dense, lexical = runs_of(data.queries)
        made = {"dense": dict(zip(query_ids, map(dict, dense))), "lexical": dict(zip(query_ids, map(dict, lexical))),
                "hybrid": fused_run(query_ids, dense, lexical, options, RUN_DEPTH)}
        runs = {m: made[m] for m in modes}
    else:
        runs = {"dense": dense_run(query_vectors, query_ids, doc_vectors, doc_ids)}
    fusions = {} if modes == ["dense"] else {m: _described(dataclasses.replace(options, mode=m)) for m in modes}
    for d in dimensions:  # Matryoshka's truncate-then-renormalise (top_k renormalises the cut vectors)
        runs[f"{d} dimensions"] = dense_run(query_vectors[:, :d], query_ids, doc_vectors[:, :d], doc_ids,
                                            normalized=False)
    scored = evaluate_runs(data.qrels, runs, measures)  # every run judged at once
    figures = {m: {**scored[m], "fusion": fusions[m]} for m in fusions}
    result = {**scored[modes[-1]], **({"fusion": fusions[modes[-1]]} if fusions else {}), "model": settings.model,
              "precision": settings.dtype, "mode": modes[-1], "max_length": settings.max_length,
              "pooling": settings.pooling, "dataset": str(data.directory), "queries": len(query_ids),
              "documents": len(data.corpus), "documents_without_tokens": len(data.corpus) - len(doc_ids),
              "documents_cut": cut["documents"], "queries_cut": cut["queries"], "encode_seconds": round(seconds, 2)}
    if dimensions:
        result["dimensions"] = {str(d): scored[f"{d} dimensions"] for d in dimensions}
    return _with_modes(result, figures, tuned)


RETRIEVAL_CUT = ("as MTEB does (BM25, in lexical and hybrid mode, reads them whole; bertkit index reads a document "
                 "whole, in passages: evaluate with --index)")


def _evaluate_lexical(data, measures) -> dict:
    """BM25 alone over whole documents, stemmed as an index's lexical part (the lexical row of --mode all). No
    model is loaded: it loaded one and embedded the whole corpus and every query for a figure that used none
    (minutes for SciFact with the default model on 2 cores)."""
    texts = {d: document_text(data.corpus[d]) for d in data.corpus}
    started = time.perf_counter()
    run = bm25_run(texts, data.queries, RUN_DEPTH, stemmer=LexicalOptions().stemmer)
    return {**evaluate_run(data.qrels, run, measures), "fusion": {"mode": "lexical"}, "model": None,
            "precision": None, "mode": "lexical", "max_length": None, "pooling": None, "dataset": str(data.directory),
            "queries": len(data.queries), "documents": len(data.corpus),
            "search_seconds": round(time.perf_counter() - started, 2)}


def read_sts(path, lines: list | None = None) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, score) rows of a TSV, CSV or JSONL file with those columns, read as the
    trainer reads its scored pairs (`bertkit.data.tables.read_rows`); a row with the wrong number of cells,
    which that reader skips, is refused here: a figure must not leave pairs out unsaid. `lines`: a list
    given gets each row's line number."""
    report, rows = ReadReport(str(path)), []
    for number, row in read_rows(path, report):
        missing = [c for c in STS_COLUMNS if c not in row]
        if missing:
            raise BertkitError(f"{path} has no {', '.join(missing)} column (header: {' '.join(row)}): "
                               f"the header must name {', '.join(STS_COLUMNS)}")
        first, second = (row[c] if isinstance(row[c], str) else "" if row[c] is None else str(row[c])
                         for c in STS_COLUMNS[:2])
        if not first.strip() or not second.strip():  # named here: the embedder knows no line numbers
            raise BertkitError(f"{path} line {number}: {'sentence1' if not first.strip() else 'sentence2'} is "
                               "empty: every pair needs two texts")
        rows.append((first, second, read_score(row["score"], f"{path} line {number}")))  # nan: a nan correlation
        if lines is not None:
            lines.append(number)
    skipped = [f"{n} {why}" for why, n in report.skipped.items() if why != "empty lines"]
    if skipped:
        raise BertkitError(f"{path}: {', '.join(skipped)}: every row needs its {len(STS_COLUMNS)} cells")
    if len(rows) < 2:
        raise BertkitError(f"{path} has {len(rows)} scored pair(s): a correlation needs at least 2")
    return rows


def evaluate_sts(model=None, pairs_or_path=None, *, batch_size: int = 32, max_length: int | None = None,
                 dtype: str = "float32", progress: bool = False, fast=True) -> dict:
    """Spearman and Pearson correlation of cosine similarity with the gold scores (`fast`: the encoder's
    fast-path settings).

    pairs_or_path: a TSV/CSV/JSONL path (columns sentence1, sentence2, score) or a list (any
    iterable: zip(first, second, scores)) of (sentence1, sentence2, score). Returns {"spearman", "pearson", "pairs", "model",
    "precision", "max_length", "pooling", "sentences_cut", "data"} (data: the file, None for a list; sentences_cut:
    how many distinct sentences were read cut at max_length, also said in a warning; the correlations are None,
    with a warning, when every pair gets the same cosine).
    """
    if pairs_or_path is None:
        raise BertkitError("evaluate_sts needs scored pairs: a TSV path or a list of (sentence1, sentence2, score)")
    given = not isinstance(pairs_or_path, (str, os.PathLike))  # pairs, not a file
    lines = []
    pairs = _scored_pairs(pairs_or_path) if given else read_sts(pairs_or_path, lines)
    if len(pairs) < 2:
        raise BertkitError(f"{len(pairs)} scored pair(s): a correlation needs at least 2")
    gold = [read_score(score, f"pair {i}") for i, (_, _, score) in enumerate(pairs)]
    if len(set(gold)) < 2:  # else nan figures, and NaN in the JSON written
        source = "" if given else f"{pairs_or_path}: "
        raise BertkitError(f"{source}every gold score is {gold[0]:g}: a correlation needs at least two different "
                           "scores")
    loaded, settings = encoder_and_settings(model, max_length, dtype, fast)
    sentences = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))  # each sentence embedded once
    row = {s: i for i, s in enumerate(sentences)}
    where = {}  # a sentence's first place, to name one without tokens (its text may be invisible)
    places = [f"pair {i}" for i in range(len(pairs))] if given else [f"{pairs_or_path} line {n}" for n in lines]
    for place, (a, b, _) in zip(places, pairs):
        where.setdefault(a, f"{place} sentence1")
        where.setdefault(b, f"{place} sentence2")
    cut = []  # the sentences read cut at max_length (iter_embed's count)
    vectors = encode(sentences, loaded, settings, batch_size=batch_size, progress=progress,
                     names=lambda i: where[sentences[i]], on_cut=lambda n, _: cut.append(n))
    say_cut([("sentences", cut[0], len(sentences))], settings.max_length, "as sentence-transformers' evaluator does")
    cosine = [float(vectors[row[a]] @ vectors[row[b]]) for a, b, _ in pairs]
    spearman_r, pearson_r = spearman(cosine, gold), pearson(cosine, gold)
    if len(set(cosine)) < 2:  # a correlation with a constant is undefined: nan, and NaN in the JSON written
        warnings.warn(f"the model gives every pair the same cosine ({cosine[0]:.4f}): spearman and pearson are "
                      "undefined and reported as null (a collapsed model, or texts it has no tokens for)",
                      stacklevel=2)
        spearman_r = pearson_r = None
    return {"spearman": spearman_r, "pearson": pearson_r, "pairs": len(pairs),
            "model": settings.model, "precision": settings.dtype, "max_length": settings.max_length,
            "pooling": settings.pooling, "sentences_cut": cut[0],
            "data": None if given else str(pairs_or_path)}


def _scored_pairs(pairs) -> list:
    """(sentence1, sentence2, score) triples from any iterable (a list, zip(first, second, scores), a generator),
    each checked for its three items and its two texts, named by its place (the scores: `read_score`)."""
    try:
        pairs = list(pairs)
    except TypeError:
        raise BertkitError("pairs_or_path must be a file or an iterable of (sentence1, sentence2, score), got "
                           f"{type(pairs).__name__}") from None
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 3:
            size = f"has {len(pair)} items" if hasattr(pair, "__len__") else f"is a {type(pair).__name__}"
            raise BertkitError(f"pair {i} {size}: each pair is (sentence1, sentence2, score)")
        for name, text in zip(STS_COLUMNS, pair[:2]):
            if not isinstance(text, str) or not text.strip():
                raise BertkitError(f"pair {i}: {name} is {'empty' if isinstance(text, str) else type(text).__name__}:"
                                   " every pair needs two texts")
    return pairs
