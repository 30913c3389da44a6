"""int8 inference: dynamic quantization of the encoder's dense layers.

Nearly all of BERT's arithmetic is the encoder's dense layers (per layer: the
[H, 3H] query/key/value projection, the [H, H] attention output, the [H, I] and
[I, H] feed-forward matrices). Dynamic quantization (Jacob et al. 2018; PyTorch's
`torch.ao.nn.quantized.dynamic.Linear`, as in its BERT tutorial) stores each of
those weights as int8 with one scale per output channel (symmetric: w ~= scale_o *
q, q in [-127, 127]) and quantizes the activations at run time, so no calibration
data is needed; the products accumulate in int32 and go back to float32 before the bias.

How the activations are quantized is `bertkit.runtime.fast` rule 5, by the CPU:
- per token, 8 bits, where the CPU has VNNI or AMX (oneDNN's int8 matmul, `onednn::qlinear_pointwise`).
  One scale per call let the batch's largest token set the step for all the others:
  the feed-forward down-projection (GELU's outliers) and the attention output lost
  most, down to a minimum per-token cosine of 0.82 to float32 on SST-2 dev; per token
  it is 0.98 (ONNX Runtime int8: 0.95; docs/deployment.md has the table per layer);
- per call, 7 bits (PyTorch's `reduce_range`), elsewhere: FBGEMM's kernels, whose AVX2
  code adds pairs of uint8 x int8 products in int16, which could saturate with 8 bits.

What stays float32, and why: the embeddings (a table look-up, no arithmetic to
save), every LayerNorm, softmax and GELU (they run on float activations), and
the small layers outside the encoder (the pooler and the task heads' classifiers:
one [H, H] or [H, labels] product per sequence or token, negligible time, and the
place where rounding would move a decision most directly).

Only the dense modules change (each becomes an `Int8Linear`); the encoder layer and
its forward are BertLayer's, as for float32. So `quantize` and `bertkit.runtime.fast.accelerate`
compose in either order: accelerate swaps the float nn.Linear layers that are left
(the pooler, the heads), quantize replaces the encoder's (float or accelerated) ones.
`dense_ops` is the one step the loader takes: int8 where asked, then the fast path.

A quantized model is saved as a model directory (`save_quantized`): config.json,
the tokenizer files, what its source folder said of it (bertkit_task.json, the
sentence-transformers layout), and `model.int8.safetensors` holding bertkit's own
parameter names (not Hugging Face's: no other library reads this file). For a
quantized layer `X`: `X.weight_int8` (int8 [out, in]), `X.weight_scale` (float64
[out]), `X.weight_zero_point` (int64 [out], zeros) and `X.bias` (float32); every
other parameter as float32. The file's metadata says
`format: bertkit-int8-dynamic`. `load_quantized` rebuilds the exact same model
(outputs identical to the one saved); a missing, extra or mis-shaped tensor, or a
file of another format, is a BertkitError naming it.

int8 runs on the CPU in float32 activations only; CUDA and bfloat16 are refused (a model cast after
`quantize` too, at its first int8 layer); under bf16 autocast the int8 layers take their input as float32.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from safetensors import safe_open
from torch.ao.quantization import per_channel_dynamic_qconfig

from bertkit.model.checkpoint import INT8_WEIGHTS, save_config, save_task_info, save_tensors, saving
from bertkit.runtime.devices import DynamicLinear, holds_int8
from bertkit.errors import BertkitError
from bertkit.runtime.fast import SpeedSettings, accelerate, decide

FORMAT = "bertkit-int8-dynamic"
VERSION = "1"


class Int8Linear(DynamicLinear):
    """x W^T + b with W int8, one scale per output channel: PyTorch's dynamic int8 Linear (its
    packed weight, state and saved form) with the activations quantized as `per_token` says
    (`bertkit.runtime.fast` rule 5, `SpeedSettings.int8_per_token`, set by quantize / load_quantized):

    - per token (a CPU with VNNI or AMX): each row of x gets its own scale, s_t = max|x_t| / 127,
      q = round(x / s_t) in [-127, 127] (held as q + 128 in uint8, the operand VNNI takes);
      oneDNN's int8 matmul (`onednn::qlinear_pointwise`, its VNNI/AMX kernels) multiplies q by
      the int8 weight, exactly in int32, and scales by s_w
      on the way out (float32), and y = that * s_t + b;
    - per call (elsewhere): FBGEMM's `quantized::linear_dynamic`, one 7-bit scale per call.
    """

    # (packed params it was made from, oneDNN's packed int8 weight, weight scales [out],
    #  weight zero points [out] (zeros: symmetric), bias)
    _mm = None
    per_token = False  # set by quantize / load_quantized from their SpeedSettings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 and torch.is_autocast_enabled(x.device.type):
            x = x.float()  # autocast hands on what an op asks for: int8 takes float32
        elif x.dtype != torch.float32:  # quantize(model).to(torch.bfloat16): the embeddings were cast, these were not
            raise BertkitError(f"int8 layers take float32 activations, got {x.dtype}: the model was cast after "
                               "quantize; keep a quantized model in float32 on the CPU (drop the .to(...))")
        packed = self._packed_params._packed_params
        if not self.per_token or x.numel() == 0:
            return torch.ops.quantized.linear_dynamic(x, packed, True)
        if self._mm is None or self._mm[0] is not packed:  # after quantize, load or set_weight_bias
            weight, bias = self._weight_bias()  # unpacking costs more than the product: once
            q_weight = weight.int_repr()  # [out, in]
            self._mm = (packed, torch.ops.onednn.qlinear_prepack(q_weight, None),
                        weight.q_per_channel_scales().float(), torch.zeros(len(q_weight), dtype=torch.long), bias)
        _, w, w_scale, w_zero, bias = self._mm
        # detached: int8 has no gradient (as PyTorch's per-call kernel), and the out= below would refuse
        # an activation that carries one (a forward outside no_grad: the embeddings' weights require it)
        x2 = x.detach().reshape(-1, x.shape[-1])  # [..., in] -> [M, in]
        # few element-wise passes: at batch 1 each is an OpenMP region, and they cost as much as the product
        s = x2.abs().amax(-1, keepdim=True).clamp_(min=1e-12).div_(127.0)  # [M, 1]: s_t
        # [M, in], each row's largest |x| -> 127, stored as uint8 with zero point 128: VNNI multiplies
        # unsigned by signed bytes, and signed activations sent oneDNN to its slow reference kernel on a
        # CPU without AMX (docs/benchmarks.md, "int8 on a CPU with VNNI and no AMX"); the kernel subtracts
        # the zero point exactly, in int32
        q = torch.div(x2, s).round_().add_(128.0).to(torch.uint8)
        # acc * s_w in the kernel's epilogue (activation scale 1, zero point 128), float32 out: [M, out]
        y = torch.ops.onednn.qlinear_pointwise(q, 1.0, 128, w, w_scale, w_zero, None, 1.0, 0, torch.float32,
                                               "none", [], "")
        y = y.mul_(s) if bias is None else torch.addcmul(bias, y, s, out=y)  # * s_t (+ b)
        return y.view(*x.shape[:-1], y.shape[-1])


def _targets(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every dense layer inside the encoder's layers."""
    out = []
    for name, module in model.named_modules():
        if ".layers." not in f".{name}.":  # encoder.layers.<i>... (bert.encoder... in a head)
            continue
        for attr, child in module.named_children():
            if isinstance(child, nn.Linear):
                out.append((module, attr, child))
    return out


def _check_runnable(model: nn.Module) -> None:
    engines = torch.backends.quantized.supported_engines
    if not any(e in engines for e in ("x86", "fbgemm", "onednn", "qnnpack")):
        raise BertkitError(f"this torch build has no int8 kernels (quantized engines: {engines}): run in float32")
    for p in model.parameters():
        if p.device.type != "cpu":
            raise BertkitError(f"int8 runs on the CPU: the model is on {p.device}; pass device='cpu' (--device cpu)")
        if p.dtype != torch.float32:
            raise BertkitError(f"int8 quantizes a float32 model, got {p.dtype}: pass dtype='float32' (--dtype float32)")


def _quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """int8 per output channel, symmetric (the observer PyTorch's per-channel dynamic qconfig uses)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao and quantized tensor creation

        observer = per_channel_dynamic_qconfig.weight()
        observer(weight)
        scales, zero_points = observer.calculate_qparams()
        return torch.quantize_per_channel(weight, scales.double(), zero_points.long(), 0, torch.qint8)


def _empty_layer(linear: nn.Linear, settings: SpeedSettings) -> Int8Linear:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = Int8Linear(linear.in_features, linear.out_features, bias_=linear.bias is not None, dtype=torch.qint8)
    layer.per_token = settings.int8_per_token
    return layer


def quantize(model: nn.Module, settings: SpeedSettings | None = None) -> nn.Module:
    """Replace the encoder's dense layers of `model` by int8 dynamic-quantized ones, in place;
    returns the model (in eval mode: a quantized model is for inference only). `settings`
    (None: `bertkit.runtime.fast.decide()`) says how activations are quantized (rule 5).

    `model` must be a float32 bertkit model on the CPU. Embeddings, LayerNorm, the pooler
    and the task heads stay float32 (see the module docstring). Calling it again is harmless.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise BertkitError(f"quantize takes a bertkit model (BertModel or a head), got {type(model).__name__}")
    if settings is not None and not isinstance(settings, SpeedSettings):
        raise BertkitError(f"quantize's settings must be a SpeedSettings (bertkit.runtime.fast.decide()), "
                           f"got {type(settings).__name__}")
    _check_runnable(model)
    settings = decide() if settings is None else settings
    for parent, attr, linear in _targets(model):
        layer = _empty_layer(linear, settings)
        with torch.no_grad():
            bias = None if linear.bias is None else linear.bias.detach().float().clone()
            layer.set_weight_bias(_quantize_weight(linear.weight.detach().float()), bias)
        setattr(parent, attr, layer)
    return model.eval()


def dense_ops(model: nn.Module, int8: bool, fast: bool, settings: SpeedSettings | None = None) -> nn.Module:
    """The dense layers an inference model runs, swapped below its layers in one step: the
    encoder's int8 (`quantize`, where asked; layers already int8 stay as they are), then the CPU
    fast path (`bertkit.runtime.fast.accelerate`) on the float layers left, when `fast`; both on
    `settings` (None: `bertkit.runtime.fast.decide()`)."""
    if settings is not None and not isinstance(settings, SpeedSettings):  # `load(fast=...)` hands it here
        raise BertkitError(f"fast must be True, False or a SpeedSettings (bertkit.runtime.fast.decide()), "
                           f"got {type(settings).__name__}")
    settings = decide() if settings is None else settings
    if int8:
        model = quantize(model, settings)
    return accelerate(model, settings) if fast else model


# --- saving and loading -----------------------------------------------------------------


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state to save: float parameters/buffers by name, and each int8 layer as four tensors."""
    out = {}
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, DynamicLinear)}
    for name, module in quantized.items():
        weight = module.weight()
        out[f"{name}.weight_int8"] = weight.int_repr().contiguous()
        out[f"{name}.weight_scale"] = weight.q_per_channel_scales().double().contiguous()
        out[f"{name}.weight_zero_point"] = weight.q_per_channel_zero_points().long().contiguous()
        if module.bias() is not None:
            out[f"{name}.bias"] = module.bias().detach().contiguous().clone()
    out.update({k: v.detach().contiguous().clone() for k, v in _float_state(model).items()})
    return out


def _float_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the int8 layers' own entries (packed weights, scale, zero point)."""
    quantized = [name + "." for name, m in model.named_modules() if isinstance(m, DynamicLinear)]
    return {k: v for k, v in model.state_dict().items() if not any(k.startswith(q) for q in quantized)}


def save_quantized(model: nn.Module, directory, tokenizer=None, *, task: dict | None = None, layout=None) -> None:
    """Write a quantized `model` to `directory`: config.json, model.int8.safetensors and,
    with a tokenizer, its files (see the module docstring for the format). What the weights alone do not say
    comes from the folder the model was loaded from (`bertkit.load(DIR, int8=True)`: `Loaded.info`,
    `Loaded.layout`): `task`, a fine-tuned model's description, as bertkit_task.json (how its inputs were
    encoded: columns, max_length, ...); `layout`, a sentence model's pooling and normalisation, as its
    sentence-transformers files. Without them an int8 pair classifier loaded as a plain classifier (predict
    asked for the columns it was trained on, and cut texts at another length), and an int8 all-MiniLM-L6-v2
    gave vectors that were no longer unit length: nothing said so."""
    if not holds_int8(model):
        raise BertkitError("save_quantized takes a model made by quantize(); save a float model with save_pretrained")
    directory = Path(directory)
    with saving(directory):  # as one: a stop between two files leaves no config.json beside other weights
        config = save_config(model, directory)
        save_tensors(directory / INT8_WEIGHTS, _tensors(model), {"format": FORMAT, "version": VERSION})
        if tokenizer is not None:  # with the model's length, as save_pretrained (it said 512 for 64 positions)
            tokenizer.save_pretrained(directory, positions=config.max_position_embeddings)
        if task and not task.get("inferred"):  # an inferred one (a Hugging Face head) is inferred again on loading
            save_task_info(directory, task)
        if layout is not None:
            layout.write(directory, config.hidden_size)


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise BertkitError(f"{path} is not a bertkit int8 model (format {meta.get('format')!r}, "
                                   f"expected {FORMAT!r}): save it with bertkit.runtime.quantization.save_quantized")
            return {k: f.get_tensor(k) for k in f.keys()}
    except BertkitError:
        raise
    except Exception as err:  # the Rust reader raises its own error type on bad headers/sizes
        raise BertkitError(f"{path} is not a readable safetensors file ({err}); it is probably truncated or "
                           "corrupt: save the quantized model again") from None


def _take(state: dict, key: str, shape: tuple, dtype: torch.dtype, path: Path) -> torch.Tensor:
    if key not in state:
        raise BertkitError(f"{path} lacks {key}: it does not match config.json (or is incomplete)")
    tensor = state.pop(key)
    if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
        raise BertkitError(f"{path}: {key} is {tensor.dtype} {list(tensor.shape)}, the model in config.json needs "
                           f"{dtype} {list(shape)}")
    return tensor


def load_quantized(cls, directory, settings: SpeedSettings | None = None, config_json: dict | None = None) -> nn.Module:
    """The int8 model saved in `directory` by `save_quantized`, as an instance of `cls`, its
    activations quantized as `settings` say (None: `bertkit.runtime.fast.decide()`); `config_json`: its
    config.json as the caller read it (None: read here)."""
    directory = Path(directory)
    path = directory / INT8_WEIGHTS
    if not path.is_file():
        raise BertkitError(f"no int8 weights in {directory}: expected {INT8_WEIGHTS} (made by save_quantized)")
    config = (cls.config_class.from_pretrained(directory) if config_json is None  # as checkpoint.load_pretrained
              else cls.config_class.from_file_dict(config_json, directory / "config.json"))
    saved = (config.architectures or ["BertModel"])[0]
    if saved != cls.__name__:
        raise BertkitError(f"{directory} holds an int8 {saved}, not a {cls.__name__}: load it as {saved}")
    state = _read(path)
    settings = decide() if settings is None else settings
    model = cls(config).eval()
    for parent, attr, linear in _targets(model):
        name = next(n for n, m in model.named_modules() if m is linear)
        out_f, in_f = linear.out_features, linear.in_features
        q = _take(state, f"{name}.weight_int8", (out_f, in_f), torch.int8, path)
        scale = _take(state, f"{name}.weight_scale", (out_f,), torch.float64, path)
        zero = _take(state, f"{name}.weight_zero_point", (out_f,), torch.int64, path)
        bias = _take(state, f"{name}.bias", (out_f,), torch.float32, path) if linear.bias is not None else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weight = torch._make_per_channel_quantized_tensor(q, scale, zero, 0)
        layer = _empty_layer(linear, settings)
        layer.set_weight_bias(weight, bias)
        setattr(parent, attr, layer)
    floats = _float_state(model)
    missing = sorted(set(floats) - set(state))
    extra = sorted(set(state) - set(floats))
    if missing or extra:
        raise BertkitError(f"{path} does not match {cls.__name__} of config.json: "
                           f"missing {missing[:5]}, unexpected {extra[:5]}")
    for key, value in floats.items():
        if state[key].shape != value.shape:
            raise BertkitError(f"{path}: {key} has shape {list(state[key].shape)}, config.json needs {list(value.shape)}")
    with torch.no_grad():  # state_dict() tensors share storage with the parameters
        for key, value in floats.items():
            value.copy_(state[key])
    return model
