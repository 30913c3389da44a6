"""`bertkit predict` on a labelled file: the evaluate mode (issue 18 item 5).

Each task's score is checked against a reference computed another way: by hand
from the written predictions and the file's labels, and against the score the
fine-tuning run itself reported for the same file with the same (best) model.
"""

import collections
import json
import random
import re
import shutil
import string

import numpy as np
import pytest
from scipy import stats

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.tasks.classification import TextTaskConfig, finetune_text
from bertkit.tasks.ner import NerConfig, finetune_ner
from bertkit.tasks.predict import predict, predict_file
from bertkit.tasks.config import QAConfig
from bertkit.tasks.qa import finetune_qa
from test_finetune import FILL, NEG, POS, fast, sentiment_run, tiny, write_tsv  # noqa: F401
from test_finetune_ner import ner_file
from test_finetune_qa import squad_file
from test_metrics import official_v2


def reported(out: str) -> dict:
    """The numbers of the CLI's `evaluation on ...: name value, ...` line."""
    line = next(x for x in out.splitlines() if x.startswith("evaluation on "))
    return {k: float(v) for k, v in re.findall(r"(\w+)(?: \([^)]*\))? (-?[\d.]+)(?:,|$)", line.split(": ", 1)[1])}


def predicted_column(path, name="prediction") -> list[str]:
    """A column of the written predictions: `prediction` (after a table's own columns, or text and text_pair)."""
    header, *rows = path.read_text().splitlines()
    at = header.split("\t").index(name)
    return [row.split("\t")[at] for row in rows]


def test_classification_reports_accuracy_and_f1(sentiment_run, tmp_path, capsys):  # noqa: F811
    d, final = sentiment_run
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    got = reported(capsys.readouterr().out)
    gold = [r.split("\t")[1] for r in (d / "dev.tsv").read_text().splitlines()[1:]]
    pred = predicted_column(tmp_path / "p.tsv")
    assert len(pred) == len(gold) == 30
    by_hand = sum(p == g for p, g in zip(pred, gold)) / len(gold)
    assert got["accuracy"] == pytest.approx(by_hand, abs=1e-4)
    assert got["accuracy"] == pytest.approx(final["dev"]["accuracy"], abs=1e-4)  # what fine-tuning said
    tp = sum(p == g == "pos" for p, g in zip(pred, gold))
    f1 = 2 * tp / (pred.count("pos") + gold.count("pos"))
    assert got["f1"] == pytest.approx(f1, abs=1e-4) and "macro_f1" in got
    # every label flipped: the accuracy becomes its complement (the labels are read, not ignored)
    flipped = write_tsv(tmp_path / "flipped.tsv", ["sentence", "label"],
                        [(r.split("\t")[0], {"pos": "neg", "neg": "pos"}[r.split("\t")[1]])
                         for r in (d / "dev.tsv").read_text().splitlines()[1:]])
    result = predict_file(d / "out", flipped, tmp_path / "p2.tsv")
    assert result.count == 30 and result.metrics["accuracy"] == pytest.approx(1 - by_hand)


def test_unlabelled_file_only_predicts_and_the_flags_choose(sentiment_run, tmp_path, capsys):  # noqa: F811
    d, _ = sentiment_run
    plain = write_tsv(tmp_path / "new.tsv", ["sentence"], [["this day was good ."], ["the food was bad ."]])
    assert main(["predict", str(d / "out"), str(plain), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "wrote 2 predictions" in out and "evaluation" not in out
    assert predict_file(d / "out", plain, tmp_path / "p.tsv").metrics is None
    # --evaluate on a file without labels: one clear line, exit 2
    assert main(["predict", str(d / "out"), str(plain), "-o", str(tmp_path / "p.tsv"), "--evaluate"]) == 2
    err = capsys.readouterr().err
    assert "carries no answers" in err and "'label' column" in err and len(err.strip().splitlines()) == 1
    # --no-evaluate on a labelled file: predictions only
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--no-evaluate"]) == 0
    assert "evaluation" not in capsys.readouterr().out
    # a label the model never saw cannot be scored
    odd = write_tsv(tmp_path / "odd.tsv", ["sentence", "label"], [["the food was bad .", "meh"]])
    with pytest.raises(BertkitError, match="'meh'"):
        predict_file(d / "out", odd, tmp_path / "p.tsv")


def test_regression_reports_pearson_and_spearman(tiny, tmp_path, capsys):  # noqa: F811
    rng = random.Random(1)

    def rows(n):
        out = []
        for _ in range(n):
            w1, w2 = rng.choice(POS + NEG), rng.choice(POS + NEG)
            out.append((f"{rng.choice(FILL)} was {w1} .", f"{rng.choice(FILL)} was {w2} .",
                        2.5 * (w1 in POS) + 2.5 * (w2 in POS)))
        return out

    hdr = ["sentence1", "sentence2", "score"]
    dev = write_tsv(tmp_path / "d.tsv", hdr, rows(30))
    cfg = TextTaskConfig(train=str(write_tsv(tmp_path / "t.tsv", hdr, rows(80))), dev=str(dev),
                         output=str(tmp_path / "o"), task="regression", model=str(tiny), text_column="sentence1",
                         text_pair_column="sentence2", label_column="score", max_length=32,
                         training=fast(epochs=6, metric="pearson"))
    final = finetune_text(cfg, log=lambda s: None)
    assert main(["predict", str(tmp_path / "o"), str(dev), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    got = reported(capsys.readouterr().out)
    rows = [r.split("\t") for r in dev.read_text().splitlines()[1:]]
    scores = [p["score"] for p in predict(tmp_path / "o", [r[0] for r in rows], pairs=[r[1] for r in rows])]
    gold = [float(r[2]) for r in rows]
    assert final["dev"]["pearson"] > 0.5
    assert got["pearson"] == pytest.approx(stats.pearsonr(scores, gold)[0], abs=1e-4)
    assert got["spearman"] == pytest.approx(stats.spearmanr(scores, gold)[0], abs=1e-4)
    # the written predictions keep the table's rows as they were, both texts of each pair and its gold score (once
    # only the first text: which pair was it?), then the prediction
    written = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()]
    assert written[0] == [*dev.read_text().splitlines()[0].split("\t"), "prediction", "details"]
    assert [r[:-2] for r in written[1:]] == rows
    assert [float(x) for x in predicted_column(tmp_path / "p.tsv")] == pytest.approx(scores, abs=1e-4)
    # what fine-tuning reported: its plain model's scores differ from the accelerated one's by float32
    # rounding, which this weak regressor's closely spaced scores turn into ~3e-4 of correlation
    assert got["pearson"] == pytest.approx(final["dev"]["pearson"], abs=2e-3)
    # regression's held_out_loss is its mse: metrics.json keeps both keys, the printed lines say the figure once
    assert list(got) == ["pearson", "spearman", "mse"]
    assert got["mse"] == pytest.approx(np.mean((np.array(scores) - np.array(gold)) ** 2), abs=1e-4)
    assert final["dev"]["held_out_loss"] == pytest.approx(final["dev"]["mse"])
    from bertkit.tasks.reports import text_report
    assert re.findall(r"(\w+) -?[\d.]+", text_report(final).split(": ", 1)[1]) == ["pearson", "spearman", "mse"]


def test_ner_reports_entity_f1_on_a_conll_file(tiny, tmp_path, capsys):  # noqa: F811
    rng = random.Random(0)
    dev = ner_file(tmp_path / "dev.txt", 20, rng)
    cfg = NerConfig(train=str(ner_file(tmp_path / "train.txt", 60, rng)), dev=str(dev), output=str(tmp_path / "o"),
                    model=str(tiny), tag_scheme="iob1", max_length=32, stride=8, training=fast(epochs=2, metric="f1"))
    final = finetune_ner(cfg, log=lambda s: None)
    assert main(["predict", str(tmp_path / "o"), str(dev), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    got = reported(out)
    assert len(predicted_column(tmp_path / "p.tsv")) == 20
    assert f"evaluation on {dev} (20 sentences, computed in float32)" in out  # finetune's word (was "examples")
    for name in ("f1", "precision", "recall"):
        assert got[name] == pytest.approx(final["dev"][name], abs=1e-4), name
    # entities by hand: (sentence, type, first, last) from the gold column and the written tags
    def chunks(tag_lists):
        out = set()
        for s, tags in enumerate(tag_lists):
            for i, t in enumerate(tags):
                if t != "O" and (i == 0 or tags[i - 1] != t):  # this file's entities are one word or I-runs
                    j = i
                    while j + 1 < len(tags) and tags[j + 1] == t:
                        j += 1
                    out.add((s, t[2:], i, j))
        return out

    blocks = [b for b in dev.read_text().split("\n\n")[1:] if b.strip()]
    gold = chunks([[line.split()[-1] for line in b.splitlines()] for b in blocks])
    pred = chunks([p.split() for p in predicted_column(tmp_path / "p.tsv")])
    f1 = 2 * len(gold & pred) / (len(gold) + len(pred)) if gold or pred else 0.0
    assert got["f1"] == pytest.approx(f1, abs=1e-4)
    # each entity type's figures, printed under the line as finetune prints them (predict showed none)
    printed = {m[0]: tuple(map(float, m[1:])) for m in re.findall(
        r"^ *(\w+): precision ([\d.]+) recall ([\d.]+) f1 ([\d.]+) \((\d+) entities\)$", out, re.M)}
    types = {e[1] for e in gold | pred}
    assert set(printed) == types and len(types) > 1
    for typ in types:
        g, p = {e for e in gold if e[1] == typ}, {e for e in pred if e[1] == typ}
        precision, recall = len(g & p) / len(p) if p else 0.0, len(g & p) / len(g) if g else 0.0
        by_hand = (precision, recall, 2 * len(g & p) / (len(g) + len(p)), len(g))
        assert printed[typ] == pytest.approx(by_hand, abs=5e-4), typ


def test_ner_evaluates_the_tag_column_the_model_was_trained_on(tiny, tmp_path, capsys):  # noqa: F811
    """A CoNLL file whose tags are not the last column (`--tag-column 1`, say word TAG POS): predict read
    the last column as the tags ("tag 'X' is not O or B-/I-/E-/S-TYPE") instead of the columns the run
    was trained on, which bertkit_task.json keeps."""
    rng = random.Random(0)

    def tag_second(path):  # word X X TAG -> TAG in column 1, a part-of-speech-like column last
        path.write_text("\n".join(" ".join([c[0], c[3], "NN"]) if len(c := line.split()) == 4 else line
                                  for line in path.read_text().split("\n")))
        return path

    dev = tag_second(ner_file(tmp_path / "dev.txt", 20, rng))
    cfg = NerConfig(train=str(tag_second(ner_file(tmp_path / "train.txt", 60, rng))), dev=str(dev),
                    output=str(tmp_path / "o"), model=str(tiny), tag_scheme="iob1", tag_column=1, max_length=32,
                    stride=8, training=fast(epochs=2, metric="f1"))
    final = finetune_ner(cfg, log=lambda s: None)
    result = predict_file(tmp_path / "o", dev, tmp_path / "p.tsv", dtype="float32")
    assert result.count == result.scored == 20
    for name in ("f1", "precision", "recall"):
        assert result.metrics[name] == pytest.approx(final["dev"][name], abs=1e-4), name


def test_qa_reports_exact_match_and_f1_on_squad_json(tiny, tmp_path, capsys):  # noqa: F811
    rng = random.Random(0)
    dev = squad_file(tmp_path / "dev.json", 20, rng)
    cfg = QAConfig(train=str(squad_file(tmp_path / "train.json", 60, rng)), dev=str(dev), output=str(tmp_path / "o"),
                   model=str(tiny), max_length=32, doc_stride=8, max_query_length=8, training=fast(epochs=2, metric="f1"))
    final = finetune_qa(cfg, log=lambda s: None)
    assert main(["predict", str(tmp_path / "o"), str(dev), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    got = reported(out)
    assert f"evaluation on {dev} (20 questions, computed in float32)" in out  # finetune's word (was "examples")
    assert got["exact_match"] == pytest.approx(final["dev"]["exact_match"], abs=1e-4)
    assert got["f1"] == pytest.approx(final["dev"]["f1"], abs=1e-4)
    answers = [q["answers"][0]["text"] for p in json.loads(dev.read_text())["data"][0]["paragraphs"] for q in p["qas"]]
    pred = predicted_column(tmp_path / "p.tsv")
    assert got["exact_match"] == pytest.approx(100 * np.mean([p == a for p, a in zip(pred, answers)]), abs=1e-4)
    # the same questions as Hugging Face's squad dataset saves them (to_json: one question a line, answers as
    # lists), which finetune qa reads: predicted, and scored the same (they were predicted unscored)
    rows = [{"id": q["id"], "title": "t", "context": par["context"], "question": q["question"],
             "answers": {"text": [a["text"] for a in q["answers"]], "answer_start": [a["answer_start"] for a in q["answers"]]}}
            for par in json.loads(dev.read_text())["data"][0]["paragraphs"] for q in par["qas"]]
    hf = tmp_path / "dev_hf.jsonl"
    hf.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["predict", str(tmp_path / "o"), str(hf), "-o", str(tmp_path / "p_hf.tsv"), "--dtype", "float32"]) == 0
    assert reported(capsys.readouterr().out) == got
    assert predicted_column(tmp_path / "p_hf.tsv") == pred
    # a SQuAD 2.0 file (unanswerable questions) is scored by the official v2.0 script's rules, with its HasAns and
    # NoAns figures, whatever the model was trained on: v1.1's rules have no empty answer (its script fails on one)
    data = json.loads(dev.read_text())
    for q in [p["qas"][0] for p in data["data"][0]["paragraphs"][:5]]:
        q.update(answers=[], is_impossible=True)
    v2 = tmp_path / "dev_v2.json"
    v2.write_text(json.dumps({**data, "version": "v2.0"}))
    result = predict_file(tmp_path / "o", v2, tmp_path / "p_v2.tsv")
    gold = {q["id"]: [a["text"] for a in q["answers"]] for p in data["data"][0]["paragraphs"] for q in p["qas"]}
    want = official_v2(gold, dict(zip(gold, predicted_column(tmp_path / "p_v2.tsv"))))
    assert result.metrics == pytest.approx({"exact_match": want["exact"], "f1": want["f1"],
                                            **{k: v for k, v in want.items() if "Ans" in k}})


# --- what a newcomer meets (issue 41 items 1, 5, 9) ----------------------------------------------

def test_without_output_predictions_go_to_the_current_directory_never_over_a_file(sentiment_run, tmp_path,  # noqa: F811
                                                                                    monkeypatch, capsys):
    d, _ = sentiment_run
    data = tmp_path / "data"
    data.mkdir()
    plain = write_tsv(data / "new.tsv", ["sentence"], [["this day was good ."], ["the food was bad ."]])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "new.predictions.tsv").write_text("mine\n")  # a file of the user's own: kept
    for expected in ("new.predictions-2.tsv", "new.predictions-3.tsv"):
        assert main(["predict", str(d / "out"), str(plain), "--dtype", "float32"]) == 0
        out = capsys.readouterr().out
        assert f"wrote 2 predictions to {expected}" in out and "--output" in out
        assert len((work / expected).read_text().splitlines()) == 3
    assert sorted(p.name for p in data.iterdir()) == ["new.tsv"]  # nothing written next to the input
    assert (work / "new.predictions.tsv").read_text() == "mine\n"
    # --output -: the predictions on standard output, the message on standard error
    assert main(["predict", str(d / "out"), str(plain), "-o", "-", "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == "sentence\tprediction\tdetails" and len(captured.out.splitlines()) == 3
    assert "wrote 2 predictions to standard output" in captured.err


def test_a_txt_file_is_one_sentence_per_line(sentiment_run, tmp_path, capsys):  # noqa: F811
    d, _ = sentiment_run
    sentences = ["this day was good .", "the food was bad .", "it was very good ."]
    txt = tmp_path / "sentences.txt"
    txt.write_text("\n".join(sentences) + "\n\n")
    assert main(["predict", str(d / "out"), str(txt), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    assert "wrote 3 predictions" in capsys.readouterr().out
    rows = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == sentences
    assert [r[1] for r in rows] == [p["label"] for p in predict(d / "out", sentences)]
    # a .txt whose first line names the column is still a table
    table = write_tsv(tmp_path / "table.txt", ["sentence"], [[s] for s in sentences])
    assert main(["predict", str(d / "out"), str(table), "-o", str(tmp_path / "q.tsv"), "--dtype", "float32"]) == 0
    assert [r.split("\t")[0] for r in (tmp_path / "q.tsv").read_text().splitlines()[1:]] == sentences


def test_evaluate_mode_says_the_precision(sentiment_run, tmp_path, capsys):  # noqa: F811
    d, final = sentiment_run
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
    assert "computed in float32)" in line
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--dtype", "bfloat16"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
    assert "computed in bfloat16; finetune scored in float32, which --dtype float32 reproduces" in line
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--int8"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
    assert "computed in int8; finetune scored in float32, which predict without --int8 reproduces" in line
    # a folder save_quantized wrote runs int8 without --int8: leaving the flag out reproduces nothing
    import bertkit
    from bertkit.runtime.quantization import save_quantized

    loaded = bertkit.load(d / "out", int8=True)
    save_quantized(loaded.model, tmp_path / "int8", loaded.tokenizer, task=loaded.info, layout=loaded.layout)
    assert main(["predict", str(tmp_path / "int8"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
    assert (f"computed in int8; {tmp_path / 'int8'} holds int8 weights (save_quantized): a finetune score is of "
            "the float32 model they were made from): accuracy ") in line, line
    # a run without --dev scored nothing (its metrics.json has no dev): no finetune figure to reproduce
    shutil.copytree(d / "out", tmp_path / "nodev")
    final = json.loads((tmp_path / "nodev" / "metrics.json").read_text())
    assert "dev" in final
    del final["dev"]
    (tmp_path / "nodev" / "metrics.json").write_text(json.dumps(final))
    for flags in (["--int8"], ["--dtype", "bfloat16"]):
        assert main(["predict", str(tmp_path / "nodev"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), *flags]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
        assert "finetune" not in line and f"computed in {flags[-1].lstrip('-')}): accuracy " in line, line


def test_single_texts_take_the_batch_ids_path_with_encodes_ids(shared_data):
    from bertkit.tasks.text_inference import make_features
    from bertkit.data.tables import TextExample
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained()
    rows = (shared_data / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:]
    texts = [r.split("\t")[0] for r in rows if r.strip()]
    texts += ["", "  ", "Hello, World! naïve café 🦄", "tab\tnew\nline\u2028sep\x0bvt [MASK] x\u00a0y",
              " ".join(texts[:20])]  # the last one longer than 32 tokens: cut as encode cuts it
    for length in (32, 128):
        assert tok.single_ids(texts, length) == [tok.encode(t, max_length=length).input_ids for t in texts]
    # pairs and windows (a stride) still go through encode
    feats = make_features(tok, [TextExample(texts[0], texts[1]), TextExample(texts[-1], None)], "x", None, 32, 0)
    want = tok.encode(texts[0], texts[1], max_length=32, truncation_strategy="longest_first")
    assert feats[0]["input_ids"] == want.input_ids and feats[0]["token_type_ids"] == want.token_type_ids
    assert feats[1]["token_type_ids"] == [0] * 32


@pytest.mark.parametrize("texts, options, message", [
    ([], {}, "no texts to predict"),
    (None, {}, "list of texts, got NoneType"),
    ([["mary", 3]], {}, r"texts\[0\] must be a str, got list \(pre-split words: a list of str, which a NER model "
                        r"tags as given; else join them with spaces\)"),
    (["a", None], {}, r"texts\[1\] must be a str, got NoneType"),
    (["a"], {"pairs": "b"}, "list of pairs; wrap a single text in a list"),
    (["a"], {"pairs": [3]}, r"pairs\[0\] must be a str, got int"),
    (["a"], {"batch_size": 0}, "batch_size must be a positive int, got 0"),
    (["a"], {"batch_size": "8"}, "batch_size must be a positive int, got '8'"),
    (["a"], {"loaded": "clf/"}, "loaded must be a Loaded"),
    # a str is true whatever it says: version_2="false" read a QA model as SQuAD v2 (test_features has embed's)
    (["a"], {"version_2": "false"}, r"version_2 must be True or False \(or None\), got 'false'"),
    (["a"], {"progress": "no"}, "progress must be True or False, got 'no'"),
    (["a"], {"int8": "no"}, "int8 must be True or False, got 'no'"),
])
def test_predict_refuses_bad_input_before_loading_the_model(tmp_path, texts, options, message):
    """Checked before any file is read (the model directory does not even exist): once an empty list or a
    batch_size of 0 failed inside the batching (IndexError, ValueError), a word list inside NER's
    whitespace split (AttributeError), and a str of pairs was split into characters. (A list of str is a NER model's
    words: refused by another model once loaded, test_predict_inputs.)"""
    with pytest.raises(BertkitError, match=message):
        predict(tmp_path / "no-model", texts, **options)


def test_predict_file_refuses_a_str_for_a_switch_before_loading_the_model(tmp_path):
    """evaluate="false" asked for the scores (a non-empty str is true) and refused a file without answers."""
    from bertkit.tasks.predict import predict_file

    for name in ("evaluate", "version_2", "progress"):
        with pytest.raises(BertkitError, match=f"{name} must be True or False.*, got 'false'"):
            predict_file(tmp_path / "no-model", tmp_path / "in.txt", **{name: "false"})


def test_a_task_file_that_disagrees_with_the_head_is_named(tmp_path):
    """bertkit_task.json says classify, config.json a token classifier (a hand-copied file): once numpy's
    broadcast ValueError while pooling the logits."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForTokenClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    BertForTokenClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path, tokenizer=Tokenizer.from_pretrained())
    (tmp_path / "bertkit_task.json").write_text(json.dumps({"task": "classify", "max_length": 32}))
    with pytest.raises(BertkitError, match="says classify .* architectures name BertForTokenClassification: the two "
                                           "files disagree"):
        predict(tmp_path, ["a sentence"])


def test_a_loaded_model_without_its_task_head_is_named_as_such(sentiment_run, tiny, tmp_path):  # noqa: F811
    """predict(..., loaded=bertkit.load(DIR, head="encoder")) once blamed the folder ("the two files disagree;
    fine-tune the model again"); a loaded encoder without a task (a pretrained model, a static table) was a
    bare KeyError 'task', and so was a fine-tuned head handed over in memory (no bertkit_task.json to say how it reads
    its inputs). Each now says what `loaded` holds and how to load the task model."""
    import torch

    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.model.static import StaticEmbedding, save_static
    from bertkit.runtime.loading import load
    from bertkit.text.tokenizer import Tokenizer
    from bertkit.text.tokenizer_json import write_tokenizer_json

    run = sentiment_run[0] / "out"
    with pytest.raises(BertkitError, match=r"loaded holds .* encoder \(BertModel\), not its classify model: load it "
                                           r"with bertkit.load\(.*\) \(head 'auto' or 'task'\)"):
        predict(run, ["a sentence"], loaded=load(run, head="encoder"))
    tok = Tokenizer.from_pretrained()
    static = tmp_path / "static"
    write_tokenizer_json(tok, save_static(StaticEmbedding(torch.ones(len(tok), 4), normalize=True), static))
    in_memory = (BertForSequenceClassification.from_pretrained(run), Tokenizer.from_pretrained(run))
    for held in (load(tiny), load(static), load(in_memory)):
        with pytest.raises(BertkitError, match="loaded holds .*, not a fine-tuned task model: load the output folder "
                                               "of `bertkit finetune`"):
            predict(None, ["a sentence"], loaded=held)
    assert predict(None, ["a sentence"], loaded=load(run)) == predict(run, ["a sentence"])
    # where and in what a loaded model runs was decided when it was loaded: dtype= beside it was ignored
    with pytest.raises(BertkitError, match=r"loaded is already loaded \(on cpu, bfloat16\): dtype= applies when "
                                           r"predict loads the model; pass it to bertkit.load\(\) instead"):
        predict(None, ["a sentence"], loaded=load(run, dtype="bfloat16"), dtype="float32")


def test_a_loaded_model_of_another_folder_than_model_dir_is_refused(sentiment_run, tmp_path):  # noqa: F811
    """predict("runs/b", texts, loaded=bertkit.load("runs/a")), a loop over models that forgot one name, gave a's
    predictions as b's without a word (model_dir was ignored whenever loaded= was given)."""
    from bertkit.runtime.loading import load

    run = sentiment_run[0] / "out"
    other = tmp_path / "other"
    shutil.copytree(run, other)
    with pytest.raises(BertkitError, match=f"loaded holds {run}'s model, not {other}'s: pass model_dir=None "
                                           "with loaded="):
        predict(other, ["a sentence"], loaded=load(run))
    want = predict(None, ["a sentence"], loaded=load(run))
    assert predict(str(run), ["a sentence"], loaded=load(run)) == want  # the same folder, however written
    assert predict(run / ".." / "out", ["a sentence"], loaded=load(run)) == want


def test_a_checkpoint_without_a_task_file_is_cut_at_its_own_positions(tmp_path, transformers_mod):
    """A Hugging Face classifier (no bertkit_task.json) is read at BERT's 512 tokens; one made with fewer positions
    (64 here) failed on a longer text with "sequence length 101 exceeds max_position_embeddings=64: truncate the
    input (tokenizer max_length <= 64)", a fix predict offers no way to apply. It is cut at its positions, as
    transformers' tokenizer cuts at the model's length; the probabilities are transformers'."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path, tokenizer=Tokenizer.from_pretrained())
    text = "a long review of a film that goes on and on " * 9  # 101 tokens with [CLS] and [SEP]
    got = predict(tmp_path, [text])[0]["probabilities"]
    model = transformers_mod.BertForSequenceClassification.from_pretrained(str(tmp_path)).eval()
    batch = transformers_mod.BertTokenizerFast.from_pretrained(str(tmp_path))(
        text, truncation=True, max_length=64, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 64
    with torch.no_grad():
        want = model(**batch).logits.softmax(-1)[0].tolist()
    assert np.allclose([got[name] for name in sorted(got)], want, atol=1e-5)


def test_a_tagger_refuses_pairs_instead_of_dropping_them(tmp_path):
    """predict(ner_dir, texts, pairs=[...]): the second texts were dropped without a word (the tags are the
    first texts' alone); a tagger reads single texts."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForTokenClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    BertForTokenClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path, tokenizer=Tokenizer.from_pretrained())
    (tmp_path / "bertkit_task.json").write_text(json.dumps({"task": "ner", "max_length": 32, "stride": 8}))
    with pytest.raises(BertkitError, match="this ner model tags single texts: it reads no pairs; leave out pairs="):
        predict(tmp_path, ["John lives in Paris"], pairs=["a second text"])
    assert [p["words"] for p in predict(tmp_path, ["John lives in Paris"])] == [["John", "lives", "in", "Paris"]]


# --- rows without answers are predicted, not dropped; messages never in the predictions -------------

def test_rows_without_a_label_are_predicted_and_only_the_labelled_scored(sentiment_run, tmp_path, capsys):  # noqa: F811
    """A labelled file with some label cells empty: once those rows got no prediction at all ("skipped
    (missing labels)"), and a file whose label column is empty everywhere (a template filled in later)
    failed with "no usable rows". Every row is predicted; the score is the score of the labelled rows
    alone (the same file without the others)."""
    d, _ = sentiment_run
    rows = [r.split("\t") for r in (d / "dev.tsv").read_text().splitlines()[1:]]
    mixed = [(t, "" if i % 3 == 0 else lab) for i, (t, lab) in enumerate(rows)]
    partial = write_tsv(tmp_path / "partial.tsv", ["sentence", "label"], mixed)
    labelled = write_tsv(tmp_path / "labelled.tsv", ["sentence", "label"], [r for r in mixed if r[1]])
    got = predict_file(d / "out", partial, tmp_path / "p.tsv", dtype="float32")
    want = predict_file(d / "out", labelled, tmp_path / "q.tsv", dtype="float32")
    assert got.count == 30 and got.scored == want.count == want.scored == 20
    figures = {k for k, v in want.metrics.items() if isinstance(v, float)}  # beside them the per-label report
    assert {k: got.metrics[k] for k in figures} == pytest.approx({k: want.metrics[k] for k in figures})
    assert {k: v for k, v in got.metrics.items() if k not in figures} == {
        k: v for k, v in want.metrics.items() if k not in figures}
    written = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()[1:]]
    assert [r[:2] for r in written] == [list(r) for r in mixed]  # every row as it was, in the file's order
    assert predicted_column(tmp_path / "p.tsv") == [
        p["label"] for p in predict(d / "out", [t for t, _ in rows], dtype="float32")]
    assert main(["predict", str(d / "out"), str(partial), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "wrote 30 predictions" in out and "evaluation on" in out and "(the 20 of the 30 rows that carry answers, computed" in out
    # a label column that is empty everywhere: only predictions; --evaluate says there are no answers
    blank = write_tsv(tmp_path / "blank.tsv", ["sentence", "label"], [(t, "") for t, _ in rows])
    result = predict_file(d / "out", blank, tmp_path / "b.tsv")
    assert result.count == 30 and result.metrics is None
    with pytest.raises(BertkitError, match="carries no answers"):
        predict_file(d / "out", blank, tmp_path / "b.tsv", evaluate=True)


def test_squad_questions_without_answers_are_predicted(tiny, tmp_path, capsys):  # noqa: F811
    """A SQuAD JSON file is also the way to hand questions in for prediction; once its questions without
    answers were dropped without a word, and a file of none but such questions failed ("no questions
    found")."""
    rng = random.Random(0)
    cfg = QAConfig(train=str(squad_file(tmp_path / "train.json", 30, rng)), output=str(tmp_path / "o"),
                   model=str(tiny), max_length=32, doc_stride=8, max_query_length=8, training=fast(epochs=1))
    finetune_qa(cfg, log=lambda s: None)
    data = json.loads(squad_file(tmp_path / "dev.json", 12, rng).read_text())
    questions = [q for p in data["data"][0]["paragraphs"] for q in p["qas"]]
    for q in questions[::3]:
        del q["answers"]
    (tmp_path / "partial.json").write_text(json.dumps(data))
    got = predict_file(tmp_path / "o", tmp_path / "partial.json", tmp_path / "p.tsv", dtype="float32")
    paras = data["data"][0]["paragraphs"]
    data["data"][0]["paragraphs"] = [p for p in paras if "answers" in p["qas"][0]]
    (tmp_path / "answered.json").write_text(json.dumps(data))
    want = predict_file(tmp_path / "o", tmp_path / "answered.json", tmp_path / "q.tsv", dtype="float32")
    assert got.count == 12 and got.scored == want.count == 8 and got.metrics == pytest.approx(want.metrics)
    assert [r.split("\t")[0] for r in (tmp_path / "p.tsv").read_text().splitlines()[1:]] == [
        q["question"] for q in questions]
    for q in questions:
        q.pop("answers", None)
    (tmp_path / "none.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}))
    result = predict_file(tmp_path / "o", tmp_path / "none.json", tmp_path / "n.tsv")
    assert result.count == 12 and result.metrics is None
    # each row names its question's id (the official evaluation script maps id -> answer; without it, only the
    # file's order did), after the columns that were there; a question or context that is empty is skipped and
    # counted, as a table's empty cell is (the whole file was refused), and the ids still name each row's question
    header, *rows = [r.split("\t") for r in (tmp_path / "n.tsv").read_text().splitlines()]
    assert header == ["text", "text_pair", "prediction", "details", "id"]
    assert [r[4] for r in rows] == [q["id"] for q in questions]
    questions[2]["question"], paras[5]["context"] = " ", ""
    (tmp_path / "holes.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": paras}]}))
    said = []
    result = predict_file(tmp_path / "o", tmp_path / "holes.json", "-", log=said.append)
    assert result.count == 10 and any("skipped 2" in s and "empty" in s for s in said), said
    by_id = {q["id"]: q["question"] for q in questions}
    rows = [r.split("\t") for r in capsys.readouterr().out.splitlines()[1:]]
    assert len(rows) == 10 and all(by_id[r[4]] == r[0] for r in rows)
    assert [r[4] for r in rows] == [q["id"] for q in questions if q is not questions[2] and q is not questions[5]]


def test_predict_says_how_many_questions_it_read_cut_at_max_query_length(tiny, tmp_path, transformers_mod):  # noqa: F811
    """A QA model reads a question past max_query_length cut (run_squad.py's rule) and `bertkit predict` said nothing,
    where it says a text model's cut: one line now counts the questions read cut; a Hugging Face checkpoint's
    cut is run_squad's 64, at most a quarter of max_length. Reference: transformers' count of each question's
    pieces against the folder's max_query_length (8)."""
    from test_serve import task_dir

    from bertkit.tasks.registry import TASKS
    from bertkit.text.tokenizer import Tokenizer

    folder = task_dir(tmp_path / "qa", tiny, "BertForQuestionAnswering", {
        "task": "qa", "max_length": 24, "doc_stride": 8, "max_query_length": 8, "max_answer_length": 6})
    fast_tok = transformers_mod.BertTokenizerFast.from_pretrained(str(folder))
    questions = ["who went to paris ?", "who went to paris and then to rome in the day ?", "where did mary go ?"]
    cut = sum(len(fast_tok(q, add_special_tokens=False)["input_ids"]) > 8 for q in questions)
    assert 0 < cut < len(questions)
    qas = [{"id": str(i), "question": q, "answers": [{"text": "paris", "answer_start": 13}]}
           for i, q in enumerate(questions)]
    (tmp_path / "dev.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "john went to paris and then to rome .", "qas": qas}]}]}))
    said = []
    predict_file(folder, tmp_path / "dev.json", tmp_path / "p.tsv", dtype="float32", log=said.append)
    assert f"{tmp_path / 'dev.json'}: {cut} of 3 questions are longer than the model's max_query_length of 8 " \
           "tokens" in "\n".join(said), said
    tok = Tokenizer.from_pretrained(folder)
    long_question = " ".join(["paris"] * 40)  # a checkpoint that keeps no settings: min(64, max_length // 4)
    assert TASKS["qa"].cut(tok, [long_question], ["c"], {"max_length": 128, "inferred": True}).startswith(
        "1 of 1 questions are longer than the model's max_query_length of 32 tokens")


def test_with_output_dash_standard_output_holds_only_the_predictions(sentiment_run, tmp_path, capsys):  # noqa: F811
    """`--output -` promises the predictions alone on standard output (`> preds.tsv`, a pipe); the
    reader's count of skipped rows ("t.tsv: 2 examples, skipped 1 ...") was printed there, above the
    header."""
    d, _ = sentiment_run
    for name, header, rows in (("t.tsv", ["sentence", "label"], [("this day was good .", "pos"), ("", "neg"),
                                                                  ("the food was bad .", "")]),
                               ("u.tsv", ["sentence"], [("this day was good .",), ("",)])):
        path = write_tsv(tmp_path / name, header, rows)
        path.write_text(path.read_text() + "\n\n")  # empty lines: skipped and counted
        assert main(["predict", str(d / "out"), str(path), "-o", "-", "--dtype", "float32"]) == 0
        captured = capsys.readouterr()
        lines = captured.out.splitlines()
        width = len(header) + 2  # the table's columns as they were, then prediction and details
        assert lines[0] == "\t".join([*header, "prediction", "details"]), lines
        assert all(len(x.split("\t")) == width for x in lines), lines
        assert "skipped" in captured.err


def test_a_jsonl_row_without_the_label_key_is_a_row_without_a_label(sentiment_run, tmp_path):  # noqa: F811
    """JSONL rows are objects, and one may leave the label out: that row was an error naming the label
    column ("no column 'label' ... pass --label-column"), which the other rows have; training now skips
    and counts it as a missing label and prediction predicts it. A key missing from the first row is
    still the one-line error (a misspelt --label-column)."""
    from bertkit.data.tables import read_text_examples

    d, _ = sentiment_run
    rows = [{"sentence": "this day was good .", "label": "pos"}, {"sentence": "the food was bad ."},
            {"sentence": "the movie was awful .", "label": "neg"}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples, report = read_text_examples(path)
    assert [e.label for e in examples] == ["pos", "neg"] and report.skipped == {"missing labels": 1}
    result = predict_file(d / "out", path, tmp_path / "p.tsv", dtype="float32")
    assert (result.count, result.scored) == (3, 2) and result.metrics["accuracy"] == 1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(BertkitError, match=r"t.jsonl:1: no column 'label' \(columns: 'sentence'\); pass --label"):
        read_text_examples(path)


@pytest.fixture(scope="module")
def hf_head(tmp_path_factory):
    """A Hugging Face head checkpoint: config.json names BertForSequenceClassification, no bertkit_task.json
    (so nothing records which column it read)."""
    import torch

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("hf_head")
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=3)
    BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        path, tokenizer=Tokenizer.from_pretrained())
    return path


TEXTS = ["the film was fine", "a dull and long story", "what a great cast"]


@pytest.mark.parametrize("name,header,rows,column", [
    ("reviews.tsv", ["id", "review"], [(str(i), t) for i, t in enumerate(TEXTS)], "review"),  # ids are no text
    ("texts.tsv", ["text", "source"], [(t, "web") for t in TEXTS], "text"),
    ("reviews.csv", ["review", "label"], [(t, "") for t in TEXTS], "review"),
    ("reviews.jsonl", None, [{"idx": i, "body": t} for i, t in enumerate(TEXTS)], "body"),
    ("labelled.tsv", ["label", "comment"], [(f"LABEL_{i}", t) for i, t in enumerate(TEXTS)], "comment")])
def test_a_hugging_face_head_reads_the_files_one_text_column_and_says_so(hf_head, tmp_path, capsys, name, header,
                                                                         rows, column):
    path = tmp_path / name
    if header is None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        sep = "," if name.endswith(".csv") else "\t"
        path.write_text("\n".join(sep.join(r) for r in [header, *rows]) + "\n")
    assert main(["predict", str(hf_head), str(path), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if column in line]
    assert len(said) == 1 and f"texts from column {column!r}" in said[0]
    expected = [p["label"] for p in predict(hf_head, TEXTS)]
    assert predicted_column(tmp_path / "p.tsv") == expected
    assert predicted_column(tmp_path / "p.tsv", column) == TEXTS  # the file's columns kept, its texts among them


def test_a_hugging_face_head_refuses_a_file_with_several_text_columns_naming_them(hf_head, tmp_path, capsys):
    path = write_tsv(tmp_path / "two.tsv", ["title", "body", "label"], [(t, t, "") for t in TEXTS])
    assert main(["predict", str(hf_head), str(path), "-o", str(tmp_path / "p.tsv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "several columns of text ('title', 'body')" in err and "--text-column" in err
    assert main(["predict", str(hf_head), str(path), "-o", str(tmp_path / "p.tsv"), "--text-column", "body",
                 "--dtype", "float32"]) == 0
    assert predicted_column(tmp_path / "p.tsv") == [p["label"] for p in predict(hf_head, TEXTS)]


def test_embed_and_predict_refuse_a_table_of_several_text_columns_in_one_line(hf_head, tmp_path, capsys):
    """The rule "a table's one column of text" is embed's and predict's, and so is its refusal: embed said "... and
    none named 'sentence' or 'text' (its columns: ...)", predict "... and no 'sentence' column (its columns: ...),
    and the model records none ...", two wordings of one refusal. Each now names its own option after one line."""
    path = write_tsv(tmp_path / "two.tsv", ["title", "body", "label"], [(t, t, "pos") for t in TEXTS])
    said = {}
    for command in (["embed", str(path), "-o", str(tmp_path / "v.npy")], ["predict", str(hf_head), str(path)]):
        assert main([*command, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        said[command[0]], said[command[0] + " option"] = err.split(": name the one to read with ")
    assert said["embed"] == said["predict"]
    assert "several columns of text ('title', 'body')" in said["embed"] and "(its columns: title, body, label)" in said["embed"]
    assert said["embed option"].startswith("--column") and said["predict option"].startswith("--text-column")


def test_a_text_holding_a_carriage_return_stays_one_row_of_the_predictions(sentiment_run, tmp_path):  # noqa: F811
    # predict's TSV replaced tab and newline in a cell but kept a carriage return: a text "good\rfilm" (a JSONL
    # escape, a CSV cell typed on Windows) was written raw, and every line reader (csv, pandas, Python's files)
    # read it as two rows, the second holding the prediction: the rows no longer matched the inputs
    import csv

    d, _ = sentiment_run
    texts = ["the food was\rgood .", "it was\r\nbad .", "this day\twas\ngood .", "plain text ."]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"sentence": t}) + "\n" for t in texts), encoding="utf-8")
    result = predict_file(d / "out", src, tmp_path / "p.tsv", dtype="float32", log=lambda s: None)
    with open(tmp_path / "p.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    with open(tmp_path / "p.tsv", encoding="utf-8") as f:  # universal newlines, as pandas reads a table
        assert len(f.readlines()) == len(texts) + 1
    assert result.count == len(texts) and len(rows) == len(texts) + 1
    assert [r[1] for r in rows[1:]] == [p["label"] for p in predict(d / "out", texts)]
    assert [r[0].split() for r in rows[1:]] == [t.split() for t in texts]  # the same words, on one line
    # the fine-tuning run's dev predictions are written the same way
    from bertkit.tasks.classification import write_predictions
    from bertkit.data.tables import TextExample

    write_predictions(tmp_path / "dev.tsv", [TextExample(t, None, "pos") for t in texts],
                      [{"label": "pos", "probabilities": {"pos": 1.0}}] * len(texts), "single_label_classification")
    with open(tmp_path / "dev.tsv", encoding="utf-8") as f:
        assert len(f.readlines()) == len(texts) + 1


def test_a_file_of_sentences_with_a_blank_line_is_still_one_sentence_per_line(tmp_path):
    # a blank line made any file CoNLL columns: `predict NER sentences.txt` took each line's first word for a
    # token and dropped the rest ("Peter EU" for two sentences, the third "The", with --no-evaluate), or said
    # "4 columns where earlier lines have 5; tokens and tags are misaligned" of a file that has no tags
    from bertkit.tasks.ner_inference import read_inputs, read_labelled

    lines = ["Peter Blackburn went to London", "EU rejects German call", "", "The cat sat on the mat", "   ",
             "Short one ."]
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_inputs(path, {})[:2] == ([line for line in lines if line.strip()], None)
    assert read_labelled(path, {}) is None
    # CoNLL columns without -DOCSTART- are still columns, and a line missing its tag still an error naming it
    conll = tmp_path / "tagged.txt"
    conll.write_text("EU B-ORG\nrejects O\n\nPeter B-PER\nBlackburn I-PER\n", encoding="utf-8")
    assert read_labelled(conll, {})[2] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    conll.write_text("EU B-ORG\nrejects O\n\n" + "".join(f"w{i} O\n" for i in range(20)) + "Peter\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=r"tagged.txt:24: 'Peter' has 1 column"):
        read_labelled(conll, {})


def strict_json(text: str):
    """JSON as a strict reader takes it (RFC 8259 has no NaN or Infinity: jq, JavaScript's JSON.parse refuse them)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_regression_model_with_one_constant_score_writes_null_not_nan(tiny, tmp_path, capsys):  # noqa: F811
    """A regression model that gives every dev example the same score has no correlation (scipy: nan; the
    premise, checked below). finetune wrote "pearson": NaN into metrics.json and metrics.jsonl, which strict JSON
    readers refuse, printed "pearson nan", and predict printed "pearson nan" too. Now, as `evaluate sts`: null in
    the JSON, a warning, "undefined" printed; the figures that are defined (mse) stay numbers."""
    hdr = ["sentence", "score"]
    train = write_tsv(tmp_path / "t.tsv", hdr, [("the movie was good .", 4.0), ("the food was bad .", 0.5)])
    dev = write_tsv(tmp_path / "d.tsv", hdr, [("the day was new .", 1.0), ("the day was new .", 3.0)])
    said = "every example the same score .*undefined and reported as null"
    with pytest.warns(UserWarning, match=said) as caught:
        assert main(["finetune", "regression", "--train", str(train), "--dev", str(dev), "-o", str(tmp_path / "o"),
                     "--model", str(tiny), "--label-column", "score", "--max-length", "16", "--epochs", "2",
                     "--quiet"]) == 0
    # once a run, not after each epoch and again for the saved epoch's report (3 times here)
    assert sum(bool(re.search(said, str(w.message))) for w in caught) == 1, [str(w.message) for w in caught]
    out = capsys.readouterr().out
    scores = [p["score"] for p in predict(tmp_path / "o", ["the day was new ."] * 2)]
    assert np.isnan(stats.pearsonr(scores, [1.0, 3.0])[0])  # the premise: one constant score, no correlation
    metrics = strict_json((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["dev"]["pearson"] is None and metrics["dev"]["spearman"] is None
    assert metrics["dev"]["mse"] == pytest.approx(np.mean([(scores[0] - 1) ** 2, (scores[0] - 3) ** 2]), abs=1e-4)
    assert all(e["pearson"] is None for e in metrics["epochs"])
    for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    assert "pearson undefined, spearman undefined" in out and "nan" not in out.lower(), out
    with pytest.warns(UserWarning, match=said):
        assert main(["predict", str(tmp_path / "o"), str(dev), "-o", str(tmp_path / "p.tsv"), "--dtype",
                     "float32"]) == 0
    out = capsys.readouterr().out
    assert "pearson undefined, spearman undefined, mse" in out and "nan" not in out.lower(), out


def test_predict_names_the_label_of_a_two_label_f1_as_finetune_does(sentiment_run, tmp_path, capsys):  # noqa: F811
    """finetune prints `f1 (pos)` and writes `f1_label` (the F1 of the second label in sorted order: which one is
    not obvious, RTE's is not_entailment's); predict's evaluation printed a bare `f1` for the same figure and its
    metrics held no label. Now both say it, and predict's figures on the dev file are finetune's (metrics.json)."""
    from bertkit.tasks import format_report

    d, final = sentiment_run
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("evaluation on "))
    dev = json.loads((d / "out" / "metrics.json").read_text())["dev"]
    assert re.search(rf"\bf1 \({dev['f1_label']}\) {dev['f1']:.4f}", line), line
    assert re.search(rf"\bf1 \(pos\) {dev['f1']:.4f}", format_report(final))  # the same words as finetune's
    result = predict_file(d / "out", d / "dev.tsv", tmp_path / "p2.tsv", dtype="float32")
    assert result.metrics["f1_label"] == dev["f1_label"] == "pos"


# --- the per-label table and the confusion matrix under evaluate mode's figures ------------------------------

def printed_tables(text: str) -> tuple[dict, dict]:
    """({label: (precision, recall, f1, support)}, {gold: [counts in the columns' order]}, columns) as the
    per-label table and the confusion matrix are printed; numbered columns (many labels) are the rows' labels
    in their order."""
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.split() == ["label", "precision", "recall", "f1", "support"])
    rows = {}
    for line in lines[at + 1:]:
        cells = line.rsplit(None, 4)
        if len(cells) != 5 or not cells[-1].isdigit():
            break
        rows[cells[0].strip()] = (*map(float, cells[1:4]), int(cells[4]))
    at = next(i for i, x in enumerate(lines) if x.startswith("confusion matrix"))
    heads = lines[at + 1].split()
    matrix = {}
    for line in lines[at + 2: at + 2 + len(rows)]:
        name, *counts = line.rsplit(None, len(heads))
        matrix[re.sub(r"^\s*\d+ ", "", name).strip() if heads[0] == "1" else name.strip()] = list(map(int, counts))
    return rows, matrix, (list(matrix) if heads[0] == "1" else heads)


def test_predict_prints_the_per_label_table_and_the_confusion_matrix(sentiment_run, tmp_path, capsys):  # noqa: F811
    """predict printed accuracy/F1 alone; the per-label figures and the confusion matrix finetune prints for its dev
    set (and predict_file(...).metrics holds) were not shown. Every third label flipped, so the matrix is not
    diagonal; each printed figure is recomputed by hand from the written predictions and the file's labels."""
    d, _ = sentiment_run
    rows = [r.split("\t") for r in (d / "dev.tsv").read_text().splitlines()[1:]]
    flip = {"pos": "neg", "neg": "pos"}
    path = write_tsv(tmp_path / "mixed.tsv", ["sentence", "label"],
                     [(t, flip[g] if i % 3 == 0 else g) for i, (t, g) in enumerate(rows)])
    assert main(["predict", str(d / "out"), str(path), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    table, matrix, columns = printed_tables(capsys.readouterr().out)
    gold = [r.split("\t")[1] for r in path.read_text().splitlines()[1:]]
    pred = predicted_column(tmp_path / "p.tsv")
    assert set(table) == set(matrix) == set(columns) == {"neg", "pos"}
    for name in ("neg", "pos"):
        tp = sum(p == g == name for p, g in zip(pred, gold))
        p, r = tp / max(pred.count(name), 1), tp / gold.count(name)
        assert table[name] == pytest.approx((p, r, 2 * p * r / (p + r) if p + r else 0.0, gold.count(name)),
                                            abs=5e-4), name
        assert matrix[name] == [sum(g == name and p == c for p, g in zip(pred, gold)) for c in columns]
    assert sum(map(sum, matrix.values())) == 30 and any(matrix[g][j] for g in matrix for j, c in enumerate(columns)
                                                        if c != g)  # the premise: a mistake to show
    # with --output - the predictions own standard output: the tables go to standard error with the figures
    assert main(["predict", str(d / "out"), str(path), "-o", "-", "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    assert printed_tables(captured.err)[1] == matrix and "confusion" not in captured.out


def test_the_tables_of_three_labels_by_hand_and_many_labels_compactly():
    """A 3-label NLI example counted by hand, and 14 long label names: the matrix stays within 100 characters a
    line (its columns numbered as the rows), every count still read back."""
    from bertkit.metrics import tasks as M
    from bertkit.tasks.registry import task_named

    names = ["contradiction", "entailment", "neutral"]
    gold = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    pred = [0, 0, 1, 1, 1, 2, 0, 2, 2, 2]
    # by hand: contradiction tp 2 of 3 predicted, 3 gold; entailment tp 2 of 3, 4 gold; neutral tp 3 of 4, 3 gold
    want = {"contradiction": (2 / 3, 2 / 3, 2 / 3, 3), "entailment": (2 / 3, 2 / 4, 4 / 7, 4),
            "neutral": (3 / 4, 1.0, 6 / 7, 3)}
    scores = {"per_label": {n: v for n, v in M.per_label_report(pred, gold, names).items() if n in names},
              "confusion_matrix": {"labels": names, "rows_gold_columns_predicted": M.confusion_matrix(pred, gold, 3)}}
    text = "\n".join(task_named("pair").tables(scores))
    table, matrix, columns = printed_tables(text)
    assert set(table) == set(want) and columns == names
    for name, figures in want.items():
        assert table[name] == pytest.approx(figures, abs=5e-4), name
    assert matrix == {"contradiction": [2, 1, 0], "entailment": [1, 2, 1], "neutral": [0, 0, 3]}
    many = [f"topic {i}: {'business and finance' if i % 2 else 'science'}" for i in range(14)]
    counts = [[(i * 7 + j * 3) % 11 * (10 if i == j else 1) for j in range(14)] for i in range(14)]
    big = {"per_label": {n: {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": sum(counts[i])}
                         for i, n in enumerate(many)},
           "confusion_matrix": {"labels": many, "rows_gold_columns_predicted": counts}}
    text = "\n".join(task_named("classify").tables(big))
    assert max(map(len, text.splitlines())) <= 100, text
    table, matrix, columns = printed_tables(text)
    assert list(table) == many == columns and matrix == dict(zip(many, counts))
    assert task_named("regression").tables({"pearson": 0.5}) == [] and task_named("qa").tables({"f1": 1.0}) == []


def official_v1(dataset: list, predictions: dict) -> dict:
    """SQuAD v1.1's evaluate-v1.1.py, transcribed: `total` counts every question of the dataset, and a question
    without a prediction ("Unanswered question ... will receive score 0.") adds nothing to the sums."""

    def norm(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(pred, gold):
        p, g = norm(pred).split(), norm(gold).split()
        same = sum((collections.Counter(p) & collections.Counter(g)).values())
        return 0 if same == 0 else 2 * (same / len(p)) * (same / len(g)) / (same / len(p) + same / len(g))

    exact = f1s = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                golds = [a["text"] for a in qa["answers"]]
                exact += max(int(norm(predictions[qa["id"]]) == norm(g)) for g in golds)
                f1s += max(f1(predictions[qa["id"]], g) for g in golds)
    return {"exact_match": 100 * exact / total, "f1": 100 * f1s / total}


def test_a_skipped_squad_question_scores_0_as_the_official_script_scores_it(tiny, tmp_path, capsys):  # noqa: F811
    """A question whose text (or context) is empty is skipped, nothing to predict; the official v1.1 script counts
    every question of the file and gives one it has no answer for 0. predict left it out of the figures' count
    too (exact match and F1 over 9 of the 10 questions), and the line said nothing of it."""
    rng = random.Random(0)
    cfg = QAConfig(train=str(squad_file(tmp_path / "train.json", 60, rng)), output=str(tmp_path / "o"),
                   model=str(tiny), max_length=32, doc_stride=8, max_query_length=8, training=fast(epochs=2))
    finetune_qa(cfg, log=lambda s: None)
    data = json.loads(squad_file(tmp_path / "dev.json", 10, rng).read_text())
    data["data"][0]["paragraphs"][3]["qas"][0]["question"] = "  "
    dev = tmp_path / "holes.json"
    dev.write_text(json.dumps(data))
    assert main(["predict", str(tmp_path / "o"), str(dev), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    header, *rows = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()]
    preds = {r[header.index("id")]: r[header.index("prediction")] for r in rows}
    assert len(preds) == 9
    want = official_v1(data["data"], preds)
    assert want["f1"] > 0  # else a wrong count could not show
    assert reported(out) == pytest.approx(want, abs=1e-4)
    assert f"evaluation on {dev} (9 questions, and 1 skipped question scored 0" in out, out


def test_multi_label_cells_read_back_as_the_labels_predicted(tiny, tmp_path):  # noqa: F811
    """Labels may hold a comma: trained with --label-separator '|' (or from JSONL lists). predict and finetune's
    dev_predictions.tsv joined a row's labels with ',' whatever the model was trained with, so {'loud', 'pets,
    cats'} was written 'loud,pets, cats': three labels, or one, to whoever reads it. A cell is now joined as the
    training file's cells were (the model's separator), which the training reader reads back (`parse_label`)
    into the labels predicted; where a label name holds the separator, a JSON list."""
    from bertkit.data.tables import label_cell, parse_label
    from bertkit.model.config import MULTI_LABEL

    rows = [(f"{FILL[i % len(FILL)]} was {w} .", "pets, cats|loud") for i, w in enumerate(POS + NEG)] * 3
    train = write_tsv(tmp_path / "t.tsv", ["sentence", "labels"], rows)
    cfg = TextTaskConfig(train=str(train), dev=str(train), output=str(tmp_path / "o"), task="multi_label",
                         model=str(tiny), label_column="labels", label_separator="|", max_length=32,
                         training=fast(epochs=2))
    finetune_text(cfg, log=lambda s: None)
    texts = [t for t, _ in rows[:6]]
    want = [p["labels"] for p in predict(tmp_path / "o", texts)]
    assert ["loud", "pets, cats"] in want  # both labels on a row: what a ',' made ambiguous
    (tmp_path / "new.txt").write_text("\n".join(texts) + "\n")
    predict_file(tmp_path / "o", tmp_path / "new.txt", tmp_path / "p.tsv")
    got = [parse_label(c, MULTI_LABEL, "|", "p.tsv") for c in predicted_column(tmp_path / "p.tsv")]
    assert got == want
    header, *lines = (tmp_path / "o" / "dev_predictions.tsv").read_text().splitlines()
    at = header.split("\t").index("gold")
    assert all(parse_label(x.split("\t")[at], MULTI_LABEL, "|", "") == ["loud", "pets, cats"] for x in lines)
    # a label name holding the separator itself (a JSONL list's 'a, b' under the default ','): a JSON list
    assert json.loads(label_cell(["a, b", "c"], ",", ["a, b", "c", "d"])) == ["a, b", "c"]
    assert json.loads(label_cell(["c"], ",", ["a, b", "c"])) == ["c"]  # the model's every cell, not the row's
