"""Readers that check before they trust (issue 38, items 5-8 and 10): each damaged input is refused
in one line naming the field or file, before work is done on it, and nothing is silently lost.

Corpora: SciFact's first abstracts with a line repeated, a null id, ids 7 and "7". Models: the
tiny random encoder of test_index (2 layers, hidden 32, 4 heads, intermediate 37, 64 positions)
with one config.json field changed at a time; the refusal must come from the header check,
before the model is built (the process's peak memory stays where it was). Indexes: a built index
damaged one file at a time; the CLI (`bertkit search`) prints one line, no traceback.
"""

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.beir import read_corpus
from bertkit.errors import BertkitError
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.passages import read_documents
from bertkit.runtime.loading import load
from test_index import make_tiny, scifact_corpus

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"))


def cli(*args):
    """`python -m bertkit.cli ARGS`: (status, stderr)."""
    done = subprocess.run([sys.executable, "-m", "bertkit.cli", *map(str, args)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    return done.returncode, done.stderr


# --- item 5 and 10: ids in corpus.jsonl -------------------------------------------------------------

def test_a_repeated_id_is_refused_with_both_lines_or_dropped_with_dedupe(shared_data, tmp_path):
    path = scifact_corpus(shared_data, tmp_path / "corpus.jsonl", n=5)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[2]]) + "\n")  # six lines, five ids: line 6 repeats line 3
    with pytest.raises(BertkitError, match=r"appears on line 3 and again on line 6.*--dedupe"):
        read_corpus(path)
    with pytest.raises(BertkitError, match="appears on line 3 and again on line 6"):
        read_documents(path)
    with pytest.warns(UserWarning, match="1 line"):
        kept = read_documents(path, dedupe=True)
    assert [d.id for d in kept] == [json.loads(line)["_id"] for line in lines]  # the first of each, in order
    assert kept[2].text == json.loads(lines[2])["text"]


def test_ids_7_and_quoted_7_are_the_same_id(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": 7, "text": "seven"}\n{"_id": "8", "text": "eight"}\n{"_id": "7", "text": "again"}\n')
    with pytest.raises(BertkitError, match=r"line 1 and again on line 3 \(7 and '7' read as the same id\)"):
        read_corpus(path)


@pytest.mark.parametrize("line, says", [('{"_id": null, "text": "x"}', "null '_id'"),
                                        ('{"_id": "a", "text": null}', "null 'text'"),
                                        ('{"_id": 1.5, "text": "x"}', "not a string or a whole number")])
def test_a_null_or_odd_id_is_refused_not_read_as_none(tmp_path, line, says):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "0", "text": "fine"}\n' + line + "\n")
    with pytest.raises(BertkitError, match=f"line 2.*{says}" if "line" not in says else says):
        read_corpus(path)


def test_index_cli_refuses_a_repeated_id_in_one_line_and_dedupe_builds(shared_data, tiny, tmp_path):
    path = scifact_corpus(shared_data, tmp_path / "corpus.jsonl", n=3)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[0]]) + "\n")
    status, err = cli("index", path, "-o", tmp_path / "ix", "--model", tiny, "--quiet", "--passage-tokens", 32)
    assert status == 2 and err.count("\n") == 1 and "line 1 and again on line 4" in err, err
    status, err = cli("index", path, "-o", tmp_path / "ix", "--model", tiny, "--quiet", "--passage-tokens", 32,
                      "--dedupe")
    assert status == 0, err
    assert "1 line(s) repeat an earlier _id and were dropped" in err
    assert open_index(tmp_path / "ix").info["documents"] == 3
    # a TSV corpus names the lines too (it said "appears twice", no line)
    (tmp_path / "c.tsv").write_text("id\ttitle\ttext\nd1\t\tone\nd2\t\ttwo\nd1\t\tthree\n", encoding="utf-8")
    status, err = cli("index", tmp_path / "c.tsv", "-o", tmp_path / "ix2", "--model", tiny, "--quiet")
    assert status == 2 and err.count("\n") == 1 and "id 'd1' appears on line 2 and again on line 4" in err, err
    assert cli("index", tmp_path / "c.tsv", "-o", tmp_path / "ix2", "--model", tiny, "--quiet", "--dedupe")[0] == 0
    assert [p["text"] for p in open_index(tmp_path / "ix2").passages(range(2))] == ["one", "two"]


# --- item 6: config.json checked, and checked against the weights before allocation -----------------

def _with_config(tiny, tmp_path, **changes) -> Path:
    folder = tmp_path / "changed"
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("changes, says", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers is 1000000, over the limit"),
    ({"hidden_size": 10**9}, "hidden_size is 1000000000, over the limit"),
    ({"vocab_size": 10**10}, "vocab_size is 10000000000, over the limit"),
    ({"max_position_embeddings": 10**9}, "max_position_embeddings is 1000000000, over the limit"),
    ({"num_hidden_layers": 1000}, "num_hidden_layers=1000 but .*model.safetensors holds 2 layers"),
    ({"hidden_size": 4096, "num_attention_heads": 4}, "hidden_size=4096 but .* shape \\[30522, 32\\]"),
    ({"vocab_size": 1_000_000}, "vocab_size=1000000 but"),
    ({"max_position_embeddings": 100_000}, "max_position_embeddings=100000 but"),
    ({"layer_norm_eps": "1e-12"}, 'layer_norm_eps must be a number, got "1e-12"'),
    ({"architectures": 5}, "architectures must be a list of class names"),
    ({"id2label": {"a": "x"}}, "id2label has the key 'a'"),
])
def test_a_wrong_config_is_one_line_naming_the_field_before_allocation(tiny, tmp_path, changes, says):
    folder = _with_config(tiny, tmp_path, **changes)
    load(tiny)  # the peak memory of a real load, before
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BertkitError, match=says) as err:
        load(folder)
    assert "\n" not in str(err.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 50_000  # KiB: nothing was allocated


def test_modules_json_idx_must_be_a_number(tiny, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": "1", "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(BertkitError, match=r"modules.json: module .*Pooling has idx '1'; idx must be a whole number"):
        load(folder)


# --- item 7: paths a model folder names stay inside it --------------------------------------------

@pytest.mark.parametrize("where", ["../outside", "/etc", "sub/../../outside"])
def test_modules_json_paths_outside_the_folder_are_refused(tiny, tmp_path, where):
    folder = tmp_path / "model" / "m"
    shutil.copytree(tiny, folder)
    outside = tmp_path / "model" / "outside"  # a real pooling config, CLS: followed, it would switch the pooling
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": where, "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(BertkitError, match=f"modules.json names '{where}', outside its folder"):
        load(folder)


def test_a_sharded_weight_map_outside_the_folder_is_refused(tiny, tmp_path):
    folder = tmp_path / "model" / "m"
    shutil.copytree(tiny, folder)
    (folder / "model.safetensors").rename(tmp_path / "model" / "shard.safetensors")  # outside, but loadable
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"embeddings.word_embeddings.weight": "../shard.safetensors"}}))
    with pytest.raises(BertkitError, match="names '../shard.safetensors', outside its folder"):
        load(folder)


def test_a_vocabulary_longer_than_the_embedding_table_is_refused(tiny, tmp_path):
    folder = tmp_path / "v"
    shutil.copytree(tiny, folder)
    with open(folder / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("".join(f"extra{i}\n" for i in range(5)))
    with pytest.raises(BertkitError, match="vocab.txt has 30527 tokens but config.json's vocab_size is 30522"):
        load(folder)


# --- item 8: an index checked on open -------------------------------------------------------------

@pytest.fixture(scope="module")
def index(shared_data, tiny, tmp_path_factory):
    base = tmp_path_factory.mktemp("index")
    out = base / "index"
    build_index(scifact_corpus(shared_data, base / "corpus.jsonl", n=4), out, str(tiny), passage_tokens=32,
                overlap=6, part_size=40, dtype="float32", progress=False)
    return out


def _damaged(index, tmp_path, damage) -> Path:
    copy = tmp_path / "damaged"
    shutil.copytree(index, copy)
    damage(copy)
    return copy


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


def _edit_info(**changes):
    def edit(folder):
        info = json.loads((folder / "index.json").read_text())
        info.update(changes)
        (folder / "index.json").write_text(json.dumps(info))
    return edit


def _nan_vector(folder):
    from bertkit.data.safetensors_header import read_header

    entry = read_header(folder / "vectors.safetensors")["vectors"]
    with open(folder / "vectors.safetensors", "r+b") as f:
        f.seek(entry.begin + 4 * 7)
        f.write(np.array([np.nan], dtype="<f4").tobytes())


DAMAGES = {
    "empty index.json": (lambda f: (f / "index.json").write_text(""), "index.json is not readable JSON"),
    "truncated index.json": (lambda f: _truncate(f / "index.json", lambda n: n // 2), "index.json is not readable JSON"),
    "truncated vectors": (lambda f: _truncate(f / "vectors.safetensors", lambda n: n - 100), "is truncated"),
    "empty vectors": (lambda f: (f / "vectors.safetensors").write_bytes(b""), "shorter than the 8-byte header"),
    "truncated passages": (lambda f: _truncate(f / "passages.jsonl", lambda n: n - 10), "passages.jsonl has"),
    "empty passages": (lambda f: (f / "passages.jsonl").write_bytes(b""), "passages.jsonl has 0 bytes"),
    "passages 10^9": (_edit_info(passages=10**9), "should be F32 \\[1000000000, 32\\]"),
    "documents null": (_edit_info(documents=None), "documents is null, not a whole number"),
    "fewer documents": (_edit_info(documents=1), "document number is outside 0..0"),
    "a NaN vector": (_nan_vector, "vector 0 is not finite"),
    # the lexical part (read by bm25s at the first lexical or hybrid search: FileNotFoundError's line, or a
    # ValueError traceback from numpy and a server's 500)
    "no lexical folder": (lambda f: shutil.rmtree(f / "lexical"), "lexical/data.csc.index.npy is missing"),
    "no vocabulary": (lambda f: (f / "lexical" / "vocab.index.json").unlink(), "vocab.index.json is missing"),
    "lexical header cut": (lambda f: _truncate(f / "lexical" / "data.csc.index.npy", lambda n: 100),
                           "data.csc.index.npy is not a whole .npy file"),
    "lexical data cut": (lambda f: _truncate(f / "lexical" / "indices.csc.index.npy", lambda n: n - 4),
                         "indices.csc.index.npy has .* bytes, not the .* its header says"),
    "lexical params emptied": (lambda f: (f / "lexical" / "params.index.json").write_text(""),
                               "params.index.json is not a JSON object"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_index_is_one_line_naming_the_file_and_the_fix(index, tmp_path, damage):
    spoil, says = DAMAGES[damage]
    open_index(index)
    with pytest.raises(BertkitError, match=says) as err:
        open_index(_damaged(index, tmp_path, spoil))
    assert "bertkit index CORPUS -o INDEX" in str(err.value) and "\n" not in str(err.value)


def test_search_and_serve_say_a_damaged_index_in_one_line(index, tiny, tmp_path):
    damaged = _damaged(index, tmp_path, DAMAGES["truncated vectors"][0])
    status, err = cli("search", damaged, "vitamin D")
    assert status == 2 and err.count("\n") == 1 and "is truncated" in err, err
    status, err = cli("serve", tiny, "--index", damaged, "--port", "0")
    assert status == 2 and err.strip().splitlines()[-1].startswith("bertkit: error:") and "is truncated" in err, err
    assert "Traceback" not in err
    damaged = _damaged(index, tmp_path / "lexical", DAMAGES["lexical data cut"][0])
    status, err = cli("search", damaged, "vitamin D", "--mode", "lexical")  # before: numpy's traceback
    assert status == 2 and err.count("\n") == 1 and "its header says" in err, err


# --- item 10: a float label column is a hint for regression -------------------------------------------

def test_fractional_labels_warn_that_regression_fits(tmp_path):
    from test_finetune import tiny_model_dir, write_tsv

    from bertkit.data.tables import looks_like_scores
    from bertkit.tasks import finetune
    from bertkit.tasks.config import TrainConfig

    assert looks_like_scores(["0.5", "1", "3.25"]) and not looks_like_scores(["0", "1", "2"])
    assert not looks_like_scores(["neg", "0.5"])
    rows = [(f"the movie was {w}", score) for w, score in [("good", 4.5), ("bad", 0.25), ("fine", 2.0)] * 4]
    train = write_tsv(tmp_path / "scores.tsv", ["sentence", "label"], rows)
    with pytest.warns(UserWarning, match=r"numbers with fractions \(0.25, 2, 4.5\): each distinct value becomes one "
                                         r"of 3 classes; for a score, use bertkit finetune regression"):
        finetune("classify", train=str(train), output=str(tmp_path / "out"), model=str(tiny_model_dir(tmp_path / "m")),
                 max_length=16, log=lambda line: None, training=TrainConfig(epochs=1, batch_size=8, progress=False))
