"""Metrics against hand-computed values and the official scripts' rules.

Entity F1 cases follow conlleval's chunking (IOB1 and IOB2 chunk starts);
SQuAD cases exercise the official normalisation (punctuation, articles, case,
whitespace) and the max over reference answers, and v2.0 is held to a transcription
of its official script (`official_v2`); macro F1, Matthews correlation and Spearman
are held to scikit-learn and scipy.
"""

import collections
import math
import re
import string

import numpy as np
import pytest
from conftest import oracle

from bertkit.errors import BertkitError
from bertkit.metrics.tasks import (
    accuracy,
    confusion_matrix,
    entity_scores,
    f1_binary,
    get_entities,
    iob1_to_iob2,
    iob2_to_iob1,
    matthews,
    multilabel_scores,
    normalize_answer,
    pearson,
    per_label_report,
    ranks,
    spearman,
    squad_exact,
    squad_f1,
    squad_scores,
)


def test_accuracy_f1_confusion_by_hand():
    preds = [1, 0, 1, 1, 0, 2]
    gold = [1, 0, 0, 1, 1, 2]
    assert accuracy(preds, gold) == pytest.approx(4 / 6)
    # positive class 1: tp=2, predicted 3, gold 3 -> P=R=F1=2/3
    assert f1_binary(preds, gold) == pytest.approx(2 / 3)
    assert confusion_matrix(preds, gold, 3) == [[1, 1, 0], [1, 2, 0], [0, 0, 1]]
    rep = per_label_report(preds, gold, ["neg", "pos", "other"])
    assert rep["neg"]["precision"] == 0.5 and rep["neg"]["recall"] == 0.5
    assert rep["other"]["f1"] == 1.0 and rep["pos"]["support"] == 3
    assert rep["macro_f1"] == pytest.approx((0.5 + 2 / 3 + 1.0) / 3)


def test_macro_f1_equals_scikit_learn_when_a_label_is_absent_from_the_dev_set():
    # a trained label that neither the dev set nor the model's predictions hold has no F1 (0/0): scikit-learn's
    # macro average, the figure papers quote, leaves it out; counting it as 0 pulled the average down
    metrics = oracle("sklearn.metrics", "scikit-learn")
    rng = np.random.default_rng(0)
    for trial in range(200):
        n_labels = int(rng.integers(2, 6))
        present = rng.choice(n_labels, size=int(rng.integers(1, n_labels + 1)), replace=False)
        gold = list(map(int, rng.choice(present, size=int(rng.integers(1, 20)))))
        pred = list(map(int, rng.choice(present, size=len(gold))))
        ours = per_label_report(pred, gold, [f"l{i}" for i in range(n_labels)])["macro_f1"]
        assert ours == pytest.approx(metrics.f1_score(gold, pred, average="macro", zero_division=0), abs=1e-12), \
            (gold, pred, n_labels)
    # by hand: three trained labels, the dev set and the predictions use two: (1 + 0.5) / 2, not / 3
    rep = per_label_report([0, 1, 1], [0, 1, 0], ["a", "b", "c"])
    assert rep["macro_f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert rep["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}  # still listed


def test_matthews_correlation_equals_scikit_learn():
    # GLUE's CoLA figure (Matthews correlation, its multi-class form for more labels): constant predictions, a
    # single gold class and perfect or inverted predictions included (sklearn: 0 where it is undefined)
    metrics = oracle("sklearn.metrics", "scikit-learn")
    rng = np.random.default_rng(2)
    cases = [([1, 1, 1], [0, 1, 0]), ([0, 0], [0, 0]), ([0, 1, 0, 1], [0, 1, 0, 1]), ([1, 0, 1, 0], [0, 1, 0, 1])]
    for _ in range(200):
        n_labels = int(rng.integers(2, 5))
        gold = list(map(int, rng.integers(0, n_labels, size=int(rng.integers(1, 25)))))
        cases.append((list(map(int, rng.integers(0, n_labels, size=len(gold)))), gold))
    for pred, gold in cases:
        assert matthews(pred, gold) == pytest.approx(metrics.matthews_corrcoef(gold, pred), abs=1e-12), (pred, gold)


def test_f1_with_no_positive_predictions_is_zero():
    assert f1_binary([0, 0], [1, 0]) == 0.0


def test_multilabel_scores_by_hand():
    pred = [{"a", "b"}, {"c"}, set()]
    gold = [{"a"}, {"c"}, {"b"}]
    s = multilabel_scores(pred, gold)
    # tp = 2 (a, c), predicted 3, gold 3
    assert s["micro_precision"] == pytest.approx(2 / 3) and s["micro_recall"] == pytest.approx(2 / 3)
    assert s["subset_accuracy"] == pytest.approx(1 / 3)


def test_length_mismatch_and_empty_are_errors():
    with pytest.raises(BertkitError, match="pair up"):
        accuracy([1, 0], [1])
    with pytest.raises(BertkitError, match="no examples"):
        accuracy([], [])


def test_pearson_spearman_against_hand_and_numpy():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [2.0, 4.0, 6.0, 8.0, 10.0]
    assert pearson(x, y) == pytest.approx(1.0)
    assert pearson(x, [-v for v in y]) == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert pearson(list(a), list(b)) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    # ties share the mean rank: [10, 20, 20, 30] -> [1, 2.5, 2.5, 4]
    assert ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]
    # monotone but non-linear: Spearman 1, Pearson < 1
    z = [v**3 for v in x]
    assert spearman(x, z) == pytest.approx(1.0) and pearson(x, z) < 0.99
    # by hand: ranks x=[1,2,3,4], y=[2,1,4,3] -> d^2 = 4 -> 1 - 6*4/(4*15) = 0.6
    assert spearman([1, 2, 3, 4], [5, 0, 9, 7]) == pytest.approx(0.6)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_spearman_of_a_nan_prediction_is_nan_as_in_scipy():
    # NaN compares false with everything, so ranking it gave each NaN a made-up rank: a model whose outputs were
    # NaN scored Spearman 1.0 on these gold scores (the rank of the file's order), where Pearson said nan
    stats = oracle("scipy.stats", "scipy")
    nan = float("nan")
    for x in ([nan, nan, nan, nan], [nan, 1.0, 2.0, 3.0], [1.0, 3.0, nan, 2.0]):
        assert math.isnan(stats.spearmanr(x, [1, 2, 3, 4]).statistic)
        assert math.isnan(spearman(x, [1, 2, 3, 4])) and math.isnan(spearman([1, 2, 3, 4], x)), x


# --- entities --------------------------------------------------------------

def test_iob2_chunks():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O", "B-ORG"]
    assert get_entities(tags) == [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 5), ("ORG", 7, 7)]


def test_iob1_chunks_as_conlleval():
    # IOB1: I- after O starts a chunk; B- only separates two same-type neighbours.
    tags = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]
    assert get_entities(tags) == [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4), ("ORG", 5, 5)]


def test_type_change_inside_i_run_starts_new_chunk():
    assert get_entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]


def test_iobes_chunks():
    assert get_entities(["S-PER", "B-LOC", "E-LOC", "B-ORG", "I-ORG", "E-ORG"]) == [
        ("PER", 0, 0),
        ("LOC", 1, 2),
        ("ORG", 3, 5),
    ]


def test_scheme_conversion_round_trip():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG"]
    assert iob1_to_iob2(iob1) == iob2
    assert iob2_to_iob1(iob2) == iob1
    assert get_entities(iob1) == get_entities(iob2)


def test_bad_tag_is_an_error():
    with pytest.raises(BertkitError, match="not O or B-"):
        get_entities(["PER"])


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-MISC"]]
    # gold: PER(0,1) LOC(3,3) ORG(0,0) = 3; pred: PER(0,0) LOC ORG MISC = 4; correct LOC, ORG = 2
    s = entity_scores(pred, gold)
    assert s["precision"] == pytest.approx(2 / 4)
    assert s["recall"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert s["per_type"]["PER"]["f1"] == 0.0 and s["per_type"]["LOC"]["f1"] == 1.0
    assert s["per_type"]["MISC"]["precision"] == 0.0 and s["per_type"]["MISC"]["support"] == 0


def test_partial_boundaries_do_not_count():
    # a wider predicted span is wrong even though it overlaps the gold one
    assert entity_scores([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]])["f1"] == 0.0


def test_entity_length_mismatch_is_an_error():
    with pytest.raises(BertkitError, match="2 predicted tags for 3 words"):
        entity_scores([["O", "O"]], [["O", "O", "O"]])


# --- SQuAD -----------------------------------------------------------------

@pytest.mark.parametrize(
    "raw, normal",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple, a pear ", "apple pear"),
        ("theatre", "theatre"),  # 'the' only as a whole word
        ("A.D. 1066", "ad 1066"),
        ("Denver Broncos.", "denver broncos"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_squad_em_f1_by_hand():
    assert squad_exact("the Broncos", "Broncos!") == 1.0
    # pred tokens [denver, broncos, team], gold [broncos]: P=1/3 R=1 F1=0.5
    assert squad_f1("Denver Broncos team", "Broncos") == pytest.approx(0.5)
    assert squad_f1("xyz", "Broncos") == 0.0
    # repeated tokens count by multiplicity (Counter intersection)
    assert squad_f1("a b b", "b b c") == pytest.approx(2 * (2 / 2) * (2 / 3) / ((2 / 2) + (2 / 3)))
    # an empty prediction: v1.1 gives 0 F1 (even against an empty answer), v2 matches empty with empty
    assert squad_f1("", "") == 0.0 and squad_f1("", "", v2=True) == 1.0
    assert squad_f1("", "x", v2=True) == 0.0


def test_squad_scores_max_over_references_and_missing():
    refs = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Santa Clara"], "q3": ["1066"]}
    preds = {"q1": "broncos", "q2": "Santa Clara, California"}  # q3 unanswered scores 0
    s = squad_scores(preds, refs)
    assert s["exact_match"] == pytest.approx(100 * 1 / 3)
    assert s["f1"] == pytest.approx(100 * (1 + 0.8) / 3)  # q2: P=2/3 R=1 -> 0.8


def official_v2(answers: dict, preds: dict) -> dict:
    """SQuAD 2.0's evaluate-v2.0.py (no na_prob file: every prediction stands), transcribed: gold answers that
    normalise to nothing are dropped, an empty list is [""], and the HasAns/NoAns split is by the answers given."""

    def norm(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(gold, pred):
        g, p = norm(gold).split(), norm(pred).split()
        if not g or not p:
            return int(g == p)
        same = sum((collections.Counter(g) & collections.Counter(p)).values())
        return 0 if same == 0 else 2 * (same / len(p)) * (same / len(g)) / (same / len(p) + same / len(g))

    exact, f1s = {}, {}
    for qid, texts in answers.items():
        gold = [a for a in texts if norm(a)] or [""]
        exact[qid] = max(int(norm(a) == norm(preds[qid])) for a in gold)
        f1s[qid] = max(f1(a, preds[qid]) for a in gold)
    out = {"exact": 100 * sum(exact.values()) / len(exact), "f1": 100 * sum(f1s.values()) / len(f1s)}
    for name, ids in (("HasAns", [q for q in answers if answers[q]]), ("NoAns", [q for q in answers if not answers[q]])):
        if ids:
            out.update({f"{name}_exact": 100 * sum(exact[q] for q in ids) / len(ids),
                        f"{name}_f1": 100 * sum(f1s[q] for q in ids) / len(ids), f"{name}_total": len(ids)})
    return out


def test_squad_v2_scores_equal_the_official_script_with_its_answerable_and_unanswerable_splits():
    # SQuAD 2.0 papers quote HasAns and NoAns beside the overall figures; the official script also drops a gold
    # answer that normalises to nothing ("The"), which would otherwise match an empty (no-answer) prediction
    rng = np.random.default_rng(1)
    words = ["the", "denver", "broncos", "a", "1066", "santa", "clara", "."]
    answers, preds = {}, {}
    for i in range(300):
        texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 4)))) for _ in range(int(rng.integers(0, 3)))]
        answers[f"q{i}"] = texts
        options = [*texts, "", "The", " ".join(rng.choice(words, size=int(rng.integers(1, 4))))]
        preds[f"q{i}"] = str(options[int(rng.integers(0, len(options)))])
    answers["the"], preds["the"] = ["The", "Denver"], ""  # gold "The" is dropped: no match for the empty answer
    want = official_v2(answers, preds)
    got = squad_scores(preds, answers, v2=True)
    assert got["exact_match"] == pytest.approx(want["exact"]) and got["f1"] == pytest.approx(want["f1"])
    for key in ("HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total"):
        assert got[key] == pytest.approx(want[key]), key
    assert squad_scores({"the": ""}, {"the": ["The", "Denver"]}, v2=True)["exact_match"] == 0.0
    # v1.1 has no unanswerable questions: no split, and its script keeps every gold answer
    assert set(squad_scores({"q": "x"}, {"q": ["x"]})) == {"exact_match", "f1"}
