"""ELECTRA: parity with transformers both ways (odd tiny shapes, embedding_size != hidden_size),
and the pre-training step's rules checked by hand: seeded sampling, replaced = "differs from the
original", no loss on padding, no gradient into the generator from the discriminator's loss,
embeddings shared before and after save/load."""

import json

import pytest
import torch

from bertkit import BertkitError
from bertkit.model.checkpoint import GENERATOR_DIR
from bertkit.model.electra import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, ElectraForQuestionAnswering,
                             ElectraForSequenceClassification, ElectraForTokenClassification, ElectraModel)
from bertkit.model.electra_pretraining import ElectraPretrainingModel, corrupt, electra_metrics
from bertkit.runtime.loading import class_for
from bertkit.model.heads import BertForSequenceClassification
from test_heads import assert_same_gradients

# odd sizes so that a swapped dimension fails: E=20 != H=36, 6 heads of 6, intermediate 37
TINY = dict(vocab_size=99, embedding_size=20, hidden_size=36, num_hidden_layers=2, num_attention_heads=6,
            intermediate_size=37, max_position_embeddings=40, type_vocab_size=2)
CLASSES = (ElectraModel, ElectraForPreTraining, ElectraForMaskedLM, ElectraForSequenceClassification,
           ElectraForTokenClassification, ElectraForQuestionAnswering)


def config(**overrides):
    return ElectraConfig(**{**TINY, **overrides})


def inputs(shape=(2, 9)):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[1, 6:] = 0
    types = torch.zeros(shape, dtype=torch.long)
    types[:, 4:] = 1
    return ids * mask, mask, types * mask


def hf_config(transformers_mod, **overrides):
    return transformers_mod.ElectraConfig(**{**TINY, "hidden_dropout_prob": 0.0, **overrides})


def labels_for(cls, B=2, T=9):
    g = torch.Generator().manual_seed(3)
    if cls is ElectraForPreTraining:
        return dict(labels=torch.randint(0, 2, (B, T), generator=g))
    if cls is ElectraForMaskedLM:
        labels = torch.full((B, T), -100)
        labels[:, [2, 5]] = torch.randint(0, 99, (B, 2), generator=g)
        return dict(labels=labels)
    if cls is ElectraForSequenceClassification:
        return dict(labels=torch.tensor([0, 2]))
    if cls is ElectraForTokenClassification:
        return dict(labels=torch.randint(0, 3, (B, T), generator=g))
    if cls is ElectraForQuestionAnswering:
        return dict(start_positions=torch.tensor([1, 3]), end_positions=torch.tensor([4, 5]))
    return {}


def _compare(ours, hf, ids, mask, types, labels):
    with torch.no_grad():
        a = ours(ids, mask, types, **labels)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels)
    real = mask.bool()
    if isinstance(ours, ElectraModel):
        # padding rows differ by summation order only (as for BERT, test_model): compare real tokens
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        return
    for name in ("logits", "start_logits", "end_logits"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is None:
            continue
        if isinstance(ours, ElectraForMaskedLM) and "labels" in labels:
            y = y[labels["labels"] != -100]  # ours projects only the labelled positions
        elif x.dim() >= 2 and x.shape[:2] == real.shape:
            x, y = x[real], y[real]
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=name)
    if a.loss is not None:
        torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)


@pytest.mark.oracle
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_transformers_checkpoints_load_with_the_same_outputs(tmp_path, transformers_mod, cls):
    torch.manual_seed(0)
    hf = getattr(transformers_mod, cls.__name__)(hf_config(transformers_mod, num_labels=3 if cls is not ElectraForQuestionAnswering else 2)).eval()
    with torch.no_grad():  # non-zero biases and LayerNorms, so a bias read from the wrong key shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    hf.save_pretrained(tmp_path)
    ours = cls.from_pretrained(tmp_path)  # strict
    assert not ours.load_report.problems, ours.load_report.describe()
    ids, mask, types = inputs()
    _compare(ours, hf, ids, mask, types, labels_for(cls))


@pytest.mark.oracle
@pytest.mark.parametrize("cls", CLASSES[1:], ids=lambda c: c.__name__)
def test_gradients_match_transformers(tmp_path, transformers_mod, cls):
    """Every weight's gradient as transformers' (dropout off), the [PAD] row's included (its padding_idx:
    none); QA's loss reaches padded positions, so that row once got one here."""
    torch.manual_seed(0)
    hf = getattr(transformers_mod, cls.__name__)(hf_config(transformers_mod, attention_probs_dropout_prob=0.0,
                                                           num_labels=3 if cls is not ElectraForQuestionAnswering else 2))
    hf.save_pretrained(tmp_path)
    ours = cls.from_pretrained(tmp_path)
    assert_same_gradients(ours, hf, *inputs(), labels_for(cls))


@pytest.mark.oracle
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_transformers_loads_what_we_save(tmp_path, transformers_mod, cls):
    ours = cls(config(num_labels=3 if cls is not ElectraForQuestionAnswering else 2),
               generator=torch.Generator().manual_seed(1)).eval()
    ours.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "electra" and saved["embedding_size"] == 20 and saved["architectures"] == [cls.__name__]
    hf, info = getattr(transformers_mod, cls.__name__).from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, mask, types = inputs()
    _compare(ours, hf.eval(), ids, mask, types, labels_for(cls))


@pytest.mark.oracle
def test_equal_embedding_and_hidden_size_has_no_projection(tmp_path, transformers_mod):
    hf = transformers_mod.ElectraForPreTraining(hf_config(transformers_mod, embedding_size=36)).eval()
    hf.save_pretrained(tmp_path)
    ours = ElectraForPreTraining.from_pretrained(tmp_path)
    assert ours.electra.embeddings_project is None
    ids, mask, types = inputs()
    _compare(ours, hf, ids, mask, types, {})


def test_a_discriminator_loads_for_fine_tuning_with_a_fresh_head(tmp_path):
    disc = ElectraForPreTraining(config(), generator=torch.Generator().manual_seed(0))
    disc.save_pretrained(tmp_path)
    cls = class_for(tmp_path, BertForSequenceClassification)
    assert cls is ElectraForSequenceClassification
    with pytest.warns(UserWarning):
        model = cls.from_pretrained(tmp_path, strict=False, num_labels=4)
    report = model.load_report
    assert sorted(report.missing) == ["classifier.dense.bias", "classifier.dense.weight",
                                      "classifier.out_proj.bias", "classifier.out_proj.weight"]
    assert report.unused and all(k.startswith("discriminator_predictions.") for k in report.unused)
    torch.testing.assert_close(model.electra.encoder.layers[1].output.weight, disc.electra.encoder.layers[1].output.weight)
    assert model(*inputs()).logits.shape == (2, 4)
    with pytest.raises(BertkitError, match="does not match"):  # strict by default: the head is missing
        ElectraForSequenceClassification.from_pretrained(tmp_path)


def test_mean_pooling_is_refused_for_electra_not_ignored(tmp_path, capsys):
    """`finetune classify --pooling mean` on an ELECTRA model trained and saved a classifier that read the first
    token (ElectraClassificationHead has no other way, as transformers'), while config.json said "mean"."""
    from bertkit.cli import main
    from bertkit.text.tokenizer import Tokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
    ElectraForPreTraining(config(vocab_size=len(vocab))).save_pretrained(tmp_path / "disc", tokenizer=Tokenizer(vocab))
    train = tmp_path / "t.tsv"
    train.write_text("sentence\tlabel\n" + "good film\t1\nbad film\t0\n" * 4)
    code = main(["finetune", "classify", "--train", str(train), "--model", str(tmp_path / "disc"), "--output",
                 str(tmp_path / "o"), "--pooling", "mean", "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bertkit: error: ") and err.count("\n") == 1, err
    assert "first token" in err and "--pooling" in err
    assert not (tmp_path / "o" / "config.json").exists()
    with pytest.raises(BertkitError, match="first token"):
        config(classifier_pooling="mean")


def test_a_saved_electra_classifier_whose_config_says_mean_loads_as_trained(tmp_path):
    """Before `--pooling mean` was refused for ELECTRA, finetune classify wrote config.json with "mean" beside a
    head trained on the first token: such a folder loads (with a warning) and classifies as the same weights read
    with "cls", instead of being refused at every load."""
    model = ElectraForSequenceClassification(config(num_labels=3)).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "classifier_pooling": "mean"}))
    with pytest.warns(UserWarning, match="read as 'cls'"):
        loaded = ElectraForSequenceClassification.from_pretrained(tmp_path).eval()
    assert loaded.config.classifier_pooling == "cls"
    with torch.no_grad():
        torch.testing.assert_close(loaded(*inputs()).logits, model(*inputs()).logits, rtol=0, atol=0)


@pytest.mark.oracle
def test_pretrain_run_takes_an_electra_config_json_with_its_embedding_size(tmp_path, transformers_mod):
    """`pretrain run --method electra --config F`: F an ELECTRA config.json (transformers', or a run's own) was
    refused as "for model_type 'electra', not 'bert'"; without model_type the same file worked."""
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.pretraining.train import build_model

    hf_config(transformers_mod).to_json_file(tmp_path / "electra.json")
    cfg = RunConfig(data=str(tmp_path), config=str(tmp_path / "electra.json"), method="electra", generator_size=0.5)
    model = build_model(cfg, vocab_size=99, objective="none")
    shape = {k: getattr(model.config, k) for k in TINY}
    assert shape == TINY  # embedding_size 20 kept, not the hidden size 36
    assert model.generator.config.embedding_size == 20 and model.generator.config.num_attention_heads == 3
    # a BERT config.json still gives an ELECTRA of its shape, embeddings as wide as hidden
    transformers_mod.BertConfig(**{k: v for k, v in TINY.items() if k != "embedding_size"}).to_json_file(tmp_path / "bert.json")
    cfg = RunConfig(data=str(tmp_path), config=str(tmp_path / "bert.json"), method="electra")
    assert build_model(cfg, vocab_size=99, objective="none").config.embedding_size == 36
    with pytest.raises(BertkitError, match="--method electra"):  # the same ELECTRA file for a BERT run says why
        build_model(RunConfig(data=str(tmp_path), config=str(tmp_path / "electra.json")), vocab_size=99, objective="none")


def test_a_config_file_and_its_model_folder_name_one_model_type(tmp_path):
    """`pretrain run --config F` asked a reader of its own (pretraining.train.config_model_type) which model_type F
    names, beside model.checkpoint.model_type for a folder: one reader answers both now, the folder or its config
    file under any name, and a --config that holds no JSON object is refused in one line naming it."""
    from bertkit.model.checkpoint import model_type
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.pretraining.train import build_model

    ElectraModel(config()).save_pretrained(tmp_path / "electra")
    written = json.loads((tmp_path / "electra" / "config.json").read_text())
    (tmp_path / "electra.cfg").write_text(json.dumps(written))
    (tmp_path / "plain.cfg").write_text(json.dumps({k: v for k, v in written.items() if k != "model_type"}))
    assert model_type(tmp_path / "electra") == model_type(tmp_path / "electra.cfg") == "electra"
    assert model_type(tmp_path / "plain.cfg") == "bert"  # as a folder whose config.json names none
    run = RunConfig(data=str(tmp_path), config=str(tmp_path / "electra.cfg"))
    with pytest.raises(BertkitError, match="is an ELECTRA config .*--method electra"):
        build_model(run, vocab_size=99, objective="none")
    electra = build_model(RunConfig(data=str(tmp_path), config=run.config, method="electra"), 99, "none")
    assert electra.config.embedding_size == TINY["embedding_size"]
    for text, says in (("{not json", "is not readable JSON"), ("[1, 2]", "is not a JSON object")):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(BertkitError) as err:
            build_model(RunConfig(data=str(tmp_path), config=str(tmp_path / "bad.json")), vocab_size=99, objective="none")
        assert str(err.value).startswith(f"{tmp_path / 'bad.json'} {says}")
        assert str(err.value).endswith(": fix or replace the file") and "\n" not in str(err.value)


def test_configs_say_which_family_they_are(tmp_path):
    ElectraModel(config()).save_pretrained(tmp_path)
    with pytest.raises(BertkitError, match="model_type 'electra'"):
        BertForSequenceClassification.from_pretrained(tmp_path)
    assert class_for(None, BertForSequenceClassification) is BertForSequenceClassification
    with pytest.raises(BertkitError, match="embedding_size"):
        config(embedding_size=0)


def test_generator_config_is_a_quarter_with_the_head_size_kept():
    base = ElectraConfig.preset("base")
    gen = base.generator_config()
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (192, 3, 768)
    assert (gen.num_hidden_layers, gen.embedding_size, gen.vocab_size) == (12, 768, base.vocab_size)
    assert base.generator_config(1.0).hidden_size == 768
    with pytest.raises(BertkitError, match="fraction"):
        base.generator_config(0.0)


# --- the pre-training step ---------------------------------------------------------------------


def pretraining_model(seed=0, **overrides):
    c = config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)
    return ElectraPretrainingModel(c, generator=torch.Generator().manual_seed(seed))


def masked_batch():
    """Two rows of 9, the second padded after 6; positions 2 and 5 masked (id 4 = [MASK])."""
    ids, mask, types = inputs()
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5]] = ids[:, [2, 5]]
    masked = ids.clone()
    masked[:, [2, 5]] = 4
    return dict(input_ids=masked, labels=labels, attention_mask=mask, token_type_ids=types)


def test_replaced_means_the_token_differs_from_the_original():
    ids = torch.tensor([[10, 4, 12, 4, 14]])  # positions 1 and 3 masked; originals 11 and 13
    labels = torch.tensor([[-100, 11, -100, 13, -100]])
    corrupted, replaced = corrupt(ids, labels, torch.tensor([11, 50]))  # 11 = the original, 50 is not
    assert corrupted.tolist() == [[10, 11, 12, 50, 14]]
    assert replaced.tolist() == [[False, False, False, True, False]]


def test_sampling_is_seeded_and_reproducible():
    model, batch = pretraining_model(), masked_batch()
    run = lambda seed: model(**batch, rng=torch.Generator().manual_seed(seed))  # noqa: E731
    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a.corrupted_ids, b.corrupted_ids) and torch.equal(a.loss, b.loss)
    others = [run(s).sampled for s in range(8, 14)]
    assert any(not torch.equal(a.sampled, s) for s in others + [c.sampled])
    # the labels the discriminator saw are exactly "differs from the original"
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    assert torch.equal(a.replaced, a.corrupted_ids != original)
    assert torch.equal(a.corrupted_ids[batch["labels"] == -100], batch["input_ids"][batch["labels"] == -100])


def test_the_loss_is_mlm_plus_fifty_times_the_discriminator_loss_over_real_tokens():
    model, batch = pretraining_model(), masked_batch()
    out = model(**batch, rng=torch.Generator().manual_seed(0))
    real = batch["attention_mask"].bool()
    by_hand = torch.nn.functional.binary_cross_entropy_with_logits(out.disc_logits[real], out.replaced[real].float())
    torch.testing.assert_close(out.disc_loss, by_hand)
    torch.testing.assert_close(out.loss, out.mlm_loss + 50.0 * out.disc_loss)
    # padding gets no loss: whatever the discriminator says at padded positions changes nothing
    logits = out.disc_logits.detach().clone()
    logits[~real] = 1e4
    from bertkit.model.electra import discriminator_loss
    torch.testing.assert_close(discriminator_loss(logits, out.replaced, batch["attention_mask"]), by_hand.detach())
    counts = out.counts()
    assert counts["disc_total"] == real.sum() == counts["tokens"] and counts["mlm_total"] == 4
    rates = electra_metrics(counts)
    assert rates["disc_acc"] == counts["disc_correct"] / 15 and 0 <= rates["sampled_original"] <= 1


def test_the_discriminator_loss_sends_no_gradient_into_the_generator():
    model, batch = pretraining_model(), masked_batch()
    out = model(**batch, rng=torch.Generator().manual_seed(0))
    out.disc_loss.backward()
    shared = {id(p) for p in model.discriminator.electra.embeddings.parameters()}
    generator_only = [(n, p) for n, p in model.generator.named_parameters() if id(p) not in shared]
    assert generator_only and all(p.grad is None for _, p in generator_only), [n for n, p in generator_only if p.grad is not None]
    assert model.discriminator.electra.embeddings.word_embeddings.weight.grad is not None  # shared: it learns
    model.zero_grad()
    model(**batch, rng=torch.Generator().manual_seed(0)).mlm_loss.backward()
    assert all(p.grad is None for p in model.discriminator.discriminator_predictions.parameters())


def test_the_held_out_loss_is_the_training_objective_over_the_slice():
    """An ELECTRA run's held-out loss (metrics.jsonl, curves, its last line) summed each batch's mean losses and
    divided by the item counts: 0.13 beside a training loss of 41. It is mlm + 50 x disc, each term's mean over
    all of its items (masked tokens; real tokens), as one batch gives it; the replacements drawn from each
    batch's sample_seed, as in a run."""
    from bertkit.pretraining.train import evaluate
    from bertkit.training.loop import autocast_for

    model, whole = pretraining_model().eval(), masked_batch()
    rows = [{k: v[i:i + 1] for k, v in whole.items()} | {"sample_seed": torch.tensor(7 + i)} for i in range(2)]
    with torch.no_grad():
        outs = [model(**row) for row in rows]
        one = model(**rows[0]).loss
    masked = [float(o.targets.numel()) for o in outs]
    real = [float(o.real.sum()) for o in outs]  # 9 and 6: the terms' means weigh the rows differently
    mlm = sum(float(o.mlm_loss) * n for o, n in zip(outs, masked)) / sum(masked)
    disc = sum(float(o.disc_loss) * n for o, n in zip(outs, real)) / sum(real)
    autocast = autocast_for("fp32", "cpu")
    assert evaluate(model, rows[:1], autocast, disc_weight=50.0)["loss"] == pytest.approx(float(one), rel=1e-6)
    assert evaluate(model, rows, autocast, disc_weight=50.0)["loss"] == pytest.approx(mlm + 50.0 * disc, rel=1e-6)


def test_embeddings_stay_shared_after_save_and_load(tmp_path):
    model = pretraining_model()
    assert model.generator.electra.embeddings is model.discriminator.electra.embeddings
    model.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / GENERATOR_DIR / "config.json").is_file()
    loaded = ElectraPretrainingModel.from_pretrained(tmp_path)
    assert loaded.generator.electra.embeddings is loaded.discriminator.electra.embeddings
    # 6 heads x 1/4 = 1.5 -> 2 heads of 6
    assert loaded.generator.config.hidden_size == 12 and loaded.config.hidden_size == 36
    batch = masked_batch()
    a = model.eval()(**batch, rng=torch.Generator().manual_seed(3))
    b = loaded(**batch, rng=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a.loss, b.loss, atol=0, rtol=0)
    # one optimizer step moves one tensor, seen by both networks
    opt = torch.optim.SGD(loaded.parameters(), lr=0.1)
    loaded.train()(**batch, rng=torch.Generator().manual_seed(3)).loss.backward()
    opt.step()
    assert torch.equal(loaded.generator.electra.embeddings.word_embeddings.weight,
                       loaded.discriminator.electra.embeddings.word_embeddings.weight)
    # a state-dict round trip (what resumable checkpoints hold) keeps them shared
    fresh = pretraining_model(seed=9)
    fresh.load_state_dict(loaded.state_dict())
    assert fresh.generator.electra.embeddings is fresh.discriminator.electra.embeddings
    torch.testing.assert_close(fresh.discriminator.electra.embeddings.word_embeddings.weight,
                               loaded.discriminator.electra.embeddings.word_embeddings.weight, atol=0, rtol=0)


def test_a_run_folders_config_is_read_once_for_its_kind_and_its_settings(tmp_path, monkeypatch):
    """ElectraPretrainingModel.from_pretrained read config.json for its model_type, then again for the settings: a
    folder saved over in between (a BERT model's config.json over the run's) was judged ELECTRA and then refused as
    'for model_type bert'. It is read once: the run it held when read loads (here the second read would find BERT)."""
    from test_checkpoint import _replaced_after_its_first_read

    model = pretraining_model()
    model.save_pretrained(tmp_path)
    bert = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 36, "num_attention_heads": 6}
    _replaced_after_its_first_read(monkeypatch, tmp_path / "config.json", bert)
    loaded = ElectraPretrainingModel.from_pretrained(tmp_path)
    assert loaded.config.model_type == "electra" and loaded.config.hidden_size == 36
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters()))


def test_load_refuses_a_generator_trained_apart(tmp_path):
    pretraining_model(seed=0).save_pretrained(tmp_path)
    pretraining_model(seed=1).generator.save_pretrained(tmp_path / GENERATOR_DIR)
    with pytest.raises(BertkitError, match="different embeddings"):
        ElectraPretrainingModel.from_pretrained(tmp_path)
    with pytest.raises(BertkitError, match="share their embeddings"):
        ElectraPretrainingModel(config(), config(embedding_size=24))
    # a generator/ of another shape (another run's, copied in) was told to build its config with
    # config.generator_config(size), a Python call, from `electra show`
    ElectraForMaskedLM(config(embedding_size=24)).save_pretrained(tmp_path / GENERATOR_DIR)
    with pytest.raises(BertkitError, match=r"generator/ and the discriminator .* embedding_size .*another run"):
        ElectraPretrainingModel.from_pretrained(tmp_path)


def test_electra_show_on_a_bert_folder_says_it_is_bert(tmp_path, capsys):
    """A BERT pre-training run given to `electra show` (or to --method electra --init-from) was told it "has no
    generator/ subfolder", as if an ELECTRA run had lost a part; it is another kind of model."""
    from bertkit.cli import main
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForMaskedLM

    BertForMaskedLM(BertConfig(**{k: v for k, v in TINY.items() if k != "embedding_size"})).save_pretrained(tmp_path / "bert")
    assert main(["electra", "show", str(tmp_path / "bert"), "the chef"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a BERT model" in err and "--method electra" in err and "fill-mask" in err, err
    pretraining_model().save_pretrained(tmp_path / "run")
    (tmp_path / "run" / GENERATOR_DIR / "config.json").unlink()
    with pytest.raises(BertkitError, match="generator/config.json is missing"):
        ElectraPretrainingModel.from_pretrained(tmp_path / "run")


@pytest.mark.oracle
def test_embed_reads_an_electra_directory_like_transformers(tmp_path, transformers_mod):
    import bertkit
    from bertkit.text.tokenizer import Tokenizer

    words = ["the", "chef", "cooked", "ate", "a", "meal", ".", "good", "food"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    disc = ElectraForPreTraining(config(vocab_size=len(vocab)), generator=torch.Generator().manual_seed(2))
    disc.save_pretrained(tmp_path, tokenizer=Tokenizer(vocab))
    texts = ["the chef cooked a meal .", "good food"]
    ours = bertkit.embed(texts, model=str(tmp_path), pooling="mean")
    hf = transformers_mod.ElectraModel.from_pretrained(str(tmp_path)).eval()
    for text, row in zip(texts, ours):
        ids = torch.tensor([[2, *(vocab.index(w) for w in text.split()), 3]])
        with torch.no_grad():
            ref = hf(input_ids=ids).last_hidden_state[0].mean(0)
        torch.testing.assert_close(torch.from_numpy(row), ref, atol=1e-5, rtol=0)


def test_the_step_runs_on_cuda_with_a_cuda_generator():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model, batch = pretraining_model().cuda(), {k: v.cuda() for k, v in masked_batch().items()}
    out = model(**batch, rng=torch.Generator(device="cuda").manual_seed(0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.generator.electra.encoder.layers[0].output.weight.grad is not None
    again = model(**batch, rng=torch.Generator(device="cuda").manual_seed(0))
    assert torch.equal(out.corrupted_ids, again.corrupted_ids)
    with pytest.raises(BertkitError, match="torch.Generator\\(device='cuda'\\)"):
        model(**batch, rng=torch.Generator().manual_seed(0))


def test_sentence_pair_batches_are_refused_with_the_fix():
    batch = masked_batch()
    with pytest.raises(BertkitError, match="--objective none"):
        pretraining_model()(**batch, next_sentence_label=torch.tensor([0, 1]))
    with pytest.raises(BertkitError, match="needs labels"):
        pretraining_model()(batch["input_ids"], None)


def test_without_a_generator_the_global_rng_draws_so_checkpointed_rng_state_replays_it():
    model, batch = pretraining_model(), masked_batch()
    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = model(**batch).corrupted_ids
    torch.set_rng_state(state)  # what a resumed run restores from its checkpoint
    assert torch.equal(model(**batch).corrupted_ids, first)


def test_the_discriminator_learns_to_spot_replacements_it_can_see():
    # text uses ids 5-29 only, replacements come from 5-59: a replaced 30-59 gives itself away by
    # its identity alone (30 of the 55 draws), so training must leave the base rate ("never
    # replaced") behind within a hundred steps. Replacements that only context can expose
    # need far longer (docs/pretraining.md, ELECTRA against BERT-MLM).
    from bertkit.model.electra import discriminator_loss

    torch.manual_seed(0)
    B, T = 32, 32
    model = ElectraForPreTraining(config(vocab_size=60, max_position_embeddings=T, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(120):
        ids = torch.randint(5, 30, (B, T), generator=g)
        masked = torch.rand(B, T, generator=g) < 0.15
        corrupted = torch.where(masked, torch.randint(5, 60, (B, T), generator=g), ids)
        replaced = corrupted != ids
        logits = model(corrupted, torch.ones_like(ids)).logits
        loss = discriminator_loss(logits, replaced, torch.ones_like(ids))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    found = ((logits > 0) & replaced).sum() / replaced.sum()
    assert ((logits > 0) == replaced).float().mean() > 1 - replaced.float().mean() + 0.04
    assert 0.4 < found < 0.7  # about 30/55 of the replacements are visible by identity


@pytest.mark.oracle
def test_an_untied_generator_decoder_loads_and_saves_both_ways(tmp_path, transformers_mod):
    """tie_word_embeddings false: generator_lm_head.weight is the generator's own decoder (it was ignored)."""
    torch.manual_seed(0)
    hf = transformers_mod.ElectraForMaskedLM(hf_config(transformers_mod, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / "hf")
    ours = ElectraForMaskedLM.from_pretrained(tmp_path / "hf")
    ids, mask, types = inputs()
    _compare(ours, hf, ids, mask, types, {})
    ours.save_pretrained(tmp_path / "ours")
    back = transformers_mod.ElectraForMaskedLM.from_pretrained(str(tmp_path / "ours")).eval()
    _compare(ours, back, ids, mask, types, {})


@pytest.mark.oracle
def test_a_fine_tuned_transformers_electra_head_predicts_like_transformers(tmp_path, transformers_mod):
    """An ElectraForSequenceClassification / ...TokenClassification saved by transformers (a fine-tuned ELECTRA
    from the hub) was refused by predict: "not a fine-tuned task model; fine-tune it first"."""
    import bertkit
    from bertkit.text.tokenizer import Tokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))]
    texts = ["w1 w2 w3", "w7 w8"]
    ids = torch.tensor([[2, 6, 7, 8, 3], [2, 12, 13, 3, 0]])
    mask = (ids != 0).long()
    torch.manual_seed(0)
    for name in ("ElectraForSequenceClassification", "ElectraForTokenClassification"):
        hf = getattr(transformers_mod, name)(hf_config(transformers_mod, num_labels=3)).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.05)
            logits = hf(input_ids=ids, attention_mask=mask).logits
        hf.save_pretrained(tmp_path / name)
        Tokenizer(vocab).save_pretrained(tmp_path / name)
        got = bertkit.predict(str(tmp_path / name), texts)
        if name == "ElectraForSequenceClassification":
            probs = torch.tensor([[row["probabilities"][f"LABEL_{i}"] for i in range(3)] for row in got])
            torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-5, rtol=0)
        else:  # one label per word: the argmax at each word's first piece
            expected = [[f"LABEL_{int(i)}" for i in row[1:1 + n]] for row, n in zip(logits.argmax(-1), (3, 2))]
            assert [row["tags"] for row in got] == expected, got


def test_electras_heads_are_berts_heads_on_one_encoder_forward():
    """Issue 36 item 5: ELECTRA's encoder is BertModel with its own embeddings (it overrides `embed`, never
    `forward`), and each fine-tuning head and the generator is the BERT head of its kind, building its modules
    under HF ELECTRA's names: a forward written again in electra.py would fail here. The discriminator
    (ElectraForPreTraining) has no BERT head of its kind; it runs the encoder through heads.encode too."""
    import inspect

    from bertkit.model import electra, heads, modeling

    assert issubclass(electra.ElectraModel, modeling.BertModel) and "forward" not in vars(electra.ElectraModel)
    for cls in electra.HEADS:
        if cls is ElectraForPreTraining:
            assert "encode(self," in inspect.getsource(cls.forward)
            continue
        bert = getattr(heads, cls.__name__.replace("Electra", "Bert"))
        assert issubclass(cls, bert) and "forward" not in vars(cls), cls.__name__
