"""The encoder's inputs: texts as the rows one forward pass takes, and long texts put back together.

For feature extraction (`bertkit.embeddings.features`): each text (or pre-split word list, or pair)
becomes its ids with [CLS]/[SEP] (`encode_chunk`), and, where word vectors are asked for, the input word
each token belongs to (a word of a string as BERT's BasicTokenizer splits it, the tokenizer's `word_ids`:
whitespace, each punctuation character and each CJK ideograph apart, as `transformers`' word_ids(); an item of
a pre-split list; [CLS], [SEP] and a pair's second segment belong to none). A string cut at max_length has
the words read. A text longer than the window is cut into overlapping windows
(`bertkit.text.windows`: `stride` tokens shared, each token owned by the window where it has the most
context, `run_squad.py`'s rule); `rows_of` makes a text's rows, `stitch` puts each token's vector back from its
owning window: [CLS] from the first window, [SEP] from the last, so a text that fits gives the one-pass result.
Where a text is cut instead of windowed is `window_cut`'s choice.

A text refused here (blank, no tokens, a word list that is not one) is named by `where(i)`: file:line from
the command line, texts[i] from `bertkit.embed`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import torch

from bertkit.errors import BertkitError, no_tokens
from bertkit.text.windows import max_context_owner, shape, spans


@dataclass
class _Piece:
    """One forward-pass row: a whole text, or one window of a long text."""

    item: int  # index of the text in its chunk
    window: int  # index of the window within the text (0 for a short text)
    input_ids: list
    token_type_ids: list


@dataclass
class _Item:
    """A text as the model sees it, before windowing."""

    text: str
    pair: str | None
    ids: list  # full id sequence with specials, possibly longer than max_length
    type_ids: list
    token_words: list  # per token: input word index or None
    n_words: int
    windows: list | None = None  # (start, end) windows over the content tokens, None when it fits
    owners: list | None = None  # per content token: the window it has the most context in
    cut: bool = False  # truncated at max_length: tokens past it unread


def _word_spans(words: Sequence[str]) -> tuple:
    """Join pre-split words with single spaces; return the text and each word's char span."""
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def _token_words(offsets, sequence_ids, spans) -> list:
    """Map each token of the first segment to the pre-split word whose char span holds its first char."""
    starts = [a for a, _ in spans]
    out = []
    for (start, end), seq in zip(offsets, sequence_ids):
        k = bisect.bisect_right(starts, start) - 1
        inside = seq == 0 and end > start and k >= 0 and start < spans[k][1]
        out.append(k if inside else None)
    return out


def encode_chunk(tok, chunk: list, max_length: int, truncate: bool, words: bool, where=None, start: int = 0) -> list:
    """The chunk's (text, pair) items as the model sees them. Plain single texts whose words are not
    asked for (every sentence vector) take the tokenizer's ids-only batch path (`Tokenizer.single_ids`:
    the ids `encode` gives, without the offsets that only word vectors read); the rest `_encode`.
    where(start + k) names the chunk's k-th text in an error about it (None: the text alone names it)."""
    where = (lambda k: None) if where is None else (lambda k, named=where: named(start + k))
    if words or not hasattr(tok, "single_ids") or any(p is not None or not isinstance(t, str) for t, p in chunk):
        return [_encode(tok, text, pair, max_length, truncate, where, k) for k, (text, pair) in enumerate(chunk)]
    texts = [text for text, _ in chunk]
    for k, text in enumerate(texts):
        _check_text(text, where, k)
    items = []
    for k, (text, (ids, cut)) in enumerate(zip(texts, tok.single_ids(texts, max_length if truncate else None,
                                                                      with_cut=True))):
        _check_tokens(text, ids, where, k)
        items.append(_Item(text, None, ids, [0] * len(ids), [], 0, cut=cut))
    return items


def _named(where, k: int) -> str:
    # asked for an error only: a file's reader finds the line by reading the file again (`bertkit embed` asked
    # for every text, and took time quadratic in the file's lines)
    return f"{named}: " if (named := where(k)) else ""


def _check_text(text: str, where, k: int) -> None:
    if not text.strip():
        raise BertkitError(f"{_named(where, k)}cannot embed an empty text: every input needs at least one non-space "
                           "character")


def _check_tokens(text: str, ids: list, where, k: int) -> None:
    """Refuse a text whose ids are only [CLS] and [SEP] (where(k) names it)."""
    if len(ids) <= 2:
        raise no_tokens(text, where(k))


def _encode(tok, text, pair, max_length: int, truncate: bool, where=lambda k: None, k: int = 0) -> _Item:
    if isinstance(text, list):  # a tuple is no pre-split text: `embed` refuses it as a pair
        if not all(isinstance(w, str) for w in text):
            raise BertkitError(f"{_named(where, k)}a pre-split text must be a list of strings (words)")
        text, words = _word_spans(text)
    elif isinstance(text, str):
        words = None
    else:
        raise BertkitError(f"{_named(where, k)}expected a string (or a list of words), got {type(text).__name__}")
    _check_text(text, where, k)
    if pair is not None and not str(pair).strip():
        raise BertkitError(f"{_named(where, k)}the second segment (pair) is empty: drop it or give it some text")
    # without truncation the tokenizer returns the whole text, however long; _pieces windows it
    enc = tok.encode(text, pair, max_length=max_length, truncation=truncate)
    _check_tokens(text, enc.input_ids, where, k)
    if words is None:  # a string's words are the tokenizer's own (BERT's BasicTokenizer words), those read
        token_words = [w if seq == 0 else None for w, seq in zip(enc.word_ids, enc.sequence_ids)]
        n_words = max((w for w in token_words if w is not None), default=-1) + 1
    else:
        token_words, n_words = _token_words(enc.offsets, enc.sequence_ids, words), len(words)
    cut = truncate and getattr(enc, "truncated", False)  # the cut says so itself: the texts are not read again
    return _Item(text, pair, list(enc.input_ids), list(enc.token_type_ids), token_words, n_words, cut=bool(cut))


def rows_of(item_index: int, item: _Item, max_length: int, stride: int) -> list:
    if len(item.ids) <= max_length:
        return [_Piece(item_index, 0, item.ids, item.type_ids)]
    if item.pair is not None:
        raise BertkitError(
            f"a text pair of {len(item.ids)} tokens exceeds {max_length}: pairs are not windowed; "
            "shorten them or pass truncate=True (--truncate)"
        )
    cls_id, content, sep_id = item.ids[0], item.ids[1:-1], item.ids[-1]
    item.windows = spans(len(content), max_length - 2, stride)
    item.owners = max_context_owner(item.windows, len(content))
    return [
        _Piece(item_index, k, [cls_id, *content[s:e], sep_id], [0] * (e - s + 2))
        for k, (s, e) in enumerate(item.windows)
    ]


def stitch(item: _Item, window_vectors: list) -> torch.Tensor:
    """Token vectors [T, D] of a windowed text: [CLS] from the first window, [SEP] from the last."""
    if item.windows is None:
        return window_vectors[0]
    rows = [window_vectors[0][0]]
    for position, k in enumerate(item.owners):
        rows.append(window_vectors[k][1 + position - item.windows[k][0]])
    rows.append(window_vectors[-1][-1])
    return torch.stack(rows)


def window_cut(positions: int, output, max_length, stride, truncate):
    """Where texts are cut or windowed (`bertkit.text.windows.shape`). A layout's sentence vectors are cut at
    its max_seq_length, or at the length asked for instead (sentence-transformers' max_seq_length, `bertkit
    evaluate --max-length`), unless truncate=False asks for windows; other outputs are windowed. (`bertkit embed
    --resume` compares the cut made, not the options typed.)"""
    truncate = True if truncate is None and output.length else truncate
    if truncate and stride is not None:  # it was ignored: nothing is windowed
        raise BertkitError(f"stride={stride} applies to windows, and these texts are cut at their max length instead: "
                           "pass truncate=False (--no-truncate) to window them, or drop the stride")
    return shape(positions, output.length, max_length, stride, truncate)
