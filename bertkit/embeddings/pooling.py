"""Pooling: how the encoder's outputs become the vectors a user asks for, in torch.

Three poolings, each a small function over torch tensors, the same for inference and training:

- across layers, the layer strategies of `bertkit.embeddings.settings` (`combine_layers`: one
  hidden state, or the sum, mean or concatenation of several);
- across word pieces, one vector per input word (`pool_words`: the mean of its pieces, or the
  first piece, as the paper's NER tagger uses);
- across tokens, one vector per text: the masked mean (sentence-transformers' pooling), the
  element-wise maximum or the [CLS] vector, `bertkit.model.modeling.pool_sentence` (one
  implementation, below the classification head that also pools with it).

`pool` is the last step of `bertkit.embeddings.features.iter_embed` for one text, and of the
server's embeddings: the sentence vector, the word vectors or the tokens, normalised or not
(`bertkit.embeddings.settings.resolve_output` decides which), handed back as float32 numpy.

Legend: B batch, T tokens (with [CLS]/[SEP]), H hidden size, W input words, D output size (H, or
k*H for a concatenation of k layers).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.errors import BertkitError
from bertkit.model.modeling import pool_sentence


def combine_layers(hidden_states: Sequence[torch.Tensor], spec) -> torch.Tensor:
    """The strategy's vectors: L+1 tensors [B, T, H] -> [B, T, D]; `spec` a `bertkit.embeddings.settings.LayerSpec`
    (named, not imported: its caller resolves it)."""
    picked = [hidden_states[i] for i in spec.indices]
    if len(picked) == 1:
        return picked[0]
    if spec.combine == "concat":
        return torch.cat(picked, dim=-1)  # [B, T, k*H]
    total = torch.stack(picked, dim=0).sum(dim=0)  # [B, T, H]
    return total / len(picked) if spec.combine == "mean" else total


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows of stored (numpy) vectors divided by their L2 norm: torch's `F.normalize`, as `pool` does
    (norms below 1e-12 taken as 1e-12), for vectors cut to a Matryoshka dimension after the fact."""
    return F.normalize(torch.from_numpy(np.array(vectors)), dim=-1).numpy()  # a copy: stored vectors may be read-only


def pool_words(token_vectors: torch.Tensor, token_words: Sequence, n_words: int, how: str = "mean") -> torch.Tensor:
    """Pool word pieces into word vectors: [T, D] -> [W, D].

    `token_words[t]` is the index of the input word token t belongs to, or None
    for [CLS]/[SEP]/pieces outside every word. `how` is "mean" (all pieces) or
    "first" (the first piece, as the paper's NER tagger uses). A word that yields
    no piece at all (say, only control characters) gets a zero vector.
    """
    if how not in ("mean", "first"):
        raise BertkitError(f"unknown word pooling {how!r}: use 'mean' or 'first'")
    pieces = [(t, w) for t, w in enumerate(token_words) if w is not None]
    if how == "first":  # a word's first piece: the earliest token of each word
        pieces = list({w: (t, w) for t, w in reversed(pieces)}.values())
    rows = torch.tensor([t for t, _ in pieces], dtype=torch.long)
    words = torch.tensor([w for _, w in pieces], dtype=torch.long)
    out = token_vectors.new_zeros((n_words, token_vectors.shape[-1]))
    out.index_add_(0, words, token_vectors[rows])  # [W, D]: each word's pieces summed
    if how == "mean":
        out /= torch.bincount(words, minlength=n_words).clamp(min=1).unsqueeze(-1).to(out.dtype)
    return out


def pool_batch(vectors: torch.Tensor, mask: torch.Tensor, pooling: str, normalize: bool) -> np.ndarray:
    """`pool`'s sentence vector for a padded batch at once: [B, T, D], mask [B, T] -> [B, D] float32 numpy
    (padding never counts); the same vectors as pooling each text alone, without torch calls per text."""
    out = pool_sentence(vectors.float(), mask, pooling)  # [B, D]
    if normalize:
        out = F.normalize(out, dim=-1)
    return np.ascontiguousarray(out.numpy(), dtype=np.float32)


def pool(tokens: torch.Tensor, pooling, normalize: bool, token_words: Sequence = (), n_words: int = 0,
         word_pooling: str = "mean") -> np.ndarray:
    """One text's output from its token vectors [T, D], float32 numpy: a sentence vector [D] (one of
    SENTENCE_POOLINGS), word vectors [W, D] ("words", with the text's `token_words` and `n_words`) or
    the tokens themselves (None); each vector L2-normalised when `normalize`."""
    tokens = tokens.float()
    if pooling is None:
        out = tokens  # [T, D]
    elif pooling == "words":
        out = pool_words(tokens, token_words, n_words, word_pooling)  # [W, D]
    else:  # a sentence pooling (pool_sentence refuses any other name)
        out = pool_sentence(tokens.unsqueeze(0), None, pooling)[0]  # [D]
    if normalize:
        out = F.normalize(out, dim=-1)
    return np.ascontiguousarray(out.numpy(), dtype=np.float32)
