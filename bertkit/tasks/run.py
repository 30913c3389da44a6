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

from bertkit.model.checkpoint import TASK_FILE
from bertkit.runtime.loading import class_for
from bertkit.text.tokenizer import Tokenizer


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
