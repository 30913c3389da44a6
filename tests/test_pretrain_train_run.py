"""`pretrain run` end to end on a slice of the shared corpus, with a tiny BERT.

The saved model is checked against transformers (the oracle): it loads our
Hugging Face checkpoint and must compute the same pre-training logits and loss
as our own classes, and our fine-tuning head loads it too.
"""

import dataclasses
import functools
import json

import pytest
import torch

from pretrain_support import BOOKS, TINY_MODEL, make_prepared_data, refusal, run_cli, tiny_config_file, train_losses

from bertkit.errors import BertkitError
from bertkit.pretraining.run_config import RunConfig
from bertkit.pretraining.held_out import held_out_split
from bertkit.pretraining.train import batch_metrics, build_model, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nsp_data(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nsp")
    return make_prepared_data(shared_data, tmp), tiny_config_file(tmp)


def tiny_run(data, config, out, schedule="linear", learning_rate=1e-3, **kw) -> RunConfig:
    cfg = RunConfig(data=data, output=out, config=config, max_steps=3, batch_size=8,
                    eval_every=3, eval_sequences=16, save_every=2, seed=5)
    cfg = dataclasses.replace(cfg, **kw)
    cfg.optim.learning_rate, cfg.optim.schedule = learning_rate, schedule
    run(cfg, progress=False)
    return cfg


def test_the_cli_leaves_a_hugging_face_checkpoint_with_its_vocab(nsp_data, tmp_path, capsys):
    data, config = nsp_data
    out = tmp_path / "run"
    res = run_cli("pretrain", "run", data, "--config", config, "--max-steps", 3, "--batch-size", 8, "--output", out,
                  "--eval-every", 3, "--eval-sequences", 16)
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "metrics.jsonl",
                 "run_config.json"):
        assert (out / name).is_file(), name
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (data / "vocab.txt").read_text() == (out / "vocab.txt").read_text()
    config_json = json.loads((out / "config.json").read_text())
    assert config_json["architectures"] == ["BertForPreTraining"]
    assert config_json["hidden_size"] == TINY_MODEL["hidden_size"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert {"loss", "mlm_acc", "nsp_acc", "lr", "tokens_per_s"} <= train[0].keys()
    evals = [r for r in rows if r["split"] == "eval"]
    assert evals and 0 < evals[-1]["mlm_baseline"] < 1
    # the run's last words: where the model went and its held-out figures (issue 41 item 10)
    last = evals[-1]
    assert res.stdout.strip().splitlines()[-1] == (
        f"saved the model to {out}/ (model.safetensors, config.json, vocab.txt; curves in curves.png); held out "
        f"at step 3: loss {last['loss']:.4f}, mlm_acc {last['mlm_acc']:.4f}, nsp_acc {last['nsp_acc']:.4f}, "
        f"mlm_baseline {last['mlm_baseline']:.4f}")
    # stderr is a pipe, not a terminal: the bar is drawn when it starts and ends, not at every step
    assert res.stderr.count("pretrain:") <= 2, res.stderr
    # a second run into the same directory must not silently overwrite it
    status, err = refusal(capsys, "pretrain", "run", data, "--config", config, "--max-steps", 1, "--output", out)
    assert status == 2 and "--resume" in err
    # --quiet (--no-progress), as every other command with a bar: it was 'unrecognized arguments'
    res = run_cli("pretrain", "run", data, "--config", config, "--max-steps", 1, "--batch-size", 8, "--eval-every", 0,
                  "--output", tmp_path / "quiet", "--quiet")
    assert "pretrain:" not in res.stderr and (tmp_path / "quiet" / "model.safetensors").is_file()


def test_resume_takes_compile_on_or_off_and_refuses_what_changes_the_run(tmp_path):
    """--compile wraps the same arithmetic in torch.compile: a run started eager may go on compiled (a resume
    with --compile was refused as a changed setting), while a setting that changes what is computed is not."""
    from bertkit.cli import build_parser
    from bertkit.options import from_args

    parser = build_parser()
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"data": str(tmp_path / "data"), "output": str(out)}))
    args = parser.parse_args(["pretrain", "run", str(tmp_path / "data"), "-o", str(out), "--resume", "--compile"])
    assert from_args(args, RunConfig).compile is True
    args = parser.parse_args(["pretrain", "run", str(tmp_path / "data"), "-o", str(out), "--resume", "--batch-size",
                              "16"])
    with pytest.raises(BertkitError, match="--batch-size 16 \\(the run used 32\\)"):
        from_args(args, RunConfig)


@pytest.mark.oracle
def test_transformers_loads_the_result_and_agrees(nsp_data, tmp_path, transformers_mod):
    from bertkit.model.heads import BertForPreTraining, BertForSequenceClassification
    from bertkit.pretraining.dataset import PretrainingDataset

    data, config = nsp_data
    out = tmp_path / "run"
    tiny_run(data, config, out)

    ds = PretrainingDataset(data, seed=0)
    batch = ds.collator()([ds[i] for i in range(6)], torch.Generator().manual_seed(0))
    ours = BertForPreTraining.from_pretrained(out).eval()
    theirs = transformers_mod.BertForPreTraining.from_pretrained(out).eval()
    with torch.no_grad():
        a = ours(**batch)
        b = theirs(**batch)
    masked = batch["labels"] != -100
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits[masked], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-5)
    # the fine-tuning head starts from it (a fresh classifier, the pre-training heads unused)
    with pytest.warns(UserWarning, match="missing .*classifier"):
        clf = BertForSequenceClassification.from_pretrained(out, strict=False, num_labels=2)
    torch.testing.assert_close(clf.bert.embeddings.word_embeddings.weight, ours.bert.embeddings.word_embeddings.weight)


def test_mlm_only_lamb_bf16_cosine(shared_data, tmp_path):
    data = make_prepared_data(shared_data, tmp_path / "none", objective="none")
    config = tiny_config_file(tmp_path)
    tiny_run(data, config, tmp_path / "bf16", optimizer="lamb", precision="bf16", schedule="cosine")
    rows = train_losses(tmp_path / "bf16")
    assert sorted(rows) == [1, 2, 3] and all(torch.isfinite(torch.tensor(v)) for v in rows.values())
    saved = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert saved["architectures"] == ["BertForMaskedLM"]  # no NSP head without a pair objective
    # MLM accuracy is logged for an MLM-only model too (its head calls the logits `logits`)
    logged = [json.loads(line) for line in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    for split in ("train", "eval"):
        rows_of_split = [r for r in logged if r["split"] == split]
        assert rows_of_split and all(0 <= r["mlm_acc"] <= 1 and "nsp_acc" not in r for r in rows_of_split), split
    # the first loss is computed before any update: bf16 autocast must agree with fp32 to bf16 precision
    tiny_run(data, config, tmp_path / "fp32", optimizer="lamb", schedule="cosine")
    assert rows[1] == pytest.approx(train_losses(tmp_path / "fp32")[1], rel=2e-2)


def test_mlm_accuracy_counts_the_same_for_both_pre_training_heads():
    # BertForMaskedLM and BertForPreTraining with the same encoder and MLM head must count the
    # same correct predictions, and both must equal a count from the full [B, T, V] logits
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForMaskedLM, BertForPreTraining

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    both = BertForPreTraining(config, generator=torch.Generator().manual_seed(0)).eval()
    mlm = BertForMaskedLM(config).eval()
    mlm.load_state_dict(both.state_dict(), strict=False)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (4, 12), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(ids.shape, generator=g) < 0.4
    labels[masked] = torch.randint(0, 50, (int(masked.sum()),), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    with torch.no_grad():
        full = mlm(input_ids=ids).logits  # [B, T, V], no labels: every position projected
        expected = float((full[masked].argmax(-1) == labels[masked]).sum())
        counts_mlm = batch_metrics(mlm(**batch), batch)
        counts_both = batch_metrics(both(**batch, next_sentence_label=torch.zeros(4, dtype=torch.long)),
                                    {**batch, "next_sentence_label": torch.zeros(4, dtype=torch.long)})
    assert counts_mlm["mlm_total"] == counts_both["mlm_total"] == float(masked.sum())
    assert counts_mlm["mlm_correct"] == counts_both["mlm_correct"] == expected
    assert "nsp_total" not in counts_mlm and counts_both["nsp_total"] == 4


def test_torch_compile_trains_like_eager(nsp_data, tmp_path, monkeypatch):
    # Inductor needs minutes to generate C++ for a BERT on 2 CPU cores, so the test runs
    # --compile with dynamo's "eager" backend: graph capture and the wrapper are real,
    # only the code generation is skipped.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    data, config = nsp_data
    tiny_run(data, config, tmp_path / "eager", max_steps=2, dropout=0.0, eval_every=0)
    tiny_run(data, config, tmp_path / "compiled", max_steps=2, dropout=0.0, eval_every=0, compile=True)
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert sorted(compiled) == [1, 2]
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-4)


def test_bad_data_and_config_are_user_errors(nsp_data, tmp_path):
    data, _ = nsp_data
    with pytest.raises(BertkitError, match="pretrain prepare"):
        tiny_run(tmp_path / "missing", "tiny", tmp_path / "a")
    with pytest.raises(BertkitError, match="neither a preset"):
        tiny_run(data, "gigantic", tmp_path / "b")


def test_paths_given_as_pathlib_paths_run_as_strings_do(nsp_data, tmp_path):
    """RunConfig(data=Path(...), output=Path(...)), a notebook's paths, loaded the data and built the model, then
    died writing run_config.json (TypeError: Object of type PosixPath is not JSON serializable)."""
    from pathlib import Path

    data, config = nsp_data
    for kind in (str, Path):
        tiny_run(kind(data), kind(config), kind(tmp_path / kind.__name__), max_steps=2, eval_every=0)
    written = [json.loads((tmp_path / kind / "run_config.json").read_text()) for kind in ("str", "Path")]
    assert written[1]["data"] == str(data) and {**written[1], "output": ""} == {**written[0], "output": ""}
    assert RunConfig(data=Path("d")).data == "d"  # the config holds strings, as the command line gives


def test_a_model_too_short_or_without_segment_b_for_the_data_is_refused_before_training(nsp_data, tmp_path):
    # both died in the first forward pass, telling a pre-training run to "truncate the input (tokenizer
    # max_length <= 16)" or that "token_type_ids must be in [0, 1)"
    data, _ = nsp_data  # NSP pairs of up to 32 tokens
    for i, (change, words) in enumerate([({"max_position_embeddings": 16}, r"max_position_embeddings 16 .*32 tokens"),
                                         ({"type_vocab_size": 1}, r"type_vocab_size 1 .*segment B")]):
        config = tmp_path / f"c{i}.json"
        config.write_text(json.dumps({**TINY_MODEL, **change}))
        with pytest.raises(BertkitError, match=words):
            tiny_run(data, config, tmp_path / f"r{i}")
        assert not (tmp_path / f"r{i}" / "metrics.jsonl").exists()


def test_a_diverging_run_stops_with_the_step_and_batch_named(nsp_data, tmp_path):
    # AdamW moves every weight by about lr per step: lr 1e30 overflows the activations in step 2
    data, config = nsp_data
    res = run_cli("pretrain", "run", data, "--config", config, "--max-steps", 5, "--batch-size", 4,
                  "--learning-rate", 1e30, "--warmup-ratio", 0, "--eval-every", 0, "-o", tmp_path / "nan", check=False)
    assert res.returncode == 2
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("bertkit: error: non-finite loss at step 2 ") and "training positions 4..7" in error
    assert sorted(train_losses(tmp_path / "nan")) == [1]  # nothing after the bad step was logged
    assert not (tmp_path / "nan" / "model.safetensors").exists()


def test_init_from_continues_a_checkpoint_on_other_data(nsp_data, shared_data, tmp_path):
    # continued (domain-adaptive) pre-training: an MLM + NSP run's weights go on with MLM alone
    from bertkit.model.checkpoint import hf_state_dict
    from bertkit.model.heads import BertForMaskedLM, BertForPreTraining, BertForSequenceClassification

    data, config = nsp_data
    first = tmp_path / "first"
    tiny_run(data, config, first, max_steps=40, eval_every=0, dropout=0.0, learning_rate=1e-2)
    other = make_prepared_data(shared_data, tmp_path / "none", objective="none")

    def continued(source, objective="none"):
        cfg = RunConfig(data=str(other), output=str(tmp_path / "unused"), init_from=str(source), seed=9)
        return build_model(cfg, 30522, objective)

    model, start = continued(first), BertForPreTraining.from_pretrained(first)
    assert isinstance(model, BertForMaskedLM) and model.training
    ours, theirs = hf_state_dict(model), hf_state_dict(start)
    assert ours.keys() < theirs.keys()  # everything but the NSP head
    for key, value in ours.items():
        assert torch.equal(value, theirs[key]), key

    # the run starts where the checkpoint left off: its first loss is far below a fresh model's
    run_cli("pretrain", "run", other, "--init-from", first, "--max-steps", 2, "--batch-size", 8, "--dropout", 0,
            "--eval-every", 0, "--output", tmp_path / "second")
    tiny_run(other, config, tmp_path / "fresh", max_steps=2, eval_every=0, dropout=0.0)
    assert train_losses(tmp_path / "second")[1] < train_losses(tmp_path / "fresh")[1] - 1.0
    assert json.loads((tmp_path / "second" / "run_config.json").read_text())["init_from"] == str(first)
    assert json.loads((tmp_path / "second" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    # an MLM-only checkpoint may go on with a pair objective: only the NSP head starts fresh
    pair = continued(tmp_path / "second", objective="nsp")
    torch.testing.assert_close(pair.bert.embeddings.word_embeddings.weight,
                               BertForMaskedLM.from_pretrained(tmp_path / "second").bert.embeddings.word_embeddings.weight)

    # another vocabulary, or a checkpoint without the masked-LM head, is refused by name
    (tmp_path / "vocab").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "vocab" / name).write_bytes((first / name).read_bytes())
    words = (first / "vocab.txt").read_text().splitlines()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join([words[1], words[0], *words[2:]]) + "\n")
    with pytest.raises(BertkitError, match="vocab.txt differs"):
        continued(tmp_path / "vocab")
    with pytest.warns(UserWarning, match="missing .*classifier"):
        clf = BertForSequenceClassification.from_pretrained(first, strict=False, num_labels=2)
    clf.save_pretrained(tmp_path / "clf")
    (tmp_path / "clf" / "vocab.txt").write_text((first / "vocab.txt").read_text())
    with pytest.raises(BertkitError, match="does not fit BertForMaskedLM: .*missing.*cls.predictions.*"
                                           "no masked-LM head .*continue from a pre-training output"):
        continued(tmp_path / "clf")


def test_electra_init_from_checks_the_vocabulary_as_bert_does(tmp_path):
    # --method electra --init-from trained a 1,000-token model on data of another 39-token vocabulary
    # without a word (ids meaning other tokens), and saved it with the data's vocab.txt
    from bertkit.model.electra import ElectraConfig
    from bertkit.model.electra_pretraining import ElectraPretrainingModel
    from bertkit.text.tokenizer import Tokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]
    config = ElectraConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=7, embedding_size=16)
    ElectraPretrainingModel(config, config.generator_config(0.5)).save_pretrained(tmp_path / "run",
                                                                                 tokenizer=Tokenizer(words))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "vocab.txt").write_text("\n".join([*words[:5], *"klmnopqrst"]) + "\n")
    cfg = RunConfig(data=str(tmp_path / "data"), output=str(tmp_path / "out"), method="electra",
                    init_from=str(tmp_path / "run"))
    with pytest.raises(BertkitError, match="its vocab.txt differs from"):
        build_model(cfg, len(words), "none")
    (tmp_path / "data" / "vocab.txt").write_text((tmp_path / "run" / "vocab.txt").read_text())
    assert build_model(cfg, len(words), "none").config.vocab_size == len(words)
    # --dropout reached a fresh ELECTRA and a BERT --init-from, not an ELECTRA --init-from (it kept 0.1)
    model = build_model(dataclasses.replace(cfg, dropout=0.0), len(words), "none")
    for c in (model.config, model.generator.config):
        assert (c.hidden_dropout_prob, c.attention_probs_dropout_prob) == (0.0, 0.0)
    # the ELECTRA run continued without --method electra said "this config is for model_type 'electra', not 'bert'"
    with pytest.raises(BertkitError, match=r"--init-from .*run is an ELECTRA model.*--method electra"):
        build_model(dataclasses.replace(cfg, method="bert"), len(words), "none")


@pytest.mark.parametrize("method", ["bert", "electra"])
def test_init_from_reads_the_folders_config_json_once(tmp_path, monkeypatch, method):
    """--init-from's config.json was read for whether the folder is static, again for its model_type (BERT) and
    again for the model's settings: a save landing in between (here the other kind's config over it) was judged by
    one file and built from the other ('is an ELECTRA model' / 'holds a BERT model' refusals). It is read once: the
    model the folder held when read, weights equal to those saved."""
    from collections import Counter
    from pathlib import Path

    from test_checkpoint import _replaced_after_its_first_read

    from bertkit.model.checkpoint import hf_state_dict
    from bertkit.model.config import BertConfig
    from bertkit.model.electra import ElectraConfig
    from bertkit.model.electra_pretraining import ElectraPretrainingModel
    from bertkit.model.heads import BertForMaskedLM
    from bertkit.text.tokenizer import Tokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]
    shape = dict(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=7)
    source = tmp_path / "source"
    if method == "electra":
        config = ElectraConfig(**shape, embedding_size=16)
        saved = ElectraPretrainingModel(config, config.generator_config(0.5))
        other = {**BertConfig(**shape).to_dict(), "model_type": "bert"}
    else:
        saved = BertForMaskedLM(BertConfig(**shape), generator=torch.Generator().manual_seed(3))
        other = {**ElectraConfig(**shape, embedding_size=16).to_dict(), "model_type": "electra"}
    saved.save_pretrained(source, tokenizer=Tokenizer(words))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "vocab.txt").write_text((source / "vocab.txt").read_text())
    _replaced_after_its_first_read(monkeypatch, source / "config.json", other)
    reads, replacing = Counter(), Path.read_text

    def read_text(self, *args, **kwargs):
        reads[self.name if self.parent == source else None] += 1
        return replacing(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    cfg = RunConfig(data=str(tmp_path / "data"), output=str(tmp_path / "out"), method=method, init_from=str(source))
    model = build_model(cfg, len(words), "none")  # main: refused, the second read judged the other kind
    assert reads["config.json"] == 1  # main: 3 (BERT), 2 (ELECTRA)
    assert json.loads((source / "config.json").read_text())["model_type"] == other["model_type"]  # the premise
    ours, theirs = (hf_state_dict(m.discriminator if method == "electra" else m) for m in (model, saved))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_the_held_out_slice_shares_no_text_with_training(nsp_data, shared_data, tmp_path):
    import numpy as np

    from bertkit.pretraining.prepare import PrepareConfig, prepare

    def docs_of(data):
        manifest = json.loads((data / "manifest.json").read_text())
        return np.concatenate([np.load(data / e["path"] / "docs.npy") for e in manifest["shards"]])

    # pairs: whole documents are held out, and no training pair touches one (as A or B)
    data, _ = nsp_data
    docs = docs_of(data)
    train, held = held_out_split(data, len(docs), 16, seed=5)
    assert len(held) == 16 and not set(train) & set(held)
    assert not np.isin(docs[train], np.unique(docs[held, 0])).any()
    # sequences packed across documents, the corpus read once: instances are held out
    packed = make_prepared_data(shared_data, tmp_path / "once", objective="none")
    n = len(docs_of(packed))
    assert (docs_of(packed) == -1).all()  # no instance names a single document
    train, held = held_out_split(packed, n, 16, seed=5)
    assert len(held) == 16 and sorted([*train, *held]) == list(range(n))
    # read twice, the same text is in two instances: nothing is held out, and the run says so
    (tmp_path / "one.txt").write_text((shared_data / "pretrain_corpus" / "gutenberg" / BOOKS[0]).read_text()[:8000])
    prepare([tmp_path / "one.txt"], tmp_path / "twice", PrepareConfig(max_seq_length=32, objective="none",
            dynamic_masking=True, dupe_factor=2, documents="file", workers=1), progress=False)
    # the warning gives this cause, not "too small" (docs/pretraining.md's packed run said that of a big corpus)
    with pytest.warns(UserWarning, match="no held-out evaluation: .* prepared with --dupe-factor 2: .* --dupe-factor 1") as caught:
        tiny_run(tmp_path / "twice", tiny_config_file(tmp_path), tmp_path / "run", max_steps=1)
    assert not any("too small" in str(w.message) for w in caught)
    assert not [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
