"""Checkpoint files: atomic writes, keep-last-K, RNG round trips."""

import random

import numpy as np
import pytest
import torch

import bertkit.training.state as ts
from bertkit.errors import BertkitError


def test_checkpoints_keep_only_the_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        ts.save_checkpoint(tmp_path, step, {"model": {"w": torch.tensor([float(step)])}}, keep=2)
    names = [p.name for p in ts.checkpoint_paths(tmp_path)]
    assert names == ["step-00000030.pt", "step-00000040.pt"]
    assert ts.load_checkpoint(ts.latest_checkpoint(tmp_path))["model"]["w"].item() == 40.0


def test_a_crash_while_writing_never_leaves_a_half_checkpoint(tmp_path, monkeypatch):
    ts.save_checkpoint(tmp_path, 1, {"model": {"w": torch.ones(3)}}, keep=3)

    real_save = torch.save

    def dying_save(obj, f):
        real_save(obj, f)
        f.truncate(10)  # the disk filled up / the process died mid-write
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError):
        ts.save_checkpoint(tmp_path, 2, {"model": {"w": torch.zeros(3)}}, keep=3)
    monkeypatch.undo()
    # the half-written file exists only under its temporary name, which is never picked up
    assert (tmp_path / "checkpoints" / "step-00000002.pt.tmp").exists()
    assert not (tmp_path / "checkpoints" / "step-00000002.pt").exists()
    latest = ts.latest_checkpoint(tmp_path)
    assert latest.name == "step-00000001.pt"
    assert torch.equal(ts.load_checkpoint(latest)["model"]["w"], torch.ones(3))


def test_a_corrupt_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "checkpoints" / "step-00000005.pt"
    path.parent.mkdir()
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(BertkitError, match="delete it to resume from the previous one"):
        ts.load_checkpoint(path)
    with pytest.raises(BertkitError, match="no checkpoint"):
        ts.load_checkpoint(tmp_path / "nope.pt")


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    ts.save_checkpoint(tmp_path, 1, {"rng": [ts.capture_rng()]})
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # disturb everything
    ts.restore_rng(ts.load_checkpoint(ts.latest_checkpoint(tmp_path))["rng"][0])
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
