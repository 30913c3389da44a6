"""A student made of N of the teacher's layers: the starting point of layer distillation.

DistilBERT (Sanh et al. 2019) initialises its student from every other layer of the teacher;
sentence-transformers' layer-drop distillation keeps N evenly spaced layers. Either way the
student is a copy of the teacher (embeddings, pooler, any task head) with fewer layers:

    layers kept: round_half_up(i * (L - 1) / (N - 1)) for i in 0..N-1, the first and the last
    always (6 -> 3: 0, 3, 5; 12 -> 4: 0, 4, 7, 11); N = 1 keeps the last.

What the student is then trained on is the teacher's sentence vectors (`bertkit.distill.layers`)
or its logits (`bertkit.distill.logits`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
from torch import nn

from bertkit.errors import BertkitError

LAYER_KEY = re.compile(r"^(.*encoder\.layers\.)(\d+)(\..*)$")  # our names (bertkit.model.modeling)


def kept_layers(total: int, keep: int) -> list[int]:
    """The teacher layers (0-based) the student starts from: `keep` evenly spaced, first and last included."""
    if not isinstance(keep, int) or not 1 <= keep <= total:
        raise BertkitError(f"--keep {keep}: the teacher has {total} layers; keep 1 to {total}")
    if keep == 1:
        return [total - 1]
    return [int(i * (total - 1) / (keep - 1) + 0.5) for i in range(keep)]


def student_from(teacher: nn.Module, keep: int) -> tuple[nn.Module, list[int]]:
    """A copy of `teacher` (a BertModel or a model with a `.bert` encoder and a head) with only the kept
    layers, renumbered 0..N-1; every other weight (embeddings, pooler, head) copied. Returns it and the layers."""
    if teacher.config.num_hidden_layers < 2:
        raise BertkitError("the teacher has a single layer: there is nothing to drop")
    layers = kept_layers(teacher.config.num_hidden_layers, keep)
    config = replace(teacher.config, num_hidden_layers=keep)
    student = type(teacher)(config)
    where = {old: new for new, old in enumerate(layers)}
    state = {}
    for key, value in teacher.state_dict().items():
        m = LAYER_KEY.match(key)
        if m is None:
            state[key] = value
        elif int(m.group(2)) in where:
            state[f"{m.group(1)}{where[int(m.group(2))]}{m.group(3)}"] = value
    student.load_state_dict(state, strict=True)
    return student, layers


@dataclass
class StudentOutput:
    loss: torch.Tensor  # what the training loop reads of a model's output
