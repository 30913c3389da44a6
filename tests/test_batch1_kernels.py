"""The kernels behind batch-1 latency: bfloat16 inference on the oneDNN route (`bertkit.runtime.fast`
rule 6) and int8 per token on oneDNN's int8 matmul (rule 5).

The rule tests mock the CPU's flags; the numeric tests run oneDNN's bfloat16 kernels and so
need a CPU that multiplies bfloat16 natively (AMX or AVX512-BF16)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import bertkit.runtime.fast as L
from bertkit import BertConfig, BertModel
from bertkit.runtime.devices import cpu_features

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
NATIVE = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
EMULATED = ("avx2", "fma", "avx512f")

native_bf16 = pytest.mark.skipif(not (cpu_features().onednn and cpu_features().native_bf16),
                                 reason="needs oneDNN and a CPU with native bfloat16 (AMX or AVX512-BF16)")


def with_flags(flags, **forced):
    """The settings `decide` makes for this CPU with `flags` (and oneDNN's kernels)."""
    return L.decide(dataclasses.replace(cpu_features(), flags=flags, onednn=True), **forced)


def operands(x_shape, out, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*x_shape, generator=g)
    w = torch.randn(out, x_shape[-1], generator=g) / x_shape[-1] ** 0.5
    b = torch.randn(out, generator=g)
    return x.to(dtype), w.to(dtype), b.to(dtype)


def record_onednn(monkeypatch):
    """Count the calls of the oneDNN route without running its kernels (so the rule tests run
    on any CPU): the recorded call returns F.linear's result."""
    calls = []
    monkeypatch.setattr(L, "_onednn", lambda x, w, b, post_op="none", algorithm="": calls.append(post_op)
                        or F.linear(x, w, b))
    return calls


@pytest.mark.parametrize("flags,routed", [(NATIVE, True), (EMULATED, False)])
def test_bfloat16_inference_takes_the_onednn_route_only_where_native(flags, routed, monkeypatch):
    speed = with_flags(flags, fuse=False)  # rule 1 as for such a CPU: oneDNN with AVX-512
    assert speed.onednn_bf16 is routed
    calls = record_onednn(monkeypatch)
    x, w, b = operands((5, 16), 8)
    with torch.inference_mode():
        linear = L.linear(x, w, b, speed)
    assert len(calls) == (1 if routed else 0)
    assert linear.dtype == torch.bfloat16
    calls.clear()  # switched off: F.linear for every dtype
    with torch.inference_mode():
        L.linear(x, w, b, with_flags(flags, onednn=False))
    assert calls == []


def test_bfloat16_training_and_autocast_stay_on_f_linear(monkeypatch):
    speed = with_flags(NATIVE, onednn=True, fuse=False)  # oneDNN forced: even then bfloat16 trains on F.linear
    calls = record_onednn(monkeypatch)
    x, w, b = operands((5, 16), 8)
    w.requires_grad_()
    y = L.linear(x, w, b, speed)
    y.float().sum().backward()
    assert calls == [] and w.grad is not None and w.grad.dtype == torch.bfloat16
    assert torch.equal(y, F.linear(x, w, b))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        L.linear(x.float(), w.detach().float(), b.float(), speed)
    assert calls == []


def test_int8_per_token_needs_onednn():
    real = cpu_features()
    for onednn, expected in ((True, True), (False, False)):
        cpu = dataclasses.replace(real, flags=("avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"), onednn=onednn)
        assert L.decide(cpu).int8_per_token is expected


# --- numbers: oneDNN's bfloat16 kernels (a CPU with native bfloat16) --------------------------


@native_bf16
@pytest.mark.parametrize("x_shape,out", [((7, 16), 8), ((3, 5, 24), 40), ((1, 384), 1536)])
@pytest.mark.parametrize("post", ["none", "gelu", "residual"])
def test_bfloat16_route_rounds_the_float32_result_once(x_shape, out, post):
    """Packed oneDNN bfloat16, post-op fused: within one bfloat16 rounding (2^-8 relative) of the
    float32 computation on the same bfloat16 operands."""
    speed = L.decide(onednn=True, fuse=True)
    x, w, b = operands(x_shape, out, seed=1)
    residual = torch.randn(*x_shape[:-1], out, generator=torch.Generator().manual_seed(2)).bfloat16()
    ref = F.linear(x.float(), w.float(), b.float())
    if post == "gelu":
        ref = F.gelu(ref)
    if post == "residual":
        ref = ref + residual.float()
    with torch.inference_mode():
        got = L.linear(x, w, b, speed, lambda: L.pack(w), gelu=post == "gelu",
                       residual=residual if post == "residual" else None)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref, rtol=2 ** -8, atol=1e-3)


@native_bf16
def test_bfloat16_model_on_the_route_keeps_every_token():
    """A bfloat16 model on the oneDNN route against the same model in float32, and against bfloat16
    on F.linear (the route before rule 6): every real token within cosine 0.999 of float32, and
    no farther from it than F.linear's bfloat16."""
    config = BertConfig(**TINY)
    fp32 = BertModel(config, generator=torch.Generator().manual_seed(0)).eval()
    bf16 = L.accelerate(BertModel(config, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).eval())
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 99, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    real = mask.bool()
    with torch.inference_mode():
        ref = fp32(ids, mask).last_hidden_state[real]
        routed = bf16(ids, mask).last_hidden_state[real].float()
        plain = L.accelerate(bf16, L.decide(onednn=False))(ids, mask).last_hidden_state[real].float()
    cos_routed = F.cosine_similarity(routed, ref, dim=-1)
    cos_plain = F.cosine_similarity(plain, ref, dim=-1)
    assert cos_routed.min() >= 0.999, cos_routed.min()
    assert (routed - ref).norm() <= 1.1 * (plain - ref).norm()
    assert not torch.equal(routed, plain)  # the route was taken: other kernels, other roundings
