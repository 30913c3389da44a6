"""One way in for inference: a model directory (or the default model) -> the ready model.

Every command that runs a model without training it (embed, predict, attention,
fill-mask, electra show, export, serve, evaluate, mine) loads it here:

    load(model, head=..., device=..., dtype=..., int8=...)
        -> Loaded(model, tokenizer, directory, task, info, layout, device, dtype, int8, weights_dir)

What the directory holds decides the class; the readers live beside the format
they read (`bertkit.model.checkpoint`: config.json's model_type and architectures,
bertkit_task.json, the int8 weights file; `bertkit.model.sentence_layout`: the
sentence-transformers modules). `head` says what the caller wants:

    "auto"        the fine-tuned task model when the directory is one, else the encoder
    "encoder"     the encoder alone (BertModel; ElectraModel for an ELECTRA directory)
    "task"        the fine-tuned head (classification, NER, QA); an error for a bare encoder
    "mlm"         the masked-LM head (fill-mask; a pre-training run's ELECTRA generator)
    "electra"     generator and discriminator together (`bertkit electra show`)
    "saved"       the class config.json names, float32, plain (export traces it)

A static model folder (`bertkit.model.static`: a sentence-transformers StaticEmbedding or a
model2vec folder) loads as task "static": the table, float32 (a lookup gains nothing from
bf16), its tokenizer from the folder's tokenizer.json (`bertkit.text.tokenizer_json`), and a
layout saying mean pooling and whether it normalises; only heads auto and encoder ask for it.

An older sentence-transformers folder, the encoder in a module folder of its own (modules.json's
Transformer at "0_Transformer"), loads the encoder and vocabulary from that folder
(`bertkit.model.sentence_layout.encoder_folder`) and the pooling from the top folder's modules;
`Loaded.directory` is the top folder, `Loaded.weights_dir` the one the weights are in.

An ELECTRA directory loads into the ELECTRA form of the class asked for
(`class_for`): the same task, the ELECTRA heads and checkpoint names.

`load` is one chain, each step once and in this order: what the directory holds
(`bertkit.model.checkpoint.describe`: its small files, no weights; modules.json and config.json are
read once and handed to every step that asks of them); the class `head` asks
for; where and in what it runs (`bertkit.runtime.devices.placement`: "auto" is bf16 where
the device multiplies it natively; int8 means the CPU and float32 activations),
decided before any weight is read, so a wrong choice costs no load; the weights;
the dense layers it runs (`bertkit.runtime.quantization.dense_ops`: int8 where asked, then
the CPU fast path); the sentence layout and the vocabulary (refused when it holds more tokens
than the model has embedding rows). Before any layer is allocated, config.json is checked
(types, ranges) and compared with the weights header's shapes (`bertkit.model.weights_check`). A model loaded here is
in eval mode, for inference only.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertkit.model import electra, heads
from bertkit.model.checkpoint import (GENERATOR_DIR, INT8_WEIGHTS, WEIGHT_FILES, Saved, architecture, describe,
                                      has_int8_weights, model_type, read_config, resolve)
from bertkit.runtime.devices import dtype_name, in_memory, placement
from bertkit.model.electra import (ElectraForMaskedLM, ElectraForPreTraining, ElectraForQuestionAnswering,
                                  ElectraForSequenceClassification, ElectraForTokenClassification, ElectraModel,
                                  ElectraPreTrainedModel)
from bertkit.model.electra_pretraining import ElectraPretrainingModel
from bertkit.errors import BertkitError, switch
from bertkit.model.modeling import BertModel
from bertkit.runtime.quantization import dense_ops, load_quantized
from bertkit.model.sentence_layout import SentenceLayout, encoder_folder, read_layout
from bertkit.model.static import StaticEmbedding, is_static, read_static, small_files, weights_folder
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.tokenizer_json import read_tokenizer_json, truncation_length

HEADS = ("auto", "encoder", "task", "mlm", "electra", "saved")

# the classes a config.json `architectures` may name
CLASSES = {cls.__name__: cls for cls in (BertModel, *heads.HEADS, ElectraModel, *electra.HEADS)}

# a BERT class -> its ELECTRA form, for an ELECTRA directory (BertForPreTraining's: the discriminator, the
# pre-training model an ELECTRA folder holds at its top, as transformers names both "...ForPreTraining")
_ELECTRA_FORM = {
    "BertModel": ElectraModel,
    "BertForPreTraining": ElectraForPreTraining,
    "BertForMaskedLM": ElectraForMaskedLM,
    "BertForSequenceClassification": ElectraForSequenceClassification,
    "BertForTokenClassification": ElectraForTokenClassification,
    "BertForQuestionAnswering": ElectraForQuestionAnswering,
}


def class_for(model_dir, cls):
    """The class to load `model_dir` into for a task that asks for the BERT class `cls`:
    `cls` itself for a BERT directory, its ELECTRA form for an ELECTRA one (e.g. a pre-training
    run's discriminator under BertForSequenceClassification -> ElectraForSequenceClassification)."""
    if model_dir is None or model_type(model_dir) != "electra":
        return cls
    return _electra_form(model_dir, cls)


def _electra_form(model_dir, cls):
    if issubclass(cls, ElectraPreTrainedModel):
        return cls
    if cls.__name__ not in _ELECTRA_FORM:
        raise BertkitError(
            f"{model_dir} is an ELECTRA model; {cls.__name__} has no ELECTRA form here "
            f"(there are: {', '.join(c.__name__ for c in _ELECTRA_FORM.values())})"
        )
    return _ELECTRA_FORM[cls.__name__]


def encoder_dir(model) -> Path:
    """The folder holding the encoder's files of `model` (None: the default model): the folder itself, or an
    older sentence-transformers layout's module folder (0_Transformer), for code that reads them itself
    (fine-tuning builds its head on the encoder; `bertkit model info`)."""
    return encoder_folder(resolve(model))


def folder_stamp(directory) -> tuple:
    """A model folder's files as a cache of loaded models keys it beside its path: each file's name, size and
    modification time (stat'ed, never read), so a folder written again (a model fine-tuned into it once more,
    `--overwrite`) is loaded again rather than its first model served from the cache."""
    stamp = []
    for folder, _, names in os.walk(directory):
        for name in names:
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:  # gone between the listing and the stat
                continue
            stamp.append((os.path.relpath(os.path.join(folder, name), directory), info.st_size, info.st_mtime_ns))
    return tuple(sorted(stamp))


def weights_fingerprint(directory) -> str:
    """SHA-256 of a model directory's weights files (the first of model.safetensors, its shards'
    index, model.int8.safetensors that exists; a sharded checkpoint's shards too): which model this is, read
    byte for byte, where `folder_stamp` only stats the files (an index records it and checks a query's model).
    A static model's table, and an older sentence-transformers layout's encoder (0_Transformer), sit in a module
    folder, which the loader records (`Loaded.weights_dir`)."""
    directory = Path(directory)
    names = [n for n in (*WEIGHT_FILES, INT8_WEIGHTS) if (directory / n).is_file()]
    if not names:
        raise BertkitError(f"{directory} holds no weights file ({', '.join(WEIGHT_FILES)})")
    files = [directory / names[0]]
    if names[0].endswith(".index.json"):  # sharded: the shards it names, in name order
        shards = json.loads(files[0].read_text())["weight_map"].values()
        files += [directory / s for s in sorted(set(shards))]
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def max_positions(model) -> int | None:
    """The positions of `model`'s encoder (config.json's max_position_embeddings): the longest input it reads;
    None where there is no model to read (a run refuses it where it loads it, after its settings and files:
    a fine-tuning run fits its default length to the positions before reading its files)."""
    try:
        return read_config(encoder_dir(model)).get("max_position_embeddings")
    except BertkitError:
        return None


def check_length(model, max_length: int) -> None:
    """Refuse a training run's --max-length above the positions of the model it fine-tunes. It was taken: short
    texts trained, the saved model then said it reads max_length tokens (bertkit_task.json, sentence-transformers'
    max_seq_length) and the first long text stopped predict, embed or the run itself on the position table."""
    positions = max_positions(model)
    if positions and max_length > positions:
        raise BertkitError(f"--max-length {max_length} is above the {positions} positions of "
                           f"{model or 'the default model'} (max_position_embeddings): pass --max-length {positions} "
                           "or less")


def need_transformer(path, use: str) -> tuple | None:
    """Refuse the folder at `path` for `use`, which runs a transformer (layers, attention, a head), when it holds
    a static model: a table, one vector per token (what `bertkit distill static` writes). None: the default model;
    a path that is no folder is left to the reader that names what it expects. Returns the folder's small files as
    read (`small_files`; None: no folder), for a caller to build from the config.json it judged."""
    if not path or not Path(path).is_dir():  # "" is no folder, not the current one
        return None
    files = small_files(path)
    if is_static(path, files):
        raise BertkitError(f"{path} holds a static embedding model (one vector per token, no layers or attention): "
                           f"{use} needs a transformer, e.g. the model it was distilled from")
    return files


@dataclass
class Loaded:
    """A model ready for inference and what it is."""

    model: nn.Module
    tokenizer: Tokenizer
    directory: Path | None  # None: a (model, tokenizer) pair handed over in memory
    task: str  # "embed" for an encoder; a fine-tuned task ("classify", "ner", "qa", ...); "mlm"; "electra"; "static"
    info: dict  # the fine-tuned task's description (bertkit_task.json); {} otherwise
    layout: SentenceLayout | None  # the sentence-transformers layout, when the directory has one (what it means for
    # a sentence vector, with the caller's choices on top: bertkit.embeddings.settings.resolve_output)
    device: torch.device
    dtype: torch.dtype
    int8: bool
    weights_dir: Path | None = None  # the folder its weights are in: `directory`, or a module folder (an older
    # sentence-transformers layout's 0_Transformer, a static model's table); None: a model in memory

    @property
    def config(self):
        return self.model.config

    @property
    def fine_tuned(self) -> bool:
        """Whether it is a fine-tuned task model (bertkit_task.json, or a Hugging Face head checkpoint)."""
        return bool(self.info) and self.task != "static"  # a static model's info says where its table is

    def need_layers(self, use: str) -> None:
        """Refuse a static model (a table: no layers, attention or heads) for `use`, which runs a transformer."""
        if self.task == "static":
            need_transformer(self.directory, use)

    @property
    def max_positions(self) -> int:
        return int(self.config.max_position_embeddings)

    @property
    def max_length(self) -> int:
        """Tokens per input the model was made for: the layout's max_seq_length (the length a sentence
        embedding model was trained at), a task's max_length, else the model's positions."""
        length = (self.layout.max_seq_length if self.layout is not None else None) or self.info.get("max_length")
        return min(int(length), self.max_positions) if length else self.max_positions

    @property
    def precision(self) -> str:
        """"int8", "float32" or "bfloat16": what the dense layers compute in."""
        return "int8" if self.int8 else dtype_name(self.dtype)


def _check_head(head: str) -> None:
    if head not in HEADS:
        raise BertkitError(f"unknown head {head!r}: use one of {', '.join(HEADS)}")


@dataclass(frozen=True)
class _Plan:
    """What `load` builds, decided before any weight is read: from a directory's small files, or
    from a (model, tokenizer) pair already in memory."""

    cls: type | None  # the class to build (None: the model is in memory)
    weights: Path | None  # the folder holding its config.json and weights (an ELECTRA generator: generator/)
    vocab: Path | None  # the folder holding its vocabulary
    task: str
    info: dict
    int8_weights: bool  # saved by bertkit.runtime.quantization.save_quantized (a model in memory is asked in _build)
    model: nn.Module | None = None  # a model in memory and its tokenizer
    tokenizer: Tokenizer | None = None


def _held(net: nn.Module, tok) -> _Plan:
    """A (model, tokenizer) pair in memory: nothing to build (where it is, and whether it is int8, are
    read from the model when it is placed)."""
    return _Plan(None, None, None, "static" if isinstance(net, StaticEmbedding) else "embed", {}, False, net, tok)


def _plan(saved: Saved, head: str, int8: bool) -> _Plan:
    """The class `head` asks for in the directory `saved` describes."""
    directory, info, int8_weights = saved.directory, saved.task, saved.int8_weights
    if head == "mlm":
        cls, where = heads.BertForMaskedLM, directory
        if saved.model_type == "electra":
            cls = ElectraForMaskedLM  # a pre-training run's generator, in its subfolder
            where = directory / GENERATOR_DIR if (directory / GENERATOR_DIR / "config.json").is_file() else directory
        return _Plan(cls, where, where if (where / "vocab.txt").is_file() else directory, "mlm", {},
                     has_int8_weights(where))  # an int8 masked LM (save_quantized) loads as int8
    if head == "electra":
        return _Plan(ElectraPretrainingModel, directory, directory, "electra", {}, False)
    if head == "saved":
        if int8 or int8_weights:
            raise BertkitError(f"{directory} holds an int8 bertkit model, which has no plain float form to save "
                               "or export: use the float model it was quantized from")
        if saved.architecture not in CLASSES:
            raise BertkitError(f"{directory} holds a {saved.architecture}, which bertkit has no class for "
                               f"(it loads {', '.join(CLASSES)})")
        return _Plan(CLASSES[saved.architecture], directory, directory, (info or {}).get("task", "embed"),
                     info or {}, False)
    if head == "task" and info is None:
        raise BertkitError(f"{directory} holds a {saved.architecture}, not a fine-tuned task model; "
                           "fine-tune it first (bertkit finetune TASK)")
    if head == "encoder" or info is None:
        cls, task = BertModel, "embed"
    else:  # a fine-tuned model: the head class its config.json names (what the directory holds decides)
        cls, task = _task_head(saved), info["task"]
    if saved.model_type == "electra":  # also an int8 one (save_quantized): its config is ELECTRA's
        cls = _electra_form(directory, cls)
    return _Plan(cls, directory, directory, task, info or {}, int8_weights)


def _task_head(saved: Saved) -> type:
    """The head class of a fine-tuned model: the one config.json's `architectures` names."""
    cls = CLASSES.get(saved.architecture)
    if cls is None or cls in (BertModel, ElectraModel):
        raise BertkitError(f"{saved.directory} describes a fine-tuned {saved.task['task']} model but holds a "
                           f"{saved.architecture}, not a task head: fine-tune it again (bertkit finetune TASK)")
    return cls


def _build(plan: _Plan, device, dtype, int8: bool, speed,
           config: dict | None = None) -> tuple[nn.Module, torch.device, torch.dtype, bool]:
    """The model of `plan` in eval mode on its device and in its dtype, that device and dtype, and
    whether its weights are int8 (`config`: the config.json `plan.weights` holds, as `load` read it). Where and
    in what it runs is decided first (`bertkit.runtime.devices.placement`), before any weight is read, so a wrong
    choice costs no load; a model in memory is moved and cast only where `device` or `dtype` ask for it."""
    held = plan.model is not None
    on, int8_weights = in_memory(plan.model) if held else (None, plan.int8_weights)
    where, chosen = placement(device, dtype, int8 or int8_weights, on=on,
                              what="an int8 model" if int8_weights else "int8")
    if held:
        return (plan.model if int8_weights else plan.model.to(where, None if dtype is None else chosen),
                where, chosen, int8_weights)
    if int8_weights:
        return _int8(plan.cls, plan.weights, speed, config), where, chosen, True
    if plan.cls is BertModel:
        return _encoder(plan.weights, config).to(where, chosen), where, chosen, False
    if plan.task != "mlm":
        model = plan.cls.from_pretrained(plan.weights, config_json=config)
        return model.eval().to(where, chosen), where, chosen, False
    # a masked-LM head must be all there: the report is checked here, with a message for fill-mask
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = plan.cls.from_pretrained(plan.weights, strict=False, config_json=config)
    report = model.load_report
    if report.missing:
        what = ("an ELECTRA discriminator or fine-tuned model: point it at the generator (ElectraForMaskedLM)"
                if plan.cls is ElectraForMaskedLM else "a bare encoder or a fine-tuned model")
        raise BertkitError(
            f"{plan.weights} has no masked-LM head (missing {', '.join(report.missing[:3])}"
            f"{', ...' if len(report.missing) > 3 else ''}); it looks like {what}. fill-mask needs a "
            "pre-training checkpoint: BertForMaskedLM / BertForPreTraining or an ELECTRA generator"
        )
    if report.unexpected or report.mismatched:
        raise BertkitError(f"{plan.weights} does not load as {plan.cls.__name__}: {report.describe()}")
    return model.eval().to(where, chosen), where, chosen, False


def _int8(cls, directory, speed, config: dict | None = None) -> nn.Module:
    """The int8 model save_quantized wrote in `directory`, as `cls`. The encoder asked of an int8 fine-tuned
    model is its head's encoder (a float one's is read out of the head's checkpoint the same way, `_encoder`):
    the quantized head is built as saved, and its encoder kept."""
    saved = CLASSES.get(architecture(directory, config))
    if cls in (BertModel, ElectraModel) and saved is not None and saved not in (BertModel, ElectraModel):
        return load_quantized(saved, directory, speed, config).base_model
    return load_quantized(cls, directory, speed, config)


def _encoder(directory, config: dict | None = None) -> BertModel:
    """The encoder of `directory`, with its pooler when the checkpoint has one. A masked-LM checkpoint
    (BertForMaskedLM, like transformers') saves no pooler: the encoder loads without it (pooler_output
    None) rather than with a random one; any other missing or unexpected weight is still refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BertModel.from_pretrained(directory, strict=False, config_json=config)
    report = model.load_report
    if report.missing and all(key.startswith("pooler.") for key in report.missing):
        model.pooler = None
        report.missing = []
    if report.problems:
        raise BertkitError(f"BertModel does not match {report.source}: {report.describe()}")
    return model.eval()


def check_as_loaded(loaded: Loaded, name: str, when: str, device=None, dtype=None, int8: bool = False) -> None:
    """A `Loaded` model (argument `name`) runs where and in what it was loaded: a device, dtype or int8 asked
    for beside it, which applies `when` a call (embed, predict, attention_map) loads a model, is refused
    rather than ignored."""
    asked = [k for k, v in (("device", device), ("dtype", dtype), ("int8", int8)) if v not in (None, False)]
    if asked:
        raise BertkitError(f"{name} is already loaded (on {loaded.device}, {loaded.precision}): {asked[0]}= applies "
                           f"when {when}; pass it to bertkit.load() instead")


def load(model=None, *, head: str = "auto", device=None, dtype=None, int8: bool = False,
         fast=True) -> Loaded:
    """The model in `model`, ready for inference: a directory (None: the default model), or a
    (model, tokenizer) pair already in memory, which is moved, cast and quantized in place only
    where `device`, `dtype` or `int8` ask for it (an encoder with no layout: nothing was read).

    head: what to load (see the module docstring). device: auto (None), cpu or cuda.
    dtype: float32 (None), bfloat16 or auto (bf16 where the device has it natively).
    int8: quantize the encoder's dense layers (CPU). fast: apply the CPU fast path, on the
    settings given (`bertkit.runtime.fast.SpeedSettings`) or, with True, those `decide()` makes for
    this CPU (False keeps the plain layers, e.g. for tracing into ONNX).

    The steps run in this order, each once: what the directory holds (its small files), where
    and in what the model runs, the weights, then int8 and the fast path, the layout and the
    vocabulary.
    """
    _check_head(head)
    int8 = switch(int8, "int8")  # int8="no" is a true str: it quantized
    held = isinstance(model, tuple) and len(model) == 2
    if held and (not isinstance(model[0], nn.Module) or model[1] is None):
        raise BertkitError(f"a (model, tokenizer) pair needs a torch model and its tokenizer, got "
                           f"({type(model[0]).__name__}, {type(model[1]).__name__})")
    top = None if held else resolve(model)  # None: the default model's folder
    # modules.json and config.json read once for the whole load (read again by each step, a folder saved over
    # meanwhile could be judged by one save's files and built from another's)
    files = None if held else small_files(top)
    if isinstance(model, (str, Path)) and is_static(top, files):  # "" is no folder, not the current one
        return _load_static(Path(model), head, device, int8, files)
    folder = None if held else encoder_folder(top, files[0])
    # the encoder's small files (an older layout: its folder's, its config.json not read yet)
    saved = None if held else describe(folder, files[1] if folder == top and isinstance(files[1], dict) else None)
    plan = _held(*model) if held else _plan(saved, head, int8)
    speed = None if isinstance(fast, bool) else fast  # None: quantization and the fast path decide() them
    # nothing random survives an inference load (a missing weight is refused, a missing pooler dropped): the
    # layers' thrown-away init must not move the caller's seeded torch generator
    with torch.random.fork_rng(devices=[]):
        net, where, chosen, int8_weights = _build(plan, device, dtype, int8, speed,
                                                  saved.config if saved and plan.weights == saved.directory else None)
    quantize_now = int8 and not int8_weights
    # a model in memory keeps its layers, unless it is quantized here
    net = dense_ops(net, quantize_now, fast is not False if not held else quantize_now, speed)
    layout = read_layout(top, files[0]) if not held and plan.cls in (BertModel, ElectraModel) else None  # an encoder's
    # the vocabulary is refused when it holds more tokens than the model has embedding rows
    tok = plan.tokenizer if held else Tokenizer.from_pretrained(plan.vocab, vocab_size=net.config.vocab_size)
    dtype_now = next((p.dtype for p in net.parameters()), chosen)
    return Loaded(net, tok, top, plan.task, plan.info, layout, where, dtype_now, int8 or int8_weights, plan.weights)


def _load_static(directory: Path, head: str, device, int8: bool, files: tuple) -> Loaded:
    """A static model folder (see the module docstring), on `device`, float32 (`files`: its small files, read)."""
    if head not in ("auto", "encoder"):
        raise BertkitError(f"{directory} holds a static embedding model (a table, no transformer): it embeds "
                           f"texts only, it has no {head} head")
    if int8:
        raise BertkitError(f"{directory} holds a static embedding model: it has no dense layers to run in int8")
    where, _ = placement(device, None, False)
    static = read_static(directory, files)
    tok = read_tokenizer_json(static.tokenizer_dir)
    config = static.model.config
    beyond = [t for t in tok.ids_to_tokens[config.vocab_size:] if t not in tok.all_special_tokens]
    if beyond:
        raise BertkitError(f"{directory}: the table has {config.vocab_size} rows but the tokenizer has "
                           f"{len(tok)} tokens ({beyond[0]!r} has no row): the folder is inconsistent")
    # model2vec's encoder drops [UNK] before averaging; special tokens its vocabulary lacks (added by
    # read_tokenizer_json after the last id) have no row: a text that writes one out ("[MASK]") skips it
    unk = (tok.unk_token_id,) if static.layout == "model2vec" else ()
    config.skip_ids = unk + tuple(i for i in tok.all_special_ids if i >= config.vocab_size)
    if static.layout != "model2vec":  # sentence-transformers cuts where its Rust tokenizer does
        config.max_length = truncation_length(static.tokenizer_dir)
    layout = SentenceLayout("mean", config.normalize, config.max_length)
    return Loaded(static.model.eval().to(where), tok, directory, "static", {"layout": static.layout}, layout, where,
                  torch.float32, False, weights_folder(directory, files))
