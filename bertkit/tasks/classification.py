"""Sequence classification and regression: one text or a text pair -> a label or a score.

BERT paper section 4.1 (GLUE): the input is `[CLS] A [SEP]` or
`[CLS] A [SEP] B [SEP]` with segment ids 0/1 telling sentence A from B; the
pooled [CLS] vector goes through one linear layer (BertForSequenceClassification).
Tasks:
- `classify`: binary or multi-class, cross-entropy (sentiment, spam, ...);
- `pair`: the same over sentence pairs (paraphrase, entailment; MRPC, RTE);
- `regression`: one output, mean squared error, single texts or pairs (STS-B);
- `multi_label`: any subset of the labels, one sigmoid per label (BCE).

Long inputs: with `stride > 0` a single text longer than `max_length` is cut
into windows of max_length tokens overlapping by `stride` tokens (the way
google-research/bert run_squad.py covers long documents); every window is a
training feature with the text's label, and at prediction time the windows'
logits are averaged into one prediction. Without a stride (the default) the
text is truncated, as in the paper, and the run says per file how many examples
were (`_say_cut`). Pairs are always truncated (longest first).

Each task's record (`bertkit.tasks.registry`) gives its head's problem type,
which decides what a label is, the loss and the decoding; the features, the
decoding and the metrics, all that using the model needs, are
`bertkit.tasks.text_inference`. Shapes: logits per example (num_labels,) or (1,) for regression.

A reranker (`bertkit finetune rerank`, run by `bertkit.tasks.cross_encoder`) is the
pair classifier with one logit, "relevant", trained by `train_pair_scorer` with
binary cross-entropy whose positives weigh `pos_weight` (sentence-transformers'
`BinaryCrossEntropyLoss`), x the logit, y the label (0/1 or a probability):

    loss = mean over pairs of -( w * y * log sigmoid(x) + (1 - y) * log(1 - sigmoid(x)) )

It is saved as a multi-label head of that one label, so it is read back as its sigmoid.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.errors import BertkitError
from bertkit.model.config import MULTI_LABEL, REGRESSION
from bertkit.tasks.batching import run_model
from bertkit.tasks.config import TextTaskConfig
from bertkit.data.tables import (TextExample, check_known_labels, label_cell, column_key, first_row, label_names,
                                 looks_like_scores, probabilities_cell, read_text_examples, tsv_cell)
from bertkit.tasks.registry import task_for
from bertkit.tasks.run import load_head, load_tokenizer, saver, settle, write_json, write_lines
from bertkit.tasks.text_inference import cut_count, decode, make_features, pool_windows, score
from bertkit.tasks.trainer import train, warnings_once
from bertkit.model.heads import BertForSequenceClassification, HeadOutput

RELEVANT = "relevant"  # a reranker's one label

# --- the run ---------------------------------------------------------------

def read_split(cfg: TextTaskConfig, path, max_examples, log):
    examples, report = read_text_examples(
        path, text_column=cfg.text_column, text_pair_column=cfg.text_pair_column, label_column=cfg.label_column,
        problem_type=task_for(cfg).problem_type, label_separator=cfg.label_separator, max_examples=max_examples)
    log(report.summary())
    unread = _second_text(cfg, path)
    if unread:  # STS-B's sentence1/sentence2 read as single texts trained on half of each pair, without a word
        warnings.warn(f"{path}: the column {unread!r} is not read: the model sees {cfg.text_column!r} alone; for text "
                      f"pairs pass --text-pair-column {unread}", stacklevel=3)
    return examples


def _second_text(cfg: TextTaskConfig, path) -> str | None:
    """The column that pairs with the text column (sentence1 -> sentence2, question1 -> question2: GLUE's names)
    when the file has it and no --text-pair-column is given; else None."""
    if cfg.text_pair_column or not cfg.text_column.endswith("1"):
        return None
    second = cfg.text_column[:-1] + "2"
    return second if column_key(first_row(path), second) is not None else None


def write_predictions(path, examples, preds, problem_type: str, separator: str = ",", names=()) -> None:
    write_lines(path, prediction_lines(examples, preds, problem_type, separator, names))  # whole or not at all


def prediction_lines(examples, preds, problem_type: str, separator: str = ",", names=()):
    """The dev predictions' TSV lines; a multi-label set's cells joined as the training file's were (`label_cell`:
    joined by ',' whatever --label-separator said, a label 'pets, cats' read back as two)."""
    pair = any(e.text_pair is not None for e in examples)
    head = ["text"] + (["text_pair"] if pair else []) + ["gold", "predicted", "probabilities" if problem_type != REGRESSION else "score"]
    yield "\t".join(head) + "\n"
    for e, p in zip(examples, preds):
        gold = label_cell(e.label, separator, names) if isinstance(e.label, list) else str(e.label)
        if problem_type == REGRESSION:
            pred, extra = f"{p['score']:.4f}", f"{p['score']:.4f}"
        else:
            pred = label_cell(p["labels"], separator, names) if problem_type == MULTI_LABEL else p["label"]
            extra = probabilities_cell(p["probabilities"])
        row = [e.text] + ([e.text_pair or ""] if pair else []) + [gold, pred, extra]
        yield "\t".join(map(tsv_cell, row)) + "\n"


def _labels(cfg: TextTaskConfig, kind: str, train_ex, dev_ex) -> tuple[dict, list | None, dict | None]:
    """The head's settings from the training labels (classes in sorted order; one output for regression):
    (config overrides, label names, label -> id); a dev label unseen in training is refused, and for
    regression a dev set of one gold score (it has no correlation)."""
    overrides = {"problem_type": kind, "classifier_pooling": cfg.pooling}
    if kind == REGRESSION:
        gold = {float(e.label) for e in dev_ex or ()}
        if len(gold) == 1:  # no correlation (nan): every epoch tied, the first kept, NaN in metrics.json
            raise BertkitError(f"{cfg.dev}: every gold score is {gold.pop():g}: pearson and spearman need at least two "
                               "different scores; give a dev set whose scores vary")
        overrides["num_labels"] = 1
        return overrides, None, None
    names = label_names(e.label for e in train_ex)
    if not names:  # multi-label rows whose cells are all empty
        raise BertkitError(f"{cfg.train}: no labels in the training data (every labels cell is empty); "
                           f"check --label-column ({cfg.label_column!r}) and --label-separator")
    if len(names) < 2 and kind != MULTI_LABEL:
        raise BertkitError(f"{cfg.train}: only one label ({names}) in the training data; a classifier needs two or more")
    if kind != MULTI_LABEL and looks_like_scores(names):
        warnings.warn(f"{cfg.train}: the labels are numbers with fractions ({', '.join(names[:4])}"
                      f"{', ...' if len(names) > 4 else ''}): each distinct value becomes one of {len(names)} "
                      "classes; for a score, use bertkit finetune regression", stacklevel=3)
    label2id = {n: i for i, n in enumerate(names)}
    if dev_ex:
        check_known_labels((e.label for e in dev_ex), label2id, f"{cfg.dev}")
    overrides.update(num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id)
    return overrides, names, label2id


def finetune_text(cfg: TextTaskConfig, log=print, speed=None) -> dict:
    """Fine-tune on cfg.train, evaluate on cfg.dev each epoch, save the best; returns its metrics."""
    settle(cfg, log)
    task = task_for(cfg)
    task.check(cfg)
    kind, tcfg = task.problem_type, cfg.training
    task.settle_metric(cfg)
    train_ex = read_split(cfg, cfg.train, cfg.max_train_examples, log)
    dev_ex = read_split(cfg, cfg.dev, cfg.max_dev_examples, log) if cfg.dev else None
    overrides, names, label2id = _labels(cfg, kind, train_ex, dev_ex)
    if dev_ex and tcfg.metric == "f1" and len(names) != 2:  # `score` gives it for two labels only
        raise BertkitError(f"--metric f1 is the F1 of the second of two labels, and {cfg.train} has {len(names)}: "
                           "choose macro_f1")
    none = sum(e.label == [] for e in train_ex)  # multi-label texts with none of the labels
    log(f"task {cfg.task}: {len(train_ex)} training examples" + (f" ({none} with no label)" if none else "")
        + (f", labels {names}" if names else ""))

    tok = load_tokenizer(cfg.model, cfg.max_length)
    model = load_head(BertForSequenceClassification, cfg.model, tcfg.seed, log, **overrides)
    train_feats = make_features(tok, train_ex, kind, label2id, cfg.max_length, cfg.stride)
    if len(train_feats) > len(train_ex):
        log(f"{len(train_feats) - len(train_ex)} extra windows for texts longer than max_length={cfg.max_length}")
    dev_feats = make_features(tok, dev_ex, kind, label2id, cfg.max_length, cfg.stride) if dev_ex else None
    _say_cut(cfg, tok, ((cfg.train, train_ex), (cfg.dev, dev_ex)), log)

    def decode_dev(m):
        logits = run_model(m, dev_feats, tcfg.eval_batch_size, progress=tcfg.progress, desc="eval")["logits"]
        return decode(pool_windows(logits, dev_feats, len(dev_ex)), kind, names)

    def evaluate(m):
        preds = decode_dev(m)
        return score(preds, dev_ex, kind, names), preds

    info = {"task": cfg.task, "max_length": cfg.max_length, "stride": cfg.stride,
            "text_column": cfg.text_column, "text_pair_column": cfg.text_pair_column,
            "label_column": cfg.label_column, "label_separator": cfg.label_separator,
            "config": _jsonable(asdict(cfg))}
    out = Path(cfg.output)
    baseline = trivial_baseline(kind, train_ex, dev_ex, names, tcfg.metric) if dev_ex else None
    result = train(model, train_feats, tcfg, evaluate=evaluate if dev_ex else None, baseline=baseline,
                   save=saver(out, tok, info), output_dir=out, pad_id=tok.pad_token_id, run_config=asdict(cfg), log=log,
                   speed=speed)
    if not result.is_main:
        return {}
    final = {"task": cfg.task, "train_examples": len(train_ex), "train_seconds": round(result.seconds, 1),
             "epochs": result.history, **result.saved}  # which epoch the saved model is, and why
    if dev_ex:
        preds = result.best_predictions or decode_dev(model)  # a resumed run may lack them
        final["dev"] = warnings_once(lambda: score(preds, dev_ex, kind, names, full=True), result.said)
        final["dev_examples"] = len(dev_ex)
        write_predictions(out / "dev_predictions.tsv", dev_ex, preds, kind, cfg.label_separator, names or ())
    write_json(out / "metrics.json", final)
    return final


def _say_cut(cfg: TextTaskConfig, tok, splits, log) -> None:
    """Say per file how many examples are read cut at --max-length (`text_inference.cut_count`): the model trains
    and is scored on their first tokens alone, which nothing showed."""
    for path, examples in splits:
        cut = cut_count(tok, examples, cfg.max_length, cfg.stride) if examples else 0
        if cut:
            how = ("pairs are cut longest side first" if cfg.text_pair_column else
                   f"--stride {cfg.max_length // 4} reads long texts whole, in windows")
            log(f"{path}: {cut} of {len(examples)} examples are longer than --max-length {cfg.max_length} tokens and "
                f"are cut there ({how})")


def trivial_baseline(problem_type: str, train_ex, dev_ex, names, metric: str) -> tuple[float, str] | None:
    """(the dev `metric` of a predictor that ignores its input, what it predicts), None for other metrics."""
    if problem_type == REGRESSION:
        mean = float(np.mean([float(e.label) for e in train_ex]))
        pred, what = {"score": mean}, f"always the mean {mean:.3g}"
    elif problem_type == MULTI_LABEL:
        pred, what = {"labels": []}, "no labels"
    else:
        labels = [e.label for e in train_ex]
        majority = max(names, key=labels.count)
        pred, what = {"label": majority, "label_id": names.index(majority)}, f"always the majority class {majority!r}"
    if metric in ("pearson", "spearman"):  # undefined for a constant: no correlation
        return 0.0, "a constant score"
    with warnings.catch_warnings():  # the constant's correlations are undefined, as expected: no warning of it
        warnings.simplefilter("ignore")
        value = score([pred] * len(dev_ex), dev_ex, problem_type, names).get(metric)
    return None if value is None else (value, what)


def _jsonable(d):
    return {k: (_jsonable(v) if isinstance(v, dict) else v) for k, v in d.items()
            if v is None or isinstance(v, (str, int, float, bool, dict, list))}


# --- a pair scorer: one logit, binary cross-entropy ------------------------------------------

def binary_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, pos_weight: float | None = None) -> torch.Tensor:
    """The mean of -(w y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))) over pairs (the module docstring)."""
    weight = None if pos_weight is None else torch.tensor(float(pos_weight), device=logits.device)
    return F.binary_cross_entropy_with_logits(logits.reshape(-1).float(), labels.reshape(-1).float(),
                                              pos_weight=weight)


class WeightedPairs(torch.nn.Module):
    """The one-logit sequence classifier with the loss above (positives weighted): what the loop trains."""

    def __init__(self, model: BertForSequenceClassification, pos_weight: float | None):
        super().__init__()
        self.model, self.pos_weight = model, pos_weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        loss = None if labels is None else binary_cross_entropy(out.logits, labels, self.pos_weight)
        return HeadOutput(loss, out.logits)


def pair_features(tok, pairs: list, max_length: int) -> list[dict]:
    """One feature per (query, passage, label): [CLS] query [SEP] passage [SEP], the longer cut first."""
    out = []
    for query, passage, label in pairs:
        enc = tok.encode(query, passage, max_length=max_length, truncation_strategy="longest_first")
        out.append({"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "labels": [float(label)]})
    return out


def train_pair_scorer(cfg, pairs: list, pos_weight: float, info: dict, log=print, speed=None):
    """A one-logit head on cfg.model trained on (query, passage, label) `pairs` through the one run harness
    and saved in cfg.output with `info` as its bertkit_task.json; the trainer's result."""
    tok = load_tokenizer(cfg.model, cfg.max_length)
    if cut := cut_count(tok, [TextExample(query, passage) for query, passage, _ in pairs], cfg.max_length, 0):
        log(f"{cut} of {len(pairs)} (query, passage) pairs are longer than --max-length {cfg.max_length} tokens and "
            "are cut there, longest side first")
    head = load_head(BertForSequenceClassification, cfg.model, cfg.training.seed, log, problem_type=MULTI_LABEL,
                     num_labels=1, id2label={0: RELEVANT}, label2id={RELEVANT: 0})
    save = saver(Path(cfg.output), tok, info)
    return train(WeightedPairs(head, pos_weight), pair_features(tok, pairs, cfg.max_length), cfg.training,
                 save=lambda m: save(m.model), output_dir=Path(cfg.output), pad_id=tok.pad_token_id,
                 run_config=_jsonable(asdict(cfg)), log=log, speed=speed)
