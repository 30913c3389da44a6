"""Using a text classification or regression model: texts -> features, logits -> predictions, scores.

What `bertkit.tasks.classification` trains (classify, pair, regression,
multi-label: BertForSequenceClassification, BERT section 4.1) is read back
here: the input `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, one vector of
logits per input, and what they mean follows the head's problem type
(`BertConfig.problem_type`):

    single_label_classification  softmax -> {"label", "label_id", "probabilities"}
    regression                   the one output -> {"score"}
    multi_label_classification   a sigmoid per label, > 0.5 -> {"labels", "probabilities"}

Long inputs: with `stride > 0` a single text longer than `max_length` is cut
into windows overlapping by `stride` tokens (google-research/bert run_squad.py's
way of covering long documents) and the windows' logits are averaged into one
prediction; pairs are always truncated (longest first). `cut_count` counts the
inputs read cut at max_length, which finetune and `bertkit predict` say.

No torch here: `predict` gets `run(features)`, the model run over features
(`bertkit.tasks.batching.run_model`), so using a model needs no training code.
Shapes: logits per example (num_labels,), (1,) for regression.
"""

from __future__ import annotations

import warnings

import numpy as np

from bertkit.data.tables import (Inputs, TextExample, check_known_labels, first_row, one_text_per_line,
                                 read_text_columns, read_text_examples, read_text_lines, text_column_of)
from bertkit.metrics import tasks as M
from bertkit.model.config import MULTI_LABEL, REGRESSION


# --- features --------------------------------------------------------------

def encode_text(tok, text: str, pair: str | None, max_length: int, stride: int) -> list:
    """The Encodings of one example: one, or several windows when stride > 0."""
    if pair is not None:
        return [tok.encode(text, pair, max_length=max_length, truncation_strategy="longest_first")]
    enc = tok.encode(text, max_length=max_length, stride=stride, return_overflowing=stride > 0)
    return [enc, *enc.overflowing] if stride > 0 else [enc]


def label_value(label, problem_type: str, label2id: dict | None):
    if problem_type == REGRESSION:
        return float(label)
    if problem_type == MULTI_LABEL:
        vec = [0.0] * len(label2id)
        for name in label:
            vec[label2id[name]] = 1.0
        return vec
    return label2id[label]


def _windows(tok, examples: list[TextExample], max_length: int, stride: int) -> list[tuple[list[tuple], bool]]:
    """Each example's windows as (input_ids, token_type_ids), and whether the model reads it cut at max_length (as
    `cut_count` counts), from this one tokenization: single texts without a stride in one batch, one piece past the
    cut telling a cut text (`Tokenizer.single_ids`' with_cut), the rest `encode_text`'s (a pair's
    `Encoding.truncated`; a windowed text is read whole)."""
    single = [i for i, ex in enumerate(examples) if ex.text_pair is None] if stride == 0 else []
    texts = [examples[i].text for i in single]
    fast = dict(zip(single, tok.single_ids(texts, max_length, with_cut=True))) if single else {}
    out = []
    for i, ex in enumerate(examples):
        if i in fast:
            ids, cut = fast[i]
            out.append(([(ids, [0] * len(ids))], cut))
        else:
            encs = encode_text(tok, ex.text, ex.text_pair, max_length, stride)
            cut = ex.text_pair is not None and encs[0].truncated  # a single text with a stride: read whole
            out.append(([(e.input_ids, e.token_type_ids) for e in encs], cut))
    return out


def make_features(tok, examples: list[TextExample], problem_type: str, label2id, max_length: int,
                  stride: int, on_cut=None, on_tokens=None) -> list[dict]:
    """One feature dict per window; `example_index` ties windows to their example. on_cut(cut, seen): told how many
    of the examples the model reads cut at max_length (`_windows`); on_tokens(n): told how many tokens the windows
    hold, before any is read (a server refuses a request over its limit there: `bertkit.serve`'s /search rerank)."""
    feats, read = [], _windows(tok, examples, max_length, stride)
    for i, (ex, (windows, _)) in enumerate(zip(examples, read)):
        for input_ids, token_type_ids in windows:
            f = {"input_ids": input_ids, "token_type_ids": token_type_ids, "example_index": i}
            if ex.label is not None:
                f["labels"] = label_value(ex.label, problem_type, label2id)
            feats.append(f)
    if on_cut is not None:
        on_cut(sum(cut for _, cut in read), len(examples))
    if on_tokens is not None:
        on_tokens(sum(len(f["input_ids"]) for f in feats))
    return feats


def training_features(tok, texts: list[str], pairs: list[str] | None, answers: list[TextExample] | None,
                      info: dict, names: list[str] | None, *, problem_type: str) -> list[dict]:
    """Features to train a model of this task on (layer distillation's data), encoded as it was trained
    (bertkit_task.json): each input's window(s), with the labels of `answers` where the file had them."""
    examples = answers or [TextExample(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    label2id = None
    if answers and problem_type != REGRESSION:
        label2id = {n: i for i, n in enumerate(names)}
        check_known_labels((e.label for e in answers), label2id, "the data")
    return make_features(tok, examples, problem_type, label2id, info.get("max_length", 512), info.get("stride", 0))


def window_reading(info: dict) -> tuple[int, int]:
    """(max_length, stride) a model reads a single text with: in windows when it was trained with --stride
    (`encode_text`), each [CLS] span [SEP] as NER's (`bertkit.tasks.ner_inference.window_tokens` counts them)."""
    return info.get("max_length", 512), info.get("stride", 0)


def cut_count(tok, examples: list[TextExample], max_length: int, stride: int) -> int:
    """How many examples the model reads cut at `max_length`, the tokens past it unread: a single text longer than
    that when there is no stride (with one it is read whole, in windows), a pair always (cut longest first). Each
    side is read only as far as its head (`Tokenizer.head`: more pieces than the budget, or the whole text)."""
    heads, budgets = [], []
    for ex in examples:
        if ex.text_pair is None and stride:
            continue
        budget = max_length - (2 if ex.text_pair is None else 3)  # [CLS] A [SEP] (B [SEP])
        sides = [ex.text] if ex.text_pair is None else [ex.text, ex.text_pair]
        heads += [tok.head(side, budget) for side in sides]
        budgets.append((budget, len(sides)))
    lengths = iter(tok.ids_batch(heads)[1] if heads else ())
    return sum(sum(next(lengths) for _ in range(sides)) > budget for budget, sides in budgets)


def cut_line(tok, texts: list[str], pairs: list[str] | None, info: dict) -> str | None:
    """What `bertkit predict` says of the inputs the model reads cut (`cut_count`), None when it reads all whole."""
    examples = [TextExample(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    max_length, stride = info.get("max_length", 512), info.get("stride", 0)
    cut = cut_count(tok, examples, max_length, stride)
    if not cut:
        return None
    if pairs is not None:
        how = "cut longest side first; pairs are never windowed"
    elif info.get("inferred"):  # a Hugging Face checkpoint keeps no stride
        how = "a Hugging Face checkpoint is read cut, as transformers' pipeline with truncation reads it"
    else:
        how = (f"it was fine-tuned without --stride: fine-tune with --stride {max_length // 4} to read long texts "
               "whole, in windows")
    return (f"{cut} of {len(texts)} inputs are longer than the model's max_length of {max_length} tokens: it read "
            f"only their first {max_length} tokens ({how})")


# --- predictions -----------------------------------------------------------

def pool_windows(logits: list[np.ndarray], features: list[dict], n_examples: int) -> np.ndarray:
    """Average the logits of each example's windows: (n_examples, num_labels)."""
    sums = np.zeros((n_examples, logits[0].shape[-1]), dtype=np.float64)
    counts = np.zeros(n_examples)
    for v, f in zip(logits, features):
        sums[f["example_index"]] += v
        counts[f["example_index"]] += 1
    return (sums / counts[:, None]).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def decode(logits: np.ndarray, problem_type: str, names: list[str] | None) -> list[dict]:
    """Per-example predictions from pooled logits: label + probabilities, or a score."""
    if problem_type == REGRESSION:
        return [{"score": float(v[0])} for v in logits]
    if problem_type == MULTI_LABEL:
        probs = sigmoid(logits)
        return [{"labels": [names[j] for j in np.flatnonzero(p > 0.5)],
                 "probabilities": {names[j]: float(p[j]) for j in range(len(names))}} for p in probs]
    probs = softmax(logits)
    return [{"label": names[int(p.argmax())], "label_id": int(p.argmax()),
             "probabilities": {names[j]: float(p[j]) for j in range(len(names))}} for p in probs]


def predict(run, tok, texts: list[str], pairs: list[str] | None, info: dict, names: list[str] | None, *,
            problem_type: str, on_cut=None, on_tokens=None) -> list[dict]:
    """One prediction per text (and pair), the inputs encoded as the model was trained (bertkit_task.json);
    on_cut(cut, seen): told how many of them the model read cut at its max_length, counted as they were encoded;
    on_tokens(n): told the tokens of those encodings before the model reads them (`make_features`)."""
    examples = [TextExample(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    feats = make_features(tok, examples, problem_type, None, info.get("max_length", 512), info.get("stride", 0),
                          on_cut, on_tokens)
    return decode(pool_windows(run(feats)["logits"], feats, len(examples)), problem_type, names)


# --- scores ----------------------------------------------------------------

def held_out_loss(preds: list[dict], examples: list[TextExample], problem_type: str, names: list[str] | None) -> float:
    """The loss the head trains with, on held-out examples: cross-entropy of the gold label's
    probability (classification), binary cross-entropy per label (multi-label), or the squared
    error (regression). What breaks a tie in the task metric (`bertkit.tasks.trainer.better`)."""
    if problem_type == REGRESSION:
        return float(np.mean([(p["score"] - float(ex.label)) ** 2 for p, ex in zip(preds, examples)]))
    tiny = 1e-12  # a probability rounded to 0 or 1 in float32 costs a large, finite loss
    if problem_type == MULTI_LABEL:
        losses = [-np.log(max(q, tiny)) if name in ex.label else -np.log(max(1.0 - q, tiny))
                  for p, ex in zip(preds, examples) for name, q in p["probabilities"].items()]
        return float(np.mean(losses))
    return float(np.mean([-np.log(max(p["probabilities"][ex.label], tiny)) for p, ex in zip(preds, examples)]))


def score(preds: list[dict], examples: list[TextExample], problem_type: str, names: list[str] | None,
          full=False) -> dict:
    """The problem type's metrics and its `held_out_loss`; `full` adds the per-label report and the
    confusion matrix."""
    # a constant predictor (the trivial baseline) gives no probabilities, so no loss
    scored = problem_type == REGRESSION or all("probabilities" in p for p in preds)
    loss = {"held_out_loss": held_out_loss(preds, examples, problem_type, names)} if scored else {}
    if problem_type == REGRESSION:
        x = [p["score"] for p in preds]
        y = [float(ex.label) for ex in examples]
        return {**correlations(x, y), "mse": float(np.mean((np.array(x) - np.array(y)) ** 2)), **loss}
    if problem_type == MULTI_LABEL:
        return {**M.multilabel_scores([p["labels"] for p in preds], [ex.label for ex in examples]), **loss}
    label2id = {n: i for i, n in enumerate(names)}
    p = [q["label_id"] for q in preds]
    y = [label2id[ex.label] for ex in examples]
    out = {"accuracy": M.accuracy(p, y), **loss}
    report = M.per_label_report(p, y, names)
    out["macro_f1"] = report.pop("macro_f1")
    out["matthews_correlation"] = M.matthews(p, y)  # CoLA's figure (GLUE), named as Hugging Face's run_glue names it
    if len(names) == 2:  # the F1 of the second label in sorted order (GLUE: 1 = paraphrase)
        out["f1"] = M.f1_binary(p, y, positive=1)
    if full and len(names) == 2:  # which label that is (RTE's: not_entailment), said beside the figure
        out["f1_label"] = names[1]
    if full:
        out["per_label"] = report
        out["confusion_matrix"] = {"labels": names, "rows_gold_columns_predicted": M.confusion_matrix(p, y, len(names))}
    return out


def correlations(x: list[float], y: list[float]) -> dict:
    """Pearson and Spearman of the scores `x` against the gold `y`; None (null in metrics.json) with a warning
    where a side is constant: a correlation is then undefined (scipy's nan), and NaN in metrics.json was no JSON
    a strict reader takes (`bertkit evaluate sts` reports such a figure the same way)."""
    for values, what in ((x, "the model gives every example the same score"), (y, "every gold score is")):
        if len(set(values)) < 2:
            warnings.warn(f"{what} {values[0]:.4f}: pearson and spearman are undefined and reported as null",
                          stacklevel=3)
            return {"pearson": None, "spearman": None}
    return {"pearson": M.pearson(x, y), "spearman": M.spearman(x, y)}


def score_answers(preds: list[dict], examples: list[TextExample], info: dict, names: list[str] | None, *,
                  problem_type: str) -> dict:
    """Evaluate mode's metrics against the labels `read_labelled` found (unknown labels refused): what finetune's
    metrics.json holds for its dev set (`full`: two labels' `f1_label`, the per-label report, the confusion matrix)."""
    if problem_type != REGRESSION:
        check_known_labels([e.label for e in examples], {n: i for i, n in enumerate(names)}, "the input file")
    return score(preds, examples, problem_type, names, full=True)


# --- files -----------------------------------------------------------------

def read_inputs(path, info: dict, text_column=None, text_pair_column=None, log=print, *,
                keep_rows: bool = False) -> Inputs:
    """The texts (and pairs) of a table, in the columns the model was trained on unless given, with `keep_rows` its
    rows (predict writes them back); a .txt file without a header naming the text column is one text per line."""
    pcol = text_pair_column or info.get("text_pair_column")
    if not pcol and one_text_per_line(path, text_column or info.get("text_column") or "sentence"):
        return Inputs(read_text_lines(path))
    tcol = text_column_of(path, text_column or info.get("text_column"), (info.get("label_column"),), log)
    return read_text_columns(path, tcol, pcol, log=log, keep_rows=keep_rows)


def read_labelled(path, info: dict, text_column=None, text_pair_column=None, label_column=None, *,
                  problem_type: str, every_input: bool = False, keep_rows: bool = False, log=print) -> Inputs | None:
    """A table's inputs with their labels (`TextExample`s), or None when it has no label column or every label
    cell is empty: the labelled rows, or with `every_input` every row, None in place of an unlabelled row's
    example (evaluate mode predicts them all and scores the labelled). With `every_input` the inputs all the same
    where there are no labels (answers None): a table whose label column is empty is read once, not again by
    `read_inputs`. `keep_rows`: with each row as read (predict writes them back; others need not hold them)."""
    lcol = (label_column or info.get("label_column")
            or ("labels" if problem_type == MULTI_LABEL else "label"))
    if lcol not in first_row(path):
        return read_inputs(path, info, text_column, text_pair_column, log, keep_rows=keep_rows) if every_input else None
    chosen = []  # the column chosen for the texts is said once: here if the rows are kept, else by read_inputs
    tcol = text_column_of(path, text_column or info.get("text_column"), (lcol,), chosen.append)
    pcol = text_pair_column or info.get("text_pair_column")
    examples, report = read_text_examples(path, text_column=tcol, text_pair_column=pcol, label_column=lcol,
                                          problem_type=problem_type, label_separator=info.get("label_separator", ","),
                                          keep_unlabelled=True, keep_cells=keep_rows)
    unlabelled = all(e.label in (None, []) for e in examples)  # a column left empty (multi-label's [] included)
    if unlabelled and not every_input:
        return None
    for line in chosen:
        log(line)
    answered = None if unlabelled else [e if e.label is not None else None for e in examples]
    if not every_input:
        report.skipped["missing labels"] += answered.count(None)
        examples = answered = [e for e in answered if e is not None]
        report.kept = len(examples)
    if report.skipped:
        log(report.summary())
    pairs = [e.text_pair for e in examples] if pcol else None
    return Inputs([e.text for e in examples], pairs, answered, rows=[e.cells for e in examples] if keep_rows else None)
