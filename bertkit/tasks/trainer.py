"""Fine-tuning's side of the one training loop: labelled features in, the best epoch out.

Fine-tuning (BERT paper section 4 and A.3) is a few epochs of AdamW over
labelled features, the rate warmed up and decayed linearly. The updates are
`bertkit.training.loop` (accumulation, clipping, bf16, DDP, NaN stop,
checkpoints, exact resume); this module adds what is particular to it. A
*feature* is a dict holding `input_ids` and optionally `token_type_ids`,
`labels`, `start_positions`, `end_positions` (anything else, such as
`example_index`, is the task's bookkeeping); the model is called as
`model(**batch)` and must return an object with `.loss`.

- batches (`EpochBatches`): length-grouped as transformers' `group_by_length`
  (shuffle, cut into mega-batches of 50 batches, sort each by length, shuffle
  the batch order), drawn from a generator seeded by (seed, epoch), so --resume
  finds any batch again; each padded only to its own longest feature. One batch
  is one update of batch_size x grad_accum x processes features, shared out
  into the micro-batches; an epoch's short last batch is kept when it can give
  every micro-batch a feature (always, alone and without accumulation);
- the update's loss is the mean over all its loss terms (examples; for token
  labels every labelled token), so k micro-batches equal one batch of k;
- after each epoch a task callback `evaluate(model) -> scores` (or `(scores,
  predictions)`, the best epoch's predictions come back in the result); the
  best epoch (by `config.metric`; a tie goes to the lower held-out loss, else
  to the later epoch: `better`, whose reason the record keeps as "saved_because")
  is saved through `save(model)`, travels in the checkpoints, and is restored
  at the end;
- metrics.jsonl (a line per step, one per epoch), curves.png, and a warning
  when the best score is no better than the task's trivial baseline;
- dropout draws from the global torch generator, seeded here per process.

Shapes: B batch, T longest feature in the batch; input_ids (B, T) int64.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bertkit.model.config import IGNORE_INDEX
from bertkit.errors import BertkitError
from bertkit.tasks.config import TrainConfig
from bertkit.training import distributed
from bertkit.training.loop import LoopConfig, move, prepare_model, train_loop
from bertkit.training.metrics_log import MetricsLog, plot_curves
from bertkit.training.optim import build_optimizer
from bertkit.training.state import (
    CHECKPOINT_DIR,
    checkpoint_paths,
    latest_checkpoint,
    restore_training_state,
    resume_state,
    save_training_state,
)

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions")


@dataclass
class TrainResult:
    history: list[dict]  # one record per epoch: epoch, step, train_loss, seconds, metrics...
    best: dict | None  # the best record (None without evaluation)
    seconds: float
    is_main: bool = True  # False on the other processes of a torchrun: they write nothing
    best_predictions: object = None  # what evaluate returned beside the scores for the best epoch, if any


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
    device = next(model.parameters()).device
    for idx in tqdm(batches, desc=desc, disable=not progress, leave=False):
        batch = collate([{"input_ids": features[i]["input_ids"],
                          **({"token_type_ids": features[i]["token_type_ids"]}
                             if "token_type_ids" in features[i] else {})} for i in idx])
        out = model(**move(batch, device))
        for name in outputs:
            values = getattr(out, name).float().cpu().numpy()
            for row, i in enumerate(idx):
                v = values[row]
                result[name][i] = v[: len(features[i]["input_ids"])] if per_token else v
    model.train(was_training)
    return result


class EpochBatches:
    """Seekable micro-batches over fine-tuning features, epoch after epoch (the loop's batch stream).

    `parts` = grad_accum x processes micro-batches make one update's batch of
    batch_size x parts features; `position` counts micro-batches consumed.
    """

    def __init__(self, features: list[dict], batch_size: int, parts: int, seed: int, group_by_length: bool = True,
                 pad_id: int = 0, position: int = 0):
        self.features, self.parts, self.seed, self.pad_id = features, parts, seed, pad_id
        self.size, self.group_by_length, self.position = batch_size * parts, group_by_length, position
        self.lengths = [len(f["input_ids"]) for f in features]
        n = len(features)
        self.steps_per_epoch = n // self.size + (n % self.size >= parts)
        if self.steps_per_epoch == 0:
            raise BertkitError(f"{n} training features cannot fill one micro-batch per accumulation step and "
                               f"process ({parts}); lower --grad-accum or use fewer processes")
        self._cache = (None, None)

    def batches(self, epoch: int) -> list[list[int]]:
        """The feature indices of each update of `epoch` (0-based), a pure function of (seed, epoch)."""
        if self._cache[0] != epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            n = len(self.features)
            batches = (length_grouped_batches(self.lengths, self.size, rng) if self.group_by_length
                       else shuffled_batches(n, self.size, rng))
            self._cache = (epoch, [b for b in batches if len(b) >= self.parts])
        return self._cache[1]

    def micro_batch(self, slot: int) -> tuple[dict, str]:
        update, part = divmod(self.position + slot, self.parts)
        epoch, k = divmod(update, self.steps_per_epoch)
        idx = [int(i) for i in np.array_split(self.batches(epoch)[k], self.parts)[part]]
        where = f"epoch {epoch + 1}, batch {k + 1}, part {part + 1}/{self.parts} (features {idx[:4]}{'...' if len(idx) > 4 else ''})"
        return _model_batch(collate([self.features[i] for i in idx], self.pad_id)), where

    def advance(self, micro_batches: int) -> None:
        self.position += micro_batches

    def state(self) -> dict:
        return {"position": self.position, "seed": self.seed, "num_instances": len(self.features),
                "batch": [self.size // self.parts, self.parts]}


def loss_terms(batch: dict) -> float:
    """How many terms a micro-batch's loss averages: its labelled tokens, or its examples."""
    labels = batch.get("labels")
    if labels is not None and labels.dim() == 2 and not labels.is_floating_point():
        return float((labels != IGNORE_INDEX).sum())
    return float(batch["input_ids"].shape[0])


def _model_batch(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k in MODEL_INPUTS}


def train(model, train_features: list, config: TrainConfig, *, evaluate=None, save=None,
          output_dir=None, pad_id: int = 0, baseline: tuple[float, str] | None = None, run_config: dict | None = None,
          log=print, batches=None) -> TrainResult:
    """Fine-tune `model` in place; returns the per-epoch history and the best epoch.

    run_config: the task's whole config, written to OUTPUT/run_config.json for --resume.
    batches(parts) -> a batch stream over `train_features` with `parts` micro-batches per update, the
    way `EpochBatches` is one (the default): for a task whose batches are drawn otherwise.
    baseline: (value of config.metric, what it is) of a trivial predictor on the
    dev set; a best epoch no better than it gets a warning, and curves.png the line.
    """
    config.validate()
    if not train_features:
        raise BertkitError("no training features: the training file produced no usable examples")
    if config.resume and output_dir is None:
        raise BertkitError("--resume needs the run's --output directory")
    info = distributed.setup(config.device)
    try:
        return _train(model, train_features, config, info, evaluate, save, output_dir, pad_id, baseline, run_config,
                      log, batches)
    finally:
        distributed.teardown()


def _train(model, features, config, info, evaluate, save, output_dir, pad_id, baseline, run_config, log,
           batches) -> TrainResult:
    t_start, metric = time.perf_counter(), config.metric or "accuracy"
    torch.manual_seed(config.seed + info.rank)  # dropout masks: a different stream per process
    parts = config.grad_accum * info.world_size
    stream = batches(parts) if batches else EpochBatches(features, config.batch_size, parts, config.seed,
                                                         config.group_by_length, pad_id)
    per_epoch = stream.steps_per_epoch
    total = min(math.ceil(per_epoch * config.epochs), config.max_steps or math.inf)
    out = Path(output_dir) if output_dir is not None else None
    # a finished run has deleted its checkpoint but not its metrics: it is a run all the same
    if out is not None and not config.resume and (latest_checkpoint(out) or (out / "metrics.jsonl").is_file()):
        raise BertkitError(f"{out} already holds a run: pass --resume to continue it, or another --output")
    # finished: the model is saved and the checkpoint deleted (a run killed before its first checkpoint
    # has no model yet: resume_state starts it again from the beginning)
    if config.resume and latest_checkpoint(out) is None and (out / "model.safetensors").is_file():
        raise BertkitError(f"--resume: the run in {out} finished and deleted its checkpoint (a run started with "
                           "--keep-checkpoint keeps it); fine-tune again into another --output, --model being "
                           "this run's model to continue from its weights")
    state = resume_state(out, len(features), info.world_size, config.save_every,
                         log if info.is_main else (lambda line: None)) if config.resume else None
    if state and state["data"]["batch"] != [config.batch_size, stream.parts]:
        raise BertkitError(f"--resume: the run used --batch-size {state['data']['batch'][0]} and --grad-accum "
                           f"{state['data']['batch'][1] // info.world_size}; resume with the same")
    model = prepare_model(model, info)
    optimizer = build_optimizer(model, config.optim)
    scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
    start_step, stream.position = restore_training_state(state, model, optimizer, info, scaler) if state else (0, 0)
    # what fine-tuning adds to the checkpoint: the epochs so far and the best one's weights
    run = state["finetune"] if state else {"history": [], "best": None, "epoch_losses": [], "best_weights": None}
    if run["best"] is not None and run["best_weights"] is None:  # the best epoch is the checkpointed one
        run["best_weights"] = _weights(model)
    del state
    log_file = None
    if out is not None and info.is_main:  # the run can start: only now does the output directory appear
        out.mkdir(parents=True, exist_ok=True)
        if run_config is not None:
            (out / "run_config.json").write_text(json.dumps(run_config, indent=2) + "\n")
        log_file = MetricsLog(out / "metrics.jsonl", keep_through_step=start_step if config.resume else None)
    clock = {"epoch_start": time.perf_counter()}
    kept = {"predictions": None}  # the best epoch's, when it ran in this process (not after a --resume)

    def on_record(rec: dict) -> None:
        if rec["split"] == "train":
            run["epoch_losses"].append(rec["loss"])
        if log_file:
            log_file(rec)

    def end_of_epoch(m, step: int) -> dict:
        m = distributed.unwrap(m)
        rec = {"epoch": math.ceil(step / per_epoch), "step": step,
               "train_loss": float(np.mean(run["epoch_losses"])) if run["epoch_losses"] else float("nan"),
               "train_seconds": round(time.perf_counter() - clock["epoch_start"], 2)}
        run["epoch_losses"] = []
        if evaluate is not None:
            t1 = time.perf_counter()
            scores = evaluate(m)
            scores, predictions = scores if isinstance(scores, tuple) else (scores, None)
            rec.update(scores)
            rec["eval_seconds"] = round(time.perf_counter() - t1, 2)
            value, best = rec.get(metric), run["best"]
            if value is None:
                raise BertkitError(f"metric {metric!r} not among the evaluation results {sorted(rec)}")
            why = better(rec, best, metric, config.greater_is_better)
            if why:
                run["best"], run["best_weights"], kept["predictions"] = {**rec, "saved_because": why}, _weights(m), predictions
                if save is not None and info.is_main:
                    save(m)
        elif save is not None and info.is_main:
            save(m)
        run["history"].append(rec)
        if info.is_main:
            log(json.dumps(rec))
        clock["epoch_start"] = time.perf_counter()
        return rec

    def checkpoint(step: int) -> None:
        best = run["best"]
        # the best epoch's weights go in only when they are not the checkpoint's own
        keep = {**run, "best_weights": run["best_weights"] if best is not None and best["step"] != step else None}
        save_training_state(out, step, model, optimizer, stream, info, scaler=scaler, keep=config.keep_last,
                            finetune=keep)
        if step % per_epoch == 0:  # an epoch's train_seconds count no checkpoint writing
            clock["epoch_start"] = time.perf_counter()

    loop = LoopConfig(max_steps=total, grad_accum=config.grad_accum, precision=config.precision,
                      eval_every=per_epoch, save_every=config.save_every or per_epoch, optim=config.optim,
                      desc="finetune")
    train_loop(model, optimizer, stream, loop, info=info, start_step=start_step, evaluate=end_of_epoch,
               weigh=loss_terms, scaler=scaler, on_record=on_record, progress=config.progress,
               on_checkpoint=checkpoint if out is not None else None)
    history, best = run["history"], run["best"]
    if best is not None and best["epoch"] != history[-1]["epoch"]:
        distributed.unwrap(model).load_state_dict(run["best_weights"])  # end on the best epoch, as saved
    if info.is_main:
        warn_if_trivial(best, metric, config.greater_is_better, baseline, log)
        if out is not None and not config.keep_checkpoint:
            _delete_checkpoints(out, log)
        if out is not None:
            refs = {metric: [(baseline[0], f"trivial baseline ({baseline[1]})")]} if baseline else {}
            plot_curves(out / "metrics.jsonl", out / "curves.png",
                        (("loss", "training loss"), ("lr", "learning rate"), (metric, f"dev {metric} per epoch")), refs)
    return TrainResult(history, best, time.perf_counter() - t_start, info.is_main, kept["predictions"])


def _delete_checkpoints(out: Path, log) -> None:
    """A finished run needs no resume point: the model is saved, the checkpoint is ~3x its size."""
    paths = checkpoint_paths(out)
    size = sum(p.stat().st_size for p in paths)
    for p in paths:
        p.unlink()
    if (out / CHECKPOINT_DIR).is_dir() and not any((out / CHECKPOINT_DIR).iterdir()):
        (out / CHECKPOINT_DIR).rmdir()
    if paths:
        log(f"deleted the resume checkpoint ({size / 2**20:.0f} MB): the run is finished "
            "(--keep-checkpoint keeps it)")


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def better(new: dict, best: dict | None, metric: str, greater_is_better: bool = True) -> str:
    """Why epoch record `new` beats `best` (the best so far), or "" when it does not.

    A higher `metric` (lower, when not `greater_is_better`) wins. A tie, common on a small dev set
    where every epoch scores 100%, goes to the lower "held_out_loss" when both records have one
    (the more confident of two equally right models), else to the later epoch (more training).
    """
    value = new[metric]
    if best is None:
        return f"the first epoch evaluated ({metric} {value:.4f})"
    old = best[metric]
    if value != old:
        wins = value > old if greater_is_better else value < old
        return f"the best {metric} ({value:.4f}, against {old:.4f} in epoch {best['epoch']})" if wins else ""
    tie = f"{metric} tied with epoch {best['epoch']} ({value:.4f})"
    if "held_out_loss" in new and "held_out_loss" in best:
        loss, before = new["held_out_loss"], best["held_out_loss"]
        return f"{tie}, lower held-out loss ({loss:.4f} against {before:.4f})" if loss < before else ""
    return f"{tie}, the later epoch"


def warn_if_trivial(best: dict | None, metric: str, greater_is_better: bool, baseline, log=print) -> bool:
    """Say so when the best epoch is no better than a trivial predictor (issue: runs that learn nothing)."""
    if best is None or baseline is None:
        return False
    value, what = best[metric], baseline[1]
    if (value > baseline[0]) if greater_is_better else (value < baseline[0]):
        return False
    log(f"warning: the best dev {metric} ({value:.4f}, epoch {best['epoch']}) is no better than the trivial "
        f"baseline {baseline[0]:.4f} ({what}): the model learned nothing usable. Train longer "
        "(--epochs, --max-steps), raise --learning-rate, or give it more training data")
    return True
