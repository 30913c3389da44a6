"""Feature extraction: contextual vectors from a frozen BERT.

The feature-based approach of the BERT paper (Devlin et al. 2019, section 5.3,
Table 7) feeds the activations of a pre-trained, *frozen* encoder to a task
model instead of fine-tuning it. Which activations matters: the paper compares
the embedding output, single hidden layers and sums/concatenations of the last
four, and google-research/bert's `extract_features.py` writes any layer list
(default -1,-2,-3,-4). This module turns one forward pass into

- token vectors   [T, D]  per text, from a *layer strategy* (see `STRATEGIES`),
- word vectors    [W, D]  the word pieces of each input word pooled together,
- sentence vectors [D]    [CLS] or the attention-masked mean (sentence-transformers'
                          pooling), optionally L2-normalised.

Legend: B batch, T tokens (with [CLS]/[SEP]), H hidden size, L encoder layers,
D output size (H, or k*H for a concatenation of k layers). `hidden_states` is the
model's tuple of L+1 tensors [B, T, H]; index 0 is the embedding output, index L
the last layer, negative indices count from the end as in Python.

Inputs longer than the model's 512 positions are cut into overlapping windows
(`stride` tokens shared by consecutive windows, default half a window) and
each token keeps the vector from the window where it has the most context on
both sides: the "max context" rule of `run_squad.py` (`bertkit.windows`).
For a sentence vector of a windowed text the [CLS] comes from the first window
and the [SEP] from the last, so a text that fits in one window gives exactly
the one-pass result.

`iter_embed` streams: it reads texts lazily in chunks, sorts each chunk by
length so that batches carry little padding, runs the batches, and yields the
results back in input order; the writers (.npy, .safetensors, .jsonl) consume
that stream without holding every vector in memory.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from bertkit.checkpoint import resolve
from bertkit.electra import class_for
from bertkit.errors import BertkitError
from bertkit.fast import accelerate, resolve_device, resolve_dtype
from bertkit.modeling import BertModel
from bertkit.quantization import has_quantized_weights, is_quantized, load_quantized, quantize
from bertkit.textfiles import existing_file, open_text
from bertkit.tokenizer import Tokenizer
from bertkit.windows import half_window, max_context_owner, spans

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
COMBINES = ("sum", "mean", "concat")
POOLINGS = ("mean", "cls", "words", None)
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
    """Turn a strategy name, an index or a list of indices into a LayerSpec.

    Indices run over the L+1 hidden states: 0 is the embedding output, L the
    last layer, -1 also the last. A list is combined with `combine` (default
    "concat", as extract_features.py writes every requested layer).
    """
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


# --- the model and tokenizer -------------------------------------------------------


def from_pretrained(path=None):
    """(BertModel, Tokenizer) from a model directory; None: the default model with its vocabulary.
    An ELECTRA directory (e.g. a pre-training run's discriminator) gives an ElectraModel: the same
    outputs (no pooler; [CLS] and mean pooling read the token vectors)."""
    directory = resolve(path)
    if has_quantized_weights(directory):  # saved by bertkit.quantization.save_quantized
        return load_quantized(BertModel, directory), Tokenizer.from_pretrained(directory)
    return class_for(directory, BertModel).from_pretrained(directory), Tokenizer.from_pretrained(directory)


@functools.lru_cache(maxsize=2)
def _load_dir(path: str | None, device: torch.device, dtype: torch.dtype, int8: bool = False):
    # cached: embedding many small inputs one call at a time should not reload the weights
    model, tok = from_pretrained(path)
    model = model.eval().to(device, dtype)
    if int8 and not is_quantized(model):
        model = quantize(model)  # before accelerate: see bertkit.quantization
    return accelerate(model), tok  # loaded here for inference only


def load_model(model=None, device=None, dtype=None, int8: bool = False):
    """(model, tokenizer) from None (the default model), a directory, or a loaded pair.

    device: "auto" (the GPU if torch sees one), "cpu" or "cuda"; dtype: "float32" or
    "bfloat16". None means auto / float32 for a model loaded here, and leaves a loaded
    pair where it is; given, a loaded pair's model is moved there (in place).
    int8: quantize the encoder's dense layers (`bertkit.quantization`; CPU and float32 only,
    so device auto means the CPU); a loaded pair's model is quantized in place.
    """
    if int8 and device in (None, "auto"):
        device = "cpu"
    if model is None or isinstance(model, (str, Path)):
        if model is not None and not Path(model).is_dir():
            raise BertkitError(f"model directory {model} does not exist: pass a directory with config.json")
        where = resolve_device(device)
        return _load_dir(None if model is None else str(Path(model).resolve()), where, resolve_dtype(dtype, where),
                         int8)
    if isinstance(model, tuple) and len(model) == 2:
        net, tok = model
        if device is not None or dtype is not None:
            where = resolve_device(device) if device is not None else _device_of(net)
            net.to(where, resolve_dtype(dtype, where) if dtype is not None else None)
        if int8 and not is_quantized(net):
            net = accelerate(quantize(net))
        return net, tok
    raise BertkitError(
        "model must be None (the default model), a model directory, or a (model, tokenizer) pair; "
        f"got {type(model).__name__}"
    )


def _device_of(model) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _max_positions(model) -> int:
    config = getattr(model, "config", None)
    return int(getattr(config, "max_position_embeddings", 512))


def _num_layers(model) -> int:
    return int(model.config.num_hidden_layers)


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


def _encode(tok, text, pair, max_length: int, truncate: bool) -> _Item:
    if isinstance(text, (list, tuple)):
        if not all(isinstance(w, str) for w in text):
            raise BertkitError("a pre-split text must be a list of strings (words)")
        text, words = _word_spans(text)
    elif isinstance(text, str):
        words = None
    else:
        raise BertkitError(f"expected a string (or a list of words), got {type(text).__name__}")
    if not text.strip():
        raise BertkitError("cannot embed an empty text: every input needs at least one non-space character")
    if pair is not None and not str(pair).strip():
        raise BertkitError("the second segment (pair) is empty: drop it or give it some text")
    # without truncation the tokenizer returns the whole text, however long; _pieces windows it
    enc = tok.encode(text, pair, max_length=max_length, truncation=truncate)
    if len(enc.input_ids) <= 2:
        raise BertkitError(f"text {text[:40]!r} yields no tokens: it holds only characters BERT drops")
    if words is None:
        words = whitespace_spans(text)
    token_words = _token_words(enc.offsets, enc.sequence_ids, words)
    item = _Item(text, pair, list(enc.input_ids), list(enc.token_type_ids), token_words, len(words))
    return item


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
    return [
        _Piece(item_index, k, [cls_id, *content[s:e], sep_id], [0] * (e - s + 2))
        for k, (s, e) in enumerate(item.windows)
    ]


def _stitch(item: _Item, window_vectors: list) -> np.ndarray:
    """Token vectors of a windowed text: [CLS] from the first window, [SEP] from the last."""
    if item.windows is None:
        return window_vectors[0]
    rows = [window_vectors[0][0]]
    for position, k in enumerate(max_context_owner(item.windows, len(item.ids) - 2)):
        rows.append(window_vectors[k][1 + position - item.windows[k][0]])
    rows.append(window_vectors[-1][-1])
    return np.stack(rows)


# --- the forward pass ---------------------------------------------------------------------


def run_batch(model, pieces: list, spec: LayerSpec, pad_id: int = 0) -> list:
    """Run one padded batch and return each piece's token vectors [T_i, D] (float32 numpy).

    `pieces` are anything with `input_ids` and `token_type_ids` lists ([CLS]/[SEP]
    included): the windows of `iter_embed`, or the rows `bertkit serve` batches.
    """
    width = max(len(p.input_ids) for p in pieces)
    ids = torch.full((len(pieces), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(pieces), width), dtype=torch.long)
    mask = torch.zeros((len(pieces), width), dtype=torch.long)
    for row, p in enumerate(pieces):
        n = len(p.input_ids)
        ids[row, :n] = torch.tensor(p.input_ids)
        types[row, :n] = torch.tensor(p.token_type_ids)
        mask[row, :n] = 1
    need_all = spec.indices != (_num_layers(model),)
    device = _device_of(model)
    ids, types, mask = ids.to(device), types.to(device), mask.to(device)
    with torch.inference_mode():
        out = model(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=need_all)
        if need_all:
            vectors = combine_layers(out.hidden_states, spec)
        else:
            vectors = out.last_hidden_state
        vectors = vectors.float().cpu().numpy()
    return [vectors[row, : len(p.input_ids)] for row, p in enumerate(pieces)]


def pool_sentence(tokens: np.ndarray, pooling: str) -> np.ndarray:
    """A text's sentence vector [D] from its token vectors [T, D] (real tokens only, no padding):
    their mean ("mean", sentence-transformers' pooling) or the [CLS] vector ("cls")."""
    return tokens.mean(axis=0) if pooling == "mean" else tokens[0]


def _finish(item: _Item, tokens: np.ndarray, pooling, normalize: bool, word_pooling: str):
    if pooling in ("mean", "cls"):
        out = pool_sentence(tokens, pooling)  # every stitched position is a real token
    elif pooling == "words":
        out = pool_words(tokens, item.token_words, item.n_words, word_pooling)
    else:
        out = tokens
    out = np.ascontiguousarray(out, dtype=np.float32)
    return l2_normalize(out) if normalize else out


def _check_pooling(pooling):
    if pooling in ("none", "tokens"):
        pooling = None
    if pooling not in POOLINGS:
        raise BertkitError(f"unknown pooling {pooling!r}: use mean, cls, words or none (per-token vectors)")
    return pooling


def iter_embed(
    texts: Iterable,
    model=None,
    layers="last",
    pooling="mean",
    normalize: bool = False,
    *,
    pairs: Iterable | None = None,
    combine: str | None = None,
    word_pooling: str = "mean",
    batch_size: int = 32,
    max_length: int | None = None,
    stride: int | None = None,
    truncate: bool = False,
    chunk_size: int = 1024,
    progress: bool = False,
    total: int | None = None,
    device=None,
    dtype=None,
    int8: bool = False,
) -> Iterator[np.ndarray]:
    """Yield one result per text, in input order, reading `texts` lazily.

    Texts are taken `chunk_size` at a time; within a chunk the forward-pass rows
    (texts, or windows of long texts) are sorted by length so each batch of
    `batch_size` carries little padding. See `embed` for the arguments.
    """
    net, tok = load_model(model, device, dtype, int8)
    pooling = _check_pooling(pooling)
    spec = resolve_layers(layers, _num_layers(net), combine)
    limit = _max_positions(net)
    max_length = limit if max_length is None else max_length
    if not 3 <= max_length <= limit:
        raise BertkitError(f"max_length {max_length} must be between 3 and the model's {limit} positions")
    stride = half_window(max_length - 2) if stride is None else stride
    spans(0, max_length - 2, stride)  # a bad stride is refused before any text is read
    if batch_size < 1:
        raise BertkitError(f"batch_size must be at least 1, got {batch_size}")
    pad_id = getattr(tok, "pad_token_id", 0) or 0

    was_training = net.training
    net.eval()  # dropout off: features are deterministic
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="text", desc="embed")
    source = zip(texts, pairs) if pairs is not None else ((t, None) for t in texts)
    try:
        while True:
            chunk = list(itertools.islice(source, chunk_size))
            if not chunk:
                break
            items = [_encode(tok, text, pair, max_length, truncate) for text, pair in chunk]
            pieces = [p for i, item in enumerate(items) for p in _pieces(i, item, max_length, stride)]
            order = sorted(range(len(pieces)), key=lambda k: len(pieces[k].input_ids))
            results = [[None] * (len(it.windows) if it.windows else 1) for it in items]
            shown = 0
            for b in range(0, len(order), batch_size):
                batch = [pieces[k] for k in order[b : b + batch_size]]
                for piece, vectors in zip(batch, run_batch(net, batch, spec, pad_id)):
                    results[piece.item][piece.window] = vectors
                if bar is not None:  # texts of the chunk, in proportion to the rows done
                    done = len(chunk) * min(b + batch_size, len(order)) // len(order)
                    bar.update(done - shown)
                    shown = done
            for item, windows in zip(items, results):
                yield _finish(item, _stitch(item, windows), pooling, normalize, word_pooling)
    finally:
        net.train(was_training)
        if bar is not None:
            bar.close()


def embed(
    texts,
    model=None,
    layers="last",
    pooling="mean",
    normalize: bool = False,
    **options,
):
    """Embed texts with a frozen BERT; a numpy float32 array, one row per text.

    texts:     a string, a list of strings, or a list of pre-split word lists
               (word vectors then align to those words).
    model:     None (the default model), a model directory, or a (model, tokenizer) pair.
    layers:    a strategy name (first, last, sum_all, second_to_last,
               sum_last_four, concat_last_four), a layer index, or a list of
               indices (0 = embeddings .. L = last, -1 = last) merged by
               `combine=` sum | mean | concat (default concat).
    pooling:   "mean" (masked mean over the tokens, [CLS]/[SEP] included, as
               sentence-transformers), "cls", "words" (one vector per input word,
               pieces pooled by `word_pooling=` mean | first) or None (per-token).
    normalize: L2-normalise each output vector.
    options:   pairs=, combine=, word_pooling=, batch_size=32, max_length=512
               (window size), stride= tokens shared by consecutive windows
               (default: half a window, (max_length-2) - (max_length-2)//2),
               truncate=False (cut at max_length instead of windowing),
               progress=False, device= auto | cpu | cuda, dtype= float32 |
               bfloat16, int8=False (int8 dense layers, `bertkit.quantization`)
               (see `load_model`).

    Returns [N, D] for pooled vectors of a list, [D] for a single string;
    with pooling None or "words" a list of [T_i, D] / [W_i, D] arrays (one
    array for a single string).
    """
    single = isinstance(texts, str)
    if single:
        texts = [texts]
        if options.get("pairs") is not None and isinstance(options["pairs"], str):
            options["pairs"] = [options["pairs"]]
    elif not isinstance(texts, (list, tuple)):
        texts = list(texts)
    if len(texts) == 0:
        raise BertkitError("no texts to embed: pass a string or a non-empty list of strings")
    if options.get("pairs") is not None and len(options["pairs"]) != len(texts):
        raise BertkitError(f"{len(texts)} texts but {len(options['pairs'])} pairs: give one pair per text")
    options.setdefault("total", len(texts))
    rows = list(iter_embed(texts, model, layers, pooling, normalize, **options))
    pooled = _check_pooling(pooling) in ("mean", "cls")
    if single:
        return rows[0]
    return np.stack(rows) if pooled else rows


# --- writers --------------------------------------------------------------------------------


def _safetensors_header(tensors: dict) -> bytes:
    """The JSON header of a .safetensors file; tensors: name -> (dtype, shape, nbytes), in data order."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format asks for 8-byte alignment of the data
    return struct.pack("<Q", len(raw)) + raw


def write_vectors(rows: Iterable[np.ndarray], path, pooled: bool, texts: Sequence | None = None) -> int:
    """Stream results into `path` by its suffix; returns the number of rows written.

    .npy          pooled vectors only: one [N, D] float32 array.
    .safetensors  pooled: tensor "embeddings" [N, D]; per-token/word: "vectors"
                  [sum T_i, D] with "offsets" [N+1] (rows of text i are
                  offsets[i]:offsets[i+1]).
    .jsonl        one JSON object per text: {"index", "embedding"} or {"index", "vectors"}
                  (plus "text" when `texts` is given).

    The .npy and .safetensors writers spool rows to a temporary file first, so
    memory stays flat however many texts stream through.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".safetensors", ".jsonl"):
        raise BertkitError(f"unknown output format {path.name!r}: use a .npy, .safetensors or .jsonl file name")
    if suffix == ".npy" and not pooled:
        raise BertkitError(
            "per-token and per-word vectors have a different length for each text and do not fit one .npy "
            "array: write them to .safetensors or .jsonl, or choose --pooling mean/cls"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        n = 0
        with path.open("w", encoding="utf-8") as out:
            for i, row in enumerate(rows):
                record = {"index": i}
                if texts is not None:
                    record["text"] = texts[i]
                record["embedding" if pooled else "vectors"] = np.round(row.astype(np.float64), 7).tolist()
                out.write(json.dumps(record) + "\n")
                n += 1
        return n

    spool = path.with_name(path.name + ".part")
    lengths, dim = [], None
    try:
        with spool.open("wb") as raw:
            for row in rows:
                row = np.ascontiguousarray(row, dtype="<f4")
                dim = row.shape[-1]
                lengths.append(1 if row.ndim == 1 else row.shape[0])
                raw.write(row.tobytes())
        if dim is None:
            raise BertkitError("nothing to write: the input holds no texts")
        total = sum(lengths)
        with path.open("wb") as out, spool.open("rb") as raw:
            if suffix == ".npy":
                np.lib.format.write_array_header_1_0(
                    out, {"descr": "<f4", "fortran_order": False, "shape": (total, dim)}
                )
                _copy(raw, out)
            else:
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
                if pooled:
                    tensors = {"embeddings": ("F32", (total, dim), total * dim * 4)}
                else:
                    tensors = {
                        "vectors": ("F32", (total, dim), total * dim * 4),
                        "offsets": ("I64", (len(offsets),), offsets.nbytes),
                    }
                out.write(_safetensors_header(tensors))
                _copy(raw, out)
                if not pooled:
                    out.write(offsets.tobytes())
    finally:
        spool.unlink(missing_ok=True)
    return len(lengths)


def _copy(src, dst, block: int = 1 << 22) -> None:
    while True:
        data = src.read(block)
        if not data:
            return
        dst.write(data)


def read_texts(path, column: str | None = None) -> tuple:
    """(an iterator over the texts of a file, how many there are), without loading them all.

    .txt (or anything else): one text per non-empty line. .jsonl: the "text"
    field (or `column`) of each line. .tsv: the column named `column` (default
    "sentence", else "text", else the first) under a header row. The file must
    be UTF-8 (`bertkit.textfiles`); a malformed line is an error naming it.
    """
    path = existing_file(path)
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        with open_text(path) as f:
            header = f.readline().rstrip("\r\n").split("\t")
        name = column or next((c for c in ("sentence", "text") if c in header), header[0])
        if name not in header:
            raise BertkitError(f"{path} has no column {name!r}; its columns are {', '.join(header)}")
        col = header.index(name)

        def lines():
            with open_text(path) as f:
                f.readline()
                for number, line in enumerate(f, 2):
                    if line.strip():
                        fields = line.rstrip("\r\n").split("\t")
                        if col >= len(fields):
                            raise BertkitError(f"{path}:{number}: {len(fields)} field(s), no {name!r} column "
                                               f"(the header has {len(header)})")
                        yield fields[col]

    elif suffix == ".jsonl":
        key = column or "text"

        def lines():
            with open_text(path) as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise BertkitError(f"{path}:{number}: not a JSON object ({err.msg}); "
                                           "JSONL needs one object per line") from None
                    if not isinstance(record, dict) or key not in record:
                        raise BertkitError(f"{path}:{number}: no field {key!r} in this line's object: set --column")
                    yield record[key]

    else:

        def lines():
            with open_text(path) as f:
                for line in f:
                    if line.strip():
                        yield line.rstrip("\r\n")

    count = sum(1 for _ in lines())
    return lines(), count
