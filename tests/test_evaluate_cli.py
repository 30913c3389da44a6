"""`bertkit evaluate retrieval|sts` and `bertkit mine` end to end, with a tiny model on small slices."""

import importlib.util
import json

import pytest

from conftest import need
from test_retrieval_beir import scifact_slice
from bertkit.cli import main
from bertkit.errors import BertkitError

MEASURES = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100")


@pytest.fixture(scope="module")
def folder(shared_data, tmp_path_factory):
    return scifact_slice(shared_data, tmp_path_factory.mktemp("sf"), n_queries=6, n_extra=10)


def test_evaluate_retrieval_writes_the_figures(folder, tiny_dir, tmp_path, capsys):
    from bertkit.retrieval.evaluation import evaluate_retrieval

    out = tmp_path / "m.json"
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--output", str(out),
                 "--quiet"]) == 0
    figures = json.loads(out.read_text())
    for key in ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100"):
        assert 0.0 <= figures[key] <= 1.0
    assert figures["precision"] == "float32" and figures["split"] == "test" and figures["max_length"] == 64
    assert figures["model"] == str(tiny_dir.resolve()) and figures["queries"] == 6
    api = evaluate_retrieval(str(tiny_dir), folder, "test", progress=False)
    assert figures["ndcg@10"] == pytest.approx(api["ndcg@10"], abs=1e-9)  # the command is the function
    printed = capsys.readouterr().out
    assert "| model |" in printed and f"{figures['ndcg@10']:.4f}" in printed


def test_evaluate_retrieval_with_bm25(folder, tiny_dir, capsys):
    need(importlib.util.find_spec("bm25s") is not None, "bm25s (the search extra) is not installed")
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--bm25", "--quiet"]) == 0
    assert "| BM25 (no stemming: the baseline) |" in capsys.readouterr().out
    # --mode all's lexical row is another BM25 (stemmed, as an index's): the two rows say which is which
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--bm25", "--mode", "all",
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| model, lexical (BM25, stemmed) |" in printed and "| BM25 (no stemming: the baseline) |" in printed


def test_evaluate_sts(shared_data, tiny_dir, tmp_path, capsys):
    sts = tmp_path / "sts.tsv"
    lines = (shared_data / "stsb" / "dev.tsv").read_text(encoding="utf-8").split("\n")
    sts.write_text("\n".join(lines[:21]) + "\n", encoding="utf-8")
    out = tmp_path / "sts.json"
    assert main(["evaluate", "sts", str(sts), "--model", str(tiny_dir), "--output", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert -1 <= figures["spearman"] <= 1 and -1 <= figures["pearson"] <= 1 and figures["pairs"] == 20
    assert figures["data"] == str(sts)  # which file the figure measured
    # the chain's two evaluations take the same flags: --quiet (evaluate retrieval's) was refused by sts, which
    # showed no progress while embedding; both now show it, and --quiet leaves the figures as they were
    capsys.readouterr()
    assert main(["evaluate", "sts", str(sts), "--model", str(tiny_dir), "--output", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["spearman"] == figures["spearman"] and "embed" not in capsys.readouterr().err


def test_evaluate_sts_writes_null_not_nan_when_every_pair_gets_one_cosine(tiny_dir, tmp_path, capsys):
    """A model that gives every pair the same cosine (here one pair repeated with other scores; a collapsed
    model, or texts it has no tokens for) has no correlation: the --output JSON held NaN, which strict JSON
    readers (JavaScript's JSON.parse, Go, jq) refuse. It holds null, and a warning says why."""
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"a cat sleeps\ta dog runs\t{s}\n" for s in (1, 3, 4)),
                   encoding="utf-8")
    out = tmp_path / "sts.json"
    with pytest.warns(UserWarning, match="every pair the same cosine .*undefined and reported as null"):
        assert main(["evaluate", "sts", str(sts), "--model", str(tiny_dir), "--output", str(out)]) == 0

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    figures = json.loads(out.read_text(), parse_constant=refuse)
    assert figures["spearman"] is None and figures["pearson"] is None and figures["pairs"] == 3
    assert "spearman undefined  pearson undefined  (3 pairs;" in capsys.readouterr().out


def test_mine_writes_triplets_the_trainer_reads(folder, tiny_dir, tmp_path, capsys):
    out, report = tmp_path / "triplets.tsv", tmp_path / "report.json"
    assert main(["mine", str(folder), "--split", "train", "--model", str(tiny_dir), "-o", str(out),
                 "--num-negatives", "2", "--relative-margin", "0.02", "--report", str(report), "--quiet"]) == 0
    lines = out.read_text(encoding="utf-8").rstrip("\n").split("\n")
    assert lines[0].split("\t") == ["anchor", "positive", "negative_1", "negative_2"]
    assert all(len(line.split("\t")) == 4 for line in lines)
    counts = json.loads(report.read_text())
    assert counts["rows"] == len(lines) - 1 and counts["options"]["relative_margin"] == 0.02
    assert "wrote" in capsys.readouterr().err
    try:
        from bertkit.tasks.embedding import read_examples
    except ImportError:
        return  # the trainer's reader is another module's; checked where it exists
    examples = read_examples(out, log=lambda *_: None)
    assert examples.columns == ("anchor", "positive", "negative_1", "negative_2")
    assert len(examples.rows) == len(lines) - 1


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "retrieval", "no/such/folder"], "BEIR folder no/such/folder does not exist"),
    (["evaluate", "retrieval", "{folder}", "--split", "dev"], "no qrels for split 'dev'"),
    (["evaluate", "sts", "no_such.tsv"], "no_such.tsv"),
    (["mine", "{folder}", "-o", "out.csv"], ".tsv or .jsonl"),
    (["mine", "{folder}", "-o", "out.tsv", "--num-negatives", "9", "--range-max", "5"], "--range-max"),
])
def test_user_mistakes_print_one_line(folder, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main([a.replace("{folder}", str(folder)) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertkit: error:") and message in err and "\n" not in err


def test_a_repeated_id_is_refused_or_deduped_as_the_error_says(folder, tiny_dir, tmp_path, capsys):
    """The refusal of a corpus line repeating an id said "pass --dedupe", which evaluate retrieval and mine did
    not take (only bertkit index did, so an index built with --dedupe could not be evaluated against its
    folder). Both take it now, with the index's rule: the first line of the id kept, the figures those of
    the folder without the repeat."""
    import shutil
    import warnings

    dup = tmp_path / "dup"
    shutil.copytree(folder, dup)
    first = (dup / "corpus.jsonl").read_text(encoding="utf-8").split("\n")[0]
    with open(dup / "corpus.jsonl", "a", encoding="utf-8") as f:
        f.write(first.replace('"text": "', '"text": "A repeat with other words. ') + "\n")
    assert main(["evaluate", "retrieval", str(dup), "--model", str(tiny_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "appears on line 1 and again on line" in err and "--dedupe (bertkit index, evaluate retrieval, mine)" in err
    plain, deduped = tmp_path / "plain.json", tmp_path / "deduped.json"
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--quiet", "-o", str(plain)]) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["evaluate", "retrieval", str(dup), "--model", str(tiny_dir), "--quiet", "--dedupe",
                     "-o", str(deduped)]) == 0
    assert any("1 line(s) repeat an earlier _id" in str(w.message) for w in caught)
    ours, expected = json.loads(deduped.read_text()), json.loads(plain.read_text())
    assert {k: ours[k] for k in ("ndcg@10", "map@100", "documents")} == \
        {k: expected[k] for k in ("ndcg@10", "map@100", "documents")}
    assert main(["mine", str(dup), "--split", "test", "-o", str(tmp_path / "m.tsv"), "--model", str(tiny_dir),
                 "--dedupe", "--quiet", "--num-negatives", "1"]) == 0


def test_max_queries_scores_the_first_judged_queries(folder, tiny_dir, tmp_path, capsys):
    """--max-queries N (the function's max_queries, which the command did not offer): the first N queries of
    the qrels file, each ranked against the whole corpus: its figures are the per-query means of those N."""
    import bertkit
    from bertkit.data.beir import document_text, load_beir
    from bertkit.metrics.retrieval import per_query
    from bertkit.retrieval.evaluation import dense_run

    out = tmp_path / "m.json"
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--max-queries", "3", "--quiet",
                 "-o", str(out)]) == 0
    figures = json.loads(out.read_text())
    data = load_beir(folder, "test")
    first = list(data.qrels)[:3]
    assert figures["queries"] == 3 and figures["documents"] == len(data.corpus)
    doc_ids = list(data.corpus)
    docs = bertkit.embed([document_text(data.corpus[d]) for d in doc_ids], str(tiny_dir), pooling="mean",
                         normalize=True, truncate=True)
    queries = bertkit.embed([data.queries[q] for q in first], str(tiny_dir), pooling="mean", normalize=True,
                            truncate=True)
    scores = per_query({q: data.qrels[q] for q in first}, dense_run(queries, first, docs, doc_ids))
    assert figures["ndcg@10"] == pytest.approx(sum(s["ndcg@10"] for s in scores.values()) / 3, abs=1e-6)
    with pytest.raises(SystemExit) as stop:  # refused where it is typed
        main(["evaluate", "retrieval", str(folder), "--max-queries", "0"])
    assert stop.value.code == 2 and "argument --max-queries: must be at least 1, got 0" in capsys.readouterr().err


def test_tuning_on_the_split_scored_is_refused_without_an_index(folder, capsys):
    """--tune's help says never the split you report; `--tune test` with the default --split test was taken
    and printed fitted figures (0.96 nDCG@10 against the held-out pick's 0.92 on a SciFact slice)."""
    assert main(["evaluate", "retrieval", str(folder), "--mode", "hybrid", "--tune", "test"]) == 2
    err = capsys.readouterr().err
    assert "--tune test is the split being scored" in err and "\n" not in err.strip()


def test_a_lexical_evaluation_loads_no_model_and_scores_as_the_lexical_row_of_mode_all(folder, tiny_dir, tmp_path,
                                                                                     capsys):
    """evaluate retrieval DIR --mode lexical loaded the model and embedded the whole corpus and every query, for
    a BM25 figure that used none of it (minutes with the default model on SciFact). Its figures equal the
    lexical row of --mode all, which does embed; a model folder that does not exist is not even looked for,
    and the line says no model was used."""
    from bertkit.retrieval.evaluation import evaluate_retrieval

    every = evaluate_retrieval(str(tiny_dir), folder, "test", mode="all", progress=False)["modes"]["lexical"]
    assert main(["evaluate", "retrieval", str(folder), "--mode", "lexical", "--quiet",
                 "-o", str(tmp_path / "m.json")]) == 0
    alone = json.loads((tmp_path / "m.json").read_text())
    assert {m: alone[m] for m in MEASURES} == {m: every[m] for m in MEASURES}
    assert alone["model"] is None and alone["fusion"] == {"mode": "lexical"}
    printed = capsys.readouterr().out
    assert "BM25 alone over whole documents (stemmed): no model used" in printed
    assert f"| model, lexical (BM25, stemmed) | {alone['ndcg@10']:.4f} |" in printed
    assert evaluate_retrieval("no/such/model", folder, "test", mode="lexical", progress=False)["model"] is None
    with pytest.raises(BertkitError, match="not --index, nor --mode lexical"):
        evaluate_retrieval(None, folder, "test", mode="lexical", dimensions=[8])
    # the encoder's options were taken and ignored (the figures the same whatever they said): refused, as
    # search --mode lexical refuses them
    for flags in (["--model", "no/such/model"], ["--batch-size", "8"], ["--max-length", "16"], ["--dtype", "float32"]):
        assert main(["evaluate", "retrieval", str(folder), "--mode", "lexical", "--quiet", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith(f"bertkit: error: {flags[0]} sets") and "--mode lexical embeds no text" in err, err
        assert err.count("\n") == 1, err


@pytest.mark.parametrize("argv, says", [
    # without --index the search is dense unless --mode says otherwise: --alpha changed no figure
    (["--alpha", "0.3"], "--alpha sets how hybrid search fuses the dense and lexical runs, and this search is dense "
     "(one run, nothing fused): give --mode hybrid, or leave it out"),
    (["--mode", "hybrid", "--fusion", "minmax", "--rrf-k", "5"], "--rrf-k sets rrf's constant, and this search fuses "
     "by minmax: give --fusion rrf too, or leave --rrf-k out"),
    # --tune's pick replaced --alpha without an index (and --alpha replaced the pick with one)
    # without --index the evaluation is dense by default: --tune's pick was printed, and no figure used it
    (["--tune", "train"], "--tune train chooses hybrid's fusion, and without --index this evaluation scores dense "
     "only: give --mode hybrid or all (with --index INDEX the pick is written into it for search and serve)"),
    (["--mode", "hybrid", "--tune", "train", "--alpha", "0.3"], "--alpha and --tune train both choose hybrid's fusion "
     "(--tune picks --fusion, --alpha and --rrf-k on that split's queries): give one or the other"),
])
def test_a_fusion_setting_the_figures_would_not_use_is_refused(folder, argv, says, capsys):
    assert main(["evaluate", "retrieval", str(folder), "--model", "no/such/model", *argv]) == 2
    assert capsys.readouterr().err == f"bertkit: error: {says}\n"


def test_dtype_auto_offered_by_the_help_is_taken(folder, tiny_dir, tmp_path):
    """evaluate's and mine's --dtype list auto (bfloat16 where the CPU has it natively) and its help explains it,
    but the encoder refused it ("dtype 'auto': use float32 ... or bfloat16"). It resolves as every command's."""
    from bertkit.runtime.devices import auto_dtype, dtype_name

    out = tmp_path / "m.json"
    assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--dtype", "auto", "--quiet",
                 "-o", str(out)]) == 0
    assert json.loads(out.read_text())["precision"] == dtype_name(auto_dtype())
    assert main(["mine", str(folder), "--split", "test", "-o", str(tmp_path / "m.tsv"), "--model", str(tiny_dir),
                 "--dtype", "auto", "--quiet", "--num-negatives", "1"]) == 0


def test_a_fine_tuned_cross_encoder_is_not_measured_as_a_sentence_model(folder, shared_data, tiny_dir, tmp_path,
                                                                        capsys):
    """The chain `finetune regression` -> `evaluate sts --model` (-> `evaluate retrieval`, `mine`, `index`): a
    regression model scores a pair itself ([CLS] a [SEP] b -> one number); the cosine of its encoder's mean-pooled
    vectors is a figure it was never trained to give, and main reported it as the model's (spearman of the
    encoder beside a model whose own predictions say otherwise). Each command that measures or uses a sentence
    model refuses it in one line naming `predict` and `--rerank` (test_evaluate_sts: a plain encoder is measured)."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.tasks.predict import predict
    from bertkit.text.tokenizer import Tokenizer

    rows = (shared_data / "stsb" / "train.tsv").read_text(encoding="utf-8").split("\n")[:9]
    (tmp_path / "sts.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    reg = tmp_path / "reg"  # what `finetune regression --text-column sentence1 --text-pair-column sentence2` saves
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=1, problem_type="regression")
    BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        reg, tokenizer=Tokenizer.from_pretrained())
    (reg / "bertkit_task.json").write_text(json.dumps({"task": "regression", "text_column": "sentence1",
                                                       "text_pair_column": "sentence2", "max_length": 64}))
    assert "score" in predict(reg, ["a man is dancing"], pairs=["a man dances"])[0]  # it scores a pair itself
    sts = str(tmp_path / "sts.tsv")
    for argv in (["evaluate", "sts", sts], ["evaluate", "retrieval", str(folder), "--quiet"],
                 ["mine", str(folder), "-o", str(tmp_path / "t.tsv"), "--quiet"],
                 ["index", str(folder), "-o", str(tmp_path / "i.index"), "--no-lexical", "--quiet"]):
        assert main([*argv, "--model", str(reg)]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is a fine-tuned regression model" in err, (argv, err)
        assert "bertkit predict" in err and "--rerank" in err, err
    assert not (tmp_path / "t.tsv").exists() and not (tmp_path / "i.index" / "index.json").exists()


def test_dimensions_take_the_list_as_finetune_embed_writes_it(folder, tiny_dir, tmp_path):
    """The chain `finetune embed --matryoshka-dims 16,8` -> `evaluate retrieval --dimensions`: the trainer takes the
    dimensions comma-separated and the evaluation took them space-separated only, refusing the list copied over
    ('invalid int value: 16,8'). Both spellings give the same figures."""
    figures = []
    for dims in (["16", "8"], ["16,8"]):
        out = tmp_path / f"{len(dims)}.json"
        assert main(["evaluate", "retrieval", str(folder), "--model", str(tiny_dir), "--dimensions", *dims,
                     "--output", str(out), "--quiet"]) == 0
        figures.append({k: v for k, v in json.loads(out.read_text()).items() if not k.endswith("seconds")})
    assert figures[0] == figures[1] and sorted(map(int, figures[0]["dimensions"])) == [8, 16]
