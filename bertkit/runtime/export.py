"""ONNX export: a bertkit model directory as an ONNX graph for ONNX Runtime and friends.

`export_onnx(model_dir, out_dir)` writes `out_dir/model.onnx` with the inputs and
outputs named as Hugging Face's exports (`optimum`, `transformers.onnx`) name them,
so code written for those runs it unchanged:

    inputs   input_ids, attention_mask, token_type_ids     int64 [batch, sequence]
    BertModel                       last_hidden_state [batch, sequence, H],
                                    pooler_output [batch, H] (when it has a pooler)
    BertForSequenceClassification   logits [batch, labels]
    BertForTokenClassification      logits [batch, sequence, labels]
    BertForQuestionAnswering        start_logits, end_logits [batch, sequence]
    ElectraModel and ELECTRA's heads  as their BERT forms (an ELECTRA encoder has no pooler_output)

batch and sequence are dynamic axes (sequence up to max_position_embeddings).
config.json, the tokenizer files and bertkit_task.json (a fine-tuned model's
task) are copied beside it, so the directory is a complete model for
`tokenizer + onnxruntime`; so is a sentence embedding model's sentence-transformers
layout (`bertkit.model.sentence_layout.layout_files`: modules.json, sentence_bert_config.json,
1_Pooling/, 2_Normalize/, config_sentence_transformers.json), so its vectors are pooled as the
source's. An older layout's encoder folder (0_Transformer) is exported with the encoder at the top.

The graph is traced from the plain float32 model (not `accelerate`d: its oneDNN
kernels are no ONNX operators) with PyTorch's TorchScript exporter
(`torch.onnx.export(dynamo=False)`): the torch.export-based one refuses the
model's input checks, which read values of the inputs (token ids against the
vocabulary). The trace runs on a padded batch so the attention-mask path is the
one recorded; on fully unpadded input the graph adds a zero mask where bertkit
skips it, the same result. Attention is exported as the fused SDPA operator's
ONNX decomposition (opset 14 or later).

Checked on export: ONNX Runtime runs the file on real text (a batch of
sentences of different lengths, and sentence pairs where the model has a second
segment) and every output must match
bertkit's within `atol` (1e-4); otherwise BertkitError with the difference. The graph is written
beside its name and renamed to model.onnx only once it passed (`bertkit.data.atomic`), the other
files copied just before, all renamed together (`bertkit.data.atomic.saving`): a failed check or a killed export
leaves no model.onnx that looks finished, nor one beside another export's files. A model's
own folder takes its export beside its weights; the installed default model's folder is its package's and is
refused (`refuse_installed_default`), as is a folder holding another model. What
cannot be exported fails with a BertkitError naming it: an int8 model (export the
float model and quantize the ONNX file with ONNX Runtime's `quantize_dynamic`),
a head with no ONNX signature here (pre-training, masked LM, NSP, multiple
choice: the error names `encoder=True`, `--encoder`, which exports such a folder's encoder, the part a
pre-training run is deployed as), or an operator the exporter has no ONNX form for at the chosen opset.

`onnx` and `onnxruntime` are optional (`pip install 'bertkit[onnx]'`); they are
imported only inside these functions.
"""

from __future__ import annotations

import importlib
import json
import shutil
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertkit.data.atomic import remove, saving, write_json, write_through
from bertkit.model.checkpoint import (INT8_WEIGHTS, PICKLED_WEIGHTS, WEIGHT_FILES, architecture, has_int8_weights,
                                      resolve, save_config)
from bertkit.runtime.devices import holds_int8
from bertkit.errors import BertkitError, MissingPackage
from bertkit.runtime.loading import load, need_transformer
from bertkit.model.sentence_layout import MODULES_FILE, SENTENCE_CONFIG, ST_CONFIG, encoder_folder, layout_files

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# class name -> output names in the order the graph returns them
SIGNATURES = {
    "BertModel": ("last_hidden_state", "pooler_output"),
    "BertForSequenceClassification": ("logits",),
    "BertForTokenClassification": ("logits",),
    "BertForQuestionAnswering": ("start_logits", "end_logits"),
    # ELECTRA (bertkit.model.electra): a discriminator has no pooler; its heads are the BERT heads' subclasses
    "ElectraModel": ("last_hidden_state",),
    "ElectraForSequenceClassification": ("logits",),
    "ElectraForTokenClassification": ("logits",),
    "ElectraForQuestionAnswering": ("start_logits", "end_logits"),
}
# copied beside model.onnx when the model directory has them
SIDE_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json",
              "bertkit_task.json")
# the architectures whose logits are one row per sequence (the other heads' are per token)
SEQUENCE_LOGITS = ("BertForSequenceClassification", "ElectraForSequenceClassification")
DEFAULT_OPSET = 17
MIN_OPSET = 14  # scaled_dot_product_attention has an ONNX form from opset 14

# real text for the check: lengths differ, so the batch is padded and the mask matters
CHECK_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "ONNX Runtime runs the exported graph; bertkit runs the PyTorch model.",
    "Short one.",
)
CHECK_PAIRS = ("Where does the fox jump?", "Who runs the graph?", "How long is it?")


@dataclass
class ExportReport:
    """What `export_onnx` wrote and how closely ONNX Runtime matched bertkit."""

    path: Path  # the .onnx file
    architecture: str
    outputs: tuple[str, ...]
    max_abs_diff: float  # over every output of the check batches

    def describe(self) -> str:
        return (f"wrote {self.path} ({self.architecture}: {', '.join(INPUTS)} -> {', '.join(self.outputs)}); "
                f"ONNX Runtime matches bertkit within {self.max_abs_diff:.1e} on real text")


class _Graph(nn.Module):
    """The model with the three named inputs and a tuple of named outputs, as the graph has them."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.outputs = outputs

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(getattr(out, name) for name in self.outputs)


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackage(f"ONNX export needs the {module} package: pip install 'bertkit[onnx]'") from None


def load_exportable(model_dir, encoder: bool = False) -> tuple:
    """(plain float32 model, its output names, its bertkit Tokenizer) from a model directory, or a BertkitError
    saying why it cannot be exported. encoder: the folder's encoder alone, whatever head it holds."""
    directory = encoder_folder(resolve(model_dir))  # an older sentence-transformers layout: its 0_Transformer
    if has_int8_weights(directory):
        raise BertkitError(f"{directory} holds an int8 bertkit model, which has no ONNX form here: export the "
                           "float model, then quantize the ONNX file (onnxruntime.quantization.quantize_dynamic)")
    arch = architecture(directory)
    if arch not in SIGNATURES and not encoder:
        # a pre-training run's heads (MLM, NSP, ELECTRA's discriminator) are for training, not serving: what it
        # is deployed as is its encoder; the error named no way to export that
        raise BertkitError(f"cannot export {arch} to ONNX: supported are {', '.join(SIGNATURES)} "
                           f"(the encoder and the fine-tuned heads); export its encoder with --encoder "
                           f"(bertkit export onnx {model_dir} -o OUT --encoder)")
    loaded = load(model_dir, head="encoder" if encoder else "saved", device="cpu", dtype="float32", fast=False)
    outputs = SIGNATURES[type(loaded.model).__name__]
    if getattr(loaded.model, "pooler", True) is None:  # an encoder saved without one (an MLM-only run's)
        outputs = ("last_hidden_state",)
    return loaded.model, outputs, loaded.tokenizer


def refuse_installed_default(out_dir) -> None:
    """BertkitError for an `out_dir` in the installed default model's folder (`bertkit export onnx default -o` it,
    or a folder inside it): an export beside a model of one's own is fine, but that folder is the package's
    (pip's record of it lists no model.onnx, and every command run without a model reads it), as the training
    commands refuse it as their output (`bertkit.data.outputs`)."""
    try:
        installed = resolve(None).resolve()  # None: the default model's folder
    except BertkitError:  # not installed: no such folder to keep
        return
    if Path(out_dir).resolve().is_relative_to(installed):
        raise BertkitError(f"--output {out_dir} is in the installed default model's folder ({installed}): the "
                           "export would write model.onnx into its package; write to another --output")


def check_exportable(model: nn.Module) -> None:
    """BertkitError for a model whose modules have no ONNX form (int8 layers, accelerated kernels)."""
    if holds_int8(model):
        raise BertkitError("an int8 model (bertkit.quantize) cannot be exported: export the float model, then "
                           "quantize the ONNX file (onnxruntime.quantization.quantize_dynamic)")
    fast = sorted({type(m).__name__ for m in model.modules() if type(m).__module__ == "bertkit.runtime.fast"})
    if fast:
        raise BertkitError(f"the model was accelerated ({', '.join(fast)}: oneDNN kernels, no ONNX operators): "
                           "export a freshly loaded model")


def _batch(tok, pairs: bool, max_length: int) -> dict[str, torch.Tensor]:
    enc = tok.encode_batch(list(CHECK_TEXTS), list(CHECK_PAIRS) if pairs else None, max_length=max_length)
    return {name: enc[name].long() for name in INPUTS}


def _export(graph: _Graph, example: dict, path: Path, opset: int) -> None:
    names = graph.outputs
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    for name in names:  # pooler_output and sequence logits are [batch, ...]; the rest [batch, sequence, ...]
        per_sequence = name == "pooler_output" or (name == "logits" and type(graph.model).__name__ in SEQUENCE_LOGITS)
        axes[name] = {0: "batch"} if per_sequence else {0: "batch", 1: "sequence"}
    args = tuple(example[name] for name in INPUTS)
    try:
        with warnings.catch_warnings():
            # the TorchScript exporter warns that it is legacy, and the tracer about the input
            # checks (Python ints read from tensors): both expected, see the module docstring
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, args, str(path), input_names=list(INPUTS), output_names=list(names),
                              dynamic_axes=axes, opset_version=opset, dynamo=False, do_constant_folding=True)
    except Exception as err:  # the exporter's own error types; the first line names the operator
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BertkitError(f"ONNX export failed at opset {opset}: {first}") from None


def _compare(session, model: nn.Module, example: dict, names: tuple[str, ...]) -> float:
    feed = {name: example[name].numpy() for name in INPUTS}
    got = session.run(list(names), feed)
    with torch.no_grad():
        out = model(example["input_ids"], attention_mask=example["attention_mask"],
                    token_type_ids=example["token_type_ids"])
    return max(float(np.abs(g - getattr(out, n).numpy()).max()) for g, n in zip(got, names))


def _copy_whole(source: Path, target: Path) -> None:
    """`source` copied to `target` whole or not at all (`write_through`): shutil.copyfile left a cut file."""
    write_through(target, partial(shutil.copyfile, source))


def _copy_beside(directory: Path, out: Path, tok, model: nn.Module | None = None) -> None:
    """The encoder's config and tokenizer files, and the sentence-transformers layout (its pooling, normalisation
    and max_seq_length; an older layout's encoder folder flattened into the top), copied beside model.onnx, each
    whole; vocab.txt with its tokenizer_config.json through `Tokenizer.save_pretrained` (`tok` the tokenizer read
    from them; the settings object kept as the model has it). model: the encoder exported from a folder with a head, described by a config.json of its own (not
    the head's architecture) and without the head's bertkit_task.json. An earlier export's files of these names that
    this model has none of are removed: they stayed, its bertkit_task.json beside an encoder (read as the classifier)
    or its tokenizer.json, which transformers reads before vocab.txt, beside another vocabulary."""
    encoder = encoder_folder(directory)
    pair = ("vocab.txt", "tokenizer_config.json") if (encoder / "vocab.txt").is_file() else ()
    copied = [name for name in SIDE_FILES if (encoder / name).is_file() and name not in pair and not (
        model is not None and name in ("config.json", "bertkit_task.json"))]
    modules, parts = layout_files(directory)
    written = {*copied, *pair, *parts, *(("config.json",) if model is not None else ()),
               *((MODULES_FILE,) if modules is not None else ())}
    for name in (*SIDE_FILES, MODULES_FILE, SENTENCE_CONFIG, ST_CONFIG):
        if name not in written:
            remove(out / name)  # with the files replaced, as one (`export_onnx`)
    for name in copied:
        _copy_whole(encoder / name, out / name)
    if pair:
        settings = encoder / "tokenizer_config.json"
        tok.save_pretrained(out, settings=json.loads(settings.read_text(encoding="utf-8")) if settings.is_file()
                            else None)
    if model is not None:
        save_config(model, out)
    for name, source in parts.items():
        if not source.is_dir():
            _copy_whole(source, out / name)
            continue
        (out / name).mkdir(parents=True, exist_ok=True)  # a Normalize module's folder is empty
        for file in sorted(f for f in source.rglob("*") if f.is_file()):
            _copy_whole(file, out / name / file.relative_to(source))
    if modules is not None:
        write_json(out / MODULES_FILE, modules)


def export_onnx(model_dir, out_dir, *, opset: int = DEFAULT_OPSET, atol: float = 1e-4,
                encoder: bool = False) -> ExportReport:
    """Export the model in `model_dir` (None: the default model) to `out_dir/model.onnx`, copy its
    config and tokenizer files beside it, and check ONNX Runtime against bertkit (see the module
    docstring). encoder: export the folder's encoder alone (a pre-training run's, a fine-tuned model's body).
    Returns the report; raises BertkitError on what cannot be exported or does not match."""
    _require("onnx")
    ort = _require("onnxruntime")
    if opset < MIN_OPSET:
        raise BertkitError(f"opset {opset} has no ONNX form for attention (scaled_dot_product_attention): "
                           f"use --opset {MIN_OPSET} or later (default {DEFAULT_OPSET})")
    directory = resolve(model_dir)
    refuse_installed_default(out_dir)
    need_transformer(directory, "export onnx")  # a table has no config.json: the reader said only that
    # config.json and the tokenizer are copied beside model.onnx: over another model's, they would describe
    # weights they do not fit (an earlier export there has no weights file: it is replaced as before)
    held = [name for name in (*WEIGHT_FILES, PICKLED_WEIGHTS, INT8_WEIGHTS) if (Path(out_dir) / name).is_file()]
    if held and Path(out_dir).resolve() != directory.resolve():
        raise BertkitError(f"{out_dir} holds another model ({', '.join(held)}): its config.json and tokenizer "
                           "would be replaced by this export's; write to a new or empty folder")
    model, names, tok = load_exportable(directory, encoder)
    check_exportable(model)
    out = Path(out_dir)
    path = out / "model.onnx"
    limit = model.config.max_position_embeddings
    # sentence pairs only where the model has a segment B (type_vocab_size 1: one segment)
    checks = (False, True) if model.config.type_vocab_size > 1 else (False,)
    diffs = []

    def export_and_check(tmp: Path) -> None:
        _export(_Graph(model, names).eval(), _batch(tok, pairs=False, max_length=limit), tmp, opset)
        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        diffs.append(max(_compare(session, model, _batch(tok, pairs, limit), names) for pairs in checks))
        if not diffs[0] <= atol:
            raise BertkitError(f"ONNX Runtime differs from bertkit by {diffs[0]:.2e} (> {atol:g}) on real text: the "
                               f"export is not faithful, and {path} was not written; report it with the model's "
                               "config.json")
        if directory.resolve() != out.resolve():
            _copy_beside(directory, out, tok, model if encoder and architecture(directory) != type(model).__name__ else None)

    # model.onnx appears only once ONNX Runtime matched it, its config and tokenizer beside it: it was written
    # first and left behind when the check failed (or the export was killed), a file that looked finished. All
    # of them replace an earlier export's together (`saving`): a stop between two left an earlier model.onnx
    # beside this one's config and tokenizer
    with saving(out):
        write_through(path, export_and_check)
    return ExportReport(path=path, architecture=type(model).__name__, outputs=names, max_abs_diff=diffs[0])
