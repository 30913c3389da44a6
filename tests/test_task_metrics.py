"""`--metric`: a task's dev figures are declared once, in its record (bertkit.tasks.registry), and checked first.

Checked here: the names a record declares are exactly the keys its dev evaluation returns, for every task
(a one-update run of each on a tiny model, the epoch's record read back), so the list cannot drift from
the code; `distill layers`' held-out figures likewise; an unknown name, or a --metric with no --dev to
score, is one line before any file is read; a figure where lower is better picks the lowest epoch.
"""

from __future__ import annotations

import json
import random

import pytest

from bertkit.cli import main
from bertkit.distill.config import HOLDOUT_METRICS
from bertkit.model.config import MULTI_LABEL, REGRESSION, SINGLE_LABEL
from bertkit.tasks import finetune
from bertkit.tasks.config import EMBED_DEV, TrainConfig
from bertkit.tasks.registry import METRICS, TASKS
from bertkit.training.optim import OptimConfig
from test_finetune import sentiment_rows, tiny_model_dir, write_tsv
from test_finetune_embed import beir_slice
from test_finetune_qa import squad_file

LOOP = {"epoch", "step", "train_loss", "train_seconds", "eval_seconds"}  # what the trainer adds to a record


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("metrics_tiny"), seed=5)


def one_update(task, tiny, train, dev, out, **options) -> set:
    """The figures of the one epoch of a one-update run with a dev set: what picks its best epoch."""
    training = TrainConfig(epochs=1, max_steps=1, batch_size=8, progress=False, device="cpu",
                           optim=OptimConfig(learning_rate=1e-3))
    final = finetune(task, train=str(train), dev=str(dev), output=str(out), model=str(tiny), training=training,
                     log=lambda line: None, **{"max_length": 32, **options})
    return set(final["epochs"][0]) - LOOP


def ner_file(path, n):
    sentences = ["john B-PER\nvisited O\nparis B-LOC\n. O\n", "mary B-PER\nwent O\nto O\nberlin B-LOC\n. O\n"]
    path.write_text("\n".join(sentences[i % 2] for i in range(n)))
    return path


def test_the_declared_figures_are_what_each_dev_evaluation_returns(tiny, tmp_path, shared_data):
    rng = random.Random(0)
    rows = sentiment_rows(24, rng)
    text = write_tsv(tmp_path / "text.tsv", ["sentence", "label"], rows)
    three = write_tsv(tmp_path / "three.tsv", ["sentence", "label"],
                      [(s, ("pos", "neg", "mid")[i % 3]) for i, (s, _) in enumerate(rows)])
    pairs = write_tsv(tmp_path / "pairs.tsv", ["sentence1", "sentence2", "label"], [(s, s, y) for s, y in rows])
    scores = write_tsv(tmp_path / "scores.tsv", ["sentence", "label"], [(s, i % 5 / 2) for i, (s, _) in enumerate(rows)])
    sets = write_tsv(tmp_path / "sets.tsv", ["sentence", "labels"], [(s, f"{y},x" if i % 3 else y)
                                                                      for i, (s, y) in enumerate(rows)])
    sts = write_tsv(tmp_path / "sts.tsv", ["sentence1", "sentence2", "score"],
                    [(a, b, i % 5) for i, ((a, _), (b, _)) in enumerate(zip(rows, rows[1:]))])
    got = {name: one_update(name, tiny, data, data, tmp_path / name)
           for name, data in (("classify", text), ("regression", scores), ("multi_label", sets))}
    assert got["classify"] == set(METRICS[SINGLE_LABEL]) == set(TASKS["classify"].metrics)
    assert got["regression"] == set(METRICS[REGRESSION]) == set(TASKS["regression"].metrics)
    assert got["multi_label"] == set(METRICS[MULTI_LABEL]) == set(TASKS["multi_label"].metrics)
    assert one_update("pair", tiny, pairs, pairs, tmp_path / "pair") == set(TASKS["pair"].metrics)
    # f1 is the second label's: a classifier of three labels has none, and --metric f1 is refused for it
    assert one_update("classify", tiny, three, three, tmp_path / "three") == set(METRICS[SINGLE_LABEL]) - {"f1"}
    conll = ner_file(tmp_path / "ner.txt", 12)
    assert one_update("ner", tiny, conll, conll, tmp_path / "ner", stride=8) == set(TASKS["ner"].metrics)
    squad, squad_dev = squad_file(tmp_path / "squad.json", 12, rng), squad_file(tmp_path / "dev.json", 4, rng)
    assert one_update("qa", tiny, squad, squad_dev, tmp_path / "qa", doc_stride=8,
                      max_query_length=8) == set(TASKS["qa"].metrics)
    # embed: each kind of --dev gives its own figures; the record offers both
    beir = beir_slice(shared_data / "retrieval" / "scifact", tmp_path / "scifact", train_queries=8, dev_queries=4,
                      extra_docs=4)
    assert one_update("embed", tiny, sts, beir, tmp_path / "beir", dev_split="dev") == \
        set(EMBED_DEV["a BEIR folder"])
    assert one_update("embed", tiny, sts, sts, tmp_path / "sts") == set(EMBED_DEV["scored pairs"])
    assert set(TASKS["embed"].metrics) == set(EMBED_DEV["a BEIR folder"]) | set(EMBED_DEV["scored pairs"])
    assert TASKS["rerank"].metrics == {}  # its --dev figures come once, after training (retrieval.json)


def test_distill_layers_declares_its_held_out_figures(tiny, tmp_path):
    data = tmp_path / "s.txt"
    data.write_text("".join(f"{s}\n" for s, _ in sentiment_rows(6, random.Random(1))))
    assert main(["distill", "layers", str(tiny), "--keep", "1", "--data", str(data), "-o", str(tmp_path / "o"),
                 "--holdout", "2", "--epochs", "1", "--no-progress", "--device", "cpu"]) == 0
    epoch = json.loads((tmp_path / "o" / "distill.json").read_text())["epochs"][0]
    assert set(epoch) - LOOP == set(HOLDOUT_METRICS)


TASK_FILES = {"classify": "t.tsv", "pair": "t.tsv", "regression": "t.tsv", "multi-label": "t.tsv", "ner": "t.txt",
              "qa": "t.json", "embed": "t.tsv"}


@pytest.mark.parametrize("task", list(TASK_FILES))
def test_an_unknown_metric_is_one_line_before_any_file_is_read(task, tmp_path, capsys):
    record = TASKS.get(task) or TASKS["multi_label"]
    out = tmp_path / "out"
    args = ["finetune", task, "--train", str(tmp_path / TASK_FILES[task]), "-o", str(out), "--model",
            str(tmp_path / "no-model")]  # none of these exist: the metric is said first
    assert main([*args, "--dev", str(tmp_path / "dev"), "--metric", "nosuch"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertkit: error: unknown --metric 'nosuch': the {task} task's dev evaluation gives "
                   f"{', '.join(record.metrics)}")
    assert main([*args, "--metric", record.metric]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertkit: error: --metric {record.metric} picks the best epoch by its score on --dev: give "
                   "--dev too, or leave --metric out (without --dev the last epoch is saved)")
    assert not out.exists()


def test_rerank_offers_no_metric(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["finetune", "rerank", "--train", str(tmp_path), "-o", str(tmp_path / "o"), "--metric", "ndcg@10"])
    assert stop.value.code == 2 and "unrecognized arguments: --metric ndcg@10" in capsys.readouterr().err


def test_a_metric_the_dev_set_cannot_give_is_one_line_before_the_model_loads(tiny, tmp_path, capsys):
    rows = sentiment_rows(12, random.Random(2))
    three = write_tsv(tmp_path / "three.tsv", ["sentence", "label"],
                      [(s, ("pos", "neg", "mid")[i % 3]) for i, (s, _) in enumerate(rows)])
    sts = write_tsv(tmp_path / "sts.tsv", ["sentence1", "sentence2", "score"],
                    [(a, b, i % 5) for i, ((a, _), (b, _)) in enumerate(zip(rows, rows[1:]))])
    common = ["--model", str(tiny), "-o", str(tmp_path / "o"), "--no-progress"]
    assert main(["finetune", "classify", "--train", str(three), "--dev", str(three), "--metric", "f1", *common]) == 2
    assert capsys.readouterr().err.strip() == (f"bertkit: error: --metric f1 is the F1 of the second of two labels, "
                                               f"and {three} has 3: choose macro_f1")
    assert main(["finetune", "embed", "--train", str(sts), "--dev", str(sts), "--metric", "ndcg@10", *common]) == 2
    assert capsys.readouterr().err.strip() == ("bertkit: error: --metric ndcg@10: a --dev of scored pairs gives "
                                               "spearman, pearson")
    # a dev set whose gold scores are all one value has no correlation (scipy: nan), as evaluate sts refuses it:
    # the run trained every epoch, kept the first ("pearson nan"), called the model useless and wrote NaN
    same = write_tsv(tmp_path / "same.tsv", ["sentence1", "sentence2", "score"],
                     [(*row.split("\t")[:2], 3) for row in sts.read_text().splitlines()[1:]])
    assert main(["finetune", "regression", "--train", str(sts), "--dev", str(same), "--text-column", "sentence1",
                 "--text-pair-column", "sentence2", "--label-column", "score", "--max-length", "32", *common]) == 2
    assert capsys.readouterr().err.strip() == (f"bertkit: error: {same}: every gold score is 3: pearson and spearman "
                                               "need at least two different scores; give a dev set whose scores vary")
    assert not (tmp_path / "o").exists()


def test_a_figure_where_lower_is_better_picks_the_lowest_epoch(tiny, tmp_path):
    rows = sentiment_rows(32, random.Random(3))
    train = write_tsv(tmp_path / "train.tsv", ["sentence", "label"], rows[:24])
    dev = write_tsv(tmp_path / "dev.tsv", ["sentence", "label"], rows[24:])
    training = TrainConfig(epochs=2, batch_size=8, progress=False, device="cpu", metric="held_out_loss",
                           optim=OptimConfig(learning_rate=5e-3))
    final = finetune("classify", train=str(train), dev=str(dev), output=str(tmp_path / "o"), model=str(tiny),
                     training=training, log=lambda line: None, max_length=32)
    losses = {e["epoch"]: e["held_out_loss"] for e in final["epochs"]}
    assert len(set(losses.values())) == 2  # two different losses: the choice is not a tie
    assert final["saved"]["epoch"] == min(losses, key=losses.get)
    saved = json.loads((tmp_path / "o" / "run_config.json").read_text())["training"]
    assert saved["metric"] == "held_out_loss" and saved["greater_is_better"] is False
