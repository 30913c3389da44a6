"""`bertkit distill layers`: the student starts as the teacher's chosen layers, the losses are the
formulas written out by hand, and bad input is one clear line."""

import json
import shutil

import numpy as np
import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.distill.config import LayersDistillConfig
from bertkit.distill.layers import distill_layers, kept_layers, soft_label_loss, student_from, vector_loss
from bertkit.errors import BertkitError
from bertkit.model.config import BertConfig
from bertkit.model.heads import BertForSequenceClassification
from bertkit.model.modeling import BertModel
from bertkit.model.sentence_layout import write_layout
from bertkit.runtime.loading import load
from bertkit.tasks.config import TrainConfig
from bertkit.training.optim import OptimConfig

SENTENCES = ["the cat sat on the mat", "a dog runs in the park", "stocks fell sharply today",
             "she plays the violin", "rain is expected tomorrow", "he cooked pasta for dinner"]


def test_kept_layers_are_evenly_spaced_first_and_last():
    assert kept_layers(6, 3) == [0, 3, 5]
    assert kept_layers(12, 4) == [0, 4, 7, 11]
    assert kept_layers(12, 6) == [0, 2, 4, 7, 9, 11]
    assert kept_layers(5, 1) == [4] and kept_layers(5, 5) == [0, 1, 2, 3, 4]
    for bad in (0, 6):
        with pytest.raises(BertkitError, match="keep 1 to 5"):
            kept_layers(5, bad)


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification])
def test_the_student_starts_equal_to_the_teachers_chosen_layers(cls):
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(0)
    teacher = cls(config).eval()
    student, layers = student_from(teacher, 3)
    student.eval()
    assert layers == [0, 2, 4] and student.config.num_hidden_layers == 3
    enc_t = teacher if cls is BertModel else teacher.bert
    enc_s = student if cls is BertModel else student.bert
    for new, old in enumerate(layers):
        for (name, a), (_, b) in zip(enc_s.encoder.layers[new].state_dict().items(),
                                     enc_t.encoder.layers[old].state_dict().items()):
            assert torch.equal(a, b), name
    assert torch.equal(enc_s.embeddings.word_embeddings.weight, enc_t.embeddings.word_embeddings.weight)
    # the forward pass: the teacher run through layers 0, 2, 4 only gives the student's output
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        x = enc_t.embeddings(ids, torch.zeros_like(ids))
        for old in layers:
            x, _ = enc_t.encoder.layers[old](x, None)
        got = enc_s(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(got, x, atol=1e-5)


def test_the_losses_are_the_formulas_by_hand():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    assert abs(float(vector_loss(s, t)) - float(((s - t) ** 2).sum() / 24)) < 1e-6
    T, alpha = 2.0, 0.3
    labels = torch.tensor([0, 5, 2, -100])
    p_t, p_s = torch.softmax(t / T, dim=-1), torch.softmax(s / T, dim=-1)
    kl = float((p_t * (p_t.log() - p_s.log())).sum() / 4) * T * T
    ce = float(-torch.log_softmax(s, dim=-1)[[0, 1, 2], [0, 5, 2]].mean())
    assert abs(float(soft_label_loss(s, t, T)) - kl) < 1e-5
    assert abs(float(soft_label_loss(s, t, T, labels, alpha)) - (alpha * kl + (1 - alpha) * ce)) < 1e-5


def config(tmp_path, keep=1, **training):
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n")
    opts = {"epochs": 2, "batch_size": 6, "seed": 0, "progress": False, "device": "cpu", **training}
    return LayersDistillConfig(keep=keep, data=str(tmp_path / "s.txt"), output=str(tmp_path / "student"),
                               training=TrainConfig(**opts, optim=OptimConfig(learning_rate=1e-3)))


def test_a_short_run_starts_at_the_hand_computed_loss_and_saves_the_teachers_layout(tiny_dir, tmp_path):
    exact = tmp_path / "exact"  # dropout off, so the first step's loss is the one computed here
    shutil.copytree(tiny_dir, exact)
    conf = json.loads((exact / "config.json").read_text())
    (exact / "config.json").write_text(json.dumps({**conf, "hidden_dropout_prob": 0.0,
                                                   "attention_probs_dropout_prob": 0.0}))
    write_layout(exact, pooling="mean", normalize=True, max_seq_length=16, hidden_size=32)  # the student keeps it
    tiny_dir = exact
    cfg = config(tmp_path)
    report = distill_layers(tiny_dir, cfg.output, cfg, log=lambda s: None)
    assert report["layers"] == [1]
    # step 1 runs at learning rate 0 (warm-up): its loss is the MSE of the untrained student, one batch of all
    teacher = load(tiny_dir, head="encoder", fast=False)
    student, _ = student_from(teacher.model, 1)
    want = ((bertkit.embed(SENTENCES, (student.eval(), teacher.tokenizer), pooling="mean", normalize=False)
             - bertkit.embed(SENTENCES, tiny_dir, pooling="mean", normalize=False)) ** 2).mean()
    records = [json.loads(x) for x in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in records if r["split"] == "train"][0]
    assert abs(first["loss"] - float(want)) < 1e-5
    saved = load(tmp_path / "student")
    assert saved.model.config.num_hidden_layers == 1 and saved.layout == teacher.layout


@pytest.mark.parametrize("args, words", [
    (["--keep", "0"], "keep at least 1 layer"),
    (["--keep", "3"], "the teacher has 2 layers; keep 1 to 2"),
    (["--keep", "1", "--data", "EMPTY"], "holds no text"),
])
def test_bad_input_is_one_line(tiny_dir, tmp_path, capsys, args, words):
    (tmp_path / "s.txt").write_text("a b\n")
    (tmp_path / "empty.txt").write_text("\n")
    data = ["--data", str(tmp_path / "s.txt")] if "--data" not in args else []
    args = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in args]
    assert main(["distill", "layers", str(tiny_dir), "-o", str(tmp_path / "o"), *data, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err
