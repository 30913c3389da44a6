"""Hugging Face BERT and ELECTRA checkpoints: load them into our classes and save ours in their format.

A Hugging Face BERT directory holds `config.json`, the weights (`model.safetensors`,
possibly sharded with `model.safetensors.index.json`) and the tokenizer files
(`vocab.txt`, ...). The older pickle `pytorch_model.bin` is refused, never opened:
nothing we read can run code, and even `torch.load(weights_only=True)` runs an
unpickler (a restricted one); the message names the one-line conversion.

Compatibility lives in one place: TABLE below maps each of our parameter names to
the Hugging Face key(s) it is stored under. The encoder's keys carry a `bert.`
prefix in head checkpoints (`bert.encoder.layer.3...`) and none in a bare
`BertModel` checkpoint; we strip it on reading and add it back on writing heads.
Our fused query/key/value matrix [3H, H] is three HF keys, concatenated in that
order. The masked-LM decoder is tied to the word embeddings, so its weight is
never read or written (transformers re-ties it on load), unless config.json says
`tie_word_embeddings: false`: then it is a matrix of its own, read and written.

Loading sorts every checkpoint key into one of:
  loaded      matched one of our parameters (shapes checked against the config);
  missing     a parameter of ours the checkpoint lacks (e.g. a task head never trained);
  unused      a BERT weight this class has no place for: another task's head, or the
              pooler for heads that do not read it (transformers ignores these too);
  unexpected  a key that is no BERT weight at all;
  mismatched  a head weight whose shape disagrees with the config (e.g. num_labels).
strict=True (the default) raises BertkitError listing missing / unexpected / mismatched
keys; strict=False initialises them freshly, warns, and leaves the report in
`model.load_report`. An encoder weight whose shape contradicts config.json, or a
different number of layers, is always an error: no setting can make those load.

Imports flow one way: `bertkit.model.modeling` imports this module (the model classes'
`from_pretrained` / `save_pretrained` delegate here), and this module never imports
the model classes: it builds the class it is given and reads any model through its
config and named parameters (a head is the model that holds its encoder as `bert`).
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bertkit.data.atomic import check_whole, saving, write_json, write_lines, write_through
from bertkit.default_model import default_model_dir
from bertkit.errors import BertkitError
from bertkit.model.config import problem_type_of
from bertkit.model.weights_check import check_config, header_shapes, shard_files, wrapper_prefix

# ours -> Hugging Face, relative to the encoder ({i}: layer index, {p}: weight or bias)
TABLE = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.attention.qkv.{p}", (
        "encoder.layer.{i}.attention.self.query.{p}",
        "encoder.layer.{i}.attention.self.key.{p}",
        "encoder.layer.{i}.attention.self.value.{p}",
    )),
    ("encoder.layers.{i}.attention.output.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.intermediate.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.output.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.output_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("pooler.dense.{p}", "pooler.dense.{p}"),
    # task heads (bertkit.model.heads), not under the encoder
    ("mlm.transform.{p}", "cls.predictions.transform.dense.{p}"),
    ("mlm.layer_norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("mlm.bias", "cls.predictions.bias"),
    ("mlm.decoder.weight", "cls.predictions.decoder.weight"),  # only when untied (tie_word_embeddings false)
    ("nsp.{p}", "cls.seq_relationship.{p}"),
    ("classifier.{p}", "classifier.{p}"),
    ("qa_outputs.{p}", "qa_outputs.{p}"),
]

ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")
HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.")
# present in some checkpoints, never needed: buffers and the tied decoder
IGNORED = {"embeddings.position_ids", "embeddings.token_type_ids",
           "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = "pytorch_model.bin"  # refused unread (see the module docstring)


# ELECTRA (Clark et al. 2020; Hugging Face modeling_electra.py): the encoder rows of
# TABLE, the projection from embedding_size to hidden_size, and ELECTRA's own heads
ELECTRA_TABLE = [row for row in TABLE if row[0].startswith(("embeddings.", "encoder."))] + [
    ("embeddings_project.{p}", "embeddings_project.{p}"),
    ("discriminator_predictions.dense.{p}", "discriminator_predictions.dense.{p}"),
    ("discriminator_predictions.dense_prediction.{p}", "discriminator_predictions.dense_prediction.{p}"),
    ("generator_predictions.dense.{p}", "generator_predictions.dense.{p}"),
    ("generator_predictions.layer_norm.{p}", "generator_predictions.LayerNorm.{p}"),
    ("generator_predictions.bias", "generator_lm_head.bias"),  # the decoder weight is the tied embeddings,
    ("generator_predictions.decoder.weight", "generator_lm_head.weight"),  # or, untied, a matrix of its own
    ("classifier.dense.{p}", "classifier.dense.{p}"),  # ElectraClassificationHead
    ("classifier.out_proj.{p}", "classifier.out_proj.{p}"),
    ("classifier.{p}", "classifier.{p}"),  # token classification: one linear layer
    ("qa_outputs.{p}", "qa_outputs.{p}"),
]


def _compile(pattern: str) -> re.Pattern:
    regex = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(regex + "$")


@dataclass(frozen=True)
class Layout:
    """One checkpoint family: its key table, the prefix head checkpoints put on the encoder,
    which keys belong to the encoder and which to heads, and keys never needed."""

    model_type: str
    prefix: str
    table: list
    encoder_prefixes: tuple
    head_prefixes: tuple
    ignored: frozenset
    compiled: list = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        rows = [(_compile(ours), (hf,) if isinstance(hf, str) else hf) for ours, hf in self.table]
        object.__setattr__(self, "compiled", rows)


BERT = Layout("bert", "bert.", TABLE, ENCODER_PREFIXES, HEAD_PREFIXES, frozenset(IGNORED))
ELECTRA = Layout(
    # "embeddings" covers embeddings.* and embeddings_project.*; ELECTRA has no pooler
    "electra", "electra.", ELECTRA_TABLE, ("embeddings", "encoder."),
    ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.", "classifier.", "qa_outputs."),
    frozenset({"embeddings.position_ids", "embeddings.token_type_ids", "generator_lm_head.weight"}),
)
LAYOUTS = {"bert": BERT, "electra": ELECTRA}


def layout_of(model) -> Layout:
    """The checkpoint layout of a model, from its config's model_type (BertConfig: "bert")."""
    return LAYOUTS[getattr(model.config, "model_type", "bert")]


def hf_keys(name: str, layout: Layout = BERT) -> tuple[str, ...]:
    """Our parameter name (without the heads' `bert.`/`electra.` prefix) -> its Hugging Face key(s)."""
    for regex, targets in layout.compiled:
        m = regex.match(name)
        if m:
            return tuple(t.format(**m.groupdict()) for t in targets)
    table = "TABLE" if layout is BERT else "ELECTRA_TABLE"
    raise AssertionError(f"no checkpoint name for parameter {name!r}: add it to checkpoint.{table}")


@dataclass
class LoadReport:
    """What happened to each checkpoint key (see the module docstring)."""

    source: str
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def problems(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        parts = []
        for name in ("missing", "unexpected", "mismatched", "unused"):
            keys = getattr(self, name)
            if keys:
                parts.append(f"{name} ({len(keys)}): {', '.join(keys)}")
        return "; ".join(parts) or "all weights matched"


# --- reading -------------------------------------------------------------------


def _read_safetensors(path: Path) -> dict:
    try:
        return load_file(str(path))
    except Exception as err:  # the Rust reader raises its own error type on bad headers/sizes
        raise BertkitError(f"{path} is not a readable safetensors file ({err}); it is probably truncated or corrupt: "
                           "copy or save it again") from None


def _refuse_pickle(path: Path) -> BertkitError:
    return BertkitError(f"{path} is a pickle, which bertkit never opens (unpickling can run code): convert it to "
                        "model.safetensors, e.g. transformers.BertModel.from_pretrained(DIR).save_pretrained(DIR) "
                        "(the head class for a head checkpoint), then load DIR again")


def weights_file(directory) -> Path:
    """The weights file of a checkpoint directory (the first of WEIGHT_FILES there), or `directory` if a file."""
    path = Path(directory)
    if path.is_dir():
        found = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
        if not found and (path / PICKLED_WEIGHTS).is_file():
            raise _refuse_pickle(path / PICKLED_WEIGHTS)
        if not found and (path / INT8_WEIGHTS).is_file():
            raise BertkitError(f"{path} holds an int8 model ({INT8_WEIGHTS}, saved by save_quantized), not float "
                               "weights: run it through bertkit.load(DIR) or a command (embed, predict, ...)")
        if not found:
            onnx = ("; model.onnx is an ONNX export, run by ONNX Runtime: give the model folder it was exported "
                    "from" if (path / "model.onnx").is_file() else "")
            raise BertkitError(f"no weights in {path}: expected one of {', '.join(WEIGHT_FILES)}{onnx}")
        return found[0]
    if not path.is_file():
        raise BertkitError(f"no checkpoint at {path}: pass a model directory with config.json and weights")
    if path.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        raise _refuse_pickle(path)
    if not path.name.endswith((".safetensors", ".index.json")):
        raise BertkitError(f"{path} is not a safetensors file: bertkit reads model.safetensors (or its shards' "
                           "index, model.safetensors.index.json)")
    return path


def read_weights(directory) -> tuple[dict[str, torch.Tensor], Path]:
    """The raw state dict of a checkpoint directory (or of one weights file) and the file read."""
    path = weights_file(directory)
    if path.name.endswith(".index.json"):
        state = {}
        for shard in shard_files(path):  # each inside the folder
            state.update(_read_safetensors(shard))
    else:
        state = _read_safetensors(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BertkitError(f"{path} does not hold a flat name -> tensor state dict")
    return state, path


def canonical(state: dict[str, torch.Tensor], layout: Layout = BERT) -> dict[str, torch.Tensor]:
    """HF keys as a bare BertModel names them: no `bert.` prefix (nor a wrapper's, as some trainers save them: DDP
    `module.`, torch.compile `_orig_mod.`), LayerNorm weight/bias (TF: gamma/beta), MLM bias: cls.predictions.bias."""
    out, cut = {}, len(wrapper_prefix(state))
    for key, value in ((k[cut:], v) for k, v in state.items()):
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key.removeprefix(layout.prefix))
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        out[key] = value
    if "cls.predictions.bias" not in out and "cls.predictions.decoder.bias" in out:
        out["cls.predictions.bias"] = out.pop("cls.predictions.decoder.bias")
    return out


def _our_params(model, layout: Layout = BERT) -> list[tuple[str, str, torch.nn.Parameter]]:
    """(full name, name relative to the encoder, parameter) for every parameter of `model`."""
    return [(name, name.removeprefix(layout.prefix), param) for name, param in model.named_parameters()]


def load_state(model, state: dict[str, torch.Tensor], strict: bool = True, source: str = "checkpoint") -> LoadReport:
    """Copy a Hugging Face state dict into `model` through its layout's table; returns the report."""
    layout = layout_of(model)
    state = canonical(state, layout)
    config = model.config
    if not config.tie_word_embeddings and "cls.predictions.decoder.bias" in state:
        # untied, transformers computes with the decoder's own bias (cls.predictions.bias is then unused)
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]
    report = LoadReport(source=source)

    layers = {int(m.group(1)) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k))}
    if layers and max(layers) + 1 != config.num_hidden_layers:
        raise BertkitError(
            f"{source} has {max(layers) + 1} encoder layers but the config says num_hidden_layers="
            f"{config.num_hidden_layers}: the config does not match the weights"
        )

    used = set()
    with torch.no_grad():
        for full, rel, param in _our_params(model, layout):
            keys = hf_keys(rel, layout)
            present = [k for k in keys if k in state]
            if len(present) < len(keys):
                report.missing += [k for k in keys if k not in state]
                continue
            tensors = [state[k] for k in keys]
            value = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
            used.update(keys)
            if value.shape != param.shape:
                found = " + ".join(str(tuple(t.shape)) for t in tensors)
                msg = f"{keys[0]}: checkpoint shape {found}, the config needs {tuple(param.shape)}"
                if keys[0].startswith(layout.head_prefixes):
                    report.mismatched.append(msg)  # e.g. a classifier trained for another num_labels
                    continue
                raise BertkitError(
                    f"{source} contradicts its config: {msg}; check vocab_size, hidden_size, "
                    "intermediate_size, max_position_embeddings and type_vocab_size in config.json"
                )
            param.copy_(value)

    for key in state:
        if key in used or key in layout.ignored:
            continue
        if key.startswith(layout.encoder_prefixes[:2]) or not key.startswith(layout.encoder_prefixes + layout.head_prefixes):
            report.unexpected.append(key)
        else:
            report.unused.append(key)  # the pooler or another task's head

    if report.problems:
        if strict:
            raise BertkitError(
                f"{type(model).__name__} does not match {source}: {report.describe()}. "
                "Pass strict=False to initialise the missing weights freshly (e.g. a new task head)."
            )
        warnings.warn(f"{type(model).__name__} from {source}: {report.describe()}", stacklevel=4)
    return report


# --- what a model directory holds ------------------------------------------------------------

INT8_WEIGHTS = "model.int8.safetensors"  # an int8 model saved by bertkit.runtime.quantization.save_quantized
TASK_FILE = "bertkit_task.json"  # how a `bertkit finetune` model encodes its inputs (task, columns, max_length)
GENERATOR_DIR = "generator"  # the generator's subfolder in an ELECTRA pre-training output directory
# A Hugging Face head checkpoint without bertkit_task.json: the task its config.json's architectures (and, for
# the sequence classifier, problem_type) name, as bertkit.tasks.registry spells it, and the input length it is
# read at (run_squad.py's 384 for QA, BERT's 512 otherwise, at most the model's positions); ELECTRA's heads (a
# fine-tuned ELECTRA) as BERT's.
_SEQUENCE_TASKS = {"single_label_classification": "classify", "regression": "regression",
                   "multi_label_classification": "multi_label"}
HF_TASKS = {
    f"{family}For{head}": task for family in ("Bert", "Electra")
    for head, task in (("SequenceClassification", _SEQUENCE_TASKS), ("TokenClassification", "ner"),
                       ("QuestionAnswering", "qa"))
}
HF_MAX_LENGTH = {"BertForQuestionAnswering": 384, "ElectraForQuestionAnswering": 384}


def read_config(directory) -> dict:
    """config.json of a model directory (or a config file itself) as a dict; a BertkitError names an unreadable one."""
    path, fix = Path(directory), "fix or replace the file"
    if not path.is_file():
        check_whole(path)
        path, fix = path / "config.json", "the model directory is corrupt"
        if not path.is_file():
            raise BertkitError(f"{directory} is not a model directory: it has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertkitError(f"{path} is not readable JSON ({' '.join(str(err).split())}): {fix}") from None
    if not isinstance(config, dict):
        raise BertkitError(f"{path} is not a JSON object: {fix}")
    return config


def model_type(directory) -> str:
    """The model_type config.json (or a config file) names: "bert" (also when it names none) or "electra"."""
    return read_config(directory).get("model_type", "bert")


def architecture(directory, config: dict | None = None) -> str:
    """The class config.json's `architectures` names ("BertModel" when it names none); `config`: the file, read."""
    names = (read_config(directory) if config is None else config).get("architectures") or ["BertModel"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BertkitError(f"{Path(directory) / 'config.json'}: architectures must be a list of class names such as "
                           f"[\"BertModel\"], got {json.dumps(names)[:60]}")
    return names[0]


def has_int8_weights(directory) -> bool:
    """Whether `directory` holds an int8 model saved by `bertkit.runtime.quantization.save_quantized`."""
    return directory is not None and (Path(directory) / INT8_WEIGHTS).is_file()


def task_info(directory, config: dict | None = None) -> dict | None:
    """A fine-tuned model's task description (bertkit_task.json, or inferred from config.json's
    architectures for a Hugging Face head checkpoint; `config`: that file, read); None for a bare encoder."""
    directory = Path(directory)
    path = directory / TASK_FILE
    if path.is_file():
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            info["task"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
            raise BertkitError(f"{path} is corrupt ({type(err).__name__}: {' '.join(str(err).split())}): "
                               "fine-tune the model again, or remove the file to use it as a plain checkpoint") from None
        for key in ("max_length", "stride"):  # read as numbers by the text tasks' encoders
            value = info.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise BertkitError(f"{path}: {key} must be a whole number, got {json.dumps(value)[:40]}: "
                                   "fine-tune the model again, or fix the file")
        return info
    config = read_config(directory) if config is None else config
    head = architecture(directory, config)
    task = HF_TASKS.get(head)
    if isinstance(task, dict):  # the sequence classifier: by its problem type, named or decided as its head decides
        n = config.get("num_labels", len(config.get("id2label") or {}) or 2)
        task = task[problem_type_of(n, config.get("problem_type"))]
    # "inferred": nothing says which columns it was trained on (single texts or pairs: both are read); the length
    # is at most the model's own positions (a longer input could not run, and predict takes no max_length)
    positions = config.get("max_position_embeddings")
    length = min(HF_MAX_LENGTH.get(head, 512), positions if isinstance(positions, int) and positions > 2 else 512)
    return None if task is None else {"task": task, "max_length": length, "inferred": True}


def save_task_info(directory, info: dict) -> None:
    """`directory`/bertkit_task.json (`task_info` reads it), written whole, non-ASCII text (labels) as it is."""
    write_json(Path(directory) / TASK_FILE, info, ensure_ascii=False)


@dataclass(frozen=True)
class Saved:
    """What a model directory holds, read from its small files (no weights)."""

    directory: Path
    model_type: str  # "bert" or "electra"
    architecture: str  # the class config.json names
    task: dict | None  # a fine-tuned model's task description; None for a bare encoder
    int8_weights: bool  # an int8 model saved by bertkit.runtime.quantization.save_quantized
    config: dict | None = field(default=None, compare=False, repr=False)  # config.json, read: a load builds from it


def describe(path, config: dict | None = None) -> Saved:
    """`path` (None: the default model) as a `Saved`: every reader above, once, config.json (`config`: when the caller
    read it) read once for all (read thrice, a folder saved over meanwhile was one model's type, another's head)."""
    directory = resolve(path)
    config = read_config(directory) if config is None else config
    return Saved(directory, config.get("model_type", "bert"), architecture(directory, config),
                 task_info(directory, config), has_int8_weights(directory), config)


def resolve(path) -> Path:
    """A model directory: `path`, or the default model's when None."""
    if path is None:
        return default_model_dir()
    if not isinstance(path, (str, Path)):
        raise BertkitError(f"model must be None (the default model) or a model directory, got {type(path).__name__}")
    if not str(path).strip():  # Path("") is the current directory
        raise BertkitError("model is an empty string: pass a model directory, or None for the default model")
    path = Path(path)
    if not path.is_dir():
        raise BertkitError(f"no model directory at {path}: it should hold config.json and model.safetensors")
    check_whole(path)  # before any of its files is read
    return path


def load_pretrained(cls, path=None, strict: bool = True, generator: torch.Generator | None = None,
                    config_json: dict | None = None, **config_overrides):
    """`cls.from_pretrained`: build `cls` from config.json (`config_json`: as the caller read it), then its weights."""
    directory = resolve(path)
    config = (cls.config_class.from_pretrained(directory) if config_json is None
              else cls.config_class.from_file_dict(config_json, directory / "config.json"))
    if config_overrides:
        config = config.replace(**config_overrides)
    weights = weights_file(directory)
    shapes = header_shapes(weights)  # the header alone: the config is checked before a layer is allocated
    if shapes is not None:
        check_config(config, shapes, weights)
    # a strict load overwrites every weight, so the layers' random init is thrown away: it must not draw from
    # torch's global generator either (a user's seeded draws would change with whether a model was loaded)
    with torch.random.fork_rng(devices=[], enabled=strict):
        model = cls(config, generator=generator)
    state, weights_path = read_weights(directory)
    model.load_report = load_state(model, state, strict=strict, source=str(weights_path))
    return model.eval()  # like transformers: loaded models start in inference mode (dropout off)


# --- writing -------------------------------------------------------------------


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our parameters under their Hugging Face names (heads: encoder under `bert.` / `electra.`)."""
    layout = layout_of(model)
    prefix = layout.prefix if hasattr(model, layout.prefix[:-1]) else ""  # a head holds its encoder as `bert`
    out = {}
    for full, rel, param in _our_params(model, layout):
        keys = hf_keys(rel, layout)
        chunks = param.detach().chunk(len(keys), dim=0) if len(keys) > 1 else (param.detach(),)
        for key, chunk in zip(keys, chunks):
            out[(prefix if key.startswith(layout.encoder_prefixes) else "") + key] = chunk.contiguous().clone()
    if "cls.predictions.decoder.weight" in out:  # untied: the bias transformers computes with, under both names
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"].clone()
    return out


def save_tensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """A safetensors file written whole or not at all (`bertkit.data.atomic.write_through`), as all our weights."""
    write_through(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def save_config(model, directory):
    """`directory`/config.json for `model` (its class in `architectures`), written whole: written in place, a kill or
    a full disk over a folder left it cut, and the model there (each better epoch's) no longer loaded. Its config."""
    config = model.config.replace(architectures=[type(model).__name__])
    write_lines(Path(directory) / "config.json", [config.to_json_string()])
    return config


def save_pretrained(model, directory, tokenizer=None) -> None:
    """Write `directory` the way transformers does: config.json, model.safetensors and, with a tokenizer, its
    vocab.txt / tokenizer_config.json; as one (`saving`): a save cut short (a kill, a full disk) leaves the model
    there, never its config beside the new weights (or the reverse), which loaded as neither model."""
    if tokenizer is not None and not hasattr(tokenizer, "save_pretrained"):
        raise BertkitError(f"cannot save a {type(tokenizer).__name__}: pass a bertkit Tokenizer")
    with saving(directory):
        config = save_config(model, directory)
        save_tensors(Path(directory) / "model.safetensors", hf_state_dict(model), {"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(directory, positions=config.max_position_embeddings)

