"""A model folder saved over another is one model afterwards, old or new, or refused in one line: never a mix.

A save writes several files (config.json, the weights, vocab.txt, bertkit_task.json, the sentence-transformers
files, an export's model.onnx and its side files), each whole. A process stopped between two of them (a kill, a
full disk) left new files beside old ones: a new config.json beside the old weights of the same shapes loaded
silently as neither model. Real processes here (tests/killed_write.py's `stopping_open`, and a kill at a chosen
rename), as tests/test_output_files.py stops them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def classifier(seed: int, labels: tuple[str, str], vocab=None):
    """A tiny classifier (the default vocabulary unless `vocab`, a list of tokens) and its tokenizer."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained() if vocab is None else Tokenizer(vocab)
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, num_labels=2,
                        id2label=dict(enumerate(labels)))
    return BertForSequenceClassification(config, generator=torch.Generator().manual_seed(seed)), tok


def save_new(out: Path) -> None:
    """The model a stopped save writes over the folder: other weights, other labels, the same shapes."""
    model, tok = classifier(2, ("bad", "good"))
    model.save_pretrained(out, tokenizer=tok)


def save_task(out: Path) -> None:
    """As fine-tuning saves each better epoch (`bertkit.tasks.run.saver`): the model, then its task file."""
    from bertkit.tasks.run import saver

    model, tok = classifier(2, ("bad", "good"))
    saver(out, tok, {"task": "classify", "text_column": "text", "max_length": 64})(model)


STOPPED = """
import builtins, io, os, signal, sys
sys.path[:0] = [{tests!r}]
from killed_write import stopping_open
from test_folder_unit import {saver}
{stop}
{saver}(__import__("pathlib").Path({out!r}))
"""
# killed once `n` bytes went to a file named NAME... (its NAME.tmp: what a save writes first)
IN_A_WRITE = "builtins.open = io.open = stopping_open({name!r}, {n}, signal.SIGKILL, io.open)"
# killed inside the weights' write (safetensors writes from Rust, past Python's open): half a file written
IN_THE_WEIGHTS = """
import bertkit.model.checkpoint as checkpoint
def save_file(tensors, path, metadata=None):
    with open(path, "wb") as f:
        f.write(b"the first bytes of a weights file")
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.save_file = save_file
"""
# killed at the second rename of one of the model's files into the folder: a save that had replaced one of them
# and not the next (a rename of the save's own marker is none of the model's files)
AT_A_RENAME = """
real, seen = os.replace, []
def replace(src, dst):
    if os.path.dirname(os.fspath(dst)) == {out!r} and os.path.basename(os.fspath(dst)) != "bertkit_saving.json":
        seen.append(dst)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
os.replace = replace
"""


def stopped(out: Path, stop: str, saver: str = "save_new") -> None:
    code = STOPPED.format(tests=str(TESTS), out=str(out), saver=saver, stop=stop)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9, done.stderr


@pytest.fixture()
def old(tmp_path):
    """A folder holding the old model: the classifier of labels neg/pos (seed 1), fine-tuning's last best epoch."""
    out = tmp_path / "model"
    model, tok = classifier(1, ("neg", "pos"))
    model.save_pretrained(out, tokenizer=tok)
    from bertkit.tasks.run import saver

    saver(out, tok, {"task": "classify", "text_column": "text", "max_length": 64})(model)
    return out, model


def same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_save_killed_inside_the_weights_leaves_the_old_model_whole(old):
    """Killed while writing model.safetensors, after config.json: the new labels were read beside the old weights
    (same shapes: it loaded silently, a model nobody trained). Now the old model, labels and weights."""
    import bertkit

    out, before = old
    stopped(out, IN_THE_WEIGHTS)
    loaded = bertkit.load(str(out))
    assert loaded.model.config.id2label == {0: "neg", 1: "pos"}  # was: bad, good (the new config.json)
    assert same_weights(loaded.model, before)


def test_a_save_killed_between_two_renames_is_refused_in_one_line_until_saved_again(old):
    """Killed after its first file replaced and before its next: the folder mixes two saves. Every reader refuses it
    (the loader, a fine-tuning run's start, the tokenizer) in one line naming the folder and what to do, before any
    weight is read; a save into it again makes it whole (the new model, nothing left of the stop)."""
    import bertkit
    from bertkit.errors import BertkitError
    from bertkit.text.tokenizer import Tokenizer

    out, _ = old
    stopped(out, AT_A_RENAME.format(out=str(out)), saver="save_task")
    for read in (lambda: bertkit.load(str(out)), lambda: Tokenizer.from_pretrained(out),
                 lambda: bertkit.BertModel.from_pretrained(out)):
        with pytest.raises(BertkitError) as err:
            read()
        said = str(err.value)
        assert "\n" not in said and str(out) in said and "stopped part way" in said and "save" in said
    save_task(out)
    loaded = bertkit.load(str(out))
    new, _ = classifier(2, ("bad", "good"))
    assert loaded.model.config.id2label == {0: "bad", 1: "good"} and same_weights(loaded.model, new)
    assert sorted(p.name for p in out.iterdir()) == ["bertkit_task.json", "config.json", "model.safetensors",
                                                     "tokenizer_config.json", "vocab.txt"]


def test_a_save_writes_only_the_files_whose_bytes_changed(old):
    """A better epoch's save changes the weights alone: the other files stay the very files they were (their
    inodes), so a stop there has nothing to mix; a full disk in any of them leaves the old folder as it was."""
    out, _ = old
    inodes = {p.name: p.stat().st_ino for p in out.iterdir()}
    model, tok = classifier(3, ("neg", "pos"))
    from bertkit.tasks.run import saver

    saver(out, tok, {"task": "classify", "text_column": "text", "max_length": 64})(model)
    now = {p.name: p.stat().st_ino for p in out.iterdir()}
    assert sorted(now) == sorted(inodes)
    assert [name for name in sorted(now) if now[name] != inodes[name]] == ["model.safetensors"]


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40))]


def export_new(out: Path) -> None:
    """An export of the model in `out`'s sibling new/ into `out`, where an earlier export stands."""
    from bertkit.runtime.export import export_onnx

    export_onnx(out.parent / "new", out)


def test_an_export_killed_over_an_earlier_one_leaves_the_earlier_export_whole(tmp_path):
    """export onnx copied config.json and the tokenizer beside the graph, each renamed as it was written, and
    model.onnx last: killed in between (here inside vocab.txt), the earlier export's model.onnx stood beside this
    export's config.json, the labels of another model. Now every file of the earlier export, byte for byte."""
    pytest.importorskip("onnxruntime")
    from bertkit.runtime.export import export_onnx

    for name, seed, labels in (("old", 1, ("neg", "pos")), ("new", 2, ("bad", "good"))):
        model, tok = classifier(seed, labels, VOCAB)
        model.save_pretrained(tmp_path / name, tokenizer=tok)
    out = tmp_path / "deploy"
    export_onnx(tmp_path / "old", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code = STOPPED.format(tests=str(TESTS), out=str(out), saver="export_new",
                          stop=IN_A_WRITE.format(name="vocab.txt", n=60))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9, done.stderr
    after = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.endswith((".tmp", ".lock"))}
    assert json.loads(after["config.json"])["id2label"] == {"0": "neg", "1": "pos"}  # was: bad, good
    assert after == before
