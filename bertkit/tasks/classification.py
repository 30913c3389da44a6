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
text is truncated, as in the paper. Pairs are always truncated (longest first).

Shapes: logits per example (num_labels,) or (1,) for regression.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError
from bertkit.metrics import tasks as M
from bertkit.tasks.config import TEXT_TASKS, TextTaskConfig
from bertkit.data.tables import TextExample, check_known_labels, label_names, looks_like_scores, read_text_examples
from bertkit.tasks.run import load_head, load_tokenizer, saver, write_json
from bertkit.tasks.trainer import run_model, train
from bertkit.model.heads import BertForSequenceClassification

TASKS = TEXT_TASKS
PROBLEM_TYPES = {
    "classify": "single_label_classification",
    "pair": "single_label_classification",
    "regression": "regression",
    "multi_label": "multi_label_classification",
}
BEST_METRIC = {"classify": "accuracy", "pair": "accuracy", "regression": "pearson", "multi_label": "micro_f1"}


# --- features --------------------------------------------------------------

def encode_text(tok, text: str, pair: str | None, max_length: int, stride: int) -> list:
    """The Encodings of one example: one, or several windows when stride > 0."""
    if pair is not None:
        return [tok.encode(text, pair, max_length=max_length, truncation_strategy="longest_first")]
    enc = tok.encode(text, max_length=max_length, stride=stride, return_overflowing=stride > 0)
    return [enc, *enc.overflowing] if stride > 0 else [enc]


def label_value(label, task: str, label2id: dict | None):
    if task == "regression":
        return float(label)
    if task == "multi_label":
        vec = [0.0] * len(label2id)
        for name in label:
            vec[label2id[name]] = 1.0
        return vec
    return label2id[label]


def make_features(tok, examples: list[TextExample], task: str, label2id, max_length: int, stride: int) -> list[dict]:
    """One feature dict per window; `example_index` ties windows to their example."""
    feats = []
    for i, ex in enumerate(examples):
        for enc in encode_text(tok, ex.text, ex.text_pair, max_length, stride):
            f = {"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "example_index": i}
            if ex.label is not None:
                f["labels"] = label_value(ex.label, task, label2id)
            feats.append(f)
    return feats


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


def decode(logits: np.ndarray, task: str, names: list[str] | None) -> list[dict]:
    """Per-example predictions from pooled logits: label + probabilities, or a score."""
    if task == "regression":
        return [{"score": float(v[0])} for v in logits]
    if task == "multi_label":
        probs = sigmoid(logits)
        return [{"labels": [names[j] for j in np.flatnonzero(p > 0.5)],
                 "probabilities": {names[j]: float(p[j]) for j in range(len(names))}} for p in probs]
    probs = softmax(logits)
    return [{"label": names[int(p.argmax())], "label_id": int(p.argmax()),
             "probabilities": {names[j]: float(p[j]) for j in range(len(names))}} for p in probs]


def held_out_loss(preds: list[dict], examples: list[TextExample], task: str, names: list[str] | None) -> float:
    """The loss the head trains with, on held-out examples: cross-entropy of the gold label's
    probability (classification), binary cross-entropy per label (multi-label), or the squared
    error (regression). What breaks a tie in the task metric (`bertkit.tasks.trainer.better`)."""
    if task == "regression":
        return float(np.mean([(p["score"] - float(ex.label)) ** 2 for p, ex in zip(preds, examples)]))
    tiny = 1e-12  # a probability rounded to 0 or 1 in float32 costs a large, finite loss
    if task == "multi_label":
        losses = [-np.log(max(q, tiny)) if name in ex.label else -np.log(max(1.0 - q, tiny))
                  for p, ex in zip(preds, examples) for name, q in p["probabilities"].items()]
        return float(np.mean(losses))
    return float(np.mean([-np.log(max(p["probabilities"][ex.label], tiny)) for p, ex in zip(preds, examples)]))


def score(preds: list[dict], examples: list[TextExample], task: str, names: list[str] | None, full=False) -> dict:
    """The task's metrics and its `held_out_loss`; `full` adds the per-label report and the confusion matrix."""
    # a constant predictor (the trivial baseline) gives no probabilities, so no loss
    scored = task == "regression" or all("probabilities" in p for p in preds)
    loss = {"held_out_loss": held_out_loss(preds, examples, task, names)} if scored else {}
    if task == "regression":
        x = [p["score"] for p in preds]
        y = [float(ex.label) for ex in examples]
        return {"pearson": M.pearson(x, y), "spearman": M.spearman(x, y),
                "mse": float(np.mean((np.array(x) - np.array(y)) ** 2)), **loss}
    if task == "multi_label":
        return {**M.multilabel_scores([p["labels"] for p in preds], [ex.label for ex in examples]), **loss}
    label2id = {n: i for i, n in enumerate(names)}
    p = [q["label_id"] for q in preds]
    y = [label2id[ex.label] for ex in examples]
    out = {"accuracy": M.accuracy(p, y), **loss}
    report = M.per_label_report(p, y, names)
    out["macro_f1"] = report.pop("macro_f1")
    if len(names) == 2:
        out["f1"] = M.f1_binary(p, y, positive=1)  # of the second label (GLUE: 1 = paraphrase)
    if full:
        out["per_label"] = report
        out["confusion_matrix"] = {"labels": names, "rows_gold_columns_predicted": M.confusion_matrix(p, y, len(names))}
    return out


def predict_examples(model, tok, examples, task, names, max_length, stride, batch_size=64, progress=False):
    feats = make_features(tok, [TextExample(e.text, e.text_pair) for e in examples], task, None, max_length, stride)
    logits = run_model(model, feats, batch_size, progress=progress)["logits"]
    return decode(pool_windows(logits, feats, len(examples)), task, names)


# --- the run ---------------------------------------------------------------

def read_split(cfg: TextTaskConfig, path, max_examples, log):
    task = "regression" if cfg.task == "regression" else ("multi_label" if cfg.task == "multi_label" else "classification")
    examples, report = read_text_examples(
        path, text_column=cfg.text_column, text_pair_column=cfg.text_pair_column, label_column=cfg.label_column,
        task=task, label_separator=cfg.label_separator, max_examples=max_examples)
    log(report.summary())
    return examples


def write_predictions(path, examples, preds, task) -> None:
    with open(path, "w", encoding="utf-8") as f:
        pair = any(e.text_pair is not None for e in examples)
        head = ["text"] + (["text_pair"] if pair else []) + ["gold", "predicted", "probabilities" if task != "regression" else "score"]
        f.write("\t".join(head) + "\n")
        for e, p in zip(examples, preds):
            gold = ",".join(e.label) if isinstance(e.label, list) else str(e.label)
            if task == "regression":
                pred, extra = f"{p['score']:.4f}", f"{p['score']:.4f}"
            else:
                pred = ",".join(p["labels"]) if task == "multi_label" else p["label"]
                extra = " ".join(f"{k}={v:.4f}" for k, v in p["probabilities"].items())
            row = [e.text] + ([e.text_pair or ""] if pair else []) + [gold, pred, extra]
            f.write("\t".join(x.replace("\t", " ").replace("\n", " ") for x in row) + "\n")


def finetune_text(cfg: TextTaskConfig, log=print) -> dict:
    """Fine-tune on cfg.train, evaluate on cfg.dev each epoch, save the best; returns its metrics."""
    cfg.validate()
    tcfg = cfg.training
    tcfg.metric = tcfg.metric or BEST_METRIC[cfg.task]
    train_ex = read_split(cfg, cfg.train, cfg.max_train_examples, log)
    dev_ex = read_split(cfg, cfg.dev, cfg.max_dev_examples, log) if cfg.dev else None
    names = None
    overrides = {"problem_type": PROBLEM_TYPES[cfg.task], "classifier_pooling": cfg.pooling}
    if cfg.task == "regression":
        overrides["num_labels"] = 1
        label2id = None
    else:
        names = label_names(e.label for e in train_ex)
        if len(names) < 2 and cfg.task != "multi_label":
            raise BertkitError(f"{cfg.train}: only one label ({names}) in the training data; a classifier needs two or more")
        if cfg.task != "multi_label" and looks_like_scores(names):
            warnings.warn(f"{cfg.train}: the labels are numbers with fractions ({', '.join(names[:4])}"
                          f"{', ...' if len(names) > 4 else ''}): each distinct value becomes one of {len(names)} "
                          "classes; for a score, use bertkit finetune regression", stacklevel=2)
        label2id = {n: i for i, n in enumerate(names)}
        if dev_ex:
            check_known_labels((e.label for e in dev_ex), label2id, f"{cfg.dev}")
        overrides.update(num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id)
    log(f"task {cfg.task}: {len(train_ex)} training examples" + (f", labels {names}" if names else ""))

    tok = load_tokenizer(cfg.model)
    model = load_head(BertForSequenceClassification, cfg.model, tcfg.seed, log, **overrides)
    train_feats = make_features(tok, train_ex, cfg.task, label2id, cfg.max_length, cfg.stride)
    if len(train_feats) > len(train_ex):
        log(f"{len(train_feats) - len(train_ex)} extra windows for texts longer than max_length={cfg.max_length}")
    dev_feats = make_features(tok, dev_ex, cfg.task, label2id, cfg.max_length, cfg.stride) if dev_ex else None

    def decode_dev(m):
        logits = run_model(m, dev_feats, tcfg.eval_batch_size, progress=tcfg.progress, desc="eval")["logits"]
        return decode(pool_windows(logits, dev_feats, len(dev_ex)), cfg.task, names)

    def evaluate(m):
        preds = decode_dev(m)
        return score(preds, dev_ex, cfg.task, names), preds

    info = {"task": cfg.task, "max_length": cfg.max_length, "stride": cfg.stride,
            "text_column": cfg.text_column, "text_pair_column": cfg.text_pair_column,
            "label_column": cfg.label_column, "label_separator": cfg.label_separator,
            "config": _jsonable(asdict(cfg))}
    out = Path(cfg.output)
    baseline = trivial_baseline(cfg.task, train_ex, dev_ex, names, tcfg.metric) if dev_ex else None
    result = train(model, train_feats, tcfg, evaluate=evaluate if dev_ex else None, baseline=baseline,
                   save=saver(out, tok, info), output_dir=out, pad_id=tok.pad_token_id, run_config=asdict(cfg), log=log)
    if not result.is_main:
        return {}
    final = {"task": cfg.task, "train_examples": len(train_ex), "train_seconds": round(result.seconds, 1),
             "epochs": result.history}
    if result.best is not None:  # which epoch the saved model is, and why (`bertkit.tasks.trainer.better`)
        final["saved"] = {"epoch": result.best["epoch"], "because": result.best["saved_because"]}
    if dev_ex:
        preds = result.best_predictions or decode_dev(model)  # a resumed run may lack them
        final["dev"] = score(preds, dev_ex, cfg.task, names, full=True)
        final["dev_examples"] = len(dev_ex)
        write_predictions(out / "dev_predictions.tsv", dev_ex, preds, cfg.task)
    write_json(out / "metrics.json", final)
    return final


def trivial_baseline(task: str, train_ex, dev_ex, names, metric: str) -> tuple[float, str] | None:
    """(the dev `metric` of a predictor that ignores its input, what it predicts), None for other metrics."""
    if task == "regression":
        mean = float(np.mean([float(e.label) for e in train_ex]))
        pred, what = {"score": mean}, f"always the mean {mean:.3g}"
    elif task == "multi_label":
        pred, what = {"labels": []}, "no labels"
    else:
        labels = [e.label for e in train_ex]
        majority = max(names, key=labels.count)
        pred, what = {"label": majority, "label_id": names.index(majority)}, f"always the majority class {majority!r}"
    if metric in ("pearson", "spearman"):  # undefined for a constant: no correlation
        return 0.0, "a constant score"
    value = score([pred] * len(dev_ex), dev_ex, task, names).get(metric)
    return None if value is None else (value, what)


def _jsonable(d):
    return {k: (_jsonable(v) if isinstance(v, dict) else v) for k, v in d.items()
            if v is None or isinstance(v, (str, int, float, bool, dict, list))}


def format_report(final: dict) -> str:
    """A readable summary: the metrics, per-label scores and the confusion matrix."""
    dev = final.get("dev")
    if not dev:
        return f"trained on {final['train_examples']} examples in {final['train_seconds']} s (no dev set)"
    lines = [f"dev ({final['dev_examples']} examples): " + ", ".join(
        f"{k} {v:.4f}" for k, v in dev.items() if isinstance(v, float))]
    if "per_label" in dev:
        lines.append(f"{'label':>16} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>7}")
        for name, r in dev["per_label"].items():
            lines.append(f"{name:>16} {r['precision']:9.3f} {r['recall']:7.3f} {r['f1']:7.3f} {r['support']:7d}")
        cm = dev["confusion_matrix"]
        w = max(8, *(len(n) for n in cm["labels"])) + 1
        lines.append("confusion matrix (rows: gold, columns: predicted)")
        lines.append(" " * w + "".join(f"{n:>{w}}" for n in cm["labels"]))
        for n, row in zip(cm["labels"], cm["rows_gold_columns_predicted"]):
            lines.append(f"{n:>{w}}" + "".join(f"{c:>{w}}" for c in row))
    return "\n".join(lines)

