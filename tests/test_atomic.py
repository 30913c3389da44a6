"""bertkit.data.atomic: a file is replaced whole or not at all."""

import json

import pytest

from bertkit.data.atomic import replace_atomically, write_json


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "index.json"
    write_json(path, {"passages": 3, "model": "caf\u00e9"})
    before = path.read_bytes()

    def half(f):  # a crash (here an exception) after half the bytes
        f.write(b'{"passages": 4, "mod')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_atomically(path, half)
    assert path.read_bytes() == before and json.loads(before) == {"passages": 3, "model": "caf\u00e9"}
    write_json(path, {"passages": 5})  # the leftover .tmp is simply written over by the next write
    assert json.loads(path.read_text()) == {"passages": 5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]


def test_json_as_json_dumps_writes_it_in_a_new_folder(tmp_path):
    data = {"name": "\u00e9t\u00e9", "sizes": [1, 2.5, None]}
    write_json(tmp_path / "a" / "b.json", data)
    assert (tmp_path / "a" / "b.json").read_text(encoding="utf-8") == json.dumps(data, indent=2) + "\n"
    write_json(tmp_path / "c.json", data, ensure_ascii=False)
    assert (tmp_path / "c.json").read_text(encoding="utf-8") == json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def test_a_nan_is_refused_naming_the_file_and_where_it_sits(tmp_path):
    """write_json allowed NaN by default: a NaN reached the file as Python's token `NaN` (or `Infinity`), which
    strict JSON readers (jq, JavaScript's JSON.parse) refuse. It is refused now, naming the file and the
    value's place, before the file is touched; a caller that means it says allow_nan=True."""
    path = tmp_path / "metrics.json"
    write_json(path, {"old": 1})
    with pytest.raises(ValueError, match=r"metrics\.json: dev\.pearson is nan"):
        write_json(path, {"dev": {"mse": 1.0, "pearson": float("nan")}})
    with pytest.raises(ValueError, match=r"metrics\.json: epochs\[1\]\.loss is -inf"):
        write_json(path, {"epochs": [{"loss": 1.0}, {"loss": float("-inf")}]})
    assert json.loads(path.read_text()) == {"old": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    write_json(path, {"x": float("nan")}, allow_nan=True)
    assert path.read_text() == '{\n  "x": NaN\n}\n'
    write_json(path, {"x": None, "y": [1.5]})  # null and finite numbers as ever
    assert json.loads(path.read_text()) == {"x": None, "y": [1.5]}


def test_a_path_writer_that_fails_leaves_the_old_file_and_no_tmp(tmp_path):
    from bertkit.data.atomic import write_through

    path = tmp_path / "graph.faiss"
    write_through(path, lambda tmp: tmp.write_bytes(b"first"))
    assert path.read_bytes() == b"first"

    def half(tmp):  # a library that wrote part of its file, then failed
        tmp.write_bytes(b"sec")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_through(path, half)
    assert path.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.faiss"]


def test_weights_saved_over_a_model_are_whole_or_the_old_ones(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    import bertkit.model.checkpoint as checkpoint

    path = tmp_path / "model.safetensors"
    checkpoint.save_tensors(path, {"w": torch.arange(4.0)}, {"format": "pt"})
    real_save = checkpoint.save_file

    def cut_short(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:  # half the file on disk when the kill comes
            f.truncate(20)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", cut_short)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_tensors(path, {"w": torch.zeros(4)}, {"format": "pt"})
    assert torch.equal(load_file(path)["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_saved_weights_get_the_mode_any_new_file_gets(tmp_path):
    """safetensors' save_file replaces the file it writes with one only its owner can read (0600), whatever the
    umask: a model folder saved by one user could not be served by another (a service account, a teammate)."""
    import os
    import stat

    import torch

    from bertkit.model.checkpoint import save_tensors

    old = os.umask(0o022)
    try:
        (tmp_path / "plain.txt").write_text("x")  # what the umask gives any new file: the reference
        save_tensors(tmp_path / "model.safetensors", {"w": torch.arange(4.0)}, {"format": "pt"})
    finally:
        os.umask(old)
    expected = stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
    assert expected == 0o644
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == expected


WRITER = ("import sys\nfrom bertkit.data.atomic import replace_atomically\n"
          "def write(f):\n    f.write(b'A' * 1000)\n    f.flush()\n    print('writing', flush=True)\n"
          "    sys.stdin.readline()\n    f.write(b'A' * 1000)\n"
          "replace_atomically(sys.argv[1], write)\n")


def test_a_second_writer_of_one_file_is_refused_while_the_first_writes(tmp_path, tiny_dir, capsys):
    # two processes writing one file shared NAME.tmp: the second truncated the first's half-written file
    # and wrote into it, the first renamed it over NAME (and said it had written its own), the second died
    # on the vanished NAME.tmp with a traceback. Now the second is refused before it writes anything.
    import os
    import subprocess
    import sys
    from pathlib import Path

    from bertkit.cli import main

    root = Path(__file__).resolve().parent.parent
    path = tmp_path / "v.npy"
    first = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert first.stdout.readline().strip() == "writing"
        with pytest.raises(BlockingIOError, match="is being written by another process right now"):
            replace_atomically(path, lambda f: f.write(b"B" * 10))
        (tmp_path / "t.txt").write_text("one line\n")
        assert main(["embed", str(tmp_path / "t.txt"), "-o", str(path), "--model", str(tiny_dir), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"bertkit: error: {path} is being written by another process" in err, err
    finally:
        first.communicate("go\n", timeout=30)
    assert first.returncode == 0
    assert path.read_bytes() == b"A" * 2000  # the first writer's file, whole
    replace_atomically(path, lambda f: f.write(b"B" * 10))  # it is done: the next write goes through
    assert path.read_bytes() == b"B" * 10 and sorted(p.name for p in tmp_path.iterdir()) == ["t.txt", "v.npy"]


def test_a_second_writer_of_one_weights_file_is_refused_while_the_first_writes(tmp_path):
    """safetensors' save_file puts a new file at the path it is given: the flock the first writer held on
    NAME.tmp was on the file save_file replaced, so a second writer of model.safetensors (two runs saving into
    one folder) locked the new NAME.tmp and wrote over the first's weights before they were renamed into place.
    The lock is on a file no library replaces now: the second is refused, the first's weights land whole."""
    import torch
    from safetensors.torch import load_file, save_file

    from bertkit.data.atomic import write_through

    path = tmp_path / "model.safetensors"

    def first(tmp):
        save_file({"w": torch.ones(3)}, str(tmp))  # NAME.tmp is save_file's new file from here on
        with pytest.raises(BlockingIOError, match="is being written by another process right now"):
            write_through(path, lambda t: save_file({"w": torch.zeros(3)}, str(t)))

    write_through(path, first)
    assert load_file(str(path))["w"].tolist() == [1.0, 1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_a_folder_saved_as_one_is_refused_after_a_stop_between_renames_until_each_stopped_file_is_saved(
        tmp_path, monkeypatch):
    """`saving`: a stop between two renames (here the second rename fails) leaves the folder refused in one line
    (`check_whole`); a later save of only some other file (a tokenizer's alone) keeps it refused, since the files
    the stopped save was replacing may still be of two saves; a save that writes them makes it whole again."""
    import os

    from bertkit.data.atomic import SAVING_MARKER, check_whole, saving
    from bertkit.errors import BertkitError

    for name in ("config.json", "weights", "vocab.txt"):
        write_json(tmp_path / name, {"save": 1})
    real, renamed = os.replace, []

    def replace(src, dst):
        if os.path.basename(dst) != SAVING_MARKER:
            if len(renamed) == 1:
                raise OSError("stopped")  # a kill here, in a real process
            renamed.append(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="stopped"), saving(tmp_path):
        write_json(tmp_path / "config.json", {"save": 2})
        write_json(tmp_path / "weights", {"save": 2})
        write_json(tmp_path / "vocab.txt", {"save": 1})  # unchanged: not renamed
    monkeypatch.undo()
    saved = {name: json.loads((tmp_path / name).read_text()) for name in ("config.json", "weights")}
    assert sorted(saved.values(), key=str) == [{"save": 1}, {"save": 2}]  # one of each: a mix
    with pytest.raises(BertkitError, match="stopped part way") as err:
        check_whole(tmp_path)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)
    with saving(tmp_path):
        write_json(tmp_path / "vocab.txt", {"save": 3})
    with pytest.raises(BertkitError, match="stopped part way"):
        check_whole(tmp_path)
    monkeypatch.chdir(tmp_path.parent)  # a folder named relative to the current one (`--output model/`)
    with saving(tmp_path.name):
        for name in ("config.json", "weights"):
            write_json(f"{tmp_path.name}/{name}", {"save": 3})
    check_whole(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "vocab.txt", "weights"]
