"""Training instances: which spans of the corpus go into one sequence.

This is `create_instances_from_document` and `truncate_seq_pair` of
google-research/bert `create_pretraining_data.py`, with ALBERT's sentence-order
variant (google-research/albert `create_pretraining_data.py`) and RoBERTa's
FULL-SENTENCES / DOC-SENTENCES packing (Liu et al. 2019, section 4.2).

The corpus is indexed, not copied: `sent_offsets` [S+1] holds the global token
offset where each sentence starts and `doc_offsets` [D+1] the index of each
document's first sentence. Consecutive sentences of a document are contiguous
tokens, so a span of sentences is just a token range [start, end), and an
instance is a few ranges. `render` turns one into ids:

    [CLS] part_1 [SEP] part_2 [SEP] ... part_k [SEP]     (token type of part i: types[i])

Objectives (`label`):
- "nsp": two parts A, B; label 1 if B is a random span of another document, 0 if
  B really follows A (the Hugging Face convention, as `next_sentence_label`);
- "sop": A and B are consecutive spans of one document; label 1 if they were
  swapped (B shown first), 0 in order;
- "none": full sentences packed contiguously up to the length, across document
  boundaries, a [SEP] after each document's part; no label (-1);
- "single": one segment of full sentences from one document; no label (-1).

As in the original: a target length of `max_num_tokens` (the length minus the
special tokens), but a random shorter one with probability `short_seq_prob`
(0.1) to soften the mismatch with short fine-tuning inputs; segment A takes a
random number of the chunk's sentences; when B is random the unused sentences
are "put back" for the next chunk; the longer side of a pair is truncated one
token at a time from a random end. Deviations, each marked where it happens:
1. a new target length is drawn for every instance, not once per document (with
   book-sized documents, one draw per document makes the short fraction lumpy);
2. the random document is drawn uniformly from the *other* documents (the
   original retries ten times and may keep the same one); for a training
   document only from the training documents (`pool`: prepare chooses the
   held-out documents before any pair is made), so held-out text never lands
   in a training pair and the training labels keep their balance however few
   documents there are;
3. a chunk of a single sentence is split at a random word start instead of
   forcing a random next (NSP) or a random next even under SOP (ALBERT), so the
   NSP label is a fair coin and SOP pairs are always consecutive;
4. "none"/"single" (not in the original) cut a sentence longer than the whole
   sequence into pieces instead of dropping its tail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

OBJECTIVES = ("nsp", "sop", "none", "single")


@dataclass
class Instance:
    """One sequence before masking: token ranges of the corpus and the pair label.

    `parts` are global token ranges [start, end) after truncation, in display
    order; `types` their token type ids; `docs` their documents; `sources` the
    sentence-aligned ranges before truncation (pairs only; for checks and for
    showing the original text); `label` the NSP/SOP label or -1.
    """

    parts: list
    types: list
    docs: list
    label: int = -1
    sources: list = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens including [CLS] and one [SEP] per part."""
        return 1 + sum(e - s for s, e in self.parts) + len(self.parts)


def num_special_tokens(objective: str) -> int:
    return 3 if objective in ("nsp", "sop") else 2


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    # Mostly fill the sequence (padding is wasted compute), but sometimes
    # (10%) train on shorter ones, like the fine-tuning inputs. With one token
    # of room (packing at max_seq_length 3) no shorter target exists.
    if rng.random() < short_seq_prob and max_num_tokens >= 2:
        return rng.randint(2, max_num_tokens)
    return max_num_tokens


def truncate_pair(a: list, b: list, max_num_tokens: int, rng: random.Random) -> None:
    """Shrink ranges a=[a0,a1], b=[b0,b1] in place until they hold <= max_num_tokens.

    Like the original, always cut the longer side (A on a tie), each token from
    the front or the back with probability 1/2, "to add more randomness and avoid
    biases". Cutting n tokens from one side at once with popcount(n random bits)
    front cuts is the same distribution as n single coin flips, in O(n/64).
    """
    while True:
        la, lb = a[1] - a[0], b[1] - b[0]
        excess = la + lb - max_num_tokens
        if excess <= 0:
            return
        side, n = (a, min(excess, la - lb + 1)) if la >= lb else (b, min(excess, lb - la))
        front = rng.getrandbits(n).bit_count()
        side[0] += front
        side[1] -= n - front


def _split_point(start: int, end: int, word_start, tokens, rng: random.Random) -> int | None:
    """A random cut inside one sentence [start, end), at a word start if we can tell; None if < 2 tokens."""
    if end - start < 2:
        return None
    cuts = range(start + 1, end)
    if word_start is not None:
        ok = [p for p in cuts if word_start[tokens[p]]]
        if ok:
            return rng.choice(ok)
    return rng.choice(cuts)


def _random_other_document(d: int, pool, rng: random.Random) -> int:
    # Deviation 2: uniform over the other documents of d's pool (sorted ids holding d), never d itself.
    r = rng.randrange(len(pool) - 1)
    at = d if isinstance(pool, range) else int(np.searchsorted(pool, d))
    return int(pool[r + 1 if r >= at else r])


def _random_next(d: int, pool, sent_offsets, doc_offsets, target_b: int, rng: random.Random) -> tuple[list[int], int]:
    """A random next segment: sentences of another document from a random one on, until target_b tokens.
    Returns its token span [start, end) and its document."""
    b_doc = _random_other_document(d, pool, rng)
    rs = rng.randint(int(doc_offsets[b_doc]), int(doc_offsets[b_doc + 1]) - 1)
    re_, b_len = rs, 0
    while re_ < int(doc_offsets[b_doc + 1]):
        b_len += int(sent_offsets[re_ + 1] - sent_offsets[re_])
        re_ += 1
        if b_len >= target_b:
            break
    return [int(sent_offsets[rs]), int(sent_offsets[re_])], b_doc


def _instance(a: list[int], b: list[int], docs: tuple[int, int], is_random: bool, objective: str,
              max_num_tokens: int, rng: random.Random) -> Instance:
    """The pair (a, b) truncated to max_num_tokens and labelled: NSP 1 = random next; SOP 1 = swapped, half the time."""
    sources = [tuple(a), tuple(b)]
    truncate_pair(a, b, max_num_tokens, rng)
    label = 1 if is_random else 0
    if objective == "sop" and rng.random() < 0.5:
        a, b, sources, label = b, a, sources[::-1], 1
    return Instance([tuple(a), tuple(b)], [0, 1], list(docs), label, sources)


def pair_instances(
    d: int,
    sent_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    tokens,
    objective: str,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    word_start=None,
    pool=None,
) -> list[Instance]:
    """NSP or SOP instances from document d (create_instances_from_document).

    pool: the documents a random next segment may come from (sorted ids, d
    among them: the training documents); None: all of them.
    """
    assert objective in ("nsp", "sop")
    pool = range(len(doc_offsets) - 1) if pool is None else pool
    n_docs = len(pool)
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    s_first, s_end = int(doc_offsets[d]), int(doc_offsets[d + 1])
    instances: list[Instance] = []
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    chunk_start, chunk_len = s_first, 0
    i = s_first
    while i < s_end:
        chunk_len += int(sent_offsets[i + 1] - sent_offsets[i])
        if i == s_end - 1 or chunk_len >= target:
            n_chunk = i + 1 - chunk_start
            # A gets sentences [chunk_start, a_end), a random number of them.
            a_end = chunk_start + (rng.randint(1, n_chunk - 1) if n_chunk >= 2 else 1)
            a = [int(sent_offsets[chunk_start]), int(sent_offsets[a_end])]
            is_random = objective == "nsp" and n_docs > 1 and rng.random() < 0.5
            b, b_doc = None, d
            if not is_random:
                if n_chunk >= 2:
                    b = [int(sent_offsets[a_end]), int(sent_offsets[i + 1])]
                else:
                    # Deviation 3: one sentence only; cut it in two so that B follows A.
                    cut = _split_point(a[0], a[1], word_start, tokens, rng)
                    if cut is not None:
                        a, b = [a[0], cut], [cut, a[1]]
                    elif objective == "nsp" and n_docs > 1:
                        is_random = True  # a one-token sentence: the original's forced random next
                    else:
                        chunk_start, chunk_len = i + 1, 0  # a one-token sentence cannot make a SOP pair
                        i += 1
                        continue
            if is_random:
                b, b_doc = _random_next(d, pool, sent_offsets, doc_offsets, target - (a[1] - a[0]), rng)
                # The chunk's unused sentences are "put back" for the next instance.
                i = a_end - 1
            instances.append(_instance(a, b, (d, b_doc), is_random, objective, max_num_tokens, rng))
            target = _target_length(max_num_tokens, short_seq_prob, rng)  # deviation 1
            chunk_start, chunk_len = i + 1, 0
        i += 1
    return instances


def pair_instances_at_least(sent_offsets: np.ndarray, doc_offsets: np.ndarray, max_seq_length: int) -> np.ndarray:
    """A certain lower bound of `len(pair_instances(d, ...))` for every document d [D], whatever the draws, so that
    prepare refuses (`room_for`) instances a disk certainly cannot hold. Every sentence of d ends in the span an
    instance takes (A's sentences when B is random, else the whole chunk) but for a one-token sentence alone, which
    may make none. A chunk grows while it is shorter than its target (at most M = max_seq_length - 3 tokens) and
    ends with the sentence that reaches it, so a span holds at most M - 1 + L tokens (L: d's longest sentence):
    instances >= (tokens - one-token sentences) / (M - 1 + L). Truncation drops tokens later, not before."""
    sent_offsets, first = np.asarray(sent_offsets, dtype=np.int64), np.asarray(doc_offsets, dtype=np.int64)
    lengths = np.diff(sent_offsets)  # [S]
    tokens = sent_offsets[first[1:]] - sent_offsets[first[:-1]]  # [D]
    ones = np.concatenate([[0], np.cumsum(lengths == 1)])
    ones = ones[first[1:]] - ones[first[:-1]]  # [D]
    filled = first[1:] > first[:-1]  # a document without a sentence makes nothing; the others' starts increase
    bound = np.zeros(len(tokens), dtype=np.int64)
    if filled.any():
        longest = np.maximum.reduceat(lengths, first[:-1][filled])
        span = np.maximum(max_seq_length - 4 + longest, 1)
        bound[filled] = np.maximum(-(-(tokens[filled] - ones[filled]) // span), 0)
    return bound


def packed_instances(
    doc_order,
    sent_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    cross_documents: bool,
) -> list[Instance]:
    """Full sentences packed up to the length: across documents ("none") or not ("single").

    Each document contributes one part (its consecutive sentences are one
    range), and every part is followed by [SEP]; a sentence longer than the
    whole sequence is cut into pieces (deviation 4).
    """
    max_total = max_seq_length - 1  # [CLS]; each part also pays one [SEP]
    instances: list[Instance] = []
    parts: list[list[int]] = []
    docs: list[int] = []
    target = _target_length(max_total - 1, short_seq_prob, rng) + 1

    def used() -> int:
        return sum(e - s + 1 for s, e in parts)

    def emit() -> None:
        nonlocal parts, docs, target
        if parts:
            instances.append(Instance([tuple(p) for p in parts], [0] * len(parts), list(docs)))
        parts, docs = [], []
        target = _target_length(max_total - 1, short_seq_prob, rng) + 1

    for d in doc_order:
        d = int(d)
        if not cross_documents:
            emit()
        for s in range(int(doc_offsets[d]), int(doc_offsets[d + 1])):
            start, end = int(sent_offsets[s]), int(sent_offsets[s + 1])
            while start < end:
                joins = bool(parts) and docs[-1] == d and parts[-1][1] == start
                cost = (end - start) + (0 if joins else 1)
                if parts and used() + cost > target:
                    emit()
                    continue
                if not parts and end - start + 1 > max_total:
                    # Deviation 4: a sentence longer than the sequence fills it alone, in pieces.
                    parts, docs = [[start, start + max_total - 1]], [d]
                    start += max_total - 1
                    emit()
                    continue
                if joins:
                    parts[-1][1] = end
                else:
                    parts.append([start, end])
                    docs.append(d)
                start = end
    emit()
    return instances


def render(inst: Instance, tokens, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The instance as ids [L] int32 and token type ids [L] int8 (see the module docstring)."""
    ids = np.empty(inst.length, dtype=np.int32)
    types = np.zeros(inst.length, dtype=np.int8)
    ids[0] = cls_id
    at = 1
    for (s, e), t in zip(inst.parts, inst.types):
        ids[at:at + e - s] = tokens[s:e]
        ids[at + e - s] = sep_id
        if t:
            types[at:at + e - s + 1] = t
        at += e - s + 1
    return ids, types
