"""A static embedding model: one vector per vocabulary token, a text's vector their mean.

The pre-BERT picture (word2vec, GloVe: "stick" has one vector whatever the sentence),
made from a sentence model by distillation (Model2Vec: Tulkens & van Dongen 2024) or by
contrastive training (sentence-transformers' `StaticEmbedding`, Aarsen 2025). At run
time there is no transformer: the text's WordPiece ids, without [CLS]/[SEP], index a
table [V, D] and the rows are averaged, `torch.nn.EmbeddingBag(mode="mean")`:

    ids [N] (all texts' ids, concatenated), offsets [B] (where each text starts)
        -> table[ids] averaged per text -> [B, D]   (a text with no token: zeros)

then L2-normalised when the folder says so (a Normalize module; model2vec's
`normalize`). Two folder layouts are read:

    sentence-transformers   modules.json naming a StaticEmbedding module; its folder holds
                            model.safetensors {"embedding.weight": [V, D]} and tokenizer.json
                            (sentence-transformers 6 puts it at the root, path "";
                            earlier versions in 0_StaticEmbedding/); a Normalize module may follow
    model2vec               config.json {"model_type": "model2vec", "normalize": ...},
                            model.safetensors {"embeddings": [V', D], optional "mapping" [V]
                            (token -> row) and "weights" [V] (a factor per token)}, tokenizer.json

A model2vec table is folded to one row per token id (row = embeddings[mapping[id]] *
weights[id]), as sentence-transformers' `StaticEmbedding._fold_model2vec_weights` does,
and model2vec's encoder drops [UNK] before averaging (`StaticModel.tokenize`), so
`skip_ids` holds it for such a folder. model2vec also writes a modules.json (for
sentence-transformers, which keeps [UNK]); its config.json decides: model2vec's reading.

A text is cut at `config.max_length` tokens (before [UNK] is dropped, as model2vec's tokenizer
cuts first): a model2vec folder's config.json max_length (512, model2vec's default, when it
names none); for a sentence-transformers folder the loader reads its tokenizer.json's
truncation, where sentence-transformers' Rust tokenizer cuts (`bertkit distill static` writes 512).

`save_static` writes the sentence-transformers layout (0_StaticEmbedding/, the subfolder
every version since 3 reads); the tokenizer.json beside the weights is the caller's to
write (`bertkit.text.tokenizer_json`: this module knows no tokenizer). No tokenizer here:
the loader (`bertkit.runtime.loading`) builds it from `Static.tokenizer_dir`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from bertkit.errors import BertkitError, int_at_least
from bertkit.model.checkpoint import read_weights, save_tensors
from bertkit.model.sentence_layout import MODULES_FILE, write_modules

STATIC_DIR, NORMALIZE_DIR = "0_StaticEmbedding", "1_Normalize"
WEIGHT_KEY = "embedding.weight"  # sentence-transformers' StaticEmbedding state dict
ABOUT_KEY = "bertkit"  # the weights file's metadata entry where bertkit says how the table was made
MODEL2VEC_KEYS = ("embeddings", "mapping", "weights")
# the positions a static model takes: no limit (sentence-transformers says math.inf)
NO_LIMIT = 1_000_000
DEFAULT_MAX_LENGTH = 512  # model2vec's default cut (its config.json naming none); bertkit writes it too


@dataclass
class StaticConfig:
    """What the rest of bertkit asks a model's config: sizes, and no layers or positions to limit."""

    vocab_size: int
    hidden_size: int
    normalize: bool = False
    skip_ids: tuple = ()  # token ids dropped before averaging (model2vec drops [UNK])
    max_length: int | None = None  # tokens a text is cut at (the folder's; None: none)
    num_hidden_layers: int = 0
    max_position_embeddings: int = NO_LIMIT


class StaticEmbedding(nn.Module):
    """The table [V, D] and its mean over each text's ids (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, normalize: bool = False, skip_ids=()):
        super().__init__()
        if weight.dim() != 2:
            raise BertkitError(f"a static embedding table must be [vocabulary, dimensions], got {list(weight.shape)}")
        # EmbeddingBag's _weight takes the table as it is (no random init to overwrite)
        self.embedding = nn.EmbeddingBag(weight.shape[0], weight.shape[1], mode="mean",
                                         _weight=weight.detach().float().clone())
        self.config = StaticConfig(weight.shape[0], weight.shape[1], bool(normalize), tuple(skip_ids))

    def forward(self, input_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """input_ids [N] and offsets [B] -> the mean vector of each text [B, D] (not normalised)."""
        return self.embedding(input_ids, offsets)

    def embed_padded(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """A padded batch [B, T] (ids without [CLS]/[SEP], mask 1 on real ids) -> [B, D]: the same mean,
        for training code that batches as it does for an encoder."""
        real = attention_mask.bool()
        sizes = real.sum(dim=1)
        offsets = torch.zeros_like(sizes)
        offsets[1:] = torch.cumsum(sizes, 0)[:-1]
        return self.embedding(input_ids[real], offsets)


@dataclass(frozen=True)
class Static:
    """A static model folder, read: the model and the folder holding its tokenizer.json."""

    model: StaticEmbedding
    tokenizer_dir: Path
    layout: str  # "sentence-transformers" or "model2vec"


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertkitError(f"{path} ({what}) is not readable JSON ({err})") from None


SMALL_FILES = ((MODULES_FILE, "the sentence-transformers modules"), ("config.json", "the model config"))


def small_files(directory) -> tuple:
    """(modules.json's object, config.json's object) of a folder, each None where the file is absent: read once
    for all a load asks of them (whether it is static, which layout, the model's settings), so a folder saved
    over meanwhile cannot be judged by one file and built from another."""
    return tuple(_small_file(Path(directory), i) for i in range(len(SMALL_FILES)))


def _small_file(directory: Path, i: int):
    path = directory / SMALL_FILES[i][0]
    return _read_json(path, SMALL_FILES[i][1]) if path.is_file() else None


def _st_modules(modules) -> list | None:
    """The module list of a sentence-transformers folder whose first module is a StaticEmbedding, else None
    (`modules`: its modules.json's object)."""
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        return None
    if not all(isinstance(m.get("idx", 0), int) and not isinstance(m.get("idx", 0), bool) for m in modules):
        return None  # not ours to judge: the layout's reader refuses a bad idx, naming the module
    modules = sorted(modules, key=lambda m: m.get("idx", 0))
    return modules if str(modules[0].get("type", "")).endswith("StaticEmbedding") else None


def _model2vec_config(directory: Path, config) -> dict | None:
    """model2vec's config.json (`config`: its object), when `directory` is a model2vec folder: model_type
    "model2vec", or no model_type beside model2vec's "embeddings" tensor at the root (model2vec writes none for a
    model built in memory, `StaticModel(vectors, tokenizer).save_pretrained`)."""
    if not isinstance(config, dict):
        return None
    if config.get("model_type") == "model2vec":
        return config
    weights = directory / "model.safetensors"
    if "model_type" in config or not weights.is_file():
        return None
    with safe_open(str(weights), framework="pt") as f:
        return config if "embeddings" in f.keys() else None


def is_static(directory, files: tuple | None = None) -> bool:
    """Whether `directory` holds a static model in either layout (its small files only; `files`: `small_files`
    as the caller read them, None: read here)."""
    directory = Path(directory)
    if not directory.is_dir():
        return False
    if _st_modules(_small_file(directory, 0) if files is None else files[0]) is not None:
        return True  # config.json not read (a StaticEmbedding folder's is not model2vec's)
    return _model2vec_config(directory, _small_file(directory, 1) if files is None else files[1]) is not None


def weights_folder(directory, files: tuple | None = None) -> Path:
    """The folder holding a static model's model.safetensors (a StaticEmbedding module's path; else the folder)."""
    directory = Path(directory)
    modules, config = small_files(directory) if files is None else files
    modules = None if _model2vec_config(directory, config) is not None else _st_modules(modules)
    return directory / modules[0].get("path", "") if modules else directory


def saved_about(directory) -> dict:
    """What `save_static(about=)` recorded in a static folder's weights file; {} for a folder without it
    (another tool's, or unreadable metadata: it only informs)."""
    path = weights_folder(directory) / "model.safetensors"
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as f:
        text = (f.metadata() or {}).get(ABOUT_KEY, "{}")
    try:
        about = json.loads(text)
    except ValueError:
        return {}
    return about if isinstance(about, dict) else {}


def fold_model2vec(state: dict, source: Path) -> torch.Tensor:
    """One row per token id from model2vec's tensors: embeddings[mapping[id]] * weights[id]."""
    if "embeddings" not in state:
        raise BertkitError(f"{source} holds {', '.join(sorted(state))}; a static model's weights are "
                           f"{WEIGHT_KEY!r} (sentence-transformers) or 'embeddings' (model2vec)")
    table = state["embeddings"].float()
    if "mapping" in state:
        table = table[state["mapping"].long()]
    if "weights" in state:
        table = table * state["weights"].float()[:, None]
    return table.contiguous()


def _table(folder: Path) -> torch.Tensor:
    state, source = read_weights(folder)
    return state[WEIGHT_KEY].float() if WEIGHT_KEY in state else fold_model2vec(state, source)


def _read_st(directory: Path, modules: list, files: tuple) -> Static:
    folder = weights_folder(directory, files)
    normalize = False
    for module in modules[1:]:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind != "Normalize":
            raise BertkitError(f"{directory / MODULES_FILE}: module {kind} after the StaticEmbedding is not "
                               "supported: bertkit runs a static table with an optional Normalize only")
        normalize = True
    return Static(StaticEmbedding(_table(folder), normalize), folder, "sentence-transformers")


def read_static(directory, files: tuple | None = None) -> Static:
    """The static model in `directory` (either layout; `files`: `small_files` as the caller read them). For a
    model2vec folder the caller sets `config.skip_ids` to [UNK]'s id, which it finds in the tokenizer."""
    directory = Path(directory)
    files = small_files(directory) if files is None else files
    # first: model2vec also writes a modules.json, for sentence-transformers
    config = _model2vec_config(directory, files[1])
    if config is not None:
        model = StaticEmbedding(_table(directory), bool(config.get("normalize", True)))
        model.config.max_length = config.get("max_length", DEFAULT_MAX_LENGTH)
        if model.config.max_length is not None:
            int_at_least(model.config.max_length, 1, f"{directory}/config.json: max_length",
                         says="a positive integer or null")
        return Static(model, directory, "model2vec")
    modules = _st_modules(files[0])
    if modules is None:
        raise BertkitError(f"{directory} holds no static model: expected modules.json naming a StaticEmbedding "
                           "(sentence-transformers) or config.json with model_type model2vec")
    return _read_st(directory, modules, files)


def save_static(model: StaticEmbedding, directory, about: dict | None = None) -> Path:
    """Write `model` as a sentence-transformers StaticEmbedding folder (modules.json, 0_StaticEmbedding/
    model.safetensors, 1_Normalize/ when it normalises, config_sentence_transformers.json naming normalize and
    max_length for model2vec); returns the module folder, where the caller writes tokenizer.json. `about`: how the table was made, kept as JSON in the weights file's metadata
    (`saved_about`; sentence-transformers and model2vec ignore it)."""
    directory = Path(directory)
    folder = directory / STATIC_DIR
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors(folder / "model.safetensors", {WEIGHT_KEY: model.embedding.weight.detach().float().cpu().contiguous()},
                 {ABOUT_KEY: json.dumps(about)} if about else None)
    modules = [{"idx": 0, "name": "0", "path": STATIC_DIR, "type": "sentence_transformers.models.StaticEmbedding"}]
    if model.config.normalize:
        modules.append({"idx": 1, "name": "1", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
    # model2vec reads a sentence-transformers folder's settings from this file, not from its modules or
    # tokenizer.json: without these two it gave the vectors unnormalised and cut every text at 512 tokens
    st_config = {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
                 "similarity_fn_name": "cosine", "normalize": model.config.normalize,
                 "max_length": model.config.max_length}
    write_modules(directory, modules, st_config, {f"{NORMALIZE_DIR}/config.json": {}} if model.config.normalize else {})
    return folder
