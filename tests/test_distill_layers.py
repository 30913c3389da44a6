"""`bertkit distill layers`: the student starts as the teacher's chosen layers, the losses are the
formulas written out by hand (sentence vectors; a fine-tuned model's logits), short runs start at the
loss computed outside the loop and save the teacher's layout, and bad input is one clear line."""

import json
from dataclasses import replace
import random
import shutil
import signal
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import bertkit
from bertkit.cli import main
from bertkit.distill.config import LayersDistillConfig
from bertkit.distill.layers import distill_layers, vector_loss
from bertkit.distill.logits import soft_loss
from bertkit.distill.student import kept_layers, student_from
from bertkit.errors import BertkitError
from bertkit.model.config import BertConfig
from bertkit.model.heads import BertForSequenceClassification
from bertkit.model.modeling import BertModel
from bertkit.model.sentence_layout import write_layout
from bertkit.runtime.loading import load
from bertkit.tasks.config import TrainConfig
from bertkit.training.optim import OptimConfig
from pretrain_support import run_cli, train_losses

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
    cos = (s * t).sum(1) / s.norm(dim=1) / t.norm(dim=1)
    assert abs(float(vector_loss(s, t, "mse+cosine")) - float(((s - t) ** 2).sum() / 24 + (1 - cos).mean())) < 1e-6
    T = 2.0
    p_t, p_s = torch.softmax(t / T, dim=-1), torch.softmax(s / T, dim=-1)
    kl = float((p_t * (p_t.log() - p_s.log())).sum() / 4) * T * T
    assert abs(float(soft_loss(s, t, T)) - kl) < 1e-5
    # per token: only the real tokens' rows, each a distribution over the classes
    s3, t3 = s.reshape(2, 2, 6), t.reshape(2, 2, 6)
    mask = torch.tensor([[1, 1], [1, 0]])
    kl3 = float((p_t * (p_t.log() - p_s.log())).sum(-1)[:3].mean()) * T * T
    assert abs(float(soft_loss(s3, t3, T, mask=mask)) - kl3) < 1e-5
    # multi-label: a Bernoulli per label; regression: the squared difference, no temperature
    q_t, q_s = torch.sigmoid(t / T), torch.sigmoid(s / T)
    bern = (q_t * (q_t / q_s).log() + (1 - q_t) * ((1 - q_t) / (1 - q_s)).log()).mean() * T * T
    assert abs(float(soft_loss(s, t, T, "multi_label_classification")) - float(bern)) < 1e-5
    assert abs(float(soft_loss(s[:, :1], t[:, :1], T, "regression")) - float(((s[:, 0] - t[:, 0]) ** 2).mean())) < 1e-6


def config(tmp_path, keep=1, teacher_cache=None, **training):
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n")
    opts = {"epochs": 2, "batch_size": 6, "seed": 0, "progress": False, "device": "cpu", **training}
    return LayersDistillConfig(keep=keep, data=tmp_path / "s.txt", output=tmp_path / "student",  # Paths, as a notebook
                               training=TrainConfig(**opts, optim=OptimConfig(learning_rate=1e-3)),
                               teacher_cache=teacher_cache)


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


def test_paths_given_as_pathlib_paths_are_recorded_as_strings(tiny_dir, tmp_path, capsys):
    """LayersDistillConfig(data=Path(...), output=Path(...)), a notebook's paths, ran the teacher, then died writing
    run_config.json (TypeError: Object of type PosixPath is not JSON serializable). The training's progress bar
    says what runs: it was labelled "finetune" (the loop's label for bertkit finetune)."""
    cfg = config(tmp_path, epochs=1, progress=True)
    assert (cfg.data, cfg.output) == (str(tmp_path / "s.txt"), str(tmp_path / "student"))
    distill_layers(tiny_dir, tmp_path / "student", cfg, log=lambda s: None)
    assert json.loads((tmp_path / "student" / "run_config.json").read_text())["data"] == str(tmp_path / "s.txt")
    bars = capsys.readouterr().err
    assert "distill layers:" in bars and "finetune" not in bars, bars


def test_the_teachers_vectors_are_cached_and_reused(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    cache = tmp_path / "cache" / "teacher.safetensors"
    cfg = config(tmp_path, teacher_cache=str(cache))
    lines = []
    distill_layers(tiny_dir, cfg.output, cfg, log=lines.append)
    want = bertkit.embed(SENTENCES, tiny_dir, pooling="mean", normalize=False)
    assert np.allclose(load_file(cache)["vectors"].numpy(), want, atol=1e-6)
    assert not any("read from" in x for x in lines)
    lines.clear()
    distill_layers(tiny_dir, tmp_path / "again", cfg, log=lines.append)
    assert any(f"teacher vectors read from {cache}" in x for x in lines)
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES[:3]) + "\n")  # other data: computed again
    lines.clear()
    distill_layers(tiny_dir, tmp_path / "other", cfg, log=lines.append)
    assert any("computing them again" in x for x in lines) and load_file(cache)["vectors"].shape[0] == 3


def test_the_teacher_cache_records_the_precision_used_not_the_one_asked(tiny_dir, tmp_path):
    """--teacher-dtype auto computes in the CPU's choice (`auto_dtype`): the cache says that precision, and a run
    asking for it by name reads the vectors (keyed by "auto", they were computed again, and the file said auto)."""
    from safetensors import safe_open

    from bertkit.runtime.devices import auto_dtype, dtype_name

    used = dtype_name(auto_dtype())
    cache = tmp_path / "teacher.safetensors"
    cfg = replace(config(tmp_path, teacher_cache=str(cache)), teacher_dtype="auto")
    lines = []
    distill_layers(tiny_dir, cfg.output, cfg, log=lines.append)
    with safe_open(str(cache), framework="pt") as f:
        assert json.loads(f.metadata()["about"])[2] == used
    assert any(f"teacher vectors computed in {used}" in x for x in lines)
    lines.clear()
    named = replace(cfg, teacher_dtype=used)
    distill_layers(tiny_dir, tmp_path / "again", named, log=lines.append)
    assert any(f"teacher vectors read from {cache}" in x for x in lines)


def test_a_teacher_trained_again_in_its_folder_does_not_read_the_cache_of_the_one_before(tiny_dir, tmp_path):
    """The cache was keyed by the teacher's folder, length, precision and texts, not its weights: a teacher
    fine-tuned again into the same folder (finetune ... -o runs/sst2 --overwrite), then distilled with the same
    --teacher-cache, trained its student on the vectors of the model that was there before, and said it read
    them. The key holds the weights' SHA-256 now (`runtime.loading.weights_fingerprint`)."""
    import bertkit.distill.layers as layers

    folder = tmp_path / "teacher"
    shutil.copytree(tiny_dir, folder)
    cache = tmp_path / "teacher.safetensors"
    before = layers.cached_targets(load(folder, head="encoder", fast=False), SENTENCES, 16, cache, log=print)
    config = BertConfig.from_json_file(folder / "config.json")
    BertModel(config, generator=torch.Generator().manual_seed(5)).save_pretrained(folder)  # trained again, there
    lines = []
    after = layers.cached_targets(load(folder, head="encoder", fast=False), SENTENCES, 16, cache, log=lines.append)
    want = bertkit.embed(SENTENCES, folder, pooling="mean", normalize=False, max_length=16)
    assert np.allclose(after, want, atol=1e-5) and not np.allclose(after, before, atol=1e-3)
    assert not any("read from" in x for x in lines), lines


HELD = "\n".join(SENTENCES + ["the sun sets over the hills", "a child reads a book quietly"]) + "\n"


def held_out_run(tiny_dir, out, *more, kill_at_step=None, check=True):
    """`distill layers --holdout 3` on 8 sentences (5 trained, batch 2: 3 updates an epoch, 3 epochs)."""
    data = out.parent / "held.txt"
    data.write_text(HELD)
    return run_cli("distill", "layers", tiny_dir, "--keep", "1", "--data", data, "-o", out, "--holdout", 3,
                   "--epochs", 3, "--batch-size", 2, "--learning-rate", 3e-3, "--seed", 0, "--no-progress",
                   "--device", "cpu", *more, kill_at_step=kill_at_step, check=check)


@pytest.mark.slow
def test_held_out_sentences_pick_the_epoch_saved_and_a_killed_run_resumes_exactly(tiny_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    held_out_run(tiny_dir, straight)
    report = json.loads((straight / "distill.json").read_text())
    scores = {e["epoch"]: e["holdout_mse"] for e in report["epochs"]}
    assert report["sentences"] == 5 and report["held_out"] == 3 and sorted(scores) == [1, 2, 3]
    assert report["best_epoch"] == min(scores, key=scores.get)
    # the saved student is the best epoch's: its MSE and cosine to the teacher on the held-out three, by hand
    held = [HELD.splitlines()[i] for i in sorted(random.Random(0).sample(range(8), 3))]
    s = bertkit.embed(held, straight, pooling="mean", normalize=False)
    t = bertkit.embed(held, tiny_dir, pooling="mean", normalize=False)
    best = report["epochs"][report["best_epoch"] - 1]
    assert abs(float(((s - t) ** 2).mean()) - best["holdout_mse"]) < 1e-6
    cos = (s * t).sum(1) / np.linalg.norm(s, axis=1) / np.linalg.norm(t, axis=1)
    assert abs(float(cos.mean()) - best["holdout_cosine"]) < 1e-6
    # killed in update 5 (epoch 2), after the epoch-1 checkpoint; --resume ends where the straight run did
    res = held_out_run(tiny_dir, killed, kill_at_step=4, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    # another teacher is refused in one line; MODEL left out means the run's own (it was the default model)
    other = shutil.copytree(tiny_dir, killed.parent / "other")
    res = run_cli("distill", "layers", other, "-o", killed, "--resume", check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and f"distils {tiny_dir}, not {other}" in res.stderr
    run_cli("distill", "layers", "-o", killed, "--resume")
    assert train_losses(killed) == train_losses(straight)
    drop = ("train_seconds", "eval_seconds")
    a, b = (json.loads((d / "distill.json").read_text()) for d in (straight, killed))
    assert [{k: v for k, v in e.items() if k not in drop} for e in b["epochs"]] == \
        [{k: v for k, v in e.items() if k not in drop} for e in a["epochs"]] and b["best_epoch"] == a["best_epoch"]
    wa, wb = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("args, words", [
    (["--keep", "0"], "keep at least 1 layer"),
    (["--keep", "3"], "the teacher has 2 layers; keep 1 to 2"),
    (["--keep", "1", "--data", "EMPTY"], "holds no text"),
    (["--keep", "1", "--holdout", "1"], "--holdout 1 leaves no sentence to train on (1 in --data)"),
    (["--keep", "1", "--holdout", "-1"], "--holdout must be >= 0"),
    (["--keep", "1", "--holdout", "1", "--metric", "accuracy"], "with --holdout choose one of holdout_mse"),
    (["--keep", "1", "--metric", "accuracy"], "with --holdout choose one of holdout_mse"),  # was never read
    (["--keep", "1", "--metric", "holdout_cosine"], "give --holdout N too, or leave --metric out"),
    # a fine-tuned teacher's settings: with a sentence model they were read by nothing (its MSE has no temperature)
    (["--keep", "1", "--temperature", "4"], "--temperature 4.0 is for a fine-tuned teacher's logits"),
    (["--keep", "1", "--soft-weight", "0.2"], "--soft-weight 0.2 is for a fine-tuned teacher's logits"),
])
def test_bad_input_is_one_line(tiny_dir, tmp_path, capsys, args, words):
    (tmp_path / "s.txt").write_text("a b\n")
    (tmp_path / "empty.txt").write_text("\n")
    data = ["--data", str(tmp_path / "s.txt")] if "--data" not in args else []
    args = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in args]
    assert main(["distill", "layers", str(tiny_dir), "-o", str(tmp_path / "o"), *data, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err



def test_a_text_without_tokens_is_named_by_its_line(tiny_dir, tmp_path, capsys):
    # it stopped with the text ('\u200b') and no line: a data file of a million lines stopped on one
    (tmp_path / "s.txt").write_text("a cat\n\na dog\n\u200b\nmore\n", encoding="utf-8")
    assert main(["distill", "layers", str(tiny_dir), "--keep", "1", "--data", str(tmp_path / "s.txt"),
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the teacher's progress bar
    assert f"{tmp_path / 's.txt'}:4: text '\\u200b' yields no tokens" in err and "\n" not in err, err


def test_an_output_holding_a_model_is_refused_before_the_teacher_loads_and_overwrite_works(tiny_dir, tmp_path,
                                                                                           capsys, monkeypatch):
    # the student was written over a model folder without a word, --overwrite was never read, and a run
    # folder was refused only after the teacher had embedded all of --data
    (tmp_path / "s.txt").write_text("a b\n")
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    base = ["distill", "layers", "--keep", "1", "--data", str(tmp_path / "s.txt"), "--epochs", "1", "--no-progress"]
    assert main([*base[:2], str(tmp_path / "none"), *base[2:], "-o", str(other)]) == 2  # no teacher there: not read
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{other} already holds a model (config.json, model.safetensors" in err, err
    assert main([*base[:2], str(other), *base[2:], "-o", str(other), "--overwrite"]) == 2
    assert "is the folder the model is read from" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before
    assert main([*base[:2], str(tiny_dir), *base[2:], "-o", str(other), "--overwrite"]) == 0
    assert "--overwrite: removed config.json" in capsys.readouterr().out
    assert json.loads((other / "distill.json").read_text())["layers"] == [1]
    # --resume of that finished run was refused only after the teacher had embedded all of --data again
    monkeypatch.setattr("bertkit.distill.layers.load", lambda *a, **k: pytest.fail("the teacher was loaded"))
    assert main([*base[:2], str(tiny_dir), *base[2:], "-o", str(other), "--resume"]) == 2
    assert "finished and deleted its checkpoint" in capsys.readouterr().err

# --- a fine-tuned teacher: its logits ---------------------------------------------------------------

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def fine_tuned(tiny_dir, path, cls, info, **config):
    """A tiny 'fine-tuned' model (tiny_dir's encoder, a random head, dropout off), saved as `bertkit finetune`
    saves one: config.json with the label names, and bertkit_task.json."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the new head's missing weights
        model = cls.from_pretrained(tiny_dir, strict=False, generator=torch.Generator().manual_seed(3), **NO_DROPOUT,
                                    **config)
    model.save_pretrained(path, tokenizer=load(tiny_dir).tokenizer)
    (path / "bertkit_task.json").write_text(json.dumps(info))
    return path


def logits_config(tmp_path, data, keep=1, **more):
    opts = {"epochs": 1, "batch_size": 6, "seed": 0, "progress": False, "device": "cpu"}
    return LayersDistillConfig(keep=keep, data=str(data), output=str(tmp_path / "student"),
                               training=TrainConfig(**opts, optim=OptimConfig(learning_rate=1e-3)), **more)


def first_loss(out) -> float:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["split"] == "train"][0]["loss"]


def padded(tok, texts, pairs=None):
    enc = [tok.encode(t, pairs[i] if pairs else None) for i, t in enumerate(texts)]
    T = max(len(e.input_ids) for e in enc)
    ids = torch.tensor([e.input_ids + [0] * (T - len(e.input_ids)) for e in enc])
    types = torch.tensor([e.token_type_ids + [0] * (T - len(e.input_ids)) for e in enc])
    return ids, (ids != 0).long(), types


def test_a_classifier_student_learns_the_teachers_logits_and_labels(tiny_dir, tmp_path):
    info = {"task": "classify", "max_length": 32, "stride": 0, "text_column": "sentence", "label_column": "label"}
    teacher_dir = fine_tuned(tiny_dir, tmp_path / "teacher", BertForSequenceClassification, info, num_labels=2,
                             id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1},
                             problem_type="single_label_classification")
    labels = [0, 1, 0, 1, 1, 0]
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{s}\t{['neg', 'pos'][y]}\n" for s, y in zip(SENTENCES, labels)))
    cfg = logits_config(tmp_path, tmp_path / "train.tsv", temperature=3.0, soft_weight=0.3)
    report = distill_layers(teacher_dir, cfg.output, cfg, log=lambda s: None)
    assert report["layers"] == [1] and report["labelled"]
    # step 1 runs at learning rate 0: its loss is the untrained student's, by hand
    teacher = load(teacher_dir, fast=False)
    student, _ = student_from(teacher.model, 1)
    ids, mask, types = padded(teacher.tokenizer, SENTENCES)
    with torch.no_grad():
        zt = teacher.model(ids, attention_mask=mask, token_type_ids=types).logits
        zs = student.eval()(ids, attention_mask=mask, token_type_ids=types).logits
    T = 3.0
    p_t, p_s = torch.softmax(zt / T, -1), torch.softmax(zs / T, -1)
    kl = float((p_t * (p_t.log() - p_s.log())).sum(-1).mean()) * T * T
    ce = float(-torch.log_softmax(zs, -1)[range(6), labels].mean())
    assert abs(first_loss(tmp_path / "student") - (0.3 * kl + 0.7 * ce)) < 1e-5
    # the teacher's layout: bertkit_task.json and the labels, so predict takes the student as it is; the record
    # says it is a student, of which teacher (it was the teacher's record alone, naming the teacher's run)
    saved = load(tmp_path / "student")
    assert saved.info == {**info, "distilled_from": {"teacher": str(teacher_dir), "layers": [1]}}
    assert saved.config.labels == ["neg", "pos"] and saved.config.num_hidden_layers == 1
    assert {p["label"] for p in bertkit.predict(tmp_path / "student", SENTENCES)} <= {"neg", "pos"}


def test_a_token_classifier_student_learns_every_real_tokens_logits(tiny_dir, tmp_path):
    from bertkit.model.heads import BertForTokenClassification

    names = ["O", "B-PER", "I-PER"]
    info = {"task": "ner", "max_length": 32, "stride": 8, "tag_scheme": "bio"}
    teacher_dir = fine_tuned(tiny_dir, tmp_path / "teacher", BertForTokenClassification, info, num_labels=3,
                             id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n")  # unlabelled: one sentence per line
    cfg = logits_config(tmp_path, tmp_path / "s.txt", temperature=2.0)
    assert not distill_layers(teacher_dir, cfg.output, cfg, log=lambda s: None)["labelled"]
    teacher = load(teacher_dir, fast=False)
    student, _ = student_from(teacher.model, 1)
    ids, mask, types = padded(teacher.tokenizer, SENTENCES)
    with torch.no_grad():
        zt = teacher.model(ids, attention_mask=mask).logits / 2
        zs = student.eval()(ids, attention_mask=mask).logits / 2
    kl = (torch.softmax(zt, -1) * (torch.log_softmax(zt, -1) - torch.log_softmax(zs, -1))).sum(-1)  # [B, T]
    want = float(kl[mask.bool()].mean()) * 4
    assert abs(first_loss(tmp_path / "student") - want) < 1e-5
    tags = bertkit.predict(tmp_path / "student", SENTENCES[:2])
    assert [len(p["tags"]) for p in tags] == [6, 6] and {t for p in tags for t in p["tags"]} <= set(names)


@pytest.mark.parametrize("case, words", [
    ("qa", "is a qa model: distill layers trains sentence models and classifiers"),
    ("unknown label", "labels ['maybe'] do not occur in the training labels"),
    ("empty", "holds no inputs"),
    ("temperature", "--temperature must be > 0"),
    # a sentence model's settings: with a classifier they were read by nothing (its logits ran in float32 whatever
    # --teacher-dtype said, and no --teacher-cache file was written)
    ("teacher dtype", "--teacher-dtype bfloat16 is for a sentence model's vectors"),
    ("teacher cache", "--teacher-cache c.safetensors is for a sentence model's vectors"),
    ("loss", "--loss mse+cosine is for a sentence model's vectors"),  # the logits' loss is the soft loss
])
def test_bad_input_for_a_fine_tuned_teacher_is_one_line(tiny_dir, tmp_path, capsys, case, words):
    from bertkit.model.heads import BertForQuestionAnswering

    info = {"task": "classify", "max_length": 32, "text_column": "sentence", "label_column": "label"}
    if case == "qa":
        teacher = fine_tuned(tiny_dir, tmp_path / "t", BertForQuestionAnswering, {"task": "qa", "max_length": 32})
    else:
        teacher = fine_tuned(tiny_dir, tmp_path / "t", BertForSequenceClassification, info, num_labels=2,
                             id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    rows = {"unknown label": "a b\tmaybe\n", "empty": ""}.get(case, "a b\tpos\n")
    (tmp_path / "d.tsv").write_text("sentence\tlabel\n" + rows)
    extra = {"temperature": ["--temperature", "0"], "teacher dtype": ["--teacher-dtype", "bfloat16"],
             "teacher cache": ["--teacher-cache", "c.safetensors"], "loss": ["--loss", "mse+cosine"]}.get(case, [])
    assert main(["distill", "layers", str(teacher), "--keep", "1", "--data", str(tmp_path / "d.tsv"),
                 "-o", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


@pytest.mark.slow
def test_two_torchrun_processes_train_the_student_as_one_process_accumulating_two(tmp_path):
    """The student trains through the one loop, so torchrun's DDP (gloo, 2 ranks x batch 2) makes the same
    updates as one process accumulating two micro-batches of 2 (1e-5), as the fine-tuning test checks. The
    teacher has no dropout: each rank draws its own dropout stream."""
    from test_distributed import torchrun
    from bertkit.text.tokenizer import Tokenizer
    teacher = tmp_path / "teacher"
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(config, generator=torch.Generator().manual_seed(0)).save_pretrained(teacher,
                                                                                  tokenizer=Tokenizer.from_pretrained())
    data = tmp_path / "s.txt"
    data.write_text(HELD)
    common = ("distill", "layers", teacher, "--keep", "1", "--data", data, "--epochs", 2, "--batch-size", 2,
              "--learning-rate", 3e-3, "--seed", 0, "--no-progress", "--device", "cpu")
    run_cli(*common, "--grad-accum", 2, "-o", tmp_path / "single")
    res = torchrun(2, *common, "-o", tmp_path / "ddp")
    assert res.stderr.count('{"layers": [1]') == 1, res.stderr[-2000:]  # the summary once, not per rank
    single, ddp = train_losses(tmp_path / "single"), train_losses(tmp_path / "ddp")
    assert sorted(ddp) == sorted(single) == [1, 2, 3, 4]
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-5), step
    a, b = load_file(tmp_path / "single" / "model.safetensors"), load_file(tmp_path / "ddp" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)


def test_the_command_prints_its_summary_on_the_first_process_only(tiny_dir, monkeypatch, tmp_path, capsys):
    """Under torchrun every rank runs the command; the summary line and distill.json come from the rank
    that writes (the training run's is_main) alone: the line was printed once per rank. The training
    run is stood in for by its report."""
    args = ["distill", "layers", str(tiny_dir), "--keep", "1", "--data", str(tmp_path / "s.txt")]
    (tmp_path / "s.txt").write_text(HELD)
    for main_rank, printed in ((False, 0), (True, 1)):
        report = {"layers": [1], "sentences": 8, "held_out": 0, "train_seconds": 0.0, "epochs": [], "is_main": main_rank}
        monkeypatch.setattr("bertkit.distill.layers.distill_sentences", lambda *a, report=report, **k: dict(report))
        out = tmp_path / str(main_rank)
        assert main([*args, "-o", str(out)]) == 0
        assert capsys.readouterr().err.count('{"layers": [1]') == printed, main_rank
        assert (out / "distill.json").exists() == main_rank


def test_distill_json_on_a_full_disk_is_whole_or_absent(tiny_dir, monkeypatch, tmp_path, capsys):
    """distill.json, the run's summary, was the one file of a distil run written in place: a kill or a full disk
    while it was written left its first bytes at its name (the student beside it is written whole). Now it is
    written beside its name and renamed (`bertkit.data.atomic`): absent after the failure, nothing left beside
    it, and whole (the report) after a run that finishes. The training run is stood in for by its report."""
    import builtins
    import io

    from killed_write import stopping_open

    (tmp_path / "s.txt").write_text(HELD)
    report = {"layers": [1], "sentences": 8, "held_out": 0, "train_seconds": 0.0, "epochs": [], "is_main": True}
    monkeypatch.setattr("bertkit.distill.layers.distill_sentences", lambda *a, **k: dict(report))
    args = ["distill", "layers", str(tiny_dir), "--keep", "1", "--data", str(tmp_path / "s.txt")]
    out = tmp_path / "student"
    with monkeypatch.context() as m:
        m.setattr(builtins, "open", stopping_open("distill.json", 20, None, io.open))
        m.setattr(io, "open", builtins.open)
        assert main([*args, "-o", str(out)]) == 2
    assert f"bertkit: error: {out / 'distill.json'}: No space left on device" in capsys.readouterr().err
    assert not (out / "distill.json").exists()  # was: its first 20 bytes
    assert not list(out.glob("distill.json*"))
    assert main([*args, "-o", str(out), "--overwrite"]) == 0
    assert json.loads((out / "distill.json").read_text()) == {k: v for k, v in report.items() if k != "is_main"}


def test_bf16_autocast_trains_the_student_close_to_float32(tiny_dir, tmp_path):
    """--precision bf16: the same run as float32 within bf16's rounding (losses, weights saved in float32), and
    not the float32 run itself (autocast is on)."""
    data = tmp_path / "s.txt"
    data.write_text(HELD)
    common = ("distill", "layers", tiny_dir, "--keep", "1", "--data", data, "--epochs", 1, "--batch-size", 2,
              "--learning-rate", 3e-3, "--seed", 0, "--no-progress", "--device", "cpu")
    run_cli(*common, "-o", tmp_path / "f32")
    run_cli(*common, "--precision", "bf16", "-o", tmp_path / "bf16")
    f32, bf16 = train_losses(tmp_path / "f32"), train_losses(tmp_path / "bf16")
    assert sorted(f32) == sorted(bf16) and len(f32) >= 3
    assert f32[1] != bf16[1]
    for step in f32:
        assert bf16[step] == pytest.approx(f32[step], rel=0.1), step
    a, b = load_file(tmp_path / "f32" / "model.safetensors"), load_file(tmp_path / "bf16" / "model.safetensors")
    for k in a:
        assert b[k].dtype == torch.float32
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0.05, msg=k)


def test_two_processes_writing_one_teacher_cache_both_finish(tiny_dir, tmp_path, monkeypatch):
    """Under torchrun every rank computes the teacher's vectors and writes --teacher-cache (and its chunks). Both
    wrote through one temporary name (CACHE.tmp) and both removed CACHE.part: the second rename or removal failed
    (FileNotFoundError, the run stopped on that rank). Two threads stand for the ranks here, in step: each has
    written its temporary file before either renames it."""
    import threading

    import bertkit.distill.layers as layers

    together = threading.Barrier(2, timeout=60)
    real_save = layers.save_file

    def save_in_step(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        together.wait()

    monkeypatch.setattr(layers, "save_file", save_in_step)
    cache = tmp_path / "teacher.safetensors"
    results, errors = {}, []

    def rank(r):
        try:
            teacher = load(tiny_dir, head="encoder", fast=False)
            results[r] = layers.cached_targets(teacher, SENTENCES, 16, cache, chunk=2, log=lambda s: None)
        except Exception as err:  # noqa: BLE001 (the test reports what a rank raised)
            errors.append(repr(err))
            together.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    want = bertkit.embed(SENTENCES, tiny_dir, pooling="mean", normalize=False, max_length=16)
    for r in (0, 1):
        assert np.allclose(results[r], want, atol=1e-6)
    assert np.allclose(load_file(cache)["vectors"].numpy(), want, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher.safetensors"]  # no chunk folder, no temporary
