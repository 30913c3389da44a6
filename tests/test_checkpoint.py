"""Checkpoints: what we save loads in transformers unchanged; what transformers (and older
BERT ports) saved loads here; broken or mismatched checkpoints are clear errors."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertkit
from bertkit import BertConfig, BertkitError, BertModel
from bertkit.model.checkpoint import TABLE, hf_keys, read_weights
from bertkit.model.heads import HEADS
from bertkit.text.tokenizer import Tokenizer

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=40, type_vocab_size=2)


def tiny(cls=BertModel, seed=0, **overrides):
    return cls(BertConfig(**{**TINY, **overrides}), generator=torch.Generator().manual_seed(seed)).eval()


def inputs(shape=(2, 9)):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 6:] = 0
    mask[0, ..., :] = 1
    return ids * mask, mask


@pytest.mark.oracle
@pytest.mark.parametrize("cls", (BertModel, *HEADS), ids=lambda c: c.__name__)
def test_transformers_loads_what_we_save(tmp_path, transformers_mod, cls):
    ours = tiny(cls, num_labels=2 if cls.__name__ == "BertForQuestionAnswering" else 3)
    ours.save_pretrained(tmp_path)
    hf, info = getattr(transformers_mod, cls.__name__).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    shape = (1, 2, 9) if cls.__name__ == "BertForMultipleChoice" else (2, 9)
    ids, mask = inputs(shape)
    with torch.no_grad():
        a, b = ours(ids, mask), hf.eval()(input_ids=ids, attention_mask=mask)
    for name in ("last_hidden_state", "pooler_output", "logits", "prediction_logits",
                 "seq_relationship_logits", "start_logits", "end_logits"):
        if getattr(a, name, None) is not None:
            torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-5, rtol=0, msg=name)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [cls.__name__] and config["model_type"] == "bert"


@pytest.mark.oracle
def test_saved_default_model_matches_in_transformers(tmp_path, transformers_mod):
    loaded = bertkit.load(head="encoder")
    model, tok = loaded.model, loaded.tokenizer
    assert isinstance(model, BertModel) and isinstance(tok, Tokenizer)
    model.save_pretrained(tmp_path, tokenizer=tok)
    assert (tmp_path / "vocab.txt").read_text() == (bertkit.default_model.default_model_dir() / "vocab.txt").read_text()
    hf = transformers_mod.BertModel.from_pretrained(str(tmp_path)).eval()
    hf_tok = transformers_mod.BertTokenizerFast.from_pretrained(str(tmp_path))
    enc = hf_tok(["A checkpoint we wrote.", "Loaded by the oracle, with its own tokenizer files."],
                 padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = hf(**enc)
        ours = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    real = enc["attention_mask"].bool()  # padding outputs differ by summation order (test_model)
    torch.testing.assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)


@pytest.mark.oracle
def test_the_saved_tokenizer_cuts_where_the_model_s_positions_end(tmp_path, transformers_mod):
    # tokenizer_config.json said model_max_length 512 for a model of 40 positions (a small pre-training
    # run): transformers' tokenizer then cut a long text at 512 and the model it came with failed on it
    tok = Tokenizer([*"[PAD] [UNK] [CLS] [SEP] [MASK]".split(), *"abcdefghij"])
    tiny(bertkit.BertForMaskedLM, vocab_size=len(tok)).save_pretrained(tmp_path, tokenizer=tok)
    hf_tok = transformers_mod.AutoTokenizer.from_pretrained(str(tmp_path))
    enc = hf_tok(" ".join("abcdefghij" * 10), truncation=True, return_tensors="pt")
    assert hf_tok.model_max_length == 40 and enc["input_ids"].shape == (1, 40)
    with torch.no_grad():
        transformers_mod.BertForMaskedLM.from_pretrained(str(tmp_path)).eval()(**enc)
    assert Tokenizer.from_pretrained(tmp_path).encode(" ".join("abc" * 30), max_length=512).input_ids[:3] == [2, 5, 6]


def test_our_round_trip_is_exact(tmp_path):
    model = tiny(bertkit.BertForPreTraining)
    model.save_pretrained(tmp_path)
    again = bertkit.BertForPreTraining.from_pretrained(tmp_path)
    for (n, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), n
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "bert.encoder.layer.1.attention.self.query.weight" in keys  # HF names, encoder under bert.
    assert "cls.predictions.bias" in keys and "cls.predictions.decoder.weight" not in keys  # tied: not stored


def test_a_save_cut_short_leaves_the_model_that_was_there(tmp_path, monkeypatch):
    """Fine-tuning saves each better epoch's model over the last one's; a Ctrl-C or a kill in that write
    left a truncated model.safetensors: the best epoch so far was lost with the run. The weights now go
    to a temporary file renamed over the old one, so the folder holds one whole model or the other."""
    import bertkit.model.checkpoint as checkpoint

    first, second = tiny(seed=0), tiny(seed=1)
    first.save_pretrained(tmp_path)

    def cut_short(tensors, filename, metadata=None):  # half the bytes, then Ctrl-C
        save_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", cut_short)
    with pytest.raises(KeyboardInterrupt):
        second.save_pretrained(tmp_path)
    again = BertModel.from_pretrained(tmp_path)
    assert all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), again.state_dict().values()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # nothing left over
    monkeypatch.undo()
    second.save_pretrained(tmp_path)
    again = BertModel.from_pretrained(tmp_path)
    assert all(torch.equal(p, q) for p, q in zip(second.state_dict().values(), again.state_dict().values()))


def test_the_table_covers_every_parameter_once():
    for cls in (BertModel, *HEADS):
        names = [n[len("bert."):] if n.startswith("bert.") else n for n, _ in tiny(cls).named_parameters()]
        hf = [k for n in names for k in hf_keys(n)]
        assert len(hf) == len(set(hf)), cls.__name__
    assert hf_keys("encoder.layers.7.attention.qkv.bias") == tuple(
        f"encoder.layer.7.attention.self.{x}.bias" for x in ("query", "key", "value"))
    assert len(TABLE) == len({ours for ours, _ in TABLE})


# --- loading heads from the default (encoder-only) checkpoint --------------------------------


def test_strict_load_of_a_missing_head_lists_it(default_model_dir):
    with pytest.raises(BertkitError) as err:
        bertkit.BertForPreTraining.from_pretrained()
    message = str(err.value)
    for key in ("cls.predictions.transform.dense.weight", "cls.predictions.bias", "cls.seq_relationship.weight"):
        assert key in message
    assert "strict=False" in message


def test_non_strict_load_reports_and_initialises_the_head():
    with pytest.warns(UserWarning, match="missing"):
        model = bertkit.BertForSequenceClassification.from_pretrained(
            None, strict=False, num_labels=5, generator=torch.Generator().manual_seed(0))
    report = model.load_report
    assert report.missing == ["classifier.weight", "classifier.bias"] and not report.unexpected
    assert model.classifier.weight.shape == (5, 384) and abs(model.classifier.weight.std().item() - 0.02) < 0.003
    encoder = BertModel.from_pretrained()
    assert torch.equal(model.bert.encoder.layers[3].intermediate.weight, encoder.encoder.layers[3].intermediate.weight)
    # token classification has no pooler: the default model's pooler is reported unused, not an error
    with pytest.warns(UserWarning, match="unused"):
        tagger = bertkit.BertForTokenClassification.from_pretrained(None, strict=False, num_labels=9)
    assert sorted(tagger.load_report.unused) == ["pooler.dense.bias", "pooler.dense.weight"]


def test_bare_encoder_loads_from_a_head_checkpoint(tmp_path):
    head = tiny(bertkit.BertForQuestionAnswering)
    head.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="missing"):
        encoder = BertModel.from_pretrained(tmp_path, strict=False)
    assert sorted(encoder.load_report.unused) == ["qa_outputs.bias", "qa_outputs.weight"]
    assert encoder.load_report.missing == ["pooler.dense.weight", "pooler.dense.bias"]
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(encoder(ids, mask).last_hidden_state, head.bert(ids, mask).last_hidden_state)


# --- other formats -------------------------------------------------------------------------------


def _hf_state(model):
    from bertkit.model.checkpoint import hf_state_dict

    return hf_state_dict(model)


def test_tf_style_names(tmp_path):
    model = tiny(bertkit.BertForMaskedLM)
    BertConfig(**TINY).to_json_file(tmp_path / "config.json")
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in _hf_state(model).items()}
    state["cls.predictions.decoder.bias"] = state.pop("cls.predictions.bias")  # older checkpoints
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = bertkit.BertForMaskedLM.from_pretrained(tmp_path)
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask).logits, model(ids, mask).logits, atol=0, rtol=0)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def _never_unpickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was opened")
    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, refuse)


def test_a_pytorch_model_bin_folder_is_refused_without_unpickling(tmp_path, monkeypatch):
    """Nothing we read can run code: even torch.load(weights_only=True) runs an unpickler (a restricted one,
    with its own CVE history). A folder holding only the pickle is refused naming the conversion."""
    model = tiny(bertkit.BertForMaskedLM)
    model.config.to_json_file(tmp_path / "config.json")
    torch.save(_hf_state(model), tmp_path / "pytorch_model.bin")
    _never_unpickle(monkeypatch)
    for load in (lambda: bertkit.BertForMaskedLM.from_pretrained(tmp_path), lambda: bertkit.load(tmp_path),
                 lambda: read_weights(tmp_path / "pytorch_model.bin")):
        with pytest.raises(BertkitError, match="pytorch_model.bin is a pickle.*model.safetensors"):
            load()
    model.save_pretrained(tmp_path)  # beside model.safetensors it is never opened
    assert bertkit.BertForMaskedLM.from_pretrained(tmp_path).load_report.problems is False


def test_pickles_are_never_loaded_unsafely(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    BertConfig(**TINY).to_json_file(tmp_path / "config.json")
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"embeddings.word_embeddings.weight": _Exploit()}, f, protocol=2)
    with pytest.raises(BertkitError, match="is a pickle"):
        BertModel.from_pretrained(tmp_path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.oracle
def test_sharded_checkpoint(tmp_path, transformers_mod):
    torch.manual_seed(0)
    hf = transformers_mod.BertModel(transformers_mod.BertConfig(**TINY)).eval()
    hf.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = BertModel.from_pretrained(tmp_path)
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask).last_hidden_state,
                                   hf(input_ids=ids, attention_mask=mask).last_hidden_state, atol=1e-5, rtol=0)


# --- broken checkpoints ---------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    tiny().save_pretrained(tmp_path)
    return tmp_path


def test_truncated_safetensors(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BertkitError, match="truncated or corrupt"):
        BertModel.from_pretrained(saved)


def test_corrupt_safetensors_header(saved):
    path = saved / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json at!"
    path.write_bytes(bytes(data))
    with pytest.raises(BertkitError, match="truncated or corrupt"):
        BertModel.from_pretrained(saved)


@pytest.mark.parametrize("change, words", [
    # said from the safetensors header, before the model is built (bertkit.model.weights_check)
    (dict(hidden_size=64), "says hidden_size=64 but"),
    (dict(vocab_size=120), "says vocab_size=120 but"),
    (dict(intermediate_size=40), "says intermediate_size=40 but"),
    (dict(num_hidden_layers=3), "says num_hidden_layers=3 but"),
    (dict(num_hidden_layers=1), "holds 2 layers"),
])
def test_config_that_contradicts_the_weights(saved, change, words):
    config = json.loads((saved / "config.json").read_text())
    config.update(change)
    (saved / "config.json").write_text(json.dumps(config))
    for strict in (True, False):  # no setting makes a contradiction load
        with pytest.raises(BertkitError) as err:
            BertModel.from_pretrained(saved, strict=strict)
        assert words in str(err.value)


def test_unexpected_and_missing_keys(saved):
    state = load_file(str(saved / "model.safetensors"))
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(3)
    del state["pooler.dense.bias"]
    save_file(state, str(saved / "model.safetensors"))
    with pytest.raises(BertkitError) as err:
        BertModel.from_pretrained(saved)
    assert "missing (1): pooler.dense.bias" in str(err.value)
    assert "unexpected (1): encoder.layer.0.attention.self.rotary.weight" in str(err.value)
    with pytest.warns(UserWarning):
        model = BertModel.from_pretrained(saved, strict=False)
    assert model.load_report.unexpected == ["encoder.layer.0.attention.self.rotary.weight"]


def test_missing_files(tmp_path):
    with pytest.raises(BertkitError, match="no model directory"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    tiny().config.to_json_file(tmp_path / "config.json")
    with pytest.raises(BertkitError, match="no weights in") as err:
        BertModel.from_pretrained(tmp_path)
    assert "ONNX" not in str(err.value)
    (tmp_path / "model.onnx").write_bytes(b"")  # an ONNX export's folder: what it holds is said, and where to go
    with pytest.raises(BertkitError, match="model.onnx is an ONNX export, run by ONNX Runtime: give the model folder"):
        BertModel.from_pretrained(tmp_path)
    with pytest.raises(BertkitError, match="no checkpoint at"):
        read_weights(tmp_path / "model.safetensors")


def test_an_empty_model_path_is_not_the_current_directory(tmp_path, monkeypatch):
    """Path("") is ".": an unset variable once loaded (or failed on) whatever the current directory held. One
    check (`bertkit.model.checkpoint.resolve`) says so for every loader, also where the current directory
    holds a static model (the loader asked `is_static("")` first and loaded it) or is embedded from already."""
    from bertkit.model.static import StaticEmbedding, save_static
    from bertkit.text.tokenizer_json import write_tokenizer_json

    for where in ("empty", "static"):
        folder = tmp_path / where
        folder.mkdir()
        if where == "static":
            tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
            write_tokenizer_json(tok, save_static(StaticEmbedding(torch.ones(len(tok), 4), normalize=True), folder))
        monkeypatch.chdir(folder)
        if where == "static":
            bertkit.embed("a", model=".")  # the current directory, named: kept for the next call
        for call in (lambda: bertkit.load(""), lambda: bertkit.embed("a", model=""),
                     lambda: BertModel.from_pretrained("  ")):
            with pytest.raises(BertkitError, match="model is an empty string"):
                call()


@pytest.mark.parametrize("field, value", [("max_length", "128"), ("stride", -1), ("max_length", 1.5)])
def test_task_file_numbers_of_the_wrong_type_are_named(tmp_path, field, value):
    """A hand-edited bertkit_task.json: once a TypeError inside the encoder (stride "x"), or a
    max_length the tokenizer refused without naming the file."""
    tiny(bertkit.BertForSequenceClassification).save_pretrained(tmp_path)
    (tmp_path / "bertkit_task.json").write_text(json.dumps({"task": "classify", "max_length": 32, field: value}))
    with pytest.raises(BertkitError, match=f"bertkit_task.json: {field} must be a whole number, got {json.dumps(value)}"):
        bertkit.load(tmp_path)


def test_cli_model_info(capsys, tmp_path):
    from bertkit.cli import main

    assert main(["model", "info", "--class", "BertForPreTraining", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["hidden_size"] == 384 and "cls.seq_relationship.weight" in info["missing"]
    assert main(["model", "info"]) == 0
    assert "parameters: 22,713,216" in capsys.readouterr().out  # all-MiniLM-L6-v2: 22.7M, as published
    assert main(["model", "info", str(tmp_path / "nowhere")]) == 2
    assert "no model directory" in capsys.readouterr().err


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_cli_model_info_reports_the_class_the_folder_was_saved_as(capsys, tmp_path, transformers_mod, kind):
    """Without --class every folder was loaded as BertModel: an MLM checkpoint showed its head as "unused" and
    the pooler it never had as "missing", a classifier its classifier as "unused", and both counted parameters
    without their head. The class config.json names is the default now; parameters as transformers counts them."""
    from bertkit.cli import main

    hf = getattr(transformers_mod, kind)(transformers_mod.BertConfig(**TINY, num_labels=3))
    hf.save_pretrained(tmp_path)
    assert main(["model", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{kind}: 2 layers, hidden 32" in out and "all weights matched" in out, out
    assert f"parameters: {hf.num_parameters():,}" in out


def test_cli_model_info_reads_what_pretrain_and_distill_write(capsys, tmp_path):
    # an ELECTRA run's folder was "this config is for model_type 'electra', not 'bert'", a static one
    # "no config file at .../config.json": both are bertkit's own outputs
    from bertkit.cli import main
    from bertkit.model.electra import ElectraConfig, ElectraForPreTraining
    from bertkit.model.static import StaticEmbedding, save_static
    from bertkit.text.tokenizer_json import write_tokenizer_json

    electra = ElectraForPreTraining(ElectraConfig(**{**TINY, "embedding_size": 16}), generator=torch.Generator())
    electra.save_pretrained(tmp_path / "electra")
    assert main(["model", "info", str(tmp_path / "electra")]) == 0
    out = capsys.readouterr().out
    # the class it was saved as (its discriminator head included), not ElectraModel with the head "unused"
    assert "ElectraForPreTraining: 2 layers, hidden 32, embedding 16, 4 heads" in out and f"parameters: {electra.num_parameters():,}" in out
    assert "all weights matched" in out
    tok = Tokenizer.from_pretrained()
    write_tokenizer_json(tok, save_static(StaticEmbedding(torch.randn(len(tok), 12), normalize=True), tmp_path / "st"))
    assert main(["model", "info", str(tmp_path / "st")]) == 0
    out = capsys.readouterr().out
    assert f"static embedding model: {len(tok):,} rows x 12" in out and f"parameters: {len(tok) * 12:,}" in out


@pytest.mark.oracle
def test_cli_model_info_loads_an_electra_folder_into_the_class_it_holds(capsys, tmp_path, transformers_mod):
    """An ELECTRA run's discriminator could be reported only as ElectraModel (4 weights unused) or a fresh head:
    --class refused the ELECTRA names that the error for BertForPreTraining listed, and the summary line left out
    embedding_size, where ELECTRA differs from BERT (parameters follow it)."""
    from bertkit.cli import main
    from bertkit.model.electra import ElectraConfig, ElectraForPreTraining

    ElectraForPreTraining(ElectraConfig(**{**TINY, "embedding_size": 16}), generator=torch.Generator()).save_pretrained(tmp_path)
    hf = transformers_mod.ElectraForPreTraining.from_pretrained(str(tmp_path))
    for cls in ("ElectraForPreTraining", "BertForPreTraining"):  # BERT's pre-training class: ELECTRA's form of it
        assert main(["model", "info", str(tmp_path), "--class", cls]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "ElectraForPreTraining: 2 layers, hidden 32, embedding 16, 4 heads" in out, out
        assert f"parameters: {hf.num_parameters():,}" in out and "all weights matched" in out
    assert main(["model", "info", str(tmp_path), "--class", "ElectraForSequenceClassification", "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["missing"])[0] == "classifier.dense.bias"


def test_head_of_another_size_is_replaced_only_when_not_strict(tmp_path):
    tiny(bertkit.BertForSequenceClassification, num_labels=3).save_pretrained(tmp_path)
    with pytest.raises(BertkitError, match=r"mismatched \(2\): classifier.weight: checkpoint shape \(3, 32\)"):
        bertkit.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    with pytest.warns(UserWarning, match="mismatched"):
        model = bertkit.BertForSequenceClassification.from_pretrained(tmp_path, strict=False, num_labels=5)
    assert model.classifier.weight.shape == (5, 32) and model.config.num_labels == 5
    assert model.config.labels == [f"LABEL_{i}" for i in range(5)]  # the old 3 names no longer apply


def test_imports_flow_one_way_from_modeling_to_checkpoint():
    """checkpoint never imports the model classes, at import time or inside a function:
    no cycle modeling <-> checkpoint, not even a lazy one."""
    import ast
    import subprocess
    import sys

    import bertkit.model.checkpoint

    tree = ast.parse(open(bertkit.model.checkpoint.__file__, encoding="utf-8").read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"bertkit.model.modeling", "bertkit.model.heads", "bertkit.embeddings.features"}, imported
    code = "import sys, bertkit.model.checkpoint; print('bertkit.model.modeling' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_describe_reads_what_a_directory_holds(tmp_path, default_model_dir):
    from bertkit.model.checkpoint import describe

    saved = describe(None)  # the default model: a bare sentence-transformers encoder
    assert (saved.directory, saved.model_type, saved.task, saved.int8_weights) == (default_model_dir, "bert", None, False)
    head = bertkit.BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                            intermediate_size=37, num_labels=3))
    head.save_pretrained(tmp_path / "cls")
    saved = describe(tmp_path / "cls")
    assert (saved.architecture, saved.task["task"]) == ("BertForSequenceClassification", "classify")
    with pytest.raises(BertkitError, match="no model directory at"):
        describe(tmp_path / "absent")
    with pytest.raises(BertkitError, match="model must be None .* or a model directory, got int"):
        describe(3)


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["BertForMaskedLM", "BertForPreTraining"])
def test_an_untied_decoder_loads_and_saves_both_ways(tmp_path, transformers_mod, name):
    """tie_word_embeddings false: the MLM decoder is a matrix of its own (cls.predictions.decoder.weight), not the
    word embeddings. It was read as tied, silently: the logits differed from transformers' by ~2."""
    torch.manual_seed(0)
    hf = getattr(transformers_mod, name)(transformers_mod.BertConfig(**TINY, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(str(tmp_path / "hf"))
    ours = getattr(bertkit, name).from_pretrained(tmp_path / "hf")  # strict: every key has its place
    ids, mask = inputs()
    key = "logits" if name == "BertForMaskedLM" else "prediction_logits"
    with torch.no_grad():
        torch.testing.assert_close(getattr(ours(ids, mask), key), getattr(hf(input_ids=ids, attention_mask=mask), key),
                                   atol=1e-5, rtol=0)
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["tie_word_embeddings"] is False
    back = getattr(transformers_mod, name).from_pretrained(str(tmp_path / "ours")).eval()
    with torch.no_grad():
        torch.testing.assert_close(getattr(back(input_ids=ids, attention_mask=mask), key),
                                   getattr(hf(input_ids=ids, attention_mask=mask), key), atol=1e-5, rtol=0)
    tied = tiny(bertkit.BertForMaskedLM)  # a tied model stays as transformers writes one: no key, no decoder
    tied.save_pretrained(tmp_path / "tied")
    assert "tie_word_embeddings" not in json.loads((tmp_path / "tied" / "config.json").read_text())
    assert "cls.predictions.decoder.weight" not in load_file(str(tmp_path / "tied" / "model.safetensors"))


def test_an_int8_folder_read_as_float_weights_says_what_it_holds(tmp_path, capsys):
    """`model info` and from_pretrained on a folder saved by save_quantized said "no weights in DIR: expected one
    of model.safetensors, ..." beside its model.int8.safetensors."""
    from bertkit.cli import main
    from bertkit.runtime.quantization import quantize, save_quantized

    save_quantized(quantize(tiny(bertkit.BertForSequenceClassification)), tmp_path)
    with pytest.raises(BertkitError, match=r"int8 model \(model.int8.safetensors.*bertkit.load"):
        bertkit.BertForSequenceClassification.from_pretrained(tmp_path)
    assert main(["model", "info", str(tmp_path), "--class", "BertForSequenceClassification"]) == 2
    assert "int8 model" in capsys.readouterr().err


def test_loading_a_model_draws_nothing_from_torchs_global_generator(tiny_dir, tmp_path):
    """A notebook seeds torch, loads or uses a model, then draws: the draws must not depend on whether a model
    was loaded in between (the layers' random init, overwritten by the file's weights, used to consume it: a
    cell's random numbers changed with whether `bertkit.embed` had its model cached yet)."""
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=2)
    bertkit.BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path, tokenizer=Tokenizer.from_pretrained())
    (tmp_path / "bertkit_task.json").write_text(json.dumps({"task": "classify", "max_length": 32}))
    bertkit.BertForMaskedLM(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path / "mlm", tokenizer=Tokenizer.from_pretrained())
    calls = {
        "BertModel.from_pretrained": lambda: BertModel.from_pretrained(tiny_dir),
        "load": lambda: bertkit.load(tiny_dir),
        "load mlm": lambda: bertkit.load(tmp_path / "mlm", head="mlm"),
        "embed": lambda: bertkit.embed("a sentence", model=str(tiny_dir) + "/"),  # a path not cached yet
        "predict": lambda: bertkit.predict(tmp_path, ["a fine film"]),
        "attention_map": lambda: bertkit.attention_map("a sentence", model=tiny_dir),
        "trace": lambda: bertkit.trace("a sentence", model=tiny_dir),
    }
    for name, call in calls.items():
        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        call()
        assert torch.equal(torch.rand(3), expected), f"{name} drew from torch's global random generator"


def test_a_state_dict_named_by_a_ddp_wrapper_loads_as_the_model_it_wraps(tmp_path, transformers_mod):
    """A DistributedDataParallel model's state_dict() names every weight `module.` + the wrapped model's name (torch's
    DDP, world size 1 on gloo, around transformers' classifier). bertkit's own torchrun runs save the wrapped model's
    (test_distributed: the same keys as one process), but a trainer that saved the wrapper's made a folder every
    bertkit loader refused, listing all weights as missing (transformers loads it as freshly initialised weights,
    silently). The prefix is dropped where the keys are read (checkpoint.canonical): the serving loader, finetune's
    (strict=False) and predict read the folder as the unwrapped one, and the model saved again carries no prefix."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from test_finetune import tiny_model_dir

    encoder = tiny_model_dir(tmp_path / "encoder")
    torch.manual_seed(0)  # transformers initialises the head it adds from torch's global generator
    model = transformers_mod.BertForSequenceClassification.from_pretrained(encoder, num_labels=2).eval()
    plain, wrapped = tmp_path / "plain", tmp_path / "ddp"
    for folder in (plain, wrapped):
        model.save_pretrained(folder)
        shutil.copy(encoder / "vocab.txt", folder)
        (folder / "bertkit_task.json").write_text(json.dumps({"task": "classify", "max_length": 16,
                                                              "text_column": "sentence"}))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        state = {k: v.detach().clone() for k, v in DistributedDataParallel(model).state_dict().items()}
    finally:
        dist.destroy_process_group()
    assert all(k.startswith("module.") for k in state), list(state)[:3]  # the premise: DDP's names
    save_file(state, str(wrapped / "model.safetensors"), metadata={"format": "pt"})
    ids, mask = inputs()
    ids = ids % 58  # the handmade vocabulary's ids
    with torch.no_grad():  # the serving loader
        got, want = (bertkit.load(folder, head="auto").model(ids, mask).logits for folder in (wrapped, plain))
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        torch.testing.assert_close(got, model(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
    head = bertkit.BertForSequenceClassification.from_pretrained(wrapped, strict=False)  # as finetune reads --model
    same = bertkit.BertForSequenceClassification.from_pretrained(plain, strict=False)
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), same.parameters()))
    texts = ["the movie was good .", "it was bad"]
    assert bertkit.predict(wrapped, texts) == bertkit.predict(plain, texts)
    head.save_pretrained(tmp_path / "again")
    assert not [k for k in load_file(str(tmp_path / "again" / "model.safetensors")) if k.startswith("module.")]


class _Compiled(torch.nn.Module):
    """torch.compile's wrapper as its state_dict() names the weights: OptimizedModule registers the model it compiles
    as the submodule `_orig_mod` (torch/_dynamo/eval_frame.py, checked below). torch.compile itself is not called: on
    this 2-core CPU importing torch._dynamo, which it does first, takes 3.4-6 s, past a test's 2 s; its state_dict()
    compiles nothing, so the keys are torch's own nn.Module.state_dict() names either way."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


@pytest.mark.parametrize("wrappers", [("compile",), ("compile", "ddp"), ("ddp", "compile")])
def test_a_state_dict_named_by_torch_compile_loads_as_the_model_it_compiled(tmp_path, transformers_mod, wrappers):
    """A torch.compile'd model's state_dict() names every weight `_orig_mod.` + the model's name; a DDP wrapper around
    it (or inside it) adds `module.` before (after) it. Saved as it is (safetensors beside the model's config.json),
    every bertkit loader refused the folder, listing all weights missing; the prefixes are dropped where a DDP
    `module.` already was (checkpoint.canonical, through weights_check.wrapper_prefix), and the config is checked
    against the prefixed header as against a plain one. Oracle: transformers' uncompiled model, its weights and
    logits."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    source = (Path(torch.__file__).parent / "_dynamo" / "eval_frame.py").read_text()
    assert "self._orig_mod = mod" in source  # the premise: how OptimizedModule holds the model it compiles
    config = transformers_mod.BertConfig(**TINY, num_labels=3)
    torch.manual_seed(0)
    model = transformers_mod.BertForSequenceClassification(config).eval()
    wrapped = model
    for wrapper in wrappers:
        if wrapper == "compile":
            wrapped = _Compiled(wrapped)
        else:
            dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
            try:
                wrapped = DistributedDataParallel(wrapped)
            finally:
                dist.destroy_process_group()
    state = {k: v.detach().clone() for k, v in wrapped.state_dict().items()}
    prefix = "".join({"compile": "_orig_mod.", "ddp": "module."}[w] for w in reversed(wrappers))
    assert all(k.startswith(prefix + "bert.") or k.startswith(prefix + "classifier.") for k in state), list(state)[:2]
    folder = tmp_path / "compiled"
    config.save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

    ours = bertkit.BertForSequenceClassification.from_pretrained(folder)  # strict: every weight found
    hf_names = dict(model.named_parameters())
    for name, param in ours.named_parameters():
        keys = hf_keys(name[len("bert."):] if name.startswith("bert.") else name)
        want = torch.cat([hf_names[("" if k.startswith("classifier.") else "bert.") + k] for k in keys])
        assert torch.equal(param, want), name
    ids, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask).logits, model(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "vocab_size": 98}))
    with pytest.raises(BertkitError, match=r"config.json says vocab_size=98 but .* of shape \[99, 32\]"):
        bertkit.BertForSequenceClassification.from_pretrained(folder)  # the header check, before a layer is built


def _replaced_after_its_first_read(monkeypatch, path, other: dict):
    """`path` (a config file) replaced by `other` right after it is first read: a save landing meanwhile."""
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        text = real(self, *args, **kwargs)
        if self == path and json.loads(text) != other:
            self.write_text(json.dumps(other))
        return text

    monkeypatch.setattr(Path, "read_text", read_text)


def test_describe_reads_config_json_once_so_a_save_landing_meanwhile_cannot_mix_two_models(tmp_path, monkeypatch):
    """checkpoint.describe read config.json three times (the model type, the architecture, the task a head implies):
    a model saved over the folder meanwhile was described as one model's type beside another's head (here a BERT
    classifier as 'bert' + 'ElectraModel', no task). It reads the file once: the one model it held when read."""
    from bertkit.model.checkpoint import describe

    folder = tmp_path / "model"
    tiny(bertkit.BertForSequenceClassification, num_labels=3).save_pretrained(folder)
    electra = {"model_type": "electra", "architectures": ["ElectraModel"], "max_position_embeddings": 40}
    _replaced_after_its_first_read(monkeypatch, folder / "config.json", electra)
    saved = describe(folder)
    assert (saved.model_type, saved.architecture, saved.task) == (
        "bert", "BertForSequenceClassification", {"task": "classify", "max_length": 40, "inferred": True})
    saved = describe(folder)  # the file now holds the other model: described as it, whole
    assert (saved.model_type, saved.architecture, saved.task) == ("electra", "ElectraModel", None)


def _folder_for_load(kind, folder):
    """A model folder of `kind` for `bertkit.load`, and the model saved in it: a fine-tuned classifier (3 labels),
    a sentence-transformers encoder (mean pooling, normalised) or an int8 classifier (save_quantized)."""
    from bertkit.model.sentence_layout import write_layout
    from bertkit.runtime.quantization import quantize, save_quantized

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"])
    model = tiny(BertModel if kind == "sentence encoder" else bertkit.BertForSequenceClassification, num_labels=3)
    if kind == "int8 classifier":
        model = quantize(model)
        save_quantized(model, folder, tok, task={"task": "classify", "max_length": 16})
        return model
    model.save_pretrained(folder, tokenizer=tok)
    if kind == "sentence encoder":
        write_layout(folder, pooling="mean", normalize=True, max_seq_length=16, hidden_size=32)
    return model


@pytest.mark.parametrize("kind", ["classifier", "sentence encoder", "int8 classifier"])
def test_one_load_reads_config_json_and_modules_json_once(tmp_path, monkeypatch, kind):
    """bertkit.load of a folder read its config.json three times (is_static's model2vec check, describe, the model's
    config; an int8 one four: its class) and modules.json three times (is_static, the encoder's folder, the layout):
    each step read the folder again. Every reader of these files goes through Path.read_text; one load now reads
    each once, and loads the model saved there."""
    from collections import Counter

    folder = tmp_path / "model"
    saved = _folder_for_load(kind, folder)
    reads, real = Counter(), Path.read_text

    def read_text(self, *args, **kwargs):
        reads[self.relative_to(folder).as_posix() if self.is_relative_to(folder) else None] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    loaded = bertkit.load(folder, fast=False)  # the plain layers: the saved model's own arithmetic
    small = {name: reads[name] for name in ("config.json", "modules.json") if (folder / name).is_file()}
    assert small == dict.fromkeys(small, 1)  # main: classifier {'config.json': 3}, encoder 3 and 3, int8 4
    ids, mask = inputs((2, 9))
    ids = ids % 15
    with torch.no_grad():
        out, ref = loaded.model(ids, attention_mask=mask), saved(ids, attention_mask=mask)
    key = "last_hidden_state" if kind == "sentence encoder" else "logits"
    torch.testing.assert_close(getattr(out, key), getattr(ref, key))
    if kind == "sentence encoder":
        assert (loaded.layout.pooling, loaded.layout.normalize, loaded.layout.max_seq_length) == ("mean", True, 16)
    else:
        assert loaded.task == "classify" and loaded.int8 is (kind == "int8 classifier")


def test_a_load_builds_the_model_of_the_config_json_it_described(tmp_path, monkeypatch):
    """bertkit.load described the folder from its config.json (describe), then built the model from the file read
    again: a classifier saved over meanwhile (here 3 labels, then a 2-label one over the same encoder) was planned as
    the first and built from the second's settings, and refused as 'does not match' (3 head rows against 2 labels).
    It reads the file once: the model it held when read, logits equal to the one saved; a load after reads the new
    file (its 2 labels refused beside the 3-label weights still there)."""
    folder = tmp_path / "model"
    saved = _folder_for_load("classifier", folder)
    other = {**json.loads((folder / "config.json").read_text()), "num_labels": 2,
             "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}}
    _replaced_after_its_first_read(monkeypatch, folder / "config.json", other)
    loaded = bertkit.load(folder, fast=False)  # main: BertkitError ... does not match
    ids, mask = inputs((2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids % 15, attention_mask=mask).logits,
                                   saved(ids % 15, attention_mask=mask).logits)
    with pytest.raises(BertkitError):
        bertkit.load(folder)

