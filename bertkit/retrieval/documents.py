"""Documents ranked by their best passage (MaxP, Dai & Callan 2019), from passages ranked by score.

An index holds passages; a search answers documents. A document scores its best
passage's score, so ranking documents is ranking passages and keeping each
document's first (`first_per_document`). The best `k x max_passages_per_document`
passages always hold the k best documents (or every document), so one top-k over
passages, `depth` deep, answers exactly (`best_first`, for a full score vector).
"""

from __future__ import annotations

import numpy as np


def first_per_document(ranked: list, document_of, k: int) -> list:
    """The first item of each document in a best-first list, up to k documents: the documents
    ranked by their best passage."""
    seen, kept = set(), []
    for item in ranked:
        doc = document_of(item)
        if doc not in seen:
            seen.add(doc)
            kept.append(item)
            if len(kept) == k:
                break
    return kept


def first_of_each(rows: np.ndarray, document: np.ndarray, k: int) -> np.ndarray:
    """`first_per_document` on arrays: the positions in `rows` (passage rows, best first) of each document's
    first row, in order, up to k documents. One gather and one sort in numpy instead of a Python loop over
    the candidates (a hybrid search looks at 1,500 per query)."""
    _, first = np.unique(document[rows], return_index=True)
    first.sort()
    return first[:k]


def best_first(scores: np.ndarray, depth: int, document: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """The rows of the best passages of the k best documents by `scores` [N] (passages scoring 0 or less
    left out) and their scores, best first; equal scores in row order. document [N]: each row's document."""
    rows = np.flatnonzero(scores > 0)
    if len(rows) > depth:  # every row tied with the depth-th best is kept, so ties are cut the same way
        threshold = np.partition(scores[rows], len(rows) - depth)[len(rows) - depth]
        rows = rows[scores[rows] >= threshold]
    rows = rows[np.lexsort((rows, -scores[rows]))]
    kept = rows[first_of_each(rows, document, k)]
    return kept.tolist(), scores[kept].tolist()
