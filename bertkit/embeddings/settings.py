"""What an embedding is made of, decided once: which layers, how they combine, how the tokens pool,
whether the vectors are normalised, and at what length the texts are cut.

- Layers: the *layer strategies* of the feature-based approach (Devlin et al. 2019, section 5.3,
  Table 7): the embedding output, one hidden layer, or the sum / concatenation of several
  (`STRATEGIES`, `resolve_layers` -> `LayerSpec`); google-research/bert's `extract_features.py`
  writes any layer list (default -1,-2,-3,-4).
- Pooling, one value: a sentence vector (`SENTENCE_POOLINGS`: the tokens' mean, their maximum or
  [CLS], computed by `bertkit.model.modeling.pool_sentence`), one vector per input word ("words"),
  or one per token (None, written `none` on the command line). `AUTO` ("auto") takes the model's own.
- `resolve_output`: the one place where the model's sentence-transformers layout
  (`bertkit.model.sentence_layout`) fills what the caller left to it: "auto" pooling becomes the
  layout's (else mean), normalize None the layout's (sentence vectors only), and sentence vectors
  get the layout's max_seq_length as their default length.
- `EmbedOptions`: the options `bertkit embed` and `bertkit serve` share, defined once.

No torch here: the command line builds its options from this module before torch is loaded. The
computations live in `bertkit.embeddings.pooling`.

Legend: L encoder layers; `hidden_states` is the model's tuple of L+1 tensors [B, T, H]; index 0 is
the embedding output, index L the last layer, negative indices count from the end as in Python.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from bertkit.errors import BertkitError, say_cut as warn_cut
from bertkit.model.sentence_layout import SENTENCE_POOLINGS, SentenceLayout

# The layer strategies of the paper's Table 7, by the names our API uses.
# Each maps the number of encoder layers L to (hidden_states indices, combine).
STRATEGIES = {
    "first": lambda L: ((0,), "sum"),  # the embedding output ("First Layer")
    "last": lambda L: ((L,), "sum"),
    # The paper's "Weighted Sum All 12 Layers" sums the encoder layers, not the embeddings (its sums are
    # weighted, with weights it does not give; ours are plain sums).
    "sum_all": lambda L: (tuple(range(1, L + 1)), "sum"),
    "second_to_last": lambda L: ((L - 1,), "sum"),
    "sum_last_four": lambda L: (tuple(range(L - 3, L + 1)), "sum"),
    # extract_features.py's order: -1, -2, -3, -4 (the last layer first).
    "concat_last_four": lambda L: (tuple(range(L, L - 4, -1)), "concat"),
}
# Paper Table 7, dev F1 on CoNLL-2003 with BERT-Base features and a BiLSTM tagger.
PAPER_NER_F1 = {
    "first": 91.0,
    "last": 94.9,
    "sum_all": 95.5,
    "second_to_last": 95.6,
    "sum_last_four": 95.9,
    "concat_last_four": 96.1,
}
COMBINES = ("sum", "mean", "concat")  # how a list of layers is merged (bertkit.embeddings.pooling.combine_layers)

AUTO = "auto"  # the pooling the model's sentence-transformers layout names, else mean
SENTENCE_CHOICES = (AUTO, *SENTENCE_POOLINGS)  # the poolings that give one vector per text: the model's, or one named
POOLINGS = (*SENTENCE_POOLINGS, "words", None)  # None: one vector per token
TOKENS_ON_THE_COMMAND_LINE = "none"  # how a command line, which has no None, writes "one vector per token"


# --- layer strategies --------------------------------------------------------


@dataclass(frozen=True)
class LayerSpec:
    """Which hidden states to take (0 = embeddings .. L = last) and how to merge them."""

    indices: tuple
    combine: str = "sum"

    def dim(self, hidden_size: int) -> int:
        return hidden_size * len(self.indices) if self.combine == "concat" else hidden_size


def _strategy(name: str, num_layers: int, combine: str | None) -> LayerSpec:
    indices, default_combine = STRATEGIES[name](num_layers)
    if combine is not None and combine != default_combine:
        raise BertkitError(
            f"layer strategy {name!r} already fixes how layers are combined ({default_combine}); "
            "pass a list of layer indices to choose --combine yourself"
        )
    if min(indices) < 0:
        raise BertkitError(f"layer strategy {name!r} needs at least 4 layers; this model has {num_layers}")
    return LayerSpec(tuple(indices), default_combine)


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
            return _strategy(text, num_layers, combine)
        try:
            layers = [int(part) for part in text.split(",")]
        except ValueError:
            raise BertkitError(
                f"unknown layer strategy {layers!r}: use one of {', '.join(STRATEGIES)} "
                "or a comma-separated list of layer indices such as -1,-2"
            ) from None
    if isinstance(layers, numbers.Integral):
        layers = [int(layers)]
    if isinstance(layers, (bytes, dict)) or not hasattr(layers, "__iter__"):
        raise BertkitError(f"layers must be a strategy name ({', '.join(STRATEGIES)}), a layer index or a list of "
                           f"indices, got {layers!r}")
    layers = list(layers)
    if not layers:
        raise BertkitError("the layer list is empty: give at least one layer index")
    out = []
    for index in layers:
        if not isinstance(index, numbers.Integral) or isinstance(index, bool):
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


# --- pooling, normalisation, length: the layout's defaults -------------------------------------


@dataclass(frozen=True)
class Output:
    """What one text becomes, decided: `pooling` one of SENTENCE_POOLINGS (one vector), "words" (one
    per input word) or None (one per token); `normalize` each vector to unit length; `length` the
    layout's max_seq_length for sentence vectors (their default window, where longer texts are
    truncated), None otherwise (the model's positions)."""

    pooling: str | None
    normalize: bool
    length: int | None

    @property
    def sentence(self) -> bool:
        """One fixed-size vector per text (rows stack into one [N, D] array)."""
        return self.pooling in SENTENCE_POOLINGS


def resolve_output(layout: SentenceLayout | None, pooling=AUTO, normalize: bool | None = None) -> Output:
    """The caller's pooling and normalize on top of the model's sentence-transformers `layout` (None:
    a plain encoder, mean and not normalised): "auto" pooling is the layout's, normalize None is the
    layout's for sentence vectors (no for words and tokens), and sentence vectors are cut at the
    layout's max_seq_length unless a length is asked for."""
    if pooling != AUTO and pooling not in POOLINGS:
        raise BertkitError(f"unknown pooling {pooling!r}: use auto (the model's), {', '.join(SENTENCE_POOLINGS)}, "
                           "words, or None (per-token vectors; `none` on the command line)")
    if pooling == AUTO:
        pooling = layout.pooling if layout is not None else "mean"
        if pooling not in SENTENCE_POOLINGS:
            raise BertkitError(f"the model's sentence-transformers layout pools with {pooling!r}, which bertkit does "
                               f"not compute: ask for one of {', '.join(SENTENCE_POOLINGS)} (--pooling)")
    sentence = pooling in SENTENCE_POOLINGS
    if normalize is None:
        normalize = sentence and layout is not None and layout.normalize
    length = layout.max_seq_length if sentence and layout is not None else None
    return Output(pooling, bool(normalize), length)


WINDOWS = ("as sentence-transformers cuts a text at its max_seq_length: truncate=False (embed --no-truncate) reads "
           "them whole, in windows")
STATIC = ("where the static model's folder cuts a text (its max_length, as model2vec and sentence-transformers read "
          "it): truncate=False (embed --no-truncate) averages every token")


def say_cut(cut: int, seen: int, length: int, asked: bool, why: str = WINDOWS) -> None:
    """Warn, once per run (`bertkit.errors.say_cut`'s line), that `cut` of `seen` texts were truncated at `length`
    tokens where the cut was not `asked` for (the layout's max_seq_length, a static folder's max_length: `why`):
    sentence-transformers cuts them silently. A cut asked for (truncate=True) is known: nothing is said."""
    if not asked:
        warn_cut([("texts", cut, seen)], length, why, stacklevel=3)


def word_pooling_for(word_pooling: str | None, output: Output) -> str:
    """How a word's pieces make its vector (None: their mean); asked for beside vectors that are not per word,
    it would change nothing, so it is refused."""
    if word_pooling is not None and output.pooling != "words":
        raise BertkitError(f"word_pooling={word_pooling!r} (--word-pooling) says how a word's pieces make its vector, "
                           f"and these vectors are not per word (pooling={output.pooling!r}): pass pooling='words' "
                           "(--pooling words), or leave it out")
    return word_pooling or "mean"


# --- the options embed and serve share ----------------------------------------------------------


@dataclass
class EmbedOptions:
    """What `bertkit embed` and `bertkit serve` take from the encoder, defined once (`bertkit.options`
    makes the flags). `pooling` holds None for per-token vectors, which the command line writes `none`."""

    layers: str = dataclasses.field(default="last", metadata={
        "help": "layer strategy: first, last, sum_all, second_to_last, sum_last_four, concat_last_four, or layer "
        "indices like -1,-2 (0 = embedding output, -1 = last layer; --layers -1,-2 or --layers=-1,-2)"})
    combine: str | None = dataclasses.field(default=None, metadata={
        "choices": list(COMBINES), "help": "how a list of layers is merged (default concat)"})
    pooling: str | None = dataclasses.field(default=AUTO, metadata={
        "choices": [AUTO, *SENTENCE_POOLINGS, "words", TOKENS_ON_THE_COMMAND_LINE],
        "help": "one vector per text from the tokens' mean, maximum or [CLS] (auto: the model's "
        "sentence-transformers layout, else mean); embed also writes one per word (words: BERT's, punctuation and CJK ideographs "
        "apart) or per token "
        "(none)"})
    normalize: bool | None = dataclasses.field(default=None, metadata={
        "help": "L2-normalise every vector (default: as the model's sentence-transformers layout says, else no; "
        "the server's /embed: yes, as text-embeddings-inference)"})

    def __post_init__(self):
        if self.pooling == TOKENS_ON_THE_COMMAND_LINE:
            self.pooling = None
