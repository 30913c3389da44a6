"""IR metrics: equal to pytrec_eval (trec_eval) to 1e-9, and small cases checked by hand."""

import math
import random

import pytest

from bertkit.errors import BertkitError
from bertkit.metrics.retrieval import evaluate_run, ndcg_at_k, per_query, ranking

# ours -> pytrec_eval's measure name (MRR@k: recip_rank, cut below by hand)
TREC = {"ndcg@10": "ndcg_cut_10", "ndcg@3": "ndcg_cut_3", "map@100": "map_cut_100", "map@5": "map_cut_5",
        "recall@10": "recall_10", "recall@100": "recall_100", "precision@5": "P_5"}


def random_case(seed: int, n_queries: int = 60, pool: int = 220):
    """Runs with many ties (scores on a coarse grid), ids whose string order differs from numeric
    order ("d2" > "d17"), runs longer than 100, several and graded relevant documents, relevant
    documents not retrieved, and queries judging nothing relevant."""
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(pool)]
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(1, 8))
        qrels[qid] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        if q % 10 == 0:
            qrels[qid] = {d: 0 for d in judged}
        retrieved = rng.sample(docs, rng.randint(1, 150))
        grid = rng.choice([2, 5, 20, 1000])
        run[qid] = {d: rng.randint(0, grid) / grid for d in retrieved}
    return qrels, run


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_to_pytrec_eval_on_random_runs_with_ties(pytrec_eval, seed):
    qrels, run = random_case(seed)
    measures = tuple(TREC) + ("mrr@10",)
    trec = pytrec_eval.RelevanceEvaluator(
        qrels, {"ndcg_cut.3,10", "map_cut.5,100", "recall.10,100", "P.5", "recip_rank"}).evaluate(run)
    ours = per_query(qrels, run, measures)
    assert set(trec) == set(ours)
    n_ties = sum(len(r) - len(set(r.values())) for r in run.values())
    assert n_ties > 1000  # the tie rule is exercised
    for qid, values in ours.items():
        for name, trec_name in TREC.items():
            assert values[name] == pytest.approx(trec[qid][trec_name], abs=1e-9), (qid, name)
        rr = trec[qid]["recip_rank"]
        expected = rr if rr > 0 and round(1 / rr) <= 10 else 0.0
        assert values["mrr@10"] == pytest.approx(expected, abs=1e-9), qid
    means = evaluate_run(qrels, run, measures)
    for name, trec_name in TREC.items():
        assert means[name] == pytest.approx(sum(t[trec_name] for t in trec.values()) / len(trec), abs=1e-9)


def test_ties_are_broken_by_doc_id_descending():
    assert ranking({"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.9}) == ["d", "c", "b", "a"]
    assert ranking({"d2": 1.0, "d17": 1.0}) == ["d2", "d17"]  # string order, as trec_eval's strcmp


def test_hand_computed_values():
    judged = {"a": 2, "b": 1, "z": 1}  # z is relevant but never retrieved
    ranked = ["x", "a", "y", "b"]
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranked, judged, 10) == pytest.approx(dcg / idcg)
    run = {"q": {"x": 4.0, "a": 3.0, "y": 2.0, "b": 1.0}}
    got = evaluate_run({"q": judged}, run, ("mrr@10", "mrr@1", "map@10", "recall@2", "recall@10"))
    assert got == pytest.approx({"mrr@10": 0.5, "mrr@1": 0.0, "map@10": (1 / 2 + 2 / 4) / 3,
                                 "recall@2": 1 / 3, "recall@10": 2 / 3})


def test_a_judged_query_missing_from_the_run_counts_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    assert evaluate_run(qrels, {"q1": {"a": 1.0}}, ("ndcg@10",)) == {"ndcg@10": 0.5}


def test_bad_measure_names_are_refused():
    with pytest.raises(BertkitError, match="unknown measure"):
        evaluate_run({"q": {"a": 1}}, {}, ("ndcg",))
    with pytest.raises(BertkitError, match="unknown measure"):
        evaluate_run({"q": {"a": 1}}, {}, ("bleu@4",))
