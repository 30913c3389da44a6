"""A run's metrics on disk: metrics.jsonl as training goes, and curves.png at the end.

metrics.jsonl holds one JSON object per line: `"split": "train"` records for
logged steps (loss, lr, grad_norm, tokens_per_s and what the caller counts)
and `"split": "eval"` records for evaluations (the caller's metrics). A
resumed run first drops the lines the killed run wrote after its last
checkpoint, so the file reads as one uninterrupted run: it cuts the file after the
last line it keeps (one truncate; the lines kept are never written again), and a
last line cut by a full disk or a crash goes with the rest.

curves.png draws chosen keys against the step, one panel each: training
values faint with a running mean on top (`train_series`; a short run, where the
mean would span one step, draws the per-step values alone and says so),
evaluations as dots, and reference lines (chance, a trivial baseline) where the
caller gives them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bertkit.data.atomic import replace_atomically


class MetricsLog:
    """metrics.jsonl: one JSON object per line, appended and flushed as training goes."""

    def __init__(self, path: Path, keep_through_step: int | None = None):
        self.path = Path(path)
        if keep_through_step is None:
            self.path.write_text("")
        elif self.path.is_file():  # resuming: drop what the killed run logged after its last checkpoint
            os.truncate(self.path, _kept_bytes(self.path, keep_through_step))

    def __call__(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _kept_bytes(path: Path, step: int) -> int:
    """The length of the file's leading whole records logged at or before `step` (steps only grow down the file).

    Resuming rewrote the whole file in place, so a kill at that moment lost the run's history; and a run stopped
    by a full disk in the middle of a line could not be resumed at all (a JSONDecodeError traceback on that line)."""
    kept = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # the line a failed append cut: nothing after it was logged
                break
            if not line.endswith(b"\n") or record["step"] > step:
                break
            kept += len(line)
    return kept


def read_metrics(path) -> list:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_series(values) -> list[tuple[list, str]]:
    """The training lines of a panel, (values, legend label), faint first: one batch is noisy, so the
    per-step values and a running mean over ~2% of the run (`RUN_FRACTION`); a run too short for a
    window of 2 steps or more gets the per-step values alone, labelled as what they are."""
    values = list(values)
    window = len(values) // RUN_FRACTION
    if window < 2:
        return [(values, "train (per step)")]
    return [(values, "train (per step)"), (_running_mean(values, window), f"train (running mean of {window} steps)")]


RUN_FRACTION = 50  # the running mean spans 1/50 of the logged steps


def _running_mean(values, window: int) -> list:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def points(records: list, names: tuple) -> list:
    """(step, value) of each record holding the figure under one of `names`, the first found: a figure renamed
    (an SOP run's nsp_acc, now sop_acc) is read from a resumed run's earlier lines too."""
    return [(r["step"], next(r[n] for n in names if n in r)) for r in records if any(n in r for n in names)]


def plot_curves(metrics_path, png_path, panels, references=None) -> None:
    """One panel per (key, title) in `panels`, train and eval against step; a key may be a tuple: the figure's
    name, then names earlier runs wrote it under (`points`).

    references: {key: [(value, label), ...]}, horizontal lines in that key's panel (its first name).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_metrics(metrics_path)
    train = [r for r in recs if r["split"] == "train"]
    evals = [r for r in recs if r["split"] == "eval"]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    # every panel spans the run's steps: an evaluation every epoch (one point, for one epoch) sits where it
    # happened beside the training lines, not in an axis of its own around it
    steps = [r["step"] for r in recs if "step" in r]
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.remove()
    for ax, (key, title) in zip(axes.flat, panels):
        key = key if isinstance(key, tuple) else (key,)
        pts = points(train, key)
        if pts:
            steps, values = zip(*pts)
            if key[0] == "lr":
                ax.plot(steps, values, linewidth=1, label="train")
            else:
                lines = train_series(values)
                for k, (ys, label) in enumerate(lines):
                    faint = k < len(lines) - 1  # the per-step values under a running mean
                    ax.plot(steps, ys, linewidth=0.5 if faint else 1.2, alpha=0.3 if faint else 1.0,
                            color="tab:blue", label=label)
        pts = points(evals, key)
        if pts:
            ax.plot(*zip(*pts), "o-", color="tab:orange", label="eval (held out)", markersize=3, linewidth=1)
        for value, label in (references or {}).get(key[0], []):
            ax.axhline(value, color="grey", linestyle="--", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        if steps and max(steps) > min(steps):
            pad = 0.04 * (max(steps) - min(steps))
            ax.set_xlim(min(steps) - pad, max(steps) + pad)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    # whole or not at all: drawn over an earlier run's picture, a full disk or a kill left a cut PNG
    replace_atomically(png_path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
