"""Where a model runs and in which precision: the machine, the device, the dtype.

`cpu_features()` reads what the CPU offers (the model name, the cores this process
may use, torch's vector capability, the /proc/cpuinfo flags that decide a kernel);
the speed rules of `bertkit.runtime.fast`, the precision rule below and every benchmark's
first line are read off it, so the machine is described in one place.

`resolve_device` and `resolve_dtype` turn what a user writes (`--device auto`,
`--dtype auto`, a torch.device, None) into a torch device and dtype, with the
errors a user can act on; `placement` applies both once, for the loader, before a
model is built, with int8's rule (the CPU, float32 activations). The precision rule, "auto": bfloat16 where the device
multiplies it natively (a CPU with AMX or AVX512-BF16, an Ampere or later GPU),
float32 elsewhere, because an AVX2-only CPU emulates bfloat16 at several times the
cost of float32. The commands that run a model for inference default to "auto";
the Python API defaults to float32 (None), which stays exact.
"""

from __future__ import annotations

import functools
import os
import platform
import warnings
from dataclasses import dataclass

import torch

from bertkit.errors import BertkitError

with warnings.catch_warnings():
    # torch.ao.quantization warns that it will move to torchao; its dynamic int8 Linear is what this torch ships
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

# the /proc/cpuinfo flags that decide a kernel here: vector width, bf16 and int8 dot products
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class CpuFeatures:
    """What the machine offers the kernels: read once by `cpu_features()`."""

    model: str  # "AMD EPYC 9B45", from /proc/cpuinfo (platform.processor() elsewhere)
    vendor: str  # "GenuineIntel", "AuthenticAMD", ... ("" where not said)
    cores: int  # logical CPUs this process may use (its affinity, as taskset sets it)
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


def _cpuinfo() -> tuple[str, str, set[str]]:
    """(model name, vendor, flags) of the first processor in /proc/cpuinfo; ("", "", set()) off Linux."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = {"Features": "flags"}.get(key.strip(), key.strip())  # ARM spells the flags "Features"
                if key in ("model name", "vendor_id", "flags") and key not in found:
                    found[key] = value.strip()
                if len(found) == 3:
                    break
    except OSError:
        pass
    return found.get("model name", ""), found.get("vendor_id", ""), set(found.get("flags", "").split())


def cores() -> int:
    """The logical CPUs this process may run on (its affinity), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """What this CPU has, read once per process."""
    model, vendor, flags = _cpuinfo()
    return CpuFeatures(
        model=model or platform.processor() or platform.machine() or "unknown CPU",
        vendor=vendor,
        cores=cores(),
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


def native_bf16(device: torch.device | None = None) -> bool:
    """Whether `device` (None: the CPU) multiplies bfloat16 in hardware."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        # including_emulation=False: by default torch says True on a T4 or V100 too (compute capability 7.x,
        # no bf16 tensor cores), where bf16 is emulated; native bf16 starts with Ampere (8.x)
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return cpu_features().native_bf16


def auto_dtype(device: torch.device | None = None) -> torch.dtype:
    """The precision rule: bfloat16 where `device` multiplies it natively, float32 elsewhere."""
    return torch.bfloat16 if native_bf16(device) else torch.float32


def _emulated_bf16(device: torch.device | None) -> str | None:
    """The warning for bfloat16 on `device` (None: the CPU) where it is emulated (several times slower than
    float32 there); None where it is native. A GPU before Ampere (a T4, a V100) emulates it too."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available() or native_bf16(device):
            return None
        gpu = torch.cuda.get_device_properties(torch.cuda.current_device() if device.index is None else device.index)
        return (f"bfloat16 on this GPU ({gpu.name}, compute capability {gpu.major}.{gpu.minor}) is emulated: native "
                "bf16 starts with Ampere (8.0); use float32 (--dtype float32; --precision fp16 for training)")
    cpu = cpu_features()
    if device.type != "cpu" or cpu.native_bf16:
        return None
    return (f"bfloat16 on this CPU ({cpu.model}, {cpu.capability}) is emulated: it has no avx512_bf16 or amx_bf16, "
            "so bfloat16 runs several times slower than float32 here; use float32 (--dtype float32; "
            "--precision fp32 for training)")


def resolve_dtype(dtype=None, device: torch.device | None = None) -> torch.dtype:
    """float32 (None), bfloat16, or "auto" (`auto_dtype` for `device`), by name or torch.dtype.
    bfloat16 asked for where the device only emulates it (a CPU without native bf16, a GPU before Ampere)
    warns once: it is several times slower than float32 there."""
    global _warned_bf16
    if isinstance(dtype, torch.dtype):
        value = dtype
    elif str(dtype) == "auto":
        return auto_dtype(device)
    else:
        value = DTYPES.get("float32" if dtype is None else str(dtype))
    if value not in (torch.float32, torch.bfloat16):
        raise BertkitError(f"unknown dtype {dtype!r}: use auto, float32 or bfloat16")
    if value == torch.bfloat16 and not _warned_bf16:
        emulated = _emulated_bf16(device)
        if emulated:
            _warned_bf16 = True
            warnings.warn(emulated, stacklevel=2)
    return value


def dtype_name(dtype: torch.dtype) -> str:
    """"float32" / "bfloat16": how logs, /info and result files name a precision."""
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype, str(dtype).replace("torch.", ""))


def placement(device=None, dtype=None, int8: bool = False, on: torch.device | None = None,
              what: str = "int8") -> tuple[torch.device, torch.dtype]:
    """(device, dtype) a model runs in, decided once before it is built. int8 runs on the CPU in
    float32 activations, so there device "auto" means the CPU and dtype "auto" float32, and
    anything else is refused (`what` names the int8 in the message). `on`: the device a model in
    memory is already on, kept unless `device` says otherwise."""
    if not int8:
        where = on if device is None and on is not None else resolve_device(device)
        return where, resolve_dtype(dtype, where)
    where = resolve_device("cpu" if device in (None, "auto") else device)
    # by name, not resolve_dtype: a bfloat16 refused here must not first warn that bf16 is emulated on this CPU
    named = dtype if isinstance(dtype, torch.dtype) else DTYPES.get(str(dtype))
    chosen = torch.float32 if dtype in (None, "auto") else named or resolve_dtype(dtype, where)  # unknown: named
    if where.type != "cpu" or chosen != torch.float32:
        raise BertkitError(f"{what}: int8 runs on the CPU in float32 activations (--device cpu, --dtype float32 "
                           "or auto)")
    return where, chosen


def holds_int8(model: torch.nn.Module) -> bool:
    """Whether `model` holds int8 dense layers (torch's dynamic int8 Linear, which
    `bertkit.runtime.quantization` makes): such a model runs on the CPU in float32 activations."""
    return any(isinstance(m, DynamicLinear) for m in model.modules())


def in_memory(model: torch.nn.Module) -> tuple[torch.device, bool]:
    """Where a model in memory is (its parameters' device; the CPU for one without any) and whether it
    holds int8 dense layers: what `placement` keeps unless told otherwise."""
    param = next(model.parameters(), None)
    return (param.device if param is not None else torch.device("cpu")), holds_int8(model)
