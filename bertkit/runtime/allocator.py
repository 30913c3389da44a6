"""Keep freed memory for reuse: the CPU allocator setting that saves the page faults of every batch.

A forward pass allocates and frees the same large activations over and over: the
feed-forward's [B, T, 4H] float32 block is 25 MB at 32 x 128 for the default
model, 50 MB for BERT-Base. glibc's malloc serves blocks that large with mmap
and, when they are freed, hands the memory back to the kernel (munmap, or by
trimming the top of the heap). The next block is then fresh memory, which the
kernel zero-fills one 4 KiB page fault at a time: ~6,000 faults for 25 MB,
milliseconds of every layer. ONNX Runtime sidesteps this with its own memory
arena, and PyTorch's CPU performance guide suggests preloading jemalloc or
tcmalloc for the same reason.

`reuse_freed_memory()` gets the effect without a preload: it tells glibc
(mallopt) to take every block from the heap and to keep freed memory instead of
returning it, so from the second batch on the activations land in pages that
are already mapped (most forwards take no page fault at all; now and then the
heap still grows by a block or two). What it saved, a batched forward and a
pre-training run with and without it, is in docs/benchmarks.md ("Numbers that left the
docstrings").
The price is that the process keeps its peak memory between batches rather than
giving it back, which a server or a batch job wants anyway. It changes the whole
process, so the library never does it behind a caller's back: the `bertkit`
command calls it at start, and a program calls it once itself.
"""

from __future__ import annotations

import ctypes
import sys

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1  # free memory at the top of the heap beyond this is returned to the kernel
M_MMAP_MAX = -4  # how many blocks may be served by mmap at once (0: none)

KEEP = 2**31 - 1  # the largest trim threshold mallopt takes (an int): keep up to 2 GiB of freed heap


def _glibc():
    """The C library if it is glibc (the only one whose mallopt this module knows), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (musl has no such symbol)
    except (OSError, AttributeError):
        return None
    return libc


def reuse_freed_memory() -> bool:
    """Serve every allocation from the heap and never trim it (process-wide, for good).

    Returns True when glibc accepted both settings, False where there is nothing to
    set (macOS, Windows, musl: other allocators, other trade-offs).
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP))
