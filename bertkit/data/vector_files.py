"""The files `bertkit embed` writes: vectors out, streamed in bounded memory.

The writers consume the stream of results `bertkit.embeddings.features.iter_embed` yields
(from texts `bertkit.data.textfiles.read_texts` streams), so a corpus of any size
embeds in flat memory:

    .npy          pooled vectors: one [N, D] float32 array
    .safetensors  pooled: "embeddings" [N, D]; per token or word: "vectors" [sum T_i, D]
                  with "offsets" [N+1] (rows of text i are offsets[i]:offsets[i+1])
    .jsonl        one JSON object per text

The .npy and .safetensors writers leave room for the header (which needs the row count),
stream the rows after it and write it at the end: the disk holds the output once. Every file is written whole or not at all
(`bertkit.data.atomic`): Ctrl-C or a kill midway leaves the file that stood at its name before. `map_safetensors` reads such a file
back as memory maps (an index's vectors and codes, `bertkit.retrieval.index`).
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from bertkit.data.atomic import replace_atomically
from bertkit.errors import BertkitError


# the safetensors names of the dtypes written here (I8, U8: an index's compact vector codes)
SAFETENSORS_DTYPES = {"F32": "<f4", "I64": "<i8", "I8": "|i1", "U8": "|u1"}


def safetensors_header(tensors: dict, room: int = 0) -> bytes:
    """The 8-byte length and JSON header of a .safetensors file, to be followed by the tensors' raw
    bytes in the same order; tensors: name -> (dtype, shape), dtype a key of SAFETENSORS_DTYPES. With `room`
    (a multiple of 8, at least the header's own length), padded with spaces to `room` bytes in all."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(SAFETENSORS_DTYPES[dtype]).itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment of the data
    raw += b" " * max(0, room - 8 - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def map_safetensors(path) -> dict[str, np.memmap]:
    """Every tensor of a .safetensors file as a read-only memory map (nothing is read until used)."""
    path = Path(path)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise BertkitError(f"{path}: tensor {name} is {entry['dtype']}; this reader maps "
                               f"{', '.join(SAFETENSORS_DTYPES)} only")
        out[name] = np.memmap(path, dtype=SAFETENSORS_DTYPES[entry["dtype"]], mode="r", offset=8 + length + begin, shape=shape)
    return out


def write_vectors(rows: Iterable[np.ndarray], path, pooled: bool, texts: Sequence | None = None) -> int:
    """Stream results into `path` by its suffix; returns the number of rows written.

    .npy          pooled vectors only: one [N, D] float32 array.
    .safetensors  pooled: tensor "embeddings" [N, D]; per-token/word: "vectors"
                  [sum T_i, D] with "offsets" [N+1] (rows of text i are
                  offsets[i]:offsets[i+1]).
    .jsonl        one JSON object per text: {"index", "embedding"} or {"index", "vectors"}
                  (plus "text" when `texts` is given).

    The .npy and .safetensors writers stream the rows into the file after room left for the header, so
    memory stays flat however many texts stream through, and the disk holds them once.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".safetensors", ".jsonl"):
        raise BertkitError(f"unknown output format {path.name!r}: use a .npy, .safetensors or .jsonl file name")
    if suffix == ".npy" and not pooled:
        raise BertkitError(
            "per-token and per-word vectors have a different length for each text and do not fit one .npy "
            "array: write them to .safetensors or .jsonl, or choose --pooling mean/cls"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside `path`, then renamed over it: streamed straight into `path`, a .jsonl stopped midway
    # (Ctrl-C, a kill) was its first k rows, a file that reads as whole, and the old file was gone from the start
    count = []
    if suffix == ".jsonl":
        replace_atomically(path, lambda out: count.append(_write_jsonl(rows, out, pooled, texts)))
    else:
        replace_atomically(path, lambda out: count.append(_write_tensors(rows, out, suffix, pooled)))
    return count[0]


# the most rows a header is made room for before the count is known (its digits are what count)
MAX_ROWS = 10**15


def _write_tensors(rows, out, suffix: str, pooled: bool) -> int:
    """The rows' float32 bytes into the binary file `out` after a header of a fixed size, which is written at the
    end, once the row count is known; returns the number of results. The rows were spooled into NAME.part and
    then copied after a header: twice the output's room on the disk at the end, and a disk that held the spool
    failed at the copy, after every text was embedded."""
    lengths, dim, room = [], None, 0
    for row in rows:
        row = np.ascontiguousarray(row, dtype="<f4")
        if dim is None:
            dim = row.shape[-1]
            room = len(_header(suffix, pooled, MAX_ROWS, dim, MAX_ROWS))
            out.write(bytes(room))
        lengths.append(1 if row.ndim == 1 else row.shape[0])
        out.write(row.tobytes())
    if dim is None:
        raise BertkitError("nothing to write: the input holds no texts")
    if suffix == ".safetensors" and not pooled:
        out.write(np.concatenate([[0], np.cumsum(lengths)]).astype("<i8").tobytes())  # offsets [N+1]
    out.seek(0)
    out.write(_header(suffix, pooled, sum(lengths), dim, len(lengths), room))
    return len(lengths)


def _write_jsonl(rows, out, pooled: bool, texts) -> int:
    """One JSON object per result into the binary file `out` (UTF-8); returns the count."""
    n = 0
    for i, row in enumerate(rows):
        record = {"index": i}
        if texts is not None:
            record["text"] = texts[i]
        record["embedding" if pooled else "vectors"] = np.round(row.astype(np.float64), 7).tolist()
        out.write((json.dumps(record) + "\n").encode("utf-8"))
        n += 1
    return n


def _header(suffix: str, pooled: bool, total: int, dim: int, n: int, room: int = 0) -> bytes:
    """The header of a [total, D] float32 .npy, or of a .safetensors (pooled, or vectors with n+1 offsets), made
    `room` bytes long: a .safetensors' JSON padded with spaces (the format allows it); a .npy's is that long
    already for a `room` made with more rows (numpy leaves room for the first axis' digits)."""
    if suffix == ".npy":
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (total, dim)})
        made = header.getvalue()
        assert not room or len(made) == room, (len(made), room)
        return made
    if pooled:
        return safetensors_header({"embeddings": ("F32", (total, dim))}, room)
    return safetensors_header({"vectors": ("F32", (total, dim)), "offsets": ("I64", (n + 1,))}, room)
