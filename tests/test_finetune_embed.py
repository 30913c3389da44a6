"""`bertkit finetune embed` end to end on a tiny model and small slices of the shared data.

- triplets (SNLI) with an STS dev set, scored pairs (STS-B) with CoSENT, and a
  BEIR folder (a slice of SciFact) with retrieval dev evaluation: each trains
  through the one loop and saves a model in the sentence-transformers layout,
  with metrics.jsonl, curves.png and the best epoch's figures;
- the cached loss is a bigger batch (the same losses and weights as the plain
  loss on the whole batch), accumulation is not (with in-batch negatives);
- a run killed with SIGKILL and resumed equals the uninterrupted one (exact);
- one batch, dropout off: the losses and the trained weights equal sentence-transformers'
  trainer's (the whole update: loss, clipping, AdamW, the schedule);
- bad input is one clear error.
"""

import json
import signal
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import oracle
from pretrain_support import run_cli
from test_finetune import tiny_model_dir

from bertkit.embeddings.features import embed
from bertkit.errors import BertkitError
from bertkit.tasks import finetune
from bertkit.tasks.config import TrainConfig
from bertkit.model.sentence_layout import read_layout
from bertkit.training.optim import OptimConfig


def head(src: Path, dst: Path, rows: int) -> Path:
    dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[: rows + 1]), encoding="utf-8")
    return dst


def beir_slice(src: Path, dst: Path, train_queries=16, dev_queries=8, extra_docs=24) -> Path:
    """A small BEIR folder cut from SciFact: some train and test claims, their abstracts and a few others."""
    def qrels(split):
        return [line.split("\t") for line in (src / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]]

    train, test = qrels("train"), qrels("test")
    tq = list(dict.fromkeys(r[0] for r in train))[:train_queries]
    dq = list(dict.fromkeys(r[0] for r in test))[:dev_queries]
    train, test = [r for r in train if r[0] in tq], [r for r in test if r[0] in dq]
    wanted = {r[1] for r in train + test}
    docs, extra = [], 0
    for line in (src / "corpus.jsonl").read_text().splitlines():
        doc = json.loads(line)
        if doc["_id"] in wanted or extra < extra_docs:
            extra += doc["_id"] not in wanted
            docs.append(line)
    (dst / "qrels").mkdir(parents=True)
    (dst / "corpus.jsonl").write_text("\n".join(docs) + "\n")
    queries = [q for q in (src / "queries.jsonl").read_text().splitlines() if json.loads(q)["_id"] in set(tq + dq)]
    (dst / "queries.jsonl").write_text("\n".join(queries) + "\n")
    for name, rows in (("train", train), ("dev", test)):
        lines = "".join("\t".join(r) + "\n" for r in rows)
        (dst / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    return dst


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    d = tmp_path_factory.mktemp("embed_data")
    tiny = tiny_model_dir(d / "tiny", seed=3)
    exact = tiny_model_dir(d / "exact", seed=3)  # dropout off: runs compare to the last digit
    config = json.loads((exact / "config.json").read_text())
    (exact / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                   "attention_probs_dropout_prob": 0.0}))
    return {
        "tiny": tiny, "exact": exact,
        "triplets": head(shared_data / "pairs" / "snli_devtest" / "triplets.tsv", d / "triplets.tsv", 48),
        "sts_train": head(shared_data / "stsb" / "train.tsv", d / "sts_train.tsv", 40),
        "sts_dev": head(shared_data / "stsb" / "dev.tsv", d / "sts_dev.tsv", 30),
        "beir": beir_slice(shared_data / "retrieval" / "scifact", d / "scifact"),
    }


def fast(**kw):
    optim = OptimConfig(learning_rate=kw.pop("lr", 1e-3), warmup_ratio=0.1)
    return TrainConfig(**{"epochs": 2, "batch_size": 8, "seed": 0, "progress": False, "device": "cpu", **kw},
                       optim=optim)


def run(data, out, model="tiny", train="triplets", training=None, **options):
    return finetune("embed", train=str(data[train]), output=str(out), model=str(data.get(model, model)),
                    training=training or fast(), log=lambda s: None, **{"max_length": 32, **options})


def records(out, split):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def test_the_texts_cut_at_max_length_are_counted_and_said(data):
    """A pair whose texts are longer than --max-length trains on their first tokens alone (sentence-transformers'
    cut, kept); nothing said how many were, and a file of long passages trained on their openings. Reference: each
    distinct text's whole encoding (no truncation) against max_length 16: 16 tokens fit, 17 do not."""
    from bertkit.tasks.embedding import EmbeddingExamples, tokenize_rows
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(data["tiny"])
    texts = ["the movie was good .", " ".join(["good"] * 14), " ".join(["bad"] * 15), "the food was bad . " * 9]
    rows = [(texts[0], texts[1]), (texts[2], texts[3]), (texts[1], texts[0]), ("john went to paris .", texts[3])]
    distinct = list(dict.fromkeys(t for row in rows for t in row))
    cut = sum(len(tok.encode(t, truncation=False)) > 16 for t in distinct)
    assert cut == 2 and [len(tok.encode(t, truncation=False)) for t in texts[1:3]] == [16, 17]
    said = []
    ids = tokenize_rows(tok, EmbeddingExamples(rows, ("anchor", "positive")), 16, log=said.append)
    assert said == [f"{cut} of {len(distinct)} distinct texts are longer than --max-length 16 tokens: cut there"]
    # the ids are the tokenizer's own cut at 16, [CLS] and [SEP] kept
    assert ids == [[tok.encode(t, max_length=16).input_ids for t in row] for row in rows]


def test_triplets_with_an_sts_dev_set_train_and_save_an_embedding_model(data, tmp_path):
    out = tmp_path / "out"
    final = run(data, out, dev=str(data["sts_dev"]), matryoshka_dims="32,16")
    assert final["loss"] == "mnrl" and final["train_examples"] == 48
    assert [e["epoch"] for e in final["epochs"]] == [1, 2] and "spearman" in final["dev"]
    assert not {"train_loss", "train_seconds"} & set(final["dev"])  # the dev figures, not the epoch's training
    losses = [r["loss"] for r in records(out, "train")]
    assert len(losses) == 12  # 48 triplets, batches of 8, 2 epochs
    assert sum(losses[-4:]) < sum(losses[:4])  # it learns (lr 1e-3 on a tiny model)
    assert [r["step"] for r in records(out, "eval")] == [6, 12]
    layout = read_layout(out)
    assert (layout.pooling, layout.normalize, layout.max_seq_length, layout.dimensions) == ("mean", True, 32, [32, 16])
    assert (out / "curves.png").stat().st_size > 0 and (out / "model.safetensors").is_file()
    assert json.loads((out / "metrics.json").read_text())["best_epoch"] == final["best_epoch"]


def test_a_max_pooled_model_trains_and_embeds_as_it_was_trained(data, st, tmp_path):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "out"
    final = run(data, out, pooling="max", normalize=False, training=fast(epochs=1))
    assert final["pooling"] == "max" and read_layout(out).pooling == "max"
    texts = ["a man plays a guitar", "two dogs run on the beach", "the cat sleeps"]
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(embed(texts, str(out), dtype="float32"), theirs, rtol=0, atol=1e-6)
    # training on from a model without a Normalize module keeps its layout, pooling and normalisation alike (as
    # sentence-transformers' trainer saves the modules it loaded): it added one, so a dot-product model came back
    # unit-length; run_config.json records what was decided, and sentence-transformers reads the same vectors
    again = tmp_path / "again"
    run(data, again, model=out, training=fast(epochs=1, max_steps=2))
    assert (read_layout(again).pooling, read_layout(again).normalize) == ("max", False)
    assert json.loads((again / "run_config.json").read_text())["normalize"] is False
    ours = embed(texts, str(again), dtype="float32")
    theirs = SentenceTransformer(str(again), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    assert np.abs(np.linalg.norm(theirs, axis=1) - 1).min() > 1e-3  # not unit length
    run(data, tmp_path / "asked", model=out, training=fast(epochs=1, max_steps=2), normalize=True)  # added
    assert read_layout(tmp_path / "asked").normalize


def test_scored_pairs_train_with_cosent(data, tmp_path):
    final = run(data, tmp_path / "out", train="sts_train", pooling="cls", normalize=False,
                training=fast(epochs=1, precision="bf16"))
    assert final["loss"] == "cosent" and final["pooling"] == "cls"
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records(tmp_path / "out", "train"))
    layout = read_layout(tmp_path / "out")
    assert (layout.pooling, layout.normalize) == ("cls", False)


def test_a_beir_folder_trains_on_its_qrels_and_evaluates_retrieval(data, tmp_path):
    out = tmp_path / "out"
    final = run(data, out, train="beir", dev=str(data["beir"]), dev_split="dev", training=fast(epochs=1))
    pairs = sum(1 for _ in (data["beir"] / "qrels" / "train.tsv").open()) - 1
    assert final["train_examples"] == pairs
    for key in ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100"):
        assert 0.0 <= final["dev"][key] <= 1.0
    assert records(out, "eval")[0]["ndcg@10"] == final["dev"]["ndcg@10"]


def test_the_cached_loss_is_a_bigger_batch_and_accumulation_is_not(data, tmp_path):
    plain = run(data, tmp_path / "plain", model="exact", training=fast(epochs=1))
    cached = run(data, tmp_path / "cached", model="exact", loss="cached-mnrl", mini_batch_size=3,
                 training=fast(epochs=1))
    accumulated = run(data, tmp_path / "accum", model="exact", training=fast(epochs=1, batch_size=4, grad_accum=2))
    a, b = records(tmp_path / "plain", "train"), records(tmp_path / "cached", "train")
    assert len(a) == len(b) == 6
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
    wa, wb = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "cached" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-5, msg=k)
    # the same rows per update, but each micro-batch of 4 scores only against itself: an easier task
    c = records(tmp_path / "accum", "train")
    assert c[0]["loss"] < a[0]["loss"] - 0.1
    assert plain["loss"] == "mnrl" and cached["loss"] == "cached-mnrl" and accumulated["train_examples"] == 48


@pytest.mark.slow
def test_a_killed_run_resumes_exactly(data, tmp_path):
    common = ("finetune", "embed", "--train", data["triplets"], "--dev", data["sts_dev"], "--model", data["tiny"],
              "--max-length", 32, "--batch-size", 8, "--epochs", 2, "--save-every", 4, "--learning-rate", 1e-3,
              "--seed", 0, "--no-progress", "--device", "cpu")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_cli(*common, "-o", straight)
    res = run_cli(*common, "-o", killed, kill_at_step=9, check=False)  # in update 10, after step 8
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    run_cli("finetune", "embed", "-o", killed, "--resume")

    def losses(out):
        return {r["step"]: r["loss"] for r in records(out, "train")}

    assert losses(killed) == losses(straight)  # exact, step for step
    wa, wb = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert read_layout(killed) == read_layout(straight)
    # metrics.json too: the dev figures before training (the baseline the gain is read against) are kept
    a, b = (without_seconds(json.loads((d / "metrics.json").read_text())) for d in (straight, killed))
    assert "dev_before_training" in a and b == a


def without_seconds(report):
    if isinstance(report, dict):
        return {k: without_seconds(v) for k, v in report.items() if not k.endswith("_seconds")}
    return [without_seconds(v) for v in report] if isinstance(report, list) else report


def test_help_says_what_accumulation_means_here():
    res = run_cli("finetune", "embed", "--help")
    text = " ".join(res.stdout.split())
    assert "--grad-accum is NOT a bigger batch" in text and "--mini-batch-size" in text


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("content,options,message", [
    ("query\tpassage\na\tb\n", {}, "neither pairs"),
    ("", {}, "empty file"),
    ("anchor\tpositive\n\t\n", {}, "no usable rows"),
    ("anchor\tpositive\na\tb\nc\td\n", {"loss": "cosent"}, "use --loss mnrl"),
    ("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n", {"loss": "mnrl"}, "use --loss cosent"),
    ("sentence1\tsentence2\tscore\na\tb\thigh\n", {}, "score 'high' is not a number"),
    ("sentence1\tsentence2\tscore\na\tb\tinf\nc\td\t2\n", {}, "score 'inf' is not a finite number"),
    ("anchor\tpositive\na\tb\nc\td\n", {"matryoshka_dims": "64,16"}, "exceeds the model's 32"),
    ("anchor\tpositive\na\tb\nc\td\n", {"matryoshka_dims": "32,x"}, "comma-separated list"),
])
def test_bad_input_is_one_clear_error(data, tmp_path, content, options, message):
    path = write(tmp_path / "train.tsv", content)
    with pytest.raises(BertkitError, match=message):
        finetune("embed", train=str(path), output=str(tmp_path / "out"), model=str(data["tiny"]),
                 training=fast(), log=lambda s: None, **options)
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_beir_is_refused(data, tmp_path):
    with pytest.raises(BertkitError, match="not a BEIR one"):
        finetune("embed", train=str(tmp_path), output=str(tmp_path / "out"), model=str(data["tiny"]),
                 training=fast(), log=lambda s: None)


def test_a_split_beside_a_table_is_refused_not_ignored(data, tmp_path):
    """--train-split and --dev-split name a BEIR folder's qrels; beside a table of pairs (or of scored pairs for
    --dev) they changed nothing, silently: `finetune embed --train pairs.tsv --train-split test` trained on every
    row and saved the model. Refused in one line before any training, naming the flag; a BEIR folder takes them."""
    pairs = write(tmp_path / "pairs.tsv", "anchor\tpositive\na\tb\nc\td\n")
    scored = write(tmp_path / "sts.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n")
    for options, flag in (({"train_split": "test"}, "--train-split test"),
                          ({"dev": str(scored), "dev_split": "test"}, "--dev-split test")):
        with pytest.raises(BertkitError, match=f"^{flag} names a BEIR folder's qrels"):
            finetune("embed", train=str(pairs), output=str(tmp_path / "out"), model=str(data["tiny"]),
                     training=fast(), log=lambda s: None, **options)
        assert not (tmp_path / "out").exists()


def test_a_run_of_an_earlier_bertkit_resumes_on_its_table(data, tmp_path):
    """A run_config.json written before a split beside a table was refused (3c30d36) holds the splits' defaults
    then, "train" and "dev": `finetune embed -o RUN --resume` of a run of the bertkit of 11-25 (53df944) on a
    table of pairs was refused, "--train-split train names a BEIR folder's qrels ...: leave --train-split out",
    a flag the user never typed. It resumes as it ran; a split typed beside a table is still refused."""
    from bertkit.cli import build_parser, main
    from bertkit.options import from_args
    from bertkit.tasks.config import EmbedConfig
    from bertkit.tasks.embedding import read_examples

    out = tmp_path / "emb"
    out.mkdir()
    # the settings that bertkit saved at the start (those this test needs; the rest at their defaults)
    saved = {"train": str(data["sts_train"]), "output": str(out), "dev": str(data["sts_dev"]),
             "model": str(data["tiny"]), "train_split": "train", "dev_split": "dev", "pooling": "mean"}
    (out / "run_config.json").write_text(json.dumps(saved))
    args = build_parser().parse_args(["finetune", "embed", "-o", str(out), "--resume"])
    cfg = from_args(args, EmbedConfig)  # as run_finetune reads it
    for path, split, flag in ((cfg.train, cfg.train_split, "--train-split"), (cfg.dev, cfg.dev_split, "--dev-split")):
        assert read_examples(path, split=split, flag=flag, log=lambda s: None).scored  # the table's rows, read
    typed = ["finetune", "embed", "-o", str(tmp_path / "typed"), "--train", str(data["sts_train"]), "--model",
             str(data["tiny"]), "--train-split", "train"]
    assert main(typed) == 2 and not (tmp_path / "typed").exists()


def test_same_seed_same_run(data, tmp_path):
    a = run(data, tmp_path / "a", training=fast(epochs=1))
    b = run(data, tmp_path / "b", training=fast(epochs=1))
    losses = [[r["loss"] for r in records(tmp_path / run, "train")] for run in ("a", "b")]
    assert losses[0] == losses[1]
    assert a["train_examples"] == b["train_examples"]


def test_jsonl_rows_with_negative_columns_and_groups(tmp_path):
    from bertkit.tasks.embedding import read_examples

    rows = [{"anchor": "a", "positive": "b", "negative_1": "c", "negative_2": "d", "group_id": 7},
            {"anchor": "e", "positive": "", "negative_1": "g", "negative_2": "h", "group_id": 8}]
    path = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    got = read_examples(path, log=lambda s: None)
    assert got.rows == [("a", "b", "c", "d")] and got.columns == ("anchor", "positive", "negative_1", "negative_2")
    assert got.groups == ["7"] and got.scores is None  # the row with an empty text is skipped (and counted)
    bad = write(tmp_path / "bad.jsonl", json.dumps({"anchor": "a", "positive": "b", "negative": ["c", "d"]}) + "\n")
    with pytest.raises(BertkitError, match="must hold one text"):
        read_examples(bad, log=lambda s: None)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_training_steps_equal_sentence_transformers_trainer(data, st, tmp_path, pooling):
    """The whole update (loss, backward, clipping, AdamW, the warm-up and linear schedule) against
    sentence-transformers' own trainer: one batch with no text twice (so both no-duplicate samplers
    take it whole, and the loss does not depend on the order of its rows), dropout off, three epochs
    of one update each. The losses and the trained weights must agree; what then still differs
    between two real runs is the order of the batches and the dropout masks, which the seed draws.
    Max pooling too: its gradient reaches only the winning token of each dimension."""
    oracle("datasets", "datasets")
    oracle("accelerate", "accelerate")
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    rows, seen = [], set()
    for line in data["triplets"].read_text(encoding="utf-8").splitlines()[1:]:
        texts = line.split("\t")
        if not seen & set(texts):
            rows.append(texts)
            seen |= set(texts)
    rows = rows[:8]
    batch = tmp_path / "batch.tsv"
    batch.write_text("anchor\tpositive\tnegative\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")

    training = TrainConfig(epochs=3, batch_size=8, seed=1, progress=False, device="cpu",
                           optim=OptimConfig(learning_rate=5e-4, warmup_ratio=0.1, weight_decay=0.0))
    finetune("embed", train=str(batch), output=str(tmp_path / "ours"), model=str(data["exact"]), training=training,
             log=lambda s: None, max_length=32, pooling=pooling)

    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    word = Transformer(str(data["exact"]), max_seq_length=32)
    hidden = json.loads((data["exact"] / "config.json").read_text())["hidden_size"]
    model = SentenceTransformer(modules=[word, Pooling(hidden, pooling)], device="cpu")
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "trainer"), num_train_epochs=3, per_device_train_batch_size=8, learning_rate=5e-4,
        warmup_ratio=0.1, weight_decay=0.0, lr_scheduler_type="linear", batch_sampler=BatchSamplers.NO_DUPLICATES,
        seed=1, save_strategy="no", report_to="none", use_cpu=True, logging_steps=1, disable_tqdm=True)
    columns = {name: [r[i] for r in rows] for i, name in enumerate(("anchor", "positive", "negative"))}
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns),
                                         loss=MultipleNegativesRankingLoss(model))
    trainer.train()

    theirs = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    ours = [r["loss"] for r in records(tmp_path / "ours", "train")]
    assert len(ours) == len(theirs) == 3
    assert ours == pytest.approx(theirs, abs=1e-4)  # the trainer logs its loss rounded
    assert ours[2] < ours[1] < ours[0] + 1e-6  # it learned: the first update is at lr 0 (warm-up)
    trained = load_file(tmp_path / "ours" / "model.safetensors")
    start = load_file(data["exact"] / "model.safetensors")
    peer = {k: v.detach() for k, v in model[0].auto_model.state_dict().items()}
    moved = max((trained[k] - start[k]).abs().max().item() for k in trained)
    gap = max((trained[k] - peer[k]).abs().max().item() for k in trained)
    print(f"largest update {moved:.2e}, largest difference from the peer {gap:.2e}")
    assert moved > 1e-4 and gap < 1e-5, (moved, gap)


def test_the_score_before_training_is_reported(data, tmp_path):
    """finetune embed measures the dev set before its first update: the untouched model's Spearman,
    as `evaluate sts` gives it for the starting folder, and the report shows the change."""
    from bertkit.retrieval.evaluation import evaluate_sts
    from bertkit.tasks import format_report

    final = run(data, tmp_path / "out", dev=str(data["sts_dev"]), training=fast(epochs=1))
    start = evaluate_sts(str(data["tiny"]), str(data["sts_dev"]), max_length=32)
    assert final["dev_before_training"]["spearman"] == pytest.approx(start["spearman"], abs=1e-4)
    after = final["dev"]["spearman"]
    lines = format_report(final).splitlines()
    assert (f"dev spearman before training {start['spearman']:.4f}, after {after:.4f} "
            f"({after - final['dev_before_training']['spearman']:+.4f})") in lines
    # a saved model below its start is said in a line of its own (the kept epoch is only the best trained one)
    assert any(line.startswith("warning: the saved model scores below") for line in lines) == (after < start["spearman"])


def test_a_model_giving_every_dev_pair_one_cosine_trains_and_says_undefined(data, tmp_path):
    """Scored dev pairs on which the model gives every pair the same cosine (here each sentence is one word the
    handmade vocabulary lacks: [CLS] [UNK] [SEP], one vector) have no correlation; `evaluate sts` warns and
    reports null. finetune embed stopped before its first step with a traceback, KeyError: 'spearman' (its dev
    figures kept numbers only). Now the run trains, metrics.json holds null, the report says "undefined", and
    the warning is said once, not before training and after every epoch."""
    import warnings

    from bertkit.retrieval.evaluation import evaluate_sts
    from bertkit.tasks import format_report

    dev = write(tmp_path / "sts.tsv", "sentence1\tsentence2\tscore\nzebra\tquokka\t1\nokapi\tyak\t3\nibex\tnarwhal\t2\n")
    with pytest.warns(UserWarning, match="every pair the same cosine"):  # the premise
        assert evaluate_sts(str(data["tiny"]), str(dev), max_length=32)["spearman"] is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = run(data, tmp_path / "out", dev=str(dev), training=fast(epochs=2))
    assert sum("same cosine" in str(w.message) for w in caught) == 1
    assert final["dev_before_training"]["spearman"] is None and final["dev"]["spearman"] is None
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["dev"]["pearson"] is None and all(e["spearman"] is None for e in metrics["epochs"])
    lines = format_report(final).splitlines()
    assert "spearman undefined, pearson undefined" in lines[1], lines
    assert "dev spearman before training undefined, after undefined" in lines, lines


def test_a_model_trained_below_its_start_is_said():
    """finetune embed keeps its best epoch even when every epoch scores below the model it started from (a
    CoSENT run went 0.9521 -> 0.9465); the report said only '(-0.0056)'. It warns in one line, as finetune
    rerank's report does for a reranker that lowers nDCG@10."""
    from bertkit.tasks.reports import embed_report

    final = {"train_examples": 8, "loss": "cosent", "pooling": "mean", "train_seconds": 1.0, "best_epoch": 2,
             "metric": "spearman", "dev": {"spearman": 0.9465}, "dev_before_training": {"spearman": 0.9521}}
    worse = embed_report(final).splitlines()
    assert worse[-2] == "dev spearman before training 0.9521, after 0.9465 (-0.0056)"
    assert worse[-1].startswith("warning: the saved model scores below the model it started from") and "--epochs" in worse[-1]
    better = embed_report({**final, "dev": {"spearman": 0.96}}).splitlines()
    assert better[-1] == "dev spearman before training 0.9521, after 0.9600 (+0.0079)"


def test_under_torchrun_only_the_first_process_prints_what_comes_before_training(data, tmp_path, monkeypatch):
    """Every process of a torchrun runs the command; the loop's lines were rank 0's alone, but the score before
    training (and every line before the loop) came once per process. The ranks are given as torchrun gives
    them (RANK, WORLD_SIZE); the run stops where the loop would join the process group."""
    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr("bertkit.tasks.embedding.train", stop)
    printed = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        lines = []
        with pytest.raises(Stop):
            finetune("embed", train=str(data["triplets"]), dev=str(data["sts_dev"]), output=str(tmp_path / rank),
                     model=str(data["tiny"]), training=fast(), log=lines.append, max_length=32)
        printed[rank] = lines
    assert len([line for line in printed["0"] if line.startswith("dev before training: spearman ")]) == 1
    assert printed["1"] == []


def test_a_micro_batch_has_the_rows_its_loss_compares(tmp_path):
    """MNRL on pairs scores an anchor against the batch's other positives (CoSENT a pair against the other
    pairs): a batch of one row has loss 0 and no gradient, so training on it is a silent no-op. Such a
    batch is never made: a one-row tail sits the epoch out, a one-row set or --batch-size 1 is refused;
    rows with a negative column bring their own, and one of them is a batch."""
    from bertkit.tasks.embedding import EmbeddingBatches, read_examples

    def stream(text, n, batch_size=8, parts=1):
        path = write(tmp_path / "t.tsv", text + "".join(f"a{i}\tb{i}" + ("\tc%d" % i) * text.count("neg") + "\n"
                                                       for i in range(n)))
        examples = read_examples(path, log=lambda s: None)
        return EmbeddingBatches(examples, [[[1, 2]] * len(examples.columns)] * n, batch_size, parts, seed=0)

    pairs, triplets = "anchor\tpositive\n", "anchor\tpositive\tnegative\n"
    assert stream(pairs, 17).steps_per_epoch == 2 and stream(pairs, 18).steps_per_epoch == 3
    assert all(len(b) >= 2 for e in range(3) for b in stream(pairs, 17).batches(e))
    assert stream(triplets, 17).steps_per_epoch == 3  # a triplet alone has its negative
    assert stream(pairs, 20, batch_size=4, parts=2).steps_per_epoch == 3  # the tail of 4 gives 2 parts 2 rows
    assert stream(pairs, 19, batch_size=4, parts=2).steps_per_epoch == 2  # 3 cannot: it sits out
    with pytest.raises(BertkitError, match="1 training example: .* one row alone teaches nothing"):
        stream(pairs, 1)
    with pytest.raises(BertkitError, match="--batch-size 1: .* use at least 2"):
        stream(pairs, 8, batch_size=1)
    assert stream(triplets, 1).steps_per_epoch == stream(triplets, 8, batch_size=1).steps_per_epoch - 7 == 1
    scored = write(tmp_path / "s.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n")
    with pytest.raises(BertkitError, match="each pair against the other pairs"):
        EmbeddingBatches(read_examples(scored, log=lambda s: None), [[[1], [1]]], 8, 1, seed=0)


def test_max_dev_examples_keeps_the_first_judged_queries_of_a_beir_dev(data, tmp_path):
    """--max-dev-examples with a BEIR --dev scores its first N judged queries against the whole corpus (it
    was ignored: every judged query was scored). The epoch's figure equals the saved model's on a copy of
    the folder whose dev qrels hold those queries alone."""
    from bertkit.retrieval.evaluation import evaluate_retrieval

    out, said = tmp_path / "out", []
    finetune("embed", train=str(data["beir"]), output=str(out), model=str(data["tiny"]), training=fast(epochs=1),
             log=said.append, max_length=32, dev=str(data["beir"]), dev_split="dev", max_dev_examples=5)
    cut = tmp_path / "cut"
    shutil.copytree(data["beir"], cut)
    rows = (cut / "qrels" / "dev.tsv").read_text().splitlines()
    first = list(dict.fromkeys(r.split("\t")[0] for r in rows[1:]))[:5]
    (cut / "qrels" / "dev.tsv").write_text("\n".join([rows[0]] + [r for r in rows[1:]
                                                                  if r.split("\t")[0] in first]) + "\n")
    expected = evaluate_retrieval(str(out), str(cut), split="dev", max_length=32, progress=False)
    assert expected["queries"] == 5 and expected["ndcg@10"] > 0  # (a figure that could be told apart)
    assert records(out, "eval")[0]["ndcg@10"] == pytest.approx(expected["ndcg@10"], abs=1e-6)
    assert any("5 of 8 judged queries" in line for line in said)
