"""Fusing a dense and a lexical run: the arithmetic against hand-computed runs, and against Qdrant's own
fusion functions (qdrant-client's hybrid/fusion.py, the formulas Qdrant's Query API applies)."""

import importlib.util
import random

import pytest
from conftest import need

from bertkit.errors import BertkitError
from bertkit.retrieval.config import FusionOptions
from bertkit.retrieval.fusion import fuse, hybrid_weights

DENSE = [("a", 0.9), ("b", 0.8), ("c", 0.5)]
LEXICAL = [("c", 10.0), ("d", 6.0), ("a", 2.0)]


def test_rrf_by_hand():
    fused = fuse([DENSE, LEXICAL], hybrid_weights(0.5), "rrf", rrf_k=60)
    # a: 0.5/61 + 0.5/63, c: 0.5/63 + 0.5/61 (a tie: a came first, in the dense run), b: 0.5/62, d: 0.5/62
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    assert fused[0][1] == pytest.approx(0.5 / 61 + 0.5 / 63) and fused[1][1] == pytest.approx(fused[0][1])
    assert fused[2][1] == pytest.approx(0.5 / 62) and fused[3][1] == pytest.approx(0.5 / 62)
    # k = 1, alpha 0.8: a 0.8/2 + 0.2/4 = 0.45, b 0.8/3, c 0.8/4 + 0.2/2 = 0.3, d 0.2/3
    fused = dict(fuse([DENSE, LEXICAL], hybrid_weights(0.8), "rrf", rrf_k=1))
    assert fused == pytest.approx({"a": 0.45, "b": 0.8 / 3, "c": 0.3, "d": 0.2 / 3})


def test_minmax_by_hand():
    # dense scaled: a 1, b 0.75, c 0; lexical: c 1, d 0.5, a 0
    fused = fuse([DENSE, LEXICAL], hybrid_weights(0.7), "minmax")
    assert [d for d, _ in fused] == ["a", "b", "c", "d"]
    assert [s for _, s in fused] == pytest.approx([0.7, 0.525, 0.3, 0.15])
    # a run of one item, or of equal scores, scales to 1 (each is its run's best)
    assert fuse([[("x", 3.0)], [("y", 2.0), ("z", 2.0)]], [0.5, 0.5], "minmax") == [("x", 0.5), ("y", 0.5),
                                                                                  ("z", 0.5)]


def test_dbsf_by_hand():
    # dense: mean 0.7333.., sample std sqrt(0.0433..) = 0.20817; low = mean - 3 std, width 6 std
    std = (((0.9 - 2.2 / 3) ** 2 + (0.8 - 2.2 / 3) ** 2 + (0.5 - 2.2 / 3) ** 2) / 2) ** 0.5
    scaled_a = (0.9 - (2.2 / 3 - 3 * std)) / (6 * std)
    lex_std = (((10 - 6) ** 2 + 0 + (2 - 6) ** 2) / 2) ** 0.5  # mean 6, std 4
    fused = dict(fuse([DENSE, LEXICAL], [1.0, 1.0], "dbsf"))
    assert fused["a"] == pytest.approx(scaled_a + (2 - (6 - 3 * lex_std)) / (6 * lex_std))
    assert fused["d"] == pytest.approx(0.5)  # the lexical run's mean sits at the middle
    assert dict(fuse([[("x", 1.0)], []], [1.0, 1.0], "dbsf")) == {"x": 0.5}


def test_missing_runs_and_zero_weights():
    fused = fuse([[], LEXICAL], [0.5, 0.5], "rrf", 2)
    assert [d for d, _ in fused] == ["c", "d", "a"]
    assert [s for _, s in fused] == pytest.approx([0.5 / 3, 0.5 / 4, 0.5 / 5])
    dense_only = fuse([DENSE, LEXICAL], hybrid_weights(1.0), "minmax")
    assert [d for d, _ in dense_only][:3] == ["a", "b", "c"] and dict(dense_only)["d"] == 0


def _points(run, models):
    return [models.ScoredPoint(id=i, version=0, score=s) for i, s in run]


@pytest.mark.parametrize("seed", range(5))
def test_equal_weights_rank_as_qdrants_fusion(seed):
    """Qdrant's RRF is 1 / (k' + rank - 1): ours with k = k' - 1; its DBSF is our dbsf's unweighted sum."""
    need(importlib.util.find_spec("qdrant_client") is not None, "qdrant-client (the search extra) is not installed")
    from qdrant_client.http import models
    from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

    rng = random.Random(seed)
    runs = []
    for _ in range(2):
        ids = rng.sample(range(40), 25)
        runs.append(sorted([(i, rng.uniform(-1, 5)) for i in ids], key=lambda item: -item[1]))
    theirs = reciprocal_rank_fusion([_points(r, models) for r in runs], limit=100, ranking_constant_k=3)
    ours = fuse(runs, [1.0, 1.0], "rrf", rrf_k=2)
    assert [p.id for p in theirs] == [i for i, _ in ours]
    assert [p.score for p in theirs] == pytest.approx([s for _, s in ours], abs=1e-12)
    theirs = distribution_based_score_fusion([_points(r, models) for r in runs], limit=100)
    ours = fuse(runs, hybrid_weights(0.5), "dbsf")
    assert [p.id for p in theirs] == [i for i, _ in ours]
    assert [p.score / 2 for p in theirs] == pytest.approx([s for _, s in ours], abs=1e-12)


@pytest.mark.parametrize("settings, words", [
    ({"mode": "sparse"}, "unknown mode 'sparse': choose one of hybrid, dense, lexical"),
    ({"fusion": "max"}, "unknown fusion 'max'"),
    ({"alpha": 1.5}, "alpha .* must be between 0 and 1, got 1.5"),
    ({"alpha": -0.1}, "between 0 and 1"),
    ({"rrf_k": -1.0}, "rrf_k must be >= 0"),
    ({"depth": 0}, "fusion depth must be at least 1"),
])
def test_bad_settings_are_one_line(settings, words):
    with pytest.raises(BertkitError, match=words) as caught:
        FusionOptions(**settings).validate()
    assert "\n" not in str(caught.value)
    with pytest.raises(BertkitError, match="unknown fusion"):
        fuse([DENSE], [1.0], "sum")


@pytest.mark.parametrize("tuned, words", [
    ({"fusion": "rrff", "alpha": 0.5}, "unknown fusion 'rrff'"),
    ({"fusion": "rrf", "rrf_k": "60"}, "rrf_k must be >= 0, got '60'"),
    ({"fusion": "dbsf", "alpha": 2}, "between 0 and 1"),
    (["dbsf"], "it is \\['dbsf'\\], not an object"),
])
def test_a_bad_fusion_in_index_json_is_named_as_index_json(tuned, words):
    """A hand-edited (or damaged) "fusion" in index.json was refused as if a flag had given it ("unknown fusion
    'rrff'"), index.json unnamed, and a text rrf_k stopped the search with a TypeError; now one line names
    index.json and the fix. A flag given beside it is still checked as a flag."""
    from bertkit.retrieval.search import fusion_options

    with pytest.raises(BertkitError, match=words) as caught:
        fusion_options({"lexical": True, "fusion": tuned})
    assert str(caught.value).startswith("index.json's \"fusion\"") and "--tune" in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(BertkitError, match="^unknown fusion 'max'"):
        fusion_options({"lexical": True, "fusion": {"fusion": "rrf", "alpha": 0.5}}, {"fusion": "max"})
    assert fusion_options({"lexical": True, "fusion": {"fusion": "rrf", "rrf_k": 2, "tuned_on": "train"}}).rrf_k == 2
