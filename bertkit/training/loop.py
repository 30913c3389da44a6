"""The training loop: the one loop pre-training and every fine-tuning task run.

It knows two things only: a model whose output has a `.loss`, and a *batch
stream* that hands out the micro-batch of any position (`micro_batch(slot)
-> (batch dict, description)`, `advance(n)`, `state()`; see
`bertkit.pretraining.train.BatchStream` and `bertkit.tasks.trainer.EpochBatches`).
Which model, which data and what "evaluation" means is the caller's business,
passed in as callbacks; the steps around the loop (resume, checkpoints, the
metrics file) are `bertkit.training.harness`, its one caller.

One update (step s) on rank r of W, accumulating A micro-batches:

    batches = stream.micro_batch(slot (s, a, r)) for a in 0..A-1   # seek, never replay
    weights: 1 each, or weigh(batch) (the loss terms it averages), summed over all ranks
    for a in 0..A-1:
        with autocast(bf16 | fp16 | off):  loss = model(**batch).loss
        (loss * W * weight_a / total_weight).backward()   # DDP averages over W: the W cancels
        (DDP all-reduces the gradients on the last micro-batch only)
    stop if any loss or the gradient norm is NaN/inf (naming step, rank, batch)
    clip the global gradient norm; lr = lr_at(s); optimizer step
    log (tqdm + a record), evaluate every E steps, checkpoint every C steps

With `weigh` the update is the mean over every loss term of the W x A
micro-batches (for token-level tasks: every labelled token), exactly as one
batch holding them all; without it each micro-batch counts equally (the mean
of the micro-batch means, as google-research/bert does).

Exact resume: the micro-batch of (s, a, r) is a pure function of the stream's
seed and position, the learning rate a pure function of s, and a checkpoint
(`bertkit.training.state`) stores weights, optimizer moments, RNG states and
the stream position; a resumed run draws the very same batches and dropout.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from bertkit.errors import BertkitError
from bertkit.runtime.devices import resolve_dtype
from bertkit.runtime.fast import accelerate
from bertkit.training import distributed
from bertkit.training.optim import OptimConfig, lr_at, set_lr, warmup_steps_for

class NonFiniteLoss(BertkitError):
    """The loss or the gradients became NaN/inf: training stops instead of going on silently."""


@dataclass
class LoopConfig:
    """What the loop needs; pre-training and fine-tuning each build one from their own settings."""

    max_steps: int
    grad_accum: int = 1
    precision: str = "fp32"
    log_every: int = 1
    eval_every: int = 0  # 0: never
    save_every: int = 0  # 0: only at the end
    optim: OptimConfig = field(default_factory=OptimConfig)
    desc: str = "train"  # the progress bar's label

    def checkpoints_after(self, step: int) -> int:
        """How many checkpoints the loop still writes after step `step`: one every save_every steps and one at
        max_steps (the trainers' free-space warning counts only these, not --keep-last, for a short run)."""
        if step >= self.max_steps:
            return 0
        return 1 + ((self.max_steps - 1) // self.save_every - step // self.save_every if self.save_every else 0)


def micro_batch_slot(step_offset: int, accum_index: int, rank: int, world_size: int, grad_accum: int) -> int:
    """Which micro-batch (in the global order since the start position) a rank computes.

    Update s consumes W * A consecutive micro-batches; rank r takes the ones
    r, r + W, ... so that W ranks with A micro-batches each cover exactly the
    micro-batches one process would accumulate with W * A.
    """
    return (step_offset * grad_accum + accum_index) * world_size + rank


def autocast_for(precision: str, device: str):
    """A context factory: bf16 autocast (CPU or GPU), fp16 autocast (GPU), or nothing."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if precision == "fp32":
        return contextlib.nullcontext
    if precision == "fp16" and device_type != "cuda":
        raise BertkitError("--precision fp16 needs a CUDA GPU (its GradScaler); on the CPU use --precision bf16")
    # bf16 on a CPU that only emulates it warns once (see bertkit.runtime.devices.resolve_dtype)
    dtype = resolve_dtype(torch.bfloat16, torch.device(device_type)) if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type, dtype=dtype)


def check_device(device: str, precision: str) -> None:
    """Fail at once, before any loading, when this machine cannot give the device and precision asked for."""
    autocast_for(precision, distributed.pick_device(device))


def move(batch: dict, device: str) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def prepare_model(model: torch.nn.Module, info: distributed.DistInfo, *, fsdp: bool = False,
                  compile: bool = False, speed=None) -> torch.nn.Module:
    """The one place a freshly built model is made ready to train: the CPU fast path
    (`bertkit.runtime.fast.accelerate` on the settings `speed`, None: `decide()`'s; exact gradients),
    device, DDP/FSDP, torch.compile."""
    model = distributed.wrap(accelerate(model.to(info.device), speed, training=True), info, fsdp)
    return torch.compile(model) if compile else model


def train_loop(model, optimizer, stream, cfg: LoopConfig, *, info=None, start_step: int = 0, evaluate=None,
               weigh=None, count=None, rates=None, scaler=None, on_record=None, on_checkpoint=None,
               progress: bool = True) -> list:
    """Train from `start_step` to cfg.max_steps. Returns the logged training records.

    evaluate(model, step) -> dict is called every cfg.eval_every steps and at the
    end (its dict becomes an `"split": "eval"` record); weigh(batch) -> float the
    number of loss terms of a micro-batch (see the module docstring);
    count(out, batch) -> dict of sums (e.g. correct predictions), summed over
    micro-batches and ranks, and rates(sums) -> dict what the record shows of
    them; on_record(record) receives every record (the same on every rank); on_checkpoint(step)
    is called every cfg.save_every steps and at the end.
    """
    info = info or distributed.DistInfo()
    autocast = autocast_for(cfg.precision, info.device)
    warmup = warmup_steps_for(cfg.max_steps, cfg.optim.warmup_ratio)
    A, W = cfg.grad_accum, info.world_size
    records = []
    bar = tqdm(total=cfg.max_steps, initial=start_step, desc=cfg.desc, unit="step",
               disable=not (progress and info.is_main), dynamic_ncols=True)
    model.train()
    for step in range(start_step, cfg.max_steps):
        t0 = time.perf_counter()
        lr = lr_at(step, peak_lr=cfg.optim.learning_rate, warmup_steps=warmup, total_steps=cfg.max_steps,
                   schedule=cfg.optim.schedule)
        set_lr(optimizer, lr)
        # slots count from the stream's position, which advances by W * A micro-batches per step
        micro = [stream.micro_batch(micro_batch_slot(0, a, info.rank, W, A)) for a in range(A)]
        sums, bad = _accumulate(model, micro, info, autocast, scaler, weigh, count)
        try:
            norm = _update(model, optimizer, scaler, cfg.optim.max_grad_norm, bad, info, step)
        except NonFiniteLoss:
            bar.close()
            raise
        stream.advance(A * W)
        dt = time.perf_counter() - t0
        done, last = step + 1, step + 1 == cfg.max_steps
        if done % cfg.log_every == 0 or last:
            rec = _train_record(sums, info, rates, done, lr, norm, dt)
            records.append(rec)
            if info.is_main:
                bar.set_postfix({k: bar_value(k, v) for k, v in rec.items() if k not in ("split", "step", "grad_norm")},
                                refresh=False)  # drawn by update(), at its pace (mininterval)
            if on_record:
                on_record(rec)
        if evaluate and cfg.eval_every and (done % cfg.eval_every == 0 or last):
            rec = {"split": "eval", "step": done, **evaluate(model, done)}
            model.train()
            if on_record:
                on_record(rec)
        if on_checkpoint and ((cfg.save_every and done % cfg.save_every == 0) or last):
            on_checkpoint(done)
        bar.update(1)
    bar.close()
    return records


def _accumulate(model, micro: list, info, autocast, scaler, weigh, count) -> tuple[dict, list]:
    """Forward and backward of this rank's micro-batches, each loss scaled by its share of the whole update.

    Returns this rank's sums (count's, "tokens", "loss" as its share of the update's mean) and a
    line per micro-batch whose loss was not finite."""
    A, W = len(micro), info.world_size
    weights = [weigh(b) if weigh else 1.0 for b, _ in micro]
    total = distributed.sum_over_ranks({"w": sum(weights)}, info)["w"] if weigh else float(A * W)
    counts, loss_sum, bad, tokens = {}, 0.0, [], 0.0
    for a, (batch, where) in enumerate(micro):
        batch = move(batch, info.device)
        share = weights[a] / total  # of the whole update, over all ranks
        # DDP reads no_sync at forward time, FSDP at backward time: wrap both
        with distributed.no_sync(model, skip=a < A - 1):
            with autocast():
                out = model(**batch)
            loss = out.loss.float()
            if not torch.isfinite(loss):
                bad.append(f"micro-batch {a} ({where}): loss {loss.item()}")
            scaled = loss * (share * W)
            (scaler.scale(scaled) if scaler else scaled).backward()
        loss_sum += loss.item() * share
        tokens += _tokens(batch)
        if count:
            add_counts(counts, count(out, batch))
    return {**counts, "tokens": tokens, "loss": loss_sum}, bad


def _update(model, optimizer, scaler, max_grad_norm, bad: list, info, step: int) -> torch.Tensor:
    """Clip the global gradient norm, stop on a non-finite loss or norm (on every rank), step. Returns the norm."""
    if scaler:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    # every rank must agree to stop, or the others would wait forever in the next all-reduce
    flags = distributed.sum_over_ranks({"bad": float(len(bad))}, info)
    if flags["bad"] or (not torch.isfinite(norm) and scaler is None):
        if bad:
            detail = "; ".join(bad)
        elif not torch.isfinite(norm):
            detail = f"the loss was finite but the gradient norm is {float(norm)}"
        else:
            detail = "the loss of another rank was not finite"
        raise NonFiniteLoss(
            f"non-finite loss at step {step + 1} on rank {info.rank}: {detail}. "
            "Lower --learning-rate, keep --max-grad-norm on, or use --precision fp32"
        )
    if scaler:
        scaler.step(optimizer)  # skipped (and the scale lowered) when fp16 gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def _train_record(sums: dict, info, rates, step: int, lr: float, norm, dt: float) -> dict:
    """The "train" record of an update: its sums over the ranks, the rates made of them, lr, norm, tokens/s."""
    sums = distributed.sum_over_ranks(sums, info)
    norm = float(norm)  # inf or nan where fp16's scaler skipped the step: null, as strict JSON readers take it
    return {"split": "train", "step": step, "loss": sums.pop("loss"), **(rates(sums) if rates else {}),
            "lr": lr, "grad_norm": norm if math.isfinite(norm) else None, "tokens_per_s": sums["tokens"] / dt}


def _tokens(batch: dict) -> float:
    if "attention_mask" in batch:
        return float(batch["attention_mask"].sum())
    return float(batch["input_ids"].numel()) if "input_ids" in batch else 0.0


def add_counts(total: dict, more: dict) -> dict:
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + v
    return total


def bar_value(name: str, x: float) -> str:
    """A record's value as the progress bar shows it: a rate per second as a whole number, thousands separated
    (as `pretrain prepare` prints its tokens/s), at every size; else 4 decimals, or 3 significant digits for a
    value too small or large for them."""
    if name.endswith("_per_s"):
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.4f}"
