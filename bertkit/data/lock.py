"""One writer per folder: an exclusive lock file holding the writer's process id.

Two jobs writing one folder interleave their files: two `bertkit index` runs made an index of
A's vectors with B's passages. So every command that writes a folder (index, index add,
finetune, pretrain prepare, pretrain run, distill layers, vocab train: the folder of its vocab.txt) holds
`folder_lock(folder, command)` while it writes:

    with folder_lock(output, "bertkit finetune"):
        ...  # write the folder

The lock is `FOLDER/.bertkit.lock`, locked with flock(2) (`LOCK_EX | LOCK_NB`): a second
writer is refused at once, in one line naming the process that holds it ("process 4242,
bertkit index, since 06:01:07 UTC"). The kernel drops a flock when its process dies, however it
dies (SIGKILL included), so a lock is never stuck: a lock file left by a dead process is
stale, recognised by its pid not running, and taken over with a warning. The file holds
"pid command start-time" for the message; the lock itself is the flock. Each holder checks
after locking that the file it locked is still the one at the path (a holder that is
finishing unlinks it), as flock-based lock files must. Linux and macOS; on NFS, Linux emulates
flock with fcntl byte-range locks, which the server honours.

Under torchrun every rank runs the same command; only the first (RANK 0, or a process not
launched by torchrun: `first_process`) takes the lock, for all of them.

A folder that did not exist is created for the lock, and removed again on release if the
writer left nothing else in it (a refused job leaves no empty folder behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import warnings
from pathlib import Path

from bertkit.errors import BertkitError

LOCK_FILE = ".bertkit.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _holder(path: Path) -> tuple[int | None, str]:
    """(pid, the rest of the line) recorded in a lock file; (None, "") when unreadable or empty."""
    try:
        first = path.read_text(encoding="utf-8").split("\n")[0].split(" ", 1)
        return int(first[0]), first[1] if len(first) > 1 else ""
    except (OSError, ValueError, UnicodeDecodeError):
        return None, ""


def _take(path: Path, folder: Path, command: str) -> int:
    """An open descriptor holding the flock on `path` (the file at the path now), or a BertkitError."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid, what = _holder(path)
            who = f"process {pid} ({what})" if pid is not None else "another process"
            raise BertkitError(f"{folder} is being written by {who}: wait for it to finish, or write to another "
                               f"folder (the lock is {path})") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder before us unlinked it as we opened it: take the new file
    raise BertkitError(f"could not lock {path}: it keeps changing; is another process looping on it?")


def first_process() -> bool:
    """Whether this process writes and speaks for its job: alone, or torchrun's rank 0 (torchrun sets RANK). Read
    from the environment, so it holds before `bertkit.training.distributed.setup()` joins the group: the one rule
    of the folder's lock and clearing (`bertkit.data.outputs`), an index's build and fine-tuning's warnings."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def folder_lock(folder, command: str):
    """Hold the exclusive lock of `folder` (created if missing) for the block; see the module docstring."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = _take(path, folder, command)
    pid, what = _holder(path)
    if pid is not None and pid != os.getpid() and not _alive(pid):
        warnings.warn(f"{path}: took over a stale lock of process {pid} ({what}), which is no longer running",
                      stacklevel=3)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {command}, since {time.strftime('%H:%M:%S UTC', time.gmtime())}\n".encode())
    try:
        yield folder
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while still holding the lock: the next writer creates a fresh file
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty
