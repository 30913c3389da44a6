"""Every command that reads a user's file, fed bad files: one line and exit code 2, or success.

Issue 18: random bytes, an empty file, a directory, a Latin-1 file, a 1 MB line
and a truncated JSON/TSV go to `tokenize --vocab`, `vocab check`, `vocab train`,
`embed`, `predict`, `finetune` (every task) and `pretrain prepare`. Each call
must return 0 (the input was usable) or 2 with exactly one `bertkit: error:`
line, within a time limit, never a traceback. Files that are not UTF-8 must be
named with the byte offset of the first bad byte, except for corpora (`vocab
train`, `pretrain prepare`), which skip binary files and repair stray bytes,
counting both (see bertkit.data.textfiles). Most calls run `bertkit.cli.main`
in-process on a tiny model; a few run as real processes to show stderr.
"""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_finetune import VOCAB, sentiment_rows, tiny_model_dir, write_tsv

from bertkit.cli import main
from bertkit.data.textfiles import first_invalid_utf8

LIMIT_S = 60  # per call: the 1 MB inputs take a few seconds; a hang would take forever
KINDS = ("random", "empty", "directory", "latin1", "megaline", "truncated")
CORPUS_COMMANDS = ("vocab-train", "prepare")


def _bad_files(root: Path, suffix: str) -> dict:
    """One file (or folder) of each kind, named with `suffix` so the command reads it in that format."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    # ~1 MB in one line, of words longer than a word may be (100 characters), so each is one [UNK]:
    # every stage reads the whole megabyte, but the model runs on ~8,000 tokens, not 200,000
    words = " ".join("".join(rng.choice(VOCAB[5:-4]) for _ in range(30))[:120] for _ in range(8_500))
    good = {".txt": "the movie was good .\n" * 5, ".jsonl": '{"text": "the movie was good ."}\n' * 5,
            ".tsv": "sentence\tlabel\n" + "the movie was good .\tpos\n" * 5,
            ".json": json.dumps({"data": [{"title": "t", "paragraphs": [
                {"context": "john visited paris .", "qas": [
                    {"id": "1", "question": "who visited paris ?", "answers": [{"text": "john", "answer_start": 0}]}
                ]}]}]})}[suffix]
    files = {kind: root / f"{kind}{suffix}" for kind in KINDS}
    files["random"].write_bytes(bytes(rng.randrange(256) for _ in range(4000)))
    files["empty"].write_bytes(b"")
    files["directory"] = root / f"folder{suffix}.d"
    files["directory"].mkdir()
    latin1 = good.replace("good", "caf\u00e9 cr\u00e8me").replace("paris", "p\u00e2ris")
    files["latin1"].write_bytes(latin1.encode("latin-1"))
    files["megaline"].write_text(words + "\n", encoding="utf-8")
    files["truncated"].write_text(good[: len(good) * 2 // 3], encoding="utf-8")
    return files


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    tiny = tiny_model_dir(root / "tiny")
    train = write_tsv(root / "train.tsv", ["sentence", "label"], sentiment_rows(16, random.Random(0)))
    conll = root / "train.conll"
    conll.write_text("john NNP B-PER\nvisited VBD O\nparis NNP B-LOC\n\nmary NNP B-PER\nwent VBD O\n")
    models = {}
    for task, data in (("classify", train), ("ner", conll)):
        models[task] = root / f"model-{task}"
        assert main(["finetune", task, "--train", str(data), "-o", str(models[task]), "--model", str(tiny),
                     "--max-steps", "1", "--max-length", "48", "--no-progress"]) == 0
    files = {suffix: _bad_files(root / suffix.strip("."), suffix) for suffix in (".txt", ".jsonl", ".tsv", ".json")}
    return root, tiny, models, files


def _commands(root, tiny, models):
    """name -> (input suffix, argv with {} where the file goes)."""
    out = str(root / "out")
    (root / "out").mkdir(exist_ok=True)  # the cases that write a file in it may run first (pytest -k predict)
    # --overwrite: every case writes the same folder, over the model the case before left there
    train = ["-o", out, "--overwrite", "--model", str(tiny), "--max-steps", "1", "--max-length", "48", "--no-progress"]
    return {
        "tokenize": (".txt", ["tokenize", "hello", "--vocab", "{}"]),
        "vocab-check": (".txt", ["vocab", "check", "{}"]),
        "vocab-train": (".txt", ["vocab", "train", "{}", "-o", out + "/vocab.txt", "--vocab-size", "60"]),
        "embed-txt": (".txt", ["embed", "{}", "-o", out + "/v.npy", "--model", str(tiny), "--quiet"]),
        "embed-jsonl": (".jsonl", ["embed", "{}", "-o", out + "/v.npy", "--model", str(tiny), "--quiet"]),
        "embed-tsv": (".tsv", ["embed", "{}", "-o", out + "/v.npy", "--model", str(tiny), "--quiet"]),
        "predict-classify": (".tsv", ["predict", str(models["classify"]), "{}", "-o", out + "/p.tsv"]),
        "predict-ner": (".txt", ["predict", str(models["ner"]), "{}", "-o", out + "/p.tsv"]),
        "finetune-classify": (".tsv", ["finetune", "classify", "--train", "{}", *train]),
        "finetune-pair": (".tsv", ["finetune", "pair", "--train", "{}", "--text-pair-column", "sentence", *train]),
        "finetune-regression": (".tsv", ["finetune", "regression", "--train", "{}", *train]),
        "finetune-multi-label": (".tsv", ["finetune", "multi-label", "--train", "{}", "--label-column", "label",
                                          *train]),
        "finetune-ner": (".txt", ["finetune", "ner", "--train", "{}", *train]),
        "finetune-qa": (".json", ["finetune", "qa", "--train", "{}", "--doc-stride", "8", "--max-query-length", "8",
                                  *train]),
        "prepare": (".txt", ["pretrain", "prepare", "{}", "-o", out + "/data", "--vocab", str(tiny / "vocab.txt"),
                             "--quiet", "--dupe-factor", "1", "--examples", "0", "--max-seq-length", "32",
                             "--objective", "none"]),
    }


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _run(argv, capsys) -> tuple[int, str]:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        code = main(argv)
    except _Timeout:
        pytest.fail(f"no answer within {LIMIT_S} s: bertkit {' '.join(argv)}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err


def _error_lines(err: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").split("\n") if line.startswith("bertkit: error:")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["tokenize", "vocab-check", "vocab-train", "embed-txt", "embed-jsonl", "embed-tsv",
                                  "predict-classify", "predict-ner", "finetune-classify", "finetune-pair",
                                  "finetune-regression", "finetune-multi-label", "finetune-ner", "finetune-qa",
                                  "prepare"])
def test_bad_file_gets_one_line_or_success(setup, capsys, name, kind):
    root, tiny, models, files = setup
    suffix, argv = _commands(root, tiny, models)[name]
    path = files[suffix][kind]
    code, err = _run([str(path) if a == "{}" else a for a in argv], capsys)
    assert "Traceback" not in err
    assert code in (0, 2), err
    lines = _error_lines(err)
    if code == 2:
        assert len(lines) == 1, err
    else:
        assert not lines, err
    if kind == "empty":
        assert code == 2, "an empty file holds nothing to work on"
    if kind == "directory" and name not in CORPUS_COMMANDS and not name.startswith(("tokenize", "vocab-check")):
        assert code == 2 and "is a directory" in lines[0]
    if kind in ("random", "latin1") and name not in CORPUS_COMMANDS:
        # the one answer to non-UTF-8: the file, the byte offset of the first bad byte, the problem
        offset, _ = first_invalid_utf8(path)
        assert code == 2 and str(path) in lines[0] and "not UTF-8" in lines[0]
        assert f"offset {offset} " in lines[0]
    if kind == "random" and name in CORPUS_COMMANDS:
        assert code == 2 and "binary" in lines[0]  # skipped, and then nothing is left
    if kind == "megaline" and name in CORPUS_COMMANDS:
        assert code == 0  # a long line of plain text is a corpus


@pytest.mark.parametrize("argv", [
    ["embed", "{latin1}", "-o", "{out}/v.npy", "--quiet"],
    ["embed", "{directory}", "-o", "{out}/v.npy", "--quiet"],
    ["finetune", "classify", "--train", "{random}", "-o", "{out}/m", "--no-progress"],
    ["vocab", "check", "{random}"],
])
def test_real_process_prints_one_line_and_no_traceback(setup, argv):
    root, tiny, models, files = setup
    bad = files[".txt"]
    argv = [a.format(out=root / "out-proc", **{k: str(v) for k, v in bad.items()}) for a in argv]
    if argv[0] in ("embed", "finetune"):
        argv += ["--model", str(tiny)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "bertkit.cli", *argv], capture_output=True, text=True,
                          timeout=LIMIT_S, env=env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("bertkit: error:"), proc.stderr
