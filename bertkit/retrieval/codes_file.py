"""An index's compact vectors on disk: codes.safetensors, and the rows kept for rescoring.

`bertkit index --vectors int8|binary` codes the passage vectors (`bertkit.retrieval.compact`)
into `INDEX/codes.safetensors`:

    codes    I8 [N, D] (int8) or U8 [N, ceil(D / 8)] (binary: packed sign bits): what a search scans
    rescore  I8 [N, D] (binary --rescore-with int8 only): the int8 codes of the same vectors,
             which the search reads for its candidates only
    ranges   F32 [2, D] (int8 codes or rows): the corpus's per-dimension lowest and highest value,
             the calibration the int8 codes were cut with (and the query is)

and then, unless `--rescore-with float32` (`--keep-float`), writes `vectors.safetensors` again
without its "vectors" tensor (keeping "document" and "passage_offset"). What the candidates are
rescored against (`--rescore-with`):

    (none)     the decoded codes themselves: codes only, 1/4 (int8) or 1/32 (binary) of float32's bytes
    int8       binary codes scanned, int8 rows read for the candidates: sentence-transformers' published
               pipeline (a binary index in memory, int8 embeddings on disk); 1/32 scanned, 1/32 + 1/4 stored
    float32    the float rows kept: Qdrant's binary quantization (codes in memory, originals on disk)

index.json's "vectors" says what is stored and what a search scans:

    {"kind": "binary", "stored": ["binary"] | ["binary", "int8"] | ["binary", "float32"],
     "oversampling": 4, "bytes_per_vector": 48, "bytes_stored_per_vector": 48 | 432 | 1584}

"bytes_per_vector" are the bytes scanned per vector (the codes), "bytes_stored_per_vector" the codes and the
rescoring rows (the row tables, 16 bytes a passage, aside). An index without a "vectors" record (or one of
kind float32) stores the float rows alone; a record without "stored" (written before `--keep-float`
existed) kept them. The float rows are needed by the build itself (the codes' calibration, the HNSW
graph, its recall), so they are dropped last, just before index.json is written.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import BertkitError
from bertkit.retrieval import compact
from bertkit.data.vector_files import safetensors_header

CODES = "codes.safetensors"
RESCORE_WITH = ("int8", "float32")  # the rows a search may rescore against beside the codes


def check_choice(vectors: str, rescore_with: str | None) -> None:
    """`--vectors` and `--rescore-with` (`--keep-float`) checked before a build reads anything."""
    if vectors not in compact.KINDS:
        raise BertkitError(f"unknown --vectors {vectors!r}: choose one of {', '.join(compact.KINDS)}")
    if rescore_with is not None and rescore_with not in RESCORE_WITH:
        raise BertkitError(f"unknown --rescore-with {rescore_with!r}: choose int8 or float32 (--keep-float)")
    if rescore_with == "float32" and vectors == "float32":
        raise BertkitError("--keep-float keeps the float rows beside compact codes: add --vectors int8 or binary")
    if rescore_with == "int8" and vectors != "binary":
        raise BertkitError(f"--rescore-with int8 keeps int8 rows beside binary codes, and --vectors {vectors} "
                           "has none to rescore: use --vectors binary --rescore-with int8 (or --vectors int8 alone)")


def record(kind: str, rescore_with: str | None, dim: int) -> dict:
    """index.json's "vectors" for codes of `kind` of D = `dim` dimensions, rescored against `rescore_with`'s
    rows (None: the decoded codes)."""
    per_vector = dim if kind == "int8" else (dim + 7) // 8
    extra = {None: 0, "int8": dim, "float32": 4 * dim}[rescore_with]
    return {"kind": kind, "stored": [kind] + ([rescore_with] if rescore_with else []),
            "oversampling": compact.DEFAULT_OVERSAMPLING, "bytes_per_vector": per_vector,
            "bytes_stored_per_vector": per_vector + extra}


def kind_of(info: dict) -> str:
    """The kind of vectors an index searches: float32, int8 or binary (index.json's "vectors")."""
    return (info.get("vectors") or {}).get("kind", "float32")


def has_float_rows(info: dict) -> bool:
    """Whether vectors.safetensors holds the float rows (see the module docstring)."""
    return kind_of(info) == "float32" or "float32" in info["vectors"].get("stored", ["float32"])


def has_int8_rows(info: dict) -> bool:
    """Whether codes.safetensors holds int8 rows for rescoring beside binary codes (--rescore-with int8)."""
    return kind_of(info) == "binary" and "int8" in info["vectors"].get("stored", [])


def codes_shape(kind: str, n: int, dim: int) -> tuple[int, int]:
    return (n, dim) if kind == "int8" else (n, (dim + 7) // 8)


def codes_tensors(kind: str, n: int, dim: int, int8_rows: bool = False) -> dict:
    """codes.safetensors's tensors, name -> (dtype, shape), in their order in the file."""
    tensors = {"codes": ("I8" if kind == "int8" else "U8", codes_shape(kind, n, dim))}
    if int8_rows:
        tensors["rescore"] = ("I8", (n, dim))
    if kind == "int8" or int8_rows:
        tensors["ranges"] = ("F32", (2, dim))
    return tensors


def codes_writer(vectors: np.ndarray, kind: str, rescore_with: str | None = None, block: int = 65536):
    """write(f) putting the codes file of `vectors` [N, D] (a memory map, coded a block at a time) into f."""
    n, dim = vectors.shape
    int8_rows = rescore_with == "int8"
    ranges = compact.int8_ranges(vectors, block) if kind == "int8" or int8_rows else None
    header = safetensors_header(codes_tensors(kind, n, dim, int8_rows))

    def write(f):
        f.write(header)
        for coded in (kind, "int8") if int8_rows else (kind,):
            for start in range(0, n, block):
                f.write(compact.encode(np.asarray(vectors[start : start + block]), coded, ranges).tobytes())
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
    """Rows start:stop of the index's vectors [stop - start, D]: the float rows, or, in an index without them,
    the vectors its search rescores against (`compact.decode` of the int8 rows, or of the codes)."""
    if index.vectors is not None:
        return np.asarray(index.vectors[start:stop], np.float32)
    if index.rescore is not None:
        return compact.decode(np.asarray(index.rescore[start:stop]), "int8", index.ranges, int(index.info["dim"]))
    return compact.decode(np.asarray(index.codes[start:stop]), kind_of(index.info), index.ranges,
                          int(index.info["dim"]))
