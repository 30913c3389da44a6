"""Feature extraction: contextual vectors from a frozen BERT, over texts of any length.

The feature-based approach of the BERT paper (Devlin et al. 2019, section 5.3, Table 7) feeds the activations
of a pre-trained, *frozen* encoder to a task model instead of fine-tuning it. This module runs the encoder over
texts and hands its outputs to `bertkit.embeddings.pooling` (torch), which turns one forward pass into

- token vectors   [T, D]  per text, from a layer strategy,
- word vectors    [W, D]  the word pieces of each input word pooled together,
- sentence vectors [D]    [CLS] or the attention-masked mean, optionally L2-normalised.

Sentence embeddings follow the model's sentence-transformers layout when it has one (`bertkit.model.sentence_layout`,
read by `bertkit.runtime.loading`): its pooling, its normalisation and its `max_seq_length`, the length it was
trained at (256 for the default all-MiniLM-L6-v2), at which a longer text is truncated (and a warning says how many
were) unless windows are asked for (`truncate=False`). An explicit argument overrides the layout; the choice is
made once, by `bertkit.embeddings.settings.resolve_output`.

Inputs longer than the window (the model's 512 positions, or `max_length`) are cut into overlapping windows
(`stride` tokens shared by consecutive windows, default half a window) and each token keeps the vector from the
window where it has the most context on both sides: the "max context" rule of `run_squad.py`
(`bertkit.text.windows`). For a sentence vector of a windowed text the [CLS] comes from the first window and the
[SEP] from the last, so a text that fits in one window gives exactly the one-pass result.

`iter_embed` streams: it reads texts lazily in chunks, sorts each chunk by length so that batches carry little
padding, runs the batches, and yields the results back in input order; `bertkit.data.vector_files` writes that
stream without holding every vector in memory. For each chunk, in this order: the texts become token ids
(`_encode`), long ones are cut into windows (`bertkit.text.windows`: the windows and, at once, each token's
max-context window), the windows run through the encoder in batches (`run_batch`, the layer strategy applied
there) and are put back together per text, and each text is pooled (`bertkit.embeddings.pooling.pool`).

Legend: as in `bertkit.embeddings.pooling` (B batch, T tokens, H hidden, L layers, D output size).
"""

from __future__ import annotations

import bisect
import functools
import inspect
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from bertkit.errors import BertkitError, int_at_least
from bertkit.runtime.loading import Loaded, check_as_loaded, folder_stamp, load
from bertkit.embeddings.pooling import combine_layers, pool, pool_batch
from bertkit.embeddings.settings import (AUTO, SENTENCE_POOLINGS, resolve_layers, resolve_output, say_cut,
                                         word_pooling_for)
from bertkit.embeddings.static import NO_CUT, check_static_options, iter_static, no_tokens
from bertkit.text.windows import max_context_owner, shape, spans


# --- the encoder ------------------------------------------------------------------------------


_LOADED: dict = {}  # (directory, device, dtype, int8, fast, its files) -> Loaded: the last two loaded


def load_encoder(model=None, device=None, dtype=None, int8: bool = False, fast=True) -> Loaded:
    """The encoder to embed with: None (the default model) or a model directory, loaded by
    `bertkit.runtime.loading` (and kept for the next call: embedding many small inputs one call at a time
    should not reload the weights); a `Loaded`; or a (model, tokenizer) pair, placed and quantized
    in place where asked (`bertkit.runtime.loading.load`, which takes `fast`: the fast path's settings)."""
    if isinstance(model, Loaded):
        return model
    if not (model is None or isinstance(model, (str, Path)) or (isinstance(model, tuple) and len(model) == 2)):
        raise BertkitError("model must be None (the default model), a model directory, or a (model, tokenizer) "
                           f"pair; got {type(model).__name__}")
    key = None
    if not isinstance(model, tuple):  # os.path, not Path: Path("") is the current directory, "" is no folder
        folder = model is not None and os.path.isdir(model)  # keyed by its files too: a folder written again
        key = (None if model is None else os.path.realpath(model) if folder else str(model),
               device, dtype, int8, fast, folder_stamp(model) if folder else None)
    if key not in _LOADED:  # the loader refuses what is no model ("": `bertkit.model.checkpoint.resolve`)
        loaded = load(model if key is None else key[0], head="encoder", device=device, dtype=dtype, int8=int8,
                      fast=fast)
        if key is None:
            return loaded
        while len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = loaded
    return _LOADED[key]


# --- encoding texts into pieces the model can take --------------------------------------


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


def whitespace_spans(text: str) -> list:
    """(start, end) character span of each whitespace-separated word of `text` (the words of str.split())."""
    spans, start = [], None
    for i, ch in enumerate(text + " "):
        if ch.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    return spans


def _token_words(offsets, sequence_ids, spans) -> list:
    """Map each token of the first segment to the input word whose char span holds its first char."""
    starts = [a for a, _ in spans]
    out = []
    for (start, end), seq in zip(offsets, sequence_ids):
        k = bisect.bisect_right(starts, start) - 1
        inside = seq == 0 and end > start and k >= 0 and start < spans[k][1]
        out.append(k if inside else None)
    return out


def _encode_chunk(tok, chunk: list, max_length: int, truncate: bool, words: bool, where=None, start: int = 0) -> list:
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
    items, budget = [], max_length - 2 if truncate else None  # one piece past it tells a cut text (`cut`)
    for k, (text, ids) in enumerate(zip(texts, tok.ids_lists(texts, None if budget is None else budget + 1))):
        ids, cut = [tok.cls_token_id, *ids[:budget], tok.sep_token_id], budget is not None and len(ids) > budget
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
        raise BertkitError("the second segment (pair) is empty: drop it or give it some text")
    # without truncation the tokenizer returns the whole text, however long; _pieces windows it
    enc = tok.encode(text, pair, max_length=max_length, truncation=truncate)
    _check_tokens(text, enc.input_ids, where, k)
    if words is None:
        words = whitespace_spans(text)
    token_words = _token_words(enc.offsets, enc.sequence_ids, words)
    budget = max_length - (2 if pair is None else 3)  # a text that fills max_length may be cut: read a bit past it
    cut = (truncate and len(enc.input_ids) == max_length and hasattr(tok, "head")
           and sum(tok.ids_batch([tok.head(s, budget) for s in (text, pair) if s is not None])[1]) > budget)
    return _Item(text, pair, list(enc.input_ids), list(enc.token_type_ids), token_words, len(words), cut=bool(cut))


def _pieces(item_index: int, item: _Item, max_length: int, stride: int) -> list:
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


def _stitch(item: _Item, window_vectors: list) -> torch.Tensor:
    """Token vectors [T, D] of a windowed text: [CLS] from the first window, [SEP] from the last."""
    if item.windows is None:
        return window_vectors[0]
    rows = [window_vectors[0][0]]
    for position, k in enumerate(item.owners):
        rows.append(window_vectors[k][1 + position - item.windows[k][0]])
    rows.append(window_vectors[-1][-1])
    return torch.stack(rows)


# --- the forward pass ---------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _takes_pool(cls: type) -> bool:
    """Whether the encoder class's forward takes `pool` (bertkit's do; a model held in memory may not)."""
    return "pool" in inspect.signature(cls.forward).parameters


def run_batch(model, pieces: list, layers="last", pad_id: int = 0, combine: str | None = None) -> list:
    """Run one padded batch and return each piece's token vectors [T_i, D] (float32, on the CPU), from
    the layer strategy `layers` (a name, indices with `combine`, or a LayerSpec: `bertkit.embeddings.settings`).

    `pieces` are anything with `input_ids` and `token_type_ids` lists ([CLS]/[SEP]
    included): the windows of `iter_embed`, or the rows `bertkit serve` batches.
    """
    vectors, _ = forward_padded(model, pieces, layers, pad_id, combine)
    return [vectors[row, : len(p.input_ids)] for row, p in enumerate(pieces)]


def forward_padded(model, pieces: list, layers="last", pad_id: int = 0, combine: str | None = None) -> tuple:
    """`run_batch`'s forward pass: the padded batch's vectors [B, T, D] (float32, on the CPU) and its
    attention mask [B, T] (1 on real tokens)."""
    spec = resolve_layers(layers, model.config.num_hidden_layers, combine)
    width = max(len(p.input_ids) for p in pieces)
    lengths = torch.tensor([len(p.input_ids) for p in pieces])
    ids = torch.tensor([[*p.input_ids, *[pad_id] * (width - len(p.input_ids))] for p in pieces], dtype=torch.long)
    types = None  # every row a single segment (every sentence): segment A's row, without a lookup per token
    if any(any(p.token_type_ids) for p in pieces):
        types = torch.tensor([[*p.token_type_ids, *[0] * (width - len(p.input_ids))] for p in pieces],
                             dtype=torch.long)
    mask = (torch.arange(width) < lengths.unsqueeze(1)).long()  # [B, T]
    need_all = spec.indices != (model.config.num_hidden_layers,)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.inference_mode():
        skip_pooler = {"pool": False} if _takes_pool(type(model)) else {}  # bertkit's encoders: no pooler to run
        out = model(ids.to(device), attention_mask=mask.to(device),
                    token_type_ids=None if types is None else types.to(device), output_hidden_states=need_all,
                    **skip_pooler)
        vectors = combine_layers(out.hidden_states, spec) if need_all else out.last_hidden_state
        return vectors.float().cpu(), mask


def iter_embed(
    texts: Iterable,
    loaded: Loaded,
    layers="last",
    pooling=AUTO,
    normalize: bool | None = None,
    *,
    pairs: Iterable | None = None,
    combine: str | None = None,
    word_pooling: str | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    stride: int | None = None,
    truncate: bool | None = None,
    chunk_size: int = 1024,
    progress: bool = False,
    total: int | None = None,
    where=None,
) -> Iterator[np.ndarray]:
    """Yield one result per text, in input order, reading `texts` lazily (`chunk_size` at a time, each chunk's rows
    sorted by length: little padding), with the encoder `loaded` (`load_encoder` or `bertkit.runtime.loading.load`);
    `where(i)` names the i-th text (from 0) in an error about it: file:line. See `embed` for the arguments."""
    if not isinstance(loaded, Loaded):
        raise BertkitError(f"iter_embed takes a loaded encoder (bertkit.embeddings.features.load_encoder(model)), "
                           f"got {type(loaded).__name__}")
    output = resolve_output(loaded.layout, pooling, normalize)
    word_pooling = word_pooling_for(word_pooling, output)  # refused beside vectors that are not per word
    int_at_least(batch_size, 1, "batch_size")
    int_at_least(chunk_size, 1, "chunk_size")
    if loaded.task == "static":  # a table and a mean: no windows, layers or forward pass
        check_static_options(pooling, layers, pairs, stride)
        yield from _static_rows(texts, loaded, normalize, static_cut(loaded, max_length, truncate), chunk_size,
                                progress, total, where)
        return
    # a task model (a Loaded classifier, a head in a pair) embeds with its encoder, as its directory does
    net, tok = getattr(loaded.model, "base_model", loaded.model), loaded.tokenizer
    cut = window_cut(loaded.max_positions, output, max_length, stride, truncate)
    pad_id = getattr(tok, "pad_token_id", 0) or 0
    was_training = net.training
    net.eval()  # dropout off: features are deterministic
    bar = tqdm(total=total, unit="text", desc="embed") if progress else None
    source = zip(texts, pairs) if pairs is not None else ((t, None) for t in texts)
    seen = was_cut = 0
    try:
        for start, chunk in _chunks(source, chunk_size):
            items = _encode_chunk(tok, chunk, cut.max_length, cut.truncate, output.pooling == "words", where, start)
            seen, was_cut = seen + len(items), was_cut + sum(item.cut for item in items)
            pieces = [p for i, item in enumerate(items) for p in _pieces(i, item, cut.max_length, cut.stride)]
            if output.pooling in SENTENCE_POOLINGS and len(pieces) == len(items):  # no text windowed
                yield from sentence_vectors(net, pieces, layers, combine, pad_id, batch_size, bar, output.normalize,
                                             output.pooling)
                continue
            tokens = _run_chunk(net, items, pieces, layers, combine, pad_id, batch_size, bar)
            for item, vectors in zip(items, tokens):
                yield pool(vectors, output.pooling, output.normalize, item.token_words, item.n_words, word_pooling)
        say_cut(was_cut, seen, cut.max_length, asked=truncate is not None)  # once, after the last text
    finally:
        net.train(was_training)
        if bar is not None:
            bar.close()


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


def static_cut(loaded: Loaded, max_length, truncate) -> int | None:
    """Where a static model cuts each text, in tokens: at max_length (default: its folder's), or nowhere (None)
    when truncate=False asks for the whole text. (`bertkit embed --resume` records and compares this cut.)"""
    return None if truncate is False else max_length or loaded.config.max_length


def _chunks(source: Iterator, size: int) -> Iterator[tuple[int, list]]:
    """(the position of its first item, a list of `size` items) taken from `source` as they are needed
    (the last may be shorter)."""
    start = 0
    while chunk := list(itertools.islice(source, size)):
        yield start, chunk
        start += len(chunk)


def _static_rows(texts, loaded: Loaded, normalize, cut, chunk_size: int, progress: bool, total, where):
    """A static model's vectors (`bertkit.embeddings.static`) with each text cut at `cut` (`static_cut`; None:
    whole), with the progress bar iter_embed shows."""
    with tqdm(total=total, unit="text", desc="embed", disable=not progress) as bar:
        yield from iter_static(texts, loaded, normalize, max_length=NO_CUT if cut is None else cut,
                               chunk_size=chunk_size, bar=bar, where=where)


def _run_chunk(net, items: list, pieces: list, layers, combine, pad_id: int, batch_size: int, bar) -> list:
    """Each item's token vectors [T, D]: the pieces run in batches of similar length (little
    padding), then each text's windows put back together (`_stitch`)."""
    order = sorted(range(len(pieces)), key=lambda k: len(pieces[k].input_ids))
    results = [[None] * (len(it.windows) if it.windows else 1) for it in items]
    shown = 0
    for b in range(0, len(order), batch_size):
        batch = [pieces[k] for k in order[b : b + batch_size]]
        for piece, vectors in zip(batch, run_batch(net, batch, layers, pad_id, combine)):
            results[piece.item][piece.window] = vectors
        if bar is not None:  # texts of the chunk, in proportion to the rows done
            done = len(items) * min(b + batch_size, len(order)) // len(order)
            bar.update(done - shown)
            shown = done
    return [_stitch(item, windows) for item, windows in zip(items, results)]


def sentence_vectors(net, pieces: list, layers, combine, pad_id: int, batch_size: int, bar, normalize: bool,
                     pooling: str) -> list:
    """One sentence vector per piece (each a whole text, its ids as the model reads them), in order: the pieces
    run in batches of similar length as in `_run_chunk` and each batch is pooled at once (`pool_batch`), not text
    by text; `bar` (or None) counts the pieces done. iter_embed's, and distill static's for its token rows."""
    order = sorted(range(len(pieces)), key=lambda k: len(pieces[k].input_ids))
    out = [None] * len(pieces)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        vectors, mask = forward_padded(net, [pieces[k] for k in idx], layers, pad_id, combine)
        for k, row in zip(idx, pool_batch(vectors, mask, pooling, normalize)):
            out[k] = row
        if bar is not None:
            bar.update(len(idx))
    return out


def placed_encoder(model, use: str, device=None, dtype=None, int8: bool = False, fast=True) -> Loaded:
    """`load_encoder` for a public call named `use` (embed, attention_map): a `Loaded` model already runs
    where and in what it was loaded, so a device, dtype or int8 asked for beside it is refused."""
    if isinstance(model, Loaded):
        check_as_loaded(model, "model", f"{use} loads it", device, dtype, int8)
    return load_encoder(model, device, dtype, int8 or False, fast)


# embed's **options: iter_embed's keyword arguments and load_encoder's
_EMBED_OPTIONS = {name for name, p in inspect.signature(iter_embed).parameters.items()
                  if p.kind == p.KEYWORD_ONLY} | {"device", "dtype", "int8"}


def _listed(values, what: str) -> list | tuple:
    """`values` (a list, a tuple, or any iterable: a generator, a numpy array) as a sequence, or a
    BertkitError: bytes would iterate as ints, None or a number not at all; a tuple inside is
    sentence-transformers' (first, second) pair, which read as pre-split words would be one segment."""
    if isinstance(values, (bytes, bytearray)):
        raise BertkitError(f"{what} must be a str or a list of str, got {type(values).__name__}: decode it first "
                           "(e.g. data.decode('utf-8'))")
    try:
        values = values if isinstance(values, (list, tuple)) else list(values)
    except TypeError:
        raise BertkitError(f"{what} must be a str or a list of str, got {type(values).__name__}") from None
    if (i := next((i for i, v in enumerate(values) if isinstance(v, tuple)), None)) is not None:
        raise BertkitError(f"{what}[{i}] is a tuple: give a text pair's second texts as pairs=[...] (one per text); "
                           "pre-split words as a list")
    return values


def embed(texts, model=None, layers="last", pooling=AUTO, normalize: bool | None = None, **options):
    """Embed texts with a frozen BERT; a numpy float32 array, one row per text.

    texts:     a string, a list (any iterable, read whole first: `iter_embed` streams one) of strings,
               or of pre-split word lists (word vectors then align to those words); a pair's second
               texts go in pairs=.
    model:     None (the default model), a model directory, a `bertkit.runtime.loading.Loaded`,
               or a (model, tokenizer) pair.
    layers:    a strategy name (first, last, sum_all, second_to_last,
               sum_last_four, concat_last_four), a layer index, or a list of
               indices (0 = embeddings .. L = last, -1 = last) merged by
               `combine=` sum | mean | concat (default concat).
    pooling:   "auto" (the model's sentence-transformers layout, else mean), "mean"
               (masked mean over the tokens, [CLS]/[SEP] included, as
               sentence-transformers), "cls", "max", "words" (one vector per input word,
               pieces pooled by `word_pooling=` mean (default) | first) or None (per-token).
    normalize: L2-normalise each output vector (None: as the model's layout says for
               sentence vectors, else no).
    options:   pairs=, combine=, word_pooling=, batch_size=32, max_length= (tokens per pass or window; default:
               for sentence vectors the layout's max_seq_length, else the model's 512 positions), stride= tokens
               shared by consecutive windows (default: half a window, (max_length-2) - (max_length-2)//2),
               truncate= (cut at max_length instead of windowing; default: True for sentence vectors of a model
               with a layout, as sentence-transformers cuts at its max_seq_length, with a warning that counts the
               texts cut, else False), progress=False, device= auto | cpu | cuda, dtype= float32 | bfloat16 |
               auto, int8=False (int8 dense layers, `bertkit.runtime.quantization`); see `bertkit.runtime.loading.load`.

    Returns [N, D] for pooled vectors of a list, [D] for a single string; with pooling None or "words" a list of
    [T_i, D] / [W_i, D] arrays (one array for a single string).
    """
    single = isinstance(texts, str)
    texts = [texts] if single else _listed(texts, "texts")
    if len(texts) == 0:
        raise BertkitError("no texts to embed: pass a string or a non-empty list of strings")
    if options.get("pairs") is not None:
        pairs = options["pairs"]
        if isinstance(pairs, str) and not single:  # zip would pair each text with one character
            raise BertkitError("pairs must be a list of str (one per text) when texts is a list, got a str")
        options["pairs"] = [pairs] if single and isinstance(pairs, str) else _listed(pairs, "pairs")
        if len(options["pairs"]) != len(texts):
            raise BertkitError(f"{len(texts)} texts but {len(options['pairs'])} pairs: give one pair per text")
    unknown = sorted(set(options) - _EMBED_OPTIONS)
    if unknown:  # before the model loads, in embed's name (iter_embed would name itself)
        raise TypeError(f"embed() got an unexpected keyword argument {unknown[0]!r}; it takes "
                        f"{', '.join(sorted(_EMBED_OPTIONS))}")
    options.setdefault("total", len(texts))
    loaded = placed_encoder(model, "embed", *(options.pop(name, None) for name in ("device", "dtype", "int8")))
    rows = iter_embed(texts, loaded, layers, pooling, normalize, **options)
    first = next(rows)
    if single or first.ndim != 1:  # one text; or tokens and words, an array per text
        return first if single else [first, *rows]
    out = np.empty((len(texts), *first.shape), first.dtype)  # filled as rows come: a list of rows, then np.stack,
    for i, row in enumerate(itertools.chain([first], rows)):  # held the vectors twice
        out[i] = row
    return out
