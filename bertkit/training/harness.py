"""One training run: the steps every run takes around the one loop, written once.

Pre-training (`bertkit.pretraining.train`), fine-tuning and sentence-embedding
training (`bertkit.tasks.trainer`) and distillation take the same steps in the
same order; what differs between them is the model, the batches, evaluation
and what they keep beside the training state, and that is what they hand in.
One run, on every process of a torchrun (or alone):

    with processes(device) as info:                    # torchrun's process group, or one process
        stream = the caller's batch stream             # micro_batch(slot), advance(n), state(), .position
        run = start(settings, info, stream, build)
            refuse an OUTPUT that holds another run, unless settings.resume
            torch.manual_seed(seed + rank)             # dropout: one stream per process
            state = OUTPUT's last checkpoint (resume), checked against the data and the processes
            model = prepare_model(build(state's extras))   # fast path, device, DDP/FSDP, torch.compile
            optimizer (AdamW | LAMB), GradScaler (fp16 only)
            weights, moments, RNG states and stream position from state
            OUTPUT/run_config.json, OUTPUT/metrics.jsonl   # only now does OUTPUT appear
        train(run, hooks)                              # bertkit.training.loop from run.start_step
            every record: hooks.on_record, then metrics.jsonl
            every loop.save_every steps and at the end: a checkpoint of the training state
            (bertkit.training.state) + hooks.extras(step), then hooks.after_checkpoint(step)
        model = final_model(run, rebuild)              # the plain model, FSDP shards gathered (rank 0)
        finish(run, panels, references)                # OUTPUT/curves.png, then delete checkpoints (if asked)

`build(extras)` makes the model to train: `extras` is what `hooks.extras`
saved in the checkpoint being resumed (None on a fresh run), so a run can
rebuild the architecture its checkpoint recorded; a caller holding its model
already ignores it. `run.extras` keeps the same dict for the caller's own
bookkeeping (fine-tuning's epochs and best epoch). Randomness: the global torch
generator is seeded before `build` and restored from the checkpoint after it,
so a resumed run draws the very dropout masks the killed one would have.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from bertkit.errors import BertkitError
from bertkit.training import distributed
from bertkit.training.loop import LoopConfig, prepare_model, train_loop
from bertkit.training.metrics_log import MetricsLog, plot_curves, read_metrics
from bertkit.training.optim import build_optimizer
from bertkit.training.state import (
    CHECKPOINT_DIR,
    checkpoint_paths,
    latest_checkpoint,
    restore_training_state,
    resume_state,
    save_run_config,
    save_training_state,
)

CURVES = "curves.png"  # drawn when a run ends, before its checkpoints are deleted

# what `save_training_state` writes itself; the rest of a checkpoint is the caller's (`hooks.extras`)
TRAINING_STATE = ("step", "model", "optimizer", "rng", "data", "scaler")


@dataclass
class RunSettings:
    """What every run is told, whichever kind it is (each builds one from its own config)."""

    output: Path | None  # None: nothing is written (no checkpoints, no metrics; a library call)
    loop: LoopConfig
    seed: int
    resume: bool = False
    keep_last: int = 3  # checkpoints kept while the run trains
    keep_checkpoints: bool = True  # False: a finished run deletes its checkpoints (its model is saved)
    optimizer: str = "adamw"  # or "lamb"
    fsdp: bool = False
    compile: bool = False
    progress: bool = True
    run_config: dict | None = None  # written to OUTPUT/run_config.json, for --resume
    epoch_steps: int = 0  # updates per epoch, for a run counted in epochs (0: counted in steps)
    speed: object = None  # the fast path's SpeedSettings (the command decided them); None: decide()'s


@dataclass
class Hooks:
    """What a kind of run adds to the loop; every one optional (see `bertkit.training.loop.train_loop`)."""

    evaluate: Callable | None = None  # (model, step) -> scores, every loop.eval_every steps and at the end
    weigh: Callable | None = None  # batch -> its loss terms
    count: Callable | None = None  # (out, batch) -> sums
    rates: Callable | None = None  # sums -> what the record shows
    on_record: Callable | None = None  # every record, before metrics.jsonl gets it
    extras: Callable | None = None  # step -> dict the checkpoint holds beside the training state
    after_checkpoint: Callable | None = None  # step -> None, once the checkpoint is written


@dataclass
class Run:
    """A started run: what `start` made, for `train`, `final_model` and `finish`."""

    settings: RunSettings
    info: distributed.DistInfo
    stream: object  # the batch stream, at the position the run starts from
    model: torch.nn.Module  # prepared: fast path, device, DDP/FSDP, torch.compile
    config: object  # the built model's .config (None if it has none): to rebuild it, to record it
    optimizer: torch.optim.Optimizer
    scaler: object  # torch.amp.GradScaler for fp16, else None
    start_step: int
    extras: dict | None  # the resumed checkpoint's part written by hooks.extras; None on a fresh run
    metrics: MetricsLog | None  # OUTPUT/metrics.jsonl, on the main process
    log: Callable = print


@contextlib.contextmanager
def processes(device: str = "auto"):
    """The process group for the length of a run (torchrun), or this process alone; yields its DistInfo."""
    with distributed.process_group(device) as info:
        yield info


def start(settings: RunSettings, info: distributed.DistInfo, stream, build: Callable, log=print) -> Run:
    """Everything before the first update: checks, resume state, seed, model, optimizer, output folder."""
    out = settings.output
    if out is not None:
        check_output(settings)
    torch.manual_seed(settings.seed + info.rank)  # dropout: a different stream per process
    state = read_state(settings, info, stream, log) if settings.resume else None
    extras = {k: v for k, v in state.items() if k not in TRAINING_STATE} if state else None
    built = build(extras)
    model = prepare_model(built, info, fsdp=settings.fsdp, compile=settings.compile, speed=settings.speed)
    optimizer = build_optimizer(model, settings.loop.optim, settings.optimizer)
    scaler = torch.amp.GradScaler("cuda") if settings.loop.precision == "fp16" else None
    start_step, stream.position = restore_training_state(state, model, optimizer, info, scaler) if state else (0, 0)
    del state  # the loaded copy of the weights and optimizer moments: not needed any more
    metrics = None
    if out is not None and info.is_main:  # the run can start: only now does OUTPUT appear
        out.mkdir(parents=True, exist_ok=True)
        if settings.run_config is not None:  # on resume: the saved settings with the flags given on top
            save_run_config(out, settings.run_config)
        metrics = MetricsLog(out / "metrics.jsonl", keep_through_step=start_step if settings.resume else None)
    distributed.barrier(info)
    return Run(settings, info, stream, model, getattr(built, "config", None), optimizer, scaler, start_step, extras,
               metrics, log if info.is_main else (lambda line: None))


def check_output(settings: RunSettings) -> None:
    """Refuse to start over another run in OUTPUT, or to resume one that finished and deleted its checkpoint."""
    check_run_folder(settings.output, settings.resume, settings.keep_checkpoints)


def check_run_folder(out: Path, resume: bool, keep_checkpoints: bool) -> None:
    """`check_output` before a run is set up: a job with costly work before its loop (distill layers' teacher)
    asks first."""
    # a run that deleted its checkpoint, or stopped before its first, has its metrics: a run all the same
    if not resume and (latest_checkpoint(out) or (out / "metrics.jsonl").is_file()):
        raise BertkitError(f"{out} already holds a run: pass --resume to continue it, or another --output")
    # finished: the curves drawn and the checkpoint deleted, in that order (`finish`); a run killed before its
    # first checkpoint was written (an epoch's best model is saved before it) has no curves: resume_state
    # starts it again from the beginning
    if (resume and not keep_checkpoints and latest_checkpoint(out) is None
            and (out / "model.safetensors").is_file() and (out / CURVES).is_file()):
        raise BertkitError(f"--resume: the run in {out} finished and deleted its checkpoint (a run started with "
                           "--keep-checkpoint keeps it); to continue from its weights, start a new run into another "
                           f"--output with {out} as the model it starts from")


def read_state(settings: RunSettings, info: distributed.DistInfo, stream, log) -> dict | None:
    """The checkpoint to resume (None: the run stopped before its first), checked against this run."""
    if settings.output is None:
        raise BertkitError("--resume needs the run's --output directory")
    data = stream.state()
    per_epoch = settings.epoch_steps and settings.loop.save_every == settings.epoch_steps
    state = resume_state(settings.output, data["num_instances"], info.world_size,
                         None if per_epoch else settings.loop.save_every, log if info.is_main else (lambda line: None))
    if state and state["data"].get("prepared", data.get("prepared")) != data.get("prepared"):  # older: unrecorded
        raise BertkitError("--resume: the training data was prepared again, with other settings, since the run "
                           "started; resume on the data it started with (prepare it as before), or start a new run")
    if state and state["data"].get("rows", data.get("rows")) != data.get("rows"):  # older: unrecorded
        raise BertkitError(f"--resume: the training rows are not the ones the run started on ({data['num_instances']}"
                           " of them, as then, but other contents: the file was edited since, or read with other "
                           "settings); resume on the data it started with, or start a new run")
    if state and state["data"].get("batch") != data.get("batch"):
        size, parts = state["data"]["batch"]
        raise BertkitError(f"--resume: the run used --batch-size {size} and --grad-accum "
                           f"{parts // info.world_size}; resume with the same")
    if state and state["step"] >= settings.loop.max_steps and info.is_main:
        log(f"--resume: the run in {settings.output} finished (step {state['step']} of {settings.loop.max_steps}): "
            "nothing left to train, its end is done again from the last checkpoint; more --max-steps (fine-tuning: "
            "--epochs) trains on")
    return state


def train(run: Run, hooks: Hooks) -> list:
    """The loop from run.start_step to the last step, with metrics.jsonl and checkpoints; its train records."""
    s = run.settings

    def on_record(rec: dict) -> None:
        if hooks.on_record:
            hooks.on_record(rec)
        if run.metrics:
            run.metrics(rec)

    def checkpoint(step: int) -> None:
        save_training_state(s.output, step, run.model, run.optimizer, run.stream, run.info, scaler=run.scaler,
                            keep=s.keep_last, to_come=s.loop.checkpoints_after(step),
                            **(hooks.extras(step) if hooks.extras else {}))
        if hooks.after_checkpoint:
            hooks.after_checkpoint(step)

    return train_loop(run.model, run.optimizer, run.stream, s.loop, info=run.info, start_step=run.start_step,
                      evaluate=hooks.evaluate, weigh=hooks.weigh, count=hooks.count, rates=hooks.rates,
                      scaler=run.scaler, on_record=on_record, progress=s.progress,
                      on_checkpoint=checkpoint if s.output is not None else None)


def final_model(run: Run, rebuild: Callable | None = None) -> torch.nn.Module | None:
    """The trained model, unwrapped, on the main process (None on the others). Under FSDP every
    process takes part in gathering the shards into `rebuild()`, a fresh model of the same shape."""
    if distributed.is_fsdp(run.model):
        model_state = distributed.state_dicts(run.model, run.optimizer)[0]  # a collective: every rank
        if not run.info.is_main:
            return None
        final = rebuild()
        final.load_state_dict(model_state)
        return final
    return distributed.unwrap(run.model) if run.info.is_main else None


def run_metrics(out) -> list:
    """The records of the run in folder `out`, as its metrics.jsonl holds them (oldest first)."""
    return read_metrics(Path(out) / "metrics.jsonl")


def finish(run: Run, panels, references: dict | None = None) -> None:
    """After the last update: draw OUTPUT/curves.png, then delete the checkpoints (unless kept): the curves
    with no checkpoint say the run finished (`check_output`) (main process)."""
    out = run.settings.output
    if out is not None and run.info.is_main:
        plot_curves(out / "metrics.jsonl", out / CURVES, panels, references)
        if not run.settings.keep_checkpoints:
            delete_checkpoints(out, run.log)
    distributed.barrier(run.info)


def delete_checkpoints(out: Path, log) -> None:
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
