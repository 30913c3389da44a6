"""Fine-tuning BERT on labelled data: one module per task around one training loop.

    data.py            reading TSV/CSV/JSONL tables, CoNLL columns, SQuAD JSON (counted skips)
    trainer.py         the loop: AdamW + warm-up/decay, length-grouped dynamic batches, eval, best epoch
    classification.py  sentences and pairs -> labels, scores, label sets (GLUE-style)
    ner.py             words -> tags (CoNLL), labels on each word's first piece
    qa.py              question + context -> answer span (SQuAD), sliding windows, n-best
    metrics.py         accuracy/F1, Pearson/Spearman, conlleval entity F1, SQuAD EM/F1
    predict.py         using a fine-tuned output directory
    run.py             loading a fresh head, saving checkpoints and results

`finetune(task, train=..., output=..., dev=..., **options)` is the one-call
Python API (the CLI's `bertkit finetune TASK`); `bertkit.predict` uses the result.
Nothing here imports torch until a function runs.
"""


def finetune(task: str, *, train: str, output: str, dev: str | None = None, training=None, log=print, **options) -> dict:
    """Fine-tune for `task` and return the final metrics (also in OUTPUT/metrics.json).

    task: classify | pair | regression | multi_label | ner | qa; `options` are
    the fields of the task's config (TextTaskConfig, NerConfig, QAConfig), e.g.
    model=, text_column=, max_length=; `training` a TrainConfig.
    """
    from bertkit.errors import BertkitError
    from bertkit.finetune.trainer import TrainConfig

    training = training or TrainConfig()
    if task == "ner":
        from bertkit.finetune.ner import NerConfig, finetune_ner

        if training.metric == "accuracy":
            training.metric = "f1"
        return finetune_ner(NerConfig(train=train, dev=dev, output=output, training=training, **options), log=log)
    if task == "qa":
        from bertkit.finetune.qa import QAConfig, finetune_qa

        if training.metric == "accuracy":
            training.metric = "f1"
        return finetune_qa(QAConfig(train=train, dev=dev, output=output, training=training, **options), log=log)
    from bertkit.finetune.classification import TASKS, TextTaskConfig, finetune_text

    if task not in TASKS:
        raise BertkitError(f"unknown task {task!r}: choose one of {', '.join(TASKS + ('ner', 'qa'))}")
    return finetune_text(TextTaskConfig(train=train, dev=dev, output=output, task=task, training=training, **options),
                         log=log)
