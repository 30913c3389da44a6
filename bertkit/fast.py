"""The CPU fast path, applied by one explicit step: `accelerate(model)`.

`bertkit.modeling` and `bertkit.heads` are written with plain PyTorch layers, as
the paper draws the model. Everything below changes how those sums are computed,
never what they are; it is chosen by what the CPU has, and stated here once:

1. Dense layers on oneDNN, or MKL where that measured faster. Nearly all of
   BERT's arithmetic is y = x W^T + b (the Q/K/V and output projections, the two
   feed-forward matrices, the MLM decoder), so its speed is the model's speed.
   PyTorch's x86 build sends float32 matmuls to Intel MKL, which takes its AVX2
   code path on AMD processors whatever they have; oneDNN, which PyTorch also ships
   ("mkldnn"), picks its kernels by instruction set alone. On a 2-core AMD EPYC
   (Zen 5), [4096, 384] x [384, 1536]: MKL ~120 GFLOP/s, oneDNN ~230-300 GFLOP/s.
   Where both run AVX2 it is closer: on a 2-core EPYC without AVX-512 (Zen 3),
   on one thread MKL took 0-12% less time than oneDNN on each of BERT's four
   dense shapes at 64 and 512 rows (4-14% over the four together, 32 to 1536
   rows), and the server's two single-threaded passes side by side ran 7-13%
   more sentences per second on MKL (medians of alternated blocks); on two
   threads oneDNN took 10-34% less time at 32-64 rows and was level beyond. So
   inference runs MKL on one thread of a CPU without AVX-512, and oneDNN
   everywhere else (`onednn_for_inference()`). Training always runs oneDNN:
   its backward is written out with the same kernel (grad_x = g W,
   grad_W = g^T x, grad_b = sum g). Same sums, other blocking: results agree
   to float32 rounding.
2. Fused post-ops (inference), where the CPU has AVX-512: the feed-forward GELU
   and the residual add that follow a matmul ride in it as oneDNN post-ops,
   applied while the output is still in cache (the same values as the separate
   operations; on an AVX-512 machine [128, 384] x [384, 1536] took 600 vs
   657 us with the GELU, [128, 1536] x [1536, 384] 580 vs 611 us with the add).
   On AVX2 alone the fused GELU is the slower way: on a 2-core AMD EPYC (AVX2)
   the GELU post-op cost 35-45% of the matmul, the separate F.gelu 10%
   (1 thread, [2048, 384] x [384, 1536]: 47 ms fused, 36 ms apart, 33 ms with no
   GELU; 2 threads at [128, 384]: 1.35 vs 1.12 ms), and the fused add saved
   nothing. So the post-ops are fused only with avx512f (`fuse_post_ops()`).
3. Packed weights (inference): each weight is kept in oneDNN's own blocked
   layout instead of being re-blocked in every call: ~15% faster at batch 1,
   ~5% at 32 x 128. The packed copy is keyed by the weight tensor, its storage
   and its version counter, which every in-place change (an optimizer step,
   load_state_dict, torch.nn.init) bumps, so those are seen; writes through
   `.data` bypass the counter and are not. It costs one extra copy of the weights.
4. Attention path by shape: at B x T x T <= SMALL_ATTENTION the fused SDPA
   kernel's set-up cost more than it saved (~2 ms of a ~15 ms forward at
   1 x 128 on 2 cores, glibc malloc as it comes; with
   bertkit.reuse_freed_memory() the two paths are within noise), so small
   inputs take the explicit path; both give the same result.

The shape rules, in one place: the oneDNN route (1-3) is taken only where it is
the same computation as F.linear: float32 on the CPU, a torch build with oneDNN's
linear kernels, outside autocast (which must see F.linear to cast it) and outside
torch.compile (inductor packs its own weights). Everything else (bfloat16,
CUDA, float64) goes to F.linear unchanged, so an accelerated model runs anywhere.

`accelerate` swaps the classes of the modules in place (nn.Linear -> FastLinear,
BertSelfAttention -> FastSelfAttention, BertLayer -> FusedBertLayer,
MaskedLMHead -> FastMaskedLMHead): subclasses that add no parameter, so the
parameters stay the same objects (an optimizer built before keeps working) and
state-dict names and checkpoints are unchanged. `use_onednn(False)` (or
BERTKIT_ONEDNN=0 in the environment) switches the oneDNN route off, for
comparisons: F.linear then runs everywhere; `use_onednn(True)` (BERTKIT_ONEDNN=1)
takes oneDNN for inference too, whatever rule 1 says; `use_onednn(None)` (the
default, BERTKIT_ONEDNN=auto) goes back to the rule.

`cpu_features()` reads what the CPU has (`/proc/cpuinfo` flags, torch's CPU
capability) for these choices, for the bfloat16 advice of `resolve_dtype`, and
for the line every benchmark prints.
"""

from __future__ import annotations

import functools
import os
import platform
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from bertkit.errors import BertkitError
from bertkit.heads import MaskedLMHead
from bertkit.modeling import BertLayer, BertSelfAttention

SMALL_ATTENTION = 128 * 128  # B x T x T at or below which the explicit attention path is the faster one

# --- what the CPU has ------------------------------------------------------------------

# the /proc/cpuinfo flags that decide a kernel here: vector width, bf16 and int8 dot products
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class CpuFeatures:
    """What the machine offers the kernels: read once by `cpu_features()`."""

    model: str  # "AMD EPYC 9B45", from /proc/cpuinfo (platform.processor() elsewhere)
    cores: int  # logical CPUs this process may use
    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", "DEFAULT", ...
    flags: tuple[str, ...]  # the FLAGS present
    onednn: bool  # this torch build has oneDNN's fused linear kernels

    @property
    def native_bf16(self) -> bool:
        """bfloat16 arithmetic in hardware (AVX512-BF16 or AMX); elsewhere it is emulated, slowly."""
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    def describe(self) -> str:
        """One line for logs and benchmark tables."""
        flags = " ".join(self.flags) or "none of " + " ".join(FLAGS)
        return (f"CPU: {self.model}, {self.cores} cores, torch capability {self.capability}, flags: {flags}; "
                f"bf16 {'native' if self.native_bf16 else 'emulated'}; "
                f"oneDNN linear {'yes' if self.onednn else 'no'}")


def _onednn_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first processor in /proc/cpuinfo; ("", set()) off Linux."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:  # x86 / ARM spelling
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """What this CPU has, read once per process."""
    model, flags = _cpuinfo()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return CpuFeatures(
        model=model or platform.processor() or platform.machine() or "unknown CPU",
        cores=cores,
        capability=torch.backends.cpu.get_cpu_capability(),
        flags=tuple(f for f in FLAGS if f in flags),
        onednn=_onednn_available(),
    )


# --- devices and dtypes ------------------------------------------------------------------

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_warned_bf16 = False


def resolve_device(device=None) -> torch.device:
    """"auto"/None: the GPU when torch sees one, else the CPU; "cpu"; "cuda" (or "cuda:1")."""
    if isinstance(device, torch.device):
        return device
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.split(":")[0] not in DEVICES:
        raise BertkitError(f"unknown device {name!r}: use auto, cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BertkitError(f"device {name} asked for, but torch sees no CUDA GPU here: use --device cpu (or auto)")
    return torch.device(name)


def resolve_dtype(dtype=None, device: torch.device | None = None) -> torch.dtype:
    """float32 (None) or bfloat16, by name or torch.dtype. bfloat16 on a CPU without native
    bf16 warns once: it is emulated there, several times slower than float32."""
    global _warned_bf16
    if isinstance(dtype, torch.dtype):
        value = dtype
    else:
        value = DTYPES.get("float32" if dtype is None else str(dtype))
    if value not in (torch.float32, torch.bfloat16):
        raise BertkitError(f"unknown dtype {dtype!r}: use float32 or bfloat16")
    on_cpu = device is None or torch.device(device).type == "cpu"
    if value == torch.bfloat16 and on_cpu and not cpu_features().native_bf16 and not _warned_bf16:
        _warned_bf16 = True
        cpu = cpu_features()
        warnings.warn(
            f"bfloat16 on this CPU ({cpu.model}, {cpu.capability}) is emulated: it has no avx512_bf16 or amx_bf16, "
            "so bfloat16 runs several times slower than float32 here; use float32 (--dtype float32; "
            "--precision fp32 for training)",
            stacklevel=2,
        )
    return value


# --- the dense layer -----------------------------------------------------------------------

# None: inference's kernel by the CPU and thread count (rule 1); True/False: oneDNN always / never
_enabled = {"0": False, "1": True}.get(os.environ.get("BERTKIT_ONEDNN", "auto"))


def use_onednn(enabled: bool | None = True) -> None:
    """Route float32 CPU matmuls of accelerated models: True, through oneDNN; False, all to
    F.linear (MKL); None, inference by the CPU and thread count (rule 1; the default)."""
    global _enabled
    _enabled = None if enabled is None else bool(enabled)


def onednn_enabled() -> bool:
    """Whether the oneDNN route is open (training takes it; inference as `onednn_for_inference` says)."""
    return _enabled is not False and cpu_features().onednn


def onednn_for_inference() -> bool:
    """Whether inference's float32 CPU matmuls go to oneDNN rather than MKL (rule 1): as forced
    by `use_onednn`, else oneDNN except on one thread of a CPU without AVX-512."""
    if _enabled is not None:
        return _enabled
    return "avx512f" in cpu_features().flags or torch.get_num_threads() > 1


def matmul_kernel() -> str:
    """"oneDNN" or "MKL": what inference's float32 CPU matmuls run on here, now (for logs)."""
    return "oneDNN" if onednn_enabled() and onednn_for_inference() else "MKL"


_fuse = None  # None: by the CPU (rule 2); True/False: forced, for tests and comparisons


def fuse_post_ops() -> bool:
    """Whether inference fuses the GELU and residual add into the matmul (rule 2): with AVX-512."""
    return _fuse if _fuse is not None else "avx512f" in cpu_features().flags


def _route(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The shape rule of the oneDNN route (see the module docstring)."""
    return (
        not torch.compiler.is_compiling()  # first: dynamo need not trace the rest
        and onednn_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
    )


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


_packed = WeakIdKeyDictionary()  # weight -> (version, data pointer, packed copy); see point 3 above


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
    `pack`: in inference, use the packed copy of `weight`. `gelu`: then the exact (erf)
    GELU; `residual` [..., out]: then + residual (one or the other). Both ride in the
    matmul as oneDNN post-ops in inference where `fuse_post_ops()` (AVX-512), and are
    separate operations elsewhere."""
    if gelu and residual is not None:
        raise ValueError("linear: fuse the GELU or the residual, not both")
    if not _route(x, weight):
        y = F.linear(x, weight, bias)
    elif _needs_grad(x, weight, bias, residual):
        y = _OneDNNLinear.apply(x.contiguous(), weight, bias)
    elif not onednn_for_inference():
        y = F.linear(x, weight, bias)
    else:
        x, w = x.contiguous(), _packed_weight(weight) if pack else weight
        if gelu and fuse_post_ops():
            return _onednn(x, w, bias, "gelu", "none")  # algorithm "none": erf, not the tanh form
        if residual is not None and fuse_post_ops():
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual.contiguous(), w, bias, "add")
        y = _onednn(x, w, bias)
    if gelu:
        return F.gelu(y)
    return y if residual is None else y + residual


# --- the accelerated modules (subclasses without new parameters) ----------------------------


class FastLinear(nn.Linear):
    """nn.Linear whose forward is `linear` above: same parameters, names and init."""

    packed = False  # set by pack_weights()

    def forward(self, x: torch.Tensor, gelu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, pack=self.packed, gelu=gelu, residual=residual)


class FastSelfAttention(BertSelfAttention):
    """Self-attention that takes the explicit path for small inputs (rule 4)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, explicit: bool):
        B, T, _ = x.shape
        return super().forward(x, mask, explicit or B * T * T <= SMALL_ATTENTION)


class FusedBertLayer(BertLayer):
    """In inference, the feed-forward's GELU and residual add handed to its two matmuls, which
    fuse them where the CPU gains by it (rule 2); in training, or with another activation, the
    plain layer."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, explicit: bool = False):
        if self.training or self.act is not F.gelu or not isinstance(self.output, FastLinear):
            return super().forward(x, mask, explicit)
        attended, weights = self.attention(x, mask, explicit)  # [B, T, H]
        x = self.attention_norm(x + attended)  # dropout is the identity in inference
        ff = self.output(self.intermediate(x, gelu=True), residual=x)  # W2 gelu(W1 x) + x, [B, T, H]
        return self.output_norm(ff), weights


class FastMaskedLMHead(MaskedLMHead):
    """The MLM head with its decoder (the largest matmul, [., H] x [H, V]) on the fast route."""

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(self.act(self.transform(x)))  # [..., H]
        return linear(x, word_embeddings, self.bias)  # [..., V]


_SWAPS = {nn.Linear: FastLinear, BertSelfAttention: FastSelfAttention, BertLayer: FusedBertLayer,
          MaskedLMHead: FastMaskedLMHead}


def pack_weights(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Let every FastLinear in `model` run inference on packed weights (rule 3); returns model."""
    for m in model.modules():
        if isinstance(m, FastLinear):
            m.packed = enabled
    return model


def accelerate(model: nn.Module, *, training: bool = False) -> nn.Module:
    """Apply the CPU fast path to `model` in place and return it (see the module docstring).

    The outputs equal the plain model's to float32 rounding (1e-5), and so do the
    gradients: training=True keeps autograd exact (the oneDNN backward) and leaves the
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
