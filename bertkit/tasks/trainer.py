"""Fine-tuning's side of the one run harness: labelled features in, the best epoch out.

Fine-tuning (BERT paper section 4 and A.3) is a few epochs of AdamW over
labelled features, the rate warmed up and decayed linearly. The run is
`bertkit.training.harness` around `bertkit.training.loop` (accumulation,
clipping, bf16, DDP, NaN stop, checkpoints, exact resume); this module adds
what is particular to it: the batches, and the epochs (`Epochs`). A
*feature* is a dict holding `input_ids` and optionally `token_type_ids`,
`labels`, `start_positions`, `end_positions`, `teacher_logits` (anything else, such as
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
- a warning the evaluation gives (a constant regression's undefined
  correlation) is shown once a run, not after every epoch (`warnings_once`);
- dropout draws from the global torch generator, seeded here per process.

Shapes: B batch, T longest feature in the batch; input_ids (B, T) int64.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertkit.data.lock import first_process
from bertkit.errors import BertkitError, figure, undefined
from bertkit.tasks.batching import collate, loss_terms
from bertkit.training import distributed, harness
from bertkit.training.loop import LoopConfig

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions",
                "teacher_logits")


@dataclass
class TrainResult:
    history: list[dict]  # one record per epoch: epoch, step, train_loss, seconds, metrics...
    best: dict | None  # the best record (None without evaluation)
    seconds: float
    is_main: bool = True  # False on the other processes of a torchrun: they write nothing
    best_predictions: object = None  # what evaluate returned beside the scores for the best epoch, if any
    said: set = field(default_factory=set)  # the evaluation's warnings shown in this run (`warnings_once`)

    @property
    def saved(self) -> dict:
        """What a run's metrics.json says of the model it saved: {"saved": {"epoch", "because"}} (`better`), which
        `bertkit finetune` prints; {} without evaluation (the last epoch is saved)."""
        if self.best is None:
            return {}
        return {"saved": {"epoch": self.best["epoch"], "because": self.best["saved_because"]}}


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
        self._cache, self._rows = (None, None), None

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
        idx, where = micro_rows(self, slot, "features")
        return _model_batch(collate([self.features[i] for i in idx], self.pad_id)), where

    def advance(self, micro_batches: int) -> None:
        self.position += micro_batches

    def state(self) -> dict:
        if self._rows is None:  # what a --resume compares: the same count of other rows is other data
            # a distillation's teacher logits are left out: its --resume checks the teacher itself, and they
            # may differ in the last bits when computed again on another device
            self._rows = rows_hash([{k: f[k] for k in MODEL_INPUTS if k in f and k != "teacher_logits"}
                                    for f in self.features])
        return {"position": self.position, "seed": self.seed, "num_instances": len(self.features),
                "batch": [self.size // self.parts, self.parts], "rows": self._rows}


def micro_rows(stream, slot: int, what: str) -> tuple[list[int], str]:
    """The indices micro-batch `slot` (counted from `stream.position`) of a batch stream takes, and where they stand
    in words: update u's batch (`stream.batches(epoch)`) cut in `stream.parts` shares, share p to micro-batch
    u x parts + p. `EpochBatches` and the embedding run's stream (`what`: "features", "rows") take theirs so."""
    update, part = divmod(stream.position + slot, stream.parts)
    epoch, k = divmod(update, stream.steps_per_epoch)
    idx = [int(i) for i in np.array_split(stream.batches(epoch)[k], stream.parts)[part]]
    return idx, (f"epoch {epoch + 1}, batch {k + 1}, part {part + 1}/{stream.parts} "
                 f"({what} {idx[:4]}{'...' if len(idx) > 4 else ''})")


def rows_hash(rows: list) -> str:
    """A digest of a run's training rows (lists, numbers, strings), kept in its checkpoints."""
    text = json.dumps(rows, separators=(",", ":"), default=lambda v: v.tolist())  # numpy scalars as numbers
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _model_batch(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k in MODEL_INPUTS}


def check_run_output(output_dir, config) -> None:
    """What `train` refuses about `output_dir` (another run there, or --resume of a finished one), asked before
    costly work that comes first (`config`: a TrainConfig)."""
    harness.check_run_folder(Path(output_dir), config.resume, config.keep_checkpoint)


def train(model, train_features: list, config, *, evaluate=None, save=None,
          output_dir=None, pad_id: int = 0, baseline: tuple[float, str] | None = None, run_config: dict | None = None,
          log=print, batches=None, speed=None, desc: str = "finetune", said: set | None = None) -> TrainResult:
    """Fine-tune `model` in place; returns the per-epoch history and the best epoch.

    config: the loop's settings, a `bertkit.tasks.config.TrainConfig` (named, not imported: the task's
    run hands it in, so the trainer needs nothing else of the settings module).
    run_config: the task's whole config, written to OUTPUT/run_config.json for --resume.
    batches(parts) -> a batch stream over `train_features` with `parts` micro-batches per update, the
    way `EpochBatches` is one (the default): for a task whose batches are drawn otherwise.
    baseline: (value of config.metric, what it is) of a trivial predictor on the
    dev set; a best epoch no better than it gets a warning, and curves.png the line.
    speed: the fast path's settings (`bertkit.runtime.fast.SpeedSettings`; None: `decide()`'s).
    desc: the progress bar's label, what runs (distill's runs train here too: they said "finetune").
    said: the warnings an evaluation before training showed (`warnings_once`): not shown again.
    """
    config.validate()
    if not train_features:
        raise BertkitError("no training features: the training file produced no usable examples")
    if config.resume and output_dir is None:
        raise BertkitError("--resume needs the run's --output directory")
    t_start, metric = time.perf_counter(), config.metric or "accuracy"
    with harness.processes(config.device) as info:
        parts = config.grad_accum * info.world_size
        stream = batches(parts) if batches else EpochBatches(train_features, config.batch_size, parts, config.seed,
                                                             config.group_by_length, pad_id)
        per_epoch = stream.steps_per_epoch
        loop = LoopConfig(max_steps=min(math.ceil(per_epoch * config.epochs), config.max_steps or math.inf),
                          grad_accum=config.grad_accum, precision=config.precision, eval_every=per_epoch,
                          save_every=config.save_every or per_epoch, optim=config.optim, desc=desc)
        settings = harness.RunSettings(None if output_dir is None else Path(output_dir), loop, config.seed,
                                       resume=config.resume, keep_last=config.keep_last,
                                       keep_checkpoints=config.keep_checkpoint, progress=config.progress,
                                       run_config=run_config, epoch_steps=per_epoch, speed=speed)
        job = harness.start(settings, info, stream, lambda extras: model, log)
        epochs = Epochs(per_epoch, metric, config.greater_is_better, evaluate, save, info.is_main, log,
                        said=set() if said is None else said)
        epochs.resume(job.extras, distributed.unwrap(job.model))
        harness.train(job, harness.Hooks(evaluate=epochs.end, weigh=loss_terms, on_record=epochs.record,
                                         extras=epochs.saved, after_checkpoint=epochs.checkpointed))
        history, best = epochs.history, epochs.best
        if best is not None and best["epoch"] != history[-1]["epoch"]:
            distributed.unwrap(job.model).load_state_dict(epochs.best_weights)  # end on the best epoch, as saved
        if info.is_main:
            warn_if_trivial(best, metric, config.greater_is_better, baseline, log)
        refs = {metric: [(baseline[0], f"trivial baseline ({baseline[1]})")]} if baseline else {}
        harness.finish(job, (("loss", "training loss"), ("lr", "learning rate"), (metric, f"dev {metric} per epoch")),
                       refs)
    return TrainResult(history, best, time.perf_counter() - t_start, info.is_main, epochs.predictions, epochs.said)


@dataclass
class Epochs:
    """Fine-tuning's bookkeeping across epochs, kept in the checkpoints: the history, the best epoch
    (by `metric`) and its weights, the losses of the epoch under way. Its methods are the hooks it
    gives the run (`bertkit.training.harness.Hooks`)."""

    per_epoch: int
    metric: str
    greater_is_better: bool
    evaluate: object  # evaluate(model) -> scores | (scores, predictions), or None
    save: object  # save(model), on the main process, for the best epoch (every epoch without evaluate)
    is_main: bool
    log: object
    history: list = field(default_factory=list)
    best: dict | None = None
    epoch_losses: list = field(default_factory=list)
    best_weights: dict | None = None
    predictions: object = None  # the best epoch's, when it ran in this process (not after a --resume)
    said: set = field(default_factory=set)  # the evaluation's warnings shown so far (`warnings_once`)
    started: float = field(default_factory=time.perf_counter)

    def resume(self, extras: dict | None, model) -> None:
        """Take up the epochs a resumed checkpoint recorded."""
        if extras is None:
            return
        kept = extras["finetune"]
        self.history, self.best, self.epoch_losses = kept["history"], kept["best"], kept["epoch_losses"]
        self.best_weights = kept["best_weights"]
        if self.best is not None and "saved_because" not in self.best:  # an earlier bertkit's record kept no reason
            self.best["saved_because"] = f"the best {self.metric} ({figure(self.best[self.metric])}) before the resume"
        if self.best is not None and self.best_weights is None:  # the best epoch is the checkpointed one
            self.best_weights = _weights(model)

    def record(self, rec: dict) -> None:
        if rec["split"] == "train":
            self.epoch_losses.append(rec["loss"])

    def end(self, model, step: int) -> dict:
        """The end of an epoch: its record, the dev scores, the best epoch kept (and saved)."""
        m = distributed.unwrap(model)
        rec = {"epoch": math.ceil(step / self.per_epoch), "step": step,
               "train_loss": float(np.mean(self.epoch_losses)) if self.epoch_losses else None,  # JSON has no NaN
               "train_seconds": round(time.perf_counter() - self.started, 2)}
        self.epoch_losses = []
        if self.evaluate is not None:
            t1 = time.perf_counter()
            scores = warnings_once(lambda: self.evaluate(m), self.said)
            scores, predictions = scores if isinstance(scores, tuple) else (scores, None)
            rec.update(scores)
            rec["eval_seconds"] = round(time.perf_counter() - t1, 2)
            if self.metric not in rec:  # present but None: a figure undefined this epoch (a constant regression)
                raise BertkitError(f"metric {self.metric!r} not among the evaluation results {sorted(rec)}")
            why = better(rec, self.best, self.metric, self.greater_is_better)
            if why:
                self.best, self.best_weights, self.predictions = {**rec, "saved_because": why}, _weights(m), predictions
                if self.save is not None and self.is_main:
                    self.save(m)
        elif self.save is not None and self.is_main:
            self.save(m)
        self.history.append(rec)
        if self.is_main:
            self.log(json.dumps(rec))
        self.started = time.perf_counter()
        return rec

    def saved(self, step: int) -> dict:
        """What a checkpoint holds of the epochs: the best epoch's weights only when they are not its own."""
        best = self.best
        return {"finetune": {"history": self.history, "best": best, "epoch_losses": self.epoch_losses,
                             "best_weights": self.best_weights if best is not None and best["step"] != step else None}}

    def checkpointed(self, step: int) -> None:
        if step % self.per_epoch == 0:  # an epoch's train_seconds count no checkpoint writing
            self.started = time.perf_counter()


def warnings_once(fn, said: set):
    """fn(), each warning it raises shown unless one of the same words was shown before (`said`, updated).

    A constant regression warns "every example the same score -0.0084: ... undefined" after every epoch, its
    number new each time, so Python's own filter (once per text) let each through: N epochs, N warnings of one
    cause. Here the numbers are left out of what makes two warnings the same. Under torchrun every process
    evaluates, and only the first shows them (as only it prints the run's lines): N processes, one warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    for w in caught:
        cause = (w.category, re.sub(r"\d+(\.\d+)?", "#", str(w.message)))
        if cause not in said:
            said.add(cause)
            if first_process():  # torchrun's RANK, read before the group is joined
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # through the caller's filters
    return out


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
        return f"the first epoch evaluated ({metric} {figure(value)})"
    old = best[metric]
    if not (undefined(value) and undefined(old)) and value != old:
        # an undefined figure (None: a correlation of constant predictions; or nan) never wins, and any number
        # beats it, else an undefined first epoch was kept over every later one; two undefined ones tie
        wins = not undefined(value) and (undefined(old) or (value > old if greater_is_better else value < old))
        return f"the best {metric} ({figure(value)}, against {figure(old)} in epoch {best['epoch']})" if wins else ""
    tie = f"{metric} tied with epoch {best['epoch']} ({figure(value)})"
    if "held_out_loss" in new and "held_out_loss" in best:
        loss, before = new["held_out_loss"], best["held_out_loss"]
        return f"{tie}, lower held-out loss ({loss:.4f} against {before:.4f})" if loss < before else ""
    return f"{tie}, the later epoch"


def warn_if_trivial(best: dict | None, metric: str, greater_is_better: bool, baseline, log=print) -> bool:
    """Say so when the best epoch is no better than a trivial predictor (issue: runs that learn nothing)."""
    if best is None or baseline is None:
        return False
    value, what = best[metric], baseline[1]
    if not undefined(value) and ((value > baseline[0]) if greater_is_better else (value < baseline[0])):
        return False
    log(f"warning: the best dev {metric} ({figure(value)}, epoch {best['epoch']}) is no better than the trivial "
        f"baseline {baseline[0]:.4f} ({what}): the model learned nothing usable. Train longer "
        "(--epochs, --max-steps), raise --learning-rate, or give it more training data")
    return True
