"""Sentence vectors from a static model: the tokenizer's ids, then one table lookup and a mean.

A static model (`bertkit.model.static`: a table [V, D] distilled from a sentence model or
trained contrastively) has no transformer, so embedding a text is

    texts --Tokenizer.ids_batch--> ids [N], lengths [B] --EmbeddingBag(mean)--> [B, D] (--L2--> [B, D])

exactly what sentence-transformers' `StaticEmbedding` computes (its tokenizer's ids without
special tokens, `EmbeddingBag` over offsets, then the Normalize module when the folder has
one): `SentenceTransformer(folder).encode` gives these vectors (a test checks it). At this
speed the tokenizer is the whole cost, so it runs its ids-only path
(`bertkit.text.tokenizer_speed.token_ids`), with no character offsets, word ids or padding.

`bertkit.embeddings.features.iter_embed` hands a static model's texts here, so `bertkit.embed`,
`bertkit embed`, retrieval (evaluate, index, search, mine) run it unchanged; the server
calls `static_vectors` on the ids it has checked.

Legend: B texts, N token ids of all texts together, D the table's width.
"""

from __future__ import annotations

import itertools
import sys
from typing import Iterable, Iterator

import numpy as np
import torch

from bertkit.errors import BertkitError, no_tokens


def _bags(ids: list, lengths: list, skip_ids: tuple, max_length: int | None):
    """ids [N] and offsets [B] as tensors: each text cut at `max_length` tokens, then `skip_ids`
    dropped (the order of model2vec, whose tokenizer truncates before [UNK] is removed)."""
    if max_length is not None and lengths and max(lengths) > max_length:
        cut, pos = [], 0
        for n in lengths:
            cut += ids[pos : pos + min(n, max_length)]
            pos += n
        ids, lengths = cut, [min(n, max_length) for n in lengths]
    flat = torch.tensor(ids, dtype=torch.long)
    sizes = torch.tensor(lengths, dtype=torch.long)
    if skip_ids:
        bag = torch.repeat_interleave(torch.arange(len(lengths)), sizes)  # [N] the text each id belongs to
        keep = ~torch.isin(flat, torch.tensor(skip_ids, dtype=torch.long))
        flat, sizes = flat[keep], torch.bincount(bag[keep], minlength=len(lengths))
    offsets = torch.zeros(len(lengths), dtype=torch.long)
    offsets[1:] = torch.cumsum(sizes, 0)[:-1]
    return flat, offsets


# max_length for truncate=False (--no-truncate): a transformer's windows then cover the whole text, so a table
# averages all of it (iter_embed passed None, the folder's cut: --no-truncate still cut at 512)
NO_CUT = sys.maxsize


def static_vectors(model, ids: list, lengths: list, max_length: int | None = None) -> np.ndarray:
    """The mean table row of each text [B, D] float32, not normalised: `ids` are all texts' ids
    concatenated, `lengths` each text's count (`Tokenizer.ids_batch`), each cut at `max_length`
    tokens (None: where the model cuts, `config.max_length`)."""
    limit = model.config.max_length if max_length is None else max_length
    flat, offsets = _bags(ids, lengths, model.config.skip_ids, limit)
    device = model.embedding.weight.device
    with torch.inference_mode():
        return model(flat.to(device), offsets.to(device)).float().cpu().numpy()


def check_static_options(pooling, layers, pairs, stride=None, combine=None) -> None:
    """A static model has one vector per token and averages them: the options it cannot honour."""
    if combine is not None:  # it was read by nothing
        raise BertkitError(f"combine {combine!r} (--combine) merges a list of layers, and a static model has no layers "
                           "(its table is the one vector per token): drop it")
    if stride is not None:  # it was read by nothing
        raise BertkitError(f"stride={stride} (--stride): a static model has no windows to overlap (truncate=False, "
                           "--no-truncate, averages every token of a text): drop the stride")
    if pooling not in ("auto", "mean"):  # None (one vector per token) as the command line spells it, not Python
        shown = "'none' (one vector per token)" if pooling is None else repr(pooling)
        raise BertkitError(f"pooling {shown}: a static model averages its tokens' vectors (pooling mean); "
                           "it has no [CLS], layers or per-token context to pool otherwise")
    if str(layers).strip() not in ("last", "-1"):  # the last layer, the table (-1 is a string on the command line)
        raise BertkitError(f"layers {layers!r}: a static model has no layers (its table is the one vector per token)")
    if pairs is not None:
        raise BertkitError("a static model embeds single texts, not pairs")


def iter_static(texts: Iterable, loaded, normalize: bool | None = None, *, max_length: int | None = None,
                chunk_size: int = 1024, bar=None, where=None, on_cut=None) -> Iterator[np.ndarray]:
    """One vector [D] per text, in order, `chunk_size` texts tokenised and averaged at a time.
    normalize: None follows the folder (a Normalize module, model2vec's normalize); where(i) names the
    i-th text (from 0) in an error about it; on_cut(cut, seen): told after the last text how many were cut at
    max_length (see `bertkit.embeddings.features.iter_embed`)."""
    model, tok = loaded.model, loaded.tokenizer
    normalize = model.config.normalize if normalize is None else bool(normalize)
    limit = model.config.max_length if max_length is None else max_length
    texts, start, cut = iter(texts), 0, 0
    while True:
        chunk = list(itertools.islice(texts, chunk_size))
        if not chunk:
            if on_cut is not None:
                on_cut(cut, start)
            return
        for text in chunk:
            if not isinstance(text, str):
                raise BertkitError(f"a static model embeds strings, got {type(text).__name__}")
            if not text.strip():
                raise BertkitError("cannot embed an empty text: every input needs at least one non-space character")
        ids, lengths = tok.ids_batch(chunk)
        for k, (text, n) in enumerate(zip(chunk, lengths)):  # as a transformer and the server: no zero vector
            if n == 0:
                raise no_tokens(text, where(start + k) if where else None)
        start, cut = start + len(chunk), cut + (0 if limit is None else sum(n > limit for n in lengths))
        vectors = static_vectors(model, ids, lengths, max_length)
        if normalize:  # as torch's F.normalize (sentence-transformers' Normalize): norms below 1e-12 taken as 1e-12
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        if bar is not None:
            bar.update(len(chunk))
        yield from vectors
