"""ONNX export (bertkit.runtime.export, `bertkit export onnx`): each head type exports, loads
in ONNX Runtime with Hugging Face's input/output names and dynamic axes, and matches
bertkit within 1e-4 on inputs of other shapes than the trace's; what cannot be
exported fails with a BertkitError that names it."""

import json
import shutil
import sys

import numpy as np
import pytest
import torch

from bertkit import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification, BertModel)
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.runtime.export import INPUTS, check_exportable, export_onnx
from bertkit.runtime.fast import accelerate
from bertkit.runtime.quantization import quantize, save_quantized
from bertkit.text.tokenizer import Tokenizer
from conftest import need
from test_finetune import tiny  # noqa: F401

try:
    import onnxruntime as ort
except ImportError:  # the dev extra installs it: skipped locally, a failure in CI
    ort = None


@pytest.fixture(autouse=True)
def _onnx_installed():
    need(ort is not None, "onnxruntime (the onnx / dev extra) is not installed")

OUTPUTS = {
    BertModel: ("last_hidden_state", "pooler_output"),
    BertForSequenceClassification: ("logits",),
    BertForTokenClassification: ("logits",),
    BertForQuestionAnswering: ("start_logits", "end_logits"),
}


def head_dir(tiny, cls, path):  # noqa: F811
    """The tiny checkpoint as `cls` with a freshly drawn 3-label head, saved like a fine-tuned model."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the new head's weights are missing from the checkpoint, on purpose
        kw = {} if cls in (BertModel, BertForQuestionAnswering) else {"num_labels": 3}
        model = cls.from_pretrained(tiny, strict=False, generator=torch.Generator().manual_seed(1), **kw)
    model.save_pretrained(path, tokenizer=Tokenizer.from_pretrained(tiny))
    return path, model.eval()


def odd_batch(seed=0):
    """5 rows of 13 tokens (the trace used other shapes), two of them padded, both segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (5, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[4, 3:] = 0
    types = torch.zeros_like(ids)
    types[:, 7:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@pytest.mark.parametrize("cls", list(OUTPUTS))
def test_each_head_exports_loads_in_onnx_runtime_and_matches(cls, tiny, tmp_path):  # noqa: F811
    src, model = head_dir(tiny, cls, tmp_path / "model")
    report = export_onnx(src, tmp_path / "onnx")
    assert report.outputs == OUTPUTS[cls] and report.max_abs_diff <= 1e-4
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        assert (tmp_path / "onnx" / name).is_file()

    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(INPUTS)
    assert [o.name for o in session.get_outputs()] == list(OUTPUTS[cls])
    assert all(i.shape == ["batch", "sequence"] for i in session.get_inputs())  # dynamic axes
    for seed in (0, 1):
        batch = odd_batch(seed)
        got = session.run(None, {k: v.numpy() for k, v in batch.items()})
        with torch.no_grad():
            out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"])
        for name, value in zip(OUTPUTS[cls], got):
            expected = getattr(out, name).numpy()
            assert value.shape == expected.shape
            np.testing.assert_allclose(value, expected, rtol=0, atol=1e-4)


def test_a_model_with_one_segment_exports(tiny, tmp_path):  # noqa: F811
    """type_vocab_size 1 (RoBERTa-style checkpoints in BERT's layout): the check's sentence pairs, segment B, made
    ONNX Runtime fail with a traceback (a Gather out of bounds) after the file was written. One segment: no pairs."""
    config = BertModel.from_pretrained(tiny).config.replace(type_vocab_size=1)
    model = BertForSequenceClassification(config, generator=torch.Generator().manual_seed(2)).eval()
    model.save_pretrained(tmp_path / "model", tokenizer=Tokenizer.from_pretrained(tiny))
    report = export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert report.max_abs_diff <= 1e-4
    batch = odd_batch()
    batch["token_type_ids"].zero_()
    got = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"]).run(
        None, {k: v.numpy() for k, v in batch.items()})[0]
    with torch.no_grad():
        expected = model(**batch).logits.numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["ElectraModel", "ElectraForSequenceClassification", "ElectraForTokenClassification",
                                  "ElectraForQuestionAnswering"])
def test_electra_models_export(name, tiny, tmp_path):  # noqa: F811
    """An ELECTRA discriminator and its fine-tuned heads (what `finetune TASK --model ELECTRA_RUN` writes) were
    refused ("cannot export ElectraModel"): they export as their BERT forms do, under the same output names."""
    from bertkit.model import electra

    cls, tok = getattr(electra, name), Tokenizer.from_pretrained(tiny)
    config = electra.ElectraConfig(vocab_size=len(tok), embedding_size=12, hidden_size=24, num_hidden_layers=2,
                                   num_attention_heads=3, intermediate_size=37, max_position_embeddings=64,
                                   num_labels=2 if "Question" in name else 3)
    model = cls(config, generator=torch.Generator().manual_seed(3)).eval()
    model.save_pretrained(tmp_path / "model", tokenizer=tok)
    report = export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert report.architecture == name and report.max_abs_diff <= 1e-4
    batch = odd_batch()
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in batch.items()})
    with torch.no_grad():
        out = model(**batch)
    for output, value in zip(report.outputs, got):
        np.testing.assert_allclose(value, getattr(out, output).numpy(), rtol=0, atol=1e-4)


def test_a_head_without_onnx_signature_fails_naming_it(tiny, tmp_path):  # noqa: F811
    src, _ = head_dir(tiny, BertForMaskedLM, tmp_path / "mlm")
    with pytest.raises(BertkitError, match="cannot export BertForMaskedLM"):
        export_onnx(src, tmp_path / "onnx")


@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForMaskedLM", "ElectraForPreTraining"])
def test_a_pre_training_run_is_refused_naming_encoder_and_its_encoder_exports_with_it(name, tiny, tmp_path,
                                                                                       capsys):  # noqa: F811
    """`bertkit export onnx RUN` of a pre-training run (MLM+NSP, MLM alone, an ELECTRA discriminator) said only
    "cannot export BertForPreTraining", with no way to deploy what such a run is for: its encoder. --encoder
    exports the encoder of any model folder (a fine-tuned model's body too), and the error
    names it; the graph matches the checkpoint's own encoder (`model.bert`, `model.electra`) within 1e-4."""
    from bertkit.model import electra, heads

    if name.startswith("Electra"):
        config = electra.ElectraConfig(vocab_size=len(Tokenizer.from_pretrained(tiny)), embedding_size=12, hidden_size=24, num_hidden_layers=2,
                                       num_attention_heads=3, intermediate_size=37, max_position_embeddings=64)
        model = electra.ElectraForPreTraining(config, generator=torch.Generator().manual_seed(3)).eval()
        model.save_pretrained(tmp_path / "run", tokenizer=Tokenizer.from_pretrained(tiny))
        src = tmp_path / "run"
    else:
        src, model = head_dir(tiny, getattr(heads, name), tmp_path / "run")
    with pytest.raises(BertkitError, match=f"cannot export {name} .*--encoder"):
        export_onnx(src, tmp_path / "onnx")
    assert main(["export", "onnx", str(src), "-o", str(tmp_path / "onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--encoder" in err and not (tmp_path / "onnx" / "model.onnx").exists()
    assert main(["export", "onnx", str(src), "-o", str(tmp_path / "onnx"), "--encoder"]) == 0
    encoder = model.base_model
    names = ("last_hidden_state",) + (("pooler_output",) if encoder.pooler is not None else ())
    assert f"{type(encoder).__name__}: input_ids" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert tuple(o.name for o in session.get_outputs()) == names
    batch = odd_batch()
    got = session.run(None, {k: v.numpy() for k, v in batch.items()})
    with torch.no_grad():
        out = encoder(**batch)
    for output, value in zip(names, got):
        np.testing.assert_allclose(value, getattr(out, output).numpy(), rtol=0, atol=1e-4)
    # the folder describes what model.onnx is: an encoder, not the run's head
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["architectures"] == [type(encoder).__name__]


def test_an_int8_model_fails_naming_the_way_to_int8_onnx(tiny, tmp_path):  # noqa: F811
    save_quantized(quantize(BertModel.from_pretrained(tiny)), tmp_path / "int8", Tokenizer.from_pretrained(tiny))
    with pytest.raises(BertkitError, match="int8.*quantize_dynamic"):
        export_onnx(tmp_path / "int8", tmp_path / "onnx")
    with pytest.raises(BertkitError, match="int8"):
        check_exportable(quantize(BertModel.from_pretrained(tiny)))
    with pytest.raises(BertkitError, match="accelerated"):
        check_exportable(accelerate(BertModel.from_pretrained(tiny)))


def test_an_opset_without_attention_fails_naming_the_operator(tiny, tmp_path):  # noqa: F811
    with pytest.raises(BertkitError, match="opset 13.*scaled_dot_product_attention"):
        export_onnx(tiny, tmp_path / "onnx", opset=13)


def test_missing_onnx_packages_name_the_extra(tiny, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "onnx", None)  # None in sys.modules: importing it raises ImportError
    with pytest.raises(BertkitError, match=r"bertkit\[onnx\]"):
        export_onnx(tiny, tmp_path / "onnx")


def test_cli_export_onnx(tiny, tmp_path, capsys):  # noqa: F811
    assert main(["export", "onnx", str(tiny), "-o", str(tmp_path / "onnx")]) == 0
    assert "ONNX Runtime matches bertkit" in capsys.readouterr().out
    assert (tmp_path / "onnx" / "model.onnx").is_file()
    assert main(["export", "onnx", str(tiny), "-o", str(tmp_path / "x"), "--opset", "11"]) == 2
    assert "opset 11" in capsys.readouterr().err


def test_export_into_another_models_folder_is_refused_first(tiny, tmp_path, capsys):  # noqa: F811
    # its config.json and tokenizer files were replaced by the exported model's, beside weights they do not fit
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    assert main(["export", "onnx", str(tiny), "-o", str(other)]) == 2
    err = capsys.readouterr().err
    assert err == f"bertkit: error: {other} holds another model (model.safetensors): its config.json and " \
                  "tokenizer would be replaced by this export's; write to a new or empty folder\n"
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert main(["export", "onnx", str(tiny), "-o", str(tmp_path / "onnx")]) == 0  # an earlier export: replaced
    assert main(["export", "onnx", str(tiny), "-o", str(tmp_path / "onnx")]) == 0


def test_an_export_that_fails_its_check_leaves_no_model_onnx(tiny, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The check runs after the export: model.onnx, config.json and the tokenizer were written first and stayed
    when ONNX Runtime disagreed, a folder that looked finished (the error was the only sign). Here the check is
    made to find a difference; nothing may be left, and an earlier good export there stays byte for byte."""
    from bertkit.runtime import export

    good = tmp_path / "good"
    assert main(["export", "onnx", str(tiny), "-o", str(good)]) == 0
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    monkeypatch.setattr(export, "_compare", lambda *args: 0.5)  # an unfaithful graph
    for out in (tmp_path / "new", good):
        assert main(["export", "onnx", str(tiny), "-o", str(out)]) == 2
        assert "differs from bertkit by 5.00e-01" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() or list((tmp_path / "new").iterdir()) == []  # was: model.onnx, config...
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before


def pooled(session, tok, texts, layout):
    """The exported graph's sentence vectors, pooled as `layout` (read from the exported folder) says."""
    enc = tok.encode_batch(texts, max_length=layout.max_seq_length, return_tensors="np")
    hidden = session.run(["last_hidden_state"], {name: enc[name].astype(np.int64) for name in INPUTS})[0]
    mask = enc["attention_mask"][..., None].astype(np.float32)
    vectors = {"cls": hidden[:, 0], "mean": (hidden * mask).sum(1) / mask.sum(1),
               "max": np.where(mask > 0, hidden, -np.inf).max(1)}[layout.pooling]
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True) if layout.normalize else vectors


@pytest.mark.parametrize("pooling,normalize,old", [("cls", True, False), ("max", False, False), ("mean", True, True)])
def test_an_exported_sentence_model_carries_its_pooling(st, tiny, tmp_path, pooling, normalize, old):  # noqa: F811
    """The sentence-transformers files travel with model.onnx (an older layout's encoder folder flattened into
    the top): the exported folder reads as the same layout, and its graph pooled that way gives the source's
    vectors, which sentence-transformers computes from the source folder."""
    from sentence_transformers import SentenceTransformer

    import bertkit
    from bertkit.model.sentence_layout import read_layout, write_layout

    source = tmp_path / "source"
    shutil.copytree(tiny, source / "0_Transformer" if old else source)
    write_layout(source, pooling=pooling, normalize=normalize, max_seq_length=9, hidden_size=32)
    if old:  # the encoder's files, sentence_bert_config.json with them, in 0_Transformer
        (source / "sentence_bert_config.json").rename(source / "0_Transformer" / "sentence_bert_config.json")
        modules = (source / "modules.json").read_text().replace('"path": ""', '"path": "0_Transformer"')
        (source / "modules.json").write_text(modules)
    texts = ["the movie was good", "who went to the city and what did they see there ?", "short"]
    expected = SentenceTransformer(str(source), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(bertkit.embed(texts, model=source), expected, rtol=0, atol=1e-5)

    export_onnx(source, tmp_path / "onnx")
    out = tmp_path / "onnx"
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                 "1_Pooling/config.json", "vocab.txt", "config.json"):
        assert (out / name).is_file(), name
    assert (out / "2_Normalize").is_dir() == normalize
    assert read_layout(out) == read_layout(source)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = pooled(session, Tokenizer.from_pretrained(out), texts, read_layout(out))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_an_export_into_the_installed_default_models_folder_is_refused(tiny, tmp_path):  # noqa: F811
    """`bertkit export onnx default -o <the installed default model's folder>` wrote model.onnx into the package
    (its own folder is a model's own, so the check that refuses another model's folder let it through), and a
    folder inside it took a whole export. Both are refused in one line, the folder left byte for byte. A real
    process whose default model is a stand-in: a package of the default's name, first on its path, whose model/
    is a copy of the tiny model (the installed one is never touched)."""
    import hashlib
    import os
    import subprocess
    from pathlib import Path

    from bertkit.default_model import DEFAULT_MODEL_PACKAGE

    package = tmp_path / "site" / DEFAULT_MODEL_PACKAGE
    default = shutil.copytree(tiny, package / "model")
    (package / "__init__.py").write_text("")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(root)])}

    def files():
        return {p.relative_to(package).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(package.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}

    before = files()
    for out in (default, default / "onnx"):
        done = subprocess.run([sys.executable, "-m", "bertkit.cli", "export", "onnx", "default", "-o", str(out)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "installed default model's folder" in done.stderr and str(out) in done.stderr, done.stderr
        assert files() == before and not (default / "onnx").exists()


def test_an_export_over_an_earlier_one_keeps_none_of_the_files_this_model_lacks(tiny, tmp_path):  # noqa: F811
    """export onnx into the folder of an earlier export replaced the files it copied and left the others: a
    classifier's export followed by an encoder's kept the classifier's bertkit_task.json (the folder then described
    a BertModel with task classify) and its tokenizer.json (which transformers reads before vocab.txt) and
    sentence-transformers layout. Those an export does not write are removed; reference: the second model's folder,
    described by the same readers."""
    from bertkit.model.checkpoint import describe, save_task_info
    from bertkit.model.sentence_layout import layout_files, read_layout, write_layout
    from bertkit.runtime.export import _copy_beside

    first, second, out = tmp_path / "clf", tmp_path / "encoder", tmp_path / "deploy"
    shutil.copytree(tiny, first)
    shutil.copytree(tiny, second)
    save_task_info(first, {"task": "classify", "max_length": 16, "text_column": "sentence"})
    (first / "tokenizer.json").write_text("{}")
    write_layout(first, pooling="cls", normalize=True, max_seq_length=12, hidden_size=32)
    tok = Tokenizer.from_pretrained(tiny)
    _copy_beside(first, out, tok)  # what export_onnx copies beside model.onnx (no graph needed to test it)
    assert describe(out).task is not None and (out / "tokenizer.json").is_file() and read_layout(out) is not None
    _copy_beside(second, out, tok)
    assert describe(out).task == describe(second).task is None
    assert read_layout(out) == read_layout(second) is None and layout_files(out) == (None, {})
    assert not (out / "tokenizer.json").exists()
    assert (out / "vocab.txt").read_text() == (second / "vocab.txt").read_text()
