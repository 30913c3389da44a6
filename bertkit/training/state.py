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
        rng          torch's generator states (CPU, CUDA) as tensors, one
                     entry per distributed rank (dropout differs per rank);
                     nothing draws from Python's or NumPy's global ones
        data         the batch stream's state: position, seed, number of
                     instances (plain data, see bertkit.training.loop)
        ...          anything else the caller wants back (the run config;
                     fine-tuning's epoch history and best epoch)

`save_training_state` gathers all of it from every rank (rank 0 writes);
`resume_state` reads the latest back after checking it fits the data and the
number of processes, and `restore_training_state` puts it in place. A run
stopped before its first checkpoint has nothing to resume: `resume_state`
says so and the run starts again from the beginning, its settings as saved.

No pickled objects: a checkpoint holds only tensors, numbers, strings, None,
lists, tuples and dicts (`plain_data` turns numpy values into those before
writing), and is read with `torch.load(weights_only=True)`. A file that holds
anything else, which unpickling could turn into running code (a run folder
copied from elsewhere), is refused with its name, never executed.

Atomicity (`bertkit.data.atomic`): the file is written to `step-N.pt.tmp` in the same directory,
flushed and fsync'ed, then renamed over its final name with os.replace (atomic
on POSIX); the directory is fsync'ed so the rename itself survives a crash. A
kill at any point leaves either the previous set of checkpoints or the new one,
never a half-written file under a checkpoint's name. A Ctrl-C while a
checkpoint is written takes effect once it is in place. Only the last `keep`
checkpoints are kept.
"""

import re
import signal
import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from bertkit.data.atomic import free_space, human_bytes, replace_atomically, write_json
from bertkit.errors import BertkitError
from bertkit.options import RUN_CONFIG  # written when a run starts, before its first step
from bertkit.training import distributed

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")


def capture_rng() -> dict:
    """The states of the generators a training step draws from, as tensors: torch's (CPU and CUDA).

    Every other draw in bertkit's training goes through a generator of its own, rebuilt from the seed and the
    position in the data (`random.Random(seed * 1_000_003 + epoch)` for batch orders, numpy's
    `default_rng([seed, epoch])`, the collator's torch.Generator). Python's and NumPy's global generators were
    kept too, though nothing seeds or draws from them, and a resume set the caller's back to the checkpoint's;
    they are left alone now (an older checkpoint's entries for them are not read)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def plain_data(obj, where: str = "state"):
    """`obj` as what `torch.load(weights_only=True)` reads back: numpy arrays become tensors, numpy
    scalars Python numbers; tensors, numbers, strings, None, lists, tuples and dicts stay. Anything
    else is a bug of the caller (a checkpoint must never need unpickling code), named by its path."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, np.generic):  # before float: numpy's float64 is a float subclass
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return obj
    if type(obj) in (list, tuple):
        return type(obj)(plain_data(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if type(obj) in (dict, OrderedDict):
        out = type(obj)((k, plain_data(v, f"{where}[{k!r}]")) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module state_dict's per-module versions
            out._metadata = obj._metadata
        return out
    raise TypeError(f"{where} is a {type(obj).__name__}: a checkpoint holds only tensors and plain data")


def save_run_config(run_dir, run_config: dict) -> None:
    """RUN_CONFIG, the settings `--resume` reads back, written whole: a resumed run writes it again over the
    one it read, and a kill or a full disk in that write left a run no `--resume` could continue."""
    write_json(Path(run_dir) / RUN_CONFIG, run_config)


def atomic_save(obj, path: Path) -> None:
    """torch.save `obj` to `path` so that `path` is never seen half-written; a Ctrl-C meanwhile waits
    for the file to be in place (`interrupts_held`)."""
    with interrupts_held():
        replace_atomically(path, lambda f: torch.save(obj, f))


@contextmanager
def interrupts_held():
    """Run the block with Ctrl-C (SIGINT) held back, then deliver it: a checkpoint being written is
    finished first. Interrupted inside torch.save, the zip writer turned the KeyboardInterrupt into a
    RuntimeError ("unexpected pos") and left its .tmp file. Only the main thread receives signals
    (elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pressed:
            signal.raise_signal(signal.SIGINT)  # to the handler that was there (KeyboardInterrupt by default)


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


def save_checkpoint(run_dir, step: int, state: dict, keep: int = 3, to_come: int | None = None) -> Path:
    """Write checkpoint `step` (a dict as in the module docstring) atomically.

    Then delete all but the newest `keep` checkpoints. to_come: how many more the run will write (None: unknown,
    at least `keep`), for the free-space warning after the first.
    """
    if keep < 1:
        raise BertkitError(f"keep must be >= 1 checkpoint, got {keep}")
    path = Path(run_dir) / CHECKPOINT_DIR / f"step-{step:08d}.pt"
    atomic_save(plain_data({**state, "step": step}), path)
    kept = checkpoint_paths(run_dir)
    if kept == [path]:  # the run's first: now its size is known
        _room_for_more(path, keep if to_come is None else min(keep, to_come))
    for old in kept[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _room_for_more(first: Path, keep: int) -> None:
    """Warn, once, when the checkpoints still to come will not fit: `keep` of them stand while one more is written
    (before the oldest is deleted), so `keep` times the first one's size beside it (`keep`: fewer when the run
    writes fewer). An estimate (a run may be stopped sooner; the state's size may change a little), so a warning,
    never a refusal (`bertkit.data.atomic.room_for` refuses a certain need): a bert-base checkpoint, optimizer
    state included, is about 1.3 GB, and a nearly full disk stopped a run hours in, on ENOSPC at its second or
    fourth one."""
    size = first.stat().st_size
    free = free_space(first.parent)
    if keep * size > free:
        warnings.warn(f"{first.parent}: the checkpoints still to come need about {human_bytes(keep * size)} ({keep} "
                      f"kept while one more is written, {human_bytes(size)} each) and its disk has {human_bytes(free)} "
                      "free: free some space or lower --keep-last, or the run stops when the disk is full", stacklevel=2)


def load_checkpoint(path) -> dict:
    """Read a checkpoint dict back (on the CPU), unpickling nothing but tensors and plain data."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError(f"no checkpoint at {path}: pass a run directory that has {CHECKPOINT_DIR}/step-*.pt")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        unsafe = _pickled_objects(path)
        if unsafe:
            raise BertkitError(
                f"refusing to read checkpoint {path}: besides tensors and plain data it holds Python objects "
                f"({', '.join(unsafe[:3])}{', ...' if len(unsafe) > 3 else ''}) whose unpickling could run any code; "
                "bertkit's checkpoints hold none (an older bertkit's did): start the run again without --resume, "
                "or delete the file to resume from the previous checkpoint"
            ) from None
        # a truncated or foreign file: say which one, in one line
        raise BertkitError(f"cannot read checkpoint {path} ({type(err).__name__}: it is truncated or not a "
                           "checkpoint); delete it to resume from the previous one") from None


def _pickled_objects(path: Path) -> list:
    """The classes and functions a torch.save file would import to unpickle (read, never run)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a torch.save zip archive at all
        return []


# --- a training run's state: gathered from every rank, saved by rank 0 -------------------


def save_training_state(run_dir, step: int, model, optimizer, stream, info, *, scaler=None, keep: int = 3,
                        to_come: int | None = None, **extra) -> None:
    """Checkpoint `step` of a run (every rank calls it: it gathers RNG states and, under FSDP, shards)."""
    model_state, optim_state = distributed.state_dicts(model, optimizer)  # a collective under FSDP
    rngs = distributed.gather_objects(capture_rng(), info)
    if info.is_main:
        state = {"model": model_state, "optimizer": optim_state, "rng": rngs, "data": stream.state(),
                 "scaler": scaler.state_dict() if scaler else None, **extra}
        save_checkpoint(run_dir, step, state, keep=keep, to_come=to_come)
    distributed.barrier(info)


def resume_state(run_dir, num_instances: int, world_size: int, save_every: int | None = None,
                 log=print) -> dict | None:
    """The latest checkpoint of the run in `run_dir`, after checking it fits this data and world size.

    None when the run started (it wrote run_config.json or metrics.jsonl) but stopped before its
    first checkpoint: there is nothing to resume, so it starts again from the beginning, and says so.
    """
    path = latest_checkpoint(run_dir)
    if path is None:
        if not any((Path(run_dir) / name).is_file() for name in (RUN_CONFIG, "metrics.jsonl")):
            raise BertkitError(f"--resume: no run in {run_dir} (no {RUN_CONFIG}, no {CHECKPOINT_DIR}/step-*.pt); "
                               "start the run without --resume")
        sooner = f"every {save_every} steps" if save_every else "at the end of every epoch"
        log(f"--resume: the run in {run_dir} stopped before its first checkpoint (written {sooner}), so there "
            "is nothing to resume: starting it again from the beginning (--save-every N checkpoints every N steps)")
        return None
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
