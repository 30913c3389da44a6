"""The files `bertkit embed` writes: vectors out, streamed in bounded memory.

The writers consume the stream of results `bertkit.embeddings.features.iter_embed` yields
(from texts `bertkit.data.textfiles.read_texts` streams), so a corpus of any size
embeds in flat memory:

    .npy          pooled vectors: one [N, D] float32 array
    .safetensors  pooled: "embeddings" [N, D]; per token or word: "vectors" [sum T_i, D]
                  with "offsets" [N+1] (rows of text i are offsets[i]:offsets[i+1]); per token
                  also "token_ids" [sum T_i] (each row's token: the model's vocab.txt line number)
    .jsonl        one JSON object per text (per token: its "tokens" beside its "vectors")

The .npy and .safetensors writers leave room for the header (which needs the row count),
stream the rows after it and write it at the end: the disk holds the output once. Every file is written whole or not at all
(`bertkit.data.atomic`): Ctrl-C or a kill midway leaves the file that stood at its name before. `map_safetensors` reads such a file
back as memory maps (an index's vectors and codes, `bertkit.retrieval.index`).

A write given a `Journal` can be resumed: every `every` rows it fsyncs NAME.tmp and records, in
NAME.resume.json (written atomically, after the rows are on the disk), how many rows are whole and how
long NAME.tmp was then, beside the plan that made them (the input, the model, the options). A run killed
midway (SIGKILL, a full disk, Ctrl-C) keeps NAME.tmp, and `open_journal(..., resume=True)` says where the
same run goes on: NAME.tmp is cut back to the recorded rows and the rows after them are appended, so the
finished file is byte for byte what one uninterrupted run writes. Per-token and per-word rows of a
.safetensors need each text's row count for the offsets written at the end: NAME.resume.lengths (int64);
per-token rows their token ids too (written after the offsets): NAME.resume.ids (int64).
"""

from __future__ import annotations

import io
import json
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from bertkit.data.atomic import replace_atomically, room_for, write_json, write_through
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


def npy_header(f, dtype, shape: tuple) -> None:
    """The .npy header np.save writes for a C-ordered array of `dtype` and `shape`, into the binary file `f`: for a
    writer that streams the data after it (embed's vectors here, pre-training's shards and corpus)."""
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})


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


def write_vectors(rows: Iterable, path, pooled: bool, texts: Sequence | None = None,
                  journal: Journal | None = None, tokens: Callable | None = None) -> int:
    """Stream results into `path` by its suffix; returns the number of rows written.

    .npy          pooled vectors only: one [N, D] float32 array.
    .safetensors  pooled: tensor "embeddings" [N, D]; per-token/word: "vectors"
                  [sum T_i, D] with "offsets" [N+1] (rows of text i are
                  offsets[i]:offsets[i+1]); with `tokens`, "token_ids" [sum T_i] int64.
    .jsonl        one JSON object per text: {"index", "embedding"} or {"index", "vectors"}
                  (plus "text" when `texts` is given; with `tokens`, "tokens" before "vectors").

    `tokens` (per-token rows): each row is a (vectors [T, D], token ids [T]) pair and tokens(ids) names the ids
    (`Tokenizer.convert_ids_to_tokens`), so a reader knows which token each vector is without the tokenizer.

    The .npy and .safetensors writers stream the rows into the file after room left for the header, so
    memory stays flat however many texts stream through, and the disk holds them once. With a `journal`
    (`open_journal`) the write records checkpoints a killed run goes on from; `rows` are then the rows after
    the journal's (its texts from `journal.rows` on), and the count returned is of all.
    """
    path = Path(path)
    suffix = vector_format(path, pooled)
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside `path`, then renamed over it: streamed straight into `path`, a .jsonl stopped midway
    # (Ctrl-C, a kill) was its first k rows, a file that reads as whole, and the old file was gone from the start
    count = []
    if suffix == ".jsonl":
        write = lambda out: count.append(_write_jsonl(rows, out, pooled, texts, journal, tokens))  # noqa: E731
    else:
        ids = tokens is not None
        write = lambda out: count.append(_write_tensors(rows, out, suffix, pooled, journal, ids))  # noqa: E731
    if journal is None:
        replace_atomically(path, write)
        return count[0]
    write_through(path, lambda tmp: journal.write_into(tmp, write), keep=journal.keeps)
    journal.discard()  # the file is whole at its name: nothing left to go on from
    return count[0]


def room_for_rows(path, texts: int, width: int, per_text: int = 1) -> None:
    """Refuse (`bertkit.data.atomic.room_for`), before they are computed, the vectors of `texts` texts, `per_text`
    rows each or more, of `width` values or more, still to be written to `path`, that its disk certainly cannot hold:
    each value takes 4 bytes or more in every format (float32; in JSON "0.0, " at least), the header comes on top."""
    room_for(Path(path).parent, texts * per_text * width * 4, f"the vectors of {texts} texts")


def vector_format(path, pooled: bool) -> str:
    """The format `write_vectors` writes to `path` (its suffix: .npy, .safetensors, .jsonl), refused where it is
    none of them or cannot hold the rows (per-token or per-word rows in a .npy)."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".npy", ".safetensors", ".jsonl"):
        raise BertkitError(f"unknown output format {Path(path).name!r}: use a .npy, .safetensors or .jsonl file name")
    if suffix == ".npy" and not pooled:
        raise BertkitError(
            "per-token and per-word vectors have a different length for each text and do not fit one .npy "
            "array: write them to .safetensors or .jsonl, or choose --pooling mean/cls"
        )
    return suffix


# the most rows a header is made room for before the count is known (its digits are what count)
MAX_ROWS = 10**15


def _write_tensors(rows, out, suffix: str, pooled: bool, journal: Journal | None = None, ids: bool = False) -> int:
    """The rows' float32 bytes into the binary file `out` after a header of a fixed size, which is written at the
    end, once the row count is known; returns the number of results. The rows were spooled into NAME.part and
    then copied after a header: twice the output's room on the disk at the end, and a disk that held the spool
    failed at the copy, after every text was embedded. A journal's rows (and width) are there already. With
    `ids`, rows are (vectors, token ids) pairs and the ids (8 bytes a token, 1/D of the vectors) are kept for the
    end, after the offsets."""
    lengths = journal.lengths if journal is not None else []
    token_ids = journal.ids if journal is not None else array("q")
    dim = journal.done.get("dim") if journal is not None else None
    room = len(_header(suffix, pooled, MAX_ROWS, dim, MAX_ROWS, ids=ids)) if dim is not None else 0
    for row in rows:
        if ids:
            row, row_ids = row
            token_ids.extend(row_ids)
        row = np.ascontiguousarray(row, dtype="<f4")
        if dim is None:
            dim = row.shape[-1]
            room = len(_header(suffix, pooled, MAX_ROWS, dim, MAX_ROWS, ids=ids))
            out.write(bytes(room))
        lengths.append(1 if row.ndim == 1 else row.shape[0])
        out.write(row.tobytes())
        if journal is not None:
            journal.wrote(out, len(lengths), dim)
    if dim is None:
        raise BertkitError("nothing to write: the input holds no texts")
    if suffix == ".safetensors" and not pooled:
        out.write(np.concatenate([[0], np.cumsum(lengths)]).astype("<i8").tobytes())  # offsets [N+1]
        if ids:
            assert len(token_ids) == sum(lengths), (len(token_ids), sum(lengths))  # one id per vector row
            out.write(np.frombuffer(token_ids, dtype=np.int64).astype("<i8").tobytes())  # token_ids [sum T_i]
    out.seek(0)
    out.write(_header(suffix, pooled, sum(lengths), dim, len(lengths), room, ids=ids))
    return len(lengths)


def _write_jsonl(rows, out, pooled: bool, texts, journal: Journal | None = None, tokens=None) -> int:
    """One JSON object per result into the binary file `out` (UTF-8), after a journal's; returns the count.
    With `tokens` (ids -> strings) rows are (vectors, token ids) pairs, and each line names its tokens."""
    n = journal.rows if journal is not None else 0
    for row in rows:
        record = {"index": n}
        if texts is not None:
            record["text"] = texts[n]
        if tokens is not None:
            row, row_ids = row
            record["tokens"] = list(tokens(list(row_ids)))
        record["embedding" if pooled else "vectors"] = np.round(row.astype(np.float64), 7).tolist()
        out.write((json.dumps(record) + "\n").encode("utf-8"))
        n += 1
        if journal is not None:
            journal.wrote(out, n)
    return n


def _header(suffix: str, pooled: bool, total: int, dim: int, n: int, room: int = 0, ids: bool = False) -> bytes:
    """The header of a [total, D] float32 .npy, or of a .safetensors (pooled, or vectors with n+1 offsets, and
    `ids`: total token ids), made `room` bytes long: a .safetensors' JSON padded with spaces (the format allows
    it); a .npy's is that long already for a `room` made with more rows (numpy leaves room for the first axis'
    digits)."""
    if suffix == ".npy":
        header = io.BytesIO()
        npy_header(header, "<f4", (total, dim))
        made = header.getvalue()
        assert not room or len(made) == room, (len(made), room)
        return made
    if pooled:
        return safetensors_header({"embeddings": ("F32", (total, dim))}, room)
    tensors = {"vectors": ("F32", (total, dim)), "offsets": ("I64", (n + 1,))}
    if ids:
        tensors["token_ids"] = ("I64", (total,))
    return safetensors_header(tensors, room)


# --- going on after a kill: the journal of a resumable write --------------------------------------

RECORD_SUFFIX, COUNTS_SUFFIX, IDS_SUFFIX = ".resume.json", ".resume.lengths", ".resume.ids"


@dataclass(frozen=True)
class PlanDifference:
    """The first entry of a resumed run's plan that differs from the interrupted run's: `key`, the plan's key, for
    a caller to decide on (index --resume says more of changed passages), and `said`, the sentence for a person."""

    key: str
    said: str

    def __str__(self) -> str:
        return self.said


def plan_difference(saved: dict, plan: dict) -> PlanDifference | None:
    """The first entry of `plan` that differs from `saved`, said for a person ("batch_size was 32 in the
    interrupted run and is 4 now"; of a record, its differing fields only, not the whole record), or None when
    they agree: what `bertkit index --resume` and `bertkit embed --resume` compare before they go on."""
    for key in plan:
        was, now = saved.get(key), plan[key]
        if was != now:
            named = key
            if isinstance(was, dict) and isinstance(now, dict):
                named += " " + ", ".join(k for k in {**was, **now} if was.get(k) != now.get(k))
                was, now = ({k: v for k, v in d.items() if was.get(k) != now.get(k)} for d in (was, now))
            return PlanDifference(key, f"{named} was {was!r} in the interrupted run and is {now!r} now")
    return None


@dataclass
class Journal:
    """What a resumable write of `path` records beside NAME.tmp (the module docstring), made by `open_journal`.

    plan() is asked once, at the first checkpoint or a resume (it may hash a corpus and a model: a file
    shorter than one chunk never asks). `done` is the checkpoint gone on from ({}: the start); the writer
    appends each text's row count to `lengths` and calls `wrote` after every row."""

    path: Path
    plan: Callable[[], dict] | None  # None with every=0: a write that cannot be resumed (standard input)
    every: int  # rows between checkpoints (0: none): the caller's chunk, so a resume starts at a chunk's first text
    counts: bool  # keep each text's row count in NAME.resume.lengths (a .safetensors of per-token rows)
    done: dict = field(default_factory=dict)
    lengths: list = field(default_factory=list)
    keeps_ids: bool = False  # keep each row's token id in NAME.resume.ids (a .safetensors of per-token rows)
    ids: array = field(default_factory=lambda: array("q"))
    ids_recorded: int = 0  # the ids NAME.resume.ids holds
    recorded: int = 0  # the rows the last checkpoint says are on the disk
    _plan: dict | None = None

    @property
    def rows(self) -> int:
        return self.done.get("rows", 0)

    @property
    def record(self) -> Path:
        return self.path.with_name(self.path.name + RECORD_SUFFIX)

    @property
    def counts_file(self) -> Path:
        return self.path.with_name(self.path.name + COUNTS_SUFFIX)

    @property
    def ids_file(self) -> Path:
        return self.path.with_name(self.path.name + IDS_SUFFIX)

    def the_plan(self) -> dict:
        if self._plan is None:
            self._plan = self.plan()
        return self._plan

    def write_into(self, tmp: Path, write) -> None:
        """write(NAME.tmp opened where the journal goes on), under NAME.tmp's lock (`write_through`): from the
        start a record left beside it is stale; on resume the bytes past the checkpoint (a row cut short) go."""
        if not self.rows:
            self.discard()
        elif self.counts:
            with open(self.counts_file, "r+b") as f:
                f.truncate(self.rows * 8)
            if self.keeps_ids:
                with open(self.ids_file, "r+b") as f:
                    f.truncate(len(self.ids) * 8)
        try:
            with open(tmp, "r+b" if self.rows else "wb") as out:
                if self.rows:
                    out.truncate(self.done["bytes"])
                    out.seek(self.done["bytes"])
                write(out)
        except BaseException as err:  # NAME.tmp goes too (`write_through`), unless it keeps rows to go on from
            if not self.keeps(err):
                self.discard()
            raise

    def wrote(self, out, n: int, dim: int | None = None) -> None:
        """After the n-th row of `out`: every `every` rows (a chunk's end), the rows fsync'ed, then recorded."""
        if not self.every or n % self.every:
            return
        out.flush()
        os.fsync(out.fileno())  # the rows reach the disk before the record says they are there
        if self.counts:
            _append(self.counts_file, np.asarray(self.lengths[self.recorded : n], dtype="<i8"))
        if self.keeps_ids:  # the ids of rows 0..n-1, one per vector: the writer adds a row's ids before its vectors
            _append(self.ids_file, np.frombuffer(self.ids, dtype=np.int64)[self.ids_recorded :])
            self.ids_recorded = len(self.ids)
        write_json(self.record, {"plan": self.the_plan(), "done": {"rows": n, "bytes": out.tell(), "dim": dim}})
        self.recorded = n

    def keeps(self, err: BaseException) -> bool:
        """Whether NAME.tmp (and the record) outlive `err`: rows are recorded, and the input is not what stopped
        the run (a text refused is mended in the input, which makes another run)."""
        return self.recorded > 0 and not isinstance(err, BertkitError)

    def discard(self) -> None:
        for path in (self.record, self.counts_file, self.ids_file):
            path.unlink(missing_ok=True)


def _append(path: Path, values: np.ndarray) -> None:
    """values as int64 at the end of `path`, on the disk when it returns (a checkpoint's side file)."""
    with open(path, "ab") as f:
        f.write(values.astype("<i8").tobytes())
        f.flush()
        os.fsync(f.fileno())


def open_journal(path, plan: Callable[[], dict] | None, every: int, resume: bool, pooled: bool,
                 ids: bool = False) -> Journal:
    """The journal of a resumable write of `path` (pooled: one row per text; ids: rows that carry token ids,
    `write_vectors`'s `tokens`), from the start, or (resume) from
    the last checkpoint of the interrupted run beside it. Refused in one line: resume where nothing was recorded,
    or with another plan() than the one recorded (naming the difference); a start from nothing beside a killed
    run's recorded rows, which it would throw away (--resume goes on from them)."""
    path = Path(path)
    counts = path.suffix.lower() == ".safetensors" and not pooled
    journal = Journal(path, plan, every, counts=counts, keeps_ids=counts and ids)
    tmp = path.with_name(path.name + ".tmp")
    saved = _saved(journal.record, tmp) if tmp.is_file() else None
    if not resume:
        if saved is not None:
            total = saved["plan"].get("texts")
            raise BertkitError(f"{tmp} holds the vectors of {saved['done']['rows']}{f' of {total}' if total else ''} "
                               f"texts from an interrupted run: add --resume to go on from them, or delete {tmp} "
                               "to start again")
        return journal
    if saved is None:
        if tmp.is_file():
            raise BertkitError(f"--resume: the run that left {tmp} stopped before its first checkpoint (every "
                               f"{every} texts), so there is nothing to go on from: run without --resume")
        if path.exists():
            raise BertkitError(f"--resume: {path} is finished (no interrupted run is beside it): run without "
                               "--resume to write it again")
        raise BertkitError(f"--resume: no interrupted run of {path} to go on from: run without --resume")
    difference = plan_difference(saved["plan"], journal.the_plan())
    if difference:
        raise BertkitError(f"--resume: {difference}: resume with the same input, model and options, or delete "
                           f"{tmp} to start again")
    journal.done, journal.recorded = saved["done"], saved["done"]["rows"]
    rows = journal.rows
    short = journal.counts and (not journal.counts_file.is_file() or journal.counts_file.stat().st_size < rows * 8)
    if tmp.stat().st_size < saved["done"]["bytes"] or short:
        raise BertkitError(f"--resume: {tmp} holds less than {journal.record.name} says was written (was it changed "
                           f"since?): delete {tmp} to start again")
    journal.lengths = np.fromfile(journal.counts_file, "<i8", count=rows).tolist() if journal.counts else [1] * rows
    if journal.keeps_ids:
        tokens = sum(journal.lengths)
        if not journal.ids_file.is_file() or journal.ids_file.stat().st_size < tokens * 8:
            raise BertkitError(f"--resume: {journal.ids_file.name} holds fewer token ids than {journal.record.name} "
                               f"says were written (was it changed since?): delete {tmp} to start again")
        journal.ids = array("q", np.fromfile(journal.ids_file, "<i8", count=tokens).astype(np.int64).tobytes())
        journal.ids_recorded = tokens
    return journal


def _saved(record: Path, tmp: Path) -> dict | None:
    """A resumable write's record (None: none), read as written (`Journal.wrote`)."""
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:
        saved = None
    if not (isinstance(saved, dict) and isinstance(saved.get("plan"), dict) and isinstance(saved.get("done"), dict)
            and {"rows", "bytes"} <= set(saved["done"])):
        raise BertkitError(f"{record} is no record of an interrupted run: delete it and {tmp} to start again")
    return saved
