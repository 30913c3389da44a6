"""Sliding windows over token sequences longer than the model's input.

BERT reads at most 512 positions. google-research/bert `run_squad.py` covers a
longer document with overlapping "doc spans" and, because a token appears in
several spans, scores it only in the span where it has the most context on
both sides (`_check_is_max_context`):

    score(span, p) = min(p - span.start, span.end - 1 - p) + 0.01 * span.length

The small length term breaks ties in favour of longer spans. QA uses this for
answer starts, NER for each word's label.

Windows here have at most `size` tokens and consecutive windows share
`overlap` tokens (the `stride` of the tokenizer and of transformers' run_qa.py;
google's `doc_stride` is the step, size - overlap).
"""

from __future__ import annotations

from bertkit.errors import BertkitError


def spans(n: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[(start, end)) windows covering range(n); the last one ends at n. n == 0 -> one empty span."""
    if size < 1:
        raise BertkitError(f"a window must hold at least one token, got size {size}; raise max_length")
    if not 0 <= overlap < size:
        raise BertkitError(f"the window overlap ({overlap}) must be smaller than the window ({size} tokens); "
                           "lower the stride or raise max_length")
    out, start = [], 0
    while True:
        end = min(start + size, n)
        out.append((start, end))
        if end >= n:
            return out
        start += size - overlap


def max_context_score(span: tuple[int, int], p: int) -> float:
    start, end = span
    return min(p - start, end - 1 - p) + 0.01 * (end - start)


def best_span(windows: list[tuple[int, int]], p: int) -> int:
    """Index of the window in which position p has the most context (the first on ties)."""
    best, best_score = -1, None
    for i, (s, e) in enumerate(windows):
        if s <= p < e:
            score = max_context_score((s, e), p)
            if best_score is None or score > best_score:
                best, best_score = i, score
    if best < 0:
        raise ValueError(f"position {p} lies in no window")  # our invariant: the spans cover everything
    return best
