"""`bertkit finetune rerank`: a cross-encoder trained on mined hard and random negatives with binary
cross-entropy, the retrieval figures it records, `evaluate retrieval --rerank` before and after, and
the start-up line of `search --rerank` / `serve --rerank` read from those figures."""

import json
import math
import random

import pytest
import torch
from test_evaluate_index import by_hand, setup  # noqa: F401 (setup: the fixture, shared)

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.retrieval.mining import MiningTask, reranker_pairs, training_pairs
from bertkit.tasks.classification import binary_cross_entropy
from bertkit.tasks.rerank import FIGURES_FILE, pair_scores, recorded_effect, reranker
from bertkit.text.tokenizer import Tokenizer

MEASURES = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100")


# --- the training pairs --------------------------------------------------------------------------

def _task():
    passages = [f"passage {i}" for i in range(12)] + ["passage 0"]  # row 12: a positive's text under another row
    return MiningTask(["q0", "q1", "q2"], passages, [[0], [1, 2], [3]])


def test_pairs_hold_the_positives_the_hard_negatives_and_seeded_random_ones():
    task = _task()
    hard = [[4, 5], None, [6, 7]]  # q1 could not fill its hard negatives
    pairs, counts = training_pairs(task, hard, 3, random.Random(7))
    assert counts == {"queries": 3, "positives": 4, "hard_negatives": 4, "random_negatives": 9,
                      "queries_without_hard_negatives": 1}
    assert len(pairs) == 4 + 4 + 9
    for q, query in enumerate(task.queries):
        rows = [(p, label) for qq, p, label in pairs if qq == query]
        assert sorted(p for p, label in rows if label == 1.0) == sorted(task.passages[i] for i in task.positives[q])
        negatives = [p for p, label in rows if label == 0.0]
        assert len(negatives) == len(hard[q] or ()) + 3
        # never a positive, nor a passage whose text is a positive's (row 12 is "passage 0", q0's positive)
        assert not set(negatives) & {task.passages[i] for i in task.positives[q]}
        assert negatives[: len(hard[q] or ())] == [task.passages[i] for i in hard[q] or ()]
    again, _ = training_pairs(task, hard, 3, random.Random(7))
    other, _ = training_pairs(task, hard, 3, random.Random(8))
    assert again == pairs and other != pairs  # drawn with the seed, and only by it


def test_first_stage_negatives_skip_positives_and_their_texts():
    task = _task()
    task.passage_ids = [f"d{i}" for i in range(len(task.passages))]
    ranked = [["d0", "d12", "d5", "d6", "d7"], ["d1", "d9", "d2"], ["d3", "d4"]]
    from bertkit.retrieval.mining import first_stage_negatives

    # q0: d0 is its positive and d12 has its text; q1 and q2 have one negative each, not two
    assert first_stage_negatives(task, ranked, 2, 4) == [[5, 6], None, None]
    assert first_stage_negatives(task, ranked, 2, 3) == [None, None, None]  # q0's d6 is past the range
    assert first_stage_negatives(task, ranked, 1, 5) == [[5], [9], [4]]


def test_a_small_corpus_gives_what_random_negatives_it_has():
    task = MiningTask(["q"], ["a", "b", "c"], [[0]])
    pairs, counts = training_pairs(task, [[1]], 5, random.Random(0))
    assert pairs == [("q", "a", 1.0), ("q", "b", 0.0), ("q", "c", 0.0)] and counts["random_negatives"] == 1


@pytest.fixture(scope="module")
def ctx(setup, tiny_dir):
    """test_evaluate_index's SciFact slice (train and test qrels) and its index by the tiny model."""
    return {**setup, "tiny": tiny_dir}


def test_mined_hard_negatives_are_never_positives(ctx):
    from bertkit.retrieval.mining import task_from_beir

    task = task_from_beir(ctx["folder"], "train")
    # no margin: a random tiny model's cosines all lie within 5% of the positive's
    pairs, counts = reranker_pairs(ctx["folder"], "train", hard=2, random_negatives=1, range_max=20,
                                   relative_margin=None, model=str(ctx["tiny"]), seed=1, log=lambda line: None)
    positives = {task.queries[q]: {task.passages[p] for p in ps} for q, ps in enumerate(task.positives)}
    assert counts["positives"] == sum(len(p) for p in task.positives)
    assert counts["hard_negatives"] == 2 * (len(task.queries) - counts["queries_without_hard_negatives"]) > 0
    assert counts["random_negatives"] == len(task.queries)
    for query, passage, label in pairs:
        assert (passage in positives[query]) == (label == 1.0)


# --- the loss ----------------------------------------------------------------------------------

def test_binary_cross_entropy_against_a_hand_computed_value():
    logits, labels = torch.tensor([[2.0], [-1.0], [0.5]]), torch.tensor([[1.0], [0.0], [1.0]])

    def sig(x):
        return 1 / (1 + math.exp(-x))

    terms = [3 * math.log(sig(2.0)), math.log(1 - sig(-1.0)), 3 * math.log(sig(0.5))]  # positives weigh 3
    assert binary_cross_entropy(logits, labels, 3.0).item() == pytest.approx(-sum(terms) / 3, abs=1e-6)
    plain = -(math.log(sig(2.0)) + math.log(1 - sig(-1.0)) + math.log(sig(0.5))) / 3
    assert binary_cross_entropy(logits, labels).item() == pytest.approx(plain, abs=1e-6)
    soft = torch.tensor([[0.25]])  # a probability as the label
    want = -(0.25 * math.log(sig(0.5)) + 0.75 * math.log(1 - sig(0.5)))
    assert binary_cross_entropy(torch.tensor([[0.5]]), soft).item() == pytest.approx(want, abs=1e-6)


# --- end to end --------------------------------------------------------------------------------

def _finetune(ctx, out, *more):
    # an index's answers take the mining model's place (--mining-model beside --mining-index is refused)
    mining = [] if "--mining-index" in more else ["--mining-model", str(ctx["tiny"])]
    return main(["finetune", "rerank", "--train", str(ctx["folder"]), "--output", str(out), "--model",
                 str(ctx["tiny"]), *mining, "--max-length", "64", "--hard-negatives",
                 "2", "--random-negatives", "1", "--range-max", "20", "--batch-size", "8", "--learning-rate", "1e-3",
                 "--seed", "3", "--no-progress", *more])


@pytest.fixture(scope="module")
def trained(ctx):
    out = ctx["root"] / "trained_cross"
    assert _finetune(ctx, out, "--dev", str(ctx["folder"]), "--dev-split", "test", "--index",
                     str(ctx["index"]), "--mining-index", str(ctx["index"])) == 0
    return out


def test_finetune_rerank_records_the_figures_it_was_evaluated_with(ctx, trained, capsys):
    figures = json.loads((trained / FIGURES_FILE).read_text())
    assert figures["split"] == "test" and figures["rerank_top"] == 50 and str(ctx["index"]) in figures["first_stage"]
    # the figures are those of evaluate retrieval through the index, without and with the reranker
    plain = by_hand(ctx, capsys, "--mode", figures["fusion"]["mode"], ranked=figures["fusion"]["mode"] == "hybrid")
    reranked = by_hand(ctx, capsys, "--rerank", str(trained), "--rerank-top", "50", ranked=True)
    assert figures["before"] == pytest.approx(plain, abs=1e-9)
    assert figures["after"] == pytest.approx(reranked, abs=1e-9)
    metrics = json.loads((trained / "metrics.json").read_text())
    assert metrics["task"] == "rerank" and metrics["retrieval"] == figures
    assert metrics["pairs"]["hard_negatives"] == 2 * (metrics["pairs"]["queries"]
                                                      - metrics["pairs"]["queries_without_hard_negatives"]) > 0
    assert metrics["train_examples"] == metrics["pairs_made"] == sum(
        metrics["pairs"][k] for k in ("positives", "hard_negatives", "random_negatives"))


def test_the_closing_line_says_a_cut_of_the_pairs_made():
    """--max-train-examples 60 of 240 pairs made: the closing line said "trained on 60 pairs (60 queries, 64
    positives, 60 hard negatives, ...)", counts of the 240 beside the 60; it now says which count is which."""
    from bertkit.tasks.reports import rerank_report

    counts = {"queries": 60, "positives": 64, "hard_negatives": 116, "random_negatives": 60}
    line = rerank_report({"train_examples": 60, "pairs_made": 240, "pairs": counts, "train_seconds": 1.0})
    assert line.startswith("trained on 60 of the 240 made pairs (")
    assert rerank_report({"train_examples": 240, "pairs_made": 240, "pairs": counts,
                          "train_seconds": 1.0}).startswith("trained on 240 pairs (")


def test_the_saved_model_is_a_one_label_cross_encoder(trained, st):
    """Read back as its sigmoid by bertkit, and by sentence-transformers' CrossEncoder (num_labels 1)."""
    loaded = reranker(str(trained), dtype="float32")
    pairs = [("vitamin d and bones", "Vitamin D helps calcium absorption."), ("cats", "A dog barked at night.")]
    ours = pair_scores(loaded, "vitamin d and bones", [p for _, p in pairs[:1]]) + pair_scores(loaded, "cats",
                                                                                             [pairs[1][1]])
    theirs = st.CrossEncoder(str(trained), device="cpu", max_length=64).predict(pairs)
    assert ours == pytest.approx([float(x) for x in theirs], abs=1e-5)
    assert all(0.0 < s < 1.0 for s in ours)


def test_evaluate_rerank_prints_before_and_after(ctx, trained, capsys):
    out = ctx["root"] / "eval.json"
    assert main(["evaluate", "retrieval", str(ctx["folder"]), "--index", str(ctx["index"]), "--rerank",
                 str(trained), "--rerank-top", "50", "--quiet", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    got = json.loads(out.read_text())
    rows = [line for line in printed.splitlines() if line.startswith("| index")]
    assert len(rows) == 2 and rows[1].startswith(rows[0].split(" |")[0] + " + rerank |"), rows
    before, after = got["before_rerank"]["ndcg@10"], got["ndcg@10"]
    assert f"| {before:.4f} |" in rows[0] and f"| {after:.4f} |" in rows[1]
    assert f"nDCG@10 {before:.4f} before, {after:.4f} after" in printed
    assert {m: got["before_rerank"][m] for m in MEASURES} == pytest.approx(by_hand(ctx, capsys, ranked=True),
                                                                           abs=1e-9)


# --- the start-up line -------------------------------------------------------------------------

def _with_figures(trained, tmp_path, before, after):
    import shutil

    model = tmp_path / f"cross_{before}_{after}"
    shutil.copytree(trained, model)
    figures = json.loads((trained / FIGURES_FILE).read_text())
    figures["before"]["ndcg@10"], figures["after"]["ndcg@10"] = before, after
    (model / FIGURES_FILE).write_text(json.dumps(figures))
    return model


def test_recorded_effect_warns_only_when_reranking_lowered_ndcg(trained, tmp_path):
    down = recorded_effect(_with_figures(trained, tmp_path, 0.7, 0.43))
    assert down.startswith("warning: ") and "lowered nDCG@10 from 0.7000 to 0.4300" in down and "\n" not in down
    assert recorded_effect(_with_figures(trained, tmp_path, 0.7, 0.75)) is None
    (tmp_path / "bare").mkdir()
    none = recorded_effect(tmp_path / "bare")
    assert "has no recorded retrieval figures" in none and "\n" not in none


@pytest.mark.parametrize("before, after, said", [(0.7, 0.43, "lowered nDCG@10"), (0.4, 0.6, None),
                                                 (None, None, "no recorded retrieval figures")])
def test_search_rerank_says_so_at_start_up(ctx, trained, tmp_path, capsys, before, after, said):
    if before is None:
        model = _with_figures(trained, tmp_path, 0.5, 0.5)
        (model / FIGURES_FILE).unlink()
    else:
        model = _with_figures(trained, tmp_path, before, after)
    assert main(["search", str(ctx["index"]), "vitamin D", "-k", "2", "--rerank", str(model), "--json"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if str(model) in line]
    assert (said is None and lines == []) or (len(lines) == 1 and said in lines[0]), err


def test_serve_rerank_says_so_at_start_up(ctx, trained, tmp_path, capsys):
    from bertkit.serve.runner import load_runner, load_searcher
    from bertkit.serve.settings import ServeConfig

    model = _with_figures(trained, tmp_path, 0.7, 0.43)
    settings = ServeConfig(model=str(ctx["tiny"]), index=str(ctx["index"]), rerank=str(model))
    load_searcher(settings, load_runner(settings))
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "lowered nDCG@10" in line] != []


# --- bad input, one line each ------------------------------------------------------------------

def _folder_without(ctx, tmp_path, what):
    import shutil

    folder = tmp_path / what
    shutil.copytree(ctx["folder"], folder)
    if what == "train_qrels":
        (folder / "qrels" / "train.tsv").unlink()
    else:  # a judged corpus id that the corpus does not have
        with open(folder / "qrels" / "train.tsv", "a") as f:
            f.write(f"{next(iter(json.loads(line)['_id'] for line in open(folder / 'queries.jsonl')))}\tnope\t1\n")
    return folder


@pytest.mark.parametrize("case, message", [
    ("train_qrels", "no qrels for split 'train'"),
    ("unknown_doc", "corpus id 'nope'"),
    ("empty_passage", "line 3: the passage is empty"),
    ("rerank_top", "--rerank-top must be at least 1"),
    ("dev_without_index", "--dev needs --index INDEX"),
    ("index_of_another_corpus", "was built from"),  # said before training, not after it at the dev evaluation
    ("bad_label", "line 2: label '2' is not 1 (relevant), 0 (not)"),
])
def test_bad_input_is_one_line(ctx, tmp_path, capsys, case, message):
    train, more = ctx["folder"], []
    if case in ("train_qrels", "unknown_doc"):
        train = _folder_without(ctx, tmp_path, case)
    elif case in ("empty_passage", "bad_label"):
        train = tmp_path / "pairs.tsv"
        rows = ["query\tpassage\tlabel", "a claim\ta passage\t" + ("2" if case == "bad_label" else "1"),
                "a claim\t \t0"]
        train.write_text("\n".join(rows) + "\n")
    elif case == "index_of_another_corpus":  # the dev folder lacks a document the index holds
        from test_evaluate_index import _corpus_copy

        from bertkit.data.beir import load_beir

        judged = {d for docs in load_beir(ctx["folder"], "test").qrels.values() for d in docs}
        gone = next(d for d in load_beir(ctx["folder"], "test").corpus if d not in judged)
        dev = _corpus_copy(ctx, tmp_path, lambda ls: [line for line in ls if json.loads(line)["_id"] != gone])
        more = ["--dev", str(dev), "--dev-split", "test", "--index", str(ctx["index"])]
    elif case == "rerank_top":
        more = ["--dev", str(ctx["folder"]), "--index", str(ctx["index"]), "--rerank-top", "0"]
    else:
        more = ["--dev", str(ctx["folder"])]
    assert main(["finetune", "rerank", "--train", str(train), "--output", str(tmp_path / "out"), "--model",
                 str(ctx["tiny"]), "--mining-model", str(ctx["tiny"]), "--no-progress", *more]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "out").exists()


def test_evaluate_rerank_top_zero_is_one_line(ctx, trained, capsys):
    with pytest.raises(SystemExit) as stop:  # refused where it is typed
        main(["evaluate", "retrieval", str(ctx["folder"]), "--index", str(ctx["index"]), "--rerank",
              str(trained), "--rerank-top", "0", "--quiet"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --rerank-top: must be at least 1" in err and err.count("\n") == 1


def test_a_table_of_pairs_trains_without_dev(ctx, tmp_path, capsys):
    train = tmp_path / "pairs.jsonl"
    rows = [{"query": f"claim {i}", "passage": f"passage {i} {'relevant' if i % 2 else 'other'}", "label": i % 2}
            for i in range(8)]
    rows[0]["passage"] = "the passage goes on and on . " * 8  # longer than --max-length 32 with its query: cut
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "table_cross"
    assert main(["finetune", "rerank", "--train", str(train), "--output", str(out), "--model", str(ctx["tiny"]),
                 "--max-length", "32", "--batch-size", "4", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "trained on 8 pairs" in printed and "no retrieval figures recorded" in printed
    # the pair read cut is said (reference: its whole encoding, [CLS] q [SEP] p [SEP], against 32)
    tok = Tokenizer.from_pretrained(ctx["tiny"])
    cut = sum(len(tok.encode(r["query"], r["passage"], truncation=False)) > 32 for r in rows)
    assert cut == 1 and "1 of 8 (query, passage) pairs are longer than --max-length 32 tokens" in printed, printed
    assert not (out / FIGURES_FILE).exists()
    assert "no recorded retrieval figures" in recorded_effect(out)
    with pytest.raises(BertkitError, match="relevant and irrelevant pairs both"):
        train.write_text("".join(json.dumps({**r, "label": 0}) + "\n" for r in rows))
        reranker_pairs(train)


def test_mining_with_the_index_of_another_corpus_is_one_line(setup, tmp_path):  # noqa: F811 (the fixture)
    """The first stage's index holds a document the mined corpus does not: a KeyError traceback before, now one
    line naming the document."""
    from functools import partial

    from test_evaluate_index import _corpus_copy

    from bertkit.data.beir import load_beir
    from bertkit.retrieval.evaluation import index_answers

    judged = {d for docs in load_beir(setup["folder"], "train").qrels.values() for d in docs}
    judged |= {d for docs in load_beir(setup["folder"], "test").qrels.values() for d in docs}
    lines = (setup["folder"] / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    gone = next(json.loads(line)["_id"] for line in lines if json.loads(line)["_id"] not in judged)
    folder = _corpus_copy(setup, tmp_path, lambda ls: [line for line in ls if json.loads(line)["_id"] != gone])
    stage = partial(index_answers, setup["index"], depth=50)
    assert gone in {d for ids in stage(["a query"]) for d in ids}  # the index does answer it
    reranker_pairs(setup["folder"], "train", hard=1, first_stage=stage, log=lambda *a: None)  # its own corpus
    with pytest.raises(BertkitError, match=f"answered document '{gone}', which the corpus being mined does not have"):
        reranker_pairs(folder, "train", hard=1, first_stage=stage, range_max=50, log=lambda *a: None)


def test_the_recorded_precisions_are_the_ones_the_figures_ran_in(ctx, tmp_path):
    """retrieval.json said the first stage's queries ran in float32 whatever they ran in: an index made by an
    int8 folder is queried in int8 (evaluate retrieval's result says so); the reranker's is what it loaded in.
    --rerank-dtype took float32 and bfloat16 only, where every other precision flag takes auto (argparse's
    "invalid choice: 'auto'"); with auto the record names the precision auto resolved to."""
    import shutil

    import bertkit
    from bertkit.cli import build_parser
    from bertkit.options import from_args
    from bertkit.retrieval.index import build_index
    from bertkit.runtime.devices import auto_dtype, dtype_name
    from bertkit.runtime.quantization import save_quantized
    from bertkit.tasks.config import RerankConfig
    from bertkit.tasks.cross_encoder import record_figures
    from test_index import OVERLAP, TOKENS

    args = build_parser().parse_args(["finetune", "rerank", "--train", "t", "-o", "o", "--rerank-dtype", "auto",
                                      "--dev", str(ctx["folder"]), "--index", str(ctx["index"])])  # it tunes the --dev evaluation
    assert from_args(args, RerankConfig).validate().rerank_dtype == "auto"

    loaded = bertkit.load(str(ctx["tiny"]), int8=True)
    save_quantized(loaded.model, tmp_path / "int8", loaded.tokenizer)
    build_index(ctx["folder"] / "corpus.jsonl", tmp_path / "index8", str(tmp_path / "int8"), passage_tokens=TOKENS,
                overlap=OVERLAP, batch_size=64, progress=False)
    cross = shutil.copytree(ctx["cross"], tmp_path / "cross")
    cfg = RerankConfig(train=str(ctx["folder"]), output=str(cross), dev=str(ctx["folder"]), dev_split="test",
                       index=str(tmp_path / "index8"), rerank_top=5, rerank_dtype="auto")
    cfg.training.progress = False
    figures = record_figures(cfg, log=lambda line: None)
    assert figures["precision"] == {"queries": "int8", "reranker": dtype_name(auto_dtype())}
    assert reranker(str(cross), dtype="auto").precision == dtype_name(auto_dtype())
