"""One way in for inference: a model directory (or the default model) -> the ready model.

Every command that runs a model without training it (embed, predict, attention,
fill-mask, electra show, export, serve, evaluate, mine) loads it here:

    load(model, head=..., device=..., dtype=..., int8=...)
        -> Loaded(model, tokenizer, directory, task, info, layout, device, dtype, int8)

What the directory holds decides the class; the readers live beside the format
they read (`bertkit.checkpoint`: config.json's model_type and architectures,
bertkit_task.json, the int8 weights file; `bertkit.sentence_layout`: the
sentence-transformers modules). `head` says what the caller wants:

    "auto"        the fine-tuned task model when the directory is one, else the encoder
    "encoder"     the encoder alone (BertModel; ElectraModel for an ELECTRA directory)
    "task"        the fine-tuned head (classification, NER, QA); an error for a bare encoder
    "mlm"         the masked-LM head (fill-mask; a pre-training run's ELECTRA generator)
    "electra"     generator and discriminator together (`bertkit electra show`)
    "saved"       the class config.json names, float32, plain (export traces it)

An ELECTRA directory loads into the ELECTRA form of the class asked for
(`class_for`): the same task, the ELECTRA heads and checkpoint names.

Then, in this order: the device and dtype (`bertkit.devices`: "auto" is bf16 where
the device multiplies it natively); int8 dense layers (`bertkit.quantization`;
CPU and float32 activations, so device "auto" means the CPU and dtype "auto"
float32); the CPU fast path (`bertkit.fast.accelerate`); eval mode. A model loaded
here is for inference only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertkit import electra, heads
from bertkit.checkpoint import (GENERATOR_DIR, architecture, has_int8_weights, model_type, resolve,
                                task_info)
from bertkit.devices import dtype_name, resolve_device, resolve_dtype
from bertkit.electra import (ElectraForMaskedLM, ElectraForQuestionAnswering, ElectraForSequenceClassification,
                             ElectraForTokenClassification, ElectraModel, ElectraPreTrainedModel)
from bertkit.electra_pretraining import ElectraPretrainingModel
from bertkit.errors import BertkitError
from bertkit.fast import accelerate
from bertkit.modeling import BertModel
from bertkit.quantization import is_quantized, load_quantized, quantize
from bertkit.sentence_layout import SentenceLayout, read_layout
from bertkit.tokenizer import Tokenizer

HEADS = ("auto", "encoder", "task", "mlm", "electra", "saved")

# the classes a config.json `architectures` may name
CLASSES = {cls.__name__: cls for cls in (BertModel, *heads.HEADS, ElectraModel, *electra.HEADS)}

# a BERT class -> its ELECTRA form, for an ELECTRA directory
_ELECTRA_FORM = {
    "BertModel": ElectraModel,
    "BertForMaskedLM": ElectraForMaskedLM,
    "BertForSequenceClassification": ElectraForSequenceClassification,
    "BertForTokenClassification": ElectraForTokenClassification,
    "BertForQuestionAnswering": ElectraForQuestionAnswering,
}

# a fine-tuned task -> the head class that answers it
_TASK_CLASS = {"ner": heads.BertForTokenClassification, "qa": heads.BertForQuestionAnswering}


def class_for(model_dir, cls):
    """The class to load `model_dir` into for a task that asks for the BERT class `cls`:
    `cls` itself for a BERT directory, its ELECTRA form for an ELECTRA one (e.g. a pre-training
    run's discriminator under BertForSequenceClassification -> ElectraForSequenceClassification)."""
    if model_dir is None or issubclass(cls, ElectraPreTrainedModel) or model_type(model_dir) != "electra":
        return cls
    if cls.__name__ not in _ELECTRA_FORM:
        raise BertkitError(
            f"{model_dir} is an ELECTRA model; {cls.__name__} has no ELECTRA form here "
            f"(there are: {', '.join(c.__name__ for c in _ELECTRA_FORM.values())})"
        )
    return _ELECTRA_FORM[cls.__name__]


@dataclass
class Loaded:
    """A model ready for inference and what it is."""

    model: nn.Module
    tokenizer: Tokenizer
    directory: Path | None  # None: a (model, tokenizer) pair handed over in memory
    task: str  # "embed" for an encoder; a fine-tuned task ("classify", "ner", "qa", ...); "mlm"; "electra"
    info: dict  # the fine-tuned task's description (bertkit_task.json); {} otherwise
    layout: SentenceLayout | None  # the sentence-transformers layout, when the directory has one
    device: torch.device
    dtype: torch.dtype
    int8: bool

    @property
    def config(self):
        return self.model.config

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
    def pooling(self) -> str:
        """How the tokens become one sentence vector: the layout's pooling, else the tokens' mean."""
        return self.layout.pooling if self.layout is not None and self.layout.pooling else "mean"

    @property
    def normalize(self) -> bool:
        """Whether sentence vectors are L2-normalised: as the layout says, else not."""
        return bool(self.layout is not None and self.layout.normalize)

    @property
    def precision(self) -> str:
        """"int8", "float32" or "bfloat16": what the dense layers compute in."""
        return "int8" if self.int8 else dtype_name(self.dtype)


def _check_head(head: str) -> None:
    if head not in HEADS:
        raise BertkitError(f"unknown head {head!r}: use one of {', '.join(HEADS)}")


def _directory(model) -> Path:
    if model is not None and not isinstance(model, (str, Path)):
        raise BertkitError(f"model must be None (the default model) or a model directory, got {type(model).__name__}")
    return resolve(model)  # None: the default model; a missing directory is one line from here


def _mlm(directory: Path) -> tuple[nn.Module, Path]:
    """The masked-LM model of a directory (an ELECTRA pre-training run: its generator), and where
    its vocabulary is; a BertkitError when the directory has no MLM head."""
    import warnings

    cls, where = heads.BertForMaskedLM, directory
    if model_type(directory) == "electra":
        cls = ElectraForMaskedLM
        if (directory / GENERATOR_DIR / "config.json").is_file():
            where = directory / GENERATOR_DIR
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report is checked below, with a message for this use
        model = cls.from_pretrained(where, strict=False)
    report = model.load_report
    if report.missing:
        what = ("an ELECTRA discriminator or fine-tuned model: point it at the generator (ElectraForMaskedLM)"
                if cls is ElectraForMaskedLM else "a bare encoder or a fine-tuned model")
        raise BertkitError(
            f"{where} has no masked-LM head (missing {', '.join(report.missing[:3])}"
            f"{', ...' if len(report.missing) > 3 else ''}); it looks like {what}. fill-mask needs a "
            "pre-training checkpoint: BertForMaskedLM / BertForPreTraining or an ELECTRA generator"
        )
    if report.unexpected or report.mismatched:
        raise BertkitError(f"{where} does not load as {cls.__name__}: {report.describe()}")
    return model, where if (where / "vocab.txt").is_file() else directory


def _saved_class(directory: Path):
    name = architecture(directory)
    if name not in CLASSES:
        raise BertkitError(f"{directory} holds a {name}, which bertkit has no class for "
                           f"(it loads {', '.join(CLASSES)})")
    return CLASSES[name]


def _build(directory: Path, head: str, info: dict | None) -> tuple[nn.Module, str, Path]:
    """(float model, task, tokenizer directory) for `head`, before device, dtype and int8."""
    if head == "mlm":
        model, vocab = _mlm(directory)
        return model, "mlm", vocab
    if head == "electra":
        return ElectraPretrainingModel.from_pretrained(directory), "electra", directory
    if head == "saved":
        return _saved_class(directory).from_pretrained(directory), (info or {}).get("task", "embed"), directory
    if head == "task" and info is None:
        raise BertkitError(f"{directory} holds a {architecture(directory)}, not a fine-tuned task model; "
                           "fine-tune it first (bertkit finetune TASK)")
    if head == "encoder" or info is None:
        cls, task = BertModel, "embed"
    else:
        cls, task = _TASK_CLASS.get(info["task"], heads.BertForSequenceClassification), info["task"]
    if has_int8_weights(directory):  # saved by bertkit.quantization.save_quantized
        return load_quantized(cls, directory), task, directory
    return class_for(directory, cls).from_pretrained(directory), task, directory


def _placement(int8_weights: bool, device, dtype, int8: bool, where) -> tuple[torch.device, torch.dtype, bool]:
    """Where the model runs and in what. int8 (asked for, or saved so) means the CPU and float32
    activations; `where`: the device a model in memory is already on (None: load it)."""
    int8 = int8 or int8_weights
    if not int8:
        where = resolve_device(device) if device is not None or where is None else where
        return where, resolve_dtype(dtype, where), False
    where = resolve_device("cpu" if device in (None, "auto") else device)
    chosen = torch.float32 if dtype in (None, "auto") else resolve_dtype(dtype, where)
    if where.type != "cpu" or chosen != torch.float32:
        what = "an int8 model" if int8_weights else "int8"
        raise BertkitError(f"{what}: int8 runs on the CPU in float32 activations (--device cpu, --dtype float32 "
                           "or auto)")
    return where, chosen, True


def _ready(net: nn.Module, where: torch.device, dtype: torch.dtype | None, int8: bool, fast: bool) -> nn.Module:
    """The model on its device in its dtype (None: as it is), int8 if asked, the fast path applied."""
    if not is_quantized(net):
        net = net.to(where, dtype)
    if int8 and not is_quantized(net):
        net = quantize(net)  # before accelerate: see bertkit.quantization
    return accelerate(net) if fast else net


def load(model=None, *, head: str = "auto", device=None, dtype=None, int8: bool = False,
         fast: bool = True) -> Loaded:
    """The model in `model`, ready for inference: a directory (None: the default model), or a
    (model, tokenizer) pair already in memory, which is moved, cast and quantized in place only
    where `device`, `dtype` or `int8` ask for it (an encoder with no layout: nothing was read).

    head: what to load (see the module docstring). device: auto (None), cpu or cuda.
    dtype: float32 (None), bfloat16 or auto (bf16 where the device has it natively).
    int8: quantize the encoder's dense layers (CPU). fast: apply the CPU fast path
    (False keeps the plain layers, e.g. for tracing into ONNX).
    """
    _check_head(head)
    if isinstance(model, tuple) and len(model) == 2:
        net, tok = model
        param = next(net.parameters(), None)
        on = param.device if param is not None else torch.device("cpu")
        where, chosen, int8 = _placement(is_quantized(net), device, dtype, int8, on)
        net = _ready(net, where, chosen if dtype is not None else None, int8, fast=int8 and not is_quantized(net))
        dtype_now = next(net.parameters()).dtype if param is not None else chosen
        return Loaded(net, tok, None, "embed", {}, None, where, dtype_now, int8)
    directory = _directory(model)
    info = task_info(directory) if head not in ("mlm", "electra") else None
    int8_weights = head not in ("mlm", "electra", "saved") and has_int8_weights(directory)
    if head == "saved" and (int8 or has_int8_weights(directory)):
        raise BertkitError(f"{directory} holds an int8 bertkit model, which has no plain float form to save "
                           "or export: use the float model it was quantized from")
    where, chosen, int8 = _placement(int8_weights, device, dtype, int8, None)
    net, task, vocab = _build(directory, head, info)
    net = _ready(net.eval(), where, chosen, int8, fast)  # loaded here for inference only
    layout = read_layout(directory) if task == "embed" else None
    return Loaded(net, Tokenizer.from_pretrained(vocab), directory, task, info or {}, layout, where, chosen, int8)
