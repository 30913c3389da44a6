"""Extractive QA: answer location, window features, n-best decoding, end to end.

Features are checked against transformers' run_qa.py recipe (the fast
tokenizer with stride and offsets) on real SQuAD questions; decoding against
hand-built logits where the right answer is known.
"""

import json
import random

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.data.squad import read_squad
from bertkit.data.tables import QAExample
from bertkit.tasks.config import QAConfig
from bertkit.tasks.qa import finetune_qa
from bertkit.tasks.reports import qa_report
from bertkit.tasks.qa_inference import best_answers, char_to_pieces, locate_answer, make_features, score_answers
from bertkit.text.tokenizer import Tokenizer
from test_finetune import fast, tiny  # noqa: F401
from test_finetune_ner import assert_saved_epoch_is_said
from test_metrics import official_v2


@pytest.fixture(scope="module")
def tok(tiny):  # noqa: F811
    return Tokenizer.from_pretrained(tiny)


def test_locate_answer():
    ctx = "john went to paris. mary went to paris too."
    assert locate_answer(ctx, "paris", 13) == 13
    assert locate_answer(ctx, "paris", 30) == 33  # start off by a few: the nearest occurrence
    assert locate_answer(ctx, "london", 13) is None


def test_char_to_pieces():
    offsets = [(0, 4), (5, 9), (10, 12), (13, 18), (18, 19)]
    assert char_to_pieces(offsets, 13, 18) == (3, 3)
    assert char_to_pieces(offsets, 6, 15) == (1, 3)  # partial overlaps count
    assert char_to_pieces(offsets, 12, 13) is None  # only a space


def qcfg(**kw):
    return QAConfig(train="", output="", **{"max_length": 24, "doc_stride": 4, "max_query_length": 4, **kw})


def test_window_labels_point_at_the_answer(tok):
    ctx = " ".join(["the day was slow ."] * 4) + " john visited paris . " + " ".join(["it was new ."] * 4)
    start = ctx.index("paris")
    ex = QAExample("q", "where went john ?", ctx, [("paris", start)])
    cfg = qcfg()
    feats, skipped = make_features(tok, [ex], cfg, training=True)
    assert not skipped and len(feats) > 2
    q_len = 4  # "where went john ?" has 4 pieces, cut to max_query_length 4
    hits = [f for f in feats if f["start_positions"] != 0]
    assert hits and all(f["start_positions"] == f["end_positions"] for f in hits)
    for f in hits:
        assert tok.convert_ids_to_tokens([f["input_ids"][f["start_positions"]]]) == ["paris"]
        assert f["token_type_ids"][: q_len + 2] == [0] * (q_len + 2) and f["token_type_ids"][-1] == 1
    misses = [f for f in feats if f["start_positions"] == 0]
    assert misses and all(f["end_positions"] == 0 for f in misses)  # no answer in the window: [CLS]


def test_unfindable_answer_is_skipped_and_counted(tok):
    ex = [QAExample("a", "who ?", "john visited paris .", [("london", 3)]),
          QAExample("b", "who ?", "john visited paris .", [("john", 2)])]
    feats, skipped = make_features(tok, ex, qcfg(), training=True)
    assert skipped["answers not found in their context"] == 1
    assert skipped["answer_start fixed to the text's nearest occurrence (kept)"] == 1
    assert {f["example_index"] for f in feats} == {1}


def decode_case(tok, start_logit_at, end_logit_at, ctx="john visited paris and mary visited london .", **kw):
    ex = QAExample("q", "who ?", ctx, [])
    cfg = qcfg(max_length=32, **kw)
    feats, _ = make_features(tok, [ex], cfg, training=False)
    T = len(feats[0]["input_ids"])
    s, e = np.zeros(T, np.float32), np.zeros(T, np.float32)
    for pos, v in start_logit_at.items():
        s[pos] = v
    for pos, v in end_logit_at.items():
        e[pos] = v
    return best_answers([ex], feats, [s], [e], cfg)[0], feats[0]


def test_decoding_by_hand(tok):
    # [CLS] who ? [SEP] john(4) visited(5) paris(6) and(7) mary(8) visited(9) london(10) .(11) [SEP]
    out, f = decode_case(tok, {6: 5.0}, {6: 5.0})
    assert out["answer"] == "paris" and out["start"] == 13
    # the question's pieces are never an answer even with the highest logits
    out, _ = decode_case(tok, {1: 9.0, 8: 2.0}, {1: 9.0, 10: 2.0})
    assert out["answer"] == "mary visited london"
    # end before start is excluded; the best valid pair wins
    out, _ = decode_case(tok, {10: 6.0, 4: 1.0}, {6: 6.0, 11: 0.5})
    assert out["answer"] == "john visited paris"
    # max_answer_length: a 7-piece span is too long with a limit of 3
    out, _ = decode_case(tok, {4: 5.0, 8: 1.0}, {10: 5.0}, max_answer_length=3)
    assert out["answer"] == "mary visited london"


def test_a_padded_batchs_logits_decode_as_each_features_own(tok):
    """best_answers reads each window's logits; docs/guide.md hands it the rows of a padded batch (collate pads to
    the longest), as a user running the model on `collate(features)` does. The n-best starts and ends were taken
    over the padding too: padding positions with high logits (nothing masks a head's output there) took the 20
    slots and a short question got the empty answer, silently. Only the feature's own positions are read now."""
    ex = QAExample("q", "who ?", "john visited paris and mary visited london .", [])
    cfg = qcfg(max_length=32)
    feats, _ = make_features(tok, [ex], cfg, training=False)
    T = len(feats[0]["input_ids"])
    s, e = np.zeros(T, np.float32), np.zeros(T, np.float32)
    s[6] = e[6] = 5.0  # "paris"
    padded = [np.concatenate([v, np.full(25, 9.0, np.float32)]) for v in (s, e)]  # 25 padding positions
    want = best_answers([ex], feats, [s], [e], cfg)[0]
    assert want["answer"] == "paris"
    assert best_answers([ex], feats, [padded[0]], [padded[1]], cfg)[0] == want


def test_questions_sharing_an_id_are_each_scored():
    """The official SQuAD files give each question its own id, but a hand-made file may number each paragraph's
    questions from 1. Scores were keyed by id, so questions sharing one collapsed into the last: predict's
    evaluate mode and finetune's dev figures scored fewer questions than they counted, silently (two of three
    right gave 50.0). Each question is scored now, as the official script scores each of its unique ids."""
    ctx = "john went to paris in may ."
    ex = [QAExample("1", "where ?", ctx, [("paris", 13)]), QAExample("1", "when ?", ctx, [("may", 22)]),
          QAExample("2", "who ?", ctx, [("john", 0)])]
    preds = [{"answer": "paris"}, {"answer": "paris"}, {"answer": "the john"}]  # right, wrong, right ("the" drops)
    assert score_answers(preds, ex, {}) == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}
    ex.append(QAExample("2", "why ?", ctx, [], is_impossible=True))  # SQuAD v2: its rules and split
    scores = score_answers(preds + [{"answer": ""}], ex, {"version_2": True})
    assert (scores["exact_match"], scores["HasAns_total"], scores["NoAns_total"]) == (75.0, 3, 1)


def test_version_2_null_answer(tok):
    out, _ = decode_case(tok, {0: 8.0, 6: 2.0}, {0: 8.0, 6: 2.0}, version_2=True)
    assert out["answer"] == ""
    out, _ = decode_case(tok, {0: 8.0, 6: 2.0}, {0: 8.0, 6: 2.0}, version_2=True, null_score_diff_threshold=20.0)
    assert out["answer"] == "paris"
    out, _ = decode_case(tok, {0: 8.0, 6: 2.0}, {0: 8.0, 6: 2.0})  # v1.1 always answers
    assert out["answer"] == "paris"


def test_long_context_answer_comes_from_max_context_window(tok):
    ctx = " ".join(["the day was slow ."] * 6)
    ex = QAExample("q", "what ?", ctx, [])
    cfg = qcfg(max_length=16, doc_stride=6)
    feats, _ = make_features(tok, [ex], cfg, training=False)
    assert len(feats) > 2
    # every window scores the same relative position as a strong answer; only the
    # window where that token has its maximum context may supply it
    starts, ends = [], []
    for f in feats:
        s = np.zeros(len(f["input_ids"]), np.float32)
        s[f["context_first"]] = 10.0  # first context piece: never max context except in window 0
        starts.append(s)
        ends.append(s.copy())
    out = best_answers([ex], feats, starts, ends, cfg)[0]
    assert out["start"] == 0 and out["answer"] == "the"


@pytest.mark.oracle
@pytest.mark.data
def test_features_match_run_qa_recipe(shared_data, default_model_dir, transformers_mod):
    """Windows and start/end labels equal transformers' run_qa.py prepare_train_features."""
    examples, _ = read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json", max_examples=60)
    ours = Tokenizer.from_pretrained(default_model_dir)
    theirs = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    cfg = QAConfig(train="", output="", max_length=128, doc_stride=32, max_query_length=64)
    feats, skipped = make_features(ours, examples, cfg, training=True)
    assert not skipped
    enc = theirs([e.question for e in examples], [e.context for e in examples], truncation="only_second",
                 max_length=128, stride=32, return_overflowing_tokens=True, return_offsets_mapping=True)
    expect = []
    for k, sample in enumerate(enc["overflow_to_sample_mapping"]):
        ex = examples[sample]
        text, s_char = ex.answers[0]
        e_char = s_char + len(text)
        seq, offs = enc.sequence_ids(k), enc["offset_mapping"][k]
        a = seq.index(1)
        b = len(seq) - 1 - seq[::-1].index(1)
        if not (offs[a][0] <= s_char and offs[b][1] >= e_char):
            expect.append((0, 0))
            continue
        while a < len(offs) and seq[a] == 1 and offs[a][0] <= s_char:
            a += 1
        while seq[b] == 1 and offs[b][1] >= e_char:
            b -= 1
        expect.append((a - 1, b + 1))
    assert [f["input_ids"] for f in feats] == enc["input_ids"]
    assert [(f["start_positions"], f["end_positions"]) for f in feats] == expect



@pytest.mark.data
def test_each_context_is_tokenized_once_and_the_answers_are_the_per_question_ones(shared_data, default_model_dir,
                                                                                    monkeypatch):
    """SQuAD asks about 5 questions of each paragraph, and a long context was tokenized again for each of them.
    On real dev rows each distinct context is now encoded once (counted at the tokenizer), and the windows and
    the answers are those of each question read alone (one question per call: its context encoded for it, the
    old path), byte for byte. The model is a fixed function of the pieces (the answers depend on nothing else)."""
    from bertkit.tasks.qa_inference import predict

    examples, _ = read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json", max_examples=40)
    questions, contexts = [e.question for e in examples], [e.context for e in examples]
    assert len(set(contexts)) < len(contexts) // 3  # several questions a paragraph
    tok = Tokenizer.from_pretrained(default_model_dir)
    info = {"max_length": 96, "doc_stride": 24, "max_query_length": 24}

    def run(feats, outputs, per_token):  # a stand-in model: logits a fixed function of each window's pieces
        logits = [np.cos(np.arange(len(f["input_ids"])) * 0.7 + np.array(f["input_ids"]) * 0.013) for f in feats]
        return {"start_logits": logits, "end_logits": [np.sin(x * 3.1) for x in logits]}

    alone = [predict(run, tok, [q], [c], info)[0] for q, c in zip(questions, contexts)]
    encoded, encode = [], tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, *a, **k: (encoded.append(text), encode(text, *a, **k))[1])
    together = predict(run, tok, questions, contexts, info)
    assert sorted(t for t in encoded if t in set(contexts)) == sorted(set(contexts))  # each context once
    assert json.dumps(together) == json.dumps(alone)
    assert sum(a["answer"] != "" for a in alone) == len(alone)  # v1: a span for every question
    cfg = qcfg(**info)
    feats, _ = make_features(tok, examples, cfg, training=False)
    one = [{**f, "example_index": i} for i, ex in enumerate(examples) for f in make_features(tok, [ex], cfg, False)[0]]
    assert feats == one

def squad_file(path, n, rng):
    """A toy SQuAD file: 'where did NAME go ?' answered by the city after 'to'."""
    paras = []
    for i in range(n):
        who = rng.choice(["john", "mary"])
        other = "mary" if who == "john" else "john"
        c1, c2 = rng.sample(["paris", "london", "berlin"], 2)
        ctx = f"{who} went to {c1} . {other} went to {c2} ."
        paras.append({"context": ctx, "qas": [{"id": f"{path.stem}{i}", "question": f"where went {who} ?",
                                               "answers": [{"text": c1, "answer_start": ctx.index(c1)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}))
    return path


def test_qa_end_to_end(tiny, tmp_path):  # noqa: F811
    import bertkit

    rng = random.Random(0)
    dev = squad_file(tmp_path / "dev.json", 20, rng)
    data = json.loads(dev.read_text())
    data["data"][0]["paragraphs"][1]["qas"][0]["id"] = data["data"][0]["paragraphs"][0]["qas"][0]["id"]
    dev.write_text(json.dumps(data))  # two questions share an id, as in a hand-made file
    cfg = QAConfig(train=str(squad_file(tmp_path / "train.json", 100, rng)), dev=str(dev),
                   output=str(tmp_path / "o"), model=str(tiny), max_length=32, doc_stride=8, max_query_length=8,
                   training=fast(epochs=6, metric="f1"))
    said = []
    final = finetune_qa(cfg, log=said.append)
    assert final["dev"]["exact_match"] >= 80.0 and final["dev_questions"] == 20
    assert_saved_epoch_is_said(final, "f1")
    preds = json.loads((tmp_path / "o" / "dev_predictions.json").read_text())
    # SQuAD's predictions file is id -> answer: the shared id keeps one answer, and the run says so (it was silent)
    assert len(preds) == 19
    assert any("keeps one answer per id" in line and "repeats an earlier one's): 1 of 20" in line for line in said), said
    out = bertkit.predict(tmp_path / "o", ["where went mary ?"], pairs=["mary went to berlin . john went to paris ."])
    assert out[0]["answer"] == "berlin" and out[0]["start"] == 13


def test_overlapping_article_slices_are_an_error(tiny, tmp_path):  # noqa: F811
    p = squad_file(tmp_path / "s.json", 5, random.Random(0))
    cfg = QAConfig(train=str(p), dev=str(p), output=str(tmp_path / "o"), model=str(tiny), max_length=32, doc_stride=8, max_query_length=8,
                   training=fast())
    with pytest.raises(BertkitError, match="overlap"):
        finetune_qa(cfg, log=lambda s: None)


def test_a_squad_v2_dev_file_needs_the_v2_flag_too(tiny, tmp_path):  # noqa: F811
    """Only the training file was checked for unanswerable questions: a SQuAD v1 train file with a v2 dev file
    trained, then scored the dev set as v1 (which has no empty answer to give). Both files are checked now."""
    train = squad_file(tmp_path / "train.json", 5, random.Random(0))
    dev = squad_file(tmp_path / "dev.json", 3, random.Random(1))
    data = json.loads(dev.read_text())
    data["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=True, answers=[])
    dev.write_text(json.dumps({**data, "version": "v2.0"}))
    cfg = QAConfig(train=str(train), dev=str(dev), output=str(tmp_path / "o"), model=str(tiny), max_length=32,
                   doc_stride=8, max_query_length=8, training=fast())
    with pytest.raises(BertkitError, match=r"dev.json has unanswerable questions \(SQuAD v2\): pass --version-2"):
        finetune_qa(cfg, log=lambda s: None)
    assert not (tmp_path / "o").exists()  # refused before anything was trained or written
    # with the flag: the dev figures are the official v2.0 script's on the predictions written, with its
    # HasAns/NoAns split in metrics.json and the report; an epoch's record keeps the declared figures
    cfg.version_2, cfg.training = True, fast(epochs=1, max_steps=1)
    final = finetune_qa(cfg, log=lambda s: None)
    written = json.loads((tmp_path / "o" / "dev_predictions.json").read_text())
    answers = {qa["id"]: [a["text"] for a in qa["answers"]] for p in data["data"][0]["paragraphs"] for qa in p["qas"]}
    want = official_v2(answers, written)
    assert final["dev"] == pytest.approx({"exact_match": want["exact"], "f1": want["f1"],
                                          **{k: v for k, v in want.items() if "Ans" in k}})
    assert final["dev"]["HasAns_total"] == 2 and final["dev"]["NoAns_total"] == 1
    assert {"HasAns_f1", "NoAns_f1"}.isdisjoint(final["epochs"][0]) and "f1" in final["epochs"][0]
    assert "HasAns (2 questions): exact match" in qa_report(final) and "NoAns (1 question)" in qa_report(final)


@pytest.mark.parametrize("length,query,stride", [(384, 64, 128), (256, 64, 128), (200, 50, 100), (128, 32, 64)])
def test_the_fitted_question_share_and_overlap_are_said(length, query, stride):
    """`finetune qa --max-length 128` trained with 32 question tokens and an overlap of 64, not the 64 and 128
    the help gives as defaults, without a word (NER says its fitted stride in a line). Now each value fitted
    below its default is said in NER's form; at a length where both are the defaults, nothing is said."""
    from bertkit.tasks.run import settle

    said = []
    cfg = settle(QAConfig(train="t", output="o", **{**dict.fromkeys(QAConfig.FITTED), "max_length": length}),
                 log=said.append)
    assert (cfg.max_query_length, cfg.doc_stride) == (query, stride)
    parts = ([f"max query length {query}: a quarter of max length {length}, fewer than the default 64 "
              "(--max-query-length sets another)"] if query != 64 else []) + \
            ([f"stride {stride}: half of max length {length}, fewer than the default 128 (--stride sets another)"]
             if stride != 128 else [])
    assert said == (["; ".join(parts)] if parts else []), said
    said.clear()  # a value typed is not said
    settle(QAConfig(train="t", output="o", max_length=length, max_query_length=16, doc_stride=8), log=said.append)
    assert said == []


def test_max_query_length_zero_is_one_line_before_anything_loads(tmp_path, capsys):
    # --max-query-length 0 cut every question away: the run trained on contexts alone, exit 0
    from bertkit.cli import main

    p = squad_file(tmp_path / "s.json", 2, random.Random(0))
    assert main(["finetune", "qa", "--train", str(p), "-o", str(tmp_path / "o"), "--model", str(tmp_path / "none"),
                 "--max-query-length", "0"]) == 2
    assert capsys.readouterr().err == "bertkit: error: --max-query-length must be >= 1, got 0 (BERT uses 64)\n"
    assert not (tmp_path / "o").exists()
