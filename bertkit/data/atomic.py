"""A file on disk is whole or absent: written beside its final name, then renamed over it.

A crash, a kill or a full disk in the middle of writing `index.json`, a checkpoint or a model's
`modules.json` must not leave half a file where a whole one stood: the next reader would fail on
it, or worse, read it. So every file bertkit writes for keeps is written to `NAME.tmp` in the same
folder, flushed and fsync'ed (its bytes on the disk), then renamed over `NAME` with `os.replace`,
which is atomic within one filesystem (POSIX rename(2); Windows too), and the folder is fsync'ed
so that the rename itself survives a power loss. A reader sees the old file or the new one; an
error or Ctrl-C removes `NAME.tmp` (unless a resumable writer recorded rows in it: `write_through`'s
`keep`, `bertkit embed --resume`), and what a kill leaves of it the next write replaces.
A write the machine refuses is an OSError naming `NAME` with the errno the disk gave (`refused`), so the CLI
says which file and why in one line, even where a library lost the errno on the way (numpy, torch.save,
safetensors). While a process writes `NAME.tmp` it holds an flock on `NAME.tmp.lock`: a second process writing the
same file at the same time is refused (`_hold`) instead of writing into the first's temporary file.
A folder of files (a token shard, an index's lexical part, a static model) is written the same way, whole into
`NAME.tmp/` and renamed to `NAME` (`write_folder`).
A model folder (config.json, the weights, vocab.txt, bertkit_task.json, a layout's files, an export's model.onnx
and its side files) is saved over the last model in place instead (`saving`): it cannot be swapped whole, since it
also holds what is not the model's (a fine-tuning run's checkpoints and metrics, the model beside its own export).
Each file is written whole beside its name as above, and kept there until the save has written them all; then
those whose bytes did not change are dropped and the rest renamed, so a stop or a full disk while the files are
written (nearly all of a save's time) leaves the last model as it was, and a better epoch's save, which changes the
weights alone, renames one file. Only a stop between two renames could mix two saves (a new config.json beside the
last weights of the same shapes loaded silently as neither model): a marker written before them and removed after
(SAVING_MARKER) makes every loader refuse that folder in one line (`check_whole`). The marker alone would refuse a
folder still whole after any stop during the minutes of writing; dropping unchanged files alone leaves a save that
changes two files (another model into the folder) mixable; the two together leave that gap only to the renames.
All of that says a full disk once it happens; a long run that knows up front what it will write looks ahead
(`room_for`): where that certainly exceeds the free space, it stops before the long work, not an hour into it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertkit.errors import BertkitError, NoSpace


def replace_atomically(path, write) -> None:
    """write(f) into `path`.tmp (a binary file; its folder made if missing), then rename it over `path`."""

    def into(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            write(f)

    write_through(path, into)


def write_through(path, write_to, keep=None) -> None:
    """write_to(tmp_path) for a library that writes to a path, not a file object (safetensors' `save_file`,
    faiss' `write_index`), then the same fsync and rename over `path` as `replace_atomically`.

    A write the machine refuses (a full disk, a file-size limit, a read-only or forbidden folder) raises an
    OSError with its errno that names `path`, the file the caller asked for (`refused`). keep(err): whether
    NAME.tmp outlives that error (or Ctrl-C) because a resumable writer recorded rows in it that a run with
    --resume goes on from (`bertkit.data.vector_files.Journal`); by default it is removed."""
    path = Path(path)
    unit, key = _unit_of(path), Path(os.path.abspath(path))
    if unit is not None:
        unit.drop(key)  # written twice in one save: the last write counts
    tmp, lock, held = _start(path)
    try:
        write_to(tmp)
        # safetensors' save_file puts a file of its own at tmp, readable by its owner alone (0600) whatever the
        # umask, and other users could not load the model; give it the mode our own new lock file got under the umask
        os.chmod(tmp, stat.S_IMODE(os.fstat(held).st_mode))
        with open(tmp, "rb+") as f:  # fsync works on any descriptor of the file: its bytes reach the disk
            os.fsync(f.fileno())
        if unit is not None:  # renamed with the rest of the folder's files when its save ends (`saving`)
            unit.staged[key] = (tmp, lock, held)
            return
        os.replace(tmp, path)
    except BaseException as err:  # an error or Ctrl-C leaves nothing behind; only a kill can leave NAME.tmp
        said = refused(err, path, (tmp, lock), probe=tmp) if isinstance(err, Exception) else None
        with contextlib.suppress(OSError):  # on a read-only disk even this fails: the cause is the error to say
            if keep is None or not keep(err):
                tmp.unlink(missing_ok=True)
        if said is not None and said is not err:
            raise said from err
        raise
    finally:  # removed while still held: a writer that opened it meanwhile finds it gone and takes a new one
        if key not in getattr(unit, "staged", ()):
            _release(lock, held)
    fsync_folder(path.parent)


def _release(lock: Path, held: int) -> None:
    with contextlib.suppress(OSError):
        lock.unlink(missing_ok=True)
    os.close(held)


# --- a model folder's files saved as one (`saving`) ---------------------------------------------------------

SAVING_MARKER = "bertkit_saving.json"  # in a folder whose save was stopped while it replaced its files
_SAVES: dict[Path, "_Save"] = {}  # the folders this process is saving now (`saving`), by absolute path


@contextlib.contextmanager
def saving(folder) -> Iterator[None]:
    """The files the block writes under `folder` (`write_through` and the writers on it; `remove`) replace the ones
    there together when it ends (see the module docstring): each kept as NAME.tmp until then, those whose bytes
    did not change dropped, the rest renamed, SAVING_MARKER around the renames when they are two or more. An error
    or Ctrl-C in the block (a full disk) removes what it staged: the folder is as it was. Nested, the outermost
    save of the folder (or of a folder above it) counts. Kept in this process, not passed: a save's writers are
    many (config, weights, tokenizer, a task's and a layout's files) and take no handle."""
    folder = Path(os.path.abspath(folder))
    if _unit_of(folder / SAVING_MARKER) is not None:
        yield
        return
    unit = _SAVES[folder] = _Save(folder)
    try:
        yield
        unit.publish()
    finally:  # what is left staged (an error, Ctrl-C before the renames) removed, its locks released
        del _SAVES[folder]
        for path in list(unit.staged):
            unit.drop(path)


def remove(path) -> None:
    """Remove the file `path` (none there: nothing): at the end of the save of its folder, if one is under way
    (`saving`), with the files it replaces."""
    path = Path(os.path.abspath(path))
    unit = _unit_of(path)
    if unit is None:
        path.unlink(missing_ok=True)
    elif path.is_file():
        unit.drop(path)
        unit.removed.add(path)


def check_whole(folder) -> None:
    """Refuse, in one line, a model folder (or one inside it: an ELECTRA run's generator/) whose save was stopped
    between two of its files (`saving`): it may hold files of two saves, which loaded silently as neither model."""
    folder = Path(folder)
    for where in (folder, folder.parent):
        if (where / SAVING_MARKER).is_file():
            raise BertkitError(f"{where}: a save into this folder was stopped part way ({SAVING_MARKER} is still "
                               "there), so its files may come from two saves: save the model into it again (a "
                               "fine-tuning run: the same command with --resume), or use another copy of it")


def _unit_of(path: Path) -> "_Save | None":
    """The save under way (`saving`) of a folder holding `path`, if any."""
    path = Path(os.path.abspath(path))
    return next((_SAVES[p] for p in path.parents if p in _SAVES), None) if _SAVES else None


class _Save:
    """One `saving` under way: the files written whole and not renamed yet ({absolute path: (NAME.tmp, its lock,
    the lock's descriptor)}), the files to remove (absolute paths)."""

    def __init__(self, folder: Path):
        self.folder, self.staged, self.removed = folder, {}, set()

    def drop(self, path: Path) -> None:
        """Forget what the save was to do to `path` (a second write of it, or its removal, replaces it)."""
        self.removed.discard(path)
        if path in self.staged:
            tmp, lock, held = self.staged.pop(path)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            _release(lock, held)

    def publish(self) -> None:
        marker, touched = self.folder / SAVING_MARKER, {*self.staged, *self.removed}
        for path, (tmp, _, _) in list(self.staged.items()):
            if _same_bytes(tmp, path):
                self.drop(path)
        changed = [*self.staged, *(path for path in self.removed if path.is_file())]
        # a stopped save's files: those this one does not write may still be of two saves (its marker stays)
        pending = _marker_files(marker)
        left = {p for p in pending or () if self.folder / p not in touched}
        if len(changed) > 1 or changed and pending is not None:
            _write_marker(marker, {str(p.relative_to(self.folder)) for p in changed} | left)
        for path in list(self.staged):
            os.replace(self.staged[path][0], path)
            _release(*self.staged.pop(path)[1:])
        for path in self.removed:
            path.unlink(missing_ok=True)
        for parent in sorted({p.parent for p in changed}, reverse=True):
            fsync_folder(parent)  # the renames on the disk before the marker goes
        if left:
            _write_marker(marker, left)
        elif marker.is_file():
            marker.unlink()
            fsync_folder(self.folder)


def _marker_files(marker: Path) -> set[str] | None:
    """The files (relative to the folder) a stopped save was replacing, as its SAVING_MARKER lists them; None: no
    marker (an unreadable one lists nothing: the next save into the folder removes it)."""
    try:
        return set(json.loads(marker.read_text(encoding="utf-8"))["replacing"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _write_marker(marker: Path, files: set[str]) -> None:
    with open(marker.with_name(marker.name + ".tmp"), "w", encoding="utf-8") as f:
        f.write(json.dumps({"replacing": sorted(files), "pid": os.getpid()}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(marker.with_name(marker.name + ".tmp"), marker)
    fsync_folder(marker.parent)


def _same_bytes(a: Path, b: Path) -> bool:
    """Whether files `a` and `b` hold the same bytes (`b` missing: no), read a MiB at a time."""
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:  # as long as each other: read side by side
            return all(chunk == fb.read(1 << 20) for chunk in iter(lambda: fa.read(1 << 20), b""))
    except OSError:
        return False


def _start(path: Path) -> tuple[Path, Path, int]:
    """A write's NAME.tmp, its NAME.tmp.lock and a descriptor holding that lock (`_hold`), `path`'s folder made."""
    tmp = path.with_name(path.name + ".tmp")
    # the lock is not taken on tmp itself: safetensors' save_file puts a new file at the path it is given, and
    # a lock on the file it replaced refused nobody (a second writer locked the new tmp and wrote over it)
    lock = tmp.with_name(tmp.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tmp, lock, _hold(lock, path)
    except OSError as err:
        raise refused(err, path, (tmp, lock)) from None


@contextlib.contextmanager
def write_folder(path, *, replace: bool = True) -> Iterator[Path]:
    """A folder written whole or not at all, as `write_through` writes a file: the block writes into `path`.tmp/ (a
    killed writer's removed first) and yields it; then its files are fsync'ed and it is renamed to `path`. An empty
    folder there gives way; one that holds something is replaced (moved aside to NAME.replaced/, removed once the
    new one stands), or with `replace` False left as it is: another process wrote it meanwhile, and this one's
    folder is kept beside it under a name of its own, a FileExistsError's filename2. NAME.tmp.lock is held while
    the block writes (`_hold`); a second writer that finds it held writes its folder under a name of its own
    instead, kept as above, `replace` or not. An error or Ctrl-C removes NAME.tmp/; a
    write the machine refused is an OSError naming the file under `path` (`path` itself where the library named
    none, or lost the errno: `refused`), never NAME.tmp/."""
    path = Path(path)
    try:
        tmp, lock, held = _start(path)
    except BlockingIOError:
        # another process is writing NAME: refused, a long job (two `distill static -o X` saving in the same
        # second, with --overwrite or not) lost the result it had just made; it cannot take NAME now, so it is kept
        # beside it (under `replace` it would have replaced the other's a moment later: neither is lost now)
        yield from _kept_beside(path)
        return
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # what a kill left: nobody else holds the lock
        tmp.mkdir()
        yield tmp
        _fsync_files(tmp)
        _publish(tmp, path, replace)
    except BaseException as err:
        said = _said_of_folder(err, path, tmp, lock) if isinstance(err, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if said is not None and said is not err:
            raise said from err
        raise
    finally:
        with contextlib.suppress(OSError):
            lock.unlink(missing_ok=True)
        os.close(held)
    fsync_folder(path.parent)


def _kept_beside(path: Path) -> Iterator[Path]:
    """`write_folder(path, replace=False)` while another process writes `path`: the folder is written whole under a
    name of its own beside it, and kept (removed on an error), the FileExistsError's filename2."""
    kept = _kept_folder(path)
    try:
        yield kept
        _fsync_files(kept)
    except BaseException:
        shutil.rmtree(kept, ignore_errors=True)
        raise
    fsync_folder(path.parent)
    raise _kept_error(path, kept, "being written by another process")


def _kept_folder(path: Path) -> Path:
    """A new folder NAME.xxxxxxxx.kept beside `path`, for a folder written while another process took NAME."""
    return Path(tempfile.mkdtemp(prefix=f"{path.name}.", suffix=".kept", dir=path.parent))


def _kept_error(path: Path, kept: Path, why: str) -> FileExistsError:
    """What `write_folder` raises when this writer's folder was kept beside `path`: `kept` is its filename2."""
    return FileExistsError(errno.EEXIST, why, str(path), None, str(kept))


def _fsync_files(folder: Path) -> None:
    for written in sorted(folder.rglob("*")):
        if written.is_file():
            with open(written, "rb+") as f:
                os.fsync(f.fileno())


def _publish(tmp: Path, path: Path, replace: bool) -> None:
    """NAME.tmp/ renamed to NAME (see `write_folder`)."""
    with contextlib.suppress(OSError):
        path.rmdir()  # an empty folder (the -o a command made) gives way; one another process filled stays
    aside = path.with_name(path.name + ".replaced")
    if replace and (path.exists() or path.is_symlink()):
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(path, aside)
    try:
        os.replace(tmp, path)
    except OSError as err:
        if replace or err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        kept = _kept_folder(path)
        os.replace(tmp, kept)
        raise _kept_error(path, kept, "written by another process meanwhile") from None
    shutil.rmtree(aside, ignore_errors=True)


def _said_of_folder(err: Exception, path: Path, tmp: Path, lock: Path) -> Exception:
    """`refused` for a folder: a file of NAME.tmp/ is named as the file under NAME the user will look for; the
    probe of a library's errno-less error is a file of the folder (removed with it)."""
    if isinstance(err, OSError) and err.errno is not None and err.filename is not None \
            and Path(err.filename).is_relative_to(tmp) and Path(err.filename) != tmp:
        return OSError(err.errno, err.strerror, str(path / Path(err.filename).relative_to(tmp)))
    return refused(err, path, (tmp, lock), probe=tmp / ".probe" if tmp.is_dir() else None)


# as much as the probe appends to a failed NAME.tmp to hear the disk's own reason: more than a block has room
# for, so that a full disk or a file-size limit refuses it as it refused the library
PROBE_BYTES = 1 << 20
# how a Rust library (safetensors) says the errno it met: "I/O error: No space left on device (os error 28)"
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def refused(err: BaseException, path, ours=(), probe=None) -> BaseException:
    """`err` said of `path`, the file the user asked for. An OSError with an errno that named no file, or one of
    `ours` (NAME.tmp, NAME.tmp.lock, a caller's own temporary file), names `path` ("[Errno 28] No space left on device" named nothing,
    an unwritable folder's EACCES named v.npy.tmp.lock). An error that lost its errno on the way (numpy's
    "3200 requested and 3040 written", torch.save's "unexpected pos" RuntimeError, safetensors' SafetensorError:
    a full disk or a file-size limit each time) becomes the errno the library quoted, or, given `probe` (the
    NAME.tmp deleted next), the one the disk gives a write of PROBE_BYTES more to it, when it refuses that;
    otherwise `err` stands. An OSError(errno, ...) is the errno's own subclass (PermissionError, ...)."""
    if isinstance(err, OSError) and err.errno is not None:
        if err.filename is None or Path(err.filename) in {Path(p) for p in ours}:
            return OSError(err.errno, err.strerror, str(path))
        return err
    quoted = RUST_OS_ERROR.search(str(err))
    if quoted:
        return OSError(int(quoted[1]), os.strerror(int(quoted[1])), str(path))
    if probe is None:
        return err
    try:
        with open(probe, "ab", buffering=0) as f:
            for _ in range(PROBE_BYTES // 65536):
                f.write(bytes(65536))
    except OSError as disk:
        if disk.errno is not None:
            return OSError(disk.errno, disk.strerror, str(path))
    return err


def allocate(f, size: int) -> None:
    """Make the open file `f` `size` bytes long with its blocks taken on the disk, for a writer that then fills
    it through a memory map. Made sparse (f.truncate), the file had no blocks yet: on a full disk a write into
    the map found none, and the kernel killed the process with SIGBUS (`bertkit index` died with "Bus error", no
    message, its lock and NAME.tmp left). posix_fallocate refuses here instead: ENOSPC, EFBIG, an OSError."""
    f.flush()
    if hasattr(os, "posix_fallocate"):  # not on macOS
        try:
            os.posix_fallocate(f.fileno(), 0, size)
            return
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot reserve: as before
                raise
    f.truncate(size)


def free_space(folder) -> int:
    """Bytes this user may still write on the file system that holds `folder` (its nearest existing parent when
    it is not made yet): statvfs' available blocks, which leave out root's reserve."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def human_bytes(n: int) -> str:
    """A size as a person reads it: 512 bytes, 61.2 KiB, 1.3 GiB."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def room_for(folder, need: int, what: str) -> None:
    """Refuse, before a long run writes anything, a `need` its disk certainly cannot hold: `need` is a lower bound
    of the bytes it will still write under `folder` (`what`: "the index's vectors"), compared with `free_space`.
    Only a certain need refuses (an estimate, say a checkpoint's size times those still to come, warns at most):
    the run it stops would have failed anyway, on ENOSPC, after the hour it spent. A `NoSpace` (a BertkitError and
    an OSError, without an errno), its message one line: the folder, the two sizes, what to do."""
    free = free_space(folder)
    if need > free:
        raise NoSpace(f"{folder}: {what} need at least {human_bytes(need)} and its disk has {human_bytes(free)} "
                      f"free: free {human_bytes(need - free)} more, or write elsewhere")


def _hold(lock: Path, path: Path) -> int:
    """A descriptor holding an flock on `lock` (the file at that path now: NAME.tmp.lock), for one write.

    Two processes writing one file (two `bertkit embed -o v.npy`) shared NAME.tmp: the second truncated the
    first's half-written file and wrote into it, the first renamed it over NAME and said it had written its
    own vectors, and the second died on the vanished NAME.tmp with a traceback. The second is refused now,
    before it writes (BlockingIOError: the CLI says it in one line). A NAME.tmp.lock (and NAME.tmp) left by a
    killed writer holds no flock (the kernel drops it with the process): it is taken and written over."""
    for _ in range(10):
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BlockingIOError(f"{path} is being written by another process right now ({lock} is locked): "
                                  "wait for it to finish, or write to another file") from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the writer before us removed it as we opened it: take a new one
    raise BlockingIOError(f"could not write {path}: {lock} keeps changing; is another process writing it in a loop?")


def write_json(path, data, *, ensure_ascii: bool = True, allow_nan: bool = False) -> None:
    """`data` as indented JSON (and a final newline), UTF-8, written atomically. A NaN or an infinity raises
    ValueError naming the file and the value's place, before the file is touched: JSON has none, and strict
    readers (jq, JavaScript) refuse Python's `NaN` (an undefined figure is None, null). allow_nan: write them
    as Python's tokens, for a caller that means it (the default was True, and a NaN reached files silently)."""
    if not allow_nan:
        bad = non_finite(data)
        if bad:
            raise ValueError(f"{path}: {bad[0]} is {bad[1]}: JSON has no NaN or infinity (an undefined figure is "
                             "None, null); the file is not written")
    text = json.dumps(data, indent=2, ensure_ascii=ensure_ascii, allow_nan=allow_nan) + "\n"
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")))


def non_finite(data, where: str = "") -> tuple[str, float] | None:
    """(the place, the value) of the first NaN or infinity in `data` (dicts, lists, tuples), None if none."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where or "the value", data)
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = non_finite(value, f"{where}[{key}]" if isinstance(data, (list, tuple)) else
                           f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def write_lines(path, lines) -> None:
    """Each text of `lines` (an iterable, its newlines included) as UTF-8, written atomically: a table or
    JSON lines streamed into `path` directly was its first k rows after a Ctrl-C or a kill."""

    def write(f) -> None:
        for line in lines:
            f.write(line.encode("utf-8"))

    replace_atomically(path, write)


def fsync_folder(folder) -> None:
    """Make a rename in `folder` durable: its entry lives in the folder (a no-op where a folder cannot be
    opened or synced, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
