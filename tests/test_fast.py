"""bertkit.runtime.fast: the oneDNN route computes what F.linear computes, forward and backward;
an accelerated model computes what the plain model computes; each CPU rule (`decide`) with the
CPU's flags or vendor mocked; the settings live on the model, not in the process."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import bertkit.runtime.fast as L
from bertkit import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel
from bertkit.errors import BertkitError
from bertkit.runtime.devices import cpu_features
from bertkit.runtime.fast import FastLinear, pack_weights

onednn = pytest.mark.skipif(not cpu_features().onednn, reason="this torch build has no oneDNN linear")

SHAPES = [((7, 16), 8), ((3, 5, 24), 40), ((2, 3, 4, 12), 5), ((1, 384), 1536)]


def on(**forced):
    """These tests are about the oneDNN route: inference takes it whatever rule 1 picks for this
    CPU and thread count (the rule has its own tests below)."""
    return L.decide(**{"onednn": True, **forced})


def linear(x, w, b=None, speed=None, packed=False, **post):
    """fast.linear on `speed` (default: the oneDNN route); packed=True: on a packed copy of w."""
    return L.linear(x, w, b, speed or on(), (lambda: L.pack(w)) if packed else None, **post)


def Linear(*shape, **forced):
    return FastLinear(*shape, speed=on(**forced))


def operands(x_shape, out, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*x_shape, generator=g)
    w = torch.randn(out, x_shape[-1], generator=g) / x_shape[-1] ** 0.5
    b = torch.randn(out, generator=g)
    return x, w, b


@onednn
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


@onednn
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


@onednn
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


@onednn
@pytest.mark.filterwarnings("ignore:Input #")
def test_gradcheck_through_the_route():
    """Finite differences in float32 (oneDNN has no float64): loose tolerance, real check."""
    x, w, b = operands((4, 6), 3, seed=4)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(linear, (x, w, b), eps=1e-2, atol=5e-3, rtol=5e-3)


@onednn
def test_non_contiguous_input():
    x, w, b = operands((12, 16), 8, seed=5)
    xt = x.t().contiguous().t()[::2]  # strided rows
    assert not xt.is_contiguous()
    torch.testing.assert_close(linear(xt, w, b), F.linear(xt, w, b), atol=1e-5, rtol=1e-5)


@onednn
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


@onednn
def test_packed_layer_replays_its_route_only_while_the_route_holds(monkeypatch):
    """FastLinear remembers the route of its last packed inference call and calls the kernel
    directly next time; every change the route was chosen by sends it back through `linear`:
    a weight changed in place or replaced through .data, new settings (oneDNN off, post-ops
    apart), another dtype, a gradient, autocast. Each answer is F.linear's (with the GELU / the add)."""
    calls = []
    real = L.linear
    monkeypatch.setattr(L, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    layer = pack_weights(Linear(16, 8))
    x, r = torch.randn(2, 3, 16), torch.randn(2, 3, 8)

    def check(act=None, residual=None, expect_linear=True):
        calls.clear()
        with torch.inference_mode():
            got = layer(x, act=act, residual=residual)
        want = F.linear(x, layer.weight, layer.bias)
        want = F.gelu(want) if act is F.gelu else want if residual is None else want + residual
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert len(calls) == (1 if expect_linear else 0)

    check()  # the first call decides the route
    check(expect_linear=False)  # replayed
    check(act=F.gelu, expect_linear=False)  # the same kernel with its GELU post-op
    check(residual=r, expect_linear=False)
    with torch.no_grad():
        layer.weight.add_(1.0)  # in place: a new version
    check()
    check(expect_linear=False)
    layer.weight.data = torch.randn(8, 16)  # through .data: a new pointer, the same version
    check()
    layer.use(on(fuse=False))  # post-ops apart: new settings, a new route
    check(act=F.gelu)
    check(act=F.gelu, expect_linear=False)  # replayed, the GELU still apart
    layer.use(L.decide(onednn=False))
    check()  # F.linear now, and again: nothing is replayed while oneDNN is off
    check()
    layer.use(on())
    check()
    check(expect_linear=False)
    calls.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.inference_mode():
        assert layer(x).dtype == torch.bfloat16 and len(calls) == 1  # autocast must see F.linear
    xd = x.double()
    with torch.inference_mode():
        assert layer.double()(xd).dtype == torch.float64  # another dtype: F.linear's, no stale plan
    layer.float()
    g = layer(x.requires_grad_()).sum()  # a gradient: the autograd route
    g.backward()
    assert x.grad is not None and layer.weight.grad is not None


@onednn
def test_a_model_that_has_run_can_be_copied_and_saved(tmp_path):
    """The remembered route holds oneDNN's packed weight, which torch can neither deep-copy nor
    pickle: copies and saved models leave it behind, plan anew and answer the same."""
    import copy

    model = L.accelerate(BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, intermediate_size=64)).eval(), on())
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = model(ids).last_hidden_state
    assert model.encoder.layers[0].attention.qkv._plan is not None  # the route was remembered
    torch.save(model, tmp_path / "model.pt")
    for other in (copy.deepcopy(model), torch.load(tmp_path / "model.pt", weights_only=False)):
        with torch.inference_mode():
            assert torch.equal(other(ids).last_hidden_state, before)


@onednn
def test_other_dtypes_and_autocast_take_f_linear():
    x, w, b = operands((4, 8), 3, seed=7)
    # float64: oneDNN has no double kernels; the result is F.linear's, bit for bit
    assert torch.equal(linear(x.double(), w.double(), b.double()), F.linear(x.double(), w.double(), b.double()))
    # autocast must see F.linear to cast it: the output is bfloat16 as transformers' would be
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, w, b).dtype == torch.bfloat16


@onednn
def test_switch_off_gives_f_linear_exactly():
    x, w, b = operands((5, 32), 64, seed=8)
    off = L.decide(onednn=False)
    assert not off.onednn_inference and not off.onednn_training and not off.onednn_bf16
    assert torch.equal(linear(x, w, b, off), F.linear(x, w, b))
    wg = w.clone().requires_grad_()
    assert torch.equal(linear(x, wg, b, off), F.linear(x, w, b))


@onednn
def test_linear_module_is_nn_linear():
    layer = Linear(4, 3)
    assert isinstance(layer, torch.nn.Linear)
    assert set(layer.state_dict()) == {"weight", "bias"}


@onednn
def test_packed_model_gives_the_same_outputs():
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    model = L.accelerate(BertModel(config, generator=torch.Generator().manual_seed(0)).eval(), on(), training=True)
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = model(ids).last_hidden_state
        packed = pack_weights(model)(ids).last_hidden_state
        again = pack_weights(model, enabled=False)(ids).last_hidden_state
    assert all(m.packed is False for m in model.modules() if isinstance(m, FastLinear))
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)
    assert torch.equal(again, plain)


@onednn
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("x_shape,out", SHAPES[:2] + SHAPES[3:])
def test_fused_gelu_and_residual_match_the_separate_ops(x_shape, out, pack, fuse):
    """The post-op path (inference; fused in the matmul or, as on AVX2, after it) against
    F.gelu / + residual after F.linear, and the training path (separate ops) against the
    same, values and gradients."""
    speed = on(fuse=fuse)
    x, w, b = operands(x_shape, out, seed=9)
    r = torch.randn(*x_shape[:-1], out, generator=torch.Generator().manual_seed(10))
    ref_gelu, ref_res = F.gelu(F.linear(x, w, b)), F.linear(x, w, b) + r
    with torch.inference_mode():
        torch.testing.assert_close(linear(x, w, b, speed, pack, gelu=True), ref_gelu, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear(x, w, b, speed, pack, residual=r), ref_res, atol=1e-5, rtol=1e-5)
    wg = w.clone().requires_grad_()
    got = linear(x, wg, b, speed, gelu=True)
    got.sum().backward()
    w_ref = w.clone().requires_grad_()
    F.gelu(F.linear(x, w_ref, b)).sum().backward()
    torch.testing.assert_close(got.detach(), ref_gelu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wg.grad, w_ref.grad, atol=1e-4, rtol=1e-4)


def test_row_buckets_are_few_and_close_above():
    """Rule 7's sizes: never fewer rows, at most 1/8 more past 128 (a multiple of 16 below), the same
    size again for a padded count, and 40 sizes for every count up to 2,048 rows."""
    sizes = [L.row_bucket(rows) for rows in range(1, 5000)]
    assert all(rows <= size <= max(-(-rows // 16) * 16, rows * 9 / 8) for rows, size in enumerate(sizes, 1))
    assert all(L.row_bucket(size) == size for size in sizes)
    assert sizes == sorted(sizes) and len(set(sizes[:2048])) == 40


@onednn
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("x_shape", [(3, 5, 24), (1, 9, 24), (2, 70, 24), (131, 24)])
def test_padded_rows_change_no_row(x_shape, fuse):
    """With rule 7 on, a product whose rows are not a bucket size runs padded with zero rows and
    gives back its own rows: the values of the unpadded product (plain, GELU and residual post-ops,
    packed weights), in the input's shape."""
    x, w, b = operands(x_shape, 40, seed=11)
    r = torch.randn(*x_shape[:-1], 40, generator=torch.Generator().manual_seed(12))
    with torch.inference_mode():
        out = {}
        for buckets in (False, True):
            s = on(fuse=fuse, row_buckets=buckets)
            out[buckets] = [linear(x, w, b, s), linear(x, w, b, s, True, gelu=True), linear(x, w, None, s, residual=r)]
        plain, padded = out[False], out[True]
    for got, want in zip(padded, plain):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


@onednn
@pytest.mark.parametrize("fuse", [True, False])
def test_fused_gelu_is_the_erf_form_not_tanh(fuse):
    x, w, b = operands((16, 64), 128, seed=11)
    with torch.inference_mode():
        got = linear(x, w, b, on(fuse=fuse), gelu=True)
        y = F.linear(x, w, b)
    torch.testing.assert_close(got, F.gelu(y), atol=1e-6, rtol=1e-6)
    assert (got - F.gelu(y, approximate="tanh")).abs().max() > 1e-5  # the two forms differ measurably here


@onednn
def test_fusing_both_is_refused():
    x, w, b = operands((4, 8), 8)
    with pytest.raises(ValueError, match="not both"):
        linear(x, w, b, gelu=True, residual=torch.zeros(4, 8))


# --- accelerate: the same model, computed faster ----------------------------------------------

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def padded_batch(seed=0, B=4, T=13):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate([T, 9, 5, 1][:B]):
        mask[b, :n] = 1
    return ids * mask, mask, (torch.arange(T) >= T // 2).long().expand(B, T) * mask


def twins(cls, attn, seed=0, speed=None, **overrides):
    """(plain, accelerated on `speed`, default the oneDNN route): the same weights, built twice from one seed."""
    config = BertConfig(**{**TINY, **overrides}, attn_implementation=attn)
    return (cls(config, generator=torch.Generator().manual_seed(seed)),
            L.accelerate(cls(config, generator=torch.Generator().manual_seed(seed)), speed or on()))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_accelerated_model_equals_the_plain_one(attn):
    """Inference (packed weights, fused GELU/residual): every layer within 1e-5 at real tokens
    (padding outputs, which nothing reads, differ by summation order)."""
    plain, fast = twins(BertModel, attn)
    plain.eval(), fast.eval()
    ids, mask, types = padded_batch()
    real = mask.bool()
    for grad_mode in (torch.inference_mode, torch.no_grad):
        with grad_mode():
            a = plain(ids, mask, types, output_hidden_states=True)
            b = fast(ids, mask, types, output_hidden_states=True)
        for x, y in zip(a.hidden_states, b.hidden_states):
            torch.testing.assert_close(y[real], x[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(b.pooler_output, a.pooler_output, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_accelerated_training_gives_the_plain_gradients(attn):
    """training=True: the pre-training loss (MLM at the labelled positions + NSP) and every
    parameter's gradient within 1e-5 of the plain model's (dropout 0 so both see one function)."""
    config = BertConfig(**TINY, attn_implementation=attn)
    plain = BertForPreTraining(config, generator=torch.Generator().manual_seed(1)).train()
    fast = L.accelerate(BertForPreTraining(config, generator=torch.Generator().manual_seed(1)), on(), training=True).train()
    ids, mask, types = padded_batch(seed=1)
    labels = torch.where((torch.arange(13) % 3 == 0) & mask.bool(), ids, torch.full_like(ids, -100))
    nsp = torch.tensor([0, 1, 1, 0])
    outs = [m(ids, mask, types, labels=labels, next_sentence_label=nsp) for m in (plain, fast)]
    for out in outs:
        out.loss.backward()
    torch.testing.assert_close(outs[1].loss, outs[0].loss, atol=1e-5, rtol=0)
    grads = [dict((n, p.grad) for n, p in m.named_parameters()) for m in (plain, fast)]
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_accelerate_keeps_parameters_names_and_checkpoints(tmp_path):
    from safetensors.torch import load_file

    plain, fast = twins(BertForSequenceClassification, "sdpa", num_labels=3)
    before = {n: p for n, p in fast.named_parameters()}
    opt = torch.optim.SGD(fast.parameters(), lr=0.1)  # built before: must still drive the model
    assert L.accelerate(fast) is fast
    assert {n: p for n, p in fast.named_parameters()} == before  # the same tensor objects
    assert list(fast.state_dict()) == list(plain.state_dict())
    assert isinstance(fast.classifier, L.FastLinear) and isinstance(fast.classifier, torch.nn.Linear)
    assert type(fast).__name__ == "BertForSequenceClassification"
    plain.save_pretrained(tmp_path / "plain")
    fast.save_pretrained(tmp_path / "fast")
    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "fast" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "plain" / "config.json").read_text() == (tmp_path / "fast" / "config.json").read_text()
    ids, mask, types = padded_batch()
    fast.train()
    fast(ids, mask, types, labels=torch.tensor([0, 1, 2, 0])).loss.backward()
    opt.step()
    assert not torch.equal(fast.classifier.weight, plain.classifier.weight)  # the optimizer moved them


def test_post_ops_are_fused_only_where_the_cpu_has_avx512():
    real = cpu_features()
    assert not L.decide(dataclasses.replace(real, flags=("avx2", "fma"))).fuse_post_ops
    assert L.decide(dataclasses.replace(real, flags=("avx2", "fma", "avx512f"))).fuse_post_ops
    assert not L.decide(dataclasses.replace(real, flags=("avx2", "fma", "avx512f")), fuse=False).fuse_post_ops


@onednn
@pytest.mark.parametrize("fuse", [True, False])
def test_inference_fuses_gelu_and_residual_into_the_matmuls(fuse, monkeypatch):
    _, model = twins(BertModel, "sdpa", speed=on(fuse=fuse))
    post_ops = []
    real = L._onednn
    monkeypatch.setattr(L, "_onednn", lambda x, w, b, post_op="none", algorithm="": post_ops.append(post_op)
                        or real(x, w, b, post_op, algorithm))
    ids, mask, types = padded_batch()
    with torch.inference_mode():
        model.eval()(ids, mask, types)
    assert post_ops.count("gelu") == (2 if fuse else 0)  # one per layer where fused
    post_ops.clear()
    model.train()(ids, mask, types)  # training: separate ops, oneDNN forward of every dense layer
    assert "gelu" not in post_ops and len(post_ops) == 2 * 4 + 1


def test_switched_off_accelerated_model_is_the_plain_model_exactly():
    """decide(onednn=False): the very same kernels as the plain model."""
    plain, fast = twins(BertModel, "sdpa", speed=L.decide(onednn=False))
    ids, mask, types = padded_batch()
    with torch.inference_mode():
        assert torch.equal(fast.eval()(ids, mask, types).last_hidden_state,
                           plain.eval()(ids, mask, types).last_hidden_state)


def test_inference_runs_mkl_only_on_one_thread_of_a_cpu_without_avx512():
    real = dataclasses.replace(cpu_features(), onednn=True)
    for flags, n, onednn in [(("avx2", "fma"), 1, False), (("avx2", "fma"), 2, True),
                             (("avx2", "fma", "avx512f"), 1, True), (("avx2", "fma", "avx512f"), 2, True)]:
        speed = L.decide(dataclasses.replace(real, flags=flags), threads=n)
        assert speed.onednn_inference == onednn and speed.matmul_kernel == ("oneDNN" if onednn else "MKL"), (flags, n)
    avx2 = dataclasses.replace(real, flags=("avx2", "fma"))
    assert L.decide(avx2, onednn=True, threads=1).onednn_inference  # forced either way
    assert not L.decide(real, onednn=False).onednn_inference and L.decide(real, onednn=False).matmul_kernel == "MKL"
    assert not L.decide(dataclasses.replace(real, onednn=False), onednn=True).onednn_inference  # no kernels, no route


@onednn
@pytest.mark.parametrize("kernel", ["oneDNN", "MKL"])
def test_inference_and_training_take_their_kernels(kernel, monkeypatch):
    speed = dataclasses.replace(on(), onednn_inference=kernel == "oneDNN")
    assert speed.matmul_kernel == kernel
    calls = []
    real = L._onednn
    monkeypatch.setattr(L, "_onednn", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, w, b = operands((6, 32), 48, seed=3)
    with torch.no_grad():
        y = linear(x, w, b, speed, packed=True)
        assert len(calls) == (1 if kernel == "oneDNN" else 0)
        if kernel == "MKL":
            assert torch.equal(y, F.linear(x, w, b))
        else:
            torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    calls.clear()  # training takes oneDNN whichever runs inference: its backward is written with it
    linear(x, w.clone().requires_grad_(), b, speed).sum().backward()
    assert len(calls) == 2  # the forward and the weight's gradient


@onednn
@pytest.mark.parametrize("vendor,onednn_trains", [("GenuineIntel", False), ("AuthenticAMD", True), ("", True)])
def test_training_runs_mkl_on_intel_and_onednn_elsewhere(vendor, onednn_trains, monkeypatch):
    """Rule 2, with the vendor mocked: the gradients are F.linear's either way."""
    cpu = dataclasses.replace(cpu_features(), vendor=vendor)
    speed = L.decide(cpu)
    assert speed.onednn_training is onednn_trains
    calls = []
    real_onednn = L._onednn
    monkeypatch.setattr(L, "_onednn", lambda *a, **k: calls.append(1) or real_onednn(*a, **k))
    x, w, b = operands((6, 32), 48, seed=12)
    ours, ref = w.clone().requires_grad_(), w.clone().requires_grad_()
    linear(x, ours, b, speed).square().sum().backward()
    F.linear(x, ref, b).square().sum().backward()
    assert len(calls) == (2 if onednn_trains else 0)  # the forward and the weight's gradient
    torch.testing.assert_close(ours.grad, ref.grad, atol=1e-4, rtol=1e-5)
    assert L.decide(cpu, onednn=True).onednn_training  # forced either way
    assert not L.decide(cpu, onednn=False).onednn_training


def test_accelerate_refuses_what_is_not_a_model():
    with pytest.raises(BertkitError, match="nn.Module"):
        L.accelerate("model/")
    with pytest.raises(BertkitError, match="SpeedSettings"):
        L.accelerate(BertModel(BertConfig(**TINY)), {"onednn": False})


@onednn
def test_settings_belong_to_the_model_not_the_process(monkeypatch):
    """Two models in one process on different settings each run their own kernels (no global switch
    between them), accelerating again hands the modules the new settings, and the default is this CPU's."""
    calls = []
    real = L._onednn
    monkeypatch.setattr(L, "_onednn", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain, routed = twins(BertModel, "sdpa")
    _, mkl = twins(BertModel, "sdpa", speed=L.decide(onednn=False))
    ids, mask, types = padded_batch()
    with torch.inference_mode():
        ref = plain.eval()(ids, mask, types).last_hidden_state
        for model, kernels in ((routed, True), (mkl, False), (routed, True)):
            calls.clear()
            model.eval()(ids, mask, types)
            assert bool(calls) is kernels
        assert torch.equal(mkl(ids, mask, types).last_hidden_state, ref)
        L.accelerate(routed, L.decide(onednn=False))  # again, on other settings: the modules take them
        assert torch.equal(routed(ids, mask, types).last_hidden_state, ref)
    assert all(m.speed == L.decide() for m in L.accelerate(BertModel(BertConfig(**TINY))).modules()
               if isinstance(m, FastLinear))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_accelerated_model_on_cuda_matches_the_cpu():
    plain, fast = twins(BertModel, "sdpa")
    ids, mask, types = padded_batch()
    fast = fast.eval().to("cuda")
    with torch.inference_mode():
        ref = plain.eval()(ids, mask, types).last_hidden_state
        got = fast(ids.cuda(), mask.cuda(), types.cuda()).last_hidden_state.cpu()
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=1e-4, rtol=0)  # TF32 off by default: float32 sums


@pytest.mark.parametrize("kwargs, words", [
    (dict(onednn="0"), "onednn must be True, False or None"),  # a truthy string: it forced oneDNN on
    (dict(fuse=1), "fuse must be True, False or None"),
    (dict(per_token="no"), "per_token must be True, False or None"),
    (dict(row_buckets=None), "row_buckets must be True or False"),
    (dict(threads=0), "threads"),
])
def test_decide_refuses_switches_that_are_not_booleans(kwargs, words):
    with pytest.raises(BertkitError, match=words):
        L.decide(**kwargs)
    assert L.decide(onednn=False).onednn_inference is False  # the booleans themselves still decide
