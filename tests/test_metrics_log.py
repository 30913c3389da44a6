"""curves.png's training lines: labelled as what they draw (issue 41 item 10)."""

import numpy as np
import pytest

from bertkit.training.metrics_log import train_series


def test_a_short_run_draws_per_step_values_labelled_so():
    values = [float(v) for v in np.random.default_rng(0).random(60)]
    [(ys, label)] = train_series(values)  # 60 // 50 = a window of 1: no mean to draw
    assert ys == values and label == "train (per step)"


def test_a_long_run_draws_a_true_running_mean_and_says_its_window():
    values = np.random.default_rng(1).random(500)
    (raw, raw_label), (mean, label) = train_series(values)
    assert raw_label == "train (per step)" and list(raw) == list(values)
    assert label == "train (running mean of 10 steps)"
    # the reference: numpy's mean of the last 10 values (fewer at the start)
    expected = [values[max(0, i - 9): i + 1].mean() for i in range(len(values))]
    np.testing.assert_allclose(mean, expected, rtol=1e-9)
    assert np.std(mean[20:]) < 0.5 * np.std(values)  # smoother than the raw values: a mean, not a copy


def test_every_panel_spans_the_run_so_a_lone_evaluation_sits_where_it_happened(tmp_path, monkeypatch):
    """A one-epoch fine-tuning run: 94 training steps and one evaluation at step 94. The accuracy panel's axis
    ran from 89 to 99 around its one point, beside a loss panel from 0 to 94; every panel now spans the run."""
    import json

    import matplotlib.figure

    from bertkit.training.metrics_log import plot_curves

    records = [{"split": "train", "step": s, "loss": 1.0 / s, "lr": 1e-5} for s in range(1, 95)]
    records.append({"split": "eval", "step": 94, "accuracy": 0.79})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curves.png",
                [("loss", "training loss"), ("lr", "learning rate"), ("accuracy", "dev accuracy per epoch")])
    [fig] = drawn
    for ax in fig.axes:
        left, right = ax.get_xlim()
        assert left <= 1 and right >= 94 and right - left < 1.2 * 93, (ax.get_title(), left, right)


def test_resuming_after_a_full_disk_keeps_the_lines_before_the_checkpoint(tmp_path, monkeypatch):
    """A run stopped by a full disk in the middle of a metrics.jsonl line could not be resumed: resuming read every
    line back and died on the cut one (a JSONDecodeError traceback). And resuming rewrote the whole file in place,
    so a kill at that moment lost the run's history. Now the file is cut after the last line kept (steps up to the
    checkpoint): those lines stay byte for byte, the cut one goes with the lines after the checkpoint."""
    import builtins
    import io

    from killed_write import stopping_open
    from bertkit.training.metrics_log import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in range(1, 5):
        log({"split": "train", "step": step, "loss": 1.0 / step})
    before = path.read_bytes()
    monkeypatch.setattr(builtins, "open", stopping_open("metrics.jsonl", 20, None, io.open))  # the disk fills
    with pytest.raises(OSError, match="No space left"):
        log({"split": "train", "step": 5, "loss": 0.2})
    monkeypatch.undo()
    assert path.read_bytes().startswith(before) and len(path.read_bytes()) == len(before) + 20  # a cut line
    resumed = MetricsLog(path, keep_through_step=3)  # the checkpoint was at step 3
    assert path.read_bytes() == b"".join(before.splitlines(keepends=True)[:3])
    resumed({"split": "train", "step": 4, "loss": 0.3})
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]


def test_curves_drawn_on_a_full_disk_leave_the_old_picture(tmp_path, monkeypatch):
    """curves.png is drawn in the output folder at the end of a run, over the one an earlier run (or a resumed
    one) left: matplotlib wrote it in place, so a full disk or a kill there left a cut PNG that no viewer opens.
    Now the picture that stood there stays byte for byte, nothing beside it, and the next drawing is a whole PNG."""
    import builtins
    import io
    import json

    from PIL import Image

    from killed_write import stopping_open
    from bertkit.training.metrics_log import plot_curves

    records = [{"split": "train", "step": s, "loss": 1.0 / s} for s in range(1, 20)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    png = tmp_path / "curves.png"
    png.write_bytes(b"the picture an earlier run drew\n")
    monkeypatch.setattr(builtins, "open", stopping_open("curves.png", 500, None, io.open))
    monkeypatch.setattr(io, "open", builtins.open)
    with pytest.raises(OSError, match="No space left"):
        plot_curves(tmp_path / "metrics.jsonl", png, [("loss", "loss")])
    monkeypatch.undo()
    assert png.read_bytes() == b"the picture an earlier run drew\n"  # was: the first 500 bytes of a PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "metrics.jsonl"]
    plot_curves(tmp_path / "metrics.jsonl", png, [("loss", "loss")])
    assert Image.open(png).format == "PNG" and Image.open(png).size[0] > 100


@pytest.mark.parametrize("norm", [float("inf"), float("nan"), 0.5])
def test_a_skipped_steps_norm_is_logged_as_null_strict_json(tmp_path, norm):
    """fp16's gradient scaler skips a step whose gradients overflowed, and its norm is inf: metrics.jsonl held
    `Infinity`, which strict JSON readers (jq, JavaScript, pandas' ujson) refuse. It is logged as null."""
    import json
    from types import SimpleNamespace

    from bertkit.training.loop import _train_record
    from bertkit.training.metrics_log import MetricsLog, read_metrics

    record = _train_record({"loss": 1.5, "tokens": 64.0}, SimpleNamespace(enabled=False), None, 3, 1e-4,
                           torch_tensor(norm), 0.5)
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log(record)
    line = (tmp_path / "metrics.jsonl").read_text()
    json.loads(line, parse_constant=lambda name: pytest.fail(f"metrics.jsonl holds {name}"))
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["grad_norm"] == (norm if norm == 0.5 else None)


def torch_tensor(value):
    import torch

    return torch.tensor(value)  # clip_grad_norm_ returns a tensor
