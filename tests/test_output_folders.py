"""Output folders (issue 38, items 3 and 4): no silent overwrite, one writer at a time.

finetune into a folder that holds a model is refused in one line and the folder is left byte for
byte as it was; --overwrite replaces it and leaves no stale file of the old model (its modules.json);
`--model X -o X` is refused even with --overwrite. The lock (`bertkit.data.lock`) is tested with
real processes: a holder process makes `bertkit index`, `finetune` and `pretrain run` refuse the
folder naming its pid; killed with SIGKILL it leaves a stale lock that the next writer takes over;
and the issue's race, two `bertkit index` runs into one folder, ends with one refused in one line and
the other's index whole (its own passages and vectors).
"""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_finetune import sentiment_rows, tiny_model_dir, write_tsv
from test_index import make_tiny, scifact_corpus

from bertkit.cli import main
from bertkit.data.lock import LOCK_FILE, folder_lock
from bertkit.data.outputs import check_output
from bertkit.errors import BertkitError
from bertkit.model.sentence_layout import write_layout
from bertkit.retrieval.index import open_index

ROOT = Path(__file__).resolve().parent.parent


def bertkit(*args, wait=True):
    command = [sys.executable, "-m", "bertkit.cli", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stderr


def digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    tiny = tiny_model_dir(root / "tiny")
    train = write_tsv(root / "train.tsv", ["sentence", "label"], sentiment_rows(16, random.Random(0)))
    return {"root": root, "tiny": tiny, "train": train}


def finetune(made, out, *flags):
    return main(["finetune", "classify", "--train", str(made["train"]), "--model", str(made["tiny"]), "-o", str(out),
                 "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--no-progress", *flags])


# --- item 3: no silent overwrite -------------------------------------------------------------------

def test_finetune_into_a_model_folder_is_refused_and_overwrite_replaces_it_whole(made, tmp_path, capsys):
    existing = tmp_path / "existing"
    import shutil

    shutil.copytree(made["tiny"], existing)
    write_layout(existing, pooling="cls", normalize=True, max_seq_length=16, hidden_size=32)  # a sentence model
    before = digest(existing)
    assert finetune(made, existing) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a model (config.json, model.safetensors" in err and \
        "--overwrite" in err, err
    assert digest(existing) == before  # nothing touched
    assert finetune(made, existing, "--overwrite") == 0
    assert not (existing / "modules.json").exists() and not (existing / "1_Pooling").exists()
    assert (existing / "bertkit_task.json").is_file() and digest(existing)["model.safetensors"] != \
        before["model.safetensors"]
    assert not (existing / LOCK_FILE).exists()


def test_model_and_output_the_same_folder_is_refused(made, capsys):
    before = digest(made["tiny"])
    for flags in ([], ["--overwrite"]):
        assert finetune(made, made["tiny"], *flags) == 2
        assert "is the folder the model is read from" in capsys.readouterr().err
    assert digest(made["tiny"]) == before
    with pytest.raises(BertkitError, match="is the folder the model is read from"):
        check_output(Path(made["tiny"]) / ".." / made["tiny"].name, overwrite=True, sources=[made["tiny"]])


def test_no_model_given_and_output_the_default_models_folder_is_refused(made, tmp_path, monkeypatch, capsys):
    # no --model is the default model: its folder as -o was no source (None was skipped), so --overwrite
    # cleared the installed model. A copy stands in for it: a package of that name whose model/ is the copy
    import shutil

    default = shutil.copytree(made["tiny"], tmp_path / "stand_in" / "model")
    (tmp_path / "stand_in" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("bertkit.default_model.DEFAULT_MODEL_PACKAGE", "stand_in")
    from bertkit.default_model import default_model_dir
    assert default_model_dir().resolve() == default.resolve()
    before = digest(default)
    (tmp_path / "s.txt").write_text("a b\n")
    for command in (["finetune", "classify", "--train", str(made["train"]), "--max-length", "16", "--no-progress"],
                    ["distill", "layers", "--keep", "1", "--data", str(tmp_path / "s.txt"), "--no-progress"],
                    ["distill", "static", "--quiet"]):
        assert main([*command, "-o", str(default), "--overwrite"]) == 2, command
        err = capsys.readouterr().err
        assert "is the folder the model is read from" in err or "is the folder of the model being distilled" in err, err
        assert digest(default) == before, command



def test_pretraining_into_its_data_folder_names_the_data(tmp_path, capsys):
    # `pretrain run DATA -o DATA` was refused as "the folder the model is read from": there was no model
    data = tmp_path / "data"
    data.mkdir()
    assert main(["pretrain", "run", str(data), "-o", str(data), "--overwrite"]) == 2
    assert capsys.readouterr().err == (f"bertkit: error: --output {data} is the folder the prepared data is read "
                                       "from: the job would overwrite its own source; write to another --output\n")
    assert list(data.iterdir()) == []


def test_a_run_folder_needs_resume_or_overwrite(made, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    assert finetune(made, run) == 2
    assert "already holds a run (metrics.jsonl): pass --overwrite to replace it, --resume to continue its run" in \
        capsys.readouterr().err


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertkit: error: ") and "Traceback" not in err, err
    return err


def test_an_output_that_is_an_input_is_refused_before_the_model_loads(tmp_path, capsys):
    # the sweep: `embed x.jsonl -o x.jsonl` emptied x.jsonl and exited 0; predict, evaluate sts, mine and vocab
    # train wrote over their input too. --model names no folder: had it been looked at first, the error
    # would be about the model.
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "the movie was good"}\n')
    table = tmp_path / "pairs.tsv"
    table.write_text("anchor\tpositive\na cat\ta kitten\n")
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    missing = str(tmp_path / "no-model")
    cases = [(["embed", texts, "-o", texts, "--model", missing], texts, "--output"),
             (["predict", missing, table, "-o", table], table, "--output"),
             (["evaluate", "sts", table, "--output", table, "--model", missing], table, "--output"),
             (["mine", table, "-o", tmp_path / "mined.tsv", "--report", table, "--model", missing], table, "--report"),
             (["vocab", "train", texts, "-o", texts], texts, "--output")]
    for argv, victim, flag in cases:
        before = victim.read_bytes()
        assert main([str(a) for a in argv]) == 2
        assert f"{flag} {victim} is a file this command reads" in one_error(capsys)
        assert victim.read_bytes() == before
    qrels = beir / "qrels" / "test.tsv"
    before = qrels.read_bytes()
    assert main(["mine", str(beir), "--split", "test", "-o", str(qrels), "--model", missing]) == 2
    assert f"is a file in {beir.resolve()}, a folder this command reads" in one_error(capsys)
    assert qrels.read_bytes() == before and not (tmp_path / "mined.tsv").exists()


def test_a_file_where_a_folder_goes_and_the_reverse_fail_first_in_one_line(made, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me\n")
    missing = str(tmp_path / "no-model")
    # finetune, export, pretrain run and index raised FileExistsError (a traceback) after loading
    for argv in (["finetune", "classify", "--train", made["train"], "--model", missing, "-o", a_file],
                 ["export", "onnx", missing, "-o", a_file],
                 ["pretrain", "run", tmp_path / "no-data", "-o", a_file],
                 ["index", made["train"], "-o", a_file, "--model", missing]):
        assert main([str(a) for a in argv]) == 2
        assert f"--output {a_file} is a file, not a folder" in one_error(capsys)
    assert a_file.read_text() == "keep me\n"
    # evaluate and mine failed with "[Errno 21] Is a directory" only after embedding everything
    for argv in (["evaluate", "sts", made["train"], "--output", tmp_path, "--model", missing],
                 ["mine", made["train"], "-o", tmp_path, "--model", missing],
                 ["predict", missing, made["train"], "-o", tmp_path]):
        assert main([str(a) for a in argv]) == 2
        assert f"--output {tmp_path} is a folder: name the file to write" in one_error(capsys)
    # a file in a folder that does not exist: "[Errno 2] No such file or directory" once the work was done
    # (embed makes the folders itself); a teacher cache that is a folder: "[Errno 21]" after the teacher ran
    nowhere = tmp_path / "no" / "r.json"
    for argv, flag in ((["evaluate", "sts", made["train"], "--model", missing, "--output", nowhere], "--output"),
                       (["mine", made["train"], "-o", tmp_path / "m.tsv", "--model", missing, "--report", nowhere],
                        "--report")):
        assert main([str(a) for a in argv]) == 2
        assert f"{flag} {nowhere}: the folder {nowhere.parent} does not exist; make it first" in one_error(capsys)
    assert main(["distill", "static", missing, "-o", str(tmp_path / "static"), "--teacher-cache", str(tmp_path)]) == 2
    assert f"--teacher-cache {tmp_path} is a folder: name the file to write" in one_error(capsys)
    assert not (tmp_path / "no").exists() and not (tmp_path / "static").exists()
    # a text argument longer than a file name may be is no path: the output check's Path.exists raised OSError
    assert main(["search", str(tmp_path / "no-index"), "word " * 200]) == 2
    assert "is not an index" in one_error(capsys)
    assert main(["attention", "word " * 200, "-o", str(tmp_path / "a.html"), "--model", missing]) == 2
    assert f"no model directory at {missing}" in one_error(capsys)
    # attention --png with a suffix matplotlib cannot write: a ValueError traceback after the model ran
    assert main(["attention", "hello", "--png", str(tmp_path / "view.txt"), "--model", missing]) == 2
    assert "name the picture .png" in one_error(capsys)


# --- item 4: one writer per folder, with real processes -----------------------------------------------

HOLD = ("import sys, time\nfrom bertkit.data.lock import folder_lock\nwith folder_lock(sys.argv[1], 'the holder'):\n"
        "    print('locked', flush=True)\n    time.sleep(120)\n")


def holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture(scope="module")
def corpora(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("race")
    return {"model": make_tiny(root / "tiny"),
            "a": scifact_corpus(shared_data, root / "a.jsonl", n=40, first=0),
            "b": scifact_corpus(shared_data, root / "b.jsonl", n=3, first=100)}


def test_a_held_folder_is_refused_by_index_finetune_and_pretrain(made, corpora, tmp_path):
    folder = tmp_path / "held"
    proc = holder(folder)
    try:
        for args in (["index", corpora["b"], "-o", folder, "--model", corpora["model"], "--quiet"],
                     ["finetune", "classify", "--train", made["train"], "--model", made["tiny"], "-o", folder,
                      "--epochs", "1", "--no-progress"],
                     ["pretrain", "run", tmp_path / "data", "-o", folder, "--config", "tiny"]):
            status, err = bertkit(*args)
            assert status == 2 and err.count("\n") == 1, err
            assert f"is being written by process {proc.pid} (the holder, since" in err, err
    finally:
        proc.kill()
        proc.wait()
    assert (folder / LOCK_FILE).is_file()  # SIGKILL: the file stays, its flock is gone with the process
    status, err = bertkit("index", corpora["b"], "-o", folder, "--model", corpora["model"], "--quiet",
                          "--passage-tokens", 32)
    assert status == 0, err
    assert f"took over a stale lock of process {proc.pid} (the holder" in err
    assert open_index(folder).info["documents"] == 3 and not (folder / LOCK_FILE).exists()


def _holds(lock_file, pid: int) -> bool:
    """Whether process `pid` holds the folder lock whose file is `lock_file` (it writes its pid once it does)."""
    try:
        return lock_file.read_text().split(" ", 1)[0] == str(pid)
    except FileNotFoundError:
        return False


def test_two_index_runs_into_one_folder_one_is_refused_the_other_is_whole(corpora, tmp_path):
    folder = tmp_path / "race"
    first = bertkit("index", corpora["a"], "-o", folder, "--model", corpora["model"], "--quiet",
                    "--passage-tokens", 32, wait=False)
    deadline = time.monotonic() + 60
    # held, not only there: the file appears before its lock is taken, and its holder's pid is written after
    # (a first run stopped between the two let the second build the index, under load in CI)
    while not _holds(folder / LOCK_FILE, first.pid):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    first.send_signal(signal.SIGSTOP)  # caught mid-build, however fast this machine is
    try:
        status, err = bertkit("index", corpora["b"], "-o", folder, "--model", corpora["model"], "--quiet",
                              "--passage-tokens", 32)
    finally:
        first.send_signal(signal.SIGCONT)
    out, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    assert status == 2 and err.count("\n") == 1 and f"is being written by process {first.pid}" in err, err
    status, err = bertkit("index", corpora["b"], "-o", folder, "--model", corpora["model"], "--quiet")
    assert status == 2 and "already holds a finished index: pass --overwrite" in err, err
    index = open_index(folder)  # whole: every check of index_check passes
    assert index.info["documents"] == 40
    ids = {p["doc_id"] for p in index.passages(range(len(index)))}
    import json

    assert ids == {json.loads(line)["_id"] for line in corpora["a"].read_text().splitlines()}


def test_lock_in_process_is_exclusive_and_released(tmp_path):
    folder = tmp_path / "new"
    with folder_lock(folder, "first"):
        assert (folder / LOCK_FILE).read_text().startswith(f"{os.getpid()} first, since ")
        with pytest.raises(BertkitError, match=f"is being written by process {os.getpid()} \\(first"):
            with folder_lock(folder, "second"):
                pass
    assert not folder.exists()  # created for the lock, left empty: removed
    with folder_lock(folder, "again"):
        (folder / "kept").write_text("x")
    assert (folder / "kept").is_file() and not (folder / LOCK_FILE).exists()


def test_sigterm_to_a_holder_releases_the_lock(tmp_path):
    folder = tmp_path / "t"
    proc = holder(folder)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    with folder_lock(folder, "next"):
        pass


def test_a_held_folder_is_refused_by_pretrain_prepare(tmp_path):
    # two `pretrain prepare` runs into one folder wrote each other's token shards, corpus and instances
    # there unlocked (each stage skips what "a previous run finished"): the manifest of one named the
    # inputs of one run over instances cut from the other's. A held folder is refused, naming the holder.
    (tmp_path / "a.txt").write_text("The first sentence is here. And a second one follows it.\n\nA new document.\n")
    folder = tmp_path / "data"
    proc = holder(folder)
    try:
        status, err = bertkit("pretrain", "prepare", tmp_path / "a.txt", "-o", folder, "--quiet")
    finally:
        proc.kill()
        proc.wait()
    assert status == 2 and err.count("\n") == 1, err
    assert f"is being written by process {proc.pid} (the holder, since" in err, err
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]  # nothing of the refused run was written


def test_vocab_train_and_pretrain_prepare_refuse_an_earlier_run_without_overwrite(tmp_path, capsys):
    """`vocab train` and `pretrain prepare` replaced what an earlier run wrote without a word: a second
    `vocab train other/ -o v/` wrote a new vocab.txt (and another casing) over the first, and a second
    `pretrain prepare other/ -o data/` rebuilt data/ from the other corpus under a run that trained on it.
    Both refuse in one line before any work, naming --overwrite, and leave the folder byte for byte; with
    --overwrite they write what a new folder gets."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"The {w} sat on the mat near door {i}. A second line follows it here.\n\n"
                              for i, w in enumerate(["cat", "dog", "owl", "fox"] * 5)))
    vocab = ["vocab", "train", str(corpus), "--vocab-size", "60", "--min-frequency", "1"]
    for out in (tmp_path / "v", tmp_path / "file" / "my.txt"):
        out.parent.mkdir(exist_ok=True)
        assert main([*vocab, "-o", str(out)]) == 0
        capsys.readouterr()
        before = digest(out.parent)
        assert main([*vocab, "-o", str(out), "--cased"]) == 2
        err = one_error(capsys)
        assert "already holds a vocabulary" in err and "pass --overwrite" in err, err
        assert digest(out.parent) == before
        assert main([*vocab, "-o", str(out), "--cased", "--overwrite"]) == 0
        assert digest(out.parent) != before
        capsys.readouterr()
    # another file in a folder with a vocabulary would replace its tokenizer_config.json (the casing)
    assert main([*vocab, "-o", str(tmp_path / "file" / "other.txt")]) == 2
    assert "tokenizer_config.json" in one_error(capsys)
    data = tmp_path / "data"
    prep = ["pretrain", "prepare", str(corpus), "-o", str(data), "--quiet", "--examples", "0",
            "--documents", "file", "--objective", "none", "--max-seq-length", "16", "--dupe-factor", "1"]
    assert main(prep) == 0
    capsys.readouterr()
    before = digest(data)
    assert main([*prep, "--seed", "3"]) == 2
    err = one_error(capsys)
    assert "already holds prepared pre-training data" in err and "pass --overwrite" in err, err
    assert digest(data) == before
    assert main([*prep, "--seed", "3", "--overwrite"]) == 0
    assert digest(data) != before
    (data / "manifest.json").unlink()  # an interrupted run is continued, as before
    assert main([*prep, "--seed", "3"]) == 0 and (data / "manifest.json").is_file()


def test_the_python_prepare_and_save_trained_vocab_refuse_an_earlier_run_as_the_cli_does(tmp_path):
    """`vocab train` and `pretrain prepare` refuse an earlier run's output without --overwrite, but the Python
    functions behind them (`save_trained_vocab`, `prepare`) still replaced it without a word: a notebook's second
    cell wrote another vocabulary (and casing) or rebuilt finished data from another corpus under a run training
    on it. Now they refuse in the same way, naming the folder and overwrite=True, and leave it byte for byte;
    overwrite=True replaces it; an interrupted prepare (no manifest.json) is still continued."""
    import dataclasses

    from bertkit.pretraining.prepare import PrepareConfig, prepare
    from bertkit.text.vocab_training import VocabTrainingConfig, save_trained_vocab, train_vocab

    lines = [f"The {w} sat on the mat near door {i}. A second line follows it here." for i, w in
             enumerate(["cat", "dog", "owl", "fox"] * 5)]
    small, cased = VocabTrainingConfig(vocab_size=60), VocabTrainingConfig(vocab_size=80, lowercase=False)
    for out in (tmp_path / "v", tmp_path / "file" / "my.txt"):
        save_trained_vocab(train_vocab(lines, small), out, small)
        before = digest(out.parent)
        with pytest.raises(BertkitError, match="overwrite=True") as refused:
            save_trained_vocab(train_vocab(lines, cased), out, cased)
        assert str(out.parent) in str(refused.value) and "already holds a vocabulary" in str(refused.value)
        assert digest(out.parent) == before
        path = save_trained_vocab(train_vocab(lines, cased), out, cased, overwrite=True)
        assert path.read_text().splitlines() == train_vocab(lines, cased) and digest(out.parent) != before
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(lines) + "\n")
    data = tmp_path / "data"
    cfg = PrepareConfig(documents="file", objective="none", max_seq_length=16, dupe_factor=1, workers=1)
    prepare([corpus], data, cfg, progress=False)
    before = digest(data)
    with pytest.raises(BertkitError, match="overwrite=True") as refused:
        prepare([corpus], data, dataclasses.replace(cfg, seed=3), progress=False)
    assert str(data) in str(refused.value) and "already holds prepared pre-training data" in str(refused.value)
    assert digest(data) == before
    prepare([corpus], data, dataclasses.replace(cfg, seed=3), progress=False, overwrite=True)
    assert digest(data) != before
    (data / "manifest.json").unlink()  # an interrupted run is continued, as before
    prepare([corpus], data, cfg, progress=False)
    assert (data / "manifest.json").is_file()
