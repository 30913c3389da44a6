"""`bertkit embed --resume`: a run stopped midway (SIGKILL, a full disk, Ctrl-C) goes on from the rows it wrote.

The rows of a chunk of texts depend on the chunk (its texts are sorted by length into batches), so a run
records a checkpoint after each chunk (OUT.resume.json) and a resume starts at the next chunk's first text:
the finished file must be byte for byte the one an uninterrupted run writes, for every output format. A
resume with another input, model or option is refused in one line naming the difference; a run without
--resume beside a killed run's rows refuses to throw them away; standard input cannot be read twice.

The command line's chunk is 1,024 texts; these tests make it 8 (`bertkit.cli.features.EMBED_CHUNK`, the value
it hands to iter_embed and to the writer), so that a few dozen texts make several checkpoints.
"""

import io
import json
import os
from pathlib import Path

import pytest

import bertkit.cli.features as embed_command
from bertkit.cli import main
from test_machine_refuses import file_size_limit, one_error_line

CHUNK = 8


@pytest.fixture
def chunked(monkeypatch):
    monkeypatch.setattr(embed_command, "EMBED_CHUNK", CHUNK)


def corpus(tmp_path: Path, n: int = 60) -> Path:
    """n texts of 5 to 11 words: the length sort reorders each chunk, so a resume that started at another text
    than a chunk's first would batch (and round) differently."""
    path = tmp_path / "texts.txt"
    path.write_text("".join(f"sentence number {i} about a {'big ' * (i * 7 % 6)}cat\n" for i in range(n)))
    return path


def embed(source, out, model, *flags) -> int:
    return main(["embed", str(source), "-o", str(out), "--model", str(model), "--quiet", *map(str, flags)])


def killed_in_a_fork(name: str, limit: int, *argv) -> int:
    """`bertkit ARGV` in a child forked from this process, SIGKILLed once `limit` bytes have gone out to the file
    NAME... (`killed_write.stopping_open`); returns its wait status. A fork, not a new interpreter: the child has
    torch, the model and the small chunk already (a new one spent seconds importing torch), and dies as a killed
    process does, its written bytes on the disk. The caller runs on one thread (`one_thread`): an OpenMP pool does
    not survive a fork (a child of a multi-threaded parent hung in its first parallel region), and the thread
    count decides the last bits of each vector (and the fast path), so the runs beside the child use one too. A
    child that hangs all the same is stopped after 60 s with SIGTERM, which the status tells apart."""
    import builtins
    import io
    import signal
    import time

    from killed_write import stopping_open

    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            builtins.open = io.open = stopping_open(name, limit, signal.SIGKILL, io.open)
            main(list(argv))
        finally:
            os._exit(3)  # not killed: the test fails on the status
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGTERM)  # hung (not SIGKILL: the status says so)
    return os.waitpid(pid, 0)[1]


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_killed_with_sigkill_and_resumed_writes_the_uninterrupted_file(tiny_dir, tmp_path, chunked, capsys,
                                                                      monkeypatch, one_thread):
    source = corpus(tmp_path)
    whole = tmp_path / "whole.npy"
    assert embed(source, whole, tiny_dir) == 0
    out = tmp_path / "v.npy"
    tmp, plan = tmp_path / "v.npy.tmp", tmp_path / "v.npy.resume.json"
    # 60 rows of 32 float32 (128 bytes each) after a header of 128: killed inside row 37, in the fifth chunk
    status = killed_in_a_fork(tmp.name, 128 + 36 * 128 + 64, "embed", str(source), "-o", str(out), "--model",
                              str(tiny_dir), "--quiet")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, status
    done = json.loads(plan.read_text())["done"]
    assert done["rows"] == 32 and tmp.stat().st_size > done["bytes"], done  # rows past the checkpoint: cut off
    size = tmp.stat().st_size
    capsys.readouterr()

    assert embed(source, out, tiny_dir) == 2  # was: NAME.tmp replaced, the killed run's rows thrown away
    line = one_error_line(capsys)
    assert "32 of 60 texts" in line and "--resume" in line, line
    assert embed(source, out, tiny_dir, "--resume", "--batch-size", 4) == 2
    line = one_error_line(capsys)
    assert "batch_size was 32 in the interrupted run and is 4" in line, line
    assert embed(source, out, tiny_dir, "--resume", "--layers", "first") == 2
    assert "layers was [2] in the interrupted run and is [0]" in one_error_line(capsys)  # resolved: 2 layers
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a text from a pipe\n")))
    assert embed("-", out, tiny_dir) == 2  # standard input, which keeps no record, would write over them too
    assert "32 of 60 texts" in one_error_line(capsys)
    assert tmp.stat().st_size == size and not out.exists()  # a refusal touches nothing

    assert embed(source, out, tiny_dir, "--resume") == 0
    assert "went on from the 32 texts" in capsys.readouterr().err
    assert out.read_bytes() == whole.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt", "v.npy", "whole.npy"]  # no record left


@pytest.mark.parametrize("name, pooling", [("v.safetensors", "none"), ("v.jsonl", "words"),
                                           ("v.safetensors", "mean")])
def test_a_full_disk_keeps_the_rows_and_resume_finishes_the_file(tiny_dir, tmp_path, chunked, capsys, name,
                                                                  pooling):
    """A file-size limit (a full disk's EFBIG) half-way: the line says --resume goes on, and it does. Per-token
    vectors need each text's row count for the .safetensors offsets written at the end (OUT.resume.lengths)."""
    source = corpus(tmp_path, 44)
    whole = tmp_path / f"whole{Path(name).suffix}"
    assert embed(source, whole, tiny_dir, "--pooling", pooling) == 0
    out = tmp_path / name
    with file_size_limit(whole.stat().st_size // 2):
        assert embed(source, out, tiny_dir, "--pooling", pooling) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bertkit: error: {out}: File too large") and "--resume goes on" in line, line
    assert (tmp_path / f"{name}.tmp").is_file() and not out.exists()  # was: NAME.tmp deleted, every row lost
    assert embed(source, out, tiny_dir, "--pooling", pooling, "--resume") == 0
    assert out.read_bytes() == whole.read_bytes()


def test_ctrl_c_keeps_the_rows_and_says_resume_goes_on(tiny_dir, tmp_path, chunked, capsys, monkeypatch):
    """Ctrl-C after 21 texts (two chunks recorded, a third begun): NAME.tmp was deleted with every row; now kept,
    and the line says --resume goes on. Before the first checkpoint it says nothing of --resume (nothing to go on
    from), and NAME.tmp goes as before."""
    import bertkit.embeddings.features as features

    source, out = corpus(tmp_path, 30), tmp_path / "v.jsonl"
    whole = tmp_path / "whole.jsonl"
    assert embed(source, whole, tiny_dir) == 0
    capsys.readouterr()
    real = features.iter_embed

    def interrupted_after(n):
        def iter_embed(*args, **kwargs):
            for i, row in enumerate(real(*args, **kwargs)):
                if i == n:
                    raise KeyboardInterrupt
                yield row
        return iter_embed

    monkeypatch.setattr(features, "iter_embed", interrupted_after(5))
    assert embed(source, out, tiny_dir) == 130
    assert capsys.readouterr().err.strip() == "bertkit: interrupted"
    assert not (tmp_path / "v.jsonl.tmp").exists()
    monkeypatch.setattr(features, "iter_embed", interrupted_after(21))
    assert embed(source, out, tiny_dir) == 130
    assert "--resume goes on" in capsys.readouterr().err
    monkeypatch.setattr(features, "iter_embed", real)
    assert embed(source, out, tiny_dir, "--resume") == 0
    assert "went on from the 16 texts" in capsys.readouterr().err
    assert out.read_bytes() == whole.read_bytes()


def test_resume_is_refused_in_one_line_where_nothing_can_go_on(tiny_dir, tmp_path, chunked, capsys, monkeypatch):
    source, out = corpus(tmp_path, 12), tmp_path / "v.npy"
    assert embed(source, out, tiny_dir, "--resume") == 2  # nothing there
    assert "no interrupted run" in one_error_line(capsys)
    assert embed(source, out, tiny_dir) == 0
    assert embed(source, out, tiny_dir, "--resume") == 2  # finished
    assert f"{out} is finished" in one_error_line(capsys)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a text\n")))
    assert embed("-", tmp_path / "w.npy", tiny_dir, "--resume") == 2
    assert "standard input" in one_error_line(capsys)


def interrupt(monkeypatch, after: int):
    """Ctrl-C raised through iter_embed after `after` texts (the module boundary embed calls it through)."""
    import bertkit.embeddings.features as features

    real = features.iter_embed

    def iter_embed(*args, **kwargs):
        for i, row in enumerate(real(*args, **kwargs)):
            if i == after:
                raise KeyboardInterrupt
            yield row
    monkeypatch.setattr(features, "iter_embed", iter_embed)
    return lambda: monkeypatch.setattr(features, "iter_embed", real)


# the defaults spelled out: a plain encoder (64 positions, 2 layers: windows of 64 sharing half of 62 tokens)
# and one with a sentence-transformers layout (mean, normalised, cut at 12 tokens); then a real difference
SPELLED = [(None, ["--layers", "-1", "--pooling", "mean", "--max-length", 64, "--stride", 31, "--no-truncate"],
            ["--max-length", 48], "max_length was 64 in the interrupted run and is 48"),
           (None, ["--layers", "2", "--pooling", "words", "--word-pooling", "mean"], ["--word-pooling", "first"],
            "word_pooling was 'mean' in the interrupted run and is 'first'"),
           ("mean", ["--pooling", "auto", "--normalize", "--max-length", 12, "--truncate", "--layers", "last"],
            ["--max-length", 11], "max_length was 12 in the interrupted run and is 11")]


@pytest.mark.parametrize("layout, spelled, other, named", SPELLED)
def test_a_default_spelled_out_on_resume_goes_on_and_a_real_difference_is_refused(
        tiny_dir, tmp_path, chunked, capsys, monkeypatch, layout, spelled, other, named):
    """The plan records what makes the vectors (the cut, the layers, the word pooling applied), not the options
    as typed: was refused ("max_length was None ... is 64") though the vectors are the same; the finished file
    is the uninterrupted run's."""
    import shutil

    from bertkit.model.sentence_layout import write_layout

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    if layout:
        write_layout(model, pooling=layout, normalize=True, max_seq_length=12, hidden_size=32)
    source, out, whole = corpus(tmp_path, 20), tmp_path / "v.jsonl", tmp_path / "whole.jsonl"
    words = ["--pooling", "words"] if "words" in spelled else []
    assert embed(source, whole, model, *words) == 0
    restore = interrupt(monkeypatch, 12)
    assert embed(source, out, model, *words) == 130
    restore()
    capsys.readouterr()
    assert embed(source, out, model, "--resume", *spelled, *other) == 2
    assert named in one_error_line(capsys)
    assert embed(source, out, model, "--resume", *spelled) == 0
    assert "went on from the 8 texts" in capsys.readouterr().err
    assert out.read_bytes() == whole.read_bytes()
