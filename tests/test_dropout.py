"""Dropout and attention with dropout, held to their definitions.

bertkit.model.dropout draws its mask from 32-bit integers instead of torch's bernoulli_:
the mask must still be Bernoulli (rate, independence between neighbours and between
the two halves of a draw), seeded, and the arithmetic torch's. bertkit.model.chunked_attention
must give the plain computation's output and gradients with the same mask, and its
backward must be the derivative of its forward (a numerical gradient check).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from bertkit.model import chunked_attention
from bertkit.model.config import BertConfig
from bertkit.model.dropout import Dropout, dropout, keep_mask
from bertkit.model.modeling import BertModel, BertSelfAttention, additive_mask

N = 2_000_000


@pytest.mark.parametrize("p", [0.1, 0.5, 0.03])
def test_mask_is_bernoulli(p):
    torch.manual_seed(0)
    keep = keep_mask((N,), p)
    sd = math.sqrt(p * (1 - p) / N)
    for part in (keep, keep[0::2], keep[1::2]):  # the two int32 halves of each 64-bit draw alike
        assert abs((~part).float().mean().item() - p) < 5 * sd * math.sqrt(N / part.numel())
    # neighbours are independent: both dropped as often as p^2
    both = (~keep[:-1] & ~keep[1:]).float().mean().item()
    assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / N)


def test_mask_follows_the_seed_and_fills_out():
    torch.manual_seed(3)
    a = keep_mask((7, 9), 0.1)
    torch.manual_seed(3)
    out = torch.empty((7, 9), dtype=torch.bool)
    b = keep_mask((7, 9), 0.1, out=out)
    assert b is out and torch.equal(a, b)
    assert not torch.equal(a, keep_mask((7, 9), 0.1))  # the generator moved on


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_is_torchs_arithmetic_on_the_mask(dtype):
    x = torch.randn(1000, 33).to(dtype).requires_grad_()
    torch.manual_seed(1)
    y = dropout(x, 0.2)
    torch.manual_seed(1)
    keep = keep_mask(x.shape, 0.2)
    expected = x.detach() * keep.to(dtype).div_(0.8)  # torch's own: the mask scaled in x's dtype
    assert torch.equal(y, expected)
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.equal(x.grad, g * keep.to(dtype).div_(0.8))
    # the expected value is kept
    ones = torch.ones(N)
    assert abs(dropout(ones, 0.1).mean().item() - 1) < 5 * math.sqrt(0.1 / 0.9 / N)


def test_dropout_off_and_edges():
    x = torch.randn(10, 10)
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # torch's p = 1
    with pytest.raises(ValueError):
        dropout(x, 1.5)
    m = Dropout(0.1)
    assert isinstance(m, torch.nn.Dropout) and m.p == 0.1
    assert m.eval()(x) is x


def plain_attention(q, k, v, mask, p):
    """The explicit computation with bertkit.model.dropout's mask of the whole [B, N, T, T]."""
    w = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask).softmax(-1)
    return dropout(w, p) @ v


def qkv(B=5, N=4, T=14, D=8, dtype=torch.float64):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, T, D, dtype=dtype, requires_grad=True) for _ in range(3))
    attention_mask = torch.ones(B, T)
    attention_mask[1, 9:] = 0
    attention_mask[B - 1, 3:] = 0
    return q, k, v, additive_mask(attention_mask, dtype)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_chunks_give_the_plain_computation(monkeypatch, rows):
    q, k, v, mask = qkv()
    monkeypatch.setattr(chunked_attention, "CHUNK_WEIGHTS", rows * 4 * 14 * 14)
    assert chunked_attention.rows_per_chunk(q.shape) == rows
    g = torch.randn(q.shape, dtype=q.dtype)
    torch.manual_seed(7)
    out = chunked_attention.attention(q, k, v, mask, 0.3)
    grads = torch.autograd.grad(out, (q, k, v), g)
    torch.manual_seed(7)  # chunks of an even size draw the same mask as one draw of the whole
    ref = plain_attention(q, k, v, mask, 0.3)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_backward_is_the_derivative(monkeypatch):
    q, k, v, mask = qkv(B=3, N=2, T=5, D=3)
    monkeypatch.setattr(chunked_attention, "CHUNK_WEIGHTS", 2 * 2 * 5 * 5)

    def f(q, k, v):
        torch.manual_seed(11)  # the same mask at every evaluation
        return chunked_attention.attention(q, k, v, mask, 0.25)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_the_training_layer_takes_the_chunks_and_agrees_with_the_explicit_path():
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        vocab_size=50, attention_probs_dropout_prob=0.2)
    torch.manual_seed(0)
    layer = BertSelfAttention(config).double().train()
    x = torch.randn(4, 10, 32, dtype=torch.float64, requires_grad=True)
    attention_mask = torch.ones(4, 10)
    attention_mask[2, 6:] = 0
    mask = additive_mask(attention_mask, torch.float64)
    outs = []
    for explicit in (False, True):
        torch.manual_seed(5)
        out, weights = layer(x, mask, explicit)
        assert (weights is None) == (not explicit)
        outs.append((out, torch.autograd.grad(out.sum(), (x, layer.qkv.weight))))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-12)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # and it is dropout: not the inference output
    assert not torch.allclose(outs[0][0], layer.eval()(x, mask, False)[0])


def test_training_under_bf16_autocast_and_checkpointing():
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=50)
    torch.manual_seed(0)
    model = BertModel(config).train()
    ids = torch.randint(0, 50, (3, 12))
    am = torch.ones(3, 12, dtype=torch.long)
    am[1, 7:] = 0

    def grads(checkpointing, autocast):
        model.set_gradient_checkpointing(checkpointing)
        model.zero_grad()
        torch.manual_seed(9)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(ids, attention_mask=am).last_hidden_state
        out.float().pow(2).mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = grads(False, False)
    # checkpointing recomputes each layer in backward: the same masks (the generator's state is restored)
    for a, b in zip(plain, grads(True, False)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # bf16 autocast: the same masks, the gradients close to float32's
    bf16 = grads(False, True)
    cos = F.cosine_similarity(torch.cat([g.flatten() for g in plain]), torch.cat([g.flatten() for g in bf16]), dim=0)
    assert cos > 0.99
