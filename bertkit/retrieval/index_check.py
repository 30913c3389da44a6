"""An index folder checked on open, before a search trusts it.

`bertkit.retrieval.index.open_index` memory-maps what `build_index` wrote (its module
docstring has the layout). A folder damaged since (a copy cut short, a file emptied or
edited, a disk that filled up) would otherwise fail deep inside numpy or json, or answer
wrong results quietly. Each check names the file and the fix in one line:

    index.json            JSON object; format; passages N, documents, dim D whole numbers >= 1;
                          the model record (directory, fingerprint, pooling, max_length)
    vectors.safetensors   a whole file (`bertkit.data.safetensors_header`: every tensor's bytes
                          inside it); vectors F32 [N, D], document I64 [N], passage_offset I64 [N+1]
    passages.jsonl        exactly passage_offset[N] bytes; offsets increasing from 0
    values                document numbers in 0..documents-1; every vector finite (read once,
                          a block of rows at a time: bounded memory)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertkit.data.safetensors_header import read_header
from bertkit.errors import BertkitError

REBUILD = "build the index again with bertkit index CORPUS -o INDEX"
MODEL_FIELDS = ("directory", "fingerprint", "pooling", "max_length")
SCAN_ROWS = 1 << 16  # rows of vectors checked at once


def read_info(path: Path) -> dict:
    """index.json, its counts and model record checked."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise BertkitError(f"{path} is not readable JSON ({' '.join(str(err).split())}): the index is corrupt; "
                           f"{REBUILD}") from None
    if not isinstance(info, dict):
        raise BertkitError(f"{path} is not a JSON object: the index is corrupt; {REBUILD}")
    for key in ("passages", "documents", "dim"):
        value = info.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BertkitError(f"{path}: {key} is {json.dumps(value)}, not a whole number >= 1: the index is "
                               f"corrupt; {REBUILD}")
    model = info.get("model")
    if not isinstance(model, dict) or any(k not in model for k in MODEL_FIELDS):
        raise BertkitError(f"{path}: the model record ({', '.join(MODEL_FIELDS)}) is missing or incomplete: the "
                           f"index is corrupt; {REBUILD}")
    return info


def check_files(directory: Path, info: dict, vectors: str, passages: str) -> None:
    """The vectors file is whole and has the shapes index.json says; passages.jsonl is there."""
    path = directory / vectors
    if not path.is_file():
        raise BertkitError(f"{path} is missing: the index is incomplete; {REBUILD}")
    header = read_header(path, f"the index is corrupt; {REBUILD}")
    n, dim = info["passages"], info["dim"]
    want = {"vectors": ("F32", (n, dim)), "document": ("I64", (n,)), "passage_offset": ("I64", (n + 1,))}
    for name, (dtype, shape) in want.items():
        entry = header.get(name)
        if entry is None or entry.dtype != dtype or entry.shape != shape:
            found = "no such tensor" if entry is None else f"{entry.dtype} {list(entry.shape)}"
            raise BertkitError(f"{path}: {name} should be {dtype} {list(shape)} for the {n} passages of "
                               f"{directory / 'index.json'}, found {found}: the files disagree; {REBUILD}")
    if not (directory / passages).is_file():
        raise BertkitError(f"{directory / passages} is missing: the index is incomplete; {REBUILD}")


def check_values(directory: Path, info: dict, tensors: dict, passages: str) -> None:
    """Offsets against passages.jsonl, document numbers in range, every vector finite."""
    offsets, document, vectors = tensors["passage_offset"], tensors["document"], tensors["vectors"]
    size = (directory / passages).stat().st_size
    if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) <= 0):
        raise BertkitError(f"{directory / passages} has {size} bytes, not the {int(offsets[-1])} its passage "
                           f"offsets say (or the offsets are out of order): the index is corrupt; {REBUILD}")
    if len(document) and (document.min() < 0 or document.max() >= info["documents"]):
        raise BertkitError(f"{directory}: a passage's document number is outside 0..{info['documents'] - 1}: "
                           f"the index is corrupt; {REBUILD}")
    for start in range(0, len(vectors), SCAN_ROWS):
        block = np.asarray(vectors[start:start + SCAN_ROWS])
        if not np.isfinite(block).all():
            row = start + int(np.argwhere(~np.isfinite(block))[0][0])
            raise BertkitError(f"{directory}: vector {row} is not finite (NaN or infinity): the index is corrupt; "
                               f"{REBUILD}")
