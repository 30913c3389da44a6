"""The index on disk: a corpus's passages, their vectors, and the model that made them.

`bertkit index CORPUS -o INDEX/` cuts the documents into passages
(`bertkit.retrieval.passages`), embeds them and writes one folder:

    index.json            {"format": 1, "model": {directory, fingerprint, pooling, normalize, max_length,
                           precision}, "passage_tokens", "overlap" (the stride), "passages": N, "documents", "dim": D,
                           "max_passages_per_document", "corpus"}
    passages.jsonl        one {"id", "doc_id", "title", "start", "end", "text"} per passage, row order
    hnsw.faiss            with --ann hnsw: a FAISS HNSW graph of the vectors (`bertkit.retrieval.ann`)
    codes.safetensors     with --vectors int8|binary: the codes (and rows to rescore: `retrieval.codes_file`)
    vectors.safetensors   "vectors"        F32 [N, D]   unit rows (cosine = dot product); with --vectors
                                                        int8|binary only if --keep-float
                          "document"       I64 [N]      the document number of each row (0.. documents-1)
                          "passage_offset" I64 [N+1]    byte offset of row i's line in passages.jsonl

Every tensor is read back through `np.memmap` at its data offset (`open_index`), so an index
larger than RAM is searched a block at a time (`bertkit.retrieval.exact.top_k`) and one passage
is read at its line's offset in passages.jsonl, held open: an open `Index` is the build it opened.

The model is named by its resolved directory and the SHA-256 of its weights
files (`bertkit.runtime.loading.weights_fingerprint`): a query embedded by another model, or by the same
directory after its weights changed, lands in another vector space, so
`check_model` refuses it in one line naming both.

Resumable building. Passages are encoded in a fixed order (by token count, then
row: length-sorted batches carry little padding) and in fixed parts of
`part_size` rows; each finished part is written as `parts/part-NNNNN.npy`
through a temporary file and `os.replace`, so a part is on disk whole or not at
all. `build.json` records the plan (model, settings, a hash of the passages).
Killed at any point (SIGKILL included) and started again with `resume=True`,
the build checks that the plan is the same, skips the parts on disk and encodes
the rest; the batches are the same as in an uninterrupted run, so the finished
index is byte for byte the same. `index.json` is written last: a folder
without it is not an index.

Past one machine: `torchrun --nproc_per_node N [--nnodes M ...] -m bertkit.cli
index CORPUS -o INDEX/` (torch.distributed's env:// rendezvous: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT; gloo on CPUs, NCCL on GPUs, one GPU per rank,
`bertkit.training.distributed`). Every rank reads the corpus and cuts the same
passages (cheap and deterministic) and so knows the same parts; the parts are
dealt to the ranks from the longest down, back and forth (`distributed.deal`:
ranks 0..N-1, then N-1..0, then again), so that each rank gets about the same
work. Rank 0 prepares the folder (passages.jsonl, build.json; a refusal, such
as a used folder or a changed plan, is raised on every rank); then each rank
encodes and writes its own parts; after a barrier rank 0 assembles
vectors.safetensors and index.json, which are the files one process writes (the
vectors within float rounding: another thread count may sum in another order). INDEX must be one folder that every rank sees: on one
machine any folder, across machines a shared filesystem (NFS, Lustre, a
mounted bucket). The parts are named by number, not by rank, so `resume=True`
keeps every finished part, whichever rank wrote it, and may be run with another
number of ranks, or alone. Only rank 0 shows a progress bar (its share); each
rank logs its encoding rate (logger `bertkit.retrieval.index`, INFO).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bertkit.data.atomic import allocate, replace_atomically, room_for, write_json
from bertkit.data.lock import LOCK_FILE, first_process, folder_lock
from bertkit.errors import BertkitError, int_at_least
from bertkit.runtime.loading import Loaded, weights_fingerprint
from bertkit.retrieval import codes_file
from bertkit.retrieval.ann import HNSW_FILE, build_measured, check_kind, faiss_module, hnsw_bytes, read_hnsw
from bertkit.retrieval.config import LexicalOptions, options_of
from bertkit.retrieval.encoding import EncodingSettings, encode, sentence_encoder
from bertkit.retrieval.index_check import check_files, check_lexical, check_values, read_info
from bertkit.retrieval.lexical import (LEXICAL_DIR, LEXICAL_FILES, build_lexical, hold_lexical, read_lexical,
                                      require_packages)
from bertkit.retrieval.passages import cut_all, default_stride, passage_lines, passages_sha256, read_documents
from bertkit.training import distributed
from bertkit.data.vector_files import map_safetensors, plan_difference, safetensors_header

FORMAT = 1
INDEX_JSON, BUILD_JSON = "index.json", "build.json"
PASSAGES, VECTORS, PARTS = "passages.jsonl", "vectors.safetensors", "parts"

log = logging.getLogger(__name__)


# --- the model that made the vectors -----------------------------------------------------------

def model_record(loaded: Loaded) -> dict:
    """What index.json says about the model: enough to embed a query the same way and to recognise it."""
    if loaded.directory is None:
        raise BertkitError("an index needs a model directory (its fingerprint is recorded), not a model in memory")
    settings = EncodingSettings.of(loaded)
    return {"directory": settings.model, "fingerprint": weights_fingerprint(loaded.weights_dir), "pooling": settings.pooling,
            "normalize": True, "max_length": settings.max_length, "precision": settings.dtype}


def model_folder(directory) -> Path | None:
    """The folder of the model that made the index in `directory` (its index.json alone: the searches open the
    index), what serve loads when no model is given; None where it is gone (`check_model` then says)."""
    made = Path(index_info(Path(directory))["model"]["directory"])
    return made if made.is_dir() else None


def check_model(info: dict, loaded: Loaded) -> None:
    """Refuse a model other than the one that made the index (other weights, or other pooling)."""
    made = info["model"]
    now = model_record(loaded)
    if now["fingerprint"] != made["fingerprint"] or now["pooling"] != made["pooling"]:
        same_dir = now["directory"] == made["directory"]
        what = " (its weights changed since)" if same_dir else ""
        raise BertkitError(
            f"this index was made by {made['directory']} (weights {made['fingerprint'][:12]}, {made['pooling']} "
            f"pooling), not {now['directory']}{what} (weights {now['fingerprint'][:12]}, {now['pooling']} pooling): "
            "search it with the model that made it, or build the index again with this one"
        )


# --- building ----------------------------------------------------------------------------------

def _prepare_folder(out: Path, resume: bool, overwrite: bool = False) -> None:
    if resume and overwrite:  # one was ignored (and a finished index's refusal said "pass --overwrite" to it)
        raise BertkitError("--resume continues an interrupted build and --overwrite starts it again: give one")
    if overwrite and not resume and ((out / INDEX_JSON).is_file() or (out / BUILD_JSON).is_file()):
        _empty(out)  # an index's folder holds only what a build wrote (it started empty)
    if (out / INDEX_JSON).is_file():
        raise BertkitError(f"{out} already holds a finished index: pass --overwrite to replace it, choose another "
                           f"folder, or add a graph or lexical part to it: bertkit index add {out} --ann hnsw")
    unfinished = (out / BUILD_JSON).is_file()
    if resume and not unfinished:
        raise BertkitError(f"--resume: {out} holds no unfinished index; start without --resume")
    if not resume and unfinished:
        raise BertkitError(f"{out} holds an unfinished index: add --resume to continue it, or --overwrite to "
                           "start again")
    if not resume and out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise BertkitError(f"{out} is not empty: write the index to a new or empty folder")


def _empty(out: Path) -> None:
    """Remove everything in `out` but its lock file."""
    for path in out.iterdir():
        if path.name == LOCK_FILE:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _check_plan(out: Path, plan: dict) -> None:
    saved = json.loads((out / BUILD_JSON).read_text())
    difference = plan_difference(saved, plan)
    # corpus, model and cut as before (plan order): the passages differ, and no setting of the user's does
    if difference and difference.key in ("passages", "passages_sha256"):
        raise BertkitError(
            f"--resume: the passages are not the interrupted run's ({saved.get('passages')} passages, text hash "
            f"{str(saved.get('passages_sha256'))[:12]} then; {plan['passages']}, {plan['passages_sha256'][:12]} now): "
            f"{plan['corpus']} changed since, or another bertkit version started the run and cut the passages "
            "otherwise (a window begins at a word since 2026-11-27); its encoded parts are of those passages: start "
            "again with --overwrite")
    if difference:
        raise BertkitError(f"--resume: {difference}: resume with the same corpus, model and settings, or start in a "
                           "new folder")


def _start(out: Path, resume: bool, plan: dict, lines: list[bytes], dim: int) -> None:
    """The folder's parts/, and passages.jsonl with build.json (or, resuming, the check that the plan is the same),
    once the disk is known to have room for what the build will certainly write (`_still_to_write`)."""
    if resume:
        _check_plan(out, plan)
    # a BertkitError (NoSpace), which `distributed.on_rank_0` says on every rank: none left waiting
    room_for(out, _still_to_write(out, plan, lines, dim, resume), "the index's passages and vectors")
    (out / PARTS).mkdir(parents=True, exist_ok=True)
    if not resume:
        replace_atomically(out / PASSAGES, lambda f: f.writelines(lines))
        write_json(out / BUILD_JSON, plan)


def _still_to_write(out: Path, plan: dict, lines: list[bytes], dim: int, resume: bool) -> int:
    """A lower bound of the bytes the build writes into `out` from here: passages.jsonl (unless resuming), the parts
    not on disk yet (float32 rows [n, D], D the hidden size sentence vectors have) and vectors.safetensors, which
    `_assemble` writes while every part is still there, and an HNSW graph's vectors and neighbours (`hnsw_bytes`).
    The BM25 and codes parts come on top: left out, as their sizes are not certain."""
    n, size, ann = plan["passages"], plan["part_size"], plan["ann"]
    missing = sum(min(size, n - start) for start in range(0, n, size) if not _part_path(out, start // size).is_file())
    return ((0 if resume else sum(map(len, lines))) + missing * dim * 4 + _tensor_bytes(n, dim)
            + (hnsw_bytes(n, dim, ann["m"]) if ann else 0))


def _encode_parts(out: Path, texts: list[str], order: list[int], part_size: int, loaded: Loaded,
                  settings: EncodingSettings, batch_size: int, progress: bool,
                  rank: distributed.DistInfo) -> None:
    """Encode this rank's parts missing from OUT/parts (part p: rows `order[p*part_size:(p+1)*part_size]`)."""
    starts = list(range(0, len(order), part_size))
    mine = [starts[p] for p in distributed.deal(len(starts), rank)]
    todo = [s for s in mine if not _part_path(out, s // part_size).is_file()]
    size = {s: len(order[s : s + part_size]) for s in mine}
    desc = "encoding passages" + (f" (rank 0's share of {rank.world_size} ranks)" if rank.enabled else "")
    t0, encoded = time.perf_counter(), 0
    with tqdm(total=sum(size.values()), initial=sum(size.values()) - sum(size[s] for s in todo),
              disable=not (progress and rank.is_main), desc=desc, unit="passage") as bar:
        for start in todo:
            rows = order[start : start + part_size]
            vectors = []
            for b in range(0, len(rows), batch_size):
                batch = [texts[i] for i in rows[b : b + batch_size]]
                vectors.append(encode(batch, loaded, settings, batch_size=batch_size))
                bar.update(len(batch))
            block = np.concatenate(vectors).astype(np.float32, copy=False)  # [rows, D]
            replace_atomically(_part_path(out, start // part_size), lambda f: np.save(f, block))
            encoded += len(rows)
    seconds = time.perf_counter() - t0
    log.info("rank %d of %d: encoded %d passages (%d parts) in %.3f s, %.2f passages/s; %d of its parts were on "
             "disk already", rank.rank, rank.world_size, encoded, len(todo), seconds,
             encoded / seconds if seconds else 0.0, len(mine) - len(todo))


def _sees(rank: distributed.DistInfo, paths: list[Path]) -> None:
    """Refuse to go on when files that other ranks wrote are not there for this one to read."""
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise BertkitError(f"rank {rank.rank} does not see {missing[0]}" + (f" and {len(missing) - 1} more"
                           if len(missing) > 1 else "") + ", which another rank wrote: across machines the index "
                           "folder must be on a filesystem every node shares")


def _part_path(out: Path, number: int) -> Path:
    return out / PARTS / f"part-{number:05d}.npy"


def _tensor_bytes(n: int, dim: int) -> int:
    """The bytes of vectors.safetensors after its header: n float32 rows of `dim`, then "document" [n] and
    "passage_offset" [n + 1] as int64 (`_assemble` takes them on the disk; `_still_to_write` counts them)."""
    return n * dim * 4 + (2 * n + 1) * 8


def _assemble(out: Path, order: list[int], part_size: int, document: np.ndarray, lines: list[bytes]) -> int:
    """Write vectors.safetensors from the parts, rows back in passage order; returns D."""
    n = len(order)
    dim = np.load(_part_path(out, 0), mmap_mode="r").shape[1]
    header = safetensors_header({"vectors": ("F32", (n, dim)), "document": ("I64", (n,)),
                                  "passage_offset": ("I64", (n + 1,))})
    offsets = np.concatenate([[0], np.cumsum([len(line) for line in lines])]).astype(np.int64)

    def write(f):
        f.write(header)
        allocate(f, len(header) + _tensor_bytes(n, dim))  # blocks taken now: a full disk is ENOSPC, not SIGBUS
        vectors = np.memmap(f.name, dtype=np.float32, mode="r+", offset=len(header), shape=(n, dim))
        for start in range(0, n, part_size):
            vectors[order[start : start + part_size]] = np.load(_part_path(out, start // part_size))
        vectors.flush()
        del vectors
        f.seek(len(header) + n * dim * 4)
        f.write(document.astype("<i8").tobytes())
        f.write(offsets.astype("<i8").tobytes())

    replace_atomically(out / VECTORS, write)
    return dim


def build_index(corpus, output, model=None, *, passage_tokens: int | None = None, stride: int | None = None,
                batch_size: int = 32, part_size: int = 1024, device=None, dtype=None, resume: bool = False,
                progress: bool = True, ann: str | None = None, ann_m: int = 32, ef_construction: int = 200,
                ef_search: int = 128, overlap: int | None = None,
                lexical: LexicalOptions | None = LexicalOptions(), dedupe: bool = False,
                overwrite: bool = False, vectors: str = "float32", rescore_with: str | None = None,
                fast=True) -> dict | None:
    """Cut `corpus` into passages, embed them with `model` (None: the default model) and write the
    index folder `output` (see the module docstring); returns index.json's contents.

    Under torchrun every rank calls it and encodes its share of the parts (the module docstring,
    "Past one machine"); rank 0 writes the index and returns index.json's contents, the other
    ranks return None once their parts are written.

    passage_tokens: tokens per passage with [CLS] and [SEP] (default: the model's max length, its
    sentence-transformers max_seq_length); stride: word pieces shared by consecutive passages of a
    document, the overlap (default: half a window; `overlap`, its old name, still works). resume: continue an interrupted build of `output`.
    ann: "hnsw" also builds a FAISS HNSW graph (`bertkit.retrieval.ann`: M `ann_m`, `ef_construction`;
    searched with `ef_search`) and records its leave-one-out recall@10 against exact search.
    lexical: the BM25 part's settings (`bertkit.retrieval.lexical`); None leaves it out (--no-lexical).
    dedupe: keep the first document of a repeated id (else a repeated id is an error). overwrite: replace
    an index (finished or not) already in `output`. The folder is locked while it is written
    (`bertkit.data.lock`): a second build into it is refused at once.
    vectors: "int8" or "binary" stores the vectors' compact codes (`bertkit.retrieval.codes_file`), which the
    exact search scans, rescoring its candidates against the decoded codes, or against the rows of
    rescore_with ("float32": the float rows kept, --keep-float; "int8", binary only: int8 rows), read for
    the candidates only.
    fast: the fast path's settings for the encoder, as `bertkit.runtime.loading.load` takes them.
    """
    _check_options(vectors, rescore_with, batch_size, part_size, (ann, ann_m, ef_construction, ef_search), lexical)
    out = Path(output)
    # one writer per folder (bertkit.data.lock); under torchrun rank 0 holds it for every rank
    lock = folder_lock(out, "bertkit index") if first_process() else contextlib.nullcontext()
    with lock, distributed.process_group(device or "auto") as rank:
        distributed.on_rank_0(rank, lambda: _prepare_folder(out, resume, overwrite))
        # a rank's own device (cuda:LOCAL_RANK on GPUs); alone, the caller's choice as given
        loaded = sentence_encoder(model, rank.device if rank.enabled else device, dtype, fast=fast)
        record = model_record(loaded)
        passage_tokens, stride = _passage_shape(loaded, passage_tokens, overlap if stride is None else stride)
        passages, lengths, empty = cut_all(read_documents(corpus, dedupe), loaded.tokenizer, passage_tokens, stride)
        if not passages:
            raise BertkitError(f"corpus {corpus}: no document has any token (only characters BERT drops)")
        lines = passage_lines(passages)
        plan = {"format": FORMAT, "corpus": str(Path(corpus).resolve()), "model": record,
                "passage_tokens": passage_tokens, "overlap": stride, "part_size": part_size, "batch_size": batch_size,
                "passages": len(passages), "passages_sha256": passages_sha256(lines),
                "ann": ann and {"kind": ann, "m": ann_m, "ef_construction": ef_construction, "ef_search": ef_search},
                "lexical": lexical and dataclasses.asdict(lexical), "vectors": vectors, "rescore_with": rescore_with}
        # only now: a corpus refused above leaves nothing behind; after it, the folder and its plan exist
        distributed.on_rank_0(rank, lambda: _start(out, resume, plan, lines, loaded.config.hidden_size))
        _sees(rank, [out / BUILD_JSON])
        order = sorted(range(len(passages)), key=lambda i: (lengths[i], i))
        settings = EncodingSettings.of(loaded, passage_tokens)
        _encode_parts(out, [p.text for p in passages], order, part_size, loaded, settings, batch_size, progress, rank)
        distributed.barrier(rank)  # every part is on disk
        if not rank.is_main:
            return None
        _sees(rank, [_part_path(out, start // part_size) for start in range(0, len(order), part_size)])
        return _finish(out, plan, passages, order, lines, empty, lexical, progress)


def _passage_shape(loaded: Loaded, passage_tokens, stride) -> tuple:
    """Tokens per passage (None: the model's max length), checked against its positions; the overlap (None: half)."""
    passage_tokens = loaded.max_length if passage_tokens is None else passage_tokens
    if isinstance(passage_tokens, int) and passage_tokens > loaded.max_positions:
        raise BertkitError(f"--passage-tokens {passage_tokens} is more than the model's {loaded.max_positions} positions")
    return passage_tokens, default_stride(passage_tokens) if stride is None and isinstance(passage_tokens, int) else stride


def _check_options(vectors: str, rescore_with: str | None, batch_size, part_size, ann, lexical) -> None:
    """build_index's settings checked before anything is read, a missing optional package included."""
    codes_file.check_choice(vectors, rescore_with)
    for name, value in (("batch size", batch_size), ("part size", part_size)):
        int_at_least(value, 1, f"the {name}", says="at least {least}")
    if ann[0] is not None:  # (kind, M, ef_construction, ef_search)
        check_kind(*ann)
        faiss_module()  # a missing FAISS is refused before the encoding, not after
    if lexical is not None:
        lexical.validate()
        require_packages(lexical)  # as is a missing bm25s or PyStemmer


def _finish(out: Path, plan: dict, passages: list, order: list[int], lines: list[bytes], empty: int, lexical,
            progress: bool) -> dict:
    """Rank 0, its parts on disk: vectors.safetensors, the plan's (BM25, HNSW, codes), index.json last (returned)."""
    numbers = {d: i for i, d in enumerate(dict.fromkeys(p.doc_id for p in passages))}
    document = np.array([numbers[p.doc_id] for p in passages], dtype=np.int64)
    dim = _assemble(out, order, plan["part_size"], document, lines)
    info = {"format": FORMAT, "model": plan["model"], "passage_tokens": plan["passage_tokens"],
            "overlap": plan["overlap"], "passages": len(passages), "documents": len(numbers),
            "documents_without_tokens": empty, "dim": dim,
            "max_passages_per_document": int(np.bincount(document).max()), "corpus": plan["corpus"]}
    if lexical is not None:
        info["lexical"] = build_lexical(out, [p.text for p in passages], lexical, progress=progress)
    if plan["ann"]:
        ann = plan["ann"]
        info["ann"] = build_measured(map_safetensors(out / VECTORS)["vectors"], out / HNSW_FILE, m=ann["m"],
                                     ef_construction=ann["ef_construction"], ef_search=ann["ef_search"],
                                     progress=progress)
    if plan["vectors"] != "float32":  # after the steps that read the float rows, which a codes-only index drops
        info["vectors"] = _store_codes(out, plan["vectors"], plan["rescore_with"])
    write_json(out / INDEX_JSON, info)  # last: from here on the folder is an index
    shutil.rmtree(out / PARTS)
    (out / BUILD_JSON).unlink()
    return info


# --- reading -----------------------------------------------------------------------------------

@dataclass
class Index:
    """An index folder, memory-mapped: vectors [N, D] float32 unit rows (None when it stores only codes),
    document [N], offsets [N+1].

    One build, as it was when opened: the maps, the files held open (passages.jsonl, hnsw.faiss) and the lexical
    part held at open keep the files of that build, so a folder built again meanwhile (`--overwrite`, which
    replaces every file) neither mixes its passages with these vectors nor breaks a server reading them."""

    directory: Path
    info: dict
    vectors: np.ndarray | None
    document: np.ndarray
    passage_offset: np.ndarray
    lexical_part: object = field(default=None, repr=False)  # the bm25s retriever, made when first asked for
    lexical_held: dict = field(default_factory=dict, repr=False)  # its files as opened (lexical.hold_lexical)
    codes: np.ndarray | None = None  # with --vectors int8|binary: [N, D] int8 or [N, D/8] uint8 (compact.py)
    ranges: np.ndarray | None = None  # int8 codes or rows: [2, D] the corpus's per-dimension lowest and highest
    rescore: np.ndarray | None = None  # binary --rescore-with int8: [N, D] int8 rows, read for candidates only
    files: dict = field(default_factory=dict, repr=False)  # name -> its file, opened with the index
    graph_part: object = field(default=None, repr=False)  # the HNSW graph, read when first asked for

    def lexical(self):
        """The BM25 part (`bertkit.retrieval.lexical`), made on first use from what was held at open; refused in
        one line when the index was built without it."""
        if self.lexical_part is None:
            options_of(self.info)
            self.lexical_part = read_lexical(self.lexical_held)
        return self.lexical_part

    def graph(self):
        """The HNSW graph (`bertkit.retrieval.ann`), read on first use from the file opened with the index."""
        if self.graph_part is None:
            self.graph_part = read_hnsw(self.directory / HNSW_FILE, self.files.get(HNSW_FILE), len(self))
        return self.graph_part

    def __len__(self) -> int:
        return len(self.document)

    def float_rows(self, needs: str) -> np.ndarray:
        """The float rows [N, D], or one line saying that `needs` needs them and this index stores codes only."""
        if self.vectors is None:
            kind, stored = codes_file.kind_of(self.info), " and ".join(self.info["vectors"]["stored"])
            raise BertkitError(f"{needs} needs the float vectors, and {self.directory} stores only {stored} codes "
                               f"(built with --vectors {kind}): build it again with --vectors {kind} --keep-float")
        return self.vectors

    def passages(self, rows) -> list[dict]:
        """The passages.jsonl records of `rows`, each line read at its offset (pread: threads may share)."""
        fd = self.files[PASSAGES].fileno()
        return [json.loads(os.pread(fd, int(self.passage_offset[r + 1] - self.passage_offset[r]),
                                    int(self.passage_offset[r]))) for r in rows]


def document_ids(index: Index) -> list[str]:
    """The document ids by document number (`index.document`'s values), read from passages.jsonl."""
    ids: dict[str, None] = {}
    fd, offset, rest = index.files[PASSAGES].fileno(), 0, b""
    while block := os.pread(fd, 1 << 22, offset):  # the held file, a block at a time
        offset += len(block)
        *lines, rest = (rest + block).split(b"\n")
        for line in lines:
            ids.setdefault(json.loads(line)["doc_id"])
    return list(ids)


def update_info(directory, *, command: str | None = None, opened: Index | None = None, **entries) -> None:
    """Set `entries` in index.json, written atomically: "fusion", how hybrid search fuses (`evaluate retrieval
    --tune`: search and serve read it as their default); "ann", "lexical", a part added (`retrieval.extend`).
    command: take the folder's lock for the write, for a caller that does not hold it (read-modify-write: an
    `index add` or a build meanwhile lost its record, or was given this one); opened: refuse when the folder
    was built again since `opened` was (what was measured on that build is not this one's)."""
    path = Path(directory) / INDEX_JSON
    with folder_lock(directory, command) if command else contextlib.nullcontext():
        if opened is not None and os.fstat(opened.files[PASSAGES].fileno()).st_ino != (path.parent / PASSAGES).stat().st_ino:
            raise BertkitError(f"{directory} was built again while this ran: what it measured is of the build before, "
                               "and is not written into the new one; run it again on the new index")
        write_json(path, {**json.loads(path.read_text()), **entries})


def index_info(directory: Path) -> dict:
    """The index.json of the index folder `directory`, read and checked (`read_info`, its format this bertkit's)."""
    if not (directory / INDEX_JSON).is_file():
        raise BertkitError(f"{directory} is not an index (no {INDEX_JSON})"
                           + (": its build was interrupted; finish it with bertkit index ... --resume"
                              if (directory / BUILD_JSON).is_file() else ": build one with bertkit index CORPUS -o INDEX"))
    info = read_info(directory / INDEX_JSON)
    if info.get("format") != FORMAT:
        raise BertkitError(f"{directory} is an index of format {info.get('format')}; this bertkit reads format "
                           f"{FORMAT}: build it again")
    return info


def open_index(directory) -> Index:
    """An index folder written by `build_index`, its tensors memory-mapped, checked first
    (`bertkit.retrieval.index_check`: counts, shapes, whole files, finite vectors)."""
    directory = Path(directory)
    info = index_info(directory)
    kind = codes_file.kind_of(info)
    coded = None if kind == "float32" else (codes_file.CODES, kind, codes_file.codes_tensors(
        kind, info["passages"], info["dim"], codes_file.has_int8_rows(info)))
    # every file's header before mapping: a truncated file is named, not an mmap error
    check_files(directory, info, VECTORS, PASSAGES, codes_file.has_float_rows(info), coded)
    tensors = map_safetensors(directory / VECTORS)
    codes = {} if coded is None else map_safetensors(directory / codes_file.CODES)
    check_values(directory, info, tensors, PASSAGES, codes)
    lexical = check_lexical(directory / LEXICAL_DIR, LEXICAL_FILES) if info.get("lexical") else None  # JSON, read
    index = Index(directory, info, tensors.get("vectors"), tensors["document"], tensors["passage_offset"],
                  codes=codes.get("codes"), ranges=None if "ranges" not in codes else np.asarray(codes["ranges"]),
                  rescore=codes.get("rescore"), files={name: open(directory / name, "rb") for name in
                                                       (PASSAGES, HNSW_FILE) if (directory / name).is_file()},
                  lexical_held=hold_lexical(directory, lexical) if lexical is not None else {})  # no bm25s yet
    return index


def _store_codes(out: Path, kind: str, rescore_with: str | None) -> dict:
    """OUT/codes.safetensors from the float rows (and int8 rows when `rescore_with` is "int8"), which are then
    dropped unless `rescore_with` is "float32" (`bertkit.retrieval.codes_file`); returns index.json's "vectors"."""
    tensors = map_safetensors(out / VECTORS)
    replace_atomically(out / codes_file.CODES, codes_file.codes_writer(tensors["vectors"], kind, rescore_with))
    if rescore_with != "float32":
        replace_atomically(out / VECTORS, codes_file.without_float_writer(tensors["document"],
                                                                           tensors["passage_offset"]))
    return codes_file.record(kind, rescore_with, tensors["vectors"].shape[1])
