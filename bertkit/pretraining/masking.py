"""Masked-LM masking: choose ~15% of a sequence's tokens and hide them.

This is `create_masked_lm_predictions` of google-research/bert
`create_pretraining_data.py`, with its whole-word option, and ALBERT's n-gram
masking (google-research/albert `create_pretraining_data.py`, Lan et al. 2019,
section 4.1, after SpanBERT):

1. candidates: every token but the special ones; grouped into *words* for
   whole-word and n-gram masking (a `##` piece joins the word before it);
2. budget: num_to_predict = min(max_predictions_per_seq, max(1, round(L * 0.15)))
   for a sequence of L tokens ([CLS]/[SEP] included, as the original counts);
   prepare's default cap follows its length (`default_max_predictions`: 20 at
   128 tokens as the original's flag, 77 at 512), so it never cuts the 15%;
3. walk the candidates in random order, taking a span of n words, n in 1..3 with
   P(n) proportional to 1/n (6/11, 3/11, 2/11; n = 1 for token and whole-word
   masking); a span that would exceed the budget, or touch a token already taken,
   is skipped (see `choose_positions` for how n-grams deviate);
4. each chosen token: 80% [MASK], 10% a random token, 10% unchanged; its
   original id becomes the label.

Inputs are plain id sequences and a `MaskVocab` (which ids are special, which
start a word), so everything here is testable with a ten-word vocabulary.
`mask_sequence` is the plain per-sequence algorithm (static masking at prepare
time, and the dynamic whole-word / n-gram masking of the collator); the
collator has a vectorised torch path for token masking that draws the same
distribution (a uniformly random subset of exactly num_to_predict candidates).

Deviations from the original, all deliberate:
- the five special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]) are never chosen
  (the original only skips [CLS]/[SEP] and may mask [UNK]; Hugging Face skips all);
- the random replacement is drawn from the non-special ids (the original, and
  Hugging Face's collator, draw from the whole vocabulary, [CLS] and [PAD]
  included; the [unused*] rows of BERT's vocabularies are drawn here as there);
- a `##` piece right after a special token starts a word (after truncation from
  the front, B can begin mid-word; the original would glue it to A's last word);
- ALBERT draws n from numpy's global generator; we use the passed-in `rng`;
  an n-gram never crosses a [SEP]; a drawn n is kept until it fits
  (`choose_positions`), which brings the realised span lengths much closer to
  1/n (on 128-token Gutenberg instances about 57/26/17% for n = 1/2/3 against
  ALBERT's 57/28/14% and the target 55/27/18%; within 1 point when the budget
  holds many spans: the hard budget makes each sequence's last span lean short).

`mask_sequence` is also what prepare runs for static whole-word and n-gram
masking; static *token* masking runs the collator's vectorised `mask_tokens`
on a whole block of instances at once.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np

from bertkit.errors import BertkitError
from bertkit.text.vocab import CONTINUATION, SPECIAL_TOKENS, check_has_words

MASKING_MODES = ("token", "whole-word", "ngram")


@dataclass
class MaskingConfig:
    """How to mask. `masking`: token | whole-word | ngram (1..max_ngram whole words)."""

    masking: str = "token"
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    max_ngram: int = 3
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1

    def validate(self) -> "MaskingConfig":
        if self.masking not in MASKING_MODES:
            raise BertkitError(f"unknown masking {self.masking!r}; choose one of {', '.join(MASKING_MODES)}")
        # named as pretrain prepare's flags, which these fields are
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise BertkitError(f"--masked-lm-prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise BertkitError(f"--max-predictions-per-seq must be >= 1, got {self.max_predictions_per_seq}")
        if self.max_ngram < 1:
            raise BertkitError(f"--max-ngram must be >= 1, got {self.max_ngram}")
        if not (0 <= self.mask_replace_prob and 0 <= self.random_replace_prob
                and self.mask_replace_prob + self.random_replace_prob <= 1):
            raise BertkitError("mask_replace_prob and random_replace_prob must be >= 0 and sum to <= 1")
        return self

    @property
    def ngram(self) -> int:
        return self.max_ngram if self.masking == "ngram" else 1


@dataclass
class MaskVocab:
    """What masking needs to know about a vocabulary of `size` ids."""

    size: int
    mask_id: int
    special_ids: frozenset  # never chosen
    continuation_ids: frozenset  # "##" pieces: they continue the word before
    replace_ids: np.ndarray  # [R] int64: the random replacements (the non-special ids)

    @classmethod
    def from_tokens(cls, tokens: list) -> "MaskVocab":
        """From the vocabulary as a list (id -> token string)."""
        index = {t: i for i, t in enumerate(tokens)}
        if "[MASK]" not in index:
            raise BertkitError("the vocabulary has no [MASK] token; masked-LM data needs one")
        check_has_words(tokens)
        specials = frozenset(index[t] for t in SPECIAL_TOKENS if t in index)
        continuation = frozenset(i for i, t in enumerate(tokens) if t.startswith(CONTINUATION))
        replace = np.array([i for i in range(len(tokens)) if i not in specials], dtype=np.int64)
        return cls(len(tokens), index["[MASK]"], specials, continuation, replace)

    def special_mask(self) -> np.ndarray:
        """[V] bool lookup: is the id special."""
        m = np.zeros(self.size, dtype=bool)
        m[list(self.special_ids)] = True
        return m

    def word_start_mask(self) -> np.ndarray:
        """[V] bool lookup: does the id start a word (not a "##" piece)."""
        m = np.ones(self.size, dtype=bool)
        m[list(self.continuation_ids)] = False
        return m


@dataclass
class MaskedSequence:
    """The result for one sequence: masked ids, chosen positions (sorted), their original ids."""

    input_ids: np.ndarray
    positions: np.ndarray
    labels: np.ndarray
    span_lengths: list  # words per chosen span, in choice order (checks the n-gram distribution)
    fills: int = 0  # how many of the last spans were shortened to fill the budget


def num_to_predict(length: int, cfg: MaskingConfig) -> int:
    return min(cfg.max_predictions_per_seq, max(1, int(round(length * cfg.masked_lm_prob))))


REFERENCE_MAX_PREDICTIONS = 20  # create_pretraining_data's default, set for its max_seq_length 128


def default_max_predictions(max_seq_length: int, masked_lm_prob: float) -> int:
    """The cap on predictions per sequence that never binds: max(20, round(T * masked_lm_prob)).

    round(T * p) is the largest budget `num_to_predict` gives a sequence of at most T tokens, so every sequence
    gets its round(L * p) (google-research/bert's README: set max_predictions_per_seq to about
    max_seq_length * masked_lm_prob; it used 20 at 128 tokens, 80 at 512; a fixed 20 masks 4% of a 512-token
    sequence). The floor of 20 is the reference's default: at 0.15, data of up to 133 tokens keeps exactly what
    the fixed 20 gave (128: 20, not round(19.2) = 19), stored arrays included.
    """
    return max(REFERENCE_MAX_PREDICTIONS, int(round(max_seq_length * masked_lm_prob)))


def ngram_probabilities(max_ngram: int) -> list:
    """P(n) for n = 1..max_ngram, proportional to 1/n (ALBERT's favor_shorter_ngram)."""
    w = [1.0 / n for n in range(1, max_ngram + 1)]
    total = sum(w)
    return [x / total for x in w]


@functools.lru_cache(maxsize=None)
def _cumulative(max_ngram: int) -> tuple:
    """Cumulative P(n) renormalised over the first k lengths, for k = 1..max_ngram
    (near the end of a sequence fewer n-grams fit)."""
    probs = ngram_probabilities(max_ngram)
    out = []
    for k in range(1, max_ngram + 1):
        total = sum(probs[:k])
        out.append(tuple(sum(probs[: j + 1]) / total for j in range(k)))
    return tuple(out)


def candidate_words(ids: list, vocab: MaskVocab, whole_word: bool) -> tuple:
    """Groups of positions masked together (words, or single tokens), and each group's
    run: the number of special tokens before it (an n-gram stays inside one run)."""
    special, continuation = vocab.special_ids, vocab.continuation_ids
    groups: list = []
    runs: list = []
    run = 0
    prev_special = True
    for i, t in enumerate(ids):
        if t in special:
            prev_special = True
            run += 1
            continue
        if whole_word and not prev_special and t in continuation:
            groups[-1].append(i)
        else:
            groups.append([i])
            runs.append(run)
        prev_special = False
    return groups, runs


def _random_order(n: int, rng: random.Random):
    """0..n-1 in random order, drawn lazily (Fisher-Yates one step at a time).

    The same distribution as shuffling first (the original), but the walk
    usually stops after ~budget of the n candidates, so most draws are saved.
    """
    order = list(range(n))
    for i in range(n):
        j = i + int(rng.random() * (n - i))
        order[i], order[j] = order[j], order[i]
        yield order[i]


def _draw_length(max_n: int, rng: random.Random) -> int:
    if max_n == 1:
        return 1
    r, c, n = rng.random(), _cumulative(max_n)[-1], 1
    while n < max_n and r >= c[n - 1]:
        n += 1
    return n


def choose_positions(ids: list, cfg: MaskingConfig, vocab: MaskVocab, rng: random.Random) -> tuple:
    """The positions to predict (in choice order), the span lengths in words, and how
    many of the spans (the last ones) are shortened fills; steps 1-3.

    Deviation from ALBERT for n-grams: a drawn length n is kept ("sticky") until
    the walk reaches a start where n words fit (inside one segment, none taken,
    within the budget), instead of being shortened or dropped on the spot; ALBERT's
    way turns 6/11, 3/11, 2/11 into about 57%, 28%, 14% on real text, because long
    spans collide more. Only when the walk ends with budget left do shorter spans
    fill it (ALBERT's shortening), so the lengths follow 1/n up to that last span.
    """
    whole_word = cfg.masking != "token"
    words, runs = candidate_words(ids, vocab, whole_word)
    budget = num_to_predict(len(ids), cfg)
    max_n = cfg.ngram
    chosen: list = []
    covered: set = set()
    spans: list = []

    def fit(w: int, n: int):
        if w + n > len(words) or runs[w + n - 1] != runs[w]:
            return None  # past the end, or across a [SEP]
        span = words[w] if n == 1 else [p for k in range(n) for p in words[w + k]]
        if len(chosen) + len(span) > budget or any(p in covered for p in span):
            return None
        return span

    def take(span, n):
        covered.update(span)
        chosen.extend(span)
        spans.append(n)
        return n

    n = _draw_length(max_n, rng)
    skipped, fills = [], []
    for w in _random_order(len(words), rng):
        if len(chosen) >= budget:
            break
        span = fit(w, n)
        if span is None:
            skipped.append(w)
            continue
        take(span, n)
        n = _draw_length(max_n, rng)
    if max_n > 1:
        for w in skipped:
            if len(chosen) >= budget:
                break
            for m in range(n - 1, 0, -1):
                span = fit(w, m)
                if span is not None:
                    fills.append(take(span, m))
                    break
    return chosen, spans, len(fills)


def mask_sequence(ids, cfg: MaskingConfig, vocab: MaskVocab, rng: random.Random) -> MaskedSequence:
    """Mask one sequence (ids [L], unpadded) as the module docstring describes."""
    ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    chosen, spans, fills = choose_positions(ids, cfg, vocab, rng)
    out = list(ids)
    keep_given_not_mask = 1.0 - cfg.random_replace_prob / (1.0 - cfg.mask_replace_prob) if cfg.mask_replace_prob < 1 else 1.0
    replace_ids = vocab.replace_ids
    for p in chosen:
        if rng.random() < cfg.mask_replace_prob:
            out[p] = vocab.mask_id
        elif rng.random() >= keep_given_not_mask:
            out[p] = int(replace_ids[rng.randrange(len(replace_ids))])
        # else: keep the original token (the model must still predict it)
    positions = np.array(sorted(chosen), dtype=np.int64)
    return MaskedSequence(
        np.array(out, dtype=np.int64),
        positions,
        np.array([ids[p] for p in positions], dtype=np.int64),
        spans,
        fills,
    )
