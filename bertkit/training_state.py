"""Training state on disk: atomic checkpoints that resume a run exactly.

A training run is a pure function of (weights, optimizer moments, schedule
step, random number generators, position in the data). A checkpoint stores all
of it, so a run killed at any moment and resumed from its last checkpoint
continues the very same loss curve: same batches, same masks, same dropout.

    OUT/checkpoints/step-00000100.pt   one file per checkpoint, a dict:
        step         optimizer updates done so far (the schedule is a pure
                     function of it, see bertkit.optim)
        model        model.state_dict()
        optimizer    optimizer.state_dict()
        scheduler    the scheduler's state_dict (LambdaLR keeps its step there)
        rng          python `random`, numpy and torch generator states, one
                     entry per distributed rank (dropout differs per rank)
        data         the batch stream's position (plain data, see
                     bertkit.pretraining.train)
        extra        anything else the caller wants back (the run config)

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
