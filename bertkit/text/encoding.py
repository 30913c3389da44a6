"""One encoded input, [CLS] A [SEP] (B [SEP]), built from the tokens of its texts.

The input layout of google-research/bert `run_classifier.convert_single_example`,
with the extras of Hugging Face's BertTokenizerFast that fine-tuning needs
(character offsets, word ids, overflowing windows). From the paper (section 3,
Figure 2): [CLS] opens every input because its final vector is what a classifier
reads; [SEP] closes each segment; token_type_ids (segment embeddings) say which
tokens belong to A (0) and which to B (1), since a pair is one sequence to the
model; attention_mask is 0 on [PAD], so padding changes no real token's vector.

Shapes (one Encoding, T tokens): input_ids, token_type_ids, attention_mask,
word_ids, sequence_ids: [T]; offsets: [T] pairs (start, end) of character
indices into the ORIGINAL text of the token's own segment, (0, 0) for [CLS],
[SEP] and [PAD]. A Segment is one text's tokens before the special tokens are
added (T_s). A BatchEncoding stacks B encodings into [B, T] tensors or arrays.

`tok` below is the Tokenizer (its special ids and id -> token table);
truncation is `bertkit.text.truncation`. torch is imported only for
return_tensors="pt".
"""

from dataclasses import asdict, dataclass, field

from bertkit.errors import BertkitError
from bertkit.text.truncation import STRATEGIES, truncate

MODEL_MAX_LENGTH = 512  # BERT's position embeddings


@dataclass(slots=True)
class Encoding:
    """One encoded input: a single text or a pair, all lists of length T."""

    input_ids: list[int]
    token_type_ids: list[int]
    attention_mask: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int] = field(default_factory=list)
    overflowing: list["Encoding"] = field(default_factory=list)
    # whether truncation cut the text (or the pair) here: the model reads it cut, its tokens past max_length unread
    # (with return_overflowing they come back in `overflowing`). Who reads the encoding counts the inputs read cut
    # from it, without a second tokenization to find them (a reranker's pairs: `bertkit.tasks.rerank`)
    truncated: bool = field(default=False, compare=False)

    def __len__(self) -> int:
        return len(self.input_ids)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["truncated"]  # the fields of transformers' encoding (`bertkit tokenize --json`)
        d["offsets"] = [list(o) for o in self.offsets]
        return d


@dataclass(slots=True)
class Segment:
    """The tokens of one text before special tokens are added (T_s tokens)."""

    ids: list[int]
    starts: list[int]
    ends: list[int]
    word_ids: list[int]

    def __len__(self):
        return len(self.ids)

    def window(self, a: int, b: int) -> "Segment":
        return Segment(self.ids[a:b], self.starts[a:b], self.ends[a:b], self.word_ids[a:b])


class BatchEncoding(dict):
    """input_ids / token_type_ids / attention_mask as [B, T] tensors, arrays or lists.

    `.encodings` keeps the per-row Encoding (tokens, offsets, word ids...). With
    overflowing windows, rows are flattened and "overflow_to_sample_mapping"
    gives each row's input index.
    """

    def __init__(self, data: dict, encodings: list[Encoding]):
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device) -> "BatchEncoding":
        """Move the tensors to `device`, in place, and return the batch (as transformers' does):
        `model(**tok.encode_batch(texts).to("cuda"))`. Only tensors move (return_tensors="pt")."""
        for name, value in self.items():
            if not hasattr(value, "to"):  # duck-typed: this module stays free of torch
                raise BertkitError(f"only a batch of torch tensors moves (return_tensors='pt'); {name} is "
                                   f"{type(value).__name__}")
        for name in list(self):
            self[name] = self[name].to(device)
        return self


def num_special_tokens(pair: bool = False) -> int:
    return 3 if pair else 2


def check_options(max_length, truncation, strategy, padding, stride, add_special_tokens, has_pair, batch,
                  pad_to_multiple_of=None) -> dict:
    """The encoding options checked once, as the keywords of `assemble` (padding for the batch)."""
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise BertkitError(f"max_length must be an int, got {type(max_length).__name__}")
    n_special = num_special_tokens(has_pair) if add_special_tokens else 0
    if max_length > MODEL_MAX_LENGTH:
        raise BertkitError(
            f"max_length={max_length} is above {MODEL_MAX_LENGTH}, the most positions BERT has; "
            f"use max_length <= {MODEL_MAX_LENGTH} (and stride/return_overflowing for long texts)"
        )
    if max_length < max(n_special, 1):
        raise BertkitError(
            f"max_length={max_length} cannot even hold the {n_special} special tokens "
            f"([CLS] A [SEP]{' B [SEP]' if has_pair else ''}); use max_length > {n_special}"
        )
    if strategy not in STRATEGIES:
        raise BertkitError(f"truncation_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if strategy == "only_second" and truncation and not has_pair:
        raise BertkitError("truncation_strategy='only_second' needs a pair (the second text)")
    allowed = ("longest", "max_length", False, None) if batch else ("max_length", False, None)
    if padding is True:
        padding = "longest" if batch else False
    if padding not in allowed:
        raise BertkitError(f"padding must be one of {allowed}, got {padding!r}")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 0:
        raise BertkitError(f"stride must be a non-negative int, got {stride!r}")
    if pad_to_multiple_of is not None:
        if isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
            raise BertkitError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r} "
                               "(e.g. 8, for tensor cores)")
        if not padding:
            raise BertkitError("pad_to_multiple_of needs padding ('longest' or 'max_length'): without it no row "
                               "is padded, so there is nothing to round up")
        if truncation and max_length % pad_to_multiple_of:  # transformers refuses it too
            raise BertkitError(f"max_length={max_length} is not a multiple of pad_to_multiple_of={pad_to_multiple_of}: "
                               "rows cut at max_length could not be padded to a multiple without going past it; "
                               f"use max_length={max_length // pad_to_multiple_of * pad_to_multiple_of or pad_to_multiple_of}")
    return dict(
        max_length=max_length,
        truncation=bool(truncation),
        strategy=strategy,
        padding=padding or False,
        pad_to_multiple_of=pad_to_multiple_of,
        stride=stride,
        add_special_tokens=bool(add_special_tokens),
    )


def padded_length(length: int, multiple: int | None) -> int:
    """`length` rounded up to a multiple of `multiple` (None: as it is), as transformers' pad_to_multiple_of:
    the padded length, the longest row's or max_length, is rounded; truncation still cuts at max_length."""
    return length if not multiple else -(-length // multiple) * multiple


def assemble(tok, a: Segment, b: Segment | None, return_overflowing, *, max_length, truncation, strategy, padding,
             stride, add_special_tokens, pad_to_multiple_of=None) -> Encoding:
    """The Encoding of a (and b), truncated to max_length, with its overflowing windows if asked."""
    # the special tokens are never cut: truncation works on what is left
    n_special = num_special_tokens(b is not None) if add_special_tokens else 0
    if truncation:
        wa, wb = truncate(a, b, max_length - n_special, strategy, stride)
    else:
        wa, wb = [a], [b]
    pad_to = padded_length(max_length, pad_to_multiple_of) if padding == "max_length" else None
    main = build(tok, wa[0], wb[0], add_special_tokens, pad_to)
    # `truncate` hands back a segment it keeps whole as itself (a head `encode` read of a long text holds more than
    # the budget: it is cut, as the whole text would be)
    main.truncated = wa[0] is not a or (b is not None and wb[0] is not b)
    if return_overflowing:
        # the order of the `tokenizers` library: each window of A with B's main
        # part and then with B's other windows; then A's main part with B's windows
        combos = [(x, y) for x in wa[1:] for y in wb] + [(wa[0], y) for y in wb[1:]]
        main.overflowing = [build(tok, x, y, add_special_tokens, pad_to) for x, y in combos]
    return main


def build(tok, a: Segment, b: Segment | None, add_special_tokens, pad_to: int | None) -> Encoding:
    """[CLS] A [SEP] (B [SEP]) with its segment ids, mask, offsets and word ids; padded to `pad_to` tokens."""
    cls_id, sep_id = tok.cls_token_id, tok.sep_token_id
    # [CLS] and [SEP] come from no character of the text: offsets (0, 0),
    # no word, no sequence, as in BertTokenizerFast
    if add_special_tokens:
        ids = [cls_id, *a.ids, sep_id]
        offsets = [(0, 0), *zip(a.starts, a.ends), (0, 0)]
        word_ids = [None, *a.word_ids, None]
        seq_ids = [None] + [0] * len(a) + [None]
        special = [1] + [0] * len(a) + [1]
    else:
        ids = list(a.ids)
        offsets = list(zip(a.starts, a.ends))
        word_ids = list(a.word_ids)
        seq_ids = [0] * len(a)
        special = [0] * len(a)
    types = [0] * len(ids)
    if b is not None:
        ids += b.ids
        offsets += zip(b.starts, b.ends)
        word_ids += b.word_ids
        seq_ids += [1] * len(b)
        special += [0] * len(b)
        if add_special_tokens:
            ids.append(sep_id)
            offsets.append((0, 0))
            word_ids.append(None)
            seq_ids.append(None)
            special.append(1)
        types += [1] * (len(ids) - len(types))  # B and its closing [SEP] are segment 1
    mask = [1] * len(ids)  # every real token is attended; only padding gets 0
    enc = Encoding(ids, types, mask, [], offsets, word_ids, seq_ids, special)
    if pad_to is not None:
        pad(enc, pad_to, tok)
    itos = tok.ids_to_tokens
    enc.tokens = [itos[i] for i in enc.input_ids]
    return enc


def pad(enc: Encoding, length: int, tok) -> None:
    """Append the tokenizer's [PAD] up to `length`: masked out (attention 0), segment 0, special, no offsets."""
    n = length - len(enc.input_ids)
    if n <= 0:
        return
    enc.input_ids += [tok.pad_token_id] * n
    enc.token_type_ids += [0] * n
    enc.attention_mask += [0] * n
    enc.offsets += [(0, 0)] * n
    enc.word_ids += [None] * n
    enc.sequence_ids += [None] * n
    enc.special_tokens_mask += [1] * n
    if enc.tokens:
        enc.tokens += [tok.ids_to_tokens[tok.pad_token_id]] * n


def batch(tok, segments_a, segments_b, opts: dict, return_overflowing, return_tensors) -> BatchEncoding:
    """Encodings of the pairs (a, b), padded as opts["padding"] says, stacked as [B, T] rows."""
    opts = dict(opts)
    padding_mode = opts.pop("padding")
    encodings, mapping = [], []
    for i, (a, b) in enumerate(zip(segments_a, segments_b)):
        enc = assemble(tok, a, b, return_overflowing, padding=False, **opts)
        rows = [enc, *enc.overflowing] if return_overflowing else [enc]
        encodings += rows
        mapping += [i] * len(rows)
    target = opts["max_length"] if padding_mode == "max_length" else max((len(e) for e in encodings), default=0)
    target = padded_length(target, opts["pad_to_multiple_of"]) if padding_mode else target
    if padding_mode:
        for e in encodings:
            pad(e, target, tok)
    longer = next((i for i, e in enumerate(encodings) if len(e) > target), None)
    if longer is not None and return_tensors is not None:  # only truncation=False leaves one
        raise BertkitError(f"padding='max_length' with truncation=False: row {longer} has {len(encodings[longer])} "
                           f"tokens, more than max_length={target}, so the rows cannot form one [B, T] tensor; "
                           "use truncation=True, padding='longest' or return_tensors=None")
    rows = {
        "input_ids": [e.input_ids for e in encodings],
        "token_type_ids": [e.token_type_ids for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
    }
    data = as_tensors(rows, return_tensors)
    if not encodings and return_tensors is not None:  # no text: still [B, T], 0 x T (a list of nothing was [0])
        data = {k: v.reshape(0, target) for k, v in data.items()}
    if return_overflowing:
        data.update(as_tensors({"overflow_to_sample_mapping": mapping}, return_tensors))
    return BatchEncoding(data, encodings)


def as_tensors(data: dict, return_tensors) -> dict:
    """Lists of rows as torch ("pt") or numpy ("np") int64 arrays, or left as lists (None)."""
    if return_tensors == "pt":
        import torch

        return {k: torch.tensor(v, dtype=torch.long) for k, v in data.items()}
    if return_tensors == "np":
        import numpy as np

        return {k: np.array(v, dtype=np.int64) for k, v in data.items()}
    return data
