"""NSP on small corpora: the held-out documents are chosen before pairs are made.

A training document's "random next" segment comes from another training
document, so holding documents out removes no training pair: training
sees both labels in the proportion `prepare` wrote, however few documents the
corpus has (before, two books gave training batches of label 0 only).
"""

import json

import numpy as np

from pretrain_support import BOOKS, run_cli, tiny_config_file

from bertkit.pretraining.held_out import held_out_split
from bertkit.pretraining.prepare import PrepareConfig, prepare


def prepared(shared_data, tmp, books, chars=20_000):
    corpus = tmp / "corpus"
    corpus.mkdir(parents=True)
    for name in books:
        text = (shared_data / "pretrain_corpus" / "gutenberg" / name).read_text(encoding="utf-8")
        (corpus / name).write_text(text[:chars], encoding="utf-8")
    cfg = PrepareConfig(max_seq_length=32, objective="nsp", dynamic_masking=True, dupe_factor=1, documents="file",
                        workers=1, seed=3)
    prepare([corpus], tmp / "data", cfg, progress=False)
    manifest = json.loads((tmp / "data" / "manifest.json").read_text())
    arrays = {name: np.concatenate([np.load(tmp / "data" / e["path"] / f"{name}.npy") for e in manifest["shards"]])
              for name in ("labels", "docs")}
    return tmp / "data", manifest, arrays


def test_two_books_train_on_both_labels_in_the_prepared_proportion(shared_data, tmp_path):
    data, manifest, a = prepared(shared_data, tmp_path, BOOKS[:2])
    labels, written = a["labels"], manifest["label_ones"] / manifest["instances"]
    assert 0.35 < written < 0.65  # prepare wrote a fair coin
    train, held = held_out_split(data, len(labels), 256, seed=42)
    assert len(held) == 0 and manifest["held_out_documents"] == []  # two documents: none to spare
    assert (labels[train] == 1).mean() == written and set(labels[train].tolist()) == {0, 1}

    out = tmp_path / "run"
    res = run_cli("pretrain", "run", data, "--config", tiny_config_file(tmp_path), "--max-steps", 1,
                  "--batch-size", 4, "-o", out)
    assert f"training: {len(labels)} instances, {written:.1%} with label 1" in res.stdout
    assert "too small for a held-out set" in res.stderr


def test_three_books_hold_one_out_without_skewing_training(shared_data, tmp_path):
    data, manifest, a = prepared(shared_data, tmp_path, BOOKS)
    labels, docs = a["labels"], a["docs"]
    (held_doc,) = manifest["held_out_documents"]
    train, held = held_out_split(data, len(labels), 16, seed=42)
    assert len(held) == 16 and (docs[held, 0] == held_doc).all()
    assert not (docs[train] == held_doc).any()  # no training pair reads the held-out book, as A or B
    # no pair of a training book took its random next segment from the held-out one, so none is lost
    assert not ((docs[:, 0] != held_doc) & (docs[:, 1] == held_doc)).any()
    assert len(train) == (docs[:, 0] != held_doc).sum()
    assert 0.35 < (labels[train] == 1).mean() < 0.65
    assert 0.2 < (labels[held] == 1).mean() < 0.8  # held-out pairs keep both labels too


def test_the_label_balance_says_what_label_1_means_for_the_data(tmp_path):
    """An SOP run said "51.3% with label 1 (random next / swapped)" of its pairs, where label 1 is "swapped"
    alone (as `pretrain show` and prepare's summary say it): the line names the data's own meaning now."""
    from types import SimpleNamespace

    from bertkit.pretraining.held_out import label_balance

    for objective, meaning in (("nsp", "random next"), ("sop", "swapped")):
        data = tmp_path / objective
        (data / "s0").mkdir(parents=True)
        np.save(data / "s0" / "labels.npy", np.array([1, 0, 1, 1], dtype=np.int8))
        (data / "manifest.json").write_text(json.dumps({"config": {"objective": objective}, "shards": [{"path": "s0"}]}))
        assert label_balance(data, SimpleNamespace(indices=[0, 1, 2, 3])) == f"4 instances, 75.0% with label 1 ({meaning})"
