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
(`bertkit.embeddings.inputs`), long ones are cut into windows (`bertkit.text.windows`: the windows and, at once,
each token's max-context window), the windows run through the encoder in batches (`run_batch`, the layer strategy applied
there) and are put back together per text, and each text is pooled (`bertkit.embeddings.pooling.pool`).

Legend: as in `bertkit.embeddings.pooling` (B batch, T tokens, H hidden, L layers, D output size).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from bertkit.errors import BertkitError, int_at_least, switch
from bertkit.runtime.loading import Loaded, check_as_loaded, folder_stamp, load
from bertkit.embeddings.pooling import combine_layers, pool, pool_batch
from bertkit.embeddings.settings import (AUTO, SENTENCE_POOLINGS, STATIC, resolve_layers, resolve_output, say_cut,
                                         word_pooling_for)
from bertkit.embeddings.inputs import encode_chunk, rows_of, stitch, window_cut
from bertkit.embeddings.static import NO_CUT, check_static_options, iter_static


# --- the encoder ------------------------------------------------------------------------------


_LOADED: dict = {}  # (directory, device, dtype, int8, fast, its files) -> Loaded: the last two loaded
# held while the cache is read and filled: threads embedding at once (a web app's workers) load a model once, and one
# thread's eviction cannot take the entry another is about to return (a KeyError) or change the dict under its loop
_LOADING = threading.Lock()


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
    if key is None:  # a pair in memory: placed as asked, nothing to keep
        return load(model, head="encoder", device=device, dtype=dtype, int8=int8, fast=fast)
    with _LOADING:
        if key not in _LOADED:  # the loader refuses what is no model ("": `bertkit.model.checkpoint.resolve`)
            loaded = load(key[0], head="encoder", device=device, dtype=dtype, int8=int8, fast=fast)
            while len(_LOADED) >= 2:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = loaded
        return _LOADED[key]


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
    with_ids: bool = False,
    on_cut=None,
) -> Iterator[np.ndarray]:
    """Yield one result per text, in input order, reading `texts` lazily (`chunk_size` at a time, each chunk's rows
    sorted by length: little padding), with the encoder `loaded` (`load_encoder` or `bertkit.runtime.loading.load`);
    `where(i)` names the i-th text (from 0) in an error about it: file:line. See `embed` for the arguments.
    with_ids (per-token vectors, pooling=None): yield (vectors [T, D], the T token ids, [CLS]/[SEP] included).
    on_cut(cut, seen): told how many texts were cut at the max length, in place of `say_cut`'s warning."""
    output, word_pooling = _checked(loaded, pooling, normalize, word_pooling, with_ids, batch_size, chunk_size)
    if loaded.task == "static":  # a table and a mean: no windows, layers or forward pass
        check_static_options(pooling, layers, pairs, stride, combine)
        yield from _static_rows(texts, loaded, normalize, static_cut(loaded, max_length, truncate), chunk_size,
                                progress, total, where, on_cut, asked=truncate is not None)
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
            items = encode_chunk(tok, chunk, cut.max_length, cut.truncate, output.pooling == "words", where, start)
            seen, was_cut = seen + len(items), was_cut + sum(item.cut for item in items)
            pieces = [p for i, item in enumerate(items) for p in rows_of(i, item, cut.max_length, cut.stride)]
            if output.pooling in SENTENCE_POOLINGS and len(pieces) == len(items):  # no text windowed
                yield from sentence_vectors(net, pieces, layers, combine, pad_id, batch_size, bar, output.normalize,
                                             output.pooling)
                continue
            rows = _run_chunk(net, items, pieces, layers, combine, pad_id, batch_size, bar, lambda item, vectors: pool(
                vectors, output.pooling, output.normalize, item.token_words, item.n_words, word_pooling))
            for item, row in zip(items, rows):
                yield (row, item.ids) if with_ids else row  # a windowed text's rows: all its ids, stitched
        tell = on_cut or functools.partial(say_cut, length=cut.max_length, asked=truncate is not None)
        tell(was_cut, seen)  # once, after the last text
    finally:
        net.train(was_training)
        if bar is not None:
            bar.close()


def _checked(loaded, pooling, normalize, word_pooling, with_ids: bool, batch_size, chunk_size) -> tuple:
    """iter_embed's arguments checked before any text is read: (the output they make, the word pooling)."""
    switch(normalize, "normalize", none=True)  # "false" is a true str: it normalised every vector
    if not isinstance(loaded, Loaded):
        raise BertkitError(f"iter_embed takes a loaded encoder (bertkit.embeddings.features.load_encoder(model)), "
                           f"got {type(loaded).__name__}")
    output = resolve_output(loaded.layout, pooling, normalize)
    word_pooling = word_pooling_for(word_pooling, output)  # refused beside vectors that are not per word
    if with_ids and output.pooling is not None:
        raise BertkitError("with_ids gives each token's id beside its vector: ask for per-token vectors "
                           f"(pooling=None), not {output.pooling!r}")
    int_at_least(batch_size, 1, "batch_size")
    int_at_least(chunk_size, 1, "chunk_size")
    return output, word_pooling


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


def _static_rows(texts, loaded: Loaded, normalize, cut, chunk_size: int, progress: bool, total, where, on_cut,
                 asked: bool):
    """A static model's vectors (`bertkit.embeddings.static`) with each text cut at `cut` (`static_cut`; None:
    whole), with the progress bar iter_embed shows; the texts cut told to on_cut(cut, seen), or warned of as
    iter_embed warns (`say_cut`: a cut not `asked` for, the folder's; 1,500 tokens averaged as 512 unsaid)."""
    tell = on_cut or functools.partial(say_cut, length=cut, asked=asked, why=STATIC)
    with tqdm(total=total, unit="text", desc="embed", disable=not progress) as bar:
        yield from iter_static(texts, loaded, normalize, max_length=NO_CUT if cut is None else cut,
                               chunk_size=chunk_size, bar=bar, where=where, on_cut=tell)


def _run_chunk(net, items: list, pieces: list, layers, combine, pad_id: int, batch_size: int, bar, finish) -> list:
    """Each item's finish(item, its token vectors [T, D]), in order: the pieces run in batches of similar length
    (little padding), and a text is put back together (`bertkit.embeddings.inputs.stitch`) and finished as soon
    as its last window has run, its windows let go. (They were all held to the chunk's end: overlapping by half,
    with the stitched copy beside them, ~3x a chunk's per-token output in memory.)"""
    order = sorted(range(len(pieces)), key=lambda k: len(pieces[k].input_ids))
    results = [[None] * (len(it.windows) if it.windows else 1) for it in items]
    left, out = [len(windows) for windows in results], [None] * len(items)
    shown = 0
    for b in range(0, len(order), batch_size):
        batch = [pieces[k] for k in order[b : b + batch_size]]
        for piece, vectors in zip(batch, run_batch(net, batch, layers, pad_id, combine)):
            k = piece.item
            results[k][piece.window], left[k] = vectors, left[k] - 1
            if not left[k]:
                out[k], results[k] = finish(items[k], stitch(items[k], results[k])), None
        if bar is not None:  # texts of the chunk, in proportion to the rows done
            done = len(items) * min(b + batch_size, len(order)) // len(order)
            bar.update(done - shown)
            shown = done
    return out


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


# embed's **options: iter_embed's keyword arguments (but with_ids: embed returns arrays) and load_encoder's
_EMBED_OPTIONS = {name for name, p in inspect.signature(iter_embed).parameters.items()
                  if p.kind == p.KEYWORD_ONLY} - {"with_ids"} | {"device", "dtype", "int8"}


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
               pieces pooled by `word_pooling=` mean (default) | first; a string's words are BERT's:
               punctuation and CJK ideographs apart, as the tokenizer's word_ids) or None (per-token).
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
    for name in ("truncate", "progress"):  # as normalize (iter_embed's `_checked`): "false" is a true str
        switch(options.get(name), name, none=True)
    options.setdefault("total", len(texts))
    if not single:  # an error about one text says which: texts[i] (the command line's where says file:line)
        options.setdefault("where", "texts[{}]".format)
    loaded = placed_encoder(model, "embed", *(options.pop(name, None) for name in ("device", "dtype", "int8")))
    rows = iter_embed(texts, loaded, layers, pooling, normalize, **options)
    first = next(rows)
    if single or first.ndim != 1:  # one text; or tokens and words, an array per text
        return first if single else [first, *rows]
    out = np.empty((len(texts), *first.shape), first.dtype)  # filled as rows come: a list of rows, then np.stack,
    for i, row in enumerate(itertools.chain([first], rows)):  # held the vectors twice
        out[i] = row
    return out
