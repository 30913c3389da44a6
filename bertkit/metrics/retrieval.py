"""Ranking metrics as trec_eval computes them: nDCG@k, MRR@k, MAP@k, Recall@k, P@k.

The figures IR papers, BEIR and MTEB report come from trec_eval (through
pytrec_eval, Van Gysel & de Rijke 2018). We compute the same numbers, in plain
Python, from

    qrels: query id -> {doc id: graded relevance}   (a judgment of 0 = not relevant)
    run:   query id -> {doc id: score}              (what a retriever returned)

and the tests hold them equal to pytrec_eval's to 1e-9. The conventions that
decide the last digits, all trec_eval's:

- a run is ranked by score, highest first, and equal scores by doc id in
  *descending* string order (trec_eval `form_res_rels.c`, `comp_sim_docno`);
  not the order in which the retriever listed them;
- a document is relevant when its judgment is >= 1 (`relevance_level` 1);
- nDCG@k (Jarvelin & Kekalainen 2002, `m_ndcg_cut.c`): gain = the judgment
  itself (linear, not 2^rel - 1), discount log2(rank + 1); the ideal ranking
  sorts every judged relevant document of the query, retrieved or not;
- MAP@k (`m_map_cut.c`): the precision at each relevant document ranked within
  k, summed and divided by the query's number of relevant documents (all of them,
  not min(k, R));
- Recall@k: relevant documents in the top k over all relevant; P@k: over k;
- MRR@k: 1 / rank of the first relevant document, 0 if none is in the top k
  (trec_eval's `recip_rank` with the run cut at k, as BEIR's MRR@k);
- a query with no relevant document scores 0 everywhere; the mean is taken
  over the judged queries, a judged query missing from the run counting 0
  (trec_eval -c).
"""

from __future__ import annotations

import math

from bertkit.errors import BertkitError

DEFAULT_MEASURES = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100")


def ranking(scores: dict[str, float]) -> list[str]:
    """Doc ids best first, ties by doc id descending (trec_eval's order)."""
    return [doc for doc, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def ndcg_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    dcg = sum(judged.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]) if judged.get(doc, 0) > 0)
    ideal = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def mrr_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    for i, doc in enumerate(ranked[:k]):
        if judged.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def map_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    n_relevant = sum(1 for rel in judged.values() if rel > 0)
    hits, total = 0, 0.0
    for i, doc in enumerate(ranked[:k]):
        if judged.get(doc, 0) > 0:
            hits += 1
            total += hits / (i + 1)
    return total / n_relevant if n_relevant else 0.0


def recall_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    n_relevant = sum(1 for rel in judged.values() if rel > 0)
    hits = sum(1 for doc in ranked[:k] if judged.get(doc, 0) > 0)
    return hits / n_relevant if n_relevant else 0.0


def precision_at_k(ranked: list[str], judged: dict[str, int], k: int) -> float:
    return sum(1 for doc in ranked[:k] if judged.get(doc, 0) > 0) / k


MEASURES = {"ndcg": ndcg_at_k, "mrr": mrr_at_k, "map": map_at_k, "recall": recall_at_k, "precision": precision_at_k}


def parse_measure(name: str) -> tuple:
    """"ndcg@10" -> (ndcg_at_k, 10); a BertkitError for anything else."""
    kind, _, k = name.partition("@")
    if kind not in MEASURES or not k.isdigit() or int(k) < 1:
        raise BertkitError(f"unknown measure {name!r}: use one of {', '.join(MEASURES)} with a cut-off, e.g. ndcg@10")
    return MEASURES[kind], int(k)


def per_query(qrels: dict, run: dict, measures=DEFAULT_MEASURES) -> dict[str, dict[str, float]]:
    """query id -> {measure: value} for every judged query (a query absent from the run scores 0)."""
    parsed = {name: parse_measure(name) for name in measures}
    out = {}
    for query, judged in qrels.items():
        ranked = ranking(run.get(query, {}))
        out[query] = {name: fn(ranked, judged, k) for name, (fn, k) in parsed.items()}
    return out


def evaluate_run(qrels: dict, run: dict, measures=DEFAULT_MEASURES) -> dict[str, float]:
    """The mean of each measure over the judged queries (see the module docstring for the rules)."""
    if not qrels:
        raise BertkitError("no judged queries to evaluate: the qrels are empty")
    scores = per_query(qrels, run, measures)
    return {name: sum(s[name] for s in scores.values()) / len(scores) for name in measures}


def evaluate_runs(qrels: dict, runs: dict, measures=DEFAULT_MEASURES) -> dict[str, dict[str, float]]:
    """name -> `evaluate_run` of each named run against the same judgements: an evaluation hands every
    run it made (one per search mode, before and after reranking, per Matryoshka width) over at once."""
    return {name: evaluate_run(qrels, run, measures) for name, run in runs.items()}
