"""Distil an encoder into fewer layers: a student made of N of the teacher's layers, trained to match it.

DistilBERT (Sanh et al. 2019) starts its student from every other layer of the teacher and
trains it on the teacher's soft outputs; sentence-transformers' layer-drop distillation
(`examples/.../distillation/model_distillation_layer_reduction.py`) keeps N evenly spaced
layers of a sentence model and trains them to give the teacher's sentence vectors (MSE).

    student = the teacher's embeddings, N of its layers, pooler (and head): a copy (bertkit.distill.student)
    sentence model:  loss = mean_i ||pool(student(x_i)) - pool(teacher(x_i))||^2 / H    (MSE)
                     (--loss mse+cosine: + mean_i 1 - cos(pool(student(x_i)), pool(teacher(x_i))))
    fine-tuned model: its logits, DistilBERT's soft loss plus the labels' (bertkit.distill.logits)

With --holdout N, N sentences (a draw seeded by --seed) are kept out of training; after each
epoch the student embeds them and its MSE (and mean cosine) to the teacher's vectors there picks
the epoch that is saved, as a dev set picks a fine-tuned model's epoch: the number of epochs is
chosen by the distillation loss on unseen sentences, never by a downstream benchmark.

The teacher runs once over the data before training, in float32 (or --teacher-dtype): its
vectors are the batches' `labels`, so each epoch costs only the student; --teacher-cache keeps
them in a safetensors file (keyed by the texts, the teacher, the length and the precision), so a
rerun or a --resume skips the teacher. Training goes through the one loop
(`bertkit.tasks.trainer.train` around `bertkit.training.loop`: resume, bf16, torchrun); the
student is saved in the teacher's layout (config.json with N layers, the sentence-transformers
files), so every command takes it unchanged.

Shapes: B sentences, H hidden, C classes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from bertkit.data.atomic import refused, saving, write_json
from bertkit.data.outputs import run_output
from bertkit.data.textfiles import numbered_texts
from bertkit.embeddings.features import iter_embed
from bertkit.distill.config import HOLDOUT_METRICS, TEACHER_NEEDS, LayersDistillConfig, changed
from bertkit.distill.logits import distill_logits
from bertkit.distill.student import StudentOutput, student_from
from bertkit.errors import BertkitError, refuse_unneeded
from bertkit.model.modeling import pool_sentence
from bertkit.runtime.loading import load, resolve, weights_fingerprint
from bertkit.tasks.trainer import check_run_output, train


def vector_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str = "mse") -> torch.Tensor:
    """MSE between sentence vectors [B, H] (the mean over B and H); "mse+cosine" adds the mean over B
    of 1 - cos(student_i, teacher_i)."""
    s, t = student.float(), teacher.float()
    loss = F.mse_loss(s, t)
    return loss + (1 - F.cosine_similarity(s, t, dim=-1)).mean() if kind == "mse+cosine" else loss


class SentenceStudent(nn.Module):
    """The student encoder and the teacher's pooling; the loop calls model(**batch).loss, `labels` [B, H]
    holding the teacher's sentence vectors."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean", loss: str = "mse"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise BertkitError(f"the teacher pools with {pooling!r}; layer distillation trains mean or cls")
        self.encoder, self.pooling, self.loss = encoder, pooling, loss
        if getattr(encoder, "pooler", None) is not None:  # never read by a sentence vector: frozen
            encoder.pooler.requires_grad_(False)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None) -> StudentOutput:
        hidden = self.encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        vectors = pool_sentence(hidden, attention_mask, self.pooling)
        return StudentOutput(vector_loss(vectors, labels, self.loss))


def holdout_split(n: int, holdout: int, seed: int) -> tuple[list[int], list[int]]:
    """Indices (training, held out) of n sentences: `holdout` of them drawn with `seed`, both in file order."""
    if holdout >= n:
        raise BertkitError(f"--holdout {holdout} leaves no sentence to train on ({n} in --data): hold out fewer")
    held = set(random.Random(seed).sample(range(n), holdout))
    return [i for i in range(n) if i not in held], sorted(held)


def holdout_scores(model: SentenceStudent, teacher, texts: list, targets: np.ndarray, max_length: int) -> dict:
    """The student's distance to the teacher on held-out sentences, embedded as `teacher_targets` embeds
    them (the teacher's tokenizer, layout and length): the training loss (MSE over N and H) and the mean
    cosine of each sentence's two vectors. targets [N, H], one row per text."""
    got = teacher_targets(replace(teacher, model=model.encoder), texts, max_length)
    cos = (got * targets).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(targets, axis=1) + 1e-12)
    return {"holdout_mse": float(((got - targets) ** 2).mean()), "holdout_cosine": float(cos.mean())}


def teacher_targets(loaded, texts: list, max_length: int, batch_size: int = 64, progress: bool = False,
                    where=None) -> np.ndarray:
    """The teacher's sentence vectors [N, H] (not normalised), cut at `max_length` tokens as the student sees them;
    where(i) names the i-th text in an error about it (`iter_embed`)."""
    rows = iter_embed(texts, loaded, normalize=False, max_length=max_length, truncate=True,
                      batch_size=batch_size, progress=progress, total=len(texts), where=where)
    return np.stack(list(rows)).astype(np.float32)


def cached_targets(teacher, texts: list, max_length: int, cache=None, dtype: str = "float32", progress: bool = False,
                   log=print, chunk: int = 8192, where=None) -> np.ndarray:
    """`teacher_targets` in `dtype` (the float32 `teacher` itself, else the same folder loaded in `dtype`), read
    from the safetensors file `cache` when it holds them for these texts, teacher (its weights), length and
    precision (else computed and written there; None: no file). Computed `chunk` texts at a time, each chunk's
    vectors written (atomically) into the folder CACHE.part, once: a killed run's rerun goes on after the last
    chunk written, and a run writes every vector twice at most (its chunk, then the whole cache)."""
    # keyed and recorded by the precision the vectors are computed in, not the name asked for: "auto" (or
    # "bf16") keyed its own cache, computed again what a float32 or bfloat16 run had cached, and the file said auto
    runner = teacher if dtype in ("float32", "fp32") else load(teacher.directory, head="encoder", dtype=dtype)
    # and by the weights, not the folder alone: a teacher trained again into its folder read the vectors of the
    # model that was there before (last, so the record's other places stay where earlier caches had them)
    what = json.dumps([str(teacher.directory), max_length, runner.precision, len(texts),
                       weights_fingerprint(teacher.weights_dir or teacher.directory)])
    key = hashlib.sha256("\n".join([what, *texts]).encode("utf-8")).hexdigest()
    cache = Path(cache) if cache else None
    if cache is not None and cache.is_file():
        vectors = _read_vectors(cache, key)
        if vectors is not None:
            log(f"teacher vectors read from {cache}")
            return vectors
        log(f"{cache} holds the vectors of other data or another teacher: computing them again")
    part = None if cache is None else cache.with_name(cache.name + ".part")
    done = [] if part is None else _chunks_written(part, key, chunk)
    start = sum(len(v) for v in done)
    if start:
        log(f"teacher vectors: {start} of {len(texts)} texts read from {part}, computing the rest")
    log(f"teacher vectors computed in {runner.precision}")
    for b in range(start, len(texts), chunk):  # chunk boundaries fixed: a resumed run computes what one run would
        name = (lambda i, b=b: where(b + i)) if where else None
        done.append(teacher_targets(runner, texts[b : b + chunk], max_length, progress=progress, where=name))
        if part is not None:
            _write_vectors(part / f"{b // chunk:06d}.safetensors", done[-1], key, what)
    vectors = np.concatenate(done)
    if part is not None:
        _write_vectors(cache, vectors, key, what)
        shutil.rmtree(part, ignore_errors=True)  # another rank may have removed it already
    return vectors


def _chunks_written(part: Path, key: str, chunk: int) -> list[np.ndarray]:
    """The whole chunks of these texts' vectors that a killed run wrote into the folder `part`, in order."""
    if part.is_file():  # an older bertkit kept the vectors so far in one file of this name: computed again
        part.unlink()
    done = []
    while (path := part / f"{len(done):06d}.safetensors").is_file():
        vectors = _read_vectors(path, key)
        if vectors is None or len(vectors) != chunk:  # other texts' chunk, or a last one: computed again
            break
        done.append(vectors)
    return done


def _read_vectors(path: Path, key: str) -> np.ndarray | None:
    """The vectors a cache file holds when its key is `key`, else None."""
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor("vectors").numpy() if (f.metadata() or {}).get("key") == key else None


def _write_vectors(path: Path, vectors: np.ndarray, key: str, what: str) -> None:
    # a temporary name of this writer's own: under torchrun every rank writes the same file (the same
    # vectors), and with one shared name the second rename found nothing to rename
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, work = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(handle)
    try:
        save_file({"vectors": torch.from_numpy(vectors)}, work, metadata={"key": key, "about": what})
        os.replace(work, path)
    except BaseException as err:  # a full disk: no CACHE.XXXX.tmp left (a new name each try), the error said of `path`
        with contextlib.suppress(OSError):
            os.unlink(work)
        said = refused(err, path, (work,)) if isinstance(err, Exception) else err
        if said is not err:
            raise said from err
        raise


def _texts(path) -> tuple[list[str], list[int]]:
    """The texts of --data and the line each is on."""
    numbered = [(n, t) for n, t in numbered_texts(path)() if t.strip()]
    if not numbered:
        raise BertkitError(f"--data {path} holds no text: give one sentence per line (or a .tsv/.jsonl)")
    return [t for _, t in numbered], [n for n, _ in numbered]


def distill_sentences(teacher, output, config: LayersDistillConfig, log=print, speed=None) -> dict:
    """Train a `config.keep`-layer student of the sentence model `teacher` (loaded, float32) on its sentence
    vectors over the sentences of `config.data` (MSE); saved at `output` in the teacher's layout."""
    texts, lines = _texts(config.data)
    kept, held = holdout_split(len(texts), config.holdout, config.training.seed)
    student, layers = student_from(teacher.model, config.keep)
    length = teacher.max_length
    pooling = teacher.layout.pooling if teacher.layout is not None else "mean"  # as embed pools it
    log(f"teacher: {teacher.model.config.num_hidden_layers} layers; student: layers {layers} of it; "
        f"{len(texts)} sentences, {pooling} pooling, max length {length}")
    targets = cached_targets(teacher, texts, length, config.teacher_cache, config.teacher_dtype,
                             config.training.progress, log, where=lambda i: f"{config.data}:{lines[i]}")
    tok = teacher.tokenizer
    ids = tok.single_ids(texts, length)
    features = [{"input_ids": ids[i], "labels": targets[i].tolist()} for i in kept]
    training, evaluate = config.training, None
    if held:
        metric = training.metric or "holdout_mse"
        training = replace(training, metric=metric, greater_is_better=HOLDOUT_METRICS[metric])
        evaluate = partial(holdout_scores, teacher=teacher, texts=[texts[i] for i in held], targets=targets[held],
                           max_length=length)
        log(f"{len(held)} sentences held out: the epoch with the best {metric} on them is saved")
    out = Path(output)
    layout = teacher.layout

    def save(m):  # as one (`saving`): the weights and the layout of one epoch, never two
        with saving(out):
            m.encoder.save_pretrained(out, tokenizer=tok)
            if layout is not None:
                replace(layout, pooling=m.pooling).write(out, m.encoder.config.hidden_size)

    result = train(SentenceStudent(student, pooling, config.loss), features, training, evaluate=evaluate, save=save,
                   output_dir=out, pad_id=tok.pad_token_id, log=log, speed=speed, desc="distill layers",
                   run_config={**asdict(config), "teacher": str(teacher.directory)})
    best = {"best_epoch": result.best["epoch"]} if result.best else {}
    return {"layers": layers, "sentences": len(kept), "held_out": len(held), **best,
            "train_seconds": round(result.seconds, 1), "epochs": result.history, "is_main": result.is_main}


def distill_layers(model, output, config: LayersDistillConfig, log=print, speed=None) -> dict:
    """Train a `config.keep`-layer student of `model` (None: the default model) on `config.data`: a sentence
    model's sentence vectors (MSE), a fine-tuned model's logits (`bertkit.distill.logits`); saved at `output`
    in the teacher's layout, with distill.json (the layers kept, the epochs). speed: the student's fast-path
    settings (`bertkit.runtime.fast.SpeedSettings`; None: `decide()`'s). The report's "is_main" says whether
    this process wrote the output (False on torchrun's ranks but the first)."""
    config.validate()
    model = resumed_teacher(output, model) if config.training.resume else model
    # the output before the teacher runs: a model there (the teacher's own folder even with --overwrite) was
    # written over without a word, --overwrite was never read, and a run there was refused only once the
    # teacher had embedded all of --data
    # no MODEL is the default model's folder: -o naming it is the teacher's own too (--overwrite cleared it)
    source = resolve(model) if model is None else model
    with run_output(output, "bertkit distill layers", overwrite=config.training.overwrite,
                    resume=config.training.resume, sources=[source], log=log) as log:
        if config.training.resume:  # a finished run's --resume was refused only once the teacher had run
            check_run_output(output, config.training)
        teacher = load(model, head="auto", fast=False)  # float32, plain layers: the weights to copy, the targets
        teacher.need_layers("distill layers")
        refuse_unneeded(TEACHER_NEEDS, changed(config), {"fine_tuned": teacher.fine_tuned, "teacher": teacher.directory})
        final = (distill_logits if teacher.fine_tuned else distill_sentences)(teacher, output, config, log, speed)
        if final["is_main"]:  # False on torchrun's other ranks, which ran the same job
            summary = {k: v for k, v in final.items() if k != "is_main"}
            # whole or absent (`bertkit.data.atomic`), as the student beside it: written in place, a kill or a
            # full disk left its first bytes at its name
            write_json(Path(output) / "distill.json", summary)
    return final


def resumed_teacher(output, model):
    """The teacher a resumed run learns from: the one it recorded in run_config.json (the run harness writes it
    when a run starts); MODEL left out means that one, not the default model, and a MODEL naming another is
    refused (its targets would be mixed into the student its checkpoint holds)."""
    saved = Path(output) / "run_config.json"
    teacher = json.loads(saved.read_text()).get("teacher") if saved.is_file() else None
    if model is None or teacher is None:
        return teacher or model
    if Path(model).resolve() != Path(teacher).resolve():
        raise BertkitError(f"--resume: the run in {output} distils {teacher}, not {model}: leave MODEL out (or give "
                           "that one), or start a new run in another --output")
    return model
