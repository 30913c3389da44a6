"""How retrieval embeds texts: one vector per text, as the model was trained to make it.

Evaluation, mining and the index embed queries and passages the way
sentence-transformers' `encode` does for the same model folder, so that figures
compare with sentence-transformers' and MTEB's:

- pooling and max length from the model's sentence-transformers layout
  (`bertkit.model.sentence_layout`: the default all-MiniLM-L6-v2 says mean pooling,
  256 tokens); a model without a layout: mean pooling, its full positions;
- a text longer than that is truncated, not windowed (what the model was
  trained on, and what MTEB's figures use);
- vectors L2-normalised, so a dot product is the cosine;
- float32 unless asked otherwise;
- the whole list sorted by length before batching, then embedded in chunks:
  a 5,000-abstract corpus pads each batch to nearly its own length, and memory
  holds one chunk's token vectors, not the corpus's.

`model` is None (the default model), a model directory, a `bertkit.runtime.loading.Loaded`
or a (model, tokenizer) pair, as `bertkit.embed` takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertkit.errors import BertkitError
from bertkit.embeddings.features import iter_embed, load_encoder
from bertkit.embeddings.settings import resolve_output
from bertkit.runtime.loading import Loaded


@dataclass(frozen=True)
class EncodingSettings:
    """What the vectors were made with; recorded next to every figure."""

    model: str  # the model directory, or "(model in memory)" for a loaded pair
    pooling: str
    max_length: int
    dtype: str  # "float32", "bfloat16" or "int8"

    @classmethod
    def of(cls, loaded: Loaded, max_length: int | None = None) -> "EncodingSettings":
        """What `loaded` embeds with: its layout's pooling (the mean without one) and max length, `max_length`
        overriding the latter, its precision. An index records them (`bertkit.retrieval.index.model_record`)."""
        name = str(loaded.directory.resolve()) if loaded.directory is not None else "(model in memory)"
        length = loaded.max_length if max_length is None else max_length
        return cls(name, resolve_output(loaded.layout).pooling, length, loaded.precision)


def encoder_and_settings(model, max_length: int | None = None,
                         dtype: str = "float32", fast=True) -> tuple[Loaded, EncodingSettings]:
    """The encoder (loaded once, `sentence_encoder`) and the settings it embeds with (`EncodingSettings.of`);
    `fast`: the fast path's settings (`bertkit.runtime.loading.load`)."""
    if dtype not in ("float32", "bfloat16", "auto"):  # auto: bfloat16 where native (the loader resolves it)
        raise BertkitError(f"dtype {dtype!r}: use float32 (comparable with published figures), bfloat16 or auto")
    loaded = sentence_encoder(model, dtype=dtype, fast=fast)
    return loaded, EncodingSettings.of(loaded, max_length)


def sentence_encoder(model, device=None, dtype=None, fast=True) -> Loaded:
    """The sentence model retrieval embeds with, loaded through `bertkit.embeddings.features.load_encoder` and
    refused when it is a fine-tuned task model (`need_sentence_model`): what evaluation, mining and an index's
    build load (a search loads the index's own model, checked against its record: `retrieval.search`)."""
    return need_sentence_model(load_encoder(model, device, dtype, fast=fast))


def need_sentence_model(loaded: Loaded) -> Loaded:
    """`loaded`, refused when it is a fine-tuned task model (a classifier, a regression or pair scorer, a
    reranker, a tagger, a QA model): the loader hands over its encoder, but what it learned is in its head
    (a cross-encoder reads [CLS] a [SEP] b and gives one score), and the cosine of its encoder's pooled
    vectors is a figure it was never trained to give: evaluation would report it as the model's, and an
    index or mined negatives would rest on it. `bertkit embed` still extracts its features (the paper's
    feature-based use)."""
    if loaded.fine_tuned:
        where = loaded.directory
        raise BertkitError(f"{where} is a fine-tuned {loaded.info.get('task', 'task')} model, not a sentence "
                           f"embedding model: its cosines are not what it learned; score it with `bertkit predict "
                           f"{where} FILE` (a text-pair scorer reranks a first stage: --rerank {where} of search "
                           "and evaluate retrieval), or give a sentence model (bertkit finetune embed) or the "
                           "encoder it was fine-tuned from")
    return loaded


def has_tokens(text: str, tokenizer) -> bool:
    """Whether `text` gives the model any word piece: not when it is empty or holds only characters BERT's
    basic tokenizer drops (control and format characters such as U+200B, combining marks stripped with the
    accents). A text with a letter or a digit always gives one ([UNK] at worst), so only a text without any is
    tokenized: tokenizing a whole corpus a second time costs about what embedding it does."""
    return any(c.isalnum() for c in text) or (bool(text.strip()) and bool(tokenizer.tokenize(text)))


def encode(texts: list[str], loaded: Loaded, settings: EncodingSettings, *, batch_size: int = 32,
           chunk_size: int = 1024, progress: bool = False, names=None, on_cut=None) -> np.ndarray:
    """Unit-length sentence vectors [N, D] float32, in the order of `texts`; names(i) names `texts[i]` in an
    error about it (a text without tokens), e.g. its id in a corpus file; on_cut(cut, seen): told how many texts
    were longer than `settings.max_length` and embedded cut there (`iter_embed`'s count; else nothing is said:
    the cut is this module's rule, and its callers say it where it matters).

    The texts go to the encoder longest-character-count last (the whole list, as
    sentence-transformers' `encode` sorts it), `chunk_size` at a time, each chunk
    sorted again by tokens; only a chunk's token vectors are held at once."""
    if not texts:
        raise BertkitError("no texts to embed")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rows = iter_embed((texts[i] for i in order), loaded, pooling=settings.pooling, normalize=True,
                      max_length=settings.max_length, truncate=True, batch_size=batch_size, chunk_size=chunk_size,
                      progress=progress, total=len(texts), where=None if names is None else lambda k: names(order[k]),
                      on_cut=on_cut)
    out = None
    for k, vector in enumerate(rows):  # to the end: iter_embed tells on_cut after its last text
        i = order[k]
        if out is None:
            out = np.empty((len(texts), len(vector)), dtype=np.float32)
        out[i] = vector
    return out
