"""What every fine-tuning task does around the loop: load, save, write results.

A fine-tuning run starts from a pretrained encoder (the default model unless
a directory is given) with a freshly initialised task head, and ends with a
Hugging Face-format checkpoint in the output directory (config.json with the
label names, model.safetensors, vocab.txt, tokenizer_config.json) plus:

- `bertkit_task.json`: how inputs were turned into features (task, columns,
  max_length, stride...), so `bertkit predict` encodes new inputs the same way;
- `metrics.jsonl`: one JSON line per epoch (written by the loop);
- `metrics.json`: the best epoch's metrics and the reports (confusion
  matrix, per-label or per-type scores);
- a predictions file for the dev set.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from bertkit.electra import class_for
from bertkit.errors import BertkitError

TASK_FILE = "bertkit_task.json"


def load_head(cls, model_path, seed: int, log=print, **config_overrides):
    """`cls` on the pretrained encoder at `model_path` with a fresh head drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    cls = class_for(model_path, cls)  # an ELECTRA discriminator gets the ELECTRA form of the head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report below says the same in one line
        model = cls.from_pretrained(model_path, strict=False, generator=generator, **config_overrides)
    report = getattr(model, "load_report", None)
    if report is not None and getattr(report, "missing", None):
        log(f"new task head, freshly initialised: {', '.join(report.missing)}")
    return model


def load_tokenizer(model_path):
    from bertkit.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(model_path)


def saver(output_dir, tokenizer, task_info: dict):
    """The loop's `save(model)`: a full checkpoint plus the task description."""
    output_dir = Path(output_dir)

    def save(model):
        model.save_pretrained(output_dir, tokenizer=tokenizer)
        write_json(output_dir / TASK_FILE, task_info)

    return save


def write_json(path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_task_info(model_dir) -> dict:
    """The saved task description, or one inferred from config.json's architectures."""
    model_dir = Path(model_dir)
    path = model_dir / TASK_FILE
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise BertkitError(f"{model_dir} is not a model directory (no config.json); pass a fine-tuned output dir")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    arch = (config.get("architectures") or ["BertModel"])[0]
    if arch == "BertForSequenceClassification":
        problem = config.get("problem_type")
        n = config.get("num_labels", len(config.get("id2label") or {}) or 2)
        task = "regression" if problem == "regression" or n == 1 else (
            "multi_label" if problem == "multi_label_classification" else "classify")
        return {"task": task, "max_length": 512}
    if arch == "BertForTokenClassification":
        return {"task": "ner", "max_length": 512}
    if arch == "BertForQuestionAnswering":
        return {"task": "qa", "max_length": 384}
    raise BertkitError(f"{model_dir} holds a {arch}, not a fine-tuned task model; fine-tune it first")
