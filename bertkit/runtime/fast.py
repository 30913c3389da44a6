"""The CPU fast path, applied by one explicit step: `accelerate(model)`.

`bertkit.model.modeling` and `bertkit.model.heads` are written with plain PyTorch layers, as
the paper draws the model. `accelerate` changes how their dense ops are computed,
never what they are: it swaps the classes of nn.Linear (-> FastLinear) and of the
masked-LM head in place, subclasses that add no parameter, so parameters stay the
same objects (an optimizer built before keeps working) and state-dict names and
checkpoints are unchanged. The encoder layer's forward stays modeling.BertLayer's;
it hands each FastLinear the GELU or residual add that follows it (modeling.dense).

The rules, each chosen by what the CPU has (`bertkit.runtime.devices.cpu_features()`);
the timings behind them, with the CPU each was taken on, are in docs/benchmarks.md
("Why bertkit.runtime.fast's rules"):

1. Inference matmuls on oneDNN, except MKL on one thread of a CPU without AVX-512:
   MKL takes its AVX2 path on AMD CPUs whatever they have, oneDNN picks kernels by
   instruction set (`onednn_for_inference()`).
2. Training matmuls on MKL on Intel CPUs, oneDNN elsewhere: MKL is Intel's own
   library and trained fastest on an Intel Xeon, oneDNN on AMD (`onednn_for_training()`;
   the oneDNN backward is written out with the same kernel, grad_x = g W, grad_W = g^T x).
3. GELU and residual add fused into the matmul as oneDNN post-ops only with AVX-512:
   on AVX2 the fused GELU is slower than a separate one (`fuse_post_ops()`).
4. Packed weights in inference: oneDNN's blocked copy of each weight saves the
   re-blocking of every call; the copy follows every in-place change of the weight
   (its version counter), not writes through `.data` (`pack_weights()`).
5. int8 activations quantized per token where the CPU has VNNI or AMX: oneDNN's int8
   matmul multiplies int8 into int32 there, and one scale per token keeps a large token
   from flattening the rest of its batch (`int8_per_token()`, used by bertkit.runtime.quantization).
6. bfloat16 inference on the oneDNN route too (packed weights, GELU and residual add as
   post-ops) where the CPU multiplies bfloat16 natively (AMX, AVX512-BF16): F.linear in
   bfloat16 also runs oneDNN there, but re-blocks the weight at every call and leaves the
   GELU and the add to separate bfloat16 passes. bfloat16 training stays on F.linear.
7. Rows padded to a few sizes where oneDNN's kernel caches are bounded (`bertkit serve`,
   BERTKIT_ROW_BUCKETS=1): oneDNN prepares (compiles) a kernel per input shape, and a
   server's batches come in a new shape every few passes; padded to `row_bucket`'s 40
   sizes, every pass finds its kernels in the cache (`bucket_rows()`).

Precision ("auto" = bfloat16 where the CPU multiplies it natively): see
`bertkit.runtime.devices.auto_dtype`.

Where the oneDNN route applies at all: float32 on the CPU (and bfloat16 inference,
rule 6), a torch build with oneDNN's linear kernels, outside autocast (which must see
F.linear to cast it) and outside torch.compile (inductor packs its own weights).
Everything else (CUDA, float64, bfloat16 elsewhere) goes to F.linear unchanged, so an
accelerated model runs anywhere; results agree with F.linear's to float32 rounding
(bfloat16: to its rounding of the output; the post-ops then run before it, in float32).
`use_onednn(False)` (or BERTKIT_ONEDNN=0) sends every matmul to F.linear,
`use_onednn(True)` (BERTKIT_ONEDNN=1) every one to oneDNN, `use_onednn(None)` (the
default) follows rules 1 and 2.
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.runtime.devices import cpu_features
from bertkit.errors import BertkitError
from bertkit.model.heads import MaskedLMHead


# --- the dense layer -----------------------------------------------------------------------

# None: the kernels of rules 1 and 2; True/False: oneDNN always / never
_enabled = {"0": False, "1": True}.get(os.environ.get("BERTKIT_ONEDNN", "auto"))


def use_onednn(enabled: bool | None = True) -> None:
    """Route float32 CPU matmuls of accelerated models: True, through oneDNN; False, all to
    F.linear (MKL); None, as rules 1 (inference) and 2 (training) say (the default)."""
    global _enabled
    _enabled = None if enabled is None else bool(enabled)


def onednn_enabled() -> bool:
    """Whether the oneDNN route is open (then `onednn_for_inference` / `onednn_for_training` decide)."""
    return _enabled is not False and cpu_features().onednn


def onednn_for_inference() -> bool:
    """Whether inference's float32 CPU matmuls go to oneDNN rather than MKL (rule 1): as forced
    by `use_onednn`, else oneDNN except on one thread of a CPU without AVX-512."""
    if _enabled is not None:
        return _enabled
    return "avx512f" in cpu_features().flags or torch.get_num_threads() > 1


def onednn_for_training() -> bool:
    """Whether training's float32 CPU matmuls (those that need a gradient) go to oneDNN rather
    than MKL (rule 2): as forced by `use_onednn`, else oneDNN except on an Intel CPU."""
    if _enabled is not None:
        return _enabled
    return cpu_features().vendor != "GenuineIntel"


def matmul_kernel() -> str:
    """"oneDNN" or "MKL": what inference's float32 CPU matmuls run on here, now (for logs)."""
    return "oneDNN" if onednn_enabled() and onednn_for_inference() else "MKL"


_fuse = None  # None: by the CPU (rule 3); True/False: forced, for tests and comparisons


def fuse_post_ops() -> bool:
    """Whether inference fuses the GELU and residual add into the matmul (rule 3): with AVX-512."""
    return _fuse if _fuse is not None else "avx512f" in cpu_features().flags


_per_token = None  # None: by the CPU (rule 5); True/False: forced, for tests and comparisons

_buckets = os.environ.get("BERTKIT_ROW_BUCKETS") == "1"  # rule 7: off unless the server asks


def bucket_rows(enabled: bool = True) -> None:
    """Pad the rows of inference's oneDNN products to `row_bucket` sizes (rule 7), or not."""
    global _buckets
    _buckets = bool(enabled)


def row_bucket(rows: int) -> int:
    """The rows a product of `rows` rows is padded to under rule 7: a multiple of 16 up to 128,
    then 8 sizes per doubling (at most 1/8 more rows): 40 sizes up to 2,048 rows."""
    if rows <= 128:
        return -(-rows // 16) * 16
    step = 1 << ((rows - 1).bit_length() - 4)
    return -(-rows // step) * step


def _padded(t: torch.Tensor, rows: int, padded: int) -> torch.Tensor:
    """t [..., k] as [padded, k]: its rows, then rows of zeros."""
    out = t.new_empty((padded, t.shape[-1]))
    out[:rows] = t.reshape(rows, t.shape[-1])
    out[rows:].zero_()
    return out


def int8_per_token() -> bool:
    """Whether int8 products quantize activations per token on oneDNN's int8 matmul (rule 5):
    where the CPU multiplies int8 into int32 in one instruction (VNNI, AMX) and torch has oneDNN."""
    if _per_token is not None:
        return _per_token
    cpu = cpu_features()
    return cpu.onednn and any(f in cpu.flags for f in ("amx_int8", "avx512_vnni", "avx_vnni"))


def _route(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The shape rule of the oneDNN route (see the module docstring): float32, or bfloat16 where
    the CPU multiplies it natively (rule 6; the caller keeps bfloat16 to inference). Asked before
    every product that FastLinear does not replay: each test is one call (a Python call between
    two kernels costs microseconds, a batch-1 layer's products tens of them)."""
    if torch.compiler.is_compiling():  # first: dynamo need not trace the rest
        return False
    dtype = x.dtype
    return (
        dtype is weight.dtype  # torch's dtypes are singletons
        and (dtype is torch.float32 or (dtype is torch.bfloat16 and cpu_features().native_bf16))
        and x.is_cpu
        and onednn_enabled()
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
    )


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            post_op: str = "none", algorithm: str = "") -> torch.Tensor:
    """oneDNN's x W^T + b (weight plain or packed), then the eltwise `post_op` if any."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)


def _with_post_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool = False,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """oneDNN's x W^T + b with the GELU or the residual add, whichever is given, as its post-op."""
    x = x.contiguous()
    if gelu:
        return _onednn(x, weight, bias, "gelu", "none")  # algorithm "none": erf, not the tanh form
    if residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), weight, bias, "add")
    return _onednn(x, weight, bias)


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


# id(weight) -> (weak reference to the weight, its version, data pointer, packed copy); see point
# 4 above. A plain dict keyed by id, its entry dropped when the weight is freed: looked up on every
# product, it costs a third of a WeakIdKeyDictionary's lookup.
_packed: dict[int, tuple] = {}


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    entry = _packed.get(id(weight))
    if entry is None or entry[0]() is not weight or entry[1] != weight._version or entry[2] != weight.data_ptr():
        key = id(weight)
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        entry = (weakref.ref(weight, lambda _, key=key: _packed.pop(key, None)), weight._version, weight.data_ptr(),
                 packed)
        _packed[key] = entry
    return entry[3]


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False,
           gelu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b, as F.linear: x [..., in], weight [out, in], bias [out] -> [..., out].
    `pack`: in inference, use the packed copy of `weight`. `gelu`: then the exact (erf)
    GELU; `residual` [..., out]: then + residual (one or the other). Both ride in the
    matmul as oneDNN post-ops in inference where `fuse_post_ops()` (AVX-512), and are
    separate operations elsewhere."""
    if gelu and residual is not None:
        raise ValueError("linear: fuse the GELU or the residual, not both")
    if not _route(x, weight):
        y = F.linear(x, weight, bias)
    elif _needs_grad(x, weight, bias, residual):
        oned = onednn_for_training() and x.dtype == torch.float32  # bfloat16 trains on F.linear (rule 6)
        y = _OneDNNLinear.apply(x.contiguous(), weight, bias) if oned else F.linear(x, weight, bias)
    elif not onednn_for_inference():
        y = F.linear(x, weight, bias)
    else:
        if _buckets:
            rows = x.numel() // x.shape[-1]
            padded = row_bucket(rows)
            if padded != rows:  # rule 7: run in the rows of a cached kernel, give back its own
                y = linear(_padded(x, rows, padded), weight, bias, pack, gelu,
                           None if residual is None else _padded(residual, rows, padded))
                return y[:rows].view(*x.shape[:-1], y.shape[-1])
        w = _packed_weight(weight) if pack else weight
        if not (gelu or residual is not None) or fuse_post_ops():
            return _with_post_op(x, w, bias, gelu, residual)
        y = _onednn(x.contiguous(), w, bias)
    if gelu:
        return F.gelu(y)
    return y if residual is None else y + residual


# --- the accelerated modules (subclasses without new parameters) ----------------------------


class FastLinear(nn.Linear):
    """nn.Linear whose forward is `linear` above: same parameters, names and init. It takes the
    GELU and the residual add that follow it in the encoder layer (`bertkit.model.modeling.dense`).

    In packed inference it remembers the route `linear` took (`_plan`) and, while everything that
    route was chosen by still holds (dtype, weight version, the switches, no gradient, autocast or
    compiler), calls the kernel directly: at batch 1 the decisions cost about a tenth of a product."""

    packed = False  # set by pack_weights()
    post_ops = True  # bertkit.model.modeling.dense hands it the activation and the residual
    _plan = None  # (dtype, weight version, data pointer, switches, post-ops fused, packed weight)

    def forward(self, x: torch.Tensor, act=None, residual: torch.Tensor | None = None) -> torch.Tensor:
        gelu = act is F.gelu
        if act is not None and (not gelu or residual is not None):  # another activation, or both: apart
            y = act(linear(x, self.weight, self.bias, pack=self.packed))
            return y if residual is None else residual + y
        plan, w = self._plan, self.weight
        post = gelu or residual is not None
        if (plan is not None and plan[0] is x.dtype and plan[1] == w._version and plan[2] == w.data_ptr()
                and plan[3] == (_enabled, _fuse, _buckets, cpu_features) and (plan[4] or not post)
                and x.dim() > 1 and x.numel() > 0 and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()):
            return _with_post_op(x, plan[5], self.bias, gelu, residual)
        y = linear(x, w, self.bias, pack=self.packed, gelu=gelu, residual=residual)
        self._plan = self._plan_for(x)
        return y

    def __getstate__(self):
        # the plan holds oneDNN's packed copy, which can be neither copied nor pickled: a copy plans anew
        state = super().__getstate__()
        state.pop("_plan", None)
        return state

    def _plan_for(self, x: torch.Tensor):
        """The plan of the route `linear` just took, if it was packed oneDNN inference; else None."""
        # the cheap tests first: this runs after every call the plan did not take (training, buckets)
        if not (self.packed and not _buckets and not torch.is_grad_enabled() and _route(x, self.weight)
                and onednn_for_inference()):
            return None
        w = self.weight
        return (x.dtype, w._version, w.data_ptr(), (_enabled, _fuse, _buckets, cpu_features), fuse_post_ops(),
                _packed_weight(w))


class FastMaskedLMHead(MaskedLMHead):
    """The MLM head with its decoder (the largest matmul, [., H] x [H, V]) on the fast route."""

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(self.act(self.transform(x)))  # [..., H]
        return linear(x, word_embeddings, self.bias)  # [..., V]


_SWAPS = {nn.Linear: FastLinear, MaskedLMHead: FastMaskedLMHead}


def pack_weights(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let every FastLinear in `model` run inference on packed weights (rule 4); returns model."""
    for m in model.modules():
        if isinstance(m, FastLinear):
            m.packed = enabled
    return model


def accelerate(model: nn.Module, *, training: bool = False) -> nn.Module:
    """Apply the CPU fast path to `model` in place and return it (see the module docstring).

    The outputs equal the plain model's to float32 rounding (1e-5), and so do the
    gradients: training=True keeps autograd exact (the oneDNN backward, or MKL's) and leaves the
    weights unpacked, since an optimizer changes them every step; training=False (for
    models used for inference: embed, predict, attention) also packs the weights.
    Calling it again is harmless.
    """
    if not isinstance(model, nn.Module):
        raise BertkitError(f"accelerate takes a torch model (nn.Module), got {type(model).__name__}")
    for m in model.modules():
        fast = _SWAPS.get(type(m))
        if fast is not None:
            m.__class__ = fast  # same object, same parameters: only the forward changes
    return pack_weights(model, enabled=not training)
