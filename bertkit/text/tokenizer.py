"""The BERT tokenizer: text -> [CLS] A [SEP] B [SEP] ids, segments, masks and offsets.

Ties the stages together, as google-research/bert `tokenization.FullTokenizer`
plus the input layout of `run_classifier.convert_single_example`, with the
extras of Hugging Face's BertTokenizerFast that fine-tuning needs (character
offsets, word ids, overflowing windows):

    text --basic_tokenizer--> words --wordpiece--> pieces --vocab--> ids
    encode: [CLS] A [SEP] (B [SEP]), truncated to max_length, padded

Shapes (one Encoding, T tokens): input_ids, token_type_ids, attention_mask,
word_ids, sequence_ids: [T]; offsets: [T] pairs (start, end) of character
indices into the ORIGINAL text of the token's own segment, (0, 0) for [CLS],
[SEP] and [PAD]. A BatchEncoding stacks B encodings into [B, T] tensors or
arrays.

The layout, from the paper (section 3, Figure 2): [CLS] opens every input
because its final vector is what a classifier reads; [SEP] closes each
segment; token_type_ids (segment embeddings) say which tokens belong to A (0)
and which to B (1), since a pair is one sequence to the model; attention_mask
is 0 on [PAD], so padding changes no real token's vector.

Speed (a word cache, worker processes for big batches, a paused garbage
collector) lives in `tokenizer_speed`; this module is what is computed.

Truncation follows the `tokenizers` library (the reference of the parity
tests): longest_first gives each segment its share at once (the shorter keeps
its length when it fits, else both get half and the longer one, or the second
when they tie, the odd token), where the original `_truncate_seq_pair` pops one
token at a time from the longer (ties: the first gets the odd token); with
stride, overflowing windows share `stride` tokens (`bertkit.text.windows`).

torch is imported only inside encode_batch(return_tensors="pt").
"""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertkit.text.basic_tokenizer import basic_words, coarse_split_pattern
from bertkit.errors import BertkitError
from bertkit.data.textfiles import read_text
from bertkit.text.tokenizer_speed import IdsCache, TokenizerWorkers, WordCache, choose_num_workers, gc_paused, token_ids
from bertkit.text.vocab import (CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, load_vocab, save_vocab, tokens_from_text,
                           tokens_from_tokenizer_json)
from bertkit.text.windows import spans
from bertkit.text.wordpiece import CONTINUATION, wordpiece_spans
from bertkit.default_model import default_model_dir

MODEL_MAX_LENGTH = 512  # BERT's position embeddings


def _flag_or_unset(value) -> bool | None:
    return None if value is None else bool(value)


# a Hugging Face tokenizer_config.json key -> our constructor's argument and its type (a null
# strip_accents is unset: it follows the casing; a null do_lower_case is false, as in transformers)
_CONFIG_KEYS = {
    "do_lower_case": ("lowercase", bool),
    "strip_accents": ("strip_accents", _flag_or_unset),
    "tokenize_chinese_chars": ("tokenize_chinese_chars", bool),
    "max_input_chars_per_word": ("max_input_chars_per_word", int),
}

STRATEGIES = ("longest_first", "only_first", "only_second")


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

    def __len__(self) -> int:
        return len(self.input_ids)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["offsets"] = [list(o) for o in self.offsets]
        return d


@dataclass(slots=True)
class _Segment:
    """The tokens of one text before special tokens are added (T_s tokens)."""

    ids: list[int]
    starts: list[int]
    ends: list[int]
    word_ids: list[int]

    def __len__(self):
        return len(self.ids)

    def window(self, a: int, b: int) -> "_Segment":
        return _Segment(self.ids[a:b], self.starts[a:b], self.ends[a:b], self.word_ids[a:b])


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



def _check_text(text, what: str) -> str:
    if not isinstance(text, str):
        raise BertkitError(
            f"{what} must be a str, got {type(text).__name__}"
            + (" (use encode_batch for a list of texts)" if isinstance(text, (list, tuple)) else "")
        )
    return text


class Tokenizer:
    """BERT's WordPiece tokenizer (see the module docstring).

    vocab_file: a vocab.txt, a directory holding one, or the list of tokens;
    lowercase: lower-case the text (uncased vocabularies); strip_accents: None
    follows lowercase, as in the original; max_input_chars_per_word: longer
    words become [UNK]; tokenize_chinese_chars: split CJK ideographs apart.
    """

    def __init__(
        self,
        vocab_file,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        max_input_chars_per_word: int = 100,
        tokenize_chinese_chars: bool = True,
    ):
        tokens = vocab_file if isinstance(vocab_file, list) else load_vocab(vocab_file)
        if not isinstance(max_input_chars_per_word, int) or max_input_chars_per_word < 1:
            raise BertkitError(f"max_input_chars_per_word must be a positive int, got {max_input_chars_per_word!r}")
        self.ids_to_tokens: list[str] = list(tokens)
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self.ids_to_tokens)}
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self.max_input_chars_per_word = max_input_chars_per_word
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        _check_casing(self.ids_to_tokens, self.lowercase)

        self.pad_token_id = self.vocab[PAD]
        self.unk_token_id = self.vocab[UNK]
        self.cls_token_id = self.vocab[CLS]
        self.sep_token_id = self.vocab[SEP]
        self.mask_token_id = self.vocab[MASK]
        self.all_special_ids = [self.vocab[t] for t in SPECIAL_TOKENS]
        self.all_special_tokens = list(SPECIAL_TOKENS)
        self._special_re = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))
        self._max_piece_len = max(len(t[2:]) if t.startswith(CONTINUATION) else len(t) for t in tokens)
        self._pattern = coarse_split_pattern()
        self._cache = WordCache()
        self._ids_cache = IdsCache()
        self._workers = None

    # --- loading and saving ---------------------------------------------------

    @classmethod
    def from_pretrained(cls, path=None, **overrides) -> "Tokenizer":
        """Load from a model directory (vocab.txt, or a tokenizer.json's WordPiece vocabulary, +
        tokenizer_config.json) or a vocab.txt.

        None: the default model's vocabulary. Settings come from
        tokenizer_config.json (HF keys: do_lower_case, strip_accents,
        tokenize_chinese_chars, max_input_chars_per_word); `overrides` (same
        names as the constructor) may not contradict the stored casing.
        """
        if path is None:
            path = default_model_dir()
        path = Path(path)
        if path.is_dir():
            folder, vocab_file = path, path / "vocab.txt"
        elif path.is_file():
            folder, vocab_file = path.parent, path
        else:
            raise BertkitError(f"no tokenizer at {path}: pass a model directory holding vocab.txt, or a vocab.txt")
        hf_json = not vocab_file.is_file() and (folder / "tokenizer.json").is_file()
        if hf_json:
            vocab_file = folder / "tokenizer.json"
        elif not vocab_file.is_file():
            raise BertkitError(f"{folder} has no vocab.txt; pass a model directory or a vocab.txt file")
        config_file = folder / "tokenizer_config.json"
        config_text = read_text(config_file, "tokenizer config") if config_file.is_file() else "{}"
        text = read_text(vocab_file, "tokenizer file" if hf_json else "vocabulary file")
        tokens = (tokens_from_tokenizer_json if hf_json else tokens_from_text)(text, str(vocab_file))
        try:
            config = json.loads(config_text)
        except json.JSONDecodeError as err:
            raise BertkitError(f"{config_file} is not valid JSON ({err})") from None
        if not isinstance(config, dict):
            raise BertkitError(f"{config_file} must hold a JSON object of settings, got {type(config).__name__}")
        settings = {name: kind(config[key]) for key, (name, kind) in _CONFIG_KEYS.items() if key in config}
        for key, value in overrides.items():
            if key not in ("lowercase", "strip_accents", "max_input_chars_per_word", "tokenize_chinese_chars"):
                raise BertkitError(f"unknown tokenizer setting {key!r}")
            if key == "lowercase" and "lowercase" in settings and bool(value) != settings["lowercase"]:
                raise BertkitError(
                    f"casing mismatch: {config_file} says do_lower_case={settings['lowercase']} but "
                    f"lowercase={value} was asked; a vocabulary only works with the casing it was built for"
                )
            settings[key] = value
        return cls(tokens, **settings)

    def save_pretrained(self, directory) -> Path:
        """Write vocab.txt and tokenizer_config.json (Hugging Face keys) into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_vocab(self.ids_to_tokens, directory / "vocab.txt")
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "model_max_length": MODEL_MAX_LENGTH,
            "pad_token": PAD,
            "unk_token": UNK,
            "cls_token": CLS,
            "sep_token": SEP,
            "mask_token": MASK,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return directory

    def __len__(self) -> int:
        return len(self.ids_to_tokens)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={len(self)}, lowercase={self.lowercase}, strip_accents={self.strip_accents}, "
            f"max_input_chars_per_word={self.max_input_chars_per_word})"
        )

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_workers"] = None
        state["_cache"] = WordCache()
        state["_ids_cache"] = IdsCache()
        state["_pattern"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pattern = coarse_split_pattern()

    # --- tokens and ids ---------------------------------------------------------

    def _analyse(self, run: str):
        """Pieces of one run of text between safe boundaries: (ids, starts, ends, word_ids, n_words).

        Character spans and word indices are relative to the run. The two stages
        of google's FullTokenizer: basic_words (clean, lower-case, strip accents,
        split punctuation and CJK) gives the words and where each character came
        from; wordpiece_spans cuts each word greedily, longest piece first. A
        word with no cover is one [UNK] over the whole word, as in the original.
        """
        ids, starts, ends, wids = [], [], [], []
        words = basic_words(run, self.lowercase, self.strip_accents, self.tokenize_chinese_chars)
        for w, (word, origin) in enumerate(words):
            spans = wordpiece_spans(word, self.vocab, self.max_input_chars_per_word, self._max_piece_len)
            if spans is None:
                ids.append(self.unk_token_id)
                starts.append(origin[0])
                ends.append(origin[-1] + 1)
                wids.append(w)
                continue
            for a, b in spans:
                piece = word[a:b] if a == 0 else CONTINUATION + word[a:b]
                ids.append(self.vocab[piece])
                starts.append(origin[a])
                ends.append(origin[b - 1] + 1)
                wids.append(w)
        return ids, starts, ends, wids, len(words)

    def _segment(self, text: str) -> _Segment:
        """Token ids, character spans and word ids of one text (no special tokens)."""
        ids, starts, ends, wids = [], [], [], []
        nw = 0
        # Special tokens written in the text ("[MASK]") stay whole, as in
        # BertTokenizerFast: the text is cut around them and each is one word.
        if "[" in text and self._special_re.search(text):
            pos = 0
            parts = []
            for m in self._special_re.finditer(text):
                parts.append((pos, m.start(), None))
                parts.append((m.start(), m.end(), self.vocab[m.group()]))
                pos = m.end()
            parts.append((pos, len(text), None))
        else:
            parts = ((0, len(text), None),)
        # Runs between safe boundaries never share a word, so each run's pieces
        # (computed once by _analyse, then cached) are shifted to its position.
        cache = self._cache
        for lo, hi, special_id in parts:
            if special_id is not None:
                ids.append(special_id)
                starts.append(lo)
                ends.append(hi)
                wids.append(nw)
                nw += 1
                continue
            for m in self._pattern.finditer(text, lo, hi):
                run = m.group()
                entry = cache.get(run)
                if entry is None:
                    entry = cache.add(run, self._analyse)
                if entry.__class__ is int:
                    s, e = m.span()
                    ids.append(entry)
                    starts.append(s)
                    ends.append(e)
                    wids.append(nw)
                    nw += 1
                else:
                    eids, es, ee, ew, n = entry
                    off = m.start()
                    ids += eids
                    starts += [off + x for x in es]
                    ends += [off + x for x in ee]
                    wids += [nw + x for x in ew]
                    nw += n
        return _Segment(ids, starts, ends, wids)

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without [CLS]/[SEP]: "unaffable" -> ["un", "##aff", "##able"]."""
        _check_text(text, "text")
        itos = self.ids_to_tokens
        return [itos[i] for i in self._segment(text).ids]

    def ids_batch(self, texts) -> tuple[list[int], list[int]]:
        """The ids of each text without [CLS]/[SEP], concatenated, and each text's count: what a
        static embedding table averages (`bertkit.text.tokenizer_speed.token_ids`, the fast path)."""
        texts = texts if isinstance(texts, list) else list(texts)
        for i, text in enumerate(texts):
            _check_text(text, f"text {i}")
        return token_ids(self, texts)

    def convert_tokens_to_ids(self, tokens) -> list[int]:
        """Ids of tokens; a token not in the vocabulary maps to [UNK]'s id."""
        if isinstance(tokens, str):
            raise BertkitError("convert_tokens_to_ids takes a list of tokens, got a str (wrap it in a list)")
        unk = self.unk_token_id
        return [self.vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids) -> list[str]:
        """Tokens of ids; an id outside the vocabulary is an error."""
        out = []
        n = len(self.ids_to_tokens)
        for i in _as_int_list(ids, "ids"):
            if not 0 <= i < n:
                raise BertkitError(f"token id {i} is outside the vocabulary (ids 0..{n - 1})")
            out.append(self.ids_to_tokens[i])
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text from ids: tokens joined by spaces, `##` pieces glued to the previous one.

        Lower-casing, accent stripping and the original spacing are not
        recoverable; "Hello, world!" decodes to "hello , world !".
        """
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            special = set(self.all_special_tokens)
            tokens = [t for t in tokens if t not in special]
        return " ".join(tokens).replace(" " + CONTINUATION, "").strip()

    # --- encoding ---------------------------------------------------------------

    def num_special_tokens(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int = MODEL_MAX_LENGTH,
        truncation: bool = True,
        truncation_strategy: str = "longest_first",
        padding=False,
        stride: int = 0,
        return_overflowing: bool = False,
        add_special_tokens: bool = True,
    ) -> Encoding:
        """Encode a text (or a pair) as [CLS] A [SEP] (B [SEP]).

        truncation: cut to max_length (<= 512) with truncation_strategy;
        padding: False or "max_length"; stride/return_overflowing: the cut-off
        tokens come back as further windows in `.overflowing`, each repeating
        `stride` tokens of the previous window (QA and long documents).
        """
        _check_text(text, "text")
        if pair is not None:
            _check_text(pair, "pair")
        opts = self._check_options(
            max_length, truncation, truncation_strategy, padding, stride, add_special_tokens, pair is not None, False
        )
        a = self._segment(text)
        b = self._segment(pair) if pair is not None else None
        return self._assemble(a, b, return_overflowing, **opts)

    def _check_options(self, max_length, truncation, strategy, padding, stride, add_special_tokens, has_pair, batch):
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise BertkitError(f"max_length must be an int, got {type(max_length).__name__}")
        n_special = self.num_special_tokens(has_pair) if add_special_tokens else 0
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
        return dict(
            max_length=max_length,
            truncation=bool(truncation),
            strategy=strategy,
            padding=padding or False,
            stride=stride,
            add_special_tokens=bool(add_special_tokens),
        )

    def _windows(self, seg: _Segment, keep: int, stride: int) -> list[_Segment]:
        """seg cut into windows of `keep` tokens sharing `stride` (the first is the kept part)."""
        if keep >= len(seg):
            return [seg]
        if keep == 0:
            # no room at all (max_length == the special tokens): windows of zero
            # tokens cannot advance, so the text is dropped. (`tokenizers` returns
            # the whole text as one overflow, longer than max_length.)
            return [seg.window(0, 0)]
        return [seg.window(a, b) for a, b in spans(len(seg), keep, stride)]

    def _truncate(self, a: _Segment, b: _Segment | None, max_length, strategy, stride):
        """Lists of windows for a and b; element 0 of each is the truncated segment."""
        n_a, n_b = len(a), len(b) if b is not None else 0
        if n_a + n_b <= max_length:
            return [a], [b]
        to_remove = n_a + n_b - max_length
        # longest_first cuts where there is most to spare, so a short question
        # keeps all its tokens next to a long context (the usual pair).
        if strategy == "longest_first":
            if b is None:
                return self._windows(a, max_length, stride), [None]
            short, long_ = min(n_a, n_b), max(n_a, n_b)
            keep_short = short
            keep_long = long_ if short > max_length else max(short, max_length - short)
            if keep_short + keep_long > max_length:
                # both are too long: split the budget, the longer segment gets the odd token
                keep_short = max_length // 2
                keep_long = keep_short + max_length % 2
            keep_a, keep_b = (keep_short, keep_long) if n_a <= n_b else (keep_long, keep_short)
            return self._windows(a, keep_a, stride), self._windows(b, keep_b, stride)
        target, name = (a, "first") if strategy == "only_first" else (b, "second")
        if len(target) <= to_remove:
            other = n_a + n_b - len(target)
            raise BertkitError(
                f"cannot truncate only the {name} text: the other text alone has {other} tokens, leaving no room "
                f"in the {max_length} tokens max_length allows after the special tokens; use "
                "truncation_strategy='longest_first' or a larger max_length"
            )
        windows = self._windows(target, len(target) - to_remove, stride)
        return (windows, [b]) if strategy == "only_first" else ([a], windows)

    def _assemble(self, a, b, return_overflowing, *, max_length, truncation, strategy, padding, stride,
                  add_special_tokens) -> Encoding:
        # the special tokens are never cut: truncation works on what is left
        n_special = (self.num_special_tokens(b is not None) if add_special_tokens else 0)
        budget = max_length - n_special
        if truncation:
            wa, wb = self._truncate(a, b, budget, strategy, stride)
        else:
            wa, wb = [a], [b]
        main = self._build(wa[0], wb[0], add_special_tokens, padding, max_length)
        if return_overflowing:
            # the order of the `tokenizers` library: each window of A with B's main
            # part and then with B's other windows; then A's main part with B's windows
            combos = [(x, y) for x in wa[1:] for y in wb] + [(wa[0], y) for y in wb[1:]]
            main.overflowing = [self._build(x, y, add_special_tokens, padding, max_length) for x, y in combos]
        return main

    def _build(self, a: _Segment, b: _Segment | None, add_special_tokens, padding, max_length) -> Encoding:
        """[CLS] A [SEP] (B [SEP]) with its segment ids, mask, offsets and word ids."""
        cls_id, sep_id = self.cls_token_id, self.sep_token_id
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
        if padding == "max_length":
            _pad(enc, max_length, self.pad_token_id)
        itos = self.ids_to_tokens
        enc.tokens = [itos[i] for i in enc.input_ids]
        return enc

    def encode_batch(
        self,
        texts,
        pairs=None,
        *,
        max_length: int = MODEL_MAX_LENGTH,
        truncation: bool = True,
        truncation_strategy: str = "longest_first",
        padding="longest",
        stride: int = 0,
        return_overflowing: bool = False,
        add_special_tokens: bool = True,
        return_tensors: str | None = "pt",
        num_workers: int | None = None,
    ) -> BatchEncoding:
        """Encode many texts (and pairs) at once: padded [B, T] tensors plus the Encodings.

        padding: "longest" (in the batch), "max_length" or False (then
        return_tensors must be None: rows differ in length). num_workers:
        processes to spread the tokenization over (None: all cores, up to 8,
        for batches of 2M+ characters, else 1). Results are identical.
        """
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise BertkitError(
                f"encode_batch needs a list of str, got {type(texts).__name__}"
                + (" (use encode for a single text)" if isinstance(texts, str) else "")
            )
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]")
        if pairs is not None:
            if isinstance(pairs, str) or not isinstance(pairs, (list, tuple)):
                raise BertkitError(f"pairs must be a list of str (one per text), got {type(pairs).__name__}")
            if len(pairs) != len(texts):
                raise BertkitError(f"got {len(texts)} texts but {len(pairs)} pairs; give one pair per text")
            for i, t in enumerate(pairs):
                _check_text(t, f"pairs[{i}]")
        if return_tensors not in ("pt", "np", None):
            raise BertkitError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        opts = self._check_options(
            max_length, truncation, truncation_strategy, padding, stride, add_special_tokens, pairs is not None, True
        )
        if opts["padding"] is False and return_tensors is not None and len(texts) > 1:
            raise BertkitError("return_tensors needs equal-length rows: use padding='longest' or 'max_length'")
        with gc_paused():  # see tokenizer_speed
            return self._encode_batch(texts, pairs, opts, return_overflowing, return_tensors, num_workers)

    def _encode_batch(self, texts, pairs, opts, return_overflowing, return_tensors, num_workers) -> BatchEncoding:
        max_length = opts["max_length"]
        segments = self._segments_many(list(texts) + (list(pairs) if pairs is not None else []), num_workers)
        seg_a = segments[: len(texts)]
        seg_b = segments[len(texts):] if pairs is not None else [None] * len(texts)
        padding_mode = opts.pop("padding")
        encodings, mapping = [], []
        for i, (a, b) in enumerate(zip(seg_a, seg_b)):
            enc = self._assemble(a, b, return_overflowing, padding=False, **opts)
            rows = [enc, *enc.overflowing] if return_overflowing else [enc]
            encodings += rows
            mapping += [i] * len(rows)
        if padding_mode:
            target = max_length if padding_mode == "max_length" else max((len(e) for e in encodings), default=0)
            for e in encodings:
                _pad(e, target, self.pad_token_id)
        data = {
            "input_ids": [e.input_ids for e in encodings],
            "token_type_ids": [e.token_type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_overflowing:
            data["overflow_to_sample_mapping"] = mapping
        if return_tensors == "pt":
            import torch

            data = {k: torch.tensor(v, dtype=torch.long) for k, v in data.items()}
        elif return_tensors == "np":
            import numpy as np

            data = {k: np.array(v, dtype=np.int64) for k, v in data.items()}
        return BatchEncoding(data, encodings)

    def _segments_many(self, texts: list[str], num_workers: int | None) -> list[_Segment]:
        """_segment of each text, in worker processes for big batches (tokenizer_speed)."""
        num_workers = choose_num_workers(texts, num_workers)
        if num_workers == 1 or len(texts) < 2:
            return [self._segment(t) for t in texts]
        if self._workers is None or self._workers.n != num_workers:
            self.close()
            self._workers = TokenizerWorkers(self, num_workers)
        return [_Segment(*parts) for parts in self._workers.segments(texts)]

    def close(self) -> None:
        """Stop the worker processes of encode_batch, if any (also done at exit)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None


def _pad(enc: Encoding, length: int, pad_id: int) -> None:
    """Append [PAD] up to `length`: masked out (attention 0), segment 0, special, no offsets."""
    n = length - len(enc.input_ids)
    if n <= 0:
        return
    enc.input_ids += [pad_id] * n
    enc.token_type_ids += [0] * n
    enc.attention_mask += [0] * n
    enc.offsets += [(0, 0)] * n
    enc.word_ids += [None] * n
    enc.sequence_ids += [None] * n
    enc.special_tokens_mask += [1] * n
    if enc.tokens:
        enc.tokens += [PAD] * n


def _as_int_list(ids, what: str) -> list[int]:
    if hasattr(ids, "tolist"):  # torch tensors and numpy arrays, without importing either
        ids = ids.tolist()
    if isinstance(ids, int) and not isinstance(ids, bool):
        return [ids]
    if not isinstance(ids, (list, tuple)):
        raise BertkitError(f"{what} must be a list of int, got {type(ids).__name__}")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise BertkitError(f"{what} must hold ints, found {i!r} ({type(i).__name__})")
    return list(ids)


def _check_casing(tokens: list[str], lowercase: bool) -> None:
    """Refuse an obvious cased/uncased mismatch between vocabulary and settings.

    Judged only on vocabularies of 1000+ tokens (handmade test vocabularies are
    too small to tell): a lower-casing tokenizer can never produce a token with
    capitals, so a vocabulary with many of them is cased; a cased vocabulary of
    English-like text always has some capitalised words.
    """
    words = [t for t in tokens if t.isalpha()]
    if len(tokens) < 1000 or len(words) < 500:
        return
    upper = sum(1 for t in words if t != t.lower())
    if lowercase and upper > 0.05 * len(words):
        raise BertkitError(
            f"casing mismatch: lowercase=True but the vocabulary looks cased ({upper} of {len(words)} words "
            "have capitals, which lower-cased text can never match); pass lowercase=False"
        )
    if not lowercase and upper == 0:
        raise BertkitError(
            "casing mismatch: lowercase=False but the vocabulary has no capitalised words (it looks uncased); "
            "pass lowercase=True"
        )


def format_encoding(tok: Tokenizer, enc: Encoding, text: str, pair: str | None = None) -> str:
    """A readable table of an encoding: position, token, id, segment, offsets, substring."""
    rows = [("pos", "token", "id", "seg", "word", "offsets", "text")]
    for i, (t, tid, seg, w, (s, e), sid) in enumerate(
        zip(enc.tokens, enc.input_ids, enc.token_type_ids, enc.word_ids, enc.offsets, enc.sequence_ids)
    ):
        source = text if sid == 0 else pair if sid == 1 else None
        sub = repr(source[s:e]) if source is not None else ""
        rows.append((str(i), t, str(tid), str(seg), "" if w is None else str(w), f"{s}:{e}" if sid is not None else "", sub))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines.append(f"{len(enc)} tokens, {enc.attention_mask.count(1)} attended")
    return "\n".join(lines)
