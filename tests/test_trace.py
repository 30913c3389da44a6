"""bertkit.trace: every traced tensor recomputed by hand from the ones before it, ending at the
model's own layer output (hidden_states, not a hook), on a tiny odd-shaped random model and on the
default model; bad input gives BertkitError."""

import math

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertkitError
from bertkit.model.config import BertConfig
from bertkit.model.modeling import BertModel
from bertkit.text.tokenizer import Tokenizer
from bertkit.explain.tracing import TENSORS, trace

WORDS = ["the", "bank", "of", "river", "money", "flooded", "lent", "me", "some", "##s", ".", ","]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
ATOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=24)
    model = BertModel(config, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a swapped parameter shows
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    return model.eval(), Tokenizer(VOCAB)


def recompute_layer(t, layer_module):
    """The layer of BertLayer's docstring, by hand from the traced tensors and the layer's weights;
    every step is checked against the traced tensor of the same name."""
    T, H = t.layer_input.shape
    N, D = t.num_heads, t.head_size
    qkv = layer_module.attention.qkv
    W, b = qkv.weight.detach(), qkv.bias.detach()
    for i, name in enumerate(("query", "key", "value")):  # rows 0:H queries, H:2H keys, 2H:3H values
        x = t.layer_input @ W[i * H:(i + 1) * H].T + b[i * H:(i + 1) * H]  # [T, H]
        torch.testing.assert_close(x.view(T, N, D).transpose(0, 1), getattr(t, name), atol=ATOL, rtol=0)
    scores = torch.einsum("ntd,nsd->nts", t.query, t.key)  # [N, T, T]
    torch.testing.assert_close(scores, t.scores, atol=ATOL, rtol=0)
    torch.testing.assert_close(scores / math.sqrt(D), t.scaled_scores, atol=ATOL, rtol=0)
    # the model's own weights (output_attentions) are the softmax of the scaled scores
    torch.testing.assert_close(torch.softmax(t.scaled_scores, dim=-1), t.weights, atol=ATOL, rtol=0)
    torch.testing.assert_close(t.weights.sum(-1), torch.ones(N, T), atol=ATOL, rtol=0)
    per_head = t.weights @ t.value  # [N, T, D]: each row a weighted average of value vectors
    torch.testing.assert_close(per_head, t.head_context, atol=ATOL, rtol=0)
    context = torch.cat(list(per_head), dim=-1)  # N x [T, D] -> [T, H]
    torch.testing.assert_close(context, t.context, atol=ATOL, rtol=0)
    out = layer_module.attention.output
    projected = context @ out.weight.detach().T + out.bias.detach()
    torch.testing.assert_close(projected, t.attention_output, atol=ATOL, rtol=0)
    residual = t.layer_input + projected
    torch.testing.assert_close(residual, t.attention_residual, atol=ATOL, rtol=0)
    ln = layer_module.attention_norm
    x = F.layer_norm(residual, (H,), ln.weight.detach(), ln.bias.detach(), ln.eps)
    torch.testing.assert_close(x, t.attention_norm, atol=ATOL, rtol=0)
    w1, w2 = layer_module.intermediate, layer_module.output
    inner = x @ w1.weight.detach().T + w1.bias.detach()  # [T, I]
    torch.testing.assert_close(inner, t.intermediate, atol=ATOL, rtol=0)
    act = 0.5 * inner * (1 + torch.erf(inner / math.sqrt(2)))  # BERT's exact GELU
    torch.testing.assert_close(act, t.activated, atol=ATOL, rtol=0)
    ffn = act @ w2.weight.detach().T + w2.bias.detach()
    torch.testing.assert_close(ffn, t.ffn_output, atol=ATOL, rtol=0)
    torch.testing.assert_close(x + ffn, t.ffn_residual, atol=ATOL, rtol=0)
    ln = layer_module.output_norm
    return F.layer_norm(x + ffn, (H,), ln.weight.detach(), ln.bias.detach(), ln.eps)


def check_embeddings(t, model):
    emb = model.embeddings
    torch.testing.assert_close(emb.word_embeddings.weight[t.token_ids].detach(), t.token_embeddings)
    total = t.token_embeddings + t.position_embeddings + t.segment_embeddings
    torch.testing.assert_close(total, t.embedding_sum, atol=ATOL, rtol=0)
    ln = emb.layer_norm
    normed = F.layer_norm(total, total.shape[-1:], ln.weight.detach(), ln.bias.detach(), ln.eps)
    torch.testing.assert_close(normed, t.embedding_output, atol=ATOL, rtol=0)
    torch.testing.assert_close(t.embedding_output, t.hidden_states[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("layer", [0, 1])
def test_tiny_model_layer_by_hand(tiny, layer):
    model, tok = tiny
    t = trace("the bank of the river flooded .", layer=layer, head=3, pair="the bank lent me some money .",
              model=(model, tok))
    assert t.tokens[0] == "[CLS]" and t.tokens.count("[SEP]") == 2 and 1 in t.token_type_ids
    check_embeddings(t, model)
    torch.testing.assert_close(t.layer_input, t.hidden_states[layer])
    by_hand = recompute_layer(t, model.encoder.layers[layer])
    torch.testing.assert_close(by_hand, t.layer_output, atol=ATOL, rtol=0)
    torch.testing.assert_close(by_hand, t.hidden_states[layer + 1], atol=ATOL, rtol=0)  # the model's own output
    assert torch.equal(t.q, t.query[3]) and torch.equal(t.head_weights, t.weights[3])
    T = len(t.tokens)
    assert t.shapes()["weights"] == (4, T, T) and t.shapes()["intermediate"] == (T, 37)
    assert set(t.shapes()) == set(TENSORS)


def test_tiny_model_is_left_as_it_was(tiny):
    model, tok = tiny
    model.train()
    try:
        hooks = sum(len(m._forward_hooks) for m in model.modules())
        t = trace("the river .", layer=-1, model=(model, tok))
        assert model.training and sum(len(m._forward_hooks) for m in model.modules()) == hooks
        assert t.layer == 1  # -1 is the last layer
        with torch.no_grad():  # dropout was off during the trace: the eval output
            assert torch.allclose(model.eval()(torch.tensor([t.token_ids])).last_hidden_state[0], t.hidden_states[-1],
                                  atol=ATOL)
    finally:
        model.eval()


def test_default_model_layer_by_hand(default_model_dir):
    from bertkit.explain.tracing import load_plain_encoder

    t = trace("The bank of the river flooded after the storm.", layer=4, head=7)
    model, _ = load_plain_encoder(None)
    assert model.config.hidden_size == 384 and t.weights.shape[0] == 12
    check_embeddings(t, model)
    by_hand = recompute_layer(t, model.encoder.layers[4])
    torch.testing.assert_close(by_hand, t.hidden_states[5], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(text="the bank", layer=2), "layer 2 is out of range"),
        (dict(text="the bank", layer=-3), "layer -3 is out of range"),
        (dict(text="the bank", head=4), "head 4 is out of range"),
        (dict(text="the bank", head=-1), "head -1 is out of range"),
        (dict(text="   "), "non-empty text"),
        (dict(text="the bank", pair=""), "pair"),
        (dict(text="the bank " * 20), "at most 24"),
        (dict(text=["the bank"]), "text must be a str .* got list"),  # was "needs a non-empty text"
        (dict(text="the bank", pair=5), "pair must be a str .* got int"),  # was "the pair is empty"
    ],
)
def test_bad_input(tiny, kwargs, message):
    with pytest.raises(BertkitError, match=message):
        trace(model=tiny, **kwargs)


def test_bad_model():
    with pytest.raises(BertkitError, match="model must be"):
        trace("the bank", model=42)
    with pytest.raises(BertkitError, match="BERT encoder"):
        trace("the bank", model=(torch.nn.Linear(2, 2), Tokenizer(VOCAB)))


def test_accelerated_model_is_refused():
    """bertkit.accelerate swaps the dense layers for ones that apply GELU / the residual inside their
    kernel: their hooks would not see W x + b, so trace says so instead of returning wrong tensors."""
    import copy

    from bertkit import accelerate

    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=24)
    fast = accelerate(copy.deepcopy(BertModel(config, generator=torch.Generator().manual_seed(0)).eval()))
    with pytest.raises(BertkitError, match="trace the plain model"):
        trace("the bank", model=(fast, Tokenizer(VOCAB)))


def test_a_loaded_model_is_traced_as_its_folder(tiny, tmp_path):
    """`bertkit.load()`'s result (the one way in for inference, which `embed` and `attention_map` take) is traced
    through its folder's plain layers: its own are fused for speed. It was refused ("model must be None ...,
    got Loaded"). Reference: the trace of the same folder given by its path, and the model's own last layer."""
    from bertkit.runtime.loading import load

    model, tok = tiny
    model.save_pretrained(tmp_path, tokenizer=tok)
    loaded = load(tmp_path)
    by_loaded = trace("the bank lent me some money", layer=1, head=2, model=loaded)
    by_folder = trace("the bank lent me some money", layer=1, head=2, model=tmp_path)
    for name in TENSORS:
        torch.testing.assert_close(getattr(by_loaded, name), getattr(by_folder, name), atol=0, rtol=0)
    own = model(torch.tensor([by_loaded.token_ids])).last_hidden_state[0]
    torch.testing.assert_close(by_loaded.hidden_states[-1], own, atol=ATOL, rtol=0)
