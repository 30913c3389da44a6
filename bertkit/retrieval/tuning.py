"""Choosing how hybrid search fuses its two runs, on a split with relevance judgements.

`tune` scores every setting of a grid (each fusion, alpha from 0 to 1 in steps
of 0.1, RRF's k over `RRF_KS`) by nDCG@10 on the split's queries, from the dense
and lexical runs computed once, fused as a search fuses them
(`bertkit.retrieval.fusion`) and scored in the order served.

The pick is not the best cell. A grid of 110 settings tuned on a few hundred
queries has a best cell that is partly noise: its neighbours tell whether it
sits on a plateau or on a spike. Each setting is scored by the mean nDCG@10 of
itself and its alpha neighbours (alpha +- 0.1, same fusion and k): the
**smoothed** score, which a spike does not win. The pick is the best smoothed
setting. `bertkit evaluate retrieval --tune SPLIT` prints the table and, with
`--index`, writes the pick into index.json ("fusion") for search and serve.
"""

from __future__ import annotations

import dataclasses

from bertkit.errors import BertkitError
from bertkit.metrics.retrieval import evaluate_run
from bertkit.retrieval.config import FusionOptions
from bertkit.retrieval.fusion import fuse, hybrid_weights

ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
RRF_KS = (1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
MEASURE = "ndcg@10"


def grid(depth: int) -> list[FusionOptions]:
    """Every setting `tune` scores: minmax and dbsf at each alpha, rrf at each alpha and k."""
    out = [FusionOptions(mode="hybrid", fusion=f, alpha=a, depth=depth) for f in ("minmax", "dbsf") for a in ALPHAS]
    return out + [FusionOptions(mode="hybrid", fusion="rrf", alpha=a, rrf_k=k, depth=depth)
                  for k in RRF_KS for a in ALPHAS]


def fused_run(query_ids: list, dense: list, lexical: list, options: FusionOptions, k: int = 100) -> dict:
    """query id -> {doc id: place score} of the fused answers (runs: per query, best-first (doc id, score));
    a document scores k - its rank, so trec_eval ranks as served (fusion ties included)."""
    out = {}
    for q, d, l in zip(query_ids, dense, lexical):
        fused = fuse([d[: options.depth], l[: options.depth]], hybrid_weights(options.alpha), options.fusion,
                     options.rrf_k)[:k]
        out[q] = {doc: float(k - rank) for rank, (doc, _) in enumerate(fused)}
    return out


def score_grid(qrels: dict, query_ids: list, dense: list, lexical: list, depth: int) -> list[dict]:
    """[{"fusion", "alpha", "rrf_k", "ndcg@10", "smoothed"}] for every setting of the grid."""
    rows = []
    for options in grid(depth):
        run = fused_run(query_ids, dense, lexical, options)
        figure = evaluate_run(qrels, run, (MEASURE,))[MEASURE]
        rows.append({"fusion": options.fusion, "alpha": options.alpha,
                     "rrf_k": options.rrf_k if options.fusion == "rrf" else None, MEASURE: figure})
    for row in rows:
        near = [r[MEASURE] for r in rows if r["fusion"] == row["fusion"] and r["rrf_k"] == row["rrf_k"]
                and abs(r["alpha"] - row["alpha"]) < 0.15]
        row["smoothed"] = sum(near) / len(near)
    return rows


def tune(qrels: dict, query_ids: list, dense: list, lexical: list, depth: int) -> tuple[FusionOptions, list[dict]]:
    """The setting with the best smoothed nDCG@10 (see the module docstring), and the whole table."""
    if not query_ids:
        raise BertkitError("--tune needs a split with judged queries")
    rows = score_grid(qrels, query_ids, dense, lexical, depth)
    best = max(rows, key=lambda r: (r["smoothed"], r[MEASURE]))
    pick = FusionOptions(mode="hybrid", fusion=best["fusion"], alpha=best["alpha"],
                         rrf_k=best["rrf_k"] if best["rrf_k"] is not None else FusionOptions.rrf_k, depth=depth)
    return pick, rows


def record(options: FusionOptions, split: str, rows: list[dict]) -> dict:
    """What index.json's "fusion" keeps of a tuning: the settings, and where they came from."""
    best = next(r for r in rows if r["fusion"] == options.fusion and r["alpha"] == options.alpha
                and r["rrf_k"] == (options.rrf_k if options.fusion == "rrf" else None))
    return {**{k: v for k, v in dataclasses.asdict(options).items() if k != "mode"},
            "tuned_on": split, MEASURE: round(best[MEASURE], 4), "smoothed": round(best["smoothed"], 4)}
