"""The sentence-transformers layout: how a model folder says what its sentence vector is.

sentence-transformers (Reimers & Gurevych 2019; `SentenceTransformer.save`) stores an
embedding model as the Hugging Face encoder plus a list of modules run after it,
each in its own folder with its own config:

    modules.json                   [{"idx": 0, "name": "0", "path": "",           "type": "...Transformer"},
                                    {"idx": 1, "name": "1", "path": "1_Pooling",   "type": "...Pooling"},
                                    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "...Normalize"}]
    sentence_bert_config.json      {"max_seq_length": 256, "do_lower_case": false}
    1_Pooling/config.json          {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true, ...}
    2_Normalize/                   present when the vectors are L2-normalised
    config_sentence_transformers.json   {"similarity_fn_name": "cosine", ...}

`read_layout(directory)` turns that into a `SentenceLayout` (None for a plain
Hugging Face folder) so that bertkit embeds a model the way it was trained:
its pooling, normalisation and `max_seq_length` (a CLS-pooled model embedded
with mean pooling is silently wrong; all-MiniLM-L6-v2 was trained at 256
tokens). `write_layout` writes the same files, so sentence-transformers, TEI and
Infinity load what `bertkit finetune embed` saves as an embedding model.

Both spellings are read: the one sentence-transformers 2.x-4.x writes (above,
one boolean per pooling mode; module types `sentence_transformers.models.X`)
and the one 5.x/6.x writes (`{"pooling_mode": "mean"}`, module types under
`sentence_transformers.base...` / `.sentence_transformer.modules...`, and
`max_seq_length` kept as the tokenizer's `model_max_length`). We write the
older one: every version of sentence-transformers and the servers read it.

An older layout (sentence-transformers before 2.0) keeps the encoder in a module folder of its
own: the Transformer module's `"path": "0_Transformer"`, and config.json, the weights, the
vocabulary and sentence_bert_config.json inside it. `encoder_folder(directory)` is where the
encoder's files are (the folder itself in the layout above); sentence_bert_config.json is read
there, as sentence-transformers reads it from the Transformer module's folder.

A module's path must stay inside the folder (`bertkit.model.confined`), and a module's `idx`
must be a whole number: each is refused in one line naming modules.json.

Our addition: `"matryoshka_dims"` in config_sentence_transformers.json, the
leading dimensions a Matryoshka loss trained (sentence-transformers ignores the key).

No torch here: plain JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertkit.data.atomic import write_json
from bertkit.model.confined import inside
from bertkit.errors import BertkitError, int_at_least

MODULES_FILE = "modules.json"
SENTENCE_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
POOLING_DIR, NORMALIZE_DIR = "1_Pooling", "2_Normalize"

# sentence-transformers' pooling modes: the 5.x+ name <- the 2.x-4.x boolean key
POOLING_MODES = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
# the modes bertkit computes (`bertkit.model.modeling.pool_sentence`), trains with and writes
SENTENCE_POOLINGS = ("mean", "cls", "max")
# the modules a BERT sentence embedder is made of; anything else (Dense, a Router...) changes
# the vector in a way bertkit does not reproduce, so reading it is an error, never a silent skip
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass
class SentenceLayout:
    """What a sentence-transformers folder says about its sentence vector."""

    pooling: str  # a key of POOLING_MODES: "mean", "cls", ...
    normalize: bool  # a Normalize module follows the pooling: unit-length vectors
    max_seq_length: int | None  # tokens the model embeds (and was trained) at; None: not recorded
    dimensions: list[int] | None = None  # Matryoshka dimensions, largest first, if recorded
    do_lower_case: bool | None = None  # sentence_bert_config.json's flag, if present

    def write(self, directory, hidden_size: int) -> None:
        """This layout's files beside an encoder of `hidden_size` saved in `directory` (`write_layout`): a model
        made from a loaded one (int8, a distilled student) keeps its layout by being handed it."""
        write_layout(directory, pooling=self.pooling, normalize=self.normalize, max_seq_length=self.max_seq_length,
                     hidden_size=hidden_size, dimensions=self.dimensions)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertkitError(f"{path} is not readable JSON ({err}); re-save the model or delete the file") from None


def _module_kind(entry, path: Path) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise BertkitError(f"{path}: each entry needs a \"type\" (e.g. sentence_transformers.models.Pooling)")
    idx = entry.get("idx", 0)
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise BertkitError(f"{path}: module {entry['type']} has idx {idx!r}; idx must be a whole number (0, 1, 2...)")
    kind = entry["type"].rsplit(".", 1)[-1]
    if kind == "StaticEmbedding":  # read by bertkit.model.static where a model only embeds
        raise BertkitError(f"{path.parent} holds a static embedding model (one vector per token, no transformer): "
                           "this needs a transformer; a static model embeds (embed, index, search, evaluate, serve) "
                           "and trains with `bertkit finetune embed --static`")
    if kind not in KNOWN_MODULES:
        raise BertkitError(f"{path}: module {entry['type']} ({entry.get('path', '')}) is not supported: bertkit "
                           f"embeds with {' + '.join(KNOWN_MODULES)} only; use sentence-transformers for this model")
    return kind


def _pooling(config: dict, path: Path) -> str:
    if isinstance(config.get("pooling_mode"), str):  # sentence-transformers 5.x+
        mode = config["pooling_mode"]
        if mode not in POOLING_MODES:
            raise BertkitError(f"{path}: unknown pooling_mode {mode!r}; expected one of {', '.join(POOLING_MODES)}")
        return mode
    modes = [mode for mode, key in POOLING_MODES.items() if config.get(key)]
    if len(modes) != 1:
        raise BertkitError(f"{path}: {'no pooling mode is' if not modes else 'several pooling modes are'} set "
                           f"({', '.join(modes) or 'none'}); bertkit reads a model with exactly one")
    return modes[0]


def _max_seq_length(directory: Path, sentence_config: dict) -> int | None:
    value = sentence_config.get("max_seq_length")
    if value is None:  # 5.x+ keep it as the tokenizer's limit
        tok_path = directory / "tokenizer_config.json"
        value = _read_json(tok_path).get("model_max_length") if tok_path.is_file() else None
        if not isinstance(value, int) or value > 1_000_000:  # transformers writes ~1e30 for "no limit"
            return None
    return int_at_least(value, 1, f"{directory / SENTENCE_CONFIG}: max_seq_length", says="a positive integer")


_UNREAD = object()  # modules.json not read by the caller (encoder_folder, read_layout)


def encoder_folder(directory, modules=_UNREAD) -> Path:
    """The folder holding the encoder's files (config.json, weights, vocabulary, sentence_bert_config.json):
    the Transformer module's folder when modules.json names one other than the folder itself (an older
    layout's "0_Transformer"), else `directory`. A module folder that is missing is named here. `modules`:
    modules.json's object when the caller read it (None: the folder has none; unset: read here)."""
    directory = Path(directory)
    modules_path = directory / MODULES_FILE
    if modules is _UNREAD:
        modules = _modules_json(directory)
    paths = [entry.get("path") for entry in modules if isinstance(entry, dict) and isinstance(entry.get("type"), str)
             and entry["type"].rsplit(".", 1)[-1] == "Transformer"] if isinstance(modules, list) else []
    if not paths or paths[0] in ("", None):
        return directory
    folder = inside(directory, paths[0], modules_path)
    if not (folder / "config.json").is_file():
        raise BertkitError(f"{folder / 'config.json'} is missing: {modules_path} names the encoder's folder "
                           f"{paths[0]!r}; restore it, or point at the folder that holds config.json")
    return folder


def read_layout(directory, modules=_UNREAD) -> SentenceLayout | None:
    """The sentence-transformers layout of a model folder, or None when it has none (`modules`: its modules.json's
    object when the caller read it, None: it has none; a load reads it once, for the encoder's folder and this).

    A folder with neither modules.json nor sentence_bert_config.json is a plain
    Hugging Face model: None, and the caller keeps its defaults. A folder with
    sentence_bert_config.json only (no modules.json) is read as sentence-transformers
    itself reads it when it has no module list: mean pooling, not normalised.
    """
    directory = Path(directory)
    return _layout(directory, _modules_json(directory) if modules is _UNREAD else modules)


def _modules_json(directory: Path):
    """modules.json's object (None: no such file), read once for the encoder's folder and the modules both (read
    twice, a layout saved over meanwhile was read as one folder's sentence_bert_config.json beside another's
    modules)."""
    modules_path = directory / MODULES_FILE
    return _read_json(modules_path) if modules_path.is_file() else None


def _layout(directory: Path, modules) -> SentenceLayout | None:
    """`read_layout` of `directory` whose modules.json holds `modules` (None: it has none)."""
    modules_path = directory / MODULES_FILE
    sentence_path = encoder_folder(directory, modules) / SENTENCE_CONFIG
    if modules is None and not sentence_path.is_file():
        return None
    sentence_config = _read_json(sentence_path) if sentence_path.is_file() else {}
    if not isinstance(sentence_config, dict):
        raise BertkitError(f"{sentence_path}: expected a JSON object such as {{\"max_seq_length\": 256}}")
    pooling, normalize = "mean", False
    if modules is not None:
        if not isinstance(modules, list):
            raise BertkitError(f"{modules_path}: expected a JSON list of modules")
        pooling_seen = False
        kinds = [_module_kind(entry, modules_path) for entry in modules]  # each entry checked before sorting
        for kind, entry in sorted(zip(kinds, modules), key=lambda ke: ke[1].get("idx", 0)):
            if kind == "Pooling":
                config_path = inside(directory, entry.get("path", POOLING_DIR), modules_path) / "config.json"
                if not config_path.is_file():
                    raise BertkitError(f"{config_path} is missing: {modules_path} names a pooling module there")
                config = _read_json(config_path)
                if not isinstance(config, dict):
                    raise BertkitError(f"{config_path}: expected a JSON object")
                pooling, pooling_seen = _pooling(config, config_path), True
            elif kind == "Normalize":
                normalize = True
        if not pooling_seen:
            raise BertkitError(f"{modules_path} has no Pooling module: bertkit needs one to make a sentence vector")
    st_path = directory / ST_CONFIG
    st_config = _read_json(st_path) if st_path.is_file() else {}
    dims = st_config.get("matryoshka_dims") if isinstance(st_config, dict) else None
    if dims is not None and not (isinstance(dims, list) and all(isinstance(d, int) and d > 0 for d in dims)):
        raise BertkitError(f"{st_path}: matryoshka_dims must be a list of positive integers, got {dims!r}")
    lower = sentence_config.get("do_lower_case")
    return SentenceLayout(pooling=pooling, normalize=normalize,
                          max_seq_length=_max_seq_length(sentence_path.parent, sentence_config),
                          dimensions=sorted(dims, reverse=True) if dims else None,
                          do_lower_case=lower if isinstance(lower, bool) else None)


def layout_files(directory) -> tuple[list | None, dict[str, Path]]:
    """The layout of `directory` as a folder holding the encoder at its top takes it (an ONNX export's):
    modules.json's list with the Transformer module at the top (`"path": ""`; None without modules.json), and
    each other part by the name it takes there -> what it is copied from (sentence_bert_config.json from the
    encoder's folder, config_sentence_transformers.json, each other module's folder). The layout is read
    first (`read_layout`), so what is copied is a layout bertkit reads."""
    directory = Path(directory)
    modules = _modules_json(directory)  # once, for the layout, the encoder's folder and the parts
    if _layout(directory, modules) is None:
        return None, {}
    encoder = encoder_folder(directory, modules)
    parts = {name: where / name for name, where in ((SENTENCE_CONFIG, encoder), (ST_CONFIG, directory))
             if (where / name).is_file()}
    if modules is None:
        return None, parts
    modules_path = directory / MODULES_FILE
    for entry in modules:
        folder = inside(directory, entry.get("path", ""), modules_path)
        if _module_kind(entry, modules_path) == "Transformer":
            entry["path"] = ""
        elif folder != directory and folder.is_dir():
            parts[folder.relative_to(directory).as_posix()] = folder
    return modules, parts


def write_modules(directory, modules: list, st_config: dict, settings: dict | None = None) -> None:
    """A sentence-transformers folder's own files: modules.json, config_sentence_transformers.json and
    `settings` ({path in the folder: JSON object}: a module's config), each written whole or not at all
    (`bertkit.data.atomic`), so that a save killed over a model folder leaves no half modules.json."""
    directory = Path(directory)
    for name, data in ((MODULES_FILE, modules), (ST_CONFIG, st_config), *(settings or {}).items()):
        write_json(directory / name, data)


def write_layout(directory, *, pooling: str, normalize: bool, max_seq_length: int | None, hidden_size: int,
                 dimensions: list[int] | None = None) -> None:
    """Write the sentence-transformers files beside a saved Hugging Face encoder in `directory`.

    pooling: one of SENTENCE_POOLINGS (mean, cls, max: those bertkit embeds with); normalize: add the
    Normalize module; dimensions: Matryoshka dimensions to record.
    """
    if pooling not in SENTENCE_POOLINGS:
        raise BertkitError(f"pooling {pooling!r} cannot be written: bertkit trains and embeds with "
                           f"{', '.join(SENTENCE_POOLINGS)}")
    if dimensions and any(not 0 < d <= hidden_size for d in dimensions):
        raise BertkitError(f"Matryoshka dimensions {dimensions} must each be in 1..{hidden_size} (the hidden size)")
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
    pooling_config = {"word_embedding_dimension": hidden_size,
                      **{key: mode == pooling for mode, key in POOLING_MODES.items()}, "include_prompt": True}
    st_config = {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
                 "similarity_fn_name": "cosine", **({"matryoshka_dims": sorted(dimensions, reverse=True)}
                                                    if dimensions else {})}
    sentence_config = {"max_seq_length": max_seq_length, "do_lower_case": False} if max_seq_length else {
        "do_lower_case": False}
    write_modules(directory, modules, st_config, {SENTENCE_CONFIG: sentence_config,
                                                  f"{POOLING_DIR}/config.json": pooling_config})
    if normalize:
        (directory / NORMALIZE_DIR).mkdir(parents=True, exist_ok=True)  # the module has no settings
    elif (directory / NORMALIZE_DIR).is_dir():  # re-saving over a normalised model
        for f in (directory / NORMALIZE_DIR).iterdir():
            f.unlink()
        (directory / NORMALIZE_DIR).rmdir()
