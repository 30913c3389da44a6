"""Checkpoint files: atomic writes, keep-last-K, RNG round trips."""

import pickle
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
    # an error removes the half-written file (data.atomic); one a kill leaves under its temporary name is never
    # picked up
    assert not (tmp_path / "checkpoints" / "step-00000002.pt.tmp").exists()
    assert not (tmp_path / "checkpoints" / "step-00000002.pt").exists()
    (tmp_path / "checkpoints" / "step-00000003.pt.tmp").write_bytes(b"PK\x03\x04 cut short by SIGKILL")
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


def test_rng_states_round_trip_through_a_checkpoint_and_leave_pythons_and_numpys_alone(tmp_path):
    """A checkpoint keeps the generator training draws from: torch's (dropout, dynamic masks, ELECTRA's samples;
    every other draw in bertkit goes through a seeded random.Random or numpy Generator of its own, rebuilt from
    the seed and the position). It kept Python's and NumPy's global states too, which nothing seeds or draws from,
    and a resume set them back to the checkpoint's: a notebook's own draws after resuming a run in-process were
    rewound. Now they are not saved and a resume leaves them as they were; a checkpoint an older bertkit wrote,
    which holds them (tensors and numbers), still resumes, its torch state restored."""
    torch.manual_seed(1)
    state = ts.capture_rng()
    assert set(state) == {"torch", "cuda"}
    ts.save_checkpoint(tmp_path, 1, {"rng": [state]})
    expected = torch.rand(3)
    version, mt, gauss = random.getstate()  # the older file's extra entries, as it wrote them
    npy = np.random.get_state(legacy=False)
    older = {**state, "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss_next": gauss},
             "numpy": {"key": torch.from_numpy(npy["state"]["key"].astype(np.int64)), "pos": npy["state"]["pos"],
                       "has_gauss": npy["has_gauss"], "gauss": npy["gauss"]}}
    ts.save_checkpoint(tmp_path, 2, {"rng": [older]})
    for step in (1, 2):
        random.seed(99), np.random.seed(99), torch.manual_seed(99)  # the caller's own generators, then a resume
        ts.restore_rng(ts.load_checkpoint(tmp_path / "checkpoints" / f"step-0000000{step}.pt")["rng"][0])
        assert torch.equal(torch.rand(3), expected)
        assert random.random() == random.Random(99).random()  # was: the checkpoint's state, rewound
        assert np.random.rand() == np.random.RandomState(99).rand()


class Payload:
    """What a hostile checkpoint would hold: unpickling it creates the file `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_checkpoint_that_would_run_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "run" / "checkpoints" / "step-00000001.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(2)}, "rng": [Payload(marker)]}, path)
    with pytest.raises(BertkitError, match=r"refusing to read checkpoint .*step-00000001\.pt.*io\.open"):
        ts.load_checkpoint(path)
    with pytest.raises(BertkitError, match="step-00000001.pt"):  # the way --resume reads it
        ts.resume_state(tmp_path / "run", num_instances=1, world_size=1)
    assert not marker.exists()
    # a plain pickle stream (no torch zip) is refused too
    raw = path.with_name("step-00000002.pt")
    raw.write_bytes(pickle.dumps({"rng": Payload(marker)}, protocol=2))
    with pytest.raises(BertkitError, match="step-00000002.pt"):
        ts.load_checkpoint(raw)
    assert not marker.exists()
    # the control: the payload is live, loading as before (weights_only=False) runs it
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_training_state_reads_back_with_weights_only(tmp_path):
    # what the loops save: RNG states, optimizer moments, numpy numbers in a fine-tuning history
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    history = [{"epoch": 1, "accuracy": np.float64(0.75), "counts": np.array([3, 1])}]
    ts.save_checkpoint(tmp_path, 4, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                     "rng": [ts.capture_rng()], "finetune": {"history": history}})
    state = torch.load(ts.latest_checkpoint(tmp_path), weights_only=True)  # no error: nothing but plain data
    assert state["step"] == 4 and state["finetune"]["history"][0]["accuracy"] == 0.75
    assert type(state["finetune"]["history"][0]["accuracy"]) is float
    assert torch.equal(state["finetune"]["history"][0]["counts"], torch.tensor([3, 1]))
    assert all(torch.equal(a, b) for a, b in zip(state["model"].values(), model.state_dict().values()))
    assert state["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]
    with pytest.raises(TypeError, match=r"state\['odd'\] is a set"):
        ts.save_checkpoint(tmp_path, 5, {"odd": {1, 2}})


def test_a_resumed_run_rewriting_its_settings_on_a_full_disk_keeps_them(tmp_path, monkeypatch):
    """A resumed run writes run_config.json again over the one it read (the harness, `save_run_config`): written
    in place, a kill or a full disk in that write left the file cut, and no `--resume` could continue the run.
    Now the settings that stood there stay, byte for byte, and nothing is left beside them."""
    import builtins
    import io

    from killed_write import stopping_open

    settings = {"train": "train.tsv", "model": "tiny", "training": {"epochs": 2.0, "resume": True}}
    ts.save_run_config(tmp_path, settings)
    before = (tmp_path / "run_config.json").read_bytes()
    monkeypatch.setattr(builtins, "open", stopping_open("run_config.json", 30, None, io.open))
    monkeypatch.setattr(io, "open", builtins.open)
    with pytest.raises(OSError, match="No space left"):
        ts.save_run_config(tmp_path, {**settings, "training": {"epochs": 3.0, "resume": True}})
    monkeypatch.undo()
    assert (tmp_path / "run_config.json").read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [
        "run_config.json"]
