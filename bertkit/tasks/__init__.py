"""Fine-tuning BERT on labelled data and using the result: one record per task around the one training loop.

    registry.py        the tasks, defined once: one record each (settings, head, prediction, report, routes...)
    config.py          the settings of a run (typed dataclasses; the CLI's options are built from them)
    trainer.py         fine-tuning's side of bertkit.training.loop: batches per epoch, the best epoch
    run.py             loading a fresh head, saving checkpoints and results
    batching.py        features in padded batches; a model run over them (inference)
    classification.py  training sentences and pairs -> labels, scores, label sets (GLUE-style)
    ner.py             training words -> tags (CoNLL), labels on each word's first piece
    qa.py              training question + context -> answer span (SQuAD)
    embedding.py       sentence embeddings: pairs / triplets / scored pairs -> an encoder whose cosines rank
    static_embed.py    the same contrastive training for a static table (`finetune embed --static`)
    cross_encoder.py   a reranker: mined hard and random negatives -> one logit per (query, passage), and the
                       retrieval figures it was evaluated with
    text_inference.py, ner_inference.py, qa_inference.py
                       what using each kind of model needs: features, decoding, metrics, input files (no torch)
    predict.py         using a fine-tuned output directory (`bertkit predict`, evaluate mode)
    rerank.py          a cross-encoder re-scoring a first stage's hits
    reports.py         the readable summary of a run

Using a model (predict.py, rerank.py and the *_inference modules) imports none of
the training code. `finetune(task, train=..., output=..., dev=..., **options)` is
the one-call Python API and `run_task(config)` runs a built config (the CLI's
`bertkit finetune TASK`); `bertkit.predict` uses the result. Nothing here imports
torch until a run starts.
"""

import importlib

from bertkit.data.outputs import run_output
from bertkit.default_model import default_model_dir
from bertkit.tasks.registry import task_for, task_named


def task_config(task: str, switches: dict | None = None):
    """(config class, defaults) of a task, under the presets of the switches `switches` turns on
    (`Task.defaults_with`); `multi_label` and `multi-label` both name it."""
    record = task_named(task)
    return record.config, record.defaults_with(switches)


def finetune(task: str, *, train: str, output: str, dev: str | None = None, training=None, log=print, **options) -> dict:
    """Fine-tune for `task` and return the final metrics (also in OUTPUT/metrics.json).

    task: classify | pair | regression | multi_label | ner | qa | embed | rerank; `options` are
    the fields of the task's config (TextTaskConfig, NerConfig, QAConfig, EmbedConfig, RerankConfig), e.g.
    model=, text_column=, max_length=; `training` the loop's settings as `bertkit finetune TASK` takes them:
    None for the task's own defaults and those of the switches given (e.g. static=True), a dict of settings over
    those, as the command's flags go over them (training={"max_steps": 5, "optim": {"learning_rate": 1e-4}}),
    or a whole TrainConfig, taken as it is (its own defaults for what it does not set).
    """
    record = task_named(task)
    for name, value in options.items():
        record.check_option(name, value)
    # a length setting not given is fitted to the model by the run (None: `TaskConfig.fit`)
    settings = {**record.defaults_with(options), **dict.fromkeys(record.config.FITTED), "train": train,
                "output": output, "dev": dev, "training": record.own_training(training, options), **options}
    return run_task(record.config(**settings), log=log)


def run_task(cfg, log=print, speed=None) -> dict:
    """Run a fine-tuning config: its task's record picks the code. The settings the record checks come
    first (`Task.check`: --metric among the task's dev figures, with a --dev), then the output folder
    (`bertkit.data.outputs`: not the model's own folder; a model or run there only with --overwrite
    or --resume), locked while the run writes it (`bertkit.data.lock`). Under torchrun only the first
    process prints what the run says before training (the loop's own lines are already its alone). `speed`: the
    fast-path settings (`bertkit.runtime.fast.SpeedSettings`; None: `decide()`'s)."""
    training, task = cfg.training, task_for(cfg)
    task.check(cfg)
    # no --model is the default model's folder: -o naming it is its own source too (--overwrite cleared it)
    model = default_model_dir() if cfg.model is None else cfg.model
    with run_output(cfg.output, f"bertkit finetune {type(cfg).__name__}", overwrite=training.overwrite,
                    resume=training.resume, sources=[model], log=log) as log:
        # the run's module is imported now (it needs torch), from above it: the run modules import the registry
        module, function = task.run.split(":")
        return getattr(importlib.import_module(module), function)(cfg, log=log, speed=speed)


def format_report(final: dict) -> str:
    """The readable summary of a run's final metrics, for any task ("" on a torchrun's other processes)."""
    if not final:
        return ""
    return task_named(final["task"]).report(final)
