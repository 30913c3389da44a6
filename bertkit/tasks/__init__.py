"""Fine-tuning BERT on labelled data: one module per task around the one training loop.

    config.py          the settings of a run (typed dataclasses; the CLI's options are built from them)
    data.py            reading TSV/CSV/JSONL tables, CoNLL columns, SQuAD JSON (counted skips)
    trainer.py         fine-tuning's side of bertkit.training.loop: batches per epoch, the best epoch
    classification.py  sentences and pairs -> labels, scores, label sets (GLUE-style)
    ner.py             words -> tags (CoNLL), labels on each word's first piece
    qa.py              question + context -> answer span (SQuAD), sliding windows, n-best
    embedding.py       sentence embeddings: pairs / triplets / scored pairs -> an encoder whose cosines rank
    embedding_losses.py  multiple-negatives ranking, its cached form (GradCache), CoSENT, Matryoshka
    metrics.py         accuracy/F1, Pearson/Spearman, conlleval entity F1, SQuAD EM/F1
    predict.py         using a fine-tuned output directory
    run.py             loading a fresh head, saving checkpoints and results

`finetune(task, train=..., output=..., dev=..., **options)` is the one-call
Python API and `run_task(config)` runs a built config (the CLI's `bertkit finetune
TASK`); `bertkit.predict` uses the result. Nothing here imports torch until a
function runs.
"""

from bertkit.data.lock import first_process, folder_lock
from bertkit.data.outputs import check_output, clear_output
from bertkit.errors import BertkitError
from bertkit.tasks.config import EmbedConfig, NerConfig, QAConfig, TextTaskConfig, TrainConfig

# task name (as the CLI spells it) -> (its config class, the task's own defaults on top of the class's)
TASKS = {
    "classify": (TextTaskConfig, {"task": "classify"}),
    "pair": (TextTaskConfig, {"task": "pair", "text_column": "sentence1", "text_pair_column": "sentence2"}),
    "regression": (TextTaskConfig, {"task": "regression"}),
    "multi-label": (TextTaskConfig, {"task": "multi_label", "label_column": "labels"}),
    "ner": (NerConfig, {}),
    "qa": (QAConfig, {}),
    # the reference recipe (sentence-transformers, SciFact): 1 epoch at 2e-5
    "embed": (EmbedConfig, {"training": {"epochs": 1.0, "optim": {"learning_rate": 2e-5}}}),
}


def task_config(task: str):
    """(config class, defaults) of a task; `multi_label` and `multi-label` both name it."""
    task = task.replace("_", "-")
    if task not in TASKS:
        raise BertkitError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    return TASKS[task]


def finetune(task: str, *, train: str, output: str, dev: str | None = None, training=None, log=print, **options) -> dict:
    """Fine-tune for `task` and return the final metrics (also in OUTPUT/metrics.json).

    task: classify | pair | regression | multi_label | ner | qa | embed; `options` are
    the fields of the task's config (TextTaskConfig, NerConfig, QAConfig, EmbedConfig), e.g.
    model=, text_column=, max_length=; `training` a TrainConfig.
    """
    cls, defaults = task_config(task)
    return run_task(cls(**{**defaults, "train": train, "output": output, "dev": dev,
                      "training": training or TrainConfig(), **options}), log=log)


def run_task(cfg, log=print) -> dict:
    """Run a fine-tuning config: the one place that picks the task's code. The output folder is checked
    first (`bertkit.data.outputs`: not the model's own folder; a model or run there only with --overwrite
    or --resume) and locked while the run writes it (`bertkit.data.lock`)."""
    training = cfg.training
    check_output(cfg.output, overwrite=training.overwrite, resume=training.resume, sources=[cfg.model])
    if not first_process():
        return _run_task(cfg, log)
    with folder_lock(cfg.output, f"bertkit finetune {type(cfg).__name__}"):
        if training.overwrite and not training.resume:
            removed = clear_output(cfg.output)
            if removed:
                log(f"--overwrite: removed {', '.join(removed)} from {cfg.output}")
        return _run_task(cfg, log)


def _run_task(cfg, log) -> dict:
    if isinstance(cfg, NerConfig):
        from bertkit.tasks.ner import finetune_ner

        return finetune_ner(cfg, log=log)
    if isinstance(cfg, QAConfig):
        from bertkit.tasks.qa import finetune_qa

        return finetune_qa(cfg, log=log)
    if isinstance(cfg, EmbedConfig):
        from bertkit.tasks.embedding import finetune_embed

        return finetune_embed(cfg, log=log)
    from bertkit.tasks.classification import finetune_text

    return finetune_text(cfg, log=log)


def format_report(final: dict) -> str:
    """The readable summary of a run's final metrics, for any task ("" on a torchrun's other processes)."""
    if not final:
        return ""
    if final.get("task") == "ner":
        from bertkit.tasks.ner import format_ner_report

        return format_ner_report(final)
    if final.get("task") == "qa":
        dev = final.get("dev")
        return f"dev: exact match {dev['exact_match']:.2f}, F1 {dev['f1']:.2f}" if dev else "trained (no dev set)"
    if final.get("task") == "embed":
        from bertkit.tasks.embedding import format_report as embed_report

        return embed_report(final)
    from bertkit.tasks.classification import format_report as text_report

    return text_report(final)
