"""The BERT tokenizer: text -> [CLS] A [SEP] B [SEP] ids, segments, masks and offsets.

Ties the stages together, as google-research/bert `tokenization.FullTokenizer`
plus the input layout of `run_classifier.convert_single_example`, with the
extras of Hugging Face's BertTokenizerFast that fine-tuning needs (character
offsets, word ids, overflowing windows):

    text --basic_tokenizer--> words --wordpiece--> pieces --vocab--> ids
    encode: [CLS] A [SEP] (B [SEP]), truncated to max_length, padded

This module cuts texts into segments (ids, character spans, word ids of one
text: `_segment`); what an encoded input holds and how it is laid out
(shapes, [CLS]/[SEP], segment ids, padding) is `bertkit.text.encoding`, and
which tokens survive max_length is `bertkit.text.truncation`.

Speed (a word cache, worker processes for big batches, a paused garbage
collector) lives in `tokenizer_speed`; this module is what is computed.
"""

import json
import numbers
import re
from pathlib import Path

from bertkit.text.basic_tokenizer import basic_words, coarse_split_pattern
from bertkit.errors import BertkitError, int_at_least, switch
from bertkit.text.tokenizer_config import added_tokens, pipeline_settings, read_config, settings_from
from bertkit.text.truncation import pair_heads
from bertkit.text.tokenizer_speed import IdsCache, TokenizerWorkers, WordCache, choose_num_workers, gc_paused, token_ids
from bertkit.text.encoding import (MODEL_MAX_LENGTH, BatchEncoding, Encoding, Segment, assemble, batch, check_options,
                                   num_special_tokens)
from bertkit.text.vocab import (CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, check_added_tokens, check_casing, load_vocab,
                                no_vocabulary, read_vocab_file, save_vocab, validate_tokens)
from bertkit.text.wordpiece import CONTINUATION, wordpiece_spans
from bertkit.default_model import default_model_dir

# where `Tokenizer.head` may cut: BERT's ASCII whitespace (not str.split()'s \x1c-\x1f or \x85, which
# the cleaner drops, joining the characters around them into one word)
_CUT = re.compile("[ \t\n\r]")


def _check_cut(max_length, least: int) -> None:
    """A length to cut ids at (None: no cut): an int of at least `least`."""
    if max_length is not None:
        int_at_least(max_length, least, "max_length", says="None or an int >= {least}")


_BATCH = " (use encode_batch for a list of texts)"
_PAIRED = " (a text pair: give the second texts as pairs=[...], one per text)"  # the (a, b) of transformers


def _check_text(text, what: str, hint: str = _BATCH) -> str:
    """`text` if it is a str; else an error naming `what`, with `hint` for a list or tuple given in its place."""
    if not isinstance(text, str):
        raise BertkitError(
            f"{what} must be a str, got {type(text).__name__}" + (hint if isinstance(text, (list, tuple)) else "")
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
        if not isinstance(vocab_file, (list, tuple, str, Path)):
            raise BertkitError(f"vocab_file must be a vocab.txt, a folder holding one, or the list of tokens; "
                               f"got {type(vocab_file).__name__}")
        tokens = list(vocab_file) if isinstance(vocab_file, (list, tuple)) else load_vocab(vocab_file)
        int_at_least(max_input_chars_per_word, 1, "max_input_chars_per_word", says="a positive int")
        self.ids_to_tokens: list[str] = list(tokens)
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self.ids_to_tokens)}
        self.lowercase = switch(lowercase, "lowercase")  # "false" is a true str: it lowercased
        self.strip_accents = self.lowercase if strip_accents is None else switch(strip_accents, "strip_accents")
        self.max_input_chars_per_word = max_input_chars_per_word
        self.tokenize_chinese_chars = switch(tokenize_chinese_chars, "tokenize_chinese_chars")
        missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
        if missing:  # a file's tokens are checked as it is read (vocab.py); a list given here is not
            raise BertkitError(f"the vocabulary lacks the special token(s) {', '.join(missing)}: a BERT "
                               f"vocabulary needs all of {' '.join(SPECIAL_TOKENS)}")
        if isinstance(vocab_file, (list, tuple)):  # as strict as a file: a repeated token shifts every id
            validate_tokens(self.ids_to_tokens, "the token list")
        check_casing(self.ids_to_tokens, self.lowercase)

        self.pad_token_id = self.vocab[PAD]
        self.unk_token_id = self.vocab[UNK]
        self.cls_token_id = self.vocab[CLS]
        self.sep_token_id = self.vocab[SEP]
        self.mask_token_id = self.vocab[MASK]
        self.all_special_ids = [self.vocab[t] for t in SPECIAL_TOKENS]
        self.all_special_tokens = list(SPECIAL_TOKENS)
        self._special_re = re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))
        self._max_piece_len = max(len(t[2:]) if t.startswith(CONTINUATION) else len(t) for t in tokens)
        self._pattern = coarse_split_pattern(self.tokenize_chinese_chars)
        self._cache = WordCache()
        self._ids_cache = IdsCache()
        self._workers = None

    # --- loading and saving ---------------------------------------------------

    @classmethod
    def from_pretrained(cls, path=None, *, vocab_size: int | None = None, **overrides) -> "Tokenizer":
        """Load from a model directory (vocab.txt, or a tokenizer.json's WordPiece vocabulary, +
        tokenizer_config.json), a vocab.txt or a tokenizer.json.

        None: the default model's vocabulary. Settings come from
        tokenizer_config.json (HF keys: do_lower_case, strip_accents,
        tokenize_chinese_chars, max_input_chars_per_word), or where a tokenizer.json has none beside it,
        from its normalizer and model (`bertkit.text.tokenizer_config`); `overrides` (same
        names as the constructor) may not contradict the stored casing.
        vocab_size: the embedding rows of the model the vocabulary is read for (its config.json's
        vocab_size); a vocabulary with more tokens is refused, since its last ids would index past the
        table (an IndexError on the first text that uses them, a 500 in a server).
        """
        if path is None:
            path = default_model_dir()
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise BertkitError(f"no tokenizer at {path!r}: pass a model directory holding vocab.txt, or a vocab.txt")
        path = Path(path)
        if path.is_dir():
            folder, vocab_file = path, path / "vocab.txt"
        elif path.is_file():
            folder, vocab_file = path.parent, path
        else:
            raise BertkitError(f"no tokenizer at {path}: pass a model directory holding vocab.txt, or a vocab.txt")
        hf_json = vocab_file.suffix == ".json" or (not vocab_file.is_file() and (folder / "tokenizer.json").is_file())
        if hf_json and vocab_file.suffix != ".json":
            vocab_file = folder / "tokenizer.json"
        elif not vocab_file.is_file():
            raise BertkitError(no_vocabulary(folder))
        config, config_file = read_config(folder)
        text, tokens = read_vocab_file(vocab_file, hf_json)
        if vocab_size is not None and len(tokens) > vocab_size:
            raise BertkitError(f"{vocab_file} has {len(tokens)} tokens but config.json's vocab_size is "
                               f"{vocab_size}: the vocabulary does not belong to these weights; use the model's own "
                               "vocab.txt")
        for source, added in added_tokens(config, folder).items():
            check_added_tokens(added, tokens, source)
        settings = settings_from(config, config_file, SPECIAL_TOKENS)
        if hf_json and not config_file.is_file():  # the Rust tokenizer's own save: its pipeline says
            settings = pipeline_settings(json.loads(text), vocab_file)
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

    def save_pretrained(self, directory, positions: int = MODEL_MAX_LENGTH, settings: dict | None = None) -> Path:
        """Write vocab.txt and tokenizer_config.json (Hugging Face keys) into `directory`, each whole or not at all
        (`bertkit.text.vocab.save_vocab`); `positions`: the model's, when fewer than BERT's 512 (transformers'
        tokenizer cuts at model_max_length). `settings`: the tokenizer_config.json object to write instead of ours
        (an ONNX export copies its model's, keys and all). Not as `save_vocab_pair` (which removes the old vocab.txt
        first in a folder holding other files): fine-tuning saves each better epoch over the last one, and a stop
        there must leave the last model loadable; the pair, and the model's other files with it when a model is
        saved, replace the old ones together (`bertkit.data.atomic.saving`)."""
        directory = Path(directory)
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.lowercase,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "model_max_length": min(int(positions), MODEL_MAX_LENGTH),
            "pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "mask_token": MASK,
        }
        save_vocab(self.ids_to_tokens, directory / "vocab.txt", config if settings is None else settings)
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
        self._pattern = coarse_split_pattern(self.tokenize_chinese_chars)

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

    def _segment(self, text: str, specials: bool = True) -> Segment:
        """Token ids, character spans and word ids of one text (no [CLS]/[SEP] added); `specials`: a special
        token written in the text is that token (else it is text: "[", "mask", "]")."""
        ids, starts, ends, wids = [], [], [], []
        nw = 0
        # Special tokens written in the text ("[MASK]") stay whole, as in
        # BertTokenizerFast: the text is cut around them and each is one word.
        if specials and "[" in text and self._special_re.search(text):
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
        return Segment(ids, starts, ends, wids)

    def tokenize(self, text: str, split_special_tokens: bool = False) -> list[str]:
        """WordPiece tokens of `text`, without [CLS]/[SEP]: "unaffable" -> ["un", "##aff", "##able"].

        A special token written in the text ("[MASK]") is that token, as in transformers; with
        `split_special_tokens` (transformers' name) it is text like any other: "[", "mask", "]", as
        google-research/bert's tokenizer reads a pre-training corpus (`pretraining.shards`)."""
        _check_text(text, "text")
        itos = self.ids_to_tokens
        return [itos[i] for i in self._segment(text, not split_special_tokens).ids]

    def ids_batch(self, texts) -> tuple[list[int], list[int]]:
        """The ids of each text without [CLS]/[SEP], concatenated, and each text's count: what a
        static embedding table averages (`bertkit.text.tokenizer_speed.token_ids`, the fast path)."""
        if isinstance(texts, str):  # list("abc") would give one text per character
            raise BertkitError("ids_batch takes a list of texts, got a str (wrap it in a list)")
        texts = texts if isinstance(texts, list) else list(texts)
        for i, text in enumerate(texts):
            _check_text(text, f"text {i}", "")
        return token_ids(self, texts)

    def head(self, text: str, n: int) -> str:
        """A prefix of `text` whose word pieces are the first of `text`'s and more than `n` of them, else `text`.

        Every run the tokenizer reads lies between safe boundaries, and whitespace is one (`coarse_split_pattern`):
        the pieces of a prefix cut at a space, tab or line end are the whole text's first pieces. A text cut at
        `n` pieces, or refused past `n`, needs no more of itself, and the rest of a long one (a megabyte of it
        is a second of Python) is never tokenized. A text with no such whitespace past the first try is read whole."""
        size = 8 * n + 64  # characters: a piece spans about four in English prose
        while size < len(text):
            cut = _CUT.search(text, size)
            if cut is None:
                break
            end = cut.start()
            if self.ids_batch([text[:end]])[1][0] > n:
                return text[:end]
            size *= 4
        return text

    def ids_lists(self, texts, max_length: int | None = None) -> list:
        """`ids_batch` split per text: each text's ids without [CLS]/[SEP], cut at `max_length` when given
        (a long text tokenized only as far as its `head`)."""
        _check_cut(max_length, 0)
        if max_length is not None and not isinstance(texts, str):
            texts = [self.head(t, max_length) if isinstance(t, str) else t for t in texts]
        ids, lengths = self.ids_batch(texts)
        out, pos = [], 0
        for n in lengths:
            out.append(ids[pos : pos + (n if max_length is None else min(n, max_length))])
            pos += n
        return out

    def single_ids(self, texts, max_length: int | None = None, with_cut: bool = False) -> list:
        """`[CLS] text [SEP]` ids of each single text, as `encode` gives them (cut at `max_length`, the
        specials counted), through the ids-only batch path: no offsets or word ids, which a sentence
        vector or a text task's features do not read. with_cut: (ids, whether the text was cut) each, told
        by one piece read past the cut (its callers count the texts a model read cut, without a second pass)."""
        _check_cut(max_length, 2)  # room for [CLS] and [SEP], as in encode
        cut = None if max_length is None else max_length - 2
        read = self.ids_lists(texts, None if cut is None else cut + 1)
        ids = [[self.cls_token_id, *piece_ids[:cut], self.sep_token_id] for piece_ids in read]
        return list(zip(ids, [cut is not None and len(r) > cut for r in read])) if with_cut else ids

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
        return num_special_tokens(pair)

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
        pad_to_multiple_of: int | None = None,
    ) -> Encoding:
        """Encode a text (or a pair) as [CLS] A [SEP] (B [SEP]).

        truncation: cut to max_length (<= 512) with truncation_strategy (longest_first, without
        overflowing windows, reads a long text and its pair only as far as the cut needs: `head`,
        `bertkit.text.truncation.pair_heads`); padding: False or "max_length" (pad_to_multiple_of: that length
        rounded up to a multiple, as transformers'); stride/return_overflowing: the cut-off
        tokens come back as further windows in `.overflowing`, each repeating
        `stride` tokens of the previous window (QA and long documents).
        """
        _check_text(text, "text")
        if pair is not None:
            _check_text(pair, "pair")
        opts = check_options(
            max_length, truncation, truncation_strategy, padding, stride, add_special_tokens, pair is not None, False,
            pad_to_multiple_of)
        if opts["truncation"] and opts["strategy"] == "longest_first" and not return_overflowing:
            # the cut keeps no more of a long text than its head: the rest is never tokenized
            budget = max_length - (num_special_tokens(pair is not None) if add_special_tokens else 0)
            text, pair = (self.head(text, budget), None) if pair is None else pair_heads(self, text, pair, budget)
        a = self._segment(text)
        b = self._segment(pair) if pair is not None else None
        return assemble(self, a, b, return_overflowing, **opts)

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
        pad_to_multiple_of: int | None = None,
    ) -> BatchEncoding:
        """Encode many texts (and pairs) at once: padded [B, T] tensors plus the Encodings.

        padding: "longest" (in the batch), "max_length" or False (then
        return_tensors must be None: rows differ in length); pad_to_multiple_of: the padded
        length rounded up to a multiple of it (transformers' meaning; 8 suits GPU tensor cores). num_workers:
        processes to spread the tokenization over (None: all cores, up to 8,
        for batches of 2M+ characters, else 1). Results are identical.
        """
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise BertkitError(
                f"encode_batch needs a list of str, got {type(texts).__name__}"
                + (" (use encode for a single text)" if isinstance(texts, str) else "")
            )
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]", _PAIRED)
        if pairs is not None:
            if isinstance(pairs, str) or not isinstance(pairs, (list, tuple)):
                raise BertkitError(f"pairs must be a list of str (one per text), got {type(pairs).__name__}")
            if len(pairs) != len(texts):
                raise BertkitError(f"got {len(texts)} texts but {len(pairs)} pairs; give one pair per text")
            for i, t in enumerate(pairs):
                _check_text(t, f"pairs[{i}]")
        if return_tensors not in ("pt", "np", None):
            raise BertkitError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
        opts = check_options(
            max_length, truncation, truncation_strategy, padding, stride, add_special_tokens, pairs is not None, True,
            pad_to_multiple_of)
        if opts["padding"] is False and return_tensors is not None and len(texts) > 1:
            raise BertkitError("return_tensors needs equal-length rows: use padding='longest' or 'max_length'")
        with gc_paused():  # see tokenizer_speed
            return self._encode_batch(texts, pairs, opts, return_overflowing, return_tensors, num_workers)

    def _encode_batch(self, texts, pairs, opts, return_overflowing, return_tensors, num_workers) -> BatchEncoding:
        segments = self._segments_many(list(texts) + (list(pairs) if pairs is not None else []), num_workers)
        seg_a = segments[: len(texts)]
        seg_b = segments[len(texts):] if pairs is not None else [None] * len(texts)
        return batch(self, seg_a, seg_b, opts, return_overflowing, return_tensors)

    def _segments_many(self, texts: list[str], num_workers: int | None) -> list[Segment]:
        """_segment of each text, in worker processes for big batches (tokenizer_speed)."""
        num_workers = choose_num_workers(texts, num_workers)
        if num_workers == 1 or len(texts) < 2:
            return [self._segment(t) for t in texts]
        if self._workers is None or self._workers.n != num_workers:
            self.close()
            self._workers = TokenizerWorkers(self, num_workers)
        return [Segment(*parts) for parts in self._workers.segments(texts)]

    def close(self) -> None:
        """Stop the worker processes of encode_batch, if any (also done at exit)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None


def _as_int_list(ids, what: str) -> list[int]:
    if hasattr(ids, "tolist"):  # torch tensors and numpy arrays, without importing either
        ids = ids.tolist()
    if isinstance(ids, int) and not isinstance(ids, bool):
        return [ids]
    if not isinstance(ids, (list, tuple)):
        raise BertkitError(f"{what} must be a list of int, got {type(ids).__name__}")
    for i in ids:  # numbers.Integral: numpy's integers too (a list(array) holds np.int64)
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise BertkitError(f"{what} must hold ints, found {i!r} ({type(i).__name__})")
    return [int(i) for i in ids]
