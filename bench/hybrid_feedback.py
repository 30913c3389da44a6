"""Query feedback and per-query fusion weights for hybrid search, scored on one judged split (issue 40, third pass).

    python bench/hybrid_feedback.py --index scifact.index --data data/scifact --split train --grid --out train.json
    python bench/hybrid_feedback.py --index SET.index --data SET --split test     # the pick and the baselines only

The first run is what an index answers today: the dense run (a document by its best passage's cosine) and the
lexical run (the index's own BM25 part, a document by its best passage), each cut at its best 100 documents and
fused by DBSF with alpha 0.5 (`bertkit.retrieval.fusion.fuse`). From its best k documents:

- dense Rocchio (Rocchio 1971; for dense retrievers Li et al., ECIR 2022): the query vector plus beta_d times the
  mean vector of those documents' best dense passages, normalised, searched again over every passage;
- lexical Rocchio over the index's own BM25 rows (Anserini's Rocchio, the feedback vectors read from the index):
  the query's term counts, L2-normalised, plus beta_l times the mean of those documents' best BM25 passages'
  rows (the best dense passage where BM25 did not find the document), each L2-normalised, cut to its
  `TERMS` heaviest terms; a passage scores the weighted sum of its BM25 weights;

and the two runs so fed back are fused again as the first were ("hybrid PRF": feedback from the fused run, the
setting of Li et al., TOIS 2023). Also per-query weights without feedback: alpha = z_d / (z_d + z_l), z a run's
best score's distance above the mean of its best 100, in sample standard deviations (a query-performance
predictor read from the run's own scores; DBSF's scaling reads the same two moments). Every figure is nDCG@10
in the order served (`bertkit.metrics.retrieval.per_query`), with the paired per-query difference to the first
run and its standard error. Choose on a split you do not report (SciFact's train); check the pick on the others.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy import sparse

from bertkit.data.beir import load_beir
from bertkit.metrics.retrieval import per_query
from bertkit.retrieval.config import DEFAULT_ALPHA, DEFAULT_DEPTH, DEFAULT_FUSION
from bertkit.retrieval.fusion import fuse, hybrid_weights
from bertkit.retrieval.index import document_ids, open_index
from bertkit.retrieval.lexical import options_of, tokenize
from bertkit.retrieval.search import embed_queries, query_encoder
from harness import load_line, machine_line
from hybrid_candidates import first_rows, runs

TERMS = 20
GRID_K, GRID_DENSE, GRID_LEXICAL = (3, 5, 10), (0.0, 0.25, 0.5, 1.0), (0.0, 0.1, 0.25, 0.5)
PICK = (3, 0.0, 0.1)  # (k, beta_d, beta_l): chosen on SciFact train (docs/search.md, "A third pass")


def dense_side(index, queries: list[str]):
    """Unit query vectors [Q, H], passage vectors [N, H] and their cosines [Q, N]."""
    vectors = embed_queries(index.info, query_encoder(index.info, dtype="float32"), queries)
    passages = np.asarray(index.float_rows("this bench"), dtype=np.float32)
    return vectors, passages, vectors @ passages.T


def lexical_side(index, queries: list[str]):
    """The lexical part as a [N, V] matrix of BM25 weights (rows: passages) and the queries' term counts [Q, V]."""
    retriever = index.lexical()
    stored = retriever.scores
    weights = sparse.csc_matrix((stored["data"], stored["indices"], stored["indptr"]),
                                shape=(stored["num_docs"], len(stored["indptr"]) - 1)).tocsr()
    counts = np.zeros((len(queries), weights.shape[1]))
    for i, tokens in enumerate(tokenize(queries, options_of(index.info), ids=False)):
        for term in retriever.get_tokens_ids(tokens):
            counts[i, term] += 1
    return weights, counts


def by_document(scores: np.ndarray, starts: np.ndarray, document: np.ndarray):
    """A document's score (its best passage's) [Q, D] and that passage's row [Q, D] (the first of equals)."""
    best = np.maximum.reduceat(scores, starts, axis=1)
    rows = np.empty(best.shape, dtype=np.int64)
    for i, row in enumerate(scores):
        hits = np.flatnonzero(row == best[i][document])
        rows[i, document[hits[::-1]]] = hits[::-1]
    return best, rows


def fused(dense: list, lexical: list, alphas) -> list:
    """Per query, the DBSF fusion of its two runs (each cut at the default depth) with its dense share."""
    return [fuse([d[:DEFAULT_DEPTH], l[:DEFAULT_DEPTH]], hybrid_weights(a), DEFAULT_FUSION)[:100]
            for d, l, a in zip(dense, lexical, alphas)]


def ndcgs(data, query_ids: list, answers: list) -> np.ndarray:
    """nDCG@10 of each query's answers, in the order served."""
    run = {q: {doc: float(len(a) - r) for r, (doc, _) in enumerate(a)} for q, a in zip(query_ids, answers)}
    figures = per_query(data.qrels, run, ("ndcg@10",))
    return np.array([figures[q]["ndcg@10"] if q in figures else 0.0 for q in query_ids])


def feedback_rows(first: list, k: int, position: dict, best_rows: np.ndarray, fallback: np.ndarray) -> list:
    """Per query, the passage rows of its first run's k best documents (best_rows; fallback where it is -1)."""
    out = []
    for i, answers in enumerate(first):
        docs = [position[doc] for doc, _ in answers[:k]]
        out.append([best_rows[i, d] if best_rows[i, d] >= 0 else fallback[i, d] for d in docs])
    return out


def dense_feedback(vectors: np.ndarray, passages: np.ndarray, rows: list, beta: float) -> np.ndarray:
    """Cosines [Q, N] of q + beta x the mean feedback passage vector, normalised (Rocchio)."""
    moved = np.stack([q + beta * passages[r].mean(0) for q, r in zip(vectors, rows)])
    return (moved / np.linalg.norm(moved, axis=1, keepdims=True)) @ passages.T


def lexical_feedback(weights, counts: np.ndarray, rows: list, beta: float) -> np.ndarray:
    """Passage scores [Q, N] of the expanded query: q / |q| + beta x the mean of the feedback rows / |row|,
    the feedback part cut to its TERMS heaviest terms."""
    expanded = np.zeros(counts.shape)
    for i, (query, feedback) in enumerate(zip(counts, rows)):
        block = weights[feedback].toarray().astype(np.float64)
        mean = (block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)).mean(0)
        if np.count_nonzero(mean) > TERMS:
            mean[np.argsort(-mean, kind="stable")[TERMS:]] = 0.0
        expanded[i] = query / max(np.linalg.norm(query), 1e-12) + beta * mean
    return np.asarray((weights @ expanded.T).T, dtype=np.float32)


def top_z(scores: list) -> float:
    """How far a run's best score stands above the mean of its best DEFAULT_DEPTH, in sample stds (0: < 3 items)."""
    s = np.asarray(scores[:DEFAULT_DEPTH], dtype=np.float64)
    return 0.0 if len(s) < 3 or s.std() == 0 else float((s[0] - s.mean()) / s.std(ddof=1))


def paired(x: np.ndarray, base: np.ndarray) -> dict:
    d = x - base
    return {"ndcg@10": round(float(x.mean()), 4), "diff": round(float(d.mean()), 4),
            "se": round(float(d.std(ddof=1) / np.sqrt(len(d))), 4),
            "better": int((d > 1e-9).sum()), "worse": int((d < -1e-9).sum())}


class Split:
    """Everything one split needs, computed once: the runs of today and what feedback reads."""

    def __init__(self, index, data):
        self.data, self.query_ids = data, list(data.queries)
        queries = [data.queries[q] for q in self.query_ids]
        self.doc_ids = document_ids(index)
        self.position = {doc: i for i, doc in enumerate(self.doc_ids)}
        document = np.asarray(index.document)
        self.starts, self.document = first_rows(document), document
        self.vectors, self.passages, cosines = dense_side(index, queries)
        self.weights, self.counts = lexical_side(index, queries)
        self.dense_scores, self.dense_rows = by_document(cosines, self.starts, document)
        lexical_scores, self.lexical_rows = by_document(self.lexical(self.counts), self.starts, document)
        self.lexical_rows[lexical_scores <= 0] = -1
        self.dense, self.lexical_run = self.runs(self.dense_scores, False), self.runs(lexical_scores, True)
        self.first = fused(self.dense, self.lexical_run, [DEFAULT_ALPHA] * len(queries))
        self.base = ndcgs(data, self.query_ids, self.first)

    def lexical(self, expanded: np.ndarray) -> np.ndarray:
        return np.asarray((self.weights @ expanded.T).T, dtype=np.float32)

    def runs(self, scores: np.ndarray, positive: bool) -> list:
        return runs(scores, DEFAULT_DEPTH, self.doc_ids, positive)

    def score(self, answers: list) -> dict:
        return paired(ndcgs(self.data, self.query_ids, answers), self.base)

    def feedback(self, k: int, beta_dense: float, beta_lexical: float) -> tuple[list, list]:
        """The dense and lexical runs after feedback from the first run's k best documents."""
        dense, lexical = self.dense, self.lexical_run
        if beta_dense:
            rows = feedback_rows(self.first, k, self.position, self.dense_rows, self.dense_rows)
            cos = dense_feedback(self.vectors, self.passages, rows, beta_dense)
            dense = self.runs(np.maximum.reduceat(cos, self.starts, axis=1), False)
        if beta_lexical:
            rows = feedback_rows(self.first, k, self.position, self.lexical_rows, self.dense_rows)
            scores = lexical_feedback(self.weights, self.counts, rows, beta_lexical)
            lexical = self.runs(np.maximum.reduceat(scores, self.starts, axis=1), True)
        return dense, lexical

    def adaptive(self) -> tuple[list, float]:
        """The first run's two runs fused with each query's own alpha = z_d / (z_d + z_l); the mean alpha."""
        alphas = []
        for d, l in zip(self.dense, self.lexical_run):
            zd, zl = top_z([s for _, s in d]), top_z([s for _, s in l])
            alphas.append(min(1.0, max(0.0, zd / (zd + zl))) if zd + zl > 0 else DEFAULT_ALPHA)
        return fused(self.dense, self.lexical_run, alphas), float(np.mean(alphas))


def measure(split: Split, grid: bool) -> dict:
    """Each design's figures (the grid, or the pick only) against the first run; a fed-back run alone too."""
    every = [DEFAULT_ALPHA] * len(split.query_ids)
    out = {"dense": split.score(split.dense), "lexical": split.score(split.lexical_run),
           "hybrid": split.score(split.first)}
    answers, mean_alpha = split.adaptive()
    out["adaptive z"] = {**split.score(answers), "mean alpha": round(mean_alpha, 3)}
    cells = [(k, bd, bl) for k in GRID_K for bd in GRID_DENSE for bl in GRID_LEXICAL if bd or bl] if grid else [PICK]
    for k, beta_dense, beta_lexical in cells:
        dense, lexical = split.feedback(k, beta_dense, beta_lexical)
        key = f"feedback k {k} beta_d {beta_dense} beta_l {beta_lexical}"
        out[key] = split.score(fused(dense, lexical, every))
        if beta_dense:
            out[key + ": dense alone"] = split.score(dense)
        if beta_lexical:
            out[key + ": lexical alone"] = split.score(lexical)
        print(key, out[key], flush=True)
    return out


def smoothed_pick(figures: dict) -> tuple:
    """The grid cell whose nDCG@10, averaged with its neighbours one grid step away in k, beta_d and beta_l
    (no feedback: the first run, at every k), is best: a plateau, not a spike (as `bertkit.retrieval.tuning`)."""
    def value(i, j, l):
        if not GRID_DENSE[j] and not GRID_LEXICAL[l]:
            return figures["hybrid"]["ndcg@10"]
        return figures[f"feedback k {GRID_K[i]} beta_d {GRID_DENSE[j]} beta_l {GRID_LEXICAL[l]}"]["ndcg@10"]
    shape, best = (len(GRID_K), len(GRID_DENSE), len(GRID_LEXICAL)), None
    for cell in np.ndindex(*shape):
        if not cell[1] and not cell[2]:
            continue
        near = [value(*n) for n in np.ndindex(*shape) if max(abs(a - b) for a, b in zip(n, cell)) <= 1]
        score = (float(np.mean(near)), value(*cell))
        if best is None or score > best[0]:
            best = (score, (GRID_K[cell[0]], GRID_DENSE[cell[1]], GRID_LEXICAL[cell[2]]))
    return best[1], round(best[0][0], 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--grid", action="store_true", help="every (k, beta_d, beta_l) of the grid, not the pick only")
    parser.add_argument("--out")
    args = parser.parse_args()
    print(f"Machine: {machine_line()}; {load_line()}; queries embedded in float32", flush=True)
    started = time.time()
    split = Split(open_index(args.index), load_beir(args.data, args.split))
    figures = measure(split, args.grid)
    summary = {"split": args.split, "queries": len(split.query_ids), "terms": TERMS, "pick": PICK,
               "figures": figures, "seconds": round(time.time() - started, 1)}
    if args.grid:
        summary["smoothed pick"] = smoothed_pick(figures)
        print("the pick (best smoothed cell; k, beta_d, beta_l), its smoothed nDCG@10:", summary["smoothed pick"])
    for name in ("dense", "lexical", "hybrid", "adaptive z"):
        print(name, figures[name])
    print(f"{args.split}: {len(split.query_ids)} queries, {summary['seconds']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
