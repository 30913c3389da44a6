"""The optimiser and learning-rate schedule BERT is trained with.

BERT (Devlin et al. 2018, section 3.1/A.2; google-research/bert
`optimization.py`) uses Adam with decoupled weight decay (AdamW, Loshchilov &
Hutter 2019), weight decay 0.01 on every weight matrix but *not* on biases and
LayerNorm parameters (decaying a LayerNorm gain towards zero would shrink the
activations it is there to normalise), and a learning rate that rises linearly
from 0 over the warm-up steps and then decays linearly to 0 at the last step.

`lr_at(step, ...)` is a pure function of the step (as in nanoGPT's
`get_lr`), so the training loop (`bertkit.training.loop`) sets the rate
itself and a test can check the whole curve. Step numbering follows the
reference code and `transformers.get_linear_schedule_with_warmup`: the rate
used for the update with index `step` (0-based) is `peak * step / warmup`
during warm-up, so the very first update uses rate 0.

Layer-wise rates (`--layerwise-lr-decay`, ELECTRA's fine-tuning: Clark et al.
2020, appendix A; google-research/electra `model/optimization.py`): each
parameter group carries an `lr_scale` by its depth, which `set_lr` multiplies
into the schedule's rate (`param_groups`).

Deviations, both deliberate:
- Adam's epsilon defaults to 1e-8 (PyTorch / transformers) where the original
  TensorFlow code used 1e-6; both are settable.
- the linear decay is transformers' (`get_linear_schedule_with_warmup`, tested
  step for step): from the peak at the end of warm-up to 0 at the last step.
  google-research/bert's `polynomial_decay` runs over all steps from step 0 and
  warm-up replaces it before `warmup`, so after warm-up its rate is
  peak * (1 - step / total): 0.9 x peak at the end of a 10% warm-up (a drop
  there); google-research/electra multiplies the two (peak * (1 - step/total) *
  min(1, step / warmup)), the same 0.9 x peak at its highest. The two curves
  differ by at most warmup / total of the peak (10% at fine-tuning's 10%,
  1% at pre-training's 1%), and meet at 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bertkit.errors import BertkitError, positive

if TYPE_CHECKING:
    import torch

SCHEDULES = ("linear", "cosine", "constant")


@dataclass
class OptimConfig:
    """AdamW and schedule settings; the defaults are the BERT paper's fine-tuning ones."""

    learning_rate: float = field(default=5e-5, metadata={"help": "peak learning rate, reached after warm-up"})
    weight_decay: float = field(default=0.01, metadata={"help": "decoupled weight decay (not on biases and LayerNorm)"})
    warmup_ratio: float = field(default=0.1, metadata={"help": "fraction of all updates spent warming up linearly from 0"})
    schedule: str = field(default="linear", metadata={"help": "decay after warm-up", "choices": SCHEDULES})
    adam_beta1: float = field(default=0.9, metadata={"help": "first-moment decay (AdamW and LAMB)"})
    adam_beta2: float = field(default=0.999, metadata={"help": "second-moment decay (AdamW and LAMB)"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "added to the second-moment root (AdamW and LAMB)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the global gradient norm to this; 0 disables"})
    layerwise_lr_decay: float = field(default=1.0, metadata={"help": "layer-wise rates: the head at the full rate, each encoder layer this times the one above it (google-research/electra's counting), the embeddings lowest; ELECTRA fine-tunes at 0.8 (0.9 for Large); 1: one rate for all (AdamW only)"})

    def validate(self) -> "OptimConfig":
        positive(self.learning_rate, "--learning-rate", " (BERT uses 2e-5..5e-5)")
        if not 0 <= self.warmup_ratio < 1:
            raise BertkitError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio} (BERT uses 0.1)")
        if self.weight_decay < 0:
            raise BertkitError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm < 0:
            raise BertkitError(f"--max-grad-norm must be >= 0 (0: no clipping), got {self.max_grad_norm}")
        for flag, beta in (("--adam-beta1", self.adam_beta1), ("--adam-beta2", self.adam_beta2)):
            if not 0 <= beta < 1:  # torch.optim raised its own ValueError, a traceback after the model loaded
                raise BertkitError(f"{flag} must be in [0, 1), got {beta} (BERT uses 0.9 and 0.999)")
        if self.adam_epsilon < 0:
            raise BertkitError(f"--adam-epsilon must be >= 0, got {self.adam_epsilon} (BERT uses 1e-6..1e-8)")
        if not 0 < self.layerwise_lr_decay <= 1:
            raise BertkitError(f"--layerwise-lr-decay must be in (0, 1] (1: one rate for all), got "
                               f"{self.layerwise_lr_decay} (ELECTRA uses 0.8)")
        if self.schedule not in SCHEDULES:
            raise BertkitError(f"unknown schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        return self


def lr_at(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int, schedule: str = "linear") -> float:
    """The learning rate for update number `step` (0-based) of `total_steps`.

    Warm-up: peak * step / warmup_steps. Afterwards, with progress p running
    from 0 (end of warm-up) to 1 (total_steps): linear peak * (1 - p), cosine
    peak * (1 + cos(pi p)) / 2, constant peak. Never negative.
    """
    if step < warmup_steps:
        return peak_lr * step / max(1, warmup_steps)
    if schedule == "constant":
        return peak_lr
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return peak_lr * max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return peak_lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))
    raise BertkitError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")


def warmup_steps_for(total_steps: int, warmup_ratio: float) -> int:
    """Warm-up length in updates, rounded up as transformers does (ceil)."""
    return math.ceil(total_steps * warmup_ratio)


def no_decay(name: str, module: torch.nn.Module) -> bool:
    """True for parameters that get no weight decay: biases and LayerNorm weights."""
    import torch  # here, not at the top: the CLI imports this module's settings without torch

    return name.endswith("bias") or isinstance(module, torch.nn.LayerNorm)


_LAYER = re.compile(r"encoder\.layers?\.(\d+)\.")  # ours (layers.N) and the Hugging Face name (layer.N)


def layer_depth(name: str, num_layers: int) -> int:
    """How far a parameter sits from the input, counted as google-research/electra's `_get_layer_lrs` does: the
    embeddings (and their projection) 0, encoder layer i at i + 1, anything else (the task's head; BERT's pooler)
    num_layers + 2."""
    if "embeddings" in name:
        return 0
    found = _LAYER.search(name)
    return int(found.group(1)) + 1 if found else num_layers + 2


def param_groups(model: torch.nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """Split trainable parameters into a decayed and a not-decayed AdamW group.

    Each parameter appears once even when shared (tied embeddings). With `layer_decay` < 1 (layer-wise rates,
    Clark et al. 2020, appendix A), each of the two is split by depth d (`layer_depth`) and a group's `lr_scale`
    is layer_decay ** (num_layers + 2 - d), which `set_lr` multiplies in: the head 1, the top layer layer_decay^2
    (the reference leaves depth num_layers + 1 empty), the embeddings layer_decay^(num_layers + 2).
    """
    layers = 1 + max((int(m.group(1)) for n, _ in model.named_parameters() for m in [_LAYER.search(n)] if m),
                     default=-1)
    groups: dict = {}  # (decayed, lr_scale) -> parameters, in the order they come
    seen = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            depth = layer_depth(f"{module_name}.{name}", layers)
            groups.setdefault((not no_decay(name, module), layer_decay ** (layers + 2 - depth)), []).append(param)
    if layer_decay == 1.0:  # the two groups as ever (a resumed optimizer's state lines up with them)
        return [{"params": groups.get((True, 1.0), []), "weight_decay": weight_decay},
                {"params": groups.get((False, 1.0), []), "weight_decay": 0.0}]
    return [{"params": params, "weight_decay": weight_decay if decayed else 0.0, "lr_scale": scale}
            for (decayed, scale), params in groups.items()]


def build_optimizer(model: torch.nn.Module, config: OptimConfig, name: str = "adamw") -> torch.optim.Optimizer:
    """AdamW (or LAMB, `name="lamb"`) over `param_groups(model)`; the loop sets the rate with `set_lr`."""
    import torch

    config.validate()
    if name == "lamb" and config.layerwise_lr_decay != 1.0:
        raise BertkitError("--layerwise-lr-decay goes with --optimizer adamw (LAMB scales each layer's step itself)")
    groups = param_groups(model, config.weight_decay, config.layerwise_lr_decay)
    kwargs = dict(lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon)
    if name == "lamb":
        from bertkit.training.lamb import Lamb

        groups[1]["trust_ratio"] = False  # like the reference: no layer adaptation where there is no decay
        return Lamb(groups, **kwargs)
    try:
        # the fused kernel: one pass over each parameter instead of a chain of foreach ops,
        # the same arithmetic (its time: docs/benchmarks.md, "Numbers that left the docstrings")
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # older torch or a device without the fused kernel
        return torch.optim.AdamW(groups, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's rate, times each group's `lr_scale` where it has one (layer-wise rates, `param_groups`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
