"""Pooling: how the encoder's outputs become the vectors a user asks for.

Three poolings, each a small function over numpy or torch arrays:

- across layers, the *layer strategies* of the feature-based approach (Devlin et
  al. 2019, section 5.3, Table 7): the embedding output, one hidden layer, or the
  sum / concatenation of several (`STRATEGIES`, `resolve_layers`, `combine_layers`);
  google-research/bert's `extract_features.py` writes any layer list (default
  -1,-2,-3,-4);
- across word pieces, one vector per input word (`pool_words`: the mean of its
  pieces, or the first piece as the paper's NER tagger uses);
- across tokens, one vector per text (`pool_sentence`: the attention-masked mean,
  sentence-transformers' pooling, or the [CLS] vector), optionally L2-normalised.

`pool` is the last step of `bertkit.embeddings.features.iter_embed` for one text: the sentence
vector, the word vectors or the tokens, normalised or not.

The settings `bertkit embed` and `bertkit serve` share (layer strategy, how layers
combine, sentence pooling, normalisation) are defined once, `bertkit.options.EmbedOptions`.
Pooling and normalisation default to what the model's sentence-transformers layout
says (`bertkit.model.sentence_layout`), else mean and none.

Legend: B batch, T tokens (with [CLS]/[SEP]), H hidden size, L encoder layers,
D output size (H, or k*H for a concatenation of k layers). `hidden_states` is the
model's tuple of L+1 tensors [B, T, H]; index 0 is the embedding output, index L
the last layer, negative indices count from the end as in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from bertkit.errors import BertkitError
from bertkit.options import COMBINES, SENTENCE_POOLINGS

# The layer strategies of the paper's Table 7, by the names our API uses.
# Each maps the number of encoder layers L to (hidden_states indices, combine).
STRATEGIES = {
    "first": lambda L: ((0,), "sum"),  # the embedding output ("First Layer")
    "last": lambda L: ((L,), "sum"),
    # "Sum All 12 Layers" in the paper sums the encoder layers, not the embeddings.
    "sum_all": lambda L: (tuple(range(1, L + 1)), "sum"),
    "second_to_last": lambda L: ((L - 1,), "sum"),
    "sum_last_four": lambda L: (tuple(range(L - 3, L + 1)), "sum"),
    # extract_features.py's order: -1, -2, -3, -4 (the last layer first).
    "concat_last_four": lambda L: (tuple(range(L, L - 4, -1)), "concat"),
}
POOLINGS = (*SENTENCE_POOLINGS, "words", None)
# Paper Table 7, dev F1 on CoNLL-2003 with BERT-Base features and a BiLSTM tagger.
PAPER_NER_F1 = {
    "first": 91.0,
    "last": 94.9,
    "sum_all": 95.5,
    "second_to_last": 95.6,
    "sum_last_four": 95.9,
    "concat_last_four": 96.1,
}


# --- layer strategies --------------------------------------------------------


@dataclass(frozen=True)
class LayerSpec:
    """Which hidden states to take (0 = embeddings .. L = last) and how to merge them."""

    indices: tuple
    combine: str = "sum"

    def dim(self, hidden_size: int) -> int:
        return hidden_size * len(self.indices) if self.combine == "concat" else hidden_size


def resolve_layers(layers, num_layers: int, combine: str | None = None) -> LayerSpec:
    """Turn a strategy name, an index or a list of indices into a LayerSpec (a LayerSpec is kept).

    Indices run over the L+1 hidden states: 0 is the embedding output, L the
    last layer, -1 also the last. A list is combined with `combine` (default
    "concat", as extract_features.py writes every requested layer).
    """
    if isinstance(layers, LayerSpec):
        return layers
    n_states = num_layers + 1
    if isinstance(layers, str):
        text = layers.strip()
        if text in STRATEGIES:
            indices, default_combine = STRATEGIES[text](num_layers)
            if combine is not None and combine != default_combine:
                raise BertkitError(
                    f"layer strategy {text!r} already fixes how layers are combined ({default_combine}); "
                    "pass a list of layer indices to choose --combine yourself"
                )
            if min(indices) < 0:
                raise BertkitError(f"layer strategy {text!r} needs at least 4 layers; this model has {num_layers}")
            return LayerSpec(tuple(indices), default_combine)
        try:
            layers = [int(part) for part in text.split(",")]
        except ValueError:
            raise BertkitError(
                f"unknown layer strategy {layers!r}: use one of {', '.join(STRATEGIES)} "
                "or a comma-separated list of layer indices such as -1,-2"
            ) from None
    if isinstance(layers, (int, np.integer)):
        layers = [int(layers)]
    layers = list(layers)
    if not layers:
        raise BertkitError("the layer list is empty: give at least one layer index")
    out = []
    for index in layers:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise BertkitError(f"layer index {index!r} is not an integer")
        if not -n_states <= index < n_states:
            raise BertkitError(
                f"layer index {index} is out of range: this model has {num_layers} layers, so indices run "
                f"from 0 (the embedding output) to {num_layers} (the last layer), or -{n_states}..-1"
            )
        out.append(int(index) % n_states)
    combine = combine or "concat"
    if combine not in COMBINES:
        raise BertkitError(f"unknown combine {combine!r}: use one of {', '.join(COMBINES)}")
    return LayerSpec(tuple(out), combine)


def combine_layers(hidden_states: Sequence[torch.Tensor], spec: LayerSpec) -> torch.Tensor:
    """The strategy's vectors: L+1 tensors [B, T, H] -> [B, T, D]."""
    picked = [hidden_states[i] for i in spec.indices]
    if len(picked) == 1:
        return picked[0]
    if spec.combine == "concat":
        return torch.cat(picked, dim=-1)  # [B, T, k*H]
    total = torch.stack(picked, dim=0).sum(dim=0)  # [B, T, H]
    return total / len(picked) if spec.combine == "mean" else total


# --- pooling -------------------------------------------------------------------


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (norms below 1e-12 are taken as 1e-12, as torch does)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def pool_words(token_vectors: np.ndarray, token_words: Sequence, n_words: int, how: str = "mean") -> np.ndarray:
    """Pool word pieces into word vectors: [T, D] -> [W, D].

    `token_words[t]` is the index of the input word token t belongs to, or None
    for [CLS]/[SEP]/pieces outside every word. `how` is "mean" (all pieces) or
    "first" (the first piece, as the paper's NER tagger uses). A word that yields
    no piece at all (say, only control characters) gets a zero vector.
    """
    if how not in ("mean", "first"):
        raise BertkitError(f"unknown word pooling {how!r}: use 'mean' or 'first'")
    out = np.zeros((n_words, token_vectors.shape[-1]), dtype=token_vectors.dtype)
    counts = np.zeros(n_words, dtype=np.int64)
    for t, w in enumerate(token_words):
        if w is None:
            continue
        if how == "first" and counts[w]:
            continue
        out[w] += token_vectors[t]
        counts[w] += 1
    if how == "mean":
        out /= np.maximum(counts, 1)[:, None]
    return out


def pool_sentence(tokens: np.ndarray, pooling: str) -> np.ndarray:
    """A text's sentence vector [D] from its token vectors [T, D] (real tokens only, no padding):
    their mean ("mean", sentence-transformers' pooling), their element-wise maximum ("max") or the
    [CLS] vector ("cls")."""
    if pooling == "mean":
        return tokens.mean(axis=0)
    return tokens.max(axis=0) if pooling == "max" else tokens[0]


def pool(tokens: np.ndarray, pooling, normalize: bool, token_words: Sequence = (), n_words: int = 0,
         word_pooling: str = "mean") -> np.ndarray:
    """One text's output from its token vectors [T, D], float32: a sentence vector [D] (a sentence
    pooling), word vectors [W, D] ("words", with the text's `token_words` and `n_words`) or the
    tokens themselves (None); each vector L2-normalised when `normalize`."""
    if pooling in SENTENCE_POOLINGS:
        out = pool_sentence(tokens, pooling)
    elif pooling == "words":
        out = pool_words(tokens, token_words, n_words, word_pooling)
    else:
        out = tokens
    out = np.ascontiguousarray(out, dtype=np.float32)
    return l2_normalize(out) if normalize else out
