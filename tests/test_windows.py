"""Sliding windows and the max-context rule (bertkit.text.windows), checked by hand.

`stride` is the overlap everywhere: the windows of the tokenizer's overflow,
of embed, NER and QA all come from `spans`, and the expected windows below are
worked out on paper from run_squad.py's rule.
"""

import numpy as np
import pytest
import torch

from bertkit.model.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.embeddings.features import embed
from bertkit.model.modeling import BertModel
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.windows import best_span, half_window, max_context_owner, read_tokens, spans


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained()


@pytest.fixture(scope="module")
def tiny(tok):
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    return BertModel(config, generator=torch.Generator().manual_seed(0)).eval(), tok


def test_spans_by_hand():
    # windows of 8 sharing 4 tokens: starts 4 apart, the last one ends at the last token
    assert spans(14, 8, 4) == [(0, 8), (4, 12), (8, 14)]
    assert spans(8, 8, 4) == [(0, 8)]
    assert spans(9, 8, 0) == [(0, 8), (8, 9)]  # no overlap
    assert spans(10, 4, 3) == [(0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10)]
    assert spans(0, 4, 1) == [(0, 0)]  # every sequence has a window
    for bad in (-1, 8, 9):
        with pytest.raises(BertkitError, match="stride=.* must be smaller than the 8 tokens"):
            spans(20, 8, bad)
    with pytest.raises(BertkitError, match="at least one token"):
        spans(20, 0, 0)


def test_read_tokens_is_what_the_spans_hold():
    """The arithmetic count (a server's --max-request-tokens) against the windows made, every length up to
    several windows, every size and overlap of small windows, with and without per-window extras."""
    assert read_tokens(14, 8, 4, 2) == 8 + 8 + 6 + 3 * 2
    for n in range(0, 40):
        for size in range(1, 10):
            for stride in range(size):
                for extra in (0, 2, 7):
                    assert read_tokens(n, size, stride, extra) == sum(e - s + extra for s, e in spans(n, size, stride))
    with pytest.raises(BertkitError, match="stride=.* must be smaller than the 8 tokens"):
        read_tokens(20, 8, 8)


def test_max_context_owner_by_hand():
    # run_squad.py's rule worked out on paper for windows [0,8), [4,12), [8,14):
    # position 5: min(5,2)=2 in the first vs min(1,6)=1 in the second -> first;
    # position 6: min(6,1)=1 vs min(2,5)=2 -> second; position 10: min(6,1) vs min(2,3) -> third
    assert max_context_owner([(0, 8), (4, 12), (8, 14)], 14) == [0] * 6 + [1] * 4 + [2] * 4
    # a tie goes to the earlier window unless the later one is longer (0.01 * length)
    assert max_context_owner([(0, 4), (2, 6)], 6) == [0, 0, 0, 1, 1, 1]
    assert max_context_owner([(0, 4), (2, 5)], 5) == [0, 0, 0, 1, 1]
    assert best_span([(0, 4), (2, 5)], 3) == 1  # min(3,0)=0 vs min(1,1)=1


def test_max_context_owner_is_best_span_of_every_position():
    for n in range(0, 40):
        for size in range(1, 12):
            for stride in range(size):
                windows = spans(n, size, stride)
                assert max_context_owner(windows, n) == [best_span(windows, p) for p in range(n)]


@pytest.mark.parametrize("size", range(1, 21))
def test_default_overlap_advances_by_half_a_window(size):
    # embed's default before stride meant the overlap: a step of max(1, size // 2)
    windows = spans(50, size, half_window(size))
    starts = [s for s, _ in windows]
    assert all(b - a == max(1, size // 2) for a, b in zip(starts, starts[1:]))
    assert windows[-1][1] == 50


def test_tokenizer_overflow_windows_are_the_spans(tok):
    text = " ".join(f"w{i}" for i in range(30))  # pieces of each word: w + ##N
    content = tok.encode(text, truncation=False, add_special_tokens=False).input_ids
    enc = tok.encode(text, max_length=9, stride=3, return_overflowing=True)
    rows = [enc, *enc.overflowing]
    expect = [content[s:e] for s, e in spans(len(content), 7, 3)]
    assert [r.input_ids[1:-1] for r in rows] == expect


def test_embed_stride_is_the_overlap(tiny):
    model, tok = tiny
    text = " ".join(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"] * 2)
    ids = tok.encode(text, max_length=512, truncation=False).input_ids
    content = ids[1:-1]
    assert len(content) == 14
    # windows of 8 content tokens sharing 6: starts 0, 2, 4, 6 (a step of 6 would give two windows)
    got = embed(text, tiny, pooling=None, max_length=10, stride=6)
    windows = [(0, 8), (2, 10), (4, 12), (6, 14)]
    # by hand: p=4 scores 3 in window 0 (min(4,3)) vs 2 in window 1; p=5 scores 3 in window 1
    owner = [0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 3]
    assert max_context_owner(windows, 14) == owner
    with torch.no_grad():
        outs = [model(torch.tensor([[ids[0], *content[s:e], ids[-1]]])).last_hidden_state[0].numpy()
                for s, e in windows]
    np.testing.assert_allclose(got[0], outs[0][0], atol=1e-5)
    np.testing.assert_allclose(got[-1], outs[-1][-1], atol=1e-5)
    for p in range(14):
        k = owner[p]
        np.testing.assert_allclose(got[1 + p], outs[k][1 + p - windows[k][0]], atol=1e-5)
    with pytest.raises(BertkitError, match="stride=8 must be smaller"):
        embed(text, tiny, max_length=10, stride=8)


def test_shape_by_hand():
    from bertkit.text.windows import Shape, shape

    # a sentence model's preset length (max_seq_length 256 of 512 positions) truncates there
    assert shape(512, 256) == Shape(256, half_window(254), True)
    # an explicit length windows, with the overlap asked or half a window; a preset beyond the positions is capped
    assert shape(512, 256, max_length=130, stride=16) == Shape(130, 16, False)
    assert shape(512) == Shape(512, 255, False) and shape(64, 4096) == Shape(64, 31, True)
    assert shape(512, 256, truncate=False).truncate is False
    with pytest.raises(BertkitError, match="between 3 and the model's 512"):
        shape(512, max_length=600)
    with pytest.raises(BertkitError, match="stride=128 must be smaller than the 126 tokens"):
        shape(512, max_length=128, stride=128)


def test_the_commands_name_the_overlap_stride():
    """`bertkit index` and `bertkit embed` take the overlap as --stride; index's old --overlap still works."""
    from bertkit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["embed", "in.txt", "-o", "v.npy", "--stride", "5"]).stride == 5
    assert parser.parse_args(["index", "corpus", "-o", "ix", "--stride", "5"]).stride == 5
    assert parser.parse_args(["index", "corpus", "-o", "ix", "--overlap", "7"]).stride == 7
