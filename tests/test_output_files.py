"""A command's output file is whole or not there: Ctrl-C or a kill in the middle of writing it leaves
the file that stood at its name before (or none), never half a file a later step reads as whole
(a .jsonl cut after its k-th row, a .npy whose header promises rows that never came).

Real processes (tests/killed_write.py): the command stops itself, SIGINT or SIGKILL, once its first
bytes have gone out to a file named like the output (the output itself, or a NAME.tmp beside it).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KILLED_WRITE = Path(__file__).resolve().parent / "killed_write.py"
OLD = b"the file a previous run wrote\n"


def stopped(sig: str, out: Path, nbytes: int, *args) -> subprocess.CompletedProcess:
    """`bertkit ARGS` stopped by `sig` once `nbytes` have been written to a file whose name begins with out's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(KILLED_WRITE), sig, out.name, str(nbytes), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def texts(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("".join(f"sentence number {i} about a cat\n" for i in range(n)), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix, sig", [(".jsonl", "SIGKILL"), (".jsonl", "SIGINT"), (".npy", "SIGKILL"),
                                         (".safetensors", "SIGINT")])
def test_embed_stopped_while_writing_leaves_the_old_output(tiny_dir, tmp_path, suffix, sig):
    out = tmp_path / f"vectors{suffix}"
    out.write_bytes(OLD)
    # .npy, .safetensors: 40 rows of 32 float32 (5,120 bytes) are spooled first; the stop comes as the file is made
    nbytes = 300 if suffix == ".jsonl" else 40 * 32 * 4 + 80
    done = stopped(sig, out, nbytes, "embed", texts(tmp_path), "-o", out, "--model", tiny_dir, "--quiet")
    assert done.returncode == (130 if sig == "SIGINT" else -9), done.stderr
    assert out.read_bytes() == OLD  # was: the rows written so far (.jsonl), a header and part of the rows
    if sig == "SIGINT":  # Ctrl-C cleans up after itself: no NAME.tmp or NAME.part left beside it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt", out.name]
