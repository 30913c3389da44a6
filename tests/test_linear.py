"""bertkit.linear: the oneDNN route computes what F.linear computes, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import bertkit.linear as L
from bertkit.linear import Linear, linear, pack_weights

pytestmark = pytest.mark.skipif(not L.onednn_enabled(), reason="this torch build has no oneDNN linear")

SHAPES = [((7, 16), 8), ((3, 5, 24), 40), ((2, 3, 4, 12), 5), ((1, 384), 1536)]


def operands(x_shape, out, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*x_shape, generator=g)
    w = torch.randn(out, x_shape[-1], generator=g) / x_shape[-1] ** 0.5
    b = torch.randn(out, generator=g)
    return x, w, b


@pytest.mark.parametrize("x_shape,out", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward_matches_f_linear(x_shape, out, with_bias):
    x, w, b = operands(x_shape, out)
    b = b if with_bias else None
    ref = F.linear(x, w, b)
    for mode in (torch.no_grad, torch.inference_mode, torch.enable_grad):
        with mode():
            got = linear(x, w, b)
        assert got.shape == ref.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("x_shape,out", SHAPES[:3])
def test_backward_matches_f_linear(x_shape, out):
    x, w, b = operands(x_shape, out, seed=1)
    g = torch.randn(*x_shape[:-1], out, generator=torch.Generator().manual_seed(2))
    grads = []
    for fn in (F.linear, linear):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        (fn(xs, ws, bs) * g).sum().backward()
        grads.append((xs.grad, ws.grad, bs.grad))
    for ours, ref in zip(grads[1], grads[0]):
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_backward_both_weight_grad_layouts():
    """grad_W is computed as g^T x or (x^T g)^T depending on which is narrower: check both."""
    for inp, out in ((8, 40), (40, 8)):
        x, w, b = operands((6, inp), out, seed=3)
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        linear(xs, ws, b).square().sum().backward()
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        F.linear(xr, wr, b).square().sum().backward()
        torch.testing.assert_close(ws.grad, wr.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(xs.grad, xr.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:Input #")
def test_gradcheck_through_the_route():
    """Finite differences in float32 (oneDNN has no float64): loose tolerance, real check."""
    x, w, b = operands((4, 6), 3, seed=4)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(linear, (x, w, b), eps=1e-2, atol=5e-3, rtol=5e-3)


def test_non_contiguous_input():
    x, w, b = operands((12, 16), 8, seed=5)
    xt = x.t().contiguous().t()[::2]  # strided rows
    assert not xt.is_contiguous()
    torch.testing.assert_close(linear(xt, w, b), F.linear(xt, w, b), atol=1e-5, rtol=1e-5)


def test_packed_weight_follows_in_place_updates():
    """Inference keeps a packed copy of each weight; an optimizer step or load_state_dict
    (in-place changes) must be seen by the next call, never the stale copy."""
    layer = pack_weights(Linear(16, 8))
    assert layer.packed
    x = torch.randn(4, 16)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    for _ in range(3):
        with torch.inference_mode():
            got = layer(x)
        torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        layer(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    state = {k: torch.randn_like(v) for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, state["weight"], state["bias"]), atol=1e-5, rtol=1e-5)


def test_other_dtypes_and_autocast_take_f_linear():
    x, w, b = operands((4, 8), 3, seed=7)
    # float64: oneDNN has no double kernels; the result is F.linear's, bit for bit
    assert torch.equal(linear(x.double(), w.double(), b.double()), F.linear(x.double(), w.double(), b.double()))
    # autocast must see F.linear to cast it: the output is bfloat16 as transformers' would be
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, w, b).dtype == torch.bfloat16


def test_switch_off_gives_f_linear_exactly():
    x, w, b = operands((5, 32), 64, seed=8)
    L.use_onednn(False)
    try:
        assert not L.onednn_enabled()
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    finally:
        L.use_onednn(True)


def test_linear_module_is_nn_linear():
    layer = Linear(4, 3)
    assert isinstance(layer, torch.nn.Linear)
    assert set(layer.state_dict()) == {"weight", "bias"}


def test_packed_model_gives_the_same_outputs():
    from bertkit import BertConfig, BertModel

    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    model = BertModel(config, generator=torch.Generator().manual_seed(0)).eval()
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = model(ids).last_hidden_state
        packed = pack_weights(model)(ids).last_hidden_state
        again = pack_weights(model, enabled=False)(ids).last_hidden_state
    assert all(m.packed is False for m in model.modules() if isinstance(m, Linear))
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)
    assert torch.equal(again, plain)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("x_shape,out", SHAPES[:2] + SHAPES[3:])
def test_fused_gelu_and_residual_match_the_separate_ops(x_shape, out, pack):
    """The post-op path (inference) against F.gelu / + residual after F.linear, and the
    training path (separate ops) against the same, values and gradients."""
    x, w, b = operands(x_shape, out, seed=9)
    r = torch.randn(*x_shape[:-1], out, generator=torch.Generator().manual_seed(10))
    ref_gelu, ref_res = F.gelu(F.linear(x, w, b)), F.linear(x, w, b) + r
    with torch.inference_mode():
        torch.testing.assert_close(linear(x, w, b, pack=pack, gelu=True), ref_gelu, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear(x, w, b, pack=pack, residual=r), ref_res, atol=1e-5, rtol=1e-5)
    wg = w.clone().requires_grad_()
    got = linear(x, wg, b, gelu=True)
    got.sum().backward()
    w_ref = w.clone().requires_grad_()
    F.gelu(F.linear(x, w_ref, b)).sum().backward()
    torch.testing.assert_close(got.detach(), ref_gelu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wg.grad, w_ref.grad, atol=1e-4, rtol=1e-4)


def test_fused_gelu_is_the_erf_form_not_tanh():
    x, w, b = operands((16, 64), 128, seed=11)
    with torch.inference_mode():
        got = linear(x, w, b, gelu=True)
        y = F.linear(x, w, b)
    torch.testing.assert_close(got, F.gelu(y), atol=1e-6, rtol=1e-6)
    assert (got - F.gelu(y, approximate="tanh")).abs().max() > 1e-5  # the two forms differ measurably here


def test_fusing_both_is_refused():
    x, w, b = operands((4, 8), 8)
    with pytest.raises(ValueError, match="not both"):
        linear(x, w, b, gelu=True, residual=torch.zeros(4, 8))
