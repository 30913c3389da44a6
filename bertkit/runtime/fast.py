"""The CPU fast path, applied by one explicit step: `accelerate(model, settings)`.

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
   instruction set (`SpeedSettings.onednn_inference`).
2. Training matmuls on MKL on Intel CPUs, oneDNN elsewhere: MKL is Intel's own
   library and trained fastest on an Intel Xeon, oneDNN on AMD (`SpeedSettings.onednn_training`;
   the oneDNN backward is written out with the same kernel, grad_x = g W, grad_W = g^T x).
3. GELU and residual add fused into the matmul as oneDNN post-ops only with AVX-512:
   on AVX2 the fused GELU is slower than a separate one (`SpeedSettings.fuse_post_ops`).
4. Packed weights in inference: oneDNN's blocked copy of each weight saves the
   re-blocking of every call; the copy follows every in-place change of the weight
   (its version counter) and every new tensor set through `.data` (`pack_weights()`; each
   FastLinear keeps its own copy).
5. int8 activations quantized per token where the CPU has VNNI or AMX: oneDNN's int8
   matmul multiplies int8 into int32 there, and one scale per token keeps a large token
   from flattening the rest of its batch (`SpeedSettings.int8_per_token`, used by bertkit.runtime.quantization).
6. bfloat16 inference on the oneDNN route too (packed weights, GELU and residual add as
   post-ops) where the CPU multiplies bfloat16 natively (AMX, AVX512-BF16): F.linear in
   bfloat16 also runs oneDNN there, but re-blocks the weight at every call and leaves the
   GELU and the add to separate bfloat16 passes. bfloat16 training stays on F.linear
   (`SpeedSettings.onednn_bf16`).
7. Rows padded to a few sizes where oneDNN's kernel caches are bounded (`bertkit serve`):
   oneDNN prepares (compiles) a kernel per input shape, and a
   server's batches come in a new shape every few passes; padded to `row_bucket`'s 40
   sizes, every pass finds its kernels in the cache (`SpeedSettings.row_buckets`).

Precision ("auto" = bfloat16 where the CPU multiplies it natively): see
`bertkit.runtime.devices.auto_dtype`.

Where the oneDNN route applies at all: float32 on the CPU (and bfloat16 inference,
rule 6), a torch build with oneDNN's linear kernels, outside autocast (which must see
F.linear to cast it) and outside torch.compile (inductor packs its own weights).
Everything else (CUDA, float64, bfloat16 elsewhere) goes to F.linear unchanged, so an
accelerated model runs anywhere; results agree with F.linear's to float32 rounding
(bfloat16: to its rounding of the output; the post-ops then run before it, in float32).

The rules are one value, `SpeedSettings`, decided once by `decide()` from the CPU's features
and what a caller forces (`decide(onednn=False)`: every matmul on F.linear; `onednn=True`:
every one on oneDNN; `row_buckets=True`: rule 7, as `bertkit serve` asks), handed to
`accelerate(model, settings)` and kept by every module it swaps: nothing here is a
process-wide switch, and two models in one process may run under different settings.
Only the command line reads the environment (`bertkit serve`: BERTKIT_ONEDNN=1/0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.errors import BertkitError, int_at_least
from bertkit.model.heads import MaskedLMHead
from bertkit.runtime.devices import CpuFeatures, cpu_features


# --- the settings: the rules as one value ----------------------------------------------------


@dataclass(frozen=True)
class SpeedSettings:
    """What the fast path does on this machine, one field per rule (module docstring); made by
    `decide()`, handed to `accelerate`, kept by every swapped module."""

    onednn_inference: bool  # rule 1: inference's float32 matmuls on oneDNN (else F.linear: MKL)
    onednn_training: bool  # rule 2: training's float32 matmuls on oneDNN (else F.linear)
    fuse_post_ops: bool  # rule 3: the GELU and the residual add as oneDNN post-ops
    int8_per_token: bool  # rule 5: int8 activations per token on oneDNN's int8 matmul
    onednn_bf16: bool  # rule 6: bfloat16 inference on the oneDNN route too
    row_buckets: bool = False  # rule 7: rows padded to `row_bucket` sizes (a server)

    @property
    def matmul_kernel(self) -> str:
        """"oneDNN" or "MKL": what inference's float32 CPU matmuls run on (for logs)."""
        return "oneDNN" if self.onednn_inference else "MKL"


def decide(cpu: CpuFeatures | None = None, *, onednn: bool | None = None, fuse: bool | None = None,
           per_token: bool | None = None, row_buckets: bool = False, threads: int | None = None) -> SpeedSettings:
    """The settings for `cpu` (None: this one) running on `threads` torch threads (None: now).

    onednn: None follows rules 1 and 2; True sends every float32 matmul to oneDNN, False every one
    to F.linear (MKL). fuse, per_token: None as rules 3 and 5 say, or forced (tests, comparisons).
    Nothing takes oneDNN where this torch build lacks its kernels."""
    for name, value in (("onednn", onednn), ("fuse", fuse), ("per_token", per_token)):
        if value is not None and not isinstance(value, bool):  # "0" is truthy: it would force the rule on
            raise BertkitError(f"decide's {name} must be True, False or None (the rule decides), got {value!r}")
    if not isinstance(row_buckets, bool):
        raise BertkitError(f"decide's row_buckets must be True or False, got {row_buckets!r}")
    cpu = cpu_features() if cpu is None else cpu
    threads = torch.get_num_threads() if threads is None else int_at_least(threads, 1, "decide's threads")
    avx512 = "avx512f" in cpu.flags
    inference = cpu.onednn and (avx512 or threads > 1 if onednn is None else onednn)
    training = cpu.onednn and (cpu.vendor != "GenuineIntel" if onednn is None else onednn)
    vnni = any(f in cpu.flags for f in ("amx_int8", "avx512_vnni", "avx_vnni"))
    return SpeedSettings(
        onednn_inference=inference,
        onednn_training=training,
        fuse_post_ops=avx512 if fuse is None else fuse,
        int8_per_token=cpu.onednn and vnni if per_token is None else per_token,
        onednn_bf16=inference and cpu.native_bf16,
        row_buckets=row_buckets,
    )


# --- the dense layer -----------------------------------------------------------------------


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


def _route(x: torch.Tensor, weight: torch.Tensor, speed: SpeedSettings) -> bool:
    """The shape rule of the oneDNN route (see the module docstring): float32, or bfloat16 where
    `speed` says (rule 6; the caller keeps bfloat16 to inference). Asked before every product that
    FastLinear does not replay: each test is one call (a Python call between two kernels costs
    microseconds, a batch-1 layer's products tens of them)."""
    if torch.compiler.is_compiling():  # first: dynamo need not trace the rest
        return False
    dtype = x.dtype
    return (
        dtype is weight.dtype  # torch's dtypes are singletons
        and (dtype is torch.float32 or (dtype is torch.bfloat16 and speed.onednn_bf16))
        and x.is_cpu
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
    )


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            post_op: str = "none", algorithm: str = "") -> torch.Tensor:
    """oneDNN's x W^T + b (weight plain or packed), then the eltwise `post_op` if any."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)


def _with_post_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool = False,
                  residual: torch.Tensor | None = None, fuse: bool = True) -> torch.Tensor:
    """oneDNN's x W^T + b, then the GELU or the residual add, whichever is given: as its post-op
    where `fuse` (rule 3), else as a separate operation."""
    x = x.contiguous()
    if not fuse and (gelu or residual is not None):
        y = _onednn(x, weight, bias)
        return F.gelu(y) if gelu else y + residual
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


def pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of `weight` [out, in] for its inference product (rule 4)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, speed: SpeedSettings,
           packed=None, gelu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b, as F.linear: x [..., in], weight [out, in], bias [out] -> [..., out], on the
    kernels `speed` chooses. `packed`: in inference, a function giving the packed copy of
    `weight` (FastLinear keeps one). `gelu`: then the exact (erf) GELU; `residual` [..., out]:
    then + residual (one or the other). Both ride in the matmul as oneDNN post-ops in
    inference where `speed.fuse_post_ops` (AVX-512), and are separate operations elsewhere."""
    if gelu and residual is not None:
        raise ValueError("linear: fuse the GELU or the residual, not both")
    if not _route(x, weight, speed):
        y = F.linear(x, weight, bias)
    elif _needs_grad(x, weight, bias, residual):
        oned = speed.onednn_training and x.dtype == torch.float32  # bfloat16 trains on F.linear (rule 6)
        y = _OneDNNLinear.apply(x.contiguous(), weight, bias) if oned else F.linear(x, weight, bias)
    elif not speed.onednn_inference:
        y = F.linear(x, weight, bias)
    else:
        if speed.row_buckets:
            rows = x.numel() // x.shape[-1]
            padded = row_bucket(rows)
            if padded != rows:  # rule 7: run in the rows of a cached kernel, give back its own
                y = linear(_padded(x, rows, padded), weight, bias, speed, packed, gelu,
                           None if residual is None else _padded(residual, rows, padded))
                return y[:rows].view(*x.shape[:-1], y.shape[-1])
        w = weight if packed is None else packed()
        return _with_post_op(x, w, bias, gelu, residual, speed.fuse_post_ops)
    if gelu:
        return F.gelu(y)
    return y if residual is None else y + residual


# --- the accelerated modules (subclasses without new parameters) ----------------------------


class FastLinear(nn.Linear):
    """nn.Linear whose forward is `linear` above, on its `speed` settings: same parameters, names
    and init. It takes the GELU and the residual add that follow it in the encoder layer
    (`bertkit.model.modeling.dense`).

    In packed inference it keeps oneDNN's packed copy of its weight and remembers the route
    `linear` took (`_plan`): while what that route was chosen by still holds (dtype, weight
    version and storage, no gradient, autocast or compiler), it calls the kernel directly: at
    batch 1 the decisions were a measurable share of a product (docs/benchmarks.md, "Batch 1 with
    the route remembered"). `use(speed)` changes the settings and
    forgets the route."""

    packed = False  # set by pack_weights()
    post_ops = True  # bertkit.model.modeling.dense hands it the activation and the residual
    _packed = None  # (weight version, data pointer, oneDNN's packed copy)
    _plan = None  # (dtype, weight version, data pointer, packed copy): the route last taken

    def __init__(self, *args, speed: SpeedSettings | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.use(decide() if speed is None else speed)

    def use(self, speed: SpeedSettings) -> None:
        self.speed, self._plan = speed, None

    def forward(self, x: torch.Tensor, act=None, residual: torch.Tensor | None = None) -> torch.Tensor:
        gelu = act is F.gelu
        if act is not None and (not gelu or residual is not None):  # another activation, or both: apart
            y = act(linear(x, self.weight, self.bias, self.speed, self._pack_for_call()))
            return y if residual is None else residual + y
        plan, w = self._plan, self.weight
        if (plan is not None and plan[0] is x.dtype and plan[1] == w._version and plan[2] == w.data_ptr()
                and x.dim() > 1 and x.numel() > 0 and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()):
            return _with_post_op(x, plan[3], self.bias, gelu, residual, self.speed.fuse_post_ops)
        y = linear(x, w, self.bias, self.speed, self._pack_for_call(), gelu, residual)
        self._plan = self._plan_for(x)
        return y

    def packed_weight(self) -> torch.Tensor:
        """oneDNN's packed copy of the weight, made again after any in-place change (its version)
        or a new tensor set through .data (its pointer)."""
        w, entry = self.weight, self._packed
        if entry is None or entry[0] != w._version or entry[1] != w.data_ptr():
            entry = self._packed = (w._version, w.data_ptr(), pack(w))
        return entry[2]

    def _pack_for_call(self):
        return self.packed_weight if self.packed else None

    def __getstate__(self):
        # oneDNN's packed copy can be neither copied nor pickled: a copy packs and plans anew
        state = super().__getstate__()
        state.pop("_plan", None)
        state.pop("_packed", None)
        return state

    def _plan_for(self, x: torch.Tensor):
        """The plan of the route `linear` just took, if it was packed oneDNN inference; else None."""
        speed = self.speed
        # the cheap tests first: this runs after every call the plan did not take (training, buckets)
        if not (self.packed and not speed.row_buckets and not torch.is_grad_enabled()
                and speed.onednn_inference and _route(x, self.weight, speed)):
            return None
        w = self.weight
        return x.dtype, w._version, w.data_ptr(), self.packed_weight()


class FastMaskedLMHead(MaskedLMHead):
    """The MLM head with its decoder (the largest matmul, [., H] x [H, V]) on the fast route."""

    speed: SpeedSettings  # set by accelerate

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(self.act(self.transform(x)))  # [..., H]
        return linear(x, word_embeddings, self.bias, self.speed)  # [..., V]


_SWAPS = {nn.Linear: FastLinear, MaskedLMHead: FastMaskedLMHead}


def pack_weights(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let every FastLinear in `model` run inference on packed weights (rule 4); returns model."""
    for m in model.modules():
        if isinstance(m, FastLinear):
            m.packed = enabled
            m._plan = None
    return model


def accelerate(model: nn.Module, settings: SpeedSettings | None = None, *, training: bool = False) -> nn.Module:
    """Apply the CPU fast path to `model` in place and return it (see the module docstring),
    on `settings` (None: `decide()`, the rules for this CPU).

    The outputs equal the plain model's to float32 rounding (1e-5), and so do the
    gradients: training=True keeps autograd exact (the oneDNN backward, or MKL's) and leaves the
    weights unpacked, since an optimizer changes them every step; training=False (for
    models used for inference: embed, predict, attention) also packs the weights.
    Calling it again is harmless (and hands the swapped modules the new settings).
    """
    if not isinstance(model, nn.Module):
        raise BertkitError(f"accelerate takes a torch model (nn.Module), got {type(model).__name__}")
    if settings is not None and not isinstance(settings, SpeedSettings):
        raise BertkitError(f"accelerate's settings must be a SpeedSettings (bertkit.runtime.fast.decide()), "
                           f"got {type(settings).__name__}")
    settings = decide() if settings is None else settings
    for m in model.modules():
        fast = _SWAPS.get(type(m))
        if fast is not None:
            m.__class__ = fast  # same object, same parameters: only the forward changes
        if isinstance(m, FastLinear):
            m.use(settings)
        elif isinstance(m, FastMaskedLMHead):
            m.speed = settings
    return pack_weights(model, enabled=not training)
