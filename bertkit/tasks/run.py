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

import warnings
from pathlib import Path

import torch

from bertkit.data import atomic
from bertkit.model.checkpoint import architecture, resolve, save_task_info
from bertkit.runtime.loading import check_length, class_for, encoder_dir, max_positions, need_transformer
from bertkit.text.tokenizer import Tokenizer


def load_head(cls, model_path, seed: int, log=print, **config_overrides):
    """`cls` on the pretrained encoder at `model_path` with a fresh head drawn from `seed`; a model fine-tuned
    for the same task and labels keeps its head (continued fine-tuning), one trained for other labels (or
    another problem type) gets a fresh one, as the bare encoder would."""
    generator = torch.Generator().manual_seed(seed)
    where = encoder_dir(model_path)  # an older sentence-transformers folder: its 0_Transformer
    cls = class_for(where, cls)  # an ELECTRA discriminator gets the ELECTRA form of the head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report below says the same in one line
        model = cls.from_pretrained(where, strict=False, generator=generator, **config_overrides)
    report = getattr(model, "load_report", None)
    fresh = [] if report is None else report.missing + [m.partition(":")[0] for m in report.mismatched]
    other = "" if fresh else trained_for_other(where, model)
    if other:
        fresh_head(model, seed)
        fresh = head_names(model)
    if fresh:
        why = f" ({model_path}'s head was trained for {other})" if other else ""
        log(f"new task head, freshly initialised: {', '.join(fresh)}{why}")
    return model


def trained_for_other(model_path, model) -> str:
    """What the head saved at `model_path` was trained for (its problem type and labels), when that is not
    what `model`'s config asks; "" when it is the same (or no such head is there)."""
    directory = resolve(model_path)
    if architecture(directory) != type(model).__name__:
        return ""
    start, now = type(model).config_class.from_pretrained(directory), model.config
    if start.labels != now.labels:
        return f"the labels {start.labels}"
    if start.problem_type and now.problem_type and start.problem_type != now.problem_type:
        return f"the problem type {start.problem_type}"
    return ""


def head_names(model) -> list[str]:
    """The parameters of `model` outside its encoder (`base_model_prefix`): the task head."""
    return [n for n, _ in model.named_parameters() if not n.startswith(model.base_model_prefix + ".")]


def fresh_head(model, seed: int) -> None:
    """Give `model` the head a model of its class and config draws from `seed` (what a bare encoder's run
    starts with: the head's weights are drawn after the encoder's from the same generator)."""
    new = dict(type(model)(model.config, generator=torch.Generator().manual_seed(seed)).named_parameters())
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in head_names(model):
            params[name].copy_(new[name])


def fit_length(cfg, log=print) -> None:
    """The config's settings not given fitted to the model (`cfg.fit`: a default max_length above the model's
    positions is cut to them, said in one line); the model's config.json is read only when a setting waits for it."""
    note = cfg.fit(max_positions(cfg.model) if cfg.max_length is None else None)
    if note:
        log(note)


def settle(cfg, log=print):
    """A run's config fitted to its model (`fit_length`), then checked (`cfg.validate`)."""
    fit_length(cfg, log)
    return cfg.validate()


def load_tokenizer(model_path, max_length: int | None = None):
    """The vocabulary of the model a run fine-tunes (the first thing a task reads of it), once the run's
    max_length fits the model's positions."""
    need_transformer(model_path, "fine-tuning")
    if max_length is not None:
        check_length(model_path, max_length)
    return Tokenizer.from_pretrained(encoder_dir(model_path))


def saver(output_dir, tokenizer, task_info: dict):
    """The loop's `save(model)`: a full checkpoint plus the task description (`as_one`)."""
    output_dir = Path(output_dir)

    def save(model):
        model.save_pretrained(output_dir, tokenizer=tokenizer)
        save_task_info(output_dir, task_info)

    return as_one(output_dir, save)


def as_one(output_dir, save):
    """save(model), its files in `output_dir` replacing the last save's together (`bertkit.data.atomic.saving`):
    each better epoch is saved over the last, and a stop between two of its files left a folder that loaded as
    neither model (a new config.json beside the last weights, a model's task file beside another's)."""

    def whole(model):
        with atomic.saving(output_dir):
            return save(model)

    return whole


def write_json(path, data) -> None:
    """A run's JSON (metrics.json), written atomically, non-ASCII text as it is; strict JSON (a NaN raises: an
    undefined figure is None, null, as strict readers require)."""
    atomic.write_json(path, data, ensure_ascii=False, allow_nan=False)


def write_lines(path, lines) -> None:
    """A run's dev predictions (the texts of `lines`), written whole or not at all: streamed into the output
    folder, a kill or a full disk at the end of a run left the first k rows, a file that read as whole."""
    atomic.write_lines(path, lines)
