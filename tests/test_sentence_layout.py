"""The sentence-transformers layout both ways, with sentence-transformers as the oracle.

- a folder bertkit writes (tiny odd-shaped BERT + `write_layout`) is loaded by
  sentence-transformers as it is, and its vectors equal bertkit's (1e-6): pooling,
  normalisation and the max_seq_length truncation all carried by the files;
- a CLS-pooled, normalised folder that sentence-transformers 6 saves (its newer
  spelling: `pooling_mode`, max length in tokenizer_config.json) is read by
  `read_layout`, and bertkit's vectors made with what it read equal
  sentence-transformers' own;
- the packaged default model (the older spelling) reads as mean, normalised, 256;
- broken or unsupported folders are one clear error naming the file.
"""

import json
import shutil

import numpy as np
import pytest
from test_finetune import WORDS, tiny_model_dir

from bertkit.errors import BertkitError
from bertkit.embeddings.features import embed
from bertkit.model.modeling import BertModel
from bertkit.model.sentence_layout import SentenceLayout, read_layout, write_layout
from bertkit.text.tokenizer import Tokenizer

TEXTS = ["the movie was good", "john visited paris and london", "who went to the city ?",
         " ".join(WORDS[:40])]  # longer than the max_seq_length below: truncation must agree


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_layout"), seed=7)


def ours(path, layout: SentenceLayout, vocab_dir=None):
    model = (BertModel.from_pretrained(path), Tokenizer.from_pretrained(vocab_dir or path))
    return embed(TEXTS, model=model, pooling=layout.pooling, normalize=layout.normalize,
                 max_length=layout.max_seq_length, truncate=True)


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False), ("max", False)])
def test_sentence_transformers_loads_what_we_write_and_gives_our_vectors(st, tiny, tmp_path, pooling, normalize):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "model"
    shutil.copytree(tiny, out)
    write_layout(out, pooling=pooling, normalize=normalize, max_seq_length=12, hidden_size=32, dimensions=[16, 32, 8])
    layout = read_layout(out)
    assert layout == SentenceLayout(pooling, normalize, 12, [32, 16, 8], False)

    model = SentenceTransformer(str(out), device="cpu")
    assert model.max_seq_length == 12 and len(model) == (3 if normalize else 2)
    theirs = model.encode(TEXTS, convert_to_numpy=True)
    mine = ours(out, layout)
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-6)
    assert np.allclose(np.linalg.norm(mine, axis=1), 1.0) == normalize
    # the layout matters: the other pooling, or no truncation, gives other vectors
    other = SentenceLayout("cls" if pooling != "cls" else "mean", normalize, 12)
    assert not np.allclose(ours(out, other), theirs, atol=1e-3)
    assert not np.allclose(ours(out, SentenceLayout(pooling, normalize, 60))[-1], theirs[-1], atol=1e-3)


def test_we_read_a_cls_folder_sentence_transformers_saved(st, tiny, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    word = Transformer(str(tiny), max_seq_length=10)
    SentenceTransformer(modules=[word, Pooling(32, "cls"), Normalize()], device="cpu").save(str(tmp_path / "st"))
    layout = read_layout(tmp_path / "st")
    assert (layout.pooling, layout.normalize, layout.max_seq_length) == ("cls", True, 10)

    theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    # sentence-transformers 6 saves tokenizer.json without vocab.txt: the vocabulary is the tiny model's
    np.testing.assert_allclose(ours(tmp_path / "st", layout, vocab_dir=tiny), theirs, rtol=0, atol=1e-6)


def test_the_default_model_reads_as_mean_normalised_256(default_model_dir):
    assert read_layout(default_model_dir) == SentenceLayout("mean", True, 256, None, False)


def test_a_plain_hugging_face_folder_has_no_layout(tiny):
    assert read_layout(tiny) is None


def test_writing_twice_drops_a_stale_normalize_module(tiny, tmp_path):
    out = tmp_path / "m"
    shutil.copytree(tiny, out)
    write_layout(out, pooling="mean", normalize=True, max_seq_length=64, hidden_size=32)
    write_layout(out, pooling="mean", normalize=False, max_seq_length=64, hidden_size=32)
    assert read_layout(out).normalize is False and not (out / "2_Normalize").exists()


def write(path, name, data):
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(data if isinstance(data, str) else json.dumps(data))


MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


@pytest.mark.parametrize("files,message", [
    ({"modules.json": "[{not json"}, "modules.json is not readable JSON"),
    ({"modules.json": MODULES + [{"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
      "1_Pooling/config.json": {"pooling_mode": "mean"}},
     "sentence_transformers.models.Dense (2_Dense) is not supported"),
    ({"modules.json": MODULES}, "1_Pooling/config.json is missing"),
    ({"modules.json": MODULES, "1_Pooling/config.json": {"pooling_mode_mean_tokens": True,
                                                         "pooling_mode_max_tokens": True}}, "several pooling modes"),
    ({"modules.json": MODULES, "1_Pooling/config.json": {"pooling_mode": "median"}}, "unknown pooling_mode 'median'"),
    ({"modules.json": MODULES, "1_Pooling/config.json": {"pooling_mode": "cls"},
      "sentence_bert_config.json": {"max_seq_length": "long"}}, "max_seq_length must be a positive integer"),
    ({"modules.json": MODULES, "1_Pooling/config.json": {"pooling_mode": "cls"},
      "config_sentence_transformers.json": {"matryoshka_dims": [64, "all"]}}, "matryoshka_dims must be"),
])
def test_broken_layouts_are_one_clear_error(tmp_path, files, message):
    for name, data in files.items():
        write(tmp_path, name, data)
    with pytest.raises(BertkitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_layout(tmp_path)


def test_sentence_config_alone_means_mean_pooling(tmp_path):
    write(tmp_path, "sentence_bert_config.json", {"max_seq_length": 128, "do_lower_case": True})
    assert read_layout(tmp_path) == SentenceLayout("mean", False, 128, None, True)


def test_write_refuses_what_bertkit_cannot_embed(tmp_path):
    with pytest.raises(BertkitError, match="mean, cls, max"):
        write_layout(tmp_path, pooling="weightedmean", normalize=False, max_seq_length=None, hidden_size=32)
    with pytest.raises(BertkitError, match="1..32"):
        write_layout(tmp_path, pooling="mean", normalize=False, max_seq_length=None, hidden_size=32, dimensions=[64])


def test_no_torch_needed():
    import subprocess
    import sys

    code = ("import sys, bertkit.model.sentence_layout; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "bertkit.model.sentence_layout imported torch"


def test_vectors_differ_between_models(tiny, tmp_path):
    # a control for the parity tests: two different random models do not agree to 1e-6 by accident
    other = tiny_model_dir(tmp_path / "other", seed=8)
    layout = SentenceLayout("mean", True, 12)
    assert not np.allclose(ours(tiny, layout), ours(other, layout), atol=1e-3)


# sentence-transformers before 2.0 saved the encoder in a module folder of its own: modules.json names
# it ("path": "0_Transformer"), and config.json, the weights, the vocabulary and sentence_bert_config.json
# sit inside it; the pooling sits in 1_Pooling beside it
ENCODER_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json")


def old_layout(default_model_dir, out, max_seq_length=12):
    (out / "0_Transformer").mkdir(parents=True)
    for name in ENCODER_FILES:  # the weights linked, not copied (90 MB)
        (out / "0_Transformer" / name).symlink_to(default_model_dir / name)
    write(out, "0_Transformer/sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    shutil.copytree(default_model_dir / "1_Pooling", out / "1_Pooling")
    modules = json.loads((default_model_dir / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    write(out, "modules.json", modules)
    return out


def test_an_old_layout_with_the_encoder_in_0_transformer_embeds_as_sentence_transformers_does(
        st, default_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    import bertkit
    from bertkit.cli import main
    from bertkit.retrieval.index import model_record

    folder = old_layout(default_model_dir, tmp_path / "old")
    theirs = SentenceTransformer(str(folder), device="cpu")
    assert theirs.max_seq_length == 12  # the module folder's sentence_bert_config.json
    expected = theirs.encode(TEXTS, convert_to_numpy=True)

    assert read_layout(folder) == SentenceLayout("mean", True, 12, None, False)
    loaded = bertkit.load(folder)
    assert loaded.task == "embed" and loaded.directory == folder and loaded.max_length == 12
    # an index made with it fingerprints the weights in the module folder: the default model's
    assert model_record(loaded)["fingerprint"] == model_record(bertkit.load())["fingerprint"]
    np.testing.assert_allclose(bertkit.embed(TEXTS, model=loaded), expected, rtol=0, atol=1e-5)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(folder),
                 "--dtype", "float32", "--quiet"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, rtol=0, atol=1e-5)
    # the module folder's length is what truncates: the long text differs at the top folder's 256
    assert not np.allclose(bertkit.embed(TEXTS[-1:], max_length=256, model=loaded), expected[-1:], atol=1e-3)


def test_an_old_layout_names_a_missing_module_folder(default_model_dir, tmp_path):
    import bertkit

    folder = old_layout(default_model_dir, tmp_path / "old")
    shutil.rmtree(folder / "0_Transformer")
    with pytest.raises(BertkitError, match="0_Transformer"):
        bertkit.load(folder)


def test_fine_tuning_starts_from_an_old_layouts_encoder(default_model_dir, tmp_path, capsys):
    """finetune (every task) builds its head on the encoder in 0_Transformer, with its vocabulary: the same weights
    and ids as the folder the files came from; `bertkit model info` reads it too."""
    import torch

    from bertkit.cli import main
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.tasks.run import load_head, load_tokenizer

    folder = old_layout(default_model_dir, tmp_path / "old")
    ours, theirs = (load_head(BertForSequenceClassification, path, 0, log=lambda _: None, num_labels=2)
                    for path in (folder, default_model_dir))
    mine, other = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == other.keys() and all(torch.equal(mine[k], other[k]) for k in mine)
    assert load_tokenizer(folder).encode(TEXTS[1]).input_ids == load_tokenizer(None).encode(TEXTS[1]).input_ids
    assert main(["model", "info", str(folder)]) == 0
    assert "all weights matched" in capsys.readouterr().out



def _two_layouts(folder):
    """Two sentence-transformers layouts of the same files, each in a folder of its own (JSON only: the readers
    need no weights): an older one with the encoder in 0_Transformer/, and the flat one, normalised."""
    def module(path, kind):
        return {"idx": 0, "name": path or "0", "path": path, "type": f"sentence_transformers.models.{kind}"}

    layouts = {"old": [module("0_Transformer", "Transformer"), module("1_Pooling", "Pooling")],
               "new": [module("", "Transformer"), module("1_Pooling", "Pooling"), module("2_Normalize", "Normalize")]}
    files = {"0_Transformer/config.json": {}, "0_Transformer/sentence_bert_config.json": {"max_seq_length": 64},
             "config.json": {}, "sentence_bert_config.json": {"max_seq_length": 128},
             "1_Pooling/config.json": {"pooling_mode_mean_tokens": True}, "2_Normalize/config.json": {}}
    for name, modules in layouts.items():
        for path, data in {**files, "modules.json": modules}.items():
            (folder / name / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / name / path).write_text(json.dumps(data))
    return layouts


def test_a_layout_is_read_from_one_modules_json(tmp_path, monkeypatch):
    """read_layout read modules.json twice, for the encoder's folder (encoder_folder) and for the modules: a layout
    saved over meanwhile (an older layout's 0_Transformer/ replaced by the flat one, normalised) was read as one
    folder's sentence_bert_config.json beside the other's modules, a layout neither file set describes. It is read
    once; the reference is each modules.json read in a folder of its own."""
    from test_checkpoint import _replaced_after_its_first_read

    modules = _two_layouts(tmp_path)
    layouts = {name: read_layout(tmp_path / name) for name in modules}
    assert layouts["old"] == SentenceLayout("mean", False, 64) and layouts["new"] == SentenceLayout("mean", True, 128)
    _replaced_after_its_first_read(monkeypatch, tmp_path / "old" / "modules.json", modules["new"])
    assert read_layout(tmp_path / "old") == layouts["old"]  # main: SentenceLayout("mean", True, 64), neither
    assert read_layout(tmp_path / "old") == layouts["new"]  # the file replaced: the new layout, whole


def test_the_files_an_export_copies_are_one_modules_jsons(tmp_path, monkeypatch):
    """layout_files (what export onnx copies beside model.onnx) read modules.json three times: for the layout, the
    encoder's folder and the module folders; a layout saved over meanwhile gave the older layout's
    0_Transformer/sentence_bert_config.json beside the flat one's modules (Normalize). One read: the parts of the
    layout it held when read, as layout_files gives them unchanged."""
    from test_checkpoint import _replaced_after_its_first_read

    from bertkit.model.sentence_layout import layout_files

    modules = _two_layouts(tmp_path)
    before = layout_files(tmp_path / "old")
    assert before[1]["sentence_bert_config.json"] == tmp_path / "old" / "0_Transformer" / "sentence_bert_config.json"
    _replaced_after_its_first_read(monkeypatch, tmp_path / "old" / "modules.json", modules["new"])
    assert layout_files(tmp_path / "old") == before
