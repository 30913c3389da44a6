"""Evaluation metrics for the fine-tuning tasks, in plain Python.

- classification: accuracy, per-label precision/recall/F1, macro F1 (over the
  labels the references or predictions hold, as scikit-learn), a confusion
  matrix, the Matthews correlation (GLUE reports accuracy, F1 of the positive
  class for MRPC, and the Matthews correlation for CoLA);
- regression: Pearson and Spearman correlation (STS-B), Spearman with average
  ranks for ties;
- NER: entity-level precision/recall/F1 as the CoNLL `conlleval` script
  computes them: a chunk starts at a B- tag, at an I- tag after O or after a
  tag of another type, and an entity counts as correct only when its type,
  first and last word all match. These rules read IOB1 (CoNLL-2003's own
  scheme, B- only between two adjacent entities of one type) and IOB2/BIO
  alike, so both schemes are scored with the same function;
- SQuAD: the official v1.1 `evaluate-v1.1.py` exact match and token F1 after
  its answer normalisation (lower-case, drop punctuation, drop the articles
  a/an/the, collapse whitespace), maximised over the reference answers and
  reported in percent; with `v2=True` the v2.0 script's rules (an empty
  prediction matches an empty, no-answer, reference; a reference that
  normalises to nothing is dropped) and its HasAns/NoAns figures.

Inputs are plain lists; outputs are floats or dicts of floats.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter

from bertkit.errors import BertkitError


def _same_length(a, b, what: str) -> None:
    if len(a) != len(b):
        raise BertkitError(f"{what}: {len(a)} predictions but {len(b)} references; they must pair up one to one")
    if not a:
        raise BertkitError(f"{what}: no examples to score")


# --- classification --------------------------------------------------------

def accuracy(preds, labels) -> float:
    _same_length(preds, labels, "accuracy")
    return sum(p == y for p, y in zip(preds, labels)) / len(labels)


def matthews(preds, labels) -> float:
    """Matthews correlation coefficient (GLUE's CoLA figure), in its multi-class form (Gorodkin 2004) for more
    than two labels, as scikit-learn's `matthews_corrcoef`: 0.0 where it is undefined (one class predicted,
    or one in the references)."""
    _same_length(preds, labels, "matthews")
    n, correct = len(labels), sum(p == y for p, y in zip(preds, labels))
    predicted, true = Counter(preds), Counter(labels)
    cov_yp = correct * n - sum(predicted[k] * true[k] for k in true)
    cov_pp = n * n - sum(c * c for c in predicted.values())
    cov_yy = n * n - sum(c * c for c in true.values())
    return cov_yp / math.sqrt(cov_pp * cov_yy) if cov_pp and cov_yy else 0.0


def confusion_matrix(preds, labels, num_labels: int) -> list[list[int]]:
    """matrix[gold][predicted] counts, labels as ids 0..num_labels-1."""
    _same_length(preds, labels, "confusion_matrix")
    m = [[0] * num_labels for _ in range(num_labels)]
    for p, y in zip(preds, labels):
        m[y][p] += 1
    return m


def _prf(tp: int, n_pred: int, n_gold: int) -> dict:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "support": n_gold}


def f1_binary(preds, labels, positive=1) -> float:
    """F1 of the positive class (GLUE's MRPC F1)."""
    _same_length(preds, labels, "f1")
    tp = sum(p == positive and y == positive for p, y in zip(preds, labels))
    return _prf(tp, sum(p == positive for p in preds), sum(y == positive for y in labels))["f1"]


def per_label_report(preds, labels, names: list[str]) -> dict:
    """{name: precision/recall/f1/support} per label plus macro F1, ids index `names`.

    The macro average is over the labels that the references or the predictions hold (scikit-learn's
    `f1_score(average="macro")`): a trained label absent from both has no F1 (0/0), and counting it as 0
    lowered a dev set's figure for a class it simply lacks. It is still listed, with support 0."""
    _same_length(preds, labels, "per_label_report")
    report, seen = {}, set(preds) | set(labels)
    for i, name in enumerate(names):
        tp = sum(p == i and y == i for p, y in zip(preds, labels))
        report[name] = _prf(tp, sum(p == i for p in preds), sum(y == i for y in labels))
    report["macro_f1"] = sum(report[name]["f1"] for i, name in enumerate(names) if i in seen) / len(seen)
    return report


def multilabel_scores(pred_sets, gold_sets) -> dict:
    """Micro P/R/F1 over (example, label) decisions and subset (exact-set) accuracy."""
    _same_length(pred_sets, gold_sets, "multi-label scores")
    tp = sum(len(set(p) & set(g)) for p, g in zip(pred_sets, gold_sets))
    scores = _prf(tp, sum(len(set(p)) for p in pred_sets), sum(len(set(g)) for g in gold_sets))
    scores.pop("support")
    scores["subset_accuracy"] = sum(set(p) == set(g) for p, g in zip(pred_sets, gold_sets)) / len(gold_sets)
    return {f"micro_{k}" if k != "subset_accuracy" else k: v for k, v in scores.items()}


# --- regression ------------------------------------------------------------

def pearson(x, y) -> float:
    _same_length(x, y, "pearson")
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return float("nan")  # undefined for a constant input, as in scipy
    return sxy / math.sqrt(sxx * syy)


def ranks(values) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x, y) -> float:
    _same_length(x, y, "spearman")
    if any(v != v for v in (*x, *y)):  # NaN has no rank (it compares false): nan, as scipy's spearmanr
        return float("nan")
    return pearson(ranks(x), ranks(y))


# --- NER: conlleval chunks -------------------------------------------------

def _split(tag: str) -> tuple[str, str]:
    if tag == "O" or tag == "":
        return "O", ""
    if len(tag) < 3 or tag[1] != "-" or tag[0] not in "BIES":
        raise BertkitError(f"tag {tag!r} is not O or B-/I-/E-/S-TYPE: use BIO (IOB2), IOB1 or IOBES tags")
    return tag[0], tag[2:]


def _chunk_end(prev_tag, tag, prev_type, typ) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != typ


def _chunk_start(prev_tag, tag, prev_type, typ) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("I", "E"):
        return True
    return tag != "O" and prev_type != typ


def get_entities(tags) -> list[tuple[str, int, int]]:
    """Chunks as (type, first, last) word indices, inclusive, by conlleval's rules."""
    entities, start = [], None
    prev_tag, prev_type = "O", ""
    for i, t in enumerate(list(tags) + ["O"]):
        tag, typ = _split(t)
        if start is not None and _chunk_end(prev_tag, tag, prev_type, typ):
            entities.append((prev_type, start, i - 1))
            start = None
        if _chunk_start(prev_tag, tag, prev_type, typ):
            start = i
        prev_tag, prev_type = tag, typ
    return entities


def check_tags(tags, where: str, fix: str = "") -> None:
    """Refuse a sentence's tags that `get_entities` cannot read, naming `where` they are (FILE:LINE) and `fix`."""
    try:
        get_entities(tags)
    except BertkitError as err:
        raise BertkitError(f"{where}: {err}{fix}") from None


def predicted_tags(tags) -> list[str]:
    """A model's tags as the chunking above reads them: a label without a B-/I-/E-/S- prefix (the IO scheme's "PER"
    of many Hub checkpoints, an unnamed head's "LABEL_1") is I-LABEL, so a run of one label is one entity, as
    transformers' token-classification pipeline reads it (conlleval's -r). `get_entities` refused it, and every
    served answer of such a model was a 500. Only a model's output is read so: a training file's bare tag is
    still refused, naming its line (more likely a wrong --tag-column than a scheme)."""
    return [t if t in ("O", "") or (len(t) > 2 and t[1] == "-" and t[0] in "BIES") else f"I-{t}" for t in tags]


def iob1_to_iob2(tags) -> list[str]:
    """Rewrite IOB1 (B- only between same-type neighbours) as IOB2/BIO (B- on every first word)."""
    out, prev_tag, prev_type = [], "O", ""
    for t in tags:
        tag, typ = _split(t)
        if tag == "I" and (prev_tag == "O" or prev_type != typ):
            t = "B-" + typ
        out.append(t)
        prev_tag, prev_type = tag, typ
    return out


def iob2_to_iob1(tags) -> list[str]:
    """Rewrite IOB2 as IOB1: B- kept only where the previous word ends an entity of the same type."""
    out, prev_type = [], ""
    for t in tags:
        tag, typ = _split(t)
        if tag == "B" and prev_type != typ:
            t = "I-" + typ
        out.append(t)
        prev_type = typ
    return out


def entity_scores(pred_sentences, gold_sentences) -> dict:
    """conlleval micro precision/recall/F1 (percent-free, 0..1) overall and per type.

    Sentences are lists of tags; each pair must have equal length.
    """
    _same_length(pred_sentences, gold_sentences, "entity F1")
    tp, n_pred, n_gold = Counter(), Counter(), Counter()
    for k, (pred, gold) in enumerate(zip(pred_sentences, gold_sentences)):
        if len(pred) != len(gold):
            raise BertkitError(f"sentence {k}: {len(pred)} predicted tags for {len(gold)} words")
        p, g = set(get_entities(pred)), set(get_entities(gold))
        for typ, *_ in p:
            n_pred[typ] += 1
        for typ, *_ in g:
            n_gold[typ] += 1
        for typ, *_ in p & g:
            tp[typ] += 1
    overall = _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))
    per_type = {t: _prf(tp[t], n_pred[t], n_gold[t]) for t in sorted(set(n_pred) | set(n_gold))}
    return {"precision": overall["precision"], "recall": overall["recall"], "f1": overall["f1"], "per_type": per_type}


# --- SQuAD -----------------------------------------------------------------

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation: lower, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def squad_exact(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def squad_f1(prediction: str, truth: str, v2: bool = False) -> float:
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(truth).split()
    if v2 and (not pred or not gold):
        return float(pred == gold)  # v2.0: no-answer vs no-answer is a match
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict, references: dict, v2: bool = False) -> dict:
    """{"exact_match", "f1"} in percent over the question ids of `references`.

    predictions: id -> answer text; references: id -> list of reference answer
    texts (an empty list means "no answer", scored against "" under v2).
    A question without a prediction scores 0, as in the official script.
    v2 (`evaluate-v2.0.py`): a reference that normalises to nothing ("The") is
    dropped, as that script drops it (else it matched the empty, no-answer,
    prediction), and the figures of the questions with answers and of those
    without follow as it names them: HasAns_exact, HasAns_f1, HasAns_total,
    NoAns_exact, NoAns_f1, NoAns_total (each group only when it has questions).
    """
    if not references:
        raise BertkitError("squad_scores: no reference questions to score")
    em, f1 = {}, {}
    for qid, truths in references.items():
        truths = [t for t in truths if not v2 or normalize_answer(t)] or [""]
        pred = predictions.get(qid)
        em[qid] = 0.0 if pred is None else max(squad_exact(pred, t) for t in truths)
        f1[qid] = 0.0 if pred is None else max(squad_f1(pred, t, v2) for t in truths)
    scores = {"exact_match": 100.0 * sum(em.values()) / len(em), "f1": 100.0 * sum(f1.values()) / len(f1)}
    for name, ids in (("HasAns", [q for q, t in references.items() if t]),
                      ("NoAns", [q for q, t in references.items() if not t])):
        if v2 and ids:
            scores.update({f"{name}_exact": 100.0 * sum(em[q] for q in ids) / len(ids),
                           f"{name}_f1": 100.0 * sum(f1[q] for q in ids) / len(ids), f"{name}_total": len(ids)})
    return scores
