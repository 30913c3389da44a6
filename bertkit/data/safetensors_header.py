"""A .safetensors file's header, read and checked without reading a tensor.

The format (huggingface/safetensors, `docs/source/index.mdx`): 8 bytes, the header's
length N as a little-endian u64; N bytes of JSON, an object

    {"__metadata__": {str: str},                       optional
     NAME: {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}

then the tensors' bytes, `begin`/`end` counted from the end of the header. What the
header says is all a reader needs to know the shapes (`bertkit.model.weights_check` compares
them with config.json before a model is built) and whether the file is whole
(`read_header` checks every tensor's bytes are inside the file: a truncated copy is
named here, not as an mmap or struct error later). Nothing here allocates more than
the header itself, which is bounded by MAX_HEADER_BYTES (the Rust reader's own limit).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError

MAX_HEADER_BYTES = 100_000_000  # safetensors' own MAX_HEADER_SIZE
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple
    begin: int  # byte offset in the file (header included)
    end: int


def read_header(path, fix: str = "copy or save the file again") -> dict[str, TensorEntry]:
    """name -> TensorEntry of every tensor in `path`; one BertkitError naming the file and `fix` when
    the header is not one, or a tensor's bytes fall outside the file (truncated)."""
    path = Path(path)

    def bad(what: str) -> BertkitError:
        return BertkitError(f"{path} is truncated or corrupt ({what}): {fix}")

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise bad(f"a header of {length} bytes in a file of {size}")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, ValueError) as err:
            raise bad(f"its header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    start = 8 + length
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(name, entry, start, size, bad)
    return out


def _entry(name: str, entry, start: int, size: int, bad) -> TensorEntry:
    ok = isinstance(entry, dict) and entry.get("dtype") in ITEM_BYTES and isinstance(entry.get("shape"), list) \
        and all(_whole(d) for d in entry["shape"]) and isinstance(entry.get("data_offsets"), list) \
        and len(entry["data_offsets"]) == 2 and all(_whole(o) for o in entry["data_offsets"])
    if not ok:
        raise bad(f"tensor {name!r} has no valid dtype, shape and data_offsets")
    begin, end = entry["data_offsets"]
    count = 1
    for d in entry["shape"]:
        count *= d
    if end - begin != count * ITEM_BYTES[entry["dtype"]]:
        raise bad(f"tensor {name!r} of shape {entry['shape']} spans {end - begin} bytes")
    if start + end > size:
        raise bad(f"tensor {name!r} ends at byte {start + end}, past the file's end at {size}: it is truncated")
    return TensorEntry(entry["dtype"], tuple(entry["shape"]), start + begin, start + end)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
