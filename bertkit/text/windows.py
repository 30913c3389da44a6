"""Sliding windows over a token sequence longer than the model's input, and max context.

BERT reads at most 512 positions. google-research/bert `run_squad.py` covers a
longer document with overlapping "doc spans"; a token then sits in several
windows, and it is read (scored, labelled, embedded) only in the window where it
has the most context on both sides (`_check_is_max_context`):

    score(window, p) = min(p - start, end - 1 - p) + 0.01 * (end - start)

The small length term breaks ties in favour of longer windows; on equal scores
the earlier window wins. Everything in bertkit that windows a sequence uses
this module: the tokenizer's overflow (`Tokenizer.encode(stride=,
return_overflowing=True)`, hence long texts in classification), NER's long
sentences, QA's contexts and `embed`'s long texts.

`stride` means the OVERLAP everywhere: the number of tokens that consecutive
windows share, as in Hugging Face tokenizers' and transformers' run_qa.py
`stride`. Consecutive windows therefore start `size - stride` tokens apart
(google's run_squad.py `doc_stride` is that step instead). The last window
ends at the last token, so it may be shorter than `size`.

Windows are half-open (start, end) spans of positions; n = 0 gives one empty
window, so every sequence has at least one. `shape` decides a text's window once,
before any text is read: its length, the overlap, and whether a longer text is
truncated instead. `read_tokens` counts what the windows hold from n alone (a server's request limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from bertkit.errors import BertkitError


def spans(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """[(start, end)) windows of at most `size` positions covering range(n), sharing `stride`.

    spans(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]: windows of 4 that repeat one
    token of the previous window.
    """
    _check(size, stride)
    out, start = [], 0
    while True:
        end = min(start + size, n)
        out.append((start, end))
        if end >= n:
            return out
        start += size - stride


def _check(size: int, stride: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise BertkitError(f"a window must hold at least one token, got {size!r} tokens; raise max_length")
    if isinstance(stride, bool) or not isinstance(stride, int) or not 0 <= stride < size:
        raise BertkitError(
            f"stride={stride} must be smaller than the {size} tokens of a window and not negative (stride is the "
            "overlap of consecutive windows; a window holds max_length minus the special tokens and any other "
            "text); lower the stride or raise max_length"
        )


def read_tokens(n: int, size: int, stride: int, extra: int = 0) -> int:
    """The tokens the windows of `spans(n, size, stride)` hold together, `extra` more in each (its [CLS] and
    [SEP], a QA question): what a model reads of a windowed sequence, counted without making the windows.

    Every window but the last is `size` long and shares `stride` tokens with the next, so W windows hold
    n + (W - 1) * stride positions; W = 1 + ceil((n - size) / (size - stride)) once n passes size.
    read_tokens(10, 4, 1, 2) == 4 + 4 + 4 + 3 * 2 == 18."""
    _check(size, stride)
    count = 1 if n <= size else 1 + -(-(n - size) // (size - stride))
    return n + (count - 1) * stride + count * extra


def half_window(size: int) -> int:
    """The default overlap: windows advance by half a window (size // 2), sharing the rest."""
    return size - max(1, size // 2)


@dataclass(frozen=True)
class Shape:
    """How texts are cut for an encoder: the window length (special tokens included), the overlap,
    and whether a longer text is truncated instead of windowed."""

    max_length: int
    stride: int
    truncate: bool


def shape(positions: int, preset: int | None = None, max_length: int | None = None, stride: int | None = None,
          truncate: bool | None = None) -> Shape:
    """The window for a model of `positions` positions. `preset`: the length its texts are made
    at when none is asked (a sentence embedding model's max_seq_length), where a longer text is
    truncated unless asked otherwise; without one, windows span the positions. Explicit arguments
    win; a bad length or stride is refused here, before any text is read."""
    from_preset = max_length is None and bool(preset)
    length = min(preset, positions) if from_preset else (positions if max_length is None else max_length)
    if isinstance(length, bool) or not isinstance(length, int) or not 3 <= length <= positions:
        raise BertkitError(f"max_length {length!r} must be an int between 3 and the model's {positions} positions")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int)):
        raise BertkitError(f"stride must be an int (the tokens consecutive windows share), got {stride!r}")
    stride = half_window(length - 2) if stride is None else stride
    spans(0, length - 2, stride)
    return Shape(length, stride, from_preset if truncate is None else bool(truncate))


def max_context_score(span: tuple[int, int], p: int) -> float:
    """run_squad.py's score of position p in a window: context on the poorer side + 0.01 * length."""
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


def max_context_owner(windows: list[tuple[int, int]], n: int) -> list[int]:
    """For each position 0..n-1, the index of its max-context window (`best_span` of every position).

    `windows` as `spans` makes them (starts and ends increasing), so only the
    few windows around a position are scored: linear in n, not n x windows.
    """
    owner, first = [], 0
    for p in range(n):
        while windows[first][1] <= p:  # this window ends before p, and so do all earlier ones
            first += 1
        best, best_score = first, max_context_score(windows[first], p)
        k = first + 1
        while k < len(windows) and windows[k][0] <= p:
            score = max_context_score(windows[k], p)
            if score > best_score:
                best, best_score = k, score
            k += 1
        owner.append(best)
    return owner
