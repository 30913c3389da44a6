"""Instances from a handmade corpus index: pairs (NSP/SOP), packing, truncation.

Token ids are their own corpus offsets (tokens = arange), so every id in an
instance says exactly where it came from, and the properties of
create_pretraining_data can be checked directly: lengths, who follows whom,
nothing lost, random ends of truncation.
"""

import random

import numpy as np
import pytest

from bertkit.pretraining.instances import (
    _target_length,
    packed_instances,
    pair_instances,
    render,
    truncate_pair,
)

CLS, SEP = -1, -2


def make_index(doc_sentence_lengths):
    """sent_offsets / doc_offsets for documents given as lists of sentence lengths."""
    lens = [n for doc in doc_sentence_lengths for n in doc]
    sent_offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in doc_sentence_lengths])]).astype(np.int64)
    tokens = np.arange(int(sent_offsets[-1]), dtype=np.int64)
    return tokens, sent_offsets, doc_offsets


def random_corpus(seed, n_docs=40):
    rng = random.Random(seed)
    docs = [[rng.randint(1, 40) for _ in range(rng.randint(1, 30))] for _ in range(n_docs)]
    docs.append([300])  # one sentence longer than any sequence
    return make_index(docs)


def all_pairs(objective, seed=0, max_seq_length=64, short_seq_prob=0.1, n_docs=40):
    tokens, sents, docs = random_corpus(seed, n_docs)
    rng = random.Random(seed)
    out = []
    for d in range(len(docs) - 1):
        out += pair_instances(d, sents, docs, tokens, objective, max_seq_length, short_seq_prob, rng)
    return out, (tokens, sents, docs)


def doc_of(docs, sents, token):
    s = int(np.searchsorted(sents, token, side="right")) - 1
    return int(np.searchsorted(docs, s, side="right")) - 1


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_pairs_fit_and_have_two_nonempty_segments(objective):
    for max_len in (5, 9, 64):
        insts, _ = all_pairs(objective, seed=max_len, max_seq_length=max_len)
        assert insts
        for inst in insts:
            assert inst.length <= max_len
            assert len(inst.parts) == 2 and all(e > s for s, e in inst.parts)
            # truncation only shrinks: each part lies inside its whole-sentence source
            for (s, e), (ss, se) in zip(inst.parts, inst.sources):
                assert ss <= s < e <= se


def test_nsp_random_next_is_from_another_document_and_real_next_follows():
    insts, (tokens, sents, docs) = all_pairs("nsp", seed=1, n_docs=300)
    labels = np.array([i.label for i in insts])
    assert len(insts) > 2000
    assert abs(labels.mean() - 0.5) < 0.03  # 3 sigma of a fair coin over >2000 draws
    for inst in insts:
        (a0, a1), (b0, b1) = inst.sources
        da, db = doc_of(docs, sents, a0), doc_of(docs, sents, b0)
        assert (da, db) == tuple(inst.docs)
        assert da == doc_of(docs, sents, a1 - 1) and db == doc_of(docs, sents, b1 - 1)
        if inst.label == 1:
            assert da != db
        else:
            assert da == db and a1 == b0  # B starts where A ends


def test_sop_pairs_are_consecutive_and_swapped_half_the_time():
    insts, (tokens, sents, docs) = all_pairs("sop", seed=2, n_docs=300)
    labels = np.array([i.label for i in insts])
    assert abs(labels.mean() - 0.5) < 0.03
    for inst in insts:
        (f0, f1), (s0, s1) = inst.sources  # first and second shown
        assert inst.docs[0] == inst.docs[1] == doc_of(docs, sents, f0) == doc_of(docs, sents, s0)
        if inst.label == 0:
            assert f1 == s0
        else:
            assert s1 == f0  # the later span is shown first


def test_every_sentence_is_used_once_per_pass():
    """The "put back" rule: a chunk's sentences not used because B was random start the next chunk."""
    tokens, sents, docs = random_corpus(3, n_docs=60)
    rng = random.Random(3)
    for d in range(len(docs) - 1):
        own = []
        for inst in pair_instances(d, sents, docs, tokens, "nsp", 48, 0.1, rng):
            own.append(inst.sources[0])
            if inst.label == 0:
                own.append(inst.sources[1])
        own.sort()
        start, end = int(sents[docs[d]]), int(sents[docs[d + 1]])
        assert own[0][0] == start and own[-1][1] == end
        assert all(own[k][1] == own[k + 1][0] for k in range(len(own) - 1))


def test_truncate_pair_cuts_the_longer_side_from_random_ends():
    rng = random.Random(0)
    fronts = []
    for _ in range(2000):
        a, b = [0, 100], [1000, 1010]
        truncate_pair(a, b, 50, rng)
        assert (a[1] - a[0]) + (b[1] - b[0]) == 50
        assert b == [1000, 1010]  # B never became the longer side
        fronts.append(a[0])
    # 60 cuts, each from the front with probability 1/2: mean 30, sd of the mean 3.87/sqrt(2000)
    assert abs(np.mean(fronts) - 30) < 0.3
    # equal lengths: cuts alternate between the sides, A first (the original breaks ties to A)
    a, b = [0, 10], [20, 30]
    truncate_pair(a, b, 17, random.Random(1))
    assert (a[1] - a[0], b[1] - b[0]) == (8, 9)


def test_truncate_pair_matches_the_original_one_token_loop():
    """Same distribution as google-research/bert's truncate_seq_pair (re-implemented here as the reference)."""

    def original(la, lb, max_num, rng):
        a, b = list(range(la)), list(range(100, 100 + lb))
        while len(a) + len(b) > max_num:
            t = a if len(a) >= len(b) else b
            if rng.random() < 0.5:
                del t[0]
            else:
                t.pop()
        return a[0], len(a), b[0] - 100, len(b)

    ours_rng, ref_rng = random.Random(5), random.Random(6)
    ours, ref = [], []
    for _ in range(3000):
        a, b = [0, 37], [100, 161]
        truncate_pair(a, b, 40, ours_rng)
        ours.append((a[0], a[1] - a[0], b[0] - 100, b[1] - b[0]))
        ref.append(original(37, 61, 40, ref_rng))
    ours, ref = np.array(ours, float), np.array(ref, float)
    assert np.array_equal(ours[:, [1, 3]].mean(0), ref[:, [1, 3]].mean(0))  # lengths are deterministic
    assert np.allclose(ours[:, [0, 2]].mean(0), ref[:, [0, 2]].mean(0), atol=0.25)  # front cuts: sd ~0.06


def test_short_targets_are_ten_percent_and_uniform():
    rng = random.Random(0)
    t = np.array([_target_length(125, 0.1, rng) for _ in range(20000)])
    short = t[t < 125]
    assert abs(len(short) / len(t) - 0.1 * 123 / 124) < 0.006  # randint(2, 125) hits 125 1 time in 124
    assert short.min() >= 2 and abs(short.mean() - 63) < 2


@pytest.mark.parametrize("cross", [True, False])
def test_packing_keeps_every_token_in_order(cross):
    tokens, sents, docs = random_corpus(4)
    order = np.random.default_rng(0).permutation(len(docs) - 1)
    insts = packed_instances(order, sents, docs, 64, 0.1, random.Random(0), cross_documents=cross)
    flat = []
    for inst in insts:
        assert inst.length <= 64
        if not cross:
            assert len(set(inst.docs)) == 1
        assert len(set(inst.docs)) == len(inst.docs) or not cross  # one part per document
        flat += [t for s, e in inst.parts for t in range(s, e)]
    expected = [t for d in order for t in range(int(sents[docs[d]]), int(sents[docs[d + 1]]))]
    assert flat == expected
    if cross:
        assert any(len(i.docs) > 1 for i in insts)


@pytest.mark.parametrize("cross", [True, False])
def test_packing_at_the_shortest_length_prepare_allows(cross):
    # max_seq_length 3 is [CLS] one token [SEP]: a shorter target than the one
    # token left is impossible, and asking for one (short_seq_prob) used to crash randint(2, 1).
    tokens, sents, docs = make_index([[2, 1], [3]])
    insts = packed_instances([0, 1], sents, docs, 3, 1.0, random.Random(0), cross_documents=cross)
    assert [i.parts for i in insts] == [[(t, t + 1)] for t in range(6)]
    assert all(i.length == 3 for i in insts)


def test_packing_cuts_only_at_sentence_ends_unless_a_sentence_is_too_long():
    tokens, sents, docs = make_index([[10, 10, 10], [200], [5]])
    insts = packed_instances([0, 1, 2], sents, docs, 25, 0.0, random.Random(0), cross_documents=True)
    got = [(i.parts, i.docs) for i in insts]
    # 25 tokens: [CLS] + parts + one [SEP] per part
    assert got[0] == ([(0, 20)], [0])
    assert got[1] == ([(20, 30)], [0])  # 10 + the 200-token sentence would not fit
    assert all(p == [(30 + 23 * k, 53 + 23 * k)] for k, (p, _) in enumerate(got[2:10]))
    assert got[10] == ([(214, 230), (230, 235)], [1, 2])  # the tail of the long one, [SEP], then doc 2


def test_render_builds_cls_a_sep_b_sep():
    tokens, sents, docs = make_index([[3, 2], [4]])
    insts = pair_instances(0, sents, docs, tokens, "sop", 20, 0.0, random.Random(0))
    (a0, a1), (b0, b1) = insts[0].parts
    ids, types = render(insts[0], tokens, CLS, SEP)
    assert ids.tolist() == [CLS, *range(a0, a1), SEP, *range(b0, b1), SEP]
    assert types.tolist() == [0] * (a1 - a0 + 2) + [1] * (b1 - b0 + 1)


def test_single_sentence_document_is_split_so_b_still_follows_a():
    tokens, sents, docs = make_index([[9], [9]])
    word_start = np.ones(18, dtype=bool)
    word_start[[3, 4]] = False  # "##" pieces: never cut before them
    for seed in range(30):
        (inst,) = pair_instances(0, sents, docs, tokens, "sop", 20, 0.0, random.Random(seed), word_start)
        (s0, s1), (t0, t1) = sorted(inst.parts)
        assert s0 == 0 and s1 == t0 and t1 == 9 and s1 not in (3, 4)
