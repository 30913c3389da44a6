"""Run a `bertkit` command and stop it while it writes its output file: Ctrl-C (SIGINT) or a lost
machine (SIGKILL) once BYTES have gone out to a file whose name begins with NAME (the output
itself, or NAME.tmp / NAME.part beside it: whatever the command writes first).

    python tests/killed_write.py SIGINT|SIGKILL NAME BYTES ARGS...    # `bertkit ARGS...`, stopped mid-write

The write that crosses BYTES is cut there, and the bytes written so far are flushed before the
signal, so a kill leaves on disk what a real one would (half a file written in one call, too).
It wraps `open` (builtins and io, which `Path.open` calls) from outside the library: the library
holds no test switch, and the test does not depend on how the command writes.
"""

import builtins
import errno
import io
import os
import signal
import sys


def stopping_open(name: str, limit: int, sig: int | None, real_open):
    """`open` whose files named NAME... stop the process with `sig` (None: fail with ENOSPC, a full disk)
    once `limit` bytes have gone out to them."""
    written = {"n": 0}

    class Stopping:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            size = len(data.encode("utf-8") if isinstance(data, str) else data)
            if written["n"] + size < limit:
                written["n"] += size
                return self._f.write(data)
            # the stop lands inside this write: a file written in one call (a config.json, a vocab.txt) is
            # cut where the limit falls, as a kill or a full disk cuts it, not left whole
            n = self._f.write(data[: limit - written["n"]])  # characters for text: at most as many bytes
            self._f.flush()
            if sig is None:  # a full disk: the write fails there, in this process
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.kill(os.getpid(), sig)
            return n

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def __getattr__(self, attr):
            return getattr(self._f, attr)

        def __iter__(self):
            return iter(self._f)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

    def open_(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        writes = any(m in mode for m in "wax")
        if writes and isinstance(file, (str, os.PathLike)) and os.path.basename(os.fspath(file)).startswith(name):
            return Stopping(f)
        return f

    return open_


def as_a_terminal_delivers_it() -> None:
    """Ctrl-C raises KeyboardInterrupt here, as in a command typed at a terminal, however this process was started:
    a pytest started in the background by a non-interactive shell (`python -m pytest ... &`) runs with SIGINT
    ignored, its children inherit that, and Python then installs no KeyboardInterrupt handler, so the SIGINT these
    scripts send themselves was ignored and the command ran to its end (the Ctrl-C tests failed there only)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    as_a_terminal_delivers_it()
    sig, name, limit = getattr(signal, sys.argv[1]), sys.argv[2], int(sys.argv[3])
    sys.argv = ["bertkit", *sys.argv[4:]]
    builtins.open = io.open = stopping_open(name, limit, sig, io.open)
    from bertkit.cli import main

    sys.exit(main())  # as `python -m bertkit.cli` runs it
