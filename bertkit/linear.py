"""Dense layers, y = x W^T + b, computed by the matmul kernel that is fast on this CPU.

Nearly all of BERT's arithmetic is this one operation (the Q/K/V and output
projections, the two feed-forward matrices, the MLM decoder), so its speed is the
model's speed. PyTorch's x86 build sends float32 matmuls to Intel MKL, and MKL
takes its slower AVX2 code path on AMD processors; oneDNN, which PyTorch also
ships (as "mkldnn"), picks its kernels by instruction set alone. Measured on the
2-core AMD EPYC (Zen 5) this project runs on, [4096, 384] x [384, 1536]:
MKL ~120 GFLOP/s, oneDNN ~230-300 GFLOP/s. Same sums, different blocking, so the
results agree to float32 rounding: the tests hold the model to 1e-5 of
transformers with this path on, at every real token (padding positions, whose
outputs nothing reads, drift by ~1e-4 through the layers).

`linear(x, weight, bias)` is a drop-in for `torch.nn.functional.linear`; `Linear`
is `nn.Linear` with that forward (same parameters, same state-dict names). The
oneDNN route is taken only where it is the same computation: float32 on the CPU,
outside autocast (which must see F.linear to cast it) and outside torch.compile
(inductor packs its own weights). Everything else goes to F.linear unchanged.
Training works too: the backward is written out below with the same kernel
(grad_x = g W, grad_W = g^T x, grad_b = sum g). In inference a GELU or a
residual add that follows the matmul can ride in it as a oneDNN post-op
(`linear(..., gelu=True)`, `linear(..., residual=r)`). `use_onednn(False)` switches the
route off, for comparisons, and so does BERTKIT_ONEDNN=0 in the environment.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

_enabled = os.environ.get("BERTKIT_ONEDNN", "1") != "0"


def use_onednn(enabled: bool = True) -> None:
    """Route float32 CPU matmuls through oneDNN (default) or leave them all to F.linear."""
    global _enabled
    _enabled = bool(enabled)


def onednn_enabled() -> bool:
    return _enabled and _AVAILABLE


def _mkldnn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_AVAILABLE = _mkldnn_linear_available()


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            post_op: str = "none", algorithm: str = "") -> torch.Tensor:
    """oneDNN's x W^T + b (weight plain or packed), then the eltwise `post_op` if any."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)


def _weight_grad(x2: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
    """g^T x, [out, in], from x [M, in] and g [M, out]. oneDNN is fastest when the product
    it writes has the fewer rows, so compute (x^T g)^T when `in` < `out`."""
    if x2.shape[1] < g2.shape[1]:
        return _onednn(x2.t(), g2.t(), None).t()  # [in, out] -> [out, in]
    return _onednn(g2.t(), x2.t(), None)


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        g = g.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(g, weight.t(), None)  # g W: [..., out] x [out, in]
        g2 = g.reshape(-1, g.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_w = _weight_grad(x.reshape(-1, x.shape[-1]), g2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def _route(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        onednn_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


# `pack_weights(model)` lets inference reuse each weight in oneDNN's own blocked layout
# ("packed") instead of re-blocking it inside every call: ~15% faster at batch 1 here,
# ~5% at 32 x 128. It is an explicit step, like building an ONNX Runtime session,
# because the packed copy stands in for the weight: it is keyed by the weight tensor,
# its storage and its version counter, which every in-place change (an optimizer step,
# load_state_dict, torch.nn.init) bumps, so those are seen; writes through `.data`
# bypass the counter and are not. It costs one extra copy of the weights.
_packed = WeakIdKeyDictionary()


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    entry = _packed.get(weight)
    if entry is None or entry[0] != weight._version or entry[1] != weight.data_ptr():
        with torch.no_grad():
            entry = (weight._version, weight.data_ptr(), torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        _packed[weight] = entry
    return entry[2]


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False,
           gelu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b, as F.linear: x [..., in], weight [out, in], bias [out] -> [..., out].
    `pack`: in inference, use the packed copy of `weight` (see pack_weights).
    `gelu`: then the exact (erf) GELU; `residual` [..., out]: then + residual (one or the other).
    In oneDNN inference these ride in the matmul as a post-op, applied while the output
    is still in cache instead of by a second kernel that reads it back: bit-identical to
    F.gelu / the addition, measured at [128, 384] x [384, 1536] 600 vs 657 us (GELU) and
    at [128, 1536] x [1536, 384] 580 vs 611 us (add)."""
    if gelu and residual is not None:
        raise ValueError("linear: fuse the GELU or the residual, not both")
    if not _route(x, weight):
        y = F.linear(x, weight, bias)
    elif _needs_grad(x, weight, bias, residual):
        y = _OneDNNLinear.apply(x.contiguous(), weight, bias)
    else:
        x, w = x.contiguous(), _packed_weight(weight) if pack else weight
        if gelu:
            return _onednn(x, w, bias, "gelu", "none")  # algorithm "none": erf, not the tanh form
        if residual is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), w, bias, "add")
        return _onednn(x, w, bias)
    if gelu:
        return F.gelu(y)
    return y if residual is None else y + residual


class Linear(nn.Linear):
    """nn.Linear whose forward is `linear` above: same parameters, names and init."""

    packed = False  # set by pack_weights()

    def forward(self, x: torch.Tensor, gelu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, pack=self.packed, gelu=gelu, residual=residual)


def pack_weights(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let every `Linear` in `model` run inference on packed weights (see above); returns model.
    For models used for inference only: bertkit's own predict/embed paths call it."""
    for m in model.modules():
        if isinstance(m, Linear):
            m.packed = enabled
    return model
