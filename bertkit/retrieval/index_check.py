"""An index folder checked on open, before a search trusts it.

`bertkit.retrieval.index.open_index` memory-maps what `build_index` wrote (its module
docstring has the layout). A folder damaged since (a copy cut short, a file emptied or
edited, a disk that filled up) would otherwise fail deep inside numpy or json, or answer
wrong results quietly. Each check names the file and the fix in one line:

    index.json            JSON object; format; passages N, documents, dim D whole numbers >= 1;
                          the model record (directory, fingerprint, pooling, max_length)
    vectors.safetensors   a whole file (`bertkit.data.safetensors_header`: every tensor's bytes
                          inside it); vectors F32 [N, D] (unless index.json says the index stores
                          only compact codes), document I64 [N], passage_offset I64 [N+1]
    codes.safetensors     with --vectors int8|binary (`bertkit.retrieval.codes_file`): a whole file;
                          codes I8 [N, D] or U8 [N, ceil(D/8)] as index.json's kind says; binary's
                          int8 rows I8 [N, D] when its "stored" names int8 (--rescore-with int8);
                          int8's ranges F32 [2, D], finite, lowest <= highest
    passages.jsonl        exactly passage_offset[N] bytes; offsets increasing from 0
    lexical/              with a lexical part: bm25s' files, each .npy whole (its header's shape and dtype
                          fit in the file), each .json an object
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


def check_files(directory: Path, info: dict, vectors: str, passages: str, float_rows: bool = True,
                codes: tuple[str, str, dict] | None = None) -> None:
    """The files are there and whole, with the tensors index.json says: the vectors file (the float rows
    unless `float_rows` is False: an index of compact codes alone), passages.jsonl, and with `codes`
    (file name, kind, its tensors: `bertkit.retrieval.codes_file.codes_tensors`) the codes file. Every
    presence and kind is checked before any header is read."""
    path = directory / vectors
    if not path.is_file():
        raise BertkitError(f"{path} is missing: the index is incomplete; {REBUILD}")
    n, dim = info["passages"], info["dim"]
    want = {"document": ("I64", (n,)), "passage_offset": ("I64", (n + 1,))}
    files = [(path, ({"vectors": ("F32", (n, dim))} if float_rows else {}) | want)]
    if not (directory / passages).is_file():
        raise BertkitError(f"{directory / passages} is missing: the index is incomplete; {REBUILD}")
    if codes is not None:
        files.append(_codes_file(directory, *codes))
    for path, want in files:
        _check_tensors(directory, path, want)


def _codes_file(directory: Path, codes: str, kind: str, want: dict) -> tuple[Path, dict]:
    """The codes file and the tensors it must hold, `want` (name -> (dtype, shape)): the codes of `kind`
    (index.json's), the rows and ranges its "vectors" record names, of the shapes its counts say."""
    path = directory / codes
    if kind not in ("int8", "binary"):
        raise BertkitError(f"{directory / 'index.json'}: vectors kind {kind!r} is not float32, int8 or binary: the "
                           f"index is corrupt; {REBUILD}")
    if not path.is_file():
        raise BertkitError(f"{path} is missing (index.json says the index has {kind} codes): the index is "
                           f"incomplete; {REBUILD}")
    return path, want


def _check_tensors(directory: Path, path: Path, want: dict) -> None:
    """Each tensor of `want` (name -> (dtype, shape)) is in the whole file `path` with that dtype and shape."""
    header = read_header(path, f"the index is corrupt; {REBUILD}")
    for name, (dtype, shape) in want.items():
        entry = header.get(name)
        if entry is None or entry.dtype != dtype or entry.shape != tuple(shape):
            found = "no such tensor" if entry is None else f"{entry.dtype} {list(entry.shape)}"
            raise BertkitError(f"{path}: {name} should be {dtype} {list(shape)}, as {directory / 'index.json'} says, "
                               f"found {found}: the files disagree; {REBUILD}")


def check_values(directory: Path, info: dict, tensors: dict, passages: str, codes: dict | None = None) -> None:
    """Offsets against passages.jsonl, document numbers in range, every vector finite, int8's calibration
    ranges finite and ordered (`codes`: the codes file's tensors)."""
    offsets, document = tensors["passage_offset"], tensors["document"]
    size = (directory / passages).stat().st_size
    if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) <= 0):
        raise BertkitError(f"{directory / passages} has {size} bytes, not the {int(offsets[-1])} its passage "
                           f"offsets say (or the offsets are out of order): the index is corrupt; {REBUILD}")
    if len(document) and (document.min() < 0 or document.max() >= info["documents"]):
        raise BertkitError(f"{directory}: a passage's document number is outside 0..{info['documents'] - 1}: "
                           f"the index is corrupt; {REBUILD}")
    ranges = (codes or {}).get("ranges")
    if ranges is not None and not (np.isfinite(ranges).all() and np.all(ranges[0] <= ranges[1])):
        raise BertkitError(f"{directory}: the int8 calibration ranges are not finite or not lowest <= highest: the "
                           f"index is corrupt; {REBUILD}")
    vectors = tensors.get("vectors", np.empty((0, 1), np.float32))
    for start in range(0, len(vectors), SCAN_ROWS):
        block = np.asarray(vectors[start:start + SCAN_ROWS])
        if not np.isfinite(block).all():
            row = start + int(np.argwhere(~np.isfinite(block))[0][0])
            raise BertkitError(f"{directory}: vector {row} is not finite (NaN or infinity): the index is corrupt; "
                               f"{REBUILD}")


def check_lexical(folder: Path, names: tuple) -> dict:
    """The lexical part's files `names` in `folder` are there and whole (an .npy's header read, its data's
    bytes inside the file; a .json an object), read without bm25s and without loading an array; returns each
    .json's object as read (name -> object), for the retriever made from them (`lexical.hold_lexical`)."""
    objects = {}
    for name in names:
        path = folder / name
        if not path.is_file():
            raise BertkitError(f"{path} is missing: the index's lexical part is incomplete; {REBUILD}")
        if name.endswith(".npy"):
            _check_npy(path)
        else:
            try:
                objects[name] = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError):
                objects[name] = None
            if not isinstance(objects[name], dict):
                raise BertkitError(f"{path} is not a JSON object: the index's lexical part is corrupt; {REBUILD}")
    return objects


def _check_npy(path: Path) -> None:
    """An .npy file's header, and its data's bytes within the file (a file cut short is named)."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise ValueError(f"an .npy version {version} that np.save does not write")
            shape, _, dtype = read[version](f)
        except (ValueError, EOFError) as err:
            raise BertkitError(f"{path} is not a whole .npy file ({' '.join(str(err).split())}): the index's "
                               f"lexical part is corrupt; {REBUILD}") from None
        need = f.tell() + int(np.prod(shape)) * dtype.itemsize
    if path.stat().st_size < need:
        raise BertkitError(f"{path} has {path.stat().st_size} bytes, not the {need} its header says: the index's "
                           f"lexical part is corrupt; {REBUILD}")
