"""Training state on disk: atomic checkpoints that resume a run exactly.

A training run is a pure function of (weights, optimizer moments, schedule
step, random number generators, position in the data). A checkpoint stores all
of it, so a run killed at any moment and resumed from its last checkpoint
continues the very same loss curve: same batches, same masks, same dropout.

    OUT/checkpoints/step-00000100.pt   one file per checkpoint, a dict:
        step         optimizer updates done so far (the schedule is a pure
                     function of it, see bertkit.training.optim)
        model        model.state_dict()
        optimizer    optimizer.state_dict()
        scheduler    the scheduler's state_dict (LambdaLR keeps its step there)
        rng          python `random`, numpy and torch generator states, one
                     entry per distributed rank (dropout differs per rank)
        data         the batch stream's state: position, seed, number of
                     instances (plain data, see bertkit.training.loop)
        ...          anything else the caller wants back (the run config;
                     fine-tuning's epoch history and best epoch)

`save_training_state` gathers all of it from every rank (rank 0 writes);
`resume_state` reads the latest back after checking it fits the data and the
number of processes, and `restore_training_state` puts it in place.

Atomicity: the file is written to `step-N.pt.tmp` in the same directory,
flushed and fsync'ed, then renamed over its final name with os.replace (atomic
on POSIX); the directory is fsync'ed so the rename itself survives a crash. A
kill at any point leaves either the previous set of checkpoints or the new one,
never a half-written file under a checkpoint's name. Only the last `keep`
checkpoints are kept.
"""

import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.training import distributed

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")


def capture_rng() -> dict:
    """The states of every generator a training step may draw from."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_save(obj, path: Path) -> None:
    """torch.save `obj` to `path` so that `path` is never seen half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # the rename lives in the directory entry: sync it too (no-op where unsupported)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def checkpoint_paths(run_dir) -> list:
    """The run's checkpoints, oldest first (leftover .tmp files are ignored)."""
    ckpt_dir = Path(run_dir) / CHECKPOINT_DIR
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir):
    """The newest checkpoint file of a run, or None."""
    paths = checkpoint_paths(run_dir)
    return paths[-1] if paths else None


def save_checkpoint(run_dir, step: int, state: dict, keep: int = 3) -> Path:
    """Write checkpoint `step` (a dict as in the module docstring) atomically.

    Then delete all but the newest `keep` checkpoints.
    """
    if keep < 1:
        raise BertkitError(f"keep must be >= 1 checkpoint, got {keep}")
    path = Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.pt"
    atomic_save({**state, "step": step}, path)
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path) -> dict:
    """Read a checkpoint dict back (on the CPU)."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"no checkpoint at {path}: pass a run directory that has {CHECKPOINT_DIR}/step-*.pt")
    try:
        # our own files, holding RNG states (numpy arrays, tuples): not weights_only
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file: say which one
        raise BertkitError(f"cannot read checkpoint {path}: {err}; delete it to resume from the previous one") from err


# --- a training run's state: gathered from every rank, saved by rank 0 -------------------


def save_training_state(run_dir, step: int, model, optimizer, stream, info, *, scaler=None, keep: int = 3,
                        **extra) -> None:
    """Checkpoint `step` of a run (every rank calls it: it gathers RNG states and, under FSDP, shards)."""
    model_state, optim_state = distributed.state_dicts(model, optimizer)  # a collective under FSDP
    rngs = distributed.gather_objects(capture_rng(), info)
    if info.is_main:
        state = {"model": model_state, "optimizer": optim_state, "rng": rngs, "data": stream.state(),
                 "scaler": scaler.state_dict() if scaler else None, **extra}
        save_checkpoint(run_dir, step, state, keep=keep)
    distributed.barrier(info)


def resume_state(run_dir, num_instances: int, world_size: int) -> dict:
    """The latest checkpoint of the run in `run_dir`, after checking it fits this data and world size."""
    path = latest_checkpoint(run_dir)
    if path is None:
        raise BertkitError(f"--resume: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}; start the run without --resume")
    state = load_checkpoint(path)
    if state["data"]["num_instances"] != num_instances:
        raise BertkitError(
            f"--resume: the data changed ({state['data']['num_instances']} training instances when "
            f"checkpointed, {num_instances} now); resume on the same data"
        )
    if len(state["rng"]) != world_size:
        raise BertkitError(f"--resume: the run used {len(state['rng'])} processes, now {world_size}: use the same number")
    return state


def restore_training_state(state: dict, model, optimizer, info, scaler=None) -> tuple[int, int]:
    """Put a checkpoint's weights, moments and RNG states in place; returns (step, stream position)."""
    distributed.load_state_dicts(model, optimizer, state["model"], state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    restore_rng(state["rng"][info.rank])
    return state["step"], state["data"]["position"]
