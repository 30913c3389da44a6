"""Token shards: the corpus tokenised once into compact numpy files on disk.

Tokenising is the slow part of preparing data (pure-Python WordPiece over every
byte of the corpus; docs/benchmarks.md has its rate), so it happens once, file by
file in worker processes (both cores), and everything after it reads
memory-mapped arrays instead of text.

One shard per input file, a folder `tokens/NNNNN/` holding:

    tokens.npy      [N]    uint16 (int32 for vocabularies over 65,536 ids): all ids, sentence after sentence
    sentences.npy   [S]    int64  tokens per sentence
    documents.npy   [D]    int64  sentences per document
    stats.json             CorpusStats of this file (counts, skips) and the file's identity

Then `consolidate` concatenates the shards into one corpus (streaming, flat
memory) with global offsets, which the instance builder indexes:

    corpus/tokens.npy     [N]     the ids
    corpus/sentences.npy  [S+1]   int64 token offset of each sentence start (last = N)
    corpus/documents.npy  [D+1]   int64 sentence index of each document start (last = S)

Crash safety: every shard and the corpus are written into NAME.tmp/ and renamed
into place (`bertkit.data.atomic.write_folder`: atomic on one file system), so a
folder that exists is complete, and a write the disk refused names its file; a
re-run skips the shards that exist for the same input (path, size, mtime),
settings and tokenizer (`tokenizer_identity`), and the output is byte-identical
whatever the number of workers or interruptions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from array import array
from pathlib import Path

import numpy as np

from bertkit.data.atomic import refused, room_for, write_folder
from bertkit.data.corpus import CorpusStats, iter_documents
from bertkit.data.vector_files import npy_header

SHARD_FILES = ("tokens.npy", "sentences.npy", "documents.npy", "stats.json")


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


def file_identity(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def save_npy(path: Path, array: np.ndarray) -> None:
    """np.save(path, array), byte for byte, its data written by Python: numpy writes a file's data with C's
    fwrite, and a write the disk refused reached the user as "16896 requested and 8128 written", no cause;
    Python's write raises the errno (ENOSPC: the disk is full; EFBIG: a file-size limit), named `path` here."""
    array = np.ascontiguousarray(array)
    try:
        with open(path, "wb") as f:
            npy_header(f, array.dtype, array.shape)
            f.write(array.data)
    except OSError as err:  # a refused write names no file
        raise refused(err, path) from None


def write_shard(folder: Path, arrays: dict, files: dict) -> None:
    """A shard folder, whole or absent (`bertkit.data.atomic.write_folder`): each array of `arrays` as NAME.npy
    (`save_npy`), then each text of `files` (name -> text: its JSON record, written last)."""
    with write_folder(folder) as tmp:
        for name, array in arrays.items():
            save_npy(tmp / f"{name}.npy", array)
        for name, text in files.items():
            (tmp / name).write_text(text)


def shard_is_complete(shard: Path, identity: dict, settings: dict) -> bool:
    try:
        meta = json.loads((shard / "stats.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("input") == identity and meta.get("settings") == settings and all(
        (shard / f).is_file() for f in SHARD_FILES
    )


def tokenizer_identity(tokenizer) -> str:
    """A hash of what decides a shard's ids: the vocabulary, token by token, the tokenizer's settings and how
    special tokens written in the text are read. A shard is reused only under the same identity: with the
    vocabulary's size alone, `prepare --vocab B --overwrite` over data prepared with a vocabulary A of the same
    size kept A's ids beside B's vocab.txt (a model trained on it read every id as another token), and so
    did an interrupted prepare continued with another vocabulary or casing."""
    what = {"tokens": tokenizer.ids_to_tokens, "lowercase": tokenizer.lowercase,
            "strip_accents": tokenizer.strip_accents, "tokenize_chinese_chars": tokenizer.tokenize_chinese_chars,
            "max_input_chars_per_word": tokenizer.max_input_chars_per_word, "special_tokens_in_text": "text"}
    return hashlib.sha256(json.dumps(what, ensure_ascii=False).encode()).hexdigest()


def tokenize_file(path: Path, shard: Path, tokenizer, settings: dict) -> CorpusStats:
    """Tokenise one input file into the shard folder `shard` (see the module docstring).

    settings: {"documents": ..., "sentences": ..., "encoding": ...} (the corpus modes), kept in
    stats.json so that a re-run with other settings does not reuse the shard.
    """
    stats = CorpusStats()
    ids_buf = array("i")
    sent_lens = array("q")
    doc_lens = array("q")
    to_ids, tokenize = tokenizer.convert_tokens_to_ids, tokenizer.tokenize
    documents = iter_documents(path, stats, settings["documents"], settings["sentences"], settings["encoding"],
                               settings.get("encoding_errors", "strict"))
    for doc in documents:
        n_sent = 0
        for sentence in doc:
            # "[MASK]" or "[SEP]" written in the corpus (a text about BERT) is text, as create_pretraining_data
            # reads it: as the special token it was a separator inside a segment, or a mask with nothing to predict
            ids = to_ids(tokenize(sentence, split_special_tokens=True))
            if not ids:
                stats.skip("empty_sentences")
                continue
            ids_buf.extend(ids)
            sent_lens.append(len(ids))
            n_sent += 1
        if n_sent:
            doc_lens.append(n_sent)
        else:
            stats.skip("empty_documents")
    stats.documents, stats.sentences, stats.tokens = len(doc_lens), len(sent_lens), len(ids_buf)
    arrays = {"tokens": np.frombuffer(ids_buf, dtype=np.int32).astype(token_dtype(len(tokenizer))),
              "sentences": np.frombuffer(sent_lens, dtype=np.int64),
              "documents": np.frombuffer(doc_lens, dtype=np.int64)}
    meta = {"input": file_identity(path), "settings": settings, "stats": stats.to_dict()}
    write_shard(shard, arrays, {"stats.json": json.dumps(meta, indent=1)})
    return stats


def read_shard_stats(shard: Path) -> CorpusStats:
    return CorpusStats.from_dict(json.loads((shard / "stats.json").read_text())["stats"])


def consolidate(shards: list, out: Path, vocab_size: int, fingerprint: dict | None = None) -> dict:
    """Concatenate shards into out/ (tokens, global sentence and document offsets); returns counts.
    `fingerprint` (what the corpus was made from) goes in as fingerprint.json, published with the rest."""
    counts = {"tokens": 0, "sentences": 0, "documents": 0}
    for shard in shards:
        st = read_shard_stats(shard)
        counts["tokens"] += st.tokens
        counts["sentences"] += st.sentences
        counts["documents"] += st.documents
    dtype = token_dtype(vocab_size)
    # its size is certain from the shards' counts: a disk without room for it is refused before the copy
    room_for(out.parent, counts["tokens"] * np.dtype(dtype).itemsize + (counts["sentences"] + counts["documents"] + 2)
             * 8, "the consolidated corpus's tokens and offsets")
    with write_folder(out) as tmp:
        # written front to back, not into memory maps of sparse files (open_memmap): a write into such a map that
        # the disk has no block for is SIGBUS, and the process died with "Bus error" (no message, its lock and this
        # folder left); a file's write says ENOSPC, an error the command reports
        with contextlib.ExitStack() as files:
            tokens, sentences, documents = (files.enter_context(open(tmp / name, "wb")) for name in SHARD_FILES[:3])
            for f, kind, n in ((tokens, dtype, counts["tokens"]), (sentences, np.int64, counts["sentences"] + 1),
                               (documents, np.int64, counts["documents"] + 1)):
                npy_header(f, kind, (n,))
            sentences.write(np.zeros(1, np.int64).tobytes())  # the first offsets, 0
            documents.write(np.zeros(1, np.int64).tobytes())
            t = s = 0
            for shard in shards:
                tk = np.load(shard / "tokens.npy", mmap_mode="r")
                sl = np.load(shard / "sentences.npy")
                dl = np.load(shard / "documents.npy")
                for start in range(0, len(tk), 1 << 24):  # a shard's tokens a block at a time: memory stays flat
                    tokens.write(np.ascontiguousarray(tk[start:start + (1 << 24)], dtype=dtype).tobytes())
                sentences.write((t + np.cumsum(sl)).astype(np.int64).tobytes())
                documents.write((s + np.cumsum(dl)).astype(np.int64).tobytes())
                t, s = t + len(tk), s + len(sl)
        (tmp / "corpus.json").write_text(json.dumps(counts))
        if fingerprint is not None:
            (tmp / "fingerprint.json").write_text(json.dumps(fingerprint))
    return counts


def room_for_instances(folder, rows: int, max_seq_length: int, vocab_size: int, predictions: int) -> None:
    """Refuse (`room_for`) `rows` training instances that the disk under `folder` certainly cannot hold, as
    `bertkit.pretraining.blocks.write_block` writes them: T ids each (input_ids), its length, type_a and label (5
    bytes), spans, sources and documents (72), and with static masking `predictions` positions and ids (6 each)."""
    row = max_seq_length * np.dtype(token_dtype(vocab_size)).itemsize + 77 + 6 * predictions
    room_for(folder, rows * row, "the training instances")


def load_corpus(folder: Path):
    """(tokens, sent_offsets, doc_offsets) of a consolidated corpus, memory-mapped."""
    folder = Path(folder)
    return (
        np.load(folder / "tokens.npy", mmap_mode="r"),
        np.load(folder / "sentences.npy", mmap_mode="r"),
        np.load(folder / "documents.npy", mmap_mode="r"),
    )
