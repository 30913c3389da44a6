"""The files of `bertkit embed`: texts in, vectors out, streamed in bounded memory.

`read_texts` iterates over a .txt (one text per line), .jsonl (a field) or .tsv
(a column under a header) file without loading it; the writers consume the
stream of results `bertkit.features.iter_embed` yields, so a corpus of any size
embeds in flat memory:

    .npy          pooled vectors: one [N, D] float32 array
    .safetensors  pooled: "embeddings" [N, D]; per token or word: "vectors" [sum T_i, D]
                  with "offsets" [N+1] (rows of text i are offsets[i]:offsets[i+1])
    .jsonl        one JSON object per text

The .npy and .safetensors writers spool rows to a temporary file and write the
header (which needs the row count) at the end.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from bertkit.errors import BertkitError
from bertkit.textfiles import existing_file, open_text


def read_texts(path, column: str | None = None) -> tuple:
    """(an iterator over the texts of a file, how many there are), without loading them all.

    .txt (or anything else): one text per non-empty line. .jsonl: the "text"
    field (or `column`) of each line. .tsv: the column named `column` (default
    "sentence", else "text", else the first) under a header row. The file must
    be UTF-8 (`bertkit.textfiles`); a malformed line is an error naming it.
    """
    path = existing_file(path)
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        with open_text(path) as f:
            header = f.readline().rstrip("\r\n").split("\t")
        name = column or next((c for c in ("sentence", "text") if c in header), header[0])
        if name not in header:
            raise BertkitError(f"{path} has no column {name!r}; its columns are {', '.join(header)}")
        col = header.index(name)

        def lines():
            with open_text(path) as f:
                f.readline()
                for number, line in enumerate(f, 2):
                    if line.strip():
                        fields = line.rstrip("\r\n").split("\t")
                        if col >= len(fields):
                            raise BertkitError(f"{path}:{number}: {len(fields)} field(s), no {name!r} column "
                                               f"(the header has {len(header)})")
                        yield fields[col]

    elif suffix == ".jsonl":
        key = column or "text"

        def lines():
            with open_text(path) as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise BertkitError(f"{path}:{number}: not a JSON object ({err.msg}); "
                                           "JSONL needs one object per line") from None
                    if not isinstance(record, dict) or key not in record:
                        raise BertkitError(f"{path}:{number}: no field {key!r} in this line's object: set --column")
                    yield record[key]

    else:

        def lines():
            with open_text(path) as f:
                for line in f:
                    if line.strip():
                        yield line.rstrip("\r\n")

    count = sum(1 for _ in lines())
    return lines(), count


def _safetensors_header(tensors: dict) -> bytes:
    """The JSON header of a .safetensors file; tensors: name -> (dtype, shape, nbytes), in data order."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment of the data
    return struct.pack("<Q", len(raw)) + raw


def write_vectors(rows: Iterable[np.ndarray], path, pooled: bool, texts: Sequence | None = None) -> int:
    """Stream results into `path` by its suffix; returns the number of rows written.

    .npy          pooled vectors only: one [N, D] float32 array.
    .safetensors  pooled: tensor "embeddings" [N, D]; per-token/word: "vectors"
                  [sum T_i, D] with "offsets" [N+1] (rows of text i are
                  offsets[i]:offsets[i+1]).
    .jsonl        one JSON object per text: {"index", "embedding"} or {"index", "vectors"}
                  (plus "text" when `texts` is given).

    The .npy and .safetensors writers spool rows to a temporary file first, so
    memory stays flat however many texts stream through.
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
    if suffix == ".jsonl":
        n = 0
        with path.open("w", encoding="utf-8") as out:
            for i, row in enumerate(rows):
                record = {"index": i}
                if texts is not None:
                    record["text"] = texts[i]
                record["embedding" if pooled else "vectors"] = np.round(row.astype(np.float64), 7).tolist()
                out.write(json.dumps(record) + "\n")
                n += 1
        return n

    spool = path.with_name(path.name + ".part")
    lengths, dim = [], None
    try:
        with spool.open("wb") as raw:
            for row in rows:
                row = np.ascontiguousarray(row, dtype="<f4")
                dim = row.shape[-1]
                lengths.append(1 if row.ndim == 1 else row.shape[0])
                raw.write(row.tobytes())
        if dim is None:
            raise BertkitError("nothing to write: the input holds no texts")
        total = sum(lengths)
        with path.open("wb") as out, spool.open("rb") as raw:
            if suffix == ".npy":
                np.lib.format.write_array_header_1_0(
                    out, {"descr": "<f4", "fortran_order": False, "shape": (total, dim)}
                )
                _copy(raw, out)
            else:
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
                if pooled:
                    tensors = {"embeddings": ("F32", (total, dim), total * dim * 4)}
                else:
                    tensors = {
                        "vectors": ("F32", (total, dim), total * dim * 4),
                        "offsets": ("I64", (len(offsets),), offsets.nbytes),
                    }
                out.write(_safetensors_header(tensors))
                _copy(raw, out)
                if not pooled:
                    out.write(offsets.tobytes())
    finally:
        spool.unlink(missing_ok=True)
    return len(lengths)


def _copy(src, dst, block: int = 1 << 22) -> None:
    while True:
        data = src.read(block)
        if not data:
            return
        dst.write(data)
