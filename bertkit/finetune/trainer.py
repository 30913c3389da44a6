"""The fine-tuning loop: one screen, for any model that returns a loss.

Fine-tuning (BERT paper section 4 and A.3) is a few epochs of AdamW over
labelled features with the learning rate warmed up and decayed linearly
(`bertkit.optim`). The loop knows nothing about tasks: a *feature* is a dict
holding `input_ids` and optionally `token_type_ids`, `labels`,
`start_positions`, `end_positions` (anything else, such as `example_index`,
is bookkeeping the task keeps for itself); the model is called as
`model(**batch)` and must return an object with `.loss`.

What it does around that:
- dynamic padding: each batch is padded only to its own longest feature;
- length-grouped batches (as transformers' `group_by_length`): shuffle, cut
  into mega-batches of 50 batches, sort each by length, so a batch holds
  similar lengths and padding is small, then shuffle the batch order;
- evaluation after each epoch through a task callback `evaluate(model) ->
  {metric: value}`, one JSON line per epoch in `metrics.jsonl`, and the best
  epoch (by `config.metric`) saved through `save(model)` and restored at the end;
- seeds: batch order comes from `random.Random(seed)`; dropout draws from the
  global torch generator, seeded here because `nn.Dropout` takes no generator.

Shapes: B batch, T longest feature in the batch; input_ids (B, T) int64.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX
from bertkit.optim import OptimConfig, build_optimizer, lr_at, set_lr, warmup_steps_for

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions")


@dataclass
class TrainConfig:
    """Loop settings; defaults follow the BERT paper's fine-tuning recipe."""

    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 64
    max_steps: int | None = None  # stop early after this many updates
    seed: int = 42
    group_by_length: bool = True
    metric: str = "accuracy"  # which evaluation metric picks the best epoch
    greater_is_better: bool = True
    progress: bool = True
    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self) -> "TrainConfig":
        if self.epochs <= 0:
            raise BertkitError(f"epochs must be > 0, got {self.epochs} (BERT uses 2-4)")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise BertkitError(f"batch sizes must be >= 1, got {self.batch_size}/{self.eval_batch_size}")
        if self.max_steps is not None and self.max_steps < 1:
            raise BertkitError(f"max_steps must be >= 1, got {self.max_steps}")
        self.optim.validate()
        return self


@dataclass
class TrainResult:
    history: list[dict]  # one record per epoch: epoch, step, train_loss, seconds, metrics...
    best: dict | None  # the best record (None without evaluation)
    seconds: float


def length_grouped_batches(lengths, batch_size: int, rng: random.Random, mega: int = 50) -> list[list[int]]:
    """Index batches of similar lengths, in a random order drawn from `rng`."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    size = mega * batch_size
    batches = []
    for i in range(0, len(order), size):
        chunk = sorted(order[i:i + size], key=lambda j: -lengths[j])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def shuffled_batches(n: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [order[k:k + batch_size] for k in range(0, n, batch_size)]


def collate(features: list[dict], pad_id: int = 0) -> dict:
    """Pad a list of features to the batch's longest and stack them into tensors.

    input_ids pad with `pad_id`, token_type_ids with 0, attention_mask is 1
    on real tokens; token-level labels (lists) pad with -100; scalar labels
    become int64 (class ids) or float32 (scores, multi-hot vectors).
    """
    T = max(len(f["input_ids"]) for f in features)
    batch = {}
    ids = torch.full((len(features), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(features), T), dtype=torch.long)
    mask = torch.zeros((len(features), T), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = torch.tensor(f["input_ids"])
        if "token_type_ids" in f:
            types[i, :n] = torch.tensor(f["token_type_ids"])
        mask[i, :n] = 1
    batch.update(input_ids=ids, token_type_ids=types, attention_mask=mask)
    for key in ("labels", "start_positions", "end_positions"):
        if key not in features[0]:
            continue
        values = [f[key] for f in features]
        first = values[0]
        if isinstance(first, list) and isinstance(first[0], int):  # token labels
            lab = torch.full((len(features), T), IGNORE_INDEX, dtype=torch.long)
            for i, v in enumerate(values):
                lab[i, : len(v)] = torch.tensor(v)
            batch[key] = lab
        elif isinstance(first, float) or (isinstance(first, list) and isinstance(first[0], float)):
            batch[key] = torch.tensor(values, dtype=torch.float32)
        else:
            batch[key] = torch.tensor(values, dtype=torch.long)
    return batch


@torch.inference_mode()
def run_model(model, features: list[dict], batch_size: int = 64, outputs=("logits",), per_token=False,
              progress=False, desc="predict") -> dict[str, list[np.ndarray]]:
    """Forward all features without labels; {output name: one array per feature, input order}.

    Features are run longest-first so batches pad little. `per_token` cuts
    each (T, ...) output back to its feature's own length.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=lambda i: -len(features[i]["input_ids"]))
    result = {name: [None] * len(features) for name in outputs}
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    for idx in tqdm(batches, desc=desc, disable=not progress, leave=False):
        batch = collate([{"input_ids": features[i]["input_ids"],
                          **({"token_type_ids": features[i]["token_type_ids"]}
                             if "token_type_ids" in features[i] else {})} for i in idx])
        device = next(model.parameters()).device
        out = model(**{k: v.to(device) for k, v in batch.items()})  # the model may sit on a GPU
        for name in outputs:
            values = getattr(out, name).float().cpu().numpy()
            for row, i in enumerate(idx):
                v = values[row]
                result[name][i] = v[: len(features[i]["input_ids"])] if per_token else v
    model.train(was_training)
    return result


def _model_batch(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k in MODEL_INPUTS}


def train(model, train_features: list[dict], config: TrainConfig, *, evaluate=None, save=None,
          output_dir=None, pad_id: int = 0, log=print) -> TrainResult:
    """Fine-tune `model` in place; returns the per-epoch history and the best epoch."""
    config.validate()
    if not train_features:
        raise BertkitError("no training features: the training file produced no usable examples")
    torch.manual_seed(config.seed)  # dropout masks and any fresh head weights drawn after this
    rng = random.Random(config.seed)
    per_epoch = math.ceil(len(train_features) / config.batch_size)
    total = math.ceil(per_epoch * config.epochs)
    if config.max_steps:
        total = min(total, config.max_steps)
    warmup = warmup_steps_for(total, config.optim.warmup_ratio)
    optimizer = build_optimizer(model, config.optim)
    lengths = [len(f["input_ids"]) for f in train_features]
    metrics_path = Path(output_dir) / "metrics.jsonl" if output_dir else None
    if metrics_path:
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text("")
    history, best, best_state = [], None, None
    step, t_start, epoch = 0, time.perf_counter(), 0
    model.train()
    while step < total:
        epoch += 1
        t0, losses = time.perf_counter(), []
        batches = (length_grouped_batches(lengths, config.batch_size, rng) if config.group_by_length
                   else shuffled_batches(len(train_features), config.batch_size, rng))
        batches = batches[: total - step]
        bar = tqdm(batches, desc=f"epoch {epoch}", disable=not config.progress, leave=False)
        for idx in bar:
            batch = collate([train_features[i] for i in idx], pad_id)
            set_lr(optimizer, lr_at(step, peak_lr=config.optim.learning_rate, warmup_steps=warmup,
                                    total_steps=total, schedule=config.optim.schedule))
            loss = model(**_model_batch(batch)).loss
            loss.backward()
            if config.optim.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        record = {"epoch": epoch, "step": step, "train_loss": float(np.mean(losses)),
                  "train_seconds": round(time.perf_counter() - t0, 2)}
        if evaluate is not None:
            t1 = time.perf_counter()
            record.update(evaluate(model))
            record["eval_seconds"] = round(time.perf_counter() - t1, 2)
            model.train()
            value = record.get(config.metric)
            if value is None:
                raise BertkitError(f"metric {config.metric!r} not among the evaluation results {sorted(record)}")
            better = best is None or (value > best[config.metric] if config.greater_is_better
                                      else value < best[config.metric])
            if better:
                best = dict(record)
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                if save is not None:
                    save(model)
        elif save is not None:
            save(model)
        history.append(record)
        log(json.dumps(record))
        if metrics_path:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
    if best_state is not None and best["epoch"] != history[-1]["epoch"]:
        model.load_state_dict(best_state)  # end on the best epoch, as saved
    return TrainResult(history, best, time.perf_counter() - t_start)

