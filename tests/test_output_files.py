"""A command's output file is whole or not there: Ctrl-C or a kill in the middle of writing it leaves
the file that stood at its name before (or none), never half a file a later step reads as whole
(a .jsonl cut after its k-th row, a .npy whose header promises rows that never came).

Real processes (tests/killed_write.py): the command stops itself, SIGINT or SIGKILL, once its first
bytes have gone out to a file named like the output (the output itself, or a NAME.tmp beside it).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KILLED_WRITE = Path(__file__).resolve().parent / "killed_write.py"
OLD = b"the file a previous run wrote\n"


def stopped(sig: str, out: Path, nbytes: int, *args) -> subprocess.CompletedProcess:
    """`bertkit ARGS` stopped by `sig` once `nbytes` have been written to a file whose name begins with out's.
    The process starts with SIGINT ignored, as every child of a pytest started in the background by a
    non-interactive shell (`python -m pytest ... &`) does: Ctrl-C still stops it (killed_write.py), so the SIGINT
    cases pass however the suite is started (they failed in such a pytest only)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(KILLED_WRITE), sig, out.name, str(nbytes), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def texts(tmp_path: Path, n: int = 40) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("".join(f"sentence number {i} about a cat\n" for i in range(n)), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix, sig", [(".jsonl", "SIGKILL"), (".jsonl", "SIGINT"), (".npy", "SIGKILL"),
                                         (".safetensors", "SIGINT")])
def test_embed_stopped_while_writing_leaves_the_old_output(tiny_dir, tmp_path, suffix, sig):
    out = tmp_path / f"vectors{suffix}"
    out.write_bytes(OLD)
    # .npy, .safetensors: 40 rows of 32 float32 (5,120 bytes) after the header's room; the stop comes near the end
    nbytes = 300 if suffix == ".jsonl" else 40 * 32 * 4 + 80
    done = stopped(sig, out, nbytes, "embed", texts(tmp_path), "-o", out, "--model", tiny_dir, "--quiet")
    assert done.returncode == (130 if sig == "SIGINT" else -9), done.stderr
    assert out.read_bytes() == OLD  # was: the rows written so far (.jsonl), a header and part of the rows
    if sig == "SIGINT":  # Ctrl-C cleans up after itself: no NAME.tmp or NAME.part left beside it
        assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt", out.name]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny untrained BertForSequenceClassification with the default vocabulary: predict's model."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("classifier")
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        path, tokenizer=Tokenizer.from_pretrained())
    return path


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_predict_stopped_while_writing_leaves_the_old_predictions(classifier, tmp_path, sig):
    out = tmp_path / "predictions.tsv"
    out.write_bytes(OLD)
    done = stopped(sig, out, 1, "predict", classifier, texts(tmp_path), "-o", out)
    assert done.returncode == (130 if sig == "SIGINT" else -9), done.stderr
    assert out.read_bytes() == OLD  # was: the header and the rows written so far, a file with fewer predictions
    if sig == "SIGINT":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.tsv", "texts.txt"]


@pytest.mark.parametrize("suffix, sig", [(".tsv", "SIGKILL"), (".jsonl", "SIGINT")])
def test_mine_stopped_while_writing_leaves_the_old_rows(tiny_dir, tmp_path, suffix, sig):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(f"question {i} about cats\tanswer {i} on a mat\n" for i in range(30)),
                     encoding="utf-8")
    out = tmp_path / f"mined{suffix}"
    out.write_bytes(OLD)
    done = stopped(sig, out, 1, "mine", pairs, "-o", out, "--model", tiny_dir, "--num-negatives", "1",
                   "--relative-margin", "0", "--range-max", "10", "--quiet")
    assert done.returncode == (130 if sig == "SIGINT" else -9), done.stderr
    assert out.read_bytes() == OLD  # was: the rows written so far, a smaller training set that reads as whole
    if sig == "SIGINT":
        assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, "pairs.tsv"]


def test_predict_over_a_file_draws_a_progress_bar_unless_quiet(classifier, tmp_path, capsys):
    """A file of 200,000 lines was predicted in silence for minutes (embed and mine draw a bar)."""
    from bertkit.cli import main

    source = texts(tmp_path, 20)
    assert main(["predict", str(classifier), str(source), "-o", str(tmp_path / "p.tsv"), "--batch-size", "4"]) == 0
    assert "predict:" in (err := capsys.readouterr().err) and "/5 [" in err  # counting 5 batches of 4
    assert main(["predict", str(classifier), str(source), "-o", str(tmp_path / "q.tsv"), "--quiet"]) == 0
    assert "predict:" not in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["mine", "{pairs}", "-o", "{same}", "--report", "{same}", "--model", "{missing}"],
    ["attention", "The cat sat.", "-o", "{same}", "--bertviz", "{same}", "--model", "{missing}"]])
def test_two_outputs_naming_one_file_are_refused_before_any_work(tmp_path, capsys, command):
    """`mine -o m.tsv --report m.tsv` wrote the rows, then the report over them, and said it wrote the rows there."""
    from bertkit.cli import main

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\na cat\ta mat\n", encoding="utf-8")
    names = {"pairs": pairs, "same": tmp_path / "out.tsv", "missing": tmp_path / "no-model"}
    assert main([word.format(**names) for word in command]) == 2
    err = capsys.readouterr().err
    assert "name the same file" in err and "no-model" not in err  # refused before the model is looked for



def model_saver(out: Path):
    """A call saving a tiny classifier of the default vocabulary into `out`, as each better epoch is saved."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=2)
    model, tok = BertForSequenceClassification(config, generator=torch.Generator().manual_seed(1)), Tokenizer.from_pretrained()
    return lambda: model.save_pretrained(out, tokenizer=tok)


def static_saver(out: Path):
    """A call saving a static model folder into `out`, as `finetune embed --static` saves each better epoch."""
    import torch

    from bertkit.model.static import StaticEmbedding, save_static
    from bertkit.text.tokenizer import Tokenizer
    from bertkit.text.tokenizer_json import write_tokenizer_json

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(25))])
    return lambda: write_tokenizer_json(tok, save_static(StaticEmbedding(torch.ones(30, 4), normalize=True), out), 64)


KILLED_SAVE = """
import builtins, io, signal, sys
sys.path[:0] = [{tests!r}]
from killed_write import stopping_open
from test_output_files import model_saver
save = model_saver(__import__("pathlib").Path({out!r}))
builtins.open = io.open = stopping_open("vocab.txt", 100_000, signal.SIGKILL, io.open)
save()
"""


def test_a_model_saved_over_its_folder_and_killed_leaves_its_vocabulary_whole(classifier, tmp_path):
    """Fine-tuning saves each better epoch over the folder's last model. vocab.txt was written in place: a
    kill in the middle left it cut after its k-th line, and the model then loaded without a word, every later
    token read as [UNK]. A real process, killed inside the one write of vocab.txt (the save writes each file
    beside its name, and renames those whose bytes changed when all are written: `bertkit.data.atomic.saving`):
    the old file, byte for byte, and the old model with it (its weights had been replaced before vocab.txt was
    written: a mix of two saves)."""
    import shutil

    import bertkit

    out = tmp_path / "model"
    shutil.copytree(classifier, out)
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE.format(tests=str(Path(__file__).parent), out=str(out))],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -9, done.stderr
    assert (out / "vocab.txt").read_bytes() == old["vocab.txt"]  # was: its first 100,000 bytes, 12,000 tokens
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.endswith((".tmp", ".lock"))} == old
    assert len(bertkit.load(str(out)).tokenizer) == 30522


@pytest.mark.parametrize("saver, name, nbytes", [
    (model_saver, "config.json", 200), (model_saver, "vocab.txt", 1000), (model_saver, "tokenizer_config.json", 50),
    (static_saver, "modules.json", 40), (static_saver, "config_sentence_transformers.json", 20),
    (static_saver, "0_StaticEmbedding/tokenizer.json", 100)])
def test_a_model_folder_saved_on_a_full_disk_keeps_each_file_whole(classifier, tmp_path, monkeypatch, saver, name,
                                                                   nbytes):
    """The same save failing after a partial write (ENOSPC, a full disk, in this process): each file of a model
    folder is the one that stood there, byte for byte (a static folder's modules.json too; the weights too,
    replaced before the failing file was written, until a save's files were renamed together when all were
    written: `bertkit.data.atomic.saving`), and nothing is left beside them."""
    import builtins
    import io
    import shutil

    from killed_write import stopping_open

    out = tmp_path / "model"
    save = saver(out)
    save()
    if saver is model_saver:  # another model was there before: the classifier fixture's
        shutil.rmtree(out)
        shutil.copytree(classifier, out)
    old = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(builtins, "open", stopping_open(Path(name).name, nbytes, None, io.open))
    monkeypatch.setattr(io, "open", builtins.open)
    with pytest.raises(OSError, match="No space left"):
        save()
    monkeypatch.undo()
    assert (out / name).read_bytes() == old[Path(name)]  # was: its first nbytes bytes
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == old


def test_a_runs_dev_predictions_on_a_full_disk_are_whole_or_the_old_ones(tmp_path, monkeypatch):
    """finetune classify/pair/... and ner stream their dev predictions into the output folder at the end of a run:
    a kill or a full disk there left the first k rows, a file that read as whole (fewer dev rows than the dev
    set). Now the table is written whole or the one that stood there stays, byte for byte."""
    import builtins
    import io
    from types import SimpleNamespace

    from killed_write import stopping_open
    from bertkit.tasks.classification import write_predictions
    from bertkit.tasks.ner import write_conll

    examples = [SimpleNamespace(text=f"text {i}", text_pair=None, label="pos") for i in range(50)]
    preds = [{"label": "neg", "probabilities": {"neg": 0.75, "pos": 0.25}}] * 50
    sentences = [SimpleNamespace(words=["a", "cat"], tags=["O", "B-ANIMAL"]) for _ in range(50)]
    writes = {"dev_predictions.tsv": lambda p: write_predictions(p, examples, preds, "single_label_classification"),
              "dev_predictions.conll": lambda p: write_conll(p, sentences, [["O", "B-ANIMAL"]] * 50, "iob2")}
    for name, write in writes.items():
        out = tmp_path / name
        out.write_bytes(OLD)
        monkeypatch.setattr(builtins, "open", stopping_open(name, 300, None, io.open))
        monkeypatch.setattr(io, "open", builtins.open)
        with pytest.raises(OSError, match="No space left"):
            write(out)
        monkeypatch.undo()
        assert out.read_bytes() == OLD  # was: its first 300 bytes
        write(out)
        assert out.read_text(encoding="utf-8").count("\n") == (51 if name.endswith(".tsv") else 150)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(writes)


@pytest.mark.parametrize("command, name", [("sts", "sts.json"), ("mine", "report.json")])
def test_a_report_on_a_full_disk_is_whole_or_the_old_one(tiny_dir, tmp_path, monkeypatch, capsys, command, name):
    """evaluate sts/retrieval --output and mine --report wrote their JSON of figures in place at the end of the
    run: a full disk (or a kill) there left the first bytes of it at its name. Now the report that stood there
    stays, byte for byte, nothing is left beside it, and the next run writes it whole."""
    import builtins
    import io
    import json

    from killed_write import stopping_open
    from bertkit.cli import main

    data = tmp_path / "data.tsv"
    if command == "sts":
        data.write_text("sentence1\tsentence2\tscore\n" + "".join(f"a cat {i}\ta dog {i % 3}\t{i % 5}\n"
                                                                for i in range(12)), encoding="utf-8")
        argv = ["evaluate", "sts", str(data), "--model", str(tiny_dir), "--output"]
    else:
        data.write_text("anchor\tpositive\n" + "".join(f"question {i} about cats\tanswer {i} on a mat\n"
                                                       for i in range(12)), encoding="utf-8")
        argv = ["mine", str(data), "-o", str(tmp_path / "mined.tsv"), "--model", str(tiny_dir), "--num-negatives",
                "1", "--relative-margin", "0", "--quiet", "--report"]
    out = tmp_path / name
    out.write_bytes(OLD)
    monkeypatch.setattr(builtins, "open", stopping_open(name, 20, None, io.open))
    monkeypatch.setattr(io, "open", builtins.open)
    assert main([*argv, str(out)]) == 2
    monkeypatch.undo()
    err = capsys.readouterr().err.splitlines()  # one line naming the report (tests/test_machine_refuses.py)
    assert f"bertkit: error: {out}: No space left on device (the disk is full" in err[-1] and "Traceback" not in err
    assert out.read_bytes() == OLD  # was: its first 20 bytes
    assert not list(tmp_path.glob(name + ".*"))
    assert main([*argv, str(out)]) == 0
    assert set(json.loads(out.read_text(encoding="utf-8"))) >= ({"spearman"} if command == "sts" else {"rows"})
