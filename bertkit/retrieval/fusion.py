"""Fusing ranked runs: one ranking from a dense and a lexical one (hybrid search).

A run is one query's best-first list of `(key, score)` (a key: a document);
`fuse` turns several runs and their weights (hybrid: alpha for the dense run,
1 - alpha for the lexical one) into one best-first list of `(key, fused
score)`. A key missing from a run gets nothing from it. Three ways:

- "rrf", reciprocal rank fusion (Cormack, Clarke & Buettcher, SIGIR 2009):
  sum over runs of  w / (k + rank),  rank 1 for a run's first. Only ranks count,
  so the runs' scales do not matter. Elasticsearch's weighted RRF retriever
  computes this. Qdrant's RRF (qdrant-client `hybrid/fusion.py`) computes
  1 / (k' + rank - 1) with its k' = 2 by default, the same ranking as ours with
  k = k' - 1; its weights divide the rank instead, so they rank as ours only
  with equal weights (`bertkit.retrieval.qdrant` passes k + 1 and no weights).
- "dbsf", distribution-based score fusion (Qdrant's DBSF): a run's scores are
  scaled by (s - (mean - 3 std)) / (6 std), std the sample standard deviation
  (n - 1), not clipped; a run of one item, or of equal scores, gives 0.5; then
  the weighted sum. Qdrant's is the unweighted sum, which ranks as alpha = 0.5
  (and scores twice as much: `bertkit.retrieval.qdrant` reports it x 0.5).
- "minmax": a run's scores scaled to (s - min) / (max - min), then the weighted
  sum (the "convex combination" of Bruch, Gai & Ingber, TOIS 2023); a run of one
  item, or of equal scores, gives 1.0 (each is its run's best).

Ties are broken by first appearance: the first run's order, then the next's
keys that it lacks (Python's sort is stable; Qdrant's fusion breaks ties the
same way, by the order the prefetches answered).
"""

from __future__ import annotations

import math

from bertkit.errors import BertkitError
from bertkit.retrieval.config import FUSIONS

Run = list  # [(key, score), ...] best first


def rrf_scores(run: Run, k: float) -> list[float]:
    """1 / (k + rank) of each item, rank 1 first."""
    return [1.0 / (k + rank) for rank in range(1, len(run) + 1)]


def dbsf_scores(run: Run) -> list[float]:
    """Each score scaled by mean -+ 3 sample standard deviations to 0..1 (Qdrant's DBSF)."""
    scores = [s for _, s in run]
    if len(scores) == 1:
        return [0.5]
    mean = sum(scores) / len(scores)
    variance = sum((s - mean) ** 2 for s in scores) / (len(scores) - 1)
    if variance == 0:
        return [0.5] * len(scores)
    low, width = mean - 3 * math.sqrt(variance), 6 * math.sqrt(variance)
    return [(s - low) / width for s in scores]


def minmax_scores(run: Run) -> list[float]:
    """Each score scaled to 0..1 between the run's lowest and highest."""
    scores = [s for _, s in run]
    low, high = min(scores, default=0.0), max(scores, default=0.0)
    if high == low:
        return [1.0] * len(scores)
    return [(s - low) / (high - low) for s in scores]


def fuse(runs: list[Run], weights: list[float], method: str, rrf_k: float = 60.0) -> Run:
    """One best-first list of (key, fused score) from `runs`, each weighted (see the module docstring)."""
    if method not in FUSIONS:
        raise BertkitError(f"unknown fusion {method!r}: choose one of {', '.join(FUSIONS)}")
    if len(weights) != len(runs):
        raise BertkitError(f"{len(runs)} runs need {len(runs)} weights, got {len(weights)}")
    fused: dict = {}
    for run, weight in zip(runs, weights):
        if not run:
            continue
        scaled = (rrf_scores(run, rrf_k) if method == "rrf" else dbsf_scores(run) if method == "dbsf"
                  else minmax_scores(run))
        for (key, _), value in zip(run, scaled):
            fused[key] = fused.get(key, 0.0) + weight * value
    return sorted(fused.items(), key=lambda item: item[1], reverse=True)


def hybrid_weights(alpha: float) -> list[float]:
    """[dense, lexical] weights for a dense share alpha."""
    return [alpha, 1.0 - alpha]
