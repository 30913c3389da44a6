"""How the tokenizer is made fast, kept apart from what it computes (tokenizer.py).

Three measures, none of which changes an output: the parity tests against the
`tokenizers` library and the property tests run with all of them on.

1. A word cache (`WordCache`). Words repeat (a few thousand make up most of any
   text), and cleaning, lower-casing, accent stripping and the WordPiece search
   cost far more than a dict lookup. So each distinct run of text between safe
   boundaries (see basic_tokenizer.coarse_split_pattern) is analysed once;
   encoding is then one regex scan plus a lookup per run. A run that is one word
   of one piece (the common case) is stored as the bare id. The cache is
   emptied at CACHE_LIMIT distinct runs, to bound memory on endless streams.
2. Worker processes for big batches (`TokenizerWorkers`): encode_batch of 2M+
   characters spreads the texts over up to 8 forked processes (bertkit.text.workers),
   which start with the tokenizer and its warm cache. Each worker takes
   contiguous chunks and returns flat int arrays, far cheaper to pickle than
   lists of Python ints. The pool stays alive for later calls and stops when its
   tokenizer is collected, at exit, or on `Tokenizer.close()`.
3. A paused garbage collector (`gc_paused`): a batch allocates millions of small
   lists that all stay alive; CPython's cyclic collector would rescan them again
   and again, for nothing. None of them can form a cycle.
4. An ids-only batch path (`token_ids`) for callers that need nothing but the ids
   and no special tokens (a static embedding table averages them: sentence-transformers'
   StaticEmbedding, model2vec): no character spans, word ids, padding or Encoding
   objects; its own cache maps a run to the tuple of its ids, so a text is one
   `findall`, one dict lookup per run and one `extend`. It gives `_segment(text).ids`
   (a test checks it on real text).
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import weakref
from array import array
from contextlib import contextmanager

from bertkit.errors import int_at_least
from bertkit.text.workers import can_start_workers, start_pool

CACHE_LIMIT = 2_000_000  # distinct runs kept before the cache is emptied
BIG_BATCH_CHARS = 2_000_000  # below this, forking the workers costs more than they save
MAX_WORKERS = 8


class WordCache(dict):
    """run of text -> an int id (one word, one piece, spanning the run) or (ids, starts, ends, word_ids, n_words).

    Reading is plain `dict.get` (the hot path); `add` analyses a new run.
    """

    def add(self, run: str, analyse):
        ids, starts, ends, wids, n_words = entry = analyse(run)
        if len(ids) == 1 and n_words == 1 and starts[0] == 0 and ends[0] == len(run):
            entry = ids[0]
        if len(self) >= CACHE_LIMIT:
            self.clear()
        self[run] = entry
        return entry


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector for the block (restored as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def choose_num_workers(texts: list[str], num_workers: int | None) -> int:
    """The processes to use: None picks all cores (up to 8) for a big batch, else 1. Inside a daemonic
    process (a DataLoader worker), which may not start any, always 1: the results are the same."""
    if num_workers is None:
        big = sum(len(t) for t in texts) >= BIG_BATCH_CHARS
        return min(os.cpu_count() or 1, MAX_WORKERS) if big and can_start_workers() else 1
    int_at_least(num_workers, 1, "num_workers", says="a positive int")
    return num_workers if can_start_workers() else 1


class TokenizerWorkers:
    """A pool of `n` forked processes that cut texts into segments with one tokenizer."""

    def __init__(self, tokenizer, n: int):
        self.n = n
        self.pool = start_pool(n, initializer=_worker_init, initargs=(tokenizer,))
        # stop the workers when the tokenizer goes away or the interpreter exits
        weakref.finalize(tokenizer, self.pool.terminate)

    def segments(self, texts: list[str]):
        """Yield (ids, starts, ends, word_ids) per text, in order."""
        size = max(1, -(-len(texts) // (self.n * 8)))  # 8 chunks per worker balance uneven texts
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        for lengths, ids, starts, ends, wids in self.pool.map(_worker_segments, chunks):
            ids, starts, ends, wids = ids.tolist(), starts.tolist(), ends.tolist(), wids.tolist()
            pos = 0
            for n in lengths:
                yield ids[pos : pos + n], starts[pos : pos + n], ends[pos : pos + n], wids[pos : pos + n]
                pos += n

    def close(self) -> None:
        self.pool.terminate()


_WORKER_TOKENIZER = None


def _worker_init(tok) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tok


def _worker_segments(texts: list[str]):
    """Segments of texts, packed as flat int arrays."""
    lengths, ids, starts, ends, wids = array("l"), array("l"), array("l"), array("l"), array("l")
    for seg in map(_WORKER_TOKENIZER._segment, texts):
        lengths.append(len(seg.ids))
        ids.extend(seg.ids)
        starts.extend(seg.starts)
        ends.extend(seg.ends)
        wids.extend(seg.word_ids)
    return lengths, ids, starts, ends, wids


class IdsCache(dict):
    """chunk of text -> the tuple of its token ids (path 4); emptied at CACHE_LIMIT chunks."""

    def fill(self, chunks, analyse) -> None:
        """Analyse the chunks not yet cached."""
        for chunk in chunks:
            if chunk not in self:
                if len(self) >= CACHE_LIMIT:
                    self.clear()
                self[chunk] = tuple(analyse(chunk)[0])


# Python's str.split() cuts at these, BERT's cleaner drops them (category Cc), joining their neighbours
_SPLIT_NOT_BERT = re.compile("[\x0b\x0c\x1c-\x1f\x85]")


def token_ids(tok, texts) -> tuple[list[int], list[int]]:
    """The token ids of each text, without special tokens, concatenated, and each text's count:
    (ids [N], lengths [B]), what an EmbeddingBag takes (offsets are the lengths' running sum).

    A text is cut at whitespace by `str.split()` (C code), where its whitespace is BERT's (space,
    tab, newline, CR, Zs, Zl, Zp: every text without the five control characters in _SPLIT_NOT_BERT),
    and each whitespace-separated chunk is looked up whole: a word with its punctuation repeats as
    often as the word. Else the text's runs are found by the tokenizer's pattern (slower: a
    regex over a large character class). A text holding a special token written out ("[MASK]")
    goes the full way (`_segment`), which keeps it whole."""
    findall, cache, special = tok._pattern.findall, tok._ids_cache, tok._special_re
    odd = _SPLIT_NOT_BERT.search
    ids, lengths = [], []
    chain = itertools.chain.from_iterable
    with gc_paused():
        for text in texts:
            if "[" in text and special.search(text):
                seg = tok._segment(text).ids
                ids += seg
                lengths.append(len(seg))
                continue
            chunks = findall(text) if odd(text) else text.split()
            try:
                pieces = [cache[c] for c in chunks]
            except KeyError:
                cache.fill(chunks, tok._analyse)
                pieces = [cache[c] for c in chunks]
            before = len(ids)
            ids += chain(pieces)
            lengths.append(len(ids) - before)
    return ids, lengths
