"""Using a fine-tuned model: `predict(model_dir, texts)` and `bertkit predict`.

The output directory of `bertkit finetune` is a Hugging Face checkpoint plus
`bertkit_task.json`, which says how inputs were encoded (task, max_length,
stride, columns). Prediction loads both and encodes new inputs the same way:

- classify / pair / multi_label: {"label", "probabilities": {name: p}} (or
  {"labels", ...}); regression: {"score"};
- ner: each text is split on whitespace into words -> {"words", "tags"};
- qa: `texts` are questions and `pairs` their contexts -> {"answer", "start", "end", "score"}.

A checkpoint without `bertkit_task.json` (e.g. one made by transformers) is
read from its config.json `architectures`.

Evaluate mode: when the input file carries the answers (a label column for the
text tasks, a tag column in a CoNLL file, answers in SQuAD JSON), `predict_file`
also scores the predictions with the task's metrics (`finetune.metrics`):
accuracy and F1 for classification, Pearson and Spearman for regression, micro
F1 for multi-label, entity F1 for NER, exact match and F1 for QA.

The model is loaded by `bertkit.runtime.loading` on `device` (auto, cpu, cuda) in `dtype`
(float32, bfloat16, auto), int8 if asked.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

from typing import NamedTuple

from bertkit.errors import BertkitError
from bertkit.metrics import tasks as M
from bertkit.tasks.classification import predict_examples, score as score_text
from bertkit.data.tables import (ReadReport, TextExample, check_known_labels, read_conll, read_rows, read_squad,
                                 read_text_examples)
from bertkit.runtime.loading import Loaded, load
from bertkit.data.textfiles import existing_file, open_text, read_text
from bertkit.tasks.ner import predict_words
from bertkit.tasks.qa import predict_answers


def load_task_model(model_dir, device=None, dtype=None, int8: bool = False) -> Loaded:
    """A fine-tuned output directory loaded for prediction (`bertkit.runtime.loading.load`, head "task"):
    on `device` in `dtype` (None: auto, float32); int8: the encoder's dense layers quantized (CPU).
    A directory saved by `bertkit.runtime.quantization.save_quantized` loads as int8 whatever `int8` says."""
    return load(model_dir, head="task", device=device, dtype=dtype, int8=int8)


def predict(model_dir, texts, pairs=None, *, batch_size: int = 32, loaded=None, device=None,
            dtype=None, int8: bool = False) -> list[dict]:
    """Predictions for `texts` (and `pairs`, the second texts or QA contexts), one dict each.
    device: auto (None), cpu or cuda; dtype: float32 (None) or bfloat16; int8: int8 dense layers."""
    if isinstance(texts, str):
        raise BertkitError("predict takes a list of texts; wrap a single text in a list")
    texts = list(texts)
    if pairs is not None:
        pairs = list(pairs)
        if len(pairs) != len(texts):
            raise BertkitError(f"{len(texts)} texts but {len(pairs)} pairs; give one second text per text")
    loaded = loaded or load_task_model(model_dir, device, dtype, int8)
    model, tok, info = loaded.model, loaded.tokenizer, loaded.info
    task = info["task"]
    if task == "ner":
        sentences = [t.split() for t in texts]
        tags = predict_words(model, tok, sentences, info, batch_size)
        return [{"words": w, "tags": t} for w, t in zip(sentences, tags)]
    if task == "qa":
        if pairs is None:
            raise BertkitError("a QA model needs contexts: pass pairs=[context, ...] (one per question)")
        return predict_answers(model, tok, texts, pairs, info, batch_size)

    if info.get("text_pair_column") and pairs is None:
        raise BertkitError("this model was trained on sentence pairs: pass pairs=[second text, ...]")
    examples = [TextExample(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    names = model.config.labels if task != "regression" else None
    return predict_examples(model, tok, examples, task, names, info.get("max_length", 512), info.get("stride", 0),
                            batch_size)


# --- files -----------------------------------------------------------------

def read_inputs(path, info: dict, text_column=None, text_pair_column=None) -> tuple[list[str], list[str] | None]:
    """Texts (and pairs) from an input file, with the columns the model was trained on."""
    path = existing_file(path)
    task = info["task"]
    if task == "ner" and path.suffix.lower() not in (".tsv", ".csv", ".jsonl", ".json"):
        if looks_like_conll(path):  # one token per line (first column), blank lines between sentences
            sentences, _ = read_conll(path, tagged=False)
            return [" ".join(s.words) for s in sentences], None
        lines = [line.strip() for line in read_text(path).split("\n")]
        return [line for line in lines if line], None  # one sentence per line, words split on whitespace
    if task == "qa" and path.suffix.lower() == ".json":
        examples, _ = read_squad(path)
        return [e.question for e in examples], [e.context for e in examples]
    tcol = text_column or (info.get("text_column") or "sentence")
    pcol = text_pair_column or info.get("text_pair_column")
    if task == "qa":
        tcol, pcol = text_column or "question", text_pair_column or "context"
    if not pcol and one_per_line(path, tcol):
        return [line.strip() for line in read_text(path).split("\n") if line.strip()], None
    report = ReadReport(str(path))
    texts, pairs = [], []
    for n, row in read_rows(path, report):
        if tcol not in row or (pcol and pcol not in row):
            missing = tcol if tcol not in row else pcol
            raise BertkitError(f"{path}:{n}: no column {missing!r} (columns: {', '.join(row)}); pass --text-column/--text-pair-column")
        texts.append(str(row[tcol]))
        if pcol:
            pairs.append(str(row[pcol]))
    if report.skipped:
        print(report.summary())
    return texts, (pairs if pcol else None)


def one_per_line(path: Path, column: str) -> bool:
    """A .txt file whose first line is not a header naming `column` holds one text per line, as
    `bertkit embed` reads it (a .txt with such a header is a TSV table)."""
    if path.suffix.lower() != ".txt":
        return False
    with open_text(path) as f:
        first = f.readline()
    return column not in [cell.strip() for cell in first.rstrip("\r\n").split("\t")]


def looks_like_conll(path) -> bool:
    """CoNLL columns start with -DOCSTART- or have blank lines between sentences; else one sentence per line."""
    text = read_text(path)
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    return text.lstrip().startswith("-DOCSTART-") or len(blocks) > 1


# --- evaluate mode: a labelled file ------------------------------------------

TEXT_TASKS = {"classify": "classification", "pair": "classification", "regression": "regression",
              "multi_label": "multi_label"}


def read_labelled(path, info: dict, text_column=None, text_pair_column=None, label_column=None):
    """(texts, pairs, references) from a file that carries the answers, or None when it does not.

    References: TextExamples (text tasks), gold tag lists (NER, in the file's scheme) or
    QAExamples (QA), in the order of the texts.
    """
    path = Path(path)
    task = info["task"]
    if task == "qa":
        if path.suffix.lower() != ".json":
            return None
        examples, _ = read_squad(path)
        if not any(e.answers or e.is_impossible for e in examples):
            return None
        return [e.question for e in examples], [e.context for e in examples], examples
    if task == "ner":
        if path.suffix.lower() in (".tsv", ".csv", ".jsonl", ".json") or not _has_tag_column(path):
            return None
        sentences, _ = read_conll(path)
        return [" ".join(s.words) for s in sentences], None, [s.tags for s in sentences]
    lcol = label_column or info.get("label_column") or ("labels" if task == "multi_label" else "label")
    if lcol not in _first_row(path):
        return None
    tcol = text_column or info.get("text_column") or "sentence"
    pcol = text_pair_column or info.get("text_pair_column")
    examples, report = read_text_examples(path, text_column=tcol, text_pair_column=pcol, label_column=lcol,
                                          task=TEXT_TASKS.get(task, "classification"),
                                          label_separator=info.get("label_separator", ","))
    if report.skipped:
        print(report.summary())
    pairs = [e.text_pair for e in examples] if pcol else None
    return [e.text for e in examples], pairs, examples


def _first_row(path) -> dict:
    for _, row in read_rows(path, ReadReport(str(path))):
        return row
    return {}


def _has_tag_column(path) -> bool:
    """A CoNLL file whose first token line has a second column (the tag) is labelled."""
    if not looks_like_conll(path):
        return False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("-DOCSTART-"):
                return len(line.split()) >= 2
    return False


def score_predictions(preds: list[dict], references, info: dict, names=None) -> dict:
    """The task's metrics for predictions against the references of `read_labelled`."""
    task = info["task"]
    if task == "ner":
        return M.entity_scores([p["tags"] for p in preds], references)
    if task == "qa":
        refs = {e.id: [text for text, _ in e.answers] for e in references}
        return M.squad_scores({e.id: p["answer"] for e, p in zip(references, preds)}, refs,
                              v2=bool(info.get("version_2")))
    kind = TEXT_TASKS.get(task, "classification")
    if kind != "regression":
        check_known_labels([e.label for e in references], {n: i for i, n in enumerate(names)}, "the input file")
    return score_text(preds, references, kind, names)


def format_metrics(metrics: dict) -> str:
    """`name value` for every number of a metrics dict (nested reports left out)."""
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, (int, float)) and k != "support")


class FileResult(NamedTuple):
    path: Path | str  # the predictions TSV ("-": standard output)
    count: int  # predictions written
    metrics: dict | None  # evaluate mode's scores, None when the file carries no answers
    precision: str = "float32"  # what the model computed in (`Loaded.precision`)


def default_output(input_path, folder=".") -> Path:
    """Where predictions go when no output is named: INPUT's name with .predictions.tsv, in `folder`
    (the current directory), never next to the input (a data folder is the user's) and never over an
    existing file: dev.predictions.tsv, else dev.predictions-2.tsv, -3, ..."""
    stem = Path(input_path).with_suffix("").name
    out = Path(folder) / f"{stem}.predictions.tsv"
    n = 2
    while out.exists():
        out = Path(folder) / f"{stem}.predictions-{n}.tsv"
        n += 1
    return out


@contextmanager
def _output(path):
    """The predictions' file, or standard output for "-"."""
    if str(path) == "-":
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8") as f:
        yield f


def predict_file(model_dir, input_path, output_path=None, *, text_column=None, text_pair_column=None,
                 label_column=None, batch_size: int = 32, evaluate: bool | None = None, device=None,
                 dtype=None, int8: bool = False) -> FileResult:
    """Write one prediction per input row as TSV (text, prediction, details) to `output_path` ("-":
    standard output; None: `default_output`, in the current directory); with the answers in the file
    (evaluate None: whenever they are there; True: required; False: never) also score them."""
    loaded = load_task_model(model_dir, device, dtype, int8)
    info = loaded.info
    labelled = read_labelled(input_path, info, text_column, text_pair_column, label_column) if evaluate is not False else None
    if evaluate and labelled is None:
        raise BertkitError(f"{input_path} carries no answers to evaluate against ({_what_answers(info)}); "
                           "drop --evaluate to only predict")
    if labelled is not None:
        texts, pairs, references = labelled
    else:
        texts, pairs = read_inputs(input_path, info, text_column, text_pair_column)
    if not texts:
        raise BertkitError(f"{input_path}: no inputs to predict")
    preds = predict(model_dir, texts, pairs, batch_size=batch_size, loaded=loaded)
    scores = None
    if labelled is not None:
        names = loaded.config.labels if info["task"] != "regression" else None
        scores = score_predictions(preds, references, info, names)
    out = default_output(input_path) if output_path is None else output_path
    out = out if str(out) == "-" else Path(out)
    with _output(out) as f:
        f.write("text\tprediction\tdetails\n")
        for t, p in zip(texts, preds):
            if "tags" in p:
                pred, details = " ".join(p["tags"]), ""
            elif "answer" in p:
                pred, details = p["answer"], json.dumps({k: p[k] for k in ("start", "end", "score")})
            elif "score" in p:
                pred, details = f"{p['score']:.4f}", ""
            else:
                pred = p["label"] if "label" in p else ",".join(p["labels"])
                details = " ".join(f"{k}={v:.4f}" for k, v in p["probabilities"].items())
            f.write("\t".join(x.replace("\t", " ").replace("\n", " ") for x in (t, pred, details)) + "\n")
    return FileResult(out, len(preds), scores, loaded.precision)


def _what_answers(info: dict) -> str:
    task = info["task"]
    if task == "ner":
        return "a CoNLL file with a tag column"
    if task == "qa":
        return "SQuAD JSON with answers"
    return f"a {info.get('label_column') or 'label'!r} column"
