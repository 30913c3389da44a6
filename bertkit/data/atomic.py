"""A file on disk is whole or absent: written beside its final name, then renamed over it.

A crash, a kill or a full disk in the middle of writing `index.json`, a checkpoint or a model's
`modules.json` must not leave half a file where a whole one stood: the next reader would fail on
it, or worse, read it. So every file bertkit writes for keeps is written to `NAME.tmp` in the same
folder, flushed and fsync'ed (its bytes on the disk), then renamed over `NAME` with `os.replace`,
which is atomic within one filesystem (POSIX rename(2); Windows too), and the folder is fsync'ed
so that the rename itself survives a power loss. A reader sees the old file or the new one; an
error or Ctrl-C removes `NAME.tmp`, and what a kill leaves of it the next write replaces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def replace_atomically(path, write) -> None:
    """write(f) into `path`.tmp (a binary file; its folder made if missing), then rename it over `path`."""

    def into(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            write(f)

    write_through(path, into)


def write_through(path, write_to) -> None:
    """write_to(tmp_path) for a library that writes to a path, not a file object (safetensors' `save_file`,
    faiss' `write_index`), then the same fsync and rename over `path` as `replace_atomically`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        write_to(tmp)
        with open(tmp, "rb+") as f:  # fsync works on any descriptor of the file: its bytes reach the disk
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # an error or Ctrl-C leaves nothing behind; only a kill can leave NAME.tmp
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_json(path, data, *, ensure_ascii: bool = True) -> None:
    """`data` as indented JSON (and a final newline), UTF-8, written atomically."""
    text = json.dumps(data, indent=2, ensure_ascii=ensure_ascii) + "\n"
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")))


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
