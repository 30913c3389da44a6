"""Distil an encoder into fewer layers: a student made of N of the teacher's layers, trained to match it.

DistilBERT (Sanh et al. 2019) starts its student from every other layer of the teacher and
trains it on the teacher's soft outputs; sentence-transformers' layer-drop distillation
(`examples/.../distillation/model_distillation_layer_reduction.py`) keeps N evenly spaced
layers of a sentence model and trains them to give the teacher's sentence vectors (MSE).

    student = the teacher's embeddings, layers kept_layers(L, N), pooler (and head): a copy
    sentence model:  loss = mean_i ||pool(student(x_i)) - pool(teacher(x_i))||^2 / H    (MSE)
    classifier:      loss = a * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - a) * CE(z_s, y)
                     (Hinton et al. 2015: T^2 keeps the soft gradients' scale; the CE term
                     only where the data has labels)

The teacher runs once, in float32, over the data before training: its vectors (or logits)
are the batches' `labels`, so each epoch costs only the student. Training goes through
the one loop (`bertkit.tasks.trainer.train` around `bertkit.training.loop`: resume, bf16,
torchrun); the student is saved in the teacher's layout (config.json with N layers, the
sentence-transformers files), so every command takes it unchanged.

Layers kept: `round_half_up(i * (L - 1) / (N - 1))` for i in 0..N-1, the first and the last
always (6 -> 3: 0, 3, 5; 12 -> 4: 0, 4, 7, 11); N = 1 keeps the last.

Shapes: B sentences, H hidden, C classes.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.data.textfiles import read_texts
from bertkit.embeddings.features import iter_embed
from bertkit.distill.config import LayersDistillConfig
from bertkit.errors import BertkitError
from bertkit.model.modeling import pool_sentence
from bertkit.model.sentence_layout import write_layout
from bertkit.runtime.loading import load
from bertkit.tasks.trainer import train

LAYER_KEY = re.compile(r"^(.*encoder\.layers\.)(\d+)(\..*)$")  # our names (bertkit.model.modeling)


def kept_layers(total: int, keep: int) -> list[int]:
    """The teacher layers (0-based) the student starts from: `keep` evenly spaced, first and last included."""
    if not isinstance(keep, int) or not 1 <= keep <= total:
        raise BertkitError(f"--keep {keep}: the teacher has {total} layers; keep 1 to {total}")
    if keep == 1:
        return [total - 1]
    return [int(i * (total - 1) / (keep - 1) + 0.5) for i in range(keep)]


def student_from(teacher: nn.Module, keep: int) -> tuple[nn.Module, list[int]]:
    """A copy of `teacher` (a BertModel or a model with a `.bert` encoder and a head) with only the kept
    layers, renumbered 0..N-1; every other weight (embeddings, pooler, head) copied. Returns it and the layers."""
    layers = kept_layers(teacher.config.num_hidden_layers, keep)
    config = replace(teacher.config, num_hidden_layers=keep)
    student = type(teacher)(config)
    where = {old: new for new, old in enumerate(layers)}
    state = {}
    for key, value in teacher.state_dict().items():
        m = LAYER_KEY.match(key)
        if m is None:
            state[key] = value
        elif int(m.group(2)) in where:
            state[f"{m.group(1)}{where[int(m.group(2))]}{m.group(3)}"] = value
    student.load_state_dict(state, strict=True)
    return student, layers


def vector_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """MSE between sentence vectors [B, H] (the mean over B and H)."""
    return F.mse_loss(student.float(), teacher.float())


def soft_label_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 2.0,
                    labels: torch.Tensor | None = None, alpha: float = 0.5) -> torch.Tensor:
    """DistilBERT's soft loss on logits [B, C]: T^2 KL(teacher || student) at temperature T, mixed with the
    labels' cross-entropy (weight 1 - alpha) where `labels` [B] are given (-100: no label)."""
    t = temperature
    soft = F.kl_div(F.log_softmax(student.float() / t, dim=-1), F.log_softmax(teacher.float() / t, dim=-1),
                    reduction="batchmean", log_target=True) * t * t
    if labels is None or not bool((labels != -100).any()):
        return soft
    return alpha * soft + (1 - alpha) * F.cross_entropy(student.float(), labels, ignore_index=-100)


@dataclass
class StudentOutput:
    loss: torch.Tensor


class SentenceStudent(nn.Module):
    """The student encoder and the teacher's pooling; the loop calls model(**batch).loss, `labels` [B, H]
    holding the teacher's sentence vectors."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise BertkitError(f"the teacher pools with {pooling!r}; layer distillation trains mean or cls")
        self.encoder, self.pooling = encoder, pooling
        if getattr(encoder, "pooler", None) is not None:  # never read by a sentence vector: frozen
            encoder.pooler.requires_grad_(False)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None) -> StudentOutput:
        hidden = self.encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        vectors = pool_sentence(hidden, attention_mask, self.pooling)
        return StudentOutput(vector_loss(vectors, labels))


def teacher_targets(loaded, texts: list, max_length: int, batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The teacher's sentence vectors [N, H] (not normalised), cut at `max_length` tokens as the student sees them."""
    rows = iter_embed(texts, loaded, normalize=False, max_length=max_length, truncate=True,
                      batch_size=batch_size, progress=progress, total=len(texts))
    return np.stack(list(rows)).astype(np.float32)


def _texts(path) -> list[str]:
    lines, _ = read_texts(path)
    texts = [t for t in lines if t.strip()]
    if not texts:
        raise BertkitError(f"--data {path} holds no text: give one sentence per line (or a .tsv/.jsonl)")
    return texts


def distill_layers(model, output, config: LayersDistillConfig, log=print) -> dict:
    """Train a `config.keep`-layer student of the sentence model `model` (None: the default model) on the
    sentences of `config.data` (MSE on the sentence vectors); saved at `output` in the teacher's layout."""
    config.validate()
    texts = _texts(config.data)
    teacher = load(model, head="encoder", fast=False)  # float32, plain layers: the targets and the weights to copy
    if teacher.fine_tuned or teacher.task == "static":
        raise BertkitError(f"{model} is a {teacher.task} model: distill layers trains sentence models (MSE on their "
                           "vectors); logits distillation of fine-tuned classifiers is not built yet")
    if teacher.model.config.num_hidden_layers < 2:
        raise BertkitError("the teacher has a single layer: there is nothing to drop")
    student, layers = student_from(teacher.model, config.keep)
    length = teacher.max_length
    pooling = teacher.layout.pooling if teacher.layout is not None else "mean"  # as embed pools it
    log(f"teacher: {teacher.model.config.num_hidden_layers} layers; student: layers {layers} of it; "
        f"{len(texts)} sentences, {pooling} pooling, max length {length}")
    targets = teacher_targets(teacher, texts, length, progress=config.training.progress)
    tok = teacher.tokenizer
    enc = tok.encode_batch(texts, max_length=length, padding=False, return_tensors=None)
    features = [{"input_ids": list(e.input_ids), "labels": targets[i].tolist()} for i, e in enumerate(enc.encodings)]
    out = Path(output)
    layout = teacher.layout

    def save(m):
        m.encoder.save_pretrained(out, tokenizer=tok)
        if layout is not None:
            write_layout(out, pooling=m.pooling, normalize=layout.normalize, max_seq_length=layout.max_seq_length,
                         hidden_size=m.encoder.config.hidden_size, dimensions=layout.dimensions)

    result = train(SentenceStudent(student, pooling), features, config.training, save=save, output_dir=out,
                   pad_id=tok.pad_token_id, run_config={**asdict(config), "teacher": str(teacher.directory)}, log=log)
    final = {"layers": layers, "sentences": len(texts), "train_seconds": round(result.seconds, 1),
             "epochs": result.history}
    if result.is_main:
        (out / "distill.json").write_text(json.dumps(final, indent=2) + "\n", encoding="utf-8")
    return final
