"""Distil a fine-tuned model into fewer layers: the student learns the teacher's logits.

DistilBERT (Sanh et al. 2019) trains its student on the teacher's soft outputs, Hinton et
al. (2015)'s knowledge distillation: both logits divided by a temperature T > 1 (softer
distributions carry how much the teacher prefers each wrong class), the KL divergence between
them scaled by T^2 (the soft gradients shrink as 1/T^2; this keeps them on the scale of the
hard loss), plus the ordinary loss on the labels where the data has them:

    single-label classes (classify, pair; ner per token):
        soft = T^2 KL(softmax(z_t / T) || softmax(z_s / T))                     mean over rows
    multi-label (a sigmoid per label):
        soft = T^2 mean_k KL(Bernoulli(sigmoid(z_t,k / T)) || Bernoulli(sigmoid(z_s,k / T)))
    regression (one score, no distribution to soften):
        soft = mean (z_s - z_t)^2
    loss = a * soft + (1 - a) * the head's own loss on the labels      (a = --soft-weight; soft alone without labels)

A row is an example's logits [C], or for a token classifier each real token's [C] (padding
left out). The data is read by the teacher's task as `bertkit predict` reads a file (its record
in `bertkit.tasks.registry`: `read_labelled`, else `read_inputs`) and encoded as the teacher
was trained (bertkit_task.json: max length, stride, columns) into the task's own training
features (`Task.features`). The teacher runs once, in float32, over them: its logits ride in
each feature as `teacher_logits`, so an epoch costs only the student. Training goes through
the one loop (`bertkit.tasks.trainer.train`); the student is saved with the teacher's
bertkit_task.json (with `distilled_from`: the teacher's folder and the layers kept), so `predict`, `serve` and
`evaluate` take it unchanged.

Shapes: B inputs, T tokens, C classes (1 for regression).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.distill.student import StudentOutput, student_from
from bertkit.errors import BertkitError
from bertkit.tasks.predict import feature_logits, task_of
from bertkit.tasks.run import saver
from bertkit.tasks.trainer import train


def soft_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 2.0,
              kind: str = "single_label_classification", mask: torch.Tensor | None = None) -> torch.Tensor:
    """The soft term (module docstring) between logits [B, C] (or [B, T, C] with `mask` [B, T]: real tokens)."""
    s, t = student.float(), teacher.float()
    if mask is not None:
        keep = mask.bool()
        s, t = s[keep], t[keep]  # [rows, C]
    if kind == "regression":
        return F.mse_loss(s, t)
    zs, zt = s / temperature, t / temperature
    if kind == "multi_label_classification":
        p = torch.sigmoid(zt)
        kl = p * (F.logsigmoid(zt) - F.logsigmoid(zs)) + (1 - p) * (F.logsigmoid(-zt) - F.logsigmoid(-zs))
        return kl.mean() * temperature ** 2
    return F.kl_div(F.log_softmax(zs, dim=-1), F.log_softmax(zt, dim=-1), reduction="batchmean",
                    log_target=True) * temperature ** 2


def problem_kind(config) -> str:
    """What the teacher's logits mean: its config's problem type (`BertConfig.problem_type_for`, the rule its head
    trains by), read as for integer labels, as the teacher's task reads its labels (a token classifier's too)."""
    return config.problem_type_for()


class LogitStudent(nn.Module):
    """The student head; the loop calls model(**batch).loss, `teacher_logits` holding the teacher's [B, C]
    (or [B, T, C]) and `labels`, when the data has them, the task's labels."""

    def __init__(self, model: nn.Module, kind: str, temperature: float, soft_weight: float):
        super().__init__()
        self.model, self.kind, self.temperature, self.soft_weight = model, kind, temperature, soft_weight

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None, teacher_logits=None):
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels)
        per_token = teacher_logits.dim() == 3
        soft = soft_loss(out.logits, teacher_logits, self.temperature, self.kind, attention_mask if per_token else None)
        if out.loss is None:
            return StudentOutput(soft)
        return StudentOutput(self.soft_weight * soft + (1 - self.soft_weight) * out.loss)


def task_features(teacher, path) -> list[dict]:
    """The teacher's task's training features from `path`: its labels when the file has them (as
    `bertkit predict` finds them), the inputs alone otherwise."""
    task = task_of(teacher)
    if task.features is None:
        raise BertkitError(f"{teacher.directory} is a {task.cli_name} model: distill layers trains sentence models "
                           "and classifiers by their logits (classify, pair, regression, multi-label, ner)")
    read = task.read_labelled(path, teacher.info)
    texts, pairs, references = (read if read is not None else task.read_inputs(path, teacher.info))[:3]
    if not texts:
        raise BertkitError(f"--data {path} holds no inputs: give the table the model was trained on, or its texts")
    return task.features(teacher.tokenizer, texts, pairs, references, teacher.info, task.labels(teacher.config))


def distill_logits(teacher, output, config, log=print, speed=None) -> dict:
    """Train a `config.keep`-layer student of the fine-tuned model `teacher` (loaded, float32) on its
    logits over `config.data`; saved at `output` in the teacher's layout."""
    features = task_features(teacher, config.data)
    student, layers = student_from(teacher.model, config.keep)
    kind = problem_kind(teacher.config)
    labelled = "labels" in features[0]
    log(f"teacher: {teacher.task} model, {teacher.config.num_hidden_layers} layers; student: layers {layers} of it; "
        f"{len(features)} features{' with labels' if labelled else ''}; soft loss at temperature {config.temperature}")
    tcfg = config.training
    logits = feature_logits(teacher, features, batch_size=tcfg.eval_batch_size, progress=tcfg.progress)
    for f, z in zip(features, logits):
        f["teacher_logits"] = z
    # the student reads its inputs as the teacher does (task, lengths, columns, labels: its record, whose "config"
    # is the fine-tuning run that defined them, output and all); the record adds what the student is: which
    # model it was distilled from and the layers it kept (its own run: run_config.json)
    info = {**teacher.info, "distilled_from": {"teacher": str(teacher.directory), "layers": layers}}
    save_task = saver(Path(output), teacher.tokenizer, info)
    wrapped = LogitStudent(student, kind, config.temperature, config.soft_weight if labelled else 1.0)
    result = train(wrapped, features, tcfg, save=lambda m: save_task(m.model), output_dir=Path(output),
                   pad_id=teacher.tokenizer.pad_token_id, run_config={**asdict(config), "teacher": str(teacher.directory)},
                   log=log, speed=speed, desc="distill layers")
    return {"layers": layers, "features": len(features), "labelled": labelled, "train_seconds": round(result.seconds, 1),
            "epochs": result.history, "is_main": result.is_main}
