"""Compact vectors: int8 and binary codes of unit vectors, searched with rescoring.

References: sentence-transformers' `quantize_embeddings` (int8 with per-dimension
ranges calibrated on the corpus; binary as sign bits) and its `semantic_search_*`
rescoring, Qdrant's binary quantization + rescore.

- int8 [N, D]: dimension d's corpus range [lo_d, hi_d] is cut into 255 steps of
  (hi - lo) / 255, code = clip(floor((x - lo) / step), 0, 255) - 128, exactly
  sentence-transformers' `quantize_embeddings(..., "int8", ranges=)`. 1/4 of float32's bytes.
- binary [N, D/8] (uint8): the sign bits of each vector, packed (`np.packbits`),
  compared by Hamming distance (popcount of XOR). 1/32 of float32's bytes.

Search (`compact_top_k`): the codes give candidates, the float query rescores
them. The query is coded the same way (int8 with the corpus ranges; its sign
bits); the best `k x oversampling` rows by the code's score (int8: the integer
dot product; binary: fewest differing bits) are rescored as the float query's
dot product with each candidate's decoded vector (int8: the middle of its step,
lo + (code + 128.5) x step; binary: -1 / +1 per bit), and the best k of those are returned.
Blocked over the rows, so memory stays about `block x D` whatever N.

Rescoring rows (`rescore_rows=`): other rows of the same passages that the candidates are
rescored against instead of the decoded codes, read for the candidates only (a memory map:
k x oversampling rows per query). float32: the original vectors, Qdrant's binary quantization
with `rescore` (its original vectors on disk); int8 codes: sentence-transformers' published
pipeline (the "Embedding Quantization" post and its demo: a binary index searched in memory,
the candidates rescored with the float query against int8 embeddings kept on disk).

Shapes: queries [Q, D] float32 unit rows; codes [N, D] int8 or [N, D/8] uint8;
ranges [2, D] float32 (lo, hi).
"""

from __future__ import annotations

import numpy as np

from bertkit.errors import BertkitError
from bertkit.retrieval.exact import above

KINDS = ("float32", "int8", "binary")
DEFAULT_OVERSAMPLING = 4  # sentence-transformers' rescore_multiplier default
# int8 codes are widened for BLAS a few rows at a time: a widened tile of about this size stays in the
# CPU's cache for the product (a whole block of 16,384 rows widened at once made one query wait on memory)
INT8_TILE_BYTES = 6 << 20


def int8_ranges(vectors: np.ndarray, block: int = 65536) -> np.ndarray:
    """[2, D] the per-dimension lowest and highest value of the corpus (read a block at a time)."""
    lo = np.full(vectors.shape[1], np.inf, np.float32)
    hi = np.full(vectors.shape[1], -np.inf, np.float32)
    for start in range(0, len(vectors), block):
        part = np.asarray(vectors[start : start + block], np.float32)
        lo, hi = np.minimum(lo, part.min(0)), np.maximum(hi, part.max(0))
    return np.stack([lo, hi])


def encode(vectors: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """The codes of `vectors` [N, D] (see the module docstring)."""
    if kind == "binary":
        return np.packbits(np.asarray(vectors) > 0, axis=1)
    if kind == "int8":
        steps = (np.asarray(vectors, np.float32) - ranges[0]) / _step(ranges)
        return (np.clip(np.floor(steps), 0, 255) - 128).astype(np.int8)
    raise BertkitError(f"unknown vector kind {kind!r}: choose one of {', '.join(KINDS)}")


def decode(codes: np.ndarray, kind: str, ranges: np.ndarray | None, dim: int) -> np.ndarray:
    """Float vectors [N, D] the codes stand for (int8: the step's value; binary: -1 or +1)."""
    if kind == "binary":
        return np.unpackbits(codes, axis=1, count=dim).astype(np.float32) * 2 - 1
    return ranges[0] + (codes.astype(np.float32) + 128.5) * _step(ranges)


def _step(ranges: np.ndarray) -> np.ndarray:
    """[D] the width of one int8 step per dimension (1 where the corpus range is empty)."""
    step = (ranges[1] - ranges[0]) / 255
    return np.where(step == 0, 1, step).astype(np.float32)


def _code_scores(query_codes: np.ndarray, block: np.ndarray, kind: str) -> np.ndarray:
    """[Q, B] int64, higher is better: the integer dot product, or minus the Hamming distance.

    int8: the product is taken in float32 through BLAS, where it is exact: |sum| <= D x 128 x 128 < 2^24
    for D < 1024, float32's exact integers (numpy's integer matrix product has no BLAS kernel; wider
    vectors take it). binary: `_hamming`."""
    if kind == "int8":
        exact_in = np.float32 if query_codes.shape[1] * 128 * 128 < 1 << 24 else np.int64
        query, out = query_codes.astype(exact_in), np.empty((len(query_codes), len(block)), np.int64)
        rows = max(1, INT8_TILE_BYTES // (block.shape[1] * 4))
        for start in range(0, len(block), rows):  # the wide copy of a few rows stays in the cache for the product
            out[:, start : start + rows] = query @ block[start : start + rows].astype(exact_in).T
        return out
    return -_hamming(query_codes, block)


def _hamming(query_codes: np.ndarray, block: np.ndarray) -> np.ndarray:
    """[Q, B] int64: the bits in which each query's code differs from each row's (popcount of XOR).

    The block is turned word-major first ([W, B]: word w of every row, contiguous; 64-bit words when a row's
    bytes allow), so each query is W long vector operations (XOR with one word, `np.bitwise_count`, add into a
    uint16 count) over buffers reused across the queries, instead of an XOR tile [B, W] and a sum along its
    short rows, which numpy does slowly."""
    if block.shape[1] % 8 == 0:  # 8 bytes at a time: 8 times fewer XORs and popcounts
        query_codes, block = query_codes.view(np.uint64), np.ascontiguousarray(block).view(np.uint64)
    words = np.ascontiguousarray(block.T)
    out = np.empty((len(query_codes), len(block)), np.int64)
    xor, bits = np.empty(len(block), words.dtype), np.empty(len(block), np.uint8)
    count = np.empty(len(block), np.uint16)
    for i, query in enumerate(query_codes):
        count[:] = 0  # D < 65,536 bits: a uint16 holds any distance
        for word, q in zip(words, query):
            np.bitwise_count(np.bitwise_xor(word, q, out=xor), out=bits)
            count += bits
        out[i] = count
    return out


def _keep_best(keys: np.ndarray, rows: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The `depth` largest keys of each row of `keys` [Q, C] (unordered) and their `rows`."""
    if keys.shape[1] <= depth:
        return keys, rows
    keep = np.argpartition(keys, keys.shape[1] - depth, axis=1)[:, -depth:]
    return np.take_along_axis(keys, keep, 1), np.take_along_axis(rows, keep, 1)


def _candidates(query_codes: np.ndarray, codes: np.ndarray, kind: str, depth: int, block_size: int) -> np.ndarray:
    """[Q, depth] the rows of the best code scores, a block of `block_size` rows at a time. Equal scores go to
    the lower row (the key is score x 2^32 - row: unique), so the candidates do not depend on the block size."""
    best_keys = np.empty((len(query_codes), 0), np.int64)
    best_rows = np.empty((len(query_codes), 0), np.int64)
    for start in range(0, len(codes), block_size):
        block = np.asarray(codes[start : start + block_size])
        rows = np.arange(start, start + len(block), dtype=np.int64)
        keys = (_code_scores(query_codes, block, kind) << 32) - rows
        if best_keys.shape[1] == depth:  # full: only keys above a query's worst kept one can enter
            keys, found = above(keys, rows, best_keys.min(1), np.iinfo(np.int64).min)  # few, past the first blocks
        else:
            keys, found = _keep_best(keys, np.broadcast_to(rows, keys.shape), depth)  # the block's best, then a merge
        best_keys, best_rows = _keep_best(np.concatenate([best_keys, keys], 1), np.concatenate([best_rows, found], 1),
                                          depth)
    return best_rows


def compact_top_k(queries: np.ndarray, codes: np.ndarray, kind: str, k: int, *, ranges: np.ndarray | None = None,
                  oversampling: int = DEFAULT_OVERSAMPLING, block_size: int = 16384,
                  rescore_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], rows [Q, k]) best first: candidates by the codes, rescored with the float queries.
    rescore_rows: [N, D] float32 vectors or int8 codes (decoded with `ranges`) to rescore the candidates against
    instead of the decoded `codes` (see the module docstring); only the candidates' rows are read."""
    if kind not in ("int8", "binary"):
        raise BertkitError(f"compact search needs int8 or binary codes, not {kind!r}")
    if oversampling < 1:
        raise BertkitError(f"oversampling must be at least 1, got {oversampling}")
    queries = np.asarray(queries, np.float32)
    dim = queries.shape[1]
    best_rows = _candidates(encode(queries, kind, ranges), codes, kind, min(len(codes), k * oversampling), block_size)
    out_scores, out_rows = [], []
    for q, rows in zip(queries, best_rows):  # rescoring: the float query against the candidates' vectors
        ordered = np.sort(rows)  # ascending rows: a forward walk through the memory map
        rescored = _candidate_vectors(codes, kind, ranges, dim, ordered, rescore_rows) @ q
        order = np.argsort(-rescored, kind="stable")[:k]
        out_scores.append(rescored[order])
        out_rows.append(ordered[order])
    return np.stack(out_scores), np.stack(out_rows)


def _candidate_vectors(codes, kind: str, ranges, dim: int, rows: np.ndarray, rescore_rows) -> np.ndarray:
    """[C, D] float32: the decoded codes of `rows`, or their rescoring rows (int8 ones decoded)."""
    if rescore_rows is None:
        return decode(np.asarray(codes[rows]), kind, ranges, dim)
    found = np.asarray(rescore_rows[rows])
    return decode(found, "int8", ranges, dim) if found.dtype == np.int8 else found.astype(np.float32, copy=False)
