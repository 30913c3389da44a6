"""Exact cosine top-k: every query scored against every vector, in blocks of bounded memory.

Given queries [Q, D] and a corpus of vectors [N, D] (a numpy array, or a
`np.memmap` of a file larger than RAM allows as one matrix), `top_k` returns, for
each query, the k vectors of highest cosine similarity, best first:

    scores  [Q, k] float32   cosine similarities
    indices [Q, k] int64     rows of `vectors`

It is the brute force of sentence-transformers' `semantic_search` and of FAISS's
`IndexFlatIP`, done as blocked matrix products: the corpus is read `block_size`
rows at a time (a memory map pages in only that block), each block is normalised
on the fly and multiplied with a block of queries, and a running top-k per query
is merged with the block's best k (taken from the score tile alone: the merge is of
2k columns; once k are kept, of the block's scores above the k-th kept: `above`). Peak
memory is about

    query_block x block_size x 13 bytes (the score tile, argpartition's int64 output, the tie
    check's booleans) + block_size x D x 4 (the block, when it has to be normalised)

whatever N is. Equal scores are ordered by row, lowest first, so the answer does
not depend on the block size.
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import BertkitError


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)  # a zero vector scores 0 against everything, not NaN


def above(scores: np.ndarray, ids: np.ndarray, floor: np.ndarray, lowest) -> tuple[np.ndarray, np.ndarray]:
    """The entries of `scores` [R, C] above each row's `floor` [R] and their `ids` [C], packed to the left of
    [R, M] (M: the most any row has; the rest padded with `lowest`, a score no real one is below, and id 0)."""
    row, column = np.nonzero(scores > floor[:, None])
    counts = np.bincount(row, minlength=len(scores))
    place = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)  # each one's place in its row
    packed = np.full((len(scores), int(counts.max(initial=0))), lowest, scores.dtype)
    found = np.zeros(packed.shape, np.int64)
    packed[row, place], found[row, place] = scores[row, column], ids[column]
    return packed, found


def _best(scores: np.ndarray, indices: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best columns of each row, by score descending then index ascending. [R, C] -> [R, k]."""
    if scores.shape[1] > k:
        cut = scores.shape[1] - k
        keep = np.argpartition(scores, cut, axis=1)[:, cut:]  # the k largest, unordered (no negated copy)
        # argpartition cuts a tie at the k-th score anywhere; where one straddles the cut,
        # rank those rows fully so the lowest indices win
        kth = np.take_along_axis(scores, keep, axis=1).min(axis=1, keepdims=True)
        straddle = np.nonzero((scores >= kth).sum(axis=1) > k)[0]
        if len(straddle):
            keep[straddle] = np.lexsort((indices[straddle], -scores[straddle]))[:, :k]
        scores, indices = np.take_along_axis(scores, keep, axis=1), np.take_along_axis(indices, keep, axis=1)
    order = np.lexsort((indices, -scores))
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)


def top_k(queries, vectors, k: int = 10, *, block_size: int = 16384, query_block: int = 1024,
          normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Cosine top-k of each query row among `vectors`' rows (see the module docstring).

    normalized=True skips normalising the corpus blocks (its rows are already unit
    length, as bertkit writes them), so scores are plain dot products.
    """
    queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
    if vectors.ndim != 2 or queries.shape[1] != vectors.shape[1]:
        raise BertkitError(f"queries have {queries.shape[1]} dimensions but the vectors are shaped "
                           f"{tuple(vectors.shape)}: embed both with the same model")
    n = vectors.shape[0]
    if n == 0:
        raise BertkitError("no vectors to search")
    if k < 1:
        raise BertkitError(f"k must be at least 1, got {k}")
    if block_size < 1 or query_block < 1:
        raise BertkitError("block_size and query_block must be at least 1")
    k = min(k, n)
    queries = _unit_rows(queries)
    all_scores = np.empty((len(queries), k), dtype=np.float32)
    all_indices = np.empty((len(queries), k), dtype=np.int64)
    for q0 in range(0, len(queries), query_block):
        q = queries[q0 : q0 + query_block]  # [Qb, D]
        best_s = np.empty((len(q), 0), dtype=np.float32)
        best_i = np.empty((len(q), 0), dtype=np.int64)
        for start in range(0, n, block_size):
            block = np.asarray(vectors[start : start + block_size], dtype=np.float32)  # [B, D], paged in
            if not normalized:
                block = _unit_rows(block)
            tile = q @ block.T  # [Qb, B]
            rows = np.arange(start, start + len(block), dtype=np.int64)
            if best_s.shape[1] == k:  # full: only a score above a query's k-th can enter (an equal one has
                # a higher row, so it loses the tie); past the first blocks few do, and the merge is small
                tile_s, tile_i = above(tile, rows, best_s[:, -1], -np.inf)
            else:  # the block's own k best first, then a merge of 2k columns: the top k of a union is the
                # top k of the parts' top k, and the whole tile is neither copied nor given int64 ids
                tile_s, tile_i = _best(tile, np.broadcast_to(rows, tile.shape), k)  # [Qb, k]
            best_s, best_i = _best(np.concatenate([best_s, tile_s], axis=1),
                                   np.concatenate([best_i, tile_i], axis=1), k)
        all_scores[q0 : q0 + len(q)], all_indices[q0 : q0 + len(q)] = best_s, best_i
    return all_scores, all_indices
