"""config.json checked against the weights' shapes before a model is built.

A model is built from its config (every layer allocated) and only then filled from its
weights file. A config that asks for more than the weights hold, by mistake or on
purpose (`num_hidden_layers` 10^6, `hidden_size` 10^9), would allocate until memory runs
out before any shape is compared. The shapes are in the safetensors header
(`bertkit.data.safetensors_header`: the header JSON alone, no tensor read), so
`check_config` compares them first and names the one config field that disagrees:

    embeddings.word_embeddings.weight         [vocab_size, E]             E = embedding_size or hidden_size
    embeddings.position_embeddings.weight     [max_position_embeddings, E]
    embeddings.token_type_embeddings.weight   [type_vocab_size, E]
    encoder.layer.N.*                          N = 0 .. num_hidden_layers - 1
    encoder.layer.0.attention.self.query.weight  [hidden_size, hidden_size]
    encoder.layer.0.intermediate.dense.weight    [intermediate_size, hidden_size]

Keys are matched with any prefix a head checkpoint puts on its encoder (`bert.`,
`electra.`) and past any wrapper's (`wrapper_prefix`); a sharded checkpoint's shards (its
`weight_map`) must lie inside the folder (`bertkit.model.confined`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bertkit.model.confined import inside
from bertkit.data.safetensors_header import read_header
from bertkit.errors import BertkitError

_ENCODER = r"^(?:bert\.|electra\.)?"
# What a wrapper puts before every key of the model it holds, when a trainer saves the wrapper's state_dict():
# DistributedDataParallel holds it as `module`, torch.compile's OptimizedModule as `_orig_mod` (either order, both)
WRAPPERS = ("module.", "_orig_mod.")
# key pattern -> [(axis, the config field that sets it)]
SHAPES = {
    "embeddings.word_embeddings.weight": [(0, "vocab_size"), (1, "embedding_size")],
    "embeddings.position_embeddings.weight": [(0, "max_position_embeddings"), (1, "embedding_size")],
    "embeddings.token_type_embeddings.weight": [(0, "type_vocab_size"), (1, "embedding_size")],
    "encoder.layer.0.attention.self.query.weight": [(0, "hidden_size"), (1, "hidden_size")],
    "encoder.layer.0.intermediate.dense.weight": [(0, "intermediate_size"), (1, "hidden_size")],
}


def shard_files(index_path: Path) -> list[Path]:
    """The shard files a `model.safetensors.index.json` names, each inside its folder, in name order."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise BertkitError(f"{index_path} is not a valid shard index ({type(err).__name__}: {err})") from None
    return [inside(index_path.parent, name, index_path) for name in names]


def header_shapes(weights: Path) -> dict[str, tuple] | None:
    """name -> shape of every tensor in a safetensors file or sharded checkpoint; None for a pickle."""
    if weights.name.endswith(".index.json"):
        files = shard_files(weights)
    elif weights.suffix == ".safetensors":
        files = [weights]
    else:
        return None
    shapes = {}
    for path in files:
        if not path.is_file():
            raise BertkitError(f"{path} is missing: {weights} names it as a shard")
        fix = "copy or save the model again"
        shapes.update({name: entry.shape for name, entry in read_header(path, fix).items()})
    return shapes


def wrapper_prefix(keys) -> str:
    """The wrappers' prefix every one of `keys` carries ('module.', '_orig_mod.', 'module._orig_mod.', ...; '' for
    none): the keys past it are the wrapped model's, as it would have saved them itself."""
    keys, prefix = list(keys), ""
    while keys and (step := next((w for w in WRAPPERS if all(k.startswith(prefix + w) for k in keys)), None)):
        prefix += step
    return prefix


def check_config(config, shapes: dict[str, tuple], source) -> None:
    """Refuse a config that disagrees with the weights' shapes, naming the field and both values."""
    cut = len(wrapper_prefix(shapes))  # a wrapper's keys are checked too (they were skipped: nothing matched)
    shapes = {name[cut:]: shape for name, shape in shapes.items()}
    layers = {int(m.group(1)) for k in shapes if (m := re.match(_ENCODER + r"encoder\.layer\.(\d+)\.", k))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        raise BertkitError(f"config.json says num_hidden_layers={config.num_hidden_layers} but {source} holds "
                           f"{max(layers) + 1} layers: the config does not match the weights")
    for key, axes in SHAPES.items():
        found = next((shape for name, shape in shapes.items() if re.match(_ENCODER + re.escape(key) + "$", name)), None)
        if found is None:
            continue
        for axis, field in axes:
            field = field if hasattr(config, field) else "hidden_size"  # BERT: the embeddings are hidden_size wide
            want = getattr(config, field)
            if len(found) != 2 or found[axis] != want:
                raise BertkitError(f"config.json says {field}={want} but {source} holds {key} of shape "
                                   f"{list(found)}: the config does not match the weights")
