"""An index's compact vectors on disk: codes.safetensors, and the float rows kept or dropped.

`bertkit index --vectors int8|binary` codes the passage vectors (`bertkit.retrieval.compact`)
into `INDEX/codes.safetensors`:

    codes    I8 [N, D] (int8) or U8 [N, ceil(D / 8)] (binary: packed sign bits)
    ranges   F32 [2, D] (int8 only): the corpus's per-dimension lowest and highest value,
             the calibration the codes were cut with (and the query is)

and then, unless `--keep-float`, writes `vectors.safetensors` again without its
"vectors" tensor (keeping "document" and "passage_offset"): a codes-only index
stores 1/4 (int8) or 1/32 (binary) of float32's vector bytes, and searches
rescore against the decoded codes. index.json's "vectors" says what is stored:

    {"kind": "binary", "stored": ["binary"] or ["binary", "float32"], "oversampling": 4,
     "bytes_per_vector": 48}

An index without a "vectors" record (or one of kind float32) stores the float
rows alone; a record without "stored" (written before `--keep-float` existed) kept them.
The float rows are needed by the build itself (the codes' calibration, the HNSW
graph, its recall), so they are dropped last, just before index.json is written.
"""

from __future__ import annotations

import numpy as np

from bertkit.retrieval import compact
from bertkit.data.vector_files import safetensors_header

CODES = "codes.safetensors"


def record(kind: str, keep_float: bool, dim: int) -> dict:
    """index.json's "vectors" for codes of `kind` of D = `dim` dimensions."""
    per_vector = dim if kind == "int8" else (dim + 7) // 8
    return {"kind": kind, "stored": [kind, "float32"] if keep_float else [kind],
            "oversampling": compact.DEFAULT_OVERSAMPLING, "bytes_per_vector": per_vector}


def kind_of(info: dict) -> str:
    """The kind of vectors an index searches: float32, int8 or binary (index.json's "vectors")."""
    return (info.get("vectors") or {}).get("kind", "float32")


def has_float_rows(info: dict) -> bool:
    """Whether vectors.safetensors holds the float rows (see the module docstring)."""
    return kind_of(info) == "float32" or "float32" in info["vectors"].get("stored", ["float32"])


def codes_shape(kind: str, n: int, dim: int) -> tuple[int, int]:
    return (n, dim) if kind == "int8" else (n, (dim + 7) // 8)


def codes_writer(vectors: np.ndarray, kind: str, block: int = 65536):
    """write(f) putting the codes file of `vectors` [N, D] (a memory map, coded a block at a time) into f."""
    n, dim = vectors.shape
    ranges = compact.int8_ranges(vectors, block) if kind == "int8" else None
    tensors = {"codes": ("I8" if kind == "int8" else "U8", codes_shape(kind, n, dim))}
    if ranges is not None:
        tensors["ranges"] = ("F32", (2, dim))
    header = safetensors_header(tensors)

    def write(f):
        f.write(header)
        for start in range(0, n, block):
            f.write(compact.encode(np.asarray(vectors[start : start + block]), kind, ranges).tobytes())
        if ranges is not None:
            f.write(ranges.astype("<f4").tobytes())

    return write


def without_float_writer(document: np.ndarray, passage_offset: np.ndarray):
    """write(f) putting a vectors.safetensors with the row tables alone (document, passage_offset) into f."""
    header = safetensors_header({"document": ("I64", document.shape), "passage_offset": ("I64", passage_offset.shape)})

    def write(f):
        f.write(header)
        f.write(np.asarray(document, "<i8").tobytes())
        f.write(np.asarray(passage_offset, "<i8").tobytes())

    return write


def rows_or_decoded(index, start: int, stop: int) -> np.ndarray:
    """Rows start:stop of the index's vectors [stop - start, D]: the float rows, or, in an index that stores
    only codes, the vectors the codes stand for (`compact.decode`: what its search rescores against)."""
    if index.vectors is not None:
        return np.asarray(index.vectors[start:stop], np.float32)
    return compact.decode(np.asarray(index.codes[start:stop]), kind_of(index.info), index.ranges,
                          int(index.info["dim"]))
