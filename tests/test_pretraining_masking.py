"""Masking and the batch collator on a handmade vocabulary.

A ten-word vocabulary with `##` pieces makes every property checkable by hand:
the budget round(L * 0.15), specials never chosen, whole words kept whole,
n-gram lengths ~ 1/n, 80/10/10, and the vectorised collator drawing the same
distribution as the per-sequence algorithm. One oracle test checks padding and
the attention mask against transformers' DataCollatorForLanguageModeling.
"""

import random
from collections import Counter

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.pretraining.collate import PretrainingCollator, masked_positions_from_labels
from bertkit.pretraining.masking import (
    MaskingConfig,
    MaskVocab,
    _draw_length,
    candidate_words,
    choose_positions,
    default_max_predictions,
    mask_sequence,
    ngram_probabilities,
    num_to_predict,
)

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
          "un", "##aff", "##able", "play", "##ing", "##s", "run", "dog"]
ID = {t: i for i, t in enumerate(TOKENS)}
VOCAB = MaskVocab.from_tokens(TOKENS)
SPECIAL = {0, 1, 2, 3, 4}
WORDS = [["the"], ["cat"], ["sat"], ["on"], ["mat"], ["un", "##aff", "##able"], ["play", "##ing"],
         ["play", "##s"], ["run"], ["dog"], ["[UNK]"]]


def random_sequence(rng, n_words_a, n_words_b=None):
    """[CLS] words [SEP] (words [SEP]) as ids, plus the word index of every position (-1: special)."""
    ids, word_of = [ID["[CLS]"]], [-1]
    w = 0
    for n in (n_words_a, n_words_b):
        if n is None:
            continue
        for _ in range(n):
            word = rng.choice(WORDS)
            ids += [ID[t] for t in word]
            word_of += [w if word != ["[UNK]"] else -1] * len(word)
            w += 1
        ids.append(ID["[SEP]"])
        word_of.append(-1)
    return ids, word_of


def test_budget_is_fifteen_percent_rounded_and_capped():
    cfg = MaskingConfig()
    assert [num_to_predict(n, cfg) for n in (1, 3, 10, 20, 100, 128, 512)] == [1, 1, 2, 3, 15, 19, 20]
    assert num_to_predict(512, MaskingConfig(max_predictions_per_seq=80)) == 77


@pytest.mark.parametrize("prob", [0.1, 0.15, 0.2, 0.25])
@pytest.mark.parametrize("max_seq_length", [64, 128, 200, 384, 512, 1000])
def test_the_default_cap_never_cuts_the_budget_and_is_the_references_20_at_128(max_seq_length, prob):
    """prepare's default cap (google-research/bert's README: about max_seq_length x masked_lm_prob): every
    length up to T gets its uncapped round(L x p), and no smaller cap >= 20 does (the array is no wider than that)."""
    cap = default_max_predictions(max_seq_length, prob)
    uncapped = MaskingConfig(masked_lm_prob=prob, max_predictions_per_seq=10**6)
    capped = MaskingConfig(masked_lm_prob=prob, max_predictions_per_seq=cap)
    budgets = [num_to_predict(n, uncapped) for n in range(1, max_seq_length + 1)]
    assert [num_to_predict(n, capped) for n in range(1, max_seq_length + 1)] == budgets
    assert cap == max(20, max(budgets))
    if (max_seq_length, prob) == (128, 0.15):
        assert cap == 20  # create_pretraining_data's default for its 128 tokens, as prepare's fixed 20 was


def test_config_errors_name_the_problem():
    with pytest.raises(BertkitError, match="unknown masking"):
        MaskingConfig(masking="span").validate()
    with pytest.raises(BertkitError, match="--masked-lm-prob"):
        MaskingConfig(masked_lm_prob=1.5).validate()
    with pytest.raises(BertkitError, match=r"\[MASK\]"):
        MaskVocab.from_tokens(["[PAD]", "[CLS]", "[SEP]", "a"])
    # only special tokens: every word is [UNK], nothing to predict or to draw a random token from
    # (torch's random_(0, 0) raised in the middle of prepare, or of the run with --dynamic-masking)
    with pytest.raises(BertkitError, match="only special tokens"):
        MaskVocab.from_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def test_a_vocabulary_of_special_tokens_only_stops_prepare_before_the_corpus_is_read(tmp_path, capsys):
    from bertkit.cli import main

    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    (tmp_path / "corpus.txt").write_text("one sentence here.\nanother one there.\n\nand a second document.\n")
    code = main(["pretrain", "prepare", str(tmp_path / "corpus.txt"), "-o", str(tmp_path / "data"),
                 "--vocab", str(tmp_path / "vocab.txt"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "only special tokens" in err and "Traceback" not in err


def test_candidate_words_group_pieces_but_not_across_special_tokens():
    ids = [ID[t] for t in ["[CLS]", "un", "##aff", "##able", "cat", "[SEP]", "##s", "dog", "[SEP]"]]
    words, runs = candidate_words(ids, VOCAB, whole_word=True)
    assert words == [[1, 2, 3], [4], [6], [7]]  # "##s" after [SEP] starts its own word
    assert runs == [1, 1, 2, 2]
    assert candidate_words(ids, VOCAB, whole_word=False)[0] == [[1], [2], [3], [4], [6], [7]]


@pytest.mark.parametrize("masking", ["token", "whole-word", "ngram"])
def test_never_special_exact_budget_and_whole_words(masking):
    rng = random.Random(0)
    cfg = MaskingConfig(masking=masking)
    for _ in range(500):
        ids, word_of = random_sequence(rng, rng.randint(1, 40), rng.randint(1, 40))
        chosen, spans, fills = choose_positions(ids, cfg, VOCAB, rng)
        assert len(set(chosen)) == len(chosen)
        assert not any(ids[p] in SPECIAL for p in chosen)
        budget = num_to_predict(len(ids), cfg)
        if masking == "token":
            n_cand = sum(t not in SPECIAL for t in ids)
            assert len(chosen) == min(budget, n_cand)
        else:
            assert len(chosen) <= budget
            # whole-word: every word is chosen completely or not at all
            chosen_set = set(chosen)
            for w in set(word_of) - {-1}:
                pos = [i for i, x in enumerate(word_of) if x == w]
                assert all(p in chosen_set for p in pos) or not any(p in chosen_set for p in pos)


def test_whole_word_fills_the_budget_when_single_tokens_allow_it():
    # The original skips a word that would overflow and goes on: with one-piece
    # words available the budget is always met exactly.
    rng = random.Random(1)
    cfg = MaskingConfig(masking="whole-word")
    for _ in range(200):
        ids = [ID["[CLS]"]] + [ID[rng.choice(["the", "cat", "dog"])] for _ in range(60)]
        ids += [ID["un"], ID["##aff"], ID["##able"], ID["[SEP]"]]
        chosen, _, _ = choose_positions(ids, cfg, VOCAB, rng)
        assert len(chosen) == num_to_predict(len(ids), cfg)


def test_ngram_length_sampler_is_one_over_n():
    rng = random.Random(0)
    draws = Counter(_draw_length(3, rng) for _ in range(60000))
    for n, p in zip((1, 2, 3), ngram_probabilities(3)):
        assert abs(draws[n] / 60000 - p) < 0.006  # 3 sd of a proportion over 60k draws
    assert ngram_probabilities(3) == pytest.approx([6 / 11, 3 / 11, 2 / 11])


def _check_spans(ids, word_of, chosen, spans):
    """Replay the choice order: each span is n consecutive whole words inside one segment."""
    k = 0
    for n in spans:
        words = []
        while k < len(chosen) and (len(words) < n or word_of[chosen[k]] == words[-1]):
            if not words or word_of[chosen[k]] != words[-1]:
                words.append(word_of[chosen[k]])
            k += 1
        assert words == list(range(words[0], words[0] + n))
        first = word_of.index(words[0])
        last = len(word_of) - 1 - word_of[::-1].index(words[-1])
        assert ID["[SEP]"] not in ids[first:last]
    assert k == len(chosen)


@pytest.mark.parametrize("n_words, max_pred, tolerance", [(50, 20, 0.04), (400, 1000, 0.01)])
def test_ngram_spans_follow_one_over_n(n_words, max_pred, tolerance):
    """Realised span lengths vs 6/11, 3/11, 2/11.

    A hard budget makes the last span of a sequence more often one that still
    fits (a short one), so the realised shares lean to n = 1 by roughly 1 / (spans
    per sequence): ~3.5 points here at 103 tokens (budget 15, ~6 spans, with many
    3-piece words), under 1 point at 803 tokens (budget 120). The sampler itself is
    exact (test above). ALBERT's procedure gives about 57/28/14 on real text.
    """
    rng = random.Random(2)
    cfg = MaskingConfig(masking="ngram", max_predictions_per_seq=max_pred)
    lengths = Counter()
    for _ in range(60000 // n_words):
        ids, word_of = random_sequence(rng, n_words, n_words)
        chosen, spans, fills = choose_positions(ids, cfg, VOCAB, rng)
        _check_spans(ids, word_of, chosen, spans)
        lengths.update(spans)
    total = sum(lengths.values())
    for n, p in zip((1, 2, 3), ngram_probabilities(3)):
        assert abs(lengths[n] / total - p) < tolerance, (n, lengths[n] / total, p)


def test_80_10_10_and_random_tokens_are_never_special():
    rng = random.Random(3)
    cfg = MaskingConfig()
    kinds = Counter()
    for _ in range(3000):
        ids, _ = random_sequence(rng, 40, 40)
        m = mask_sequence(ids, cfg, VOCAB, rng)
        assert m.labels.tolist() == [ids[p] for p in m.positions]
        untouched = np.ones(len(ids), bool)
        untouched[m.positions] = False
        assert (m.input_ids[untouched] == np.array(ids)[untouched]).all()
        for p in m.positions:
            new = int(m.input_ids[p])
            if new == ID["[MASK]"]:
                kinds["mask"] += 1
            elif new == ids[p]:
                kinds["same"] += 1
            else:
                assert new not in SPECIAL
                kinds["random"] += 1
    total = sum(kinds.values())  # ~36,000 choices: sd of a 10% share 0.16 points
    # a random replacement equal to the original (1 in 13 ids) counts as "same"
    assert abs(kinds["mask"] / total - 0.8) < 0.008
    assert abs(kinds["random"] / total - 0.1 * 12 / 13) < 0.006
    assert abs(kinds["same"] / total - (0.1 + 0.1 / 13)) < 0.006


# --- the collator -------------------------------------------------------------------------

def _instances(rng, n, pair=True):
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        ids, _ = random_sequence(rng, a, b if pair else None)
        sep = ids.index(ID["[SEP]"])
        types = [0] * (sep + 1) + [1] * (len(ids) - sep - 1)
        out.append({"input_ids": np.array(ids), "token_type_ids": np.array(types), "next_sentence_label": rng.randint(0, 1)})
    return out


def test_collator_pads_to_the_longest_and_uses_stored_masks():
    rng = random.Random(4)
    insts = _instances(rng, 5)
    for x in insts:
        m = mask_sequence(x["input_ids"], MaskingConfig(), VOCAB, rng)
        x["input_ids"], x["masked_positions"], x["masked_ids"] = m.input_ids, m.positions, m.labels
    batch = PretrainingCollator(VOCAB, pad_id=0)(insts)
    T = max(len(x["input_ids"]) for x in insts)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (5, T), "token_type_ids": (5, T), "attention_mask": (5, T), "labels": (5, T),
        "next_sentence_label": (5,)}
    for i, x in enumerate(insts):
        n = len(x["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == x["input_ids"].tolist()
        assert (batch["input_ids"][i, n:] == 0).all() and (batch["labels"][i, n:] == -100).all()
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (T - n)
        assert batch["token_type_ids"][i, :n].tolist() == x["token_type_ids"].tolist()
        labelled = (batch["labels"][i] != -100).nonzero().flatten().tolist()
        assert labelled == x["masked_positions"].tolist()
        assert batch["labels"][i, labelled].tolist() == x["masked_ids"].tolist()
    assert batch["next_sentence_label"].tolist() == [x["next_sentence_label"] for x in insts]


def test_masked_positions_from_labels():
    labels = torch.tensor([[-100, 7, -100, 9], [-100, -100, -100, 5]])
    out = masked_positions_from_labels(labels)
    assert out["masked_positions"].tolist() == [[1, 3], [3, 0]]
    assert out["masked_weights"].tolist() == [[1.0, 1.0], [1.0, 0.0]]


def test_vectorised_token_masking_draws_the_per_sequence_distribution():
    """Exactly the budget per row, every candidate equally likely, 80/10/10: what mask_sequence draws."""
    rng = random.Random(5)
    insts = _instances(rng, 32)
    cfg = MaskingConfig()
    collate = PretrainingCollator(VOCAB, pad_id=0, masking=cfg)
    g = torch.Generator().manual_seed(0)
    T = max(len(x["input_ids"]) for x in insts)
    hits = np.zeros((32, T))
    kinds = Counter()
    rounds = 400
    for _ in range(rounds):
        batch = collate(insts, g)
        chosen = (batch["labels"] != -100).numpy()
        hits += chosen
        new = batch["input_ids"].numpy()
        for i, x in enumerate(insts):
            orig = x["input_ids"]
            n = len(orig)
            assert chosen[i].sum() == num_to_predict(n, cfg) and not chosen[i, n:].any()
            c = chosen[i, :n]
            assert not any(int(t) in SPECIAL for t in orig[c])
            kinds["mask"] += int((new[i, :n][c] == 4).sum())
            kinds["same"] += int((new[i, :n][c] == orig[c]).sum())
    expected = np.zeros((32, T))
    for i, x in enumerate(insts):
        cand = np.array([int(t) not in SPECIAL for t in x["input_ids"]])
        expected[i, : len(cand)][cand] = num_to_predict(len(cand), cfg) / cand.sum()
    freq = hits / rounds
    assert np.abs(freq - expected).max() < 0.11  # 4.5 sd of a 400-draw share (sd <= 0.025)
    assert np.abs(freq - expected).mean() < 0.02
    total = hits.sum()
    assert abs(kinds["mask"] / total - 0.8) < 0.01
    assert abs(kinds["same"] / total - (0.1 + 0.1 / 13)) < 0.01  # a random pick can equal the original


@pytest.mark.parametrize("masking", ["whole-word", "ngram"])
def test_dynamic_word_masking_is_reproducible_from_the_generator(masking):
    rng = random.Random(6)
    insts = _instances(rng, 8)
    collate = PretrainingCollator(VOCAB, pad_id=0, masking=MaskingConfig(masking=masking))
    b1 = collate(insts, torch.Generator().manual_seed(11))
    b2 = collate(insts, torch.Generator().manual_seed(11))
    b3 = collate(insts, torch.Generator().manual_seed(12))
    assert torch.equal(b1["input_ids"], b2["input_ids"]) and torch.equal(b1["labels"], b2["labels"])
    assert not torch.equal(b1["labels"], b3["labels"])


@pytest.mark.oracle
def test_padding_matches_transformers(transformers_mod, default_model_dir):
    """Our padded input_ids / attention_mask equal DataCollatorForLanguageModeling's (mlm=False pads only)."""
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(default_model_dir)
    hf_tok = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    texts = ["Hello there, how are you?", "A much longer sentence, with unaffable words in it.", "Short."]
    insts = []
    for t in texts:
        ids = [tok.cls_token_id] + tok.convert_tokens_to_ids(tok.tokenize(t)) + [tok.sep_token_id]
        insts.append({"input_ids": np.array(ids), "token_type_ids": np.zeros(len(ids), int),
                      "masked_positions": np.array([1]), "masked_ids": np.array([ids[1]])})
    ours = PretrainingCollator(MaskVocab.from_tokens(tok.ids_to_tokens), tok.pad_token_id)(insts)
    hf = transformers_mod.DataCollatorForLanguageModeling(hf_tok, mlm=False)(
        [{"input_ids": x["input_ids"].tolist()} for x in insts])
    assert torch.equal(ours["input_ids"], hf["input_ids"])
    assert torch.equal(ours["attention_mask"], hf["attention_mask"])
