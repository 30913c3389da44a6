"""Hybrid search's design questions, scored on one judged split: how the lexical run scores a document, BM25's
k1 and b, how the dense run scores a document, and how deep each run goes into the fusion.

    python bench/hybrid_candidates.py --index scifact.index --data data/scifact --split train --out train.json

The index's passage vectors and the split's queries (embedded by the index's model) give each passage's cosine;
a document's dense score is its best passage's (MaxP, what `bertkit search` does), its first passage's
(FirstP: the title and the opening) or the mean of the two. The lexical run is bm25s with the index's
settings (`bertkit.retrieval.lexical.tokenize`: stop words, English stems, Lucene idf) over the index's
passages, a document scored by its best passage (what an index's lexical part does), or over each whole
document (its title and text, once: Lucene's and MTEB's BM25), at several k1/b. Each candidate's two runs
(the best `depth` documents of each; `all`: every document the run scores) are fused by
`bertkit.retrieval.tuning.fused_run` (DBSF and min-max at alpha 0, 0.1, ..., 1, alpha the dense share) and
scored by `bertkit.metrics.retrieval` in the order served: the rows of docs/search.md's candidate tables.
Choose on a split you do not report (SciFact's train); check the pick on the others.
"""

import argparse
import json
import time

import numpy as np
from harness import load_line, machine_line

from bertkit.data.beir import document_text, load_beir
from bertkit.metrics.retrieval import evaluate_run
from bertkit.retrieval.config import FusionOptions, LexicalOptions
from bertkit.retrieval.index import document_ids, open_index
from bertkit.retrieval.lexical import in_sorted_order, tokenize
from bertkit.retrieval.bm25 import require_bm25s
from bertkit.retrieval.search import embed_queries, query_encoder
from bertkit.retrieval.tuning import ALPHAS, fused_run

# (name, dense document score, lexical unit, k1, b, depth); the first is what an index does today
CANDIDATES = (
    ("today: passages MaxP, k1 1.5 b 0.75, depth 100", "MaxP", "passages", 1.5, 0.75, 100),
    ("lexical over whole documents", "MaxP", "documents", 1.5, 0.75, 100),
    ("whole documents, k1 1.2 b 0.75", "MaxP", "documents", 1.2, 0.75, 100),
    ("whole documents, k1 0.9 b 0.4 (Anserini's BEIR)", "MaxP", "documents", 0.9, 0.4, 100),
    ("passages, k1 0.9 b 0.4", "MaxP", "passages", 0.9, 0.4, 100),
    ("passages, the title in front of every passage", "MaxP", "titled passages", 1.5, 0.75, 100),
    ("dense FirstP, whole documents", "FirstP", "documents", 1.5, 0.75, 100),
    ("dense (MaxP + FirstP) / 2, whole documents", "mix", "documents", 1.5, 0.75, 100),
    ("depth 1000 (passages)", "MaxP", "passages", 1.5, 0.75, 1000),
    ("depth 1000, whole documents", "MaxP", "documents", 1.5, 0.75, 1000),
    ("depth all (passages)", "MaxP", "passages", 1.5, 0.75, None),
    ("depth all, whole documents", "MaxP", "documents", 1.5, 0.75, None),
)


def first_rows(document: np.ndarray) -> np.ndarray:
    """The row of each document's first passage (an index writes a document's passages together, in order)."""
    starts = np.flatnonzero(np.r_[True, document[1:] != document[:-1]])
    if not (document[starts] == np.arange(len(starts))).all():
        raise SystemExit("this index's passages of a document are not consecutive")
    return starts


def dense_documents(index, queries: list[str], starts: np.ndarray) -> dict:
    """[Q, documents] cosines by MaxP, FirstP and their mean."""
    loaded = query_encoder(index.info, dtype="float32")
    cosines = embed_queries(index.info, loaded, queries) @ np.asarray(index.float_rows("this bench")).T
    maxp, firstp = np.maximum.reduceat(cosines, starts, axis=1), cosines[:, starts]
    return {"MaxP": maxp, "FirstP": firstp, "mix": (maxp + firstp) / 2}


def bm25_matrix(texts: list[str], queries: list[str], k1: float, b: float) -> np.ndarray:
    """[Q, texts] BM25 scores, bm25s with the lexical part's tokens (`bertkit.retrieval.lexical`)."""
    options = LexicalOptions(k1=k1, b=b)
    retriever = require_bm25s().BM25(k1=k1, b=b, method="lucene")
    retriever.index(in_sorted_order(tokenize(texts, options, ids=True)), show_progress=False)
    out = np.zeros((len(queries), len(texts)), dtype=np.float32)
    for i, tokens in enumerate(tokenize(queries, options, ids=False)):
        ids = retriever.get_tokens_ids(tokens)
        if ids:
            out[i] = retriever.get_scores_from_ids(ids)
    return out


def lexical_documents(unit: str, k1: float, b: float, passages: list[dict], documents: list[str],
                      queries: list[str], starts: np.ndarray) -> np.ndarray:
    """[Q, documents] BM25: over whole documents, or over passages (optionally titled) by MaxP."""
    if unit == "documents":
        return bm25_matrix(documents, queries, k1, b)
    texts = [p["text"] if unit == "passages" or p["start"] == 0 else f"{p['title']} {p['text']}" for p in passages]
    return np.maximum.reduceat(bm25_matrix(texts, queries, k1, b), starts, axis=1)


def runs(scores: np.ndarray, depth: int | None, doc_ids: list[str], positive: bool) -> list:
    """Per query, best-first (doc id, score) of its `depth` best documents (lexical: those scoring > 0)."""
    out = []
    for row in scores:
        top = np.argsort(-row, kind="stable")[: depth or len(row)]
        out.append([(doc_ids[d], float(row[d])) for d in top if not positive or row[d] > 0])
    return out


def candidate_rows(data, query_ids, dense, lexical, depth, alphas) -> dict:
    """{fusion: [nDCG@10 per alpha]} and each run alone."""
    figures = {"dense": ndcg(data, query_ids, dense), "lexical": ndcg(data, query_ids, lexical)}
    deep = depth or max(len(r) for r in dense + lexical)
    for fusion in ("dbsf", "minmax"):
        figures[fusion] = [evaluate_run(data.qrels, fused_run(query_ids, dense, lexical, FusionOptions(
            mode="hybrid", fusion=fusion, alpha=a, depth=deep)), ("ndcg@10",))["ndcg@10"] for a in alphas]
    return figures


def ndcg(data, query_ids, run) -> float:
    return evaluate_run(data.qrels, {q: {d: float(len(r) - i) for i, (d, _) in enumerate(r)}
                                     for q, r in zip(query_ids, run)}, ("ndcg@10",))["ndcg@10"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--only", type=int, nargs="*", help="candidate numbers (default: all)")
    parser.add_argument("--out")
    args = parser.parse_args()
    print(f"Machine: {machine_line()}; {load_line()}; queries embedded in float32", flush=True)
    started = time.time()
    data, index = load_beir(args.data, args.split), open_index(args.index)
    query_ids = list(data.queries)
    queries = [data.queries[q] for q in query_ids]
    doc_ids = document_ids(index)
    starts = first_rows(np.asarray(index.document))
    passages = index.passages(range(len(index)))
    documents = [document_text(data.corpus[d]) for d in doc_ids]
    dense = dense_documents(index, queries, starts)
    lexical, results = {}, []
    for number, (name, dense_by, unit, k1, b, depth) in enumerate(CANDIDATES):
        if args.only and number not in args.only:
            continue
        if (unit, k1, b) not in lexical:
            lexical[unit, k1, b] = lexical_documents(unit, k1, b, passages, documents, queries, starts)
        figures = candidate_rows(data, query_ids, runs(dense[dense_by], depth, doc_ids, False),
                                 runs(lexical[unit, k1, b], depth, doc_ids, True), depth, ALPHAS)
        results.append({"candidate": name, "dense": dense_by, "lexical": unit, "k1": k1, "b": b,
                        "depth": depth or "all", **figures})
        for fusion in ("dbsf", "minmax"):
            print(f"| {name} | {fusion} | {figures['lexical']:.4f} | "
                  + " | ".join(f"{x:.4f}" for x in figures[fusion][1:-1]) + f" | {figures['dense']:.4f} |", flush=True)
    summary = {"split": args.split, "queries": len(query_ids), "alphas": ALPHAS, "candidates": results,
               "seconds": round(time.time() - started, 1)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"{args.split}: {len(query_ids)} queries, {summary['seconds']} s")


if __name__ == "__main__":
    main()
