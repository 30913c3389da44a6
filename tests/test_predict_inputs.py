"""What a practitioner sends to a fine-tuned model: `bertkit.predict`, `bertkit predict` and the inputs that are
not plain sentences (empty cells, texts without a word piece, a pair missing a side, a Hugging Face head
checkpoint with few positions).

The models are untrained heads on the handmade-vocabulary tiny model of test_finetune, saved the way
`bertkit finetune` saves its output (test_serve's `task_dir`): nothing is trained, so each test takes well
under a second. The references are independent: the server's and `bertkit.embed`'s refusal of a text without
tokens, the file's own rows, and transformers' BertForQuestionAnswering over the windows transformers'
tokenizer cuts.
"""

import json
import re
import shutil
import warnings

import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.errors import BertkitError
from test_finetune import tiny_model_dir
from test_serve import task_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict-inputs")
    tiny = tiny_model_dir(root / "tiny")
    return {
        "tiny": tiny,
        "classify": task_dir(root / "classify", tiny, "BertForSequenceClassification",
                             {"task": "classify", "max_length": 32, "text_column": "sentence"}, ["neg", "pos"]),
        "pair": task_dir(root / "pair", tiny, "BertForSequenceClassification",
                         {"task": "pair", "max_length": 32, "text_column": "sentence1",
                          "text_pair_column": "sentence2"}, ["no", "yes"]),
        "ner": task_dir(root / "ner", tiny, "BertForTokenClassification",
                        {"task": "ner", "max_length": 16, "stride": 4, "tag_scheme": "iob2"}, ["O", "B-PER", "I-PER"]),
        "qa": task_dir(root / "qa", tiny, "BertForQuestionAnswering",
                       {"task": "qa", "max_length": 24, "doc_stride": 8, "max_query_length": 8,
                        "max_answer_length": 6}),
    }


# --- inputs without a word piece ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\u200b", "\x00"])
def test_an_input_without_tokens_is_refused_naming_it(models, text):
    """An empty text, spaces, or only characters BERT drops has no word piece: the model would read [CLS] [SEP]
    and give a label, a score, an answer like any other (it did: {'label': 'neg', 'probabilities': ...}). The
    server's /predict refuses such an input naming it (test_serve), and bertkit.embed refuses it; so does predict."""
    from bertkit.text.tokenizer import Tokenizer

    assert Tokenizer.from_pretrained(models["tiny"]).ids_lists([text]) == [[]]  # the premise
    for model, texts, pairs, name in [
        ("classify", ["the movie was good .", text], None, "texts[1]"),
        ("pair", ["the movie was good .", text], ["it was bad", "fine"], "texts[1]"),
        ("pair", ["the movie was good .", "fine"], ["it was bad", text], "pairs[1]"),
        ("ner", [text, "john went to paris"], None, "texts[0]"),
        ("qa", ["who went ?", text], ["john went to paris .", "mary went ."], "texts[1]"),
        ("qa", ["who went ?"], [text], "pairs[0]"),
    ]:
        with pytest.raises(BertkitError, match=rf"^{name.replace('[', '.')} .* yields no tokens"):
            bertkit.predict(models[model], texts, pairs)
    # a text with a word piece beside them is predicted as before: a text's words are BERT's, where what it drops is
    # no word; a list's words are as given, and one without a piece is tagged O
    got = bertkit.predict(models["ner"], [f"{text} john went"])[0]
    assert got["words"] == ["john", "went"] and len(got["tags"]) == 2
    words = [w for w in (text, "john", "went") if w.strip()]
    got = bertkit.predict(models["ner"], [words])[0]
    assert got["words"] == words and len(got["tags"]) == len(words) and got["tags"][:len(words) - 2] in ([], ["O"])


def test_a_file_skips_empty_cells_as_evaluate_mode_does_and_refuses_a_text_without_tokens(models, tmp_path, capsys):
    """`bertkit predict` on a table: a row whose text or second text is empty (a blank cell, JSON null) is skipped
    and counted, as the labelled reader (evaluate mode, fine-tuning) skips it. It was predicted: a pair with an
    empty second text got a label, JSON null was read as the text 'None', and the count said '0 examples'. A text
    that is not empty but has no word piece is refused in one line naming the file and the input."""
    rows = [("the movie was good .", "it was bad"), ("the food was great .", ""), ("", "fine"),
            ("this day was fine .", None), ("paris in the day", "mary went")]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n" for a, b in rows), encoding="utf-8")
    out = tmp_path / "p.tsv"
    assert main(["predict", str(models["pair"]), str(src), "-o", str(out), "--no-evaluate"]) == 0
    said = capsys.readouterr().out
    written = [line.split("\t")[:2] for line in out.read_text(encoding="utf-8").splitlines()[1:]]
    assert written == [[a, b] for a, b in rows if a and b]
    assert f"{src}: 2 examples, skipped 3 (3 empty texts)" in said and "wrote 2 predictions" in said
    # the same rows as a TSV (a row's second cell left empty) read the same
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("sentence1\tsentence2\n" + "".join(f"{a}\t{b or ''}\n" for a, b in rows), encoding="utf-8")
    assert main(["predict", str(models["pair"]), str(tsv), "-o", str(out)]) == 0
    assert [line.split("\t")[:2] for line in out.read_text(encoding="utf-8").splitlines()[1:]] == written
    capsys.readouterr()
    # a text of characters BERT drops: one line naming the file and which input, exit 2
    (tmp_path / "odd.txt").write_text("the movie was good .\n\u200b\nit was bad\n", encoding="utf-8")
    assert main(["predict", str(models["classify"]), str(tmp_path / "odd.txt"), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: ") and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'odd.txt'}: input 2 '\\u200b' yields no tokens" in err


def test_a_squad_file_is_parsed_once_with_its_ids_and_its_skipped_questions_said_once(models, tmp_path, capsys,
                                                                                      monkeypatch):
    """`bertkit predict` on SQuAD JSON parsed the file two or three times: evaluate mode's reader, then (no answers
    in it) the inputs' reader, then once more for the ids column; a file without answers printed its count of
    skipped questions twice. One reading now gives the questions, their answers and their ids."""
    import bertkit.tasks.qa_inference as qa

    parsed, read_squad = [], qa.read_squad
    monkeypatch.setattr(qa, "read_squad", lambda *a, **k: parsed.append(a) or read_squad(*a, **k))
    qas = [{"id": "q1", "question": "who went ?"}, {"id": "q2", "question": " "}, {"id": "q3", "question": "where ?"}]
    data = {"data": [{"title": "t", "paragraphs": [{"context": "john went to paris .", "qas": qas}]}]}
    for answered in (False, True):
        if answered:  # evaluate mode: two answered questions, the skipped one among them (scored 0)
            qas[0]["answers"] = qas[1]["answers"] = [{"text": "paris", "answer_start": 13}]
        (tmp_path / "q.json").write_text(json.dumps(data))
        parsed.clear()
        assert main(["predict", str(models["qa"]), str(tmp_path / "q.json"), "-o", str(tmp_path / "p.tsv")]) == 0
        said = capsys.readouterr().out
        assert len(parsed) == 1 and said.count("skipped 1 (1 questions with an empty question or context)") == 1, said
        header, *rows = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()]
        assert header[-1] == "id" and [(r[0], r[-1]) for r in rows] == [("who went ?", "q1"), ("where ?", "q3")]
        assert ("2 in all" in said and "exact_match" in said) == answered  # q1 scored, q2 scored 0


def test_a_conll_file_of_document_markers_alone_is_one_line(models, tmp_path, capsys):
    """A CoNLL file holding -DOCSTART- lines and no sentence (an export cut short, a split left empty): predict of
    a NER model stopped on an IndexError traceback (conll_has_tags read the first token line of none). It is one
    line naming the file, as an empty file is."""
    for text in ("-DOCSTART- -X- -X- O\n\n", "-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n"):
        (tmp_path / "docs.txt").write_text(text, encoding="utf-8")
        assert main(["predict", str(models["ner"]), str(tmp_path / "docs.txt"), "-o", "-", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bertkit: error: {tmp_path / 'docs.txt'}: no sentences") and err.count("\n") == 1, err


def test_a_ner_model_reads_a_tables_text_column_as_the_help_says(models, tmp_path, capsys):
    """`bertkit predict --help`: the text column is by default the one the model was trained on, else 'sentence',
    else 'text', else the file's one column of text; the text tasks read so. A NER model (trained on CoNLL files,
    it records no column) read 'sentence' alone, and refused a table of 'id' and 'text' columns. It now takes the
    same rule, saying which column it read; the predictions are bertkit.predict's of those texts."""
    texts = ["john went to paris.", "mary saw london in the day"]  # details: the words the tags belong to
    src = tmp_path / "in.tsv"
    src.write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    out = tmp_path / "p.tsv"
    assert main(["predict", str(models["ner"]), str(src), "-o", str(out), "--quiet"]) == 0
    assert f"{src}: reading the texts from column 'text'" in capsys.readouterr().out
    header, *lines = out.read_text(encoding="utf-8").splitlines()
    rows = [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]  # the table's columns, then the tags
    assert header.split("\t") == ["id", "text", "prediction", "details"]
    assert [(r["id"], r["text"], r["prediction"].split(), json.loads(r["details"])) for r in rows] == [
        (str(i), t, p["tags"], p["words"]) for i, (t, p) in enumerate(zip(texts, bertkit.predict(models["ner"], texts)))]


def test_a_conll_file_whose_last_column_is_no_tags_names_the_line_and_no_evaluate(models, tmp_path, capsys):
    """A CoNLL file of words and part-of-speech tags (no NER column) looks labelled: evaluate mode read its last
    column as the gold tags and stopped on "tag 'NNP' is not O or B-/I-/E-/S-TYPE", naming neither the file, nor
    the line, nor a way on (predict has no --tag-column). It names them now, and --no-evaluate predicts the file."""
    src = tmp_path / "pos.txt"
    src.write_text("EU NNP\nrejects VBZ\n\nPeter NNP\nBlackburn NNP\n", encoding="utf-8")
    assert main(["predict", str(models["ner"]), str(src), "-o", "-", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertkit: error: {src}:1: tag 'NNP' is not") and "--no-evaluate" in err, err
    assert err.count("\n") == 1
    assert main(["predict", str(models["ner"]), str(src), "-o", str(tmp_path / "p.tsv"), "--quiet", "--no-evaluate"]) == 0
    assert (tmp_path / "p.tsv").read_text(encoding="utf-8").splitlines()[1].startswith("EU rejects\t")


# --- texts longer than the model reads ------------------------------------------------------------------------


def test_predict_says_how_many_inputs_the_model_read_cut_at_its_max_length(models, tmp_path, capsys):
    """A classifier fine-tuned without --stride reads the first max_length tokens of a text and nothing else, as
    transformers' pipeline with truncation does; `bertkit predict` classified 4000-word chapters from their first
    sentences and said nothing. It says once how many inputs were cut. Reference: each input's whole encoding
    (no truncation) against the model's max_length of 32; an input of exactly 32 tokens is not cut. A model
    trained with --stride reads a long text whole, in windows: nothing is said."""
    tok = bertkit.Tokenizer.from_pretrained(models["tiny"] / "vocab.txt")
    texts = ["the movie was good .", " ".join(["good"] * 30), " ".join(["good"] * 31), "the food was bad . " * 60]
    lengths = [len(tok.encode(t, truncation=False)) for t in texts]
    assert lengths[1] == 32 and lengths[2] == 33  # the edge: 32 fits, 33 is cut
    cut = sum(n > 32 for n in lengths)
    src = tmp_path / "long.txt"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    assert main(["predict", str(models["classify"]), str(src), "-o", str(tmp_path / "p.tsv"), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert f"{src}: {cut} of 4 inputs are longer than the model's max_length of 32 tokens" in said, said
    assert said.count("longer than") == 1 and "--stride 8" in said
    # with a stride: windows, nothing cut
    info = json.loads((models["classify"] / "bertkit_task.json").read_text())
    windowed = tmp_path / "windowed"
    shutil.copytree(models["classify"], windowed)
    (windowed / "bertkit_task.json").write_text(json.dumps({**info, "stride": 8}))
    assert main(["predict", str(windowed), str(src), "-o", str(tmp_path / "w.tsv"), "--quiet"]) == 0
    assert "longer than" not in capsys.readouterr().out
    # pairs are never windowed: a pair longer than 32 tokens with [CLS] and two [SEP]s is counted
    pairs = tmp_path / "pairs.tsv"
    rows = [("the movie was good .", "it was"), (" ".join(["good"] * 15), " ".join(["bad"] * 14)),
            (" ".join(["good"] * 15), " ".join(["bad"] * 15))]
    pairs.write_text("sentence1\tsentence2\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
    cut = sum(len(tok.encode(a, b, truncation=False)) > 32 for a, b in rows)
    assert cut == 1
    assert main(["predict", str(models["pair"]), str(pairs), "-o", str(tmp_path / "q.tsv"), "--quiet"]) == 0
    assert f"{pairs}: 1 of 3 inputs are longer than the model's max_length of 32 tokens" in capsys.readouterr().out


def test_predict_tells_on_cut_the_inputs_it_encoded_cut(models, tmp_path, transformers_mod):
    """predict(on_cut=) tells how many inputs the model read cut at its max_length, from the pass that encodes them
    (what a reranker's count of its pairs reads): single texts through the ids-only batch (one piece past the cut),
    pairs through their encodings. Reference: BertTokenizerFast's uncut lengths against max_length 32, at the edge
    (32 fits, 33 is cut). A model trained with --stride reads a long text whole: 0. NER and QA refuse on_cut."""
    fast = transformers_mod.BertTokenizerFast(str(models["tiny"] / "vocab.txt"))
    texts = ["the movie was good .", " ".join(["good"] * 30), " ".join(["good"] * 31), "the food was bad . " * 60]
    pairs = ["it was", " ".join(["bad"] * 14), " ".join(["bad"] * 15), "fine"]
    firsts = ["the movie was good .", " ".join(["good"] * 15), " ".join(["good"] * 15), "the food was bad . " * 60]
    lengths = [len(fast(t)["input_ids"]) for t in texts]
    pair_lengths = [len(fast(a, b)["input_ids"]) for a, b in zip(firsts, pairs)]
    assert lengths[1:3] == [32, 33] and pair_lengths[1:3] == [32, 33]
    told = []
    bertkit.predict(models["classify"], texts, on_cut=lambda *n: told.append(n))
    bertkit.predict(models["pair"], firsts, pairs, on_cut=lambda *n: told.append(n))
    assert told == [(sum(n > 32 for n in lengths), 4), (sum(n > 32 for n in pair_lengths), 4)]
    info = json.loads((models["classify"] / "bertkit_task.json").read_text())
    windowed = shutil.copytree(models["classify"], tmp_path / "windowed")
    (windowed / "bertkit_task.json").write_text(json.dumps({**info, "stride": 8}))
    bertkit.predict(windowed, texts, on_cut=lambda *n: told.append(n))
    assert told[-1] == (0, 4)
    for task, second in (("ner", None), ("qa", ["john went to paris ."])):
        with pytest.raises(BertkitError, match=f"this is a {task} model: leave on_cut out"):
            bertkit.predict(models[task], ["who went ?"], second, on_cut=told.append)


# --- a Hugging Face QA checkpoint with fewer positions than run_squad.py's 384 --------------------------------


def squad_windows_answer(model, tok, question: str, context: str, max_length: int, query: int, stride: int,
                         longest: int) -> tuple[int, int]:
    """The best span of transformers' model over the windows transformers' tokenizer cuts (the question cut at
    `query` pieces, windows sharing `stride` context tokens), every start tried in the window where it has the
    most context (run_squad.py's rule), every end at most `longest` pieces on: (start, end) in characters."""
    question = tok.decode(tok(question, add_special_tokens=False)["input_ids"][:query])
    enc = tok(question, context, truncation="only_second", max_length=max_length, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length", return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    token_type_ids=enc["token_type_ids"])
    starts, ends, offsets = out.start_logits.tolist(), out.end_logits.tolist(), enc["offset_mapping"].tolist()
    windows = [[i for i, s in enumerate(enc.sequence_ids(k)) if s == 1] for k in range(len(enc["input_ids"]))]
    first = [0]
    for w in windows[:-1]:
        first.append(first[-1] + len(w) - stride)

    def owner(p):  # the window where context token p has the most context
        held = [(min(p - first[k], first[k] + len(w) - 1 - p) + 0.01 * len(w), -k)
                for k, w in enumerate(windows) if first[k] <= p < first[k] + len(w)]
        return -max(held)[1]

    best = None
    for k, w in enumerate(windows):
        for a in range(len(w)):
            if owner(first[k] + a) != k:
                continue
            for b in range(a, min(len(w), a + longest)):
                score = starts[k][w[a]] + ends[k][w[b]]
                if best is None or score > best[0]:
                    best = (score, offsets[k][w[a]][0], offsets[k][w[b]][1])
    return best[1], best[2]


def test_a_hugging_face_qa_checkpoint_with_64_positions_reads_its_contexts_in_windows_that_fit(models, transformers_mod):
    """A QA checkpoint without bertkit_task.json is read as run_squad.py reads one (384 tokens, questions cut at 64
    pieces, windows sharing 128), at most at the model's own positions; at 64 positions (a tiny model; at 128, a
    long question) predict failed on every input with "stride=128 must be smaller than the 56 tokens of a
    window", which no option of predict could change, and the server with it at start-up. The question and the
    overlap now follow the length: a quarter of it, at most 64; half of it, at most 128 (transformers' QA pipeline's
    doc_stride)."""
    import shutil

    folder = models["qa"].parent / "qa-hf"
    shutil.copytree(models["qa"], folder)
    (folder / "bertkit_task.json").unlink()  # as transformers saves it
    model = transformers_mod.BertForQuestionAnswering.from_pretrained(str(folder)).eval()
    tok = transformers_mod.BertTokenizerFast.from_pretrained(str(folder))
    words = "john went to paris and then mary saw london in the day while the movie was new".split()
    contexts = [" ".join(words[(3 * i + j) % len(words)] for j in range(n)) + " ." for i, n in enumerate((6, 40, 90))]
    questions = ["who went to paris ?", "where did mary go in the day and what was new and old ?", "what was new ?"]
    got = bertkit.predict(folder, questions, contexts)
    assert len(tok(contexts[2])["input_ids"]) > 64  # the longest context is longer than the model reads at once
    for q, c, p in zip(questions, contexts, got):  # 64 positions: questions cut at 16, windows sharing 32
        assert (p["start"], p["end"]) == squad_windows_answer(model, tok, q, c, 64, 16, 32, 30)
        assert p["answer"] == c[p["start"]:p["end"]] != ""


def test_a_hugging_face_qa_checkpoint_is_read_as_squad_v1_unless_asked_and_predict_says_how(models, tmp_path,
                                                                                              capsys):
    """A BertForQuestionAnswering folder saved by transformers holds no bertkit_task.json, and nothing in it says
    whether it was trained on SQuAD v2: predict read it as v1 (every question answered, v1 scoring) without a
    word, a v2 model's "no answer" never given. It says so now and names the option; --version-2-with-negative
    (version_2=True) reads it as the same weights in a bertkit folder trained with that flag are read, and
    without it as a v1 folder. Refused for a model that is no QA model, and for a bertkit QA folder whose task
    file says otherwise."""
    import shutil

    hf = shutil.copytree(models["qa"], tmp_path / "hf")
    (hf / "bertkit_task.json").unlink()  # as transformers saves it
    v2 = shutil.copytree(models["qa"], tmp_path / "v2")  # how bertkit reads hf (64 positions), trained as v2
    (v2 / "bertkit_task.json").write_text(json.dumps({"task": "qa", "max_length": 64, "max_query_length": 16,
                                                      "doc_stride": 32, "version_2": True}))
    v1 = shutil.copytree(v2, tmp_path / "v1")
    (v1 / "bertkit_task.json").write_text(json.dumps({"task": "qa", "max_length": 64, "max_query_length": 16,
                                                      "doc_stride": 32}))
    questions, contexts = ["who went to paris ?", "what was new ?"], ["john went to paris .", "the movie was new ."]
    assert bertkit.predict(hf, questions, contexts, version_2=True) == bertkit.predict(v2, questions, contexts)
    assert bertkit.predict(hf, questions, contexts) == bertkit.predict(v1, questions, contexts)  # unasked: v1
    squad = tmp_path / "v2.json"
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": contexts[0], "qas": [
        {"id": "1", "question": questions[0], "answers": [{"text": "john", "answer_start": 0}]},
        {"id": "2", "question": "who went to london ?", "answers": [], "is_impossible": True}]}]}]}))
    for folder, flags in ((hf, []), (hf, ["--version-2-with-negative"]), (v2, []), (v1, [])):
        out = tmp_path / f"{folder.name}{len(flags)}.tsv"
        assert main(["predict", str(folder), str(squad), "-o", str(out), "--quiet", *flags]) == 0
        printed = capsys.readouterr().out
        said = f"{hf}: a Hugging Face QA checkpoint says nothing of SQuAD v2, so every question gets an answer (v1)"
        assert (said in printed and "pass --version-2-with-negative" in printed) == (folder == hf and not flags)
        assert "NoAns_total" in printed  # a file with an unanswerable question is scored by v2's rules (6688e63)
    assert (tmp_path / "hf1.tsv").read_text() == (tmp_path / "v20.tsv").read_text()
    assert (tmp_path / "hf0.tsv").read_text() == (tmp_path / "v10.tsv").read_text()
    for folder, says in ((models["classify"], "is for a question-answering model"),
                         (models["qa"], "was trained without --version-2-with-negative")):
        assert main(["predict", str(folder), str(squad), "--version-2-with-negative", "-o", "-"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_a_jsonl_column_of_pre_split_words_is_read_as_those_words(models, tmp_path, capsys):
    """Hugging Face's conll2003 saved with to_json holds each sentence as a list of words ("tokens"). predict
    read that cell as Python wrote the list, "['EU', 'rejects', ...]", and tagged the words "['EU'," and
    "'rejects',": one tag per word, but of other words. A list of strings is now the sentence's words, joined
    with spaces as bertkit.predict's own error asks for pre-split words; an object or a nested list is refused
    naming the line and the column."""
    sentences = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"], ["john", "went", "to", "paris", "."],
                 ["U.S.-based", "john", "(paris)"]]
    src = tmp_path / "conll.jsonl"
    src.write_text("".join(json.dumps({"id": i, "tokens": s, "ner_tags": [0] * len(s)}) + "\n"
                           for i, s in enumerate(sentences)), encoding="utf-8")
    out = tmp_path / "p.tsv"
    assert main(["predict", str(models["ner"]), str(src), "-o", str(out), "--text-column", "tokens", "--quiet"]) == 0
    header, *lines = out.read_text(encoding="utf-8").splitlines()
    rows = [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]
    expected = bertkit.predict(models["ner"], sentences)  # a list's words as given, one tag each
    assert [p["words"] for p in expected] == sentences
    assert [json.loads(r["tokens"]) for r in rows] == sentences  # the row's cells as they were: the list as JSON
    assert [r["prediction"].split() for r in rows] == [p["tags"] for p in expected]
    src.write_text(json.dumps({"tokens": ["EU"]}) + "\n" + json.dumps({"tokens": {"EU": 1}}) + "\n", encoding="utf-8")
    assert main(["predict", str(models["ner"]), str(src), "-o", str(out), "--text-column", "tokens", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: column 'tokens' holds" in err and len(err.strip().splitlines()) == 1


def test_a_list_of_words_is_a_ner_models_and_refused_by_another_model(models):
    """A NER model tags a text given as its words (a list of str) as given; a text model reads no words: refused
    naming the input and the way on, as a list was before NER took one."""
    with pytest.raises(BertkitError, match=r"^texts\[1\] is a list of words, which a classify model does not read: "
                       "join them with spaces"):
        bertkit.predict(models["classify"], ["the movie", ["the", "movie"]])
    assert bertkit.predict(models["ner"], [["U.S.", "paris"]])[0]["words"] == ["U.S.", "paris"]


def test_a_model_whose_labels_share_a_name_is_refused_naming_them(models, tmp_path):
    """config.json's id2label naming one label twice (a hand-edited or badly converted checkpoint): predict gave
    {'label': 'pos', 'label_id': 0, 'probabilities': {'pos': 0.495}}, the second label's probability under the
    first's name and the first's lost, and evaluate mode scored a correct 'pos' as wrong (label2id keeps one id).
    Now refused before anything runs, naming the label and its ids."""
    import shutil

    folder = tmp_path / "twice"
    shutil.copytree(models["classify"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(id2label={"0": "pos", "1": "pos"}, label2id={"pos": 1})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"names 'pos' for labels 0 and 1"):
        bertkit.predict(folder, ["the movie was good ."])
    assert len(bertkit.predict(models["classify"], ["the movie was good ."])[0]["probabilities"]) == 2


@pytest.mark.parametrize("changes", [{"num_labels": 3}, {"num_labels": 1},
                                     {"num_labels": 2, "id2label": {"0": "neg", "1": "pos", "2": "mixed"}},
                                     {"num_labels": 3, "id2label": None, "label2id": {"neg": 0, "pos": 1}}])
def test_a_config_whose_num_labels_and_label_names_disagree_is_refused_naming_both(models, tmp_path, capsys, changes):
    """config.json's num_labels and id2label (or label2id) counting different labels (a hand edit: a label name
    added, num_labels changed): bertkit took id2label's count, so num_labels 3 beside two names and two outputs
    predicted two labels silently, and a name added to id2label stopped at the weights' shapes with "Pass
    strict=False"; transformers reads the same file by num_labels (5.x: names LABEL_0.., or a size mismatch), 4.x
    by id2label. Which outputs the labels are is not known, so it is one line naming the file and both fields."""
    import shutil

    folder = tmp_path / "disagree"
    shutil.copytree(models["classify"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    names = "id2label" if changes.get("id2label", 0) is not None else "label2id"
    says = f"config.json: num_labels is {changes['num_labels']} but its {names} names"
    with pytest.raises(BertkitError, match=says):
        bertkit.predict(folder, ["the movie was good ."])
    (tmp_path / "in.txt").write_text("the movie was good .\n")
    assert main(["predict", str(folder), str(tmp_path / "in.txt"), "-o", "-", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder / "config.json") in err and says in err


def test_a_hugging_face_token_classifier_with_few_positions_is_read_in_windows_that_fit(tmp_path):
    """A transformers BertForTokenClassification folder keeps no bertkit_task.json: predict read it at its positions
    (32 here) with NER's overlap of 32, which leaves its windows no room, and refused every input with 'stride=32
    must be smaller than the 30 tokens of a window ... lower the stride', a flag predict does not have. It now reads
    it as a run with that length fits its overlap (NerConfig.fit: a quarter, 8), as the same weights in a bertkit
    folder that says so are read (the reference)."""
    import shutil

    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForTokenClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=32, id2label=dict(enumerate(["O", "B-PER", "I-PER"])))
    hf = tmp_path / "hf"
    BertForTokenClassification(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        hf, tokenizer=Tokenizer.from_pretrained())
    ours = shutil.copytree(hf, tmp_path / "ours")
    (ours / "bertkit_task.json").write_text(json.dumps({"task": "ner", "max_length": 32, "stride": 8}))
    texts = [" ".join(["john went to paris with mary"] * 9), "mary stayed"]  # 54 words: several windows
    got = bertkit.predict(hf, texts)
    assert got == bertkit.predict(ours, texts) and len(got[0]["tags"]) == 54


# --- a Hugging Face token classifier whose labels have no B-/I- prefix ----------------------------------------


@pytest.mark.oracle
@pytest.mark.parametrize("labels", [["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], ["O", "PER", "LOC"]])
def test_served_entities_equal_the_transformers_pipeline_for_bio_and_io_labels(tmp_path, transformers_mod, labels):
    """Many token classifiers on the Hub tag in the IO scheme (`PER`, `LOC`, no B-/I- prefix; a checkpoint saved
    without names has `LABEL_1`). `bertkit predict` tagged their words, but the server's entities (conlleval's
    chunks of the tags) raised on the first bare label: every /predict of such a model answered 500 "internal
    error: tag 'LOC' is not O or B-/I-/E-/S-TYPE", and evaluate mode blamed the file's tags. A bare label is now
    read as transformers' token-classification pipeline reads it, I-LABEL (a run of one type is one entity). The
    oracle: that pipeline (aggregation "first": a word's tag is its first piece's) over the same weights, its
    entity groups and character offsets, on texts of accents, emoji, runs of spaces and tabs, long words, and
    Chinese without spaces (each ideograph a word, as BERT's BasicTokenizer splits it)."""
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForTokenClassification
    from bertkit.serve.runner import with_entities
    from bertkit.tasks.predict import predict_file
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, id2label=dict(enumerate(labels)))
    model = BertForTokenClassification(config, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.classifier.weight.mul_(40)  # a random head of 0.02 tags every word alike: varied tags, entities of each length
    model.save_pretrained(tmp_path / "hf", tokenizer=Tokenizer.from_pretrained())
    texts = ["Angela Merkel met Emmanuel Macron in Paris on Tuesday", "José  Mourinho\tleft Real Madrid for Chelsea",
             "naïve résumé of Ǆemal in İstanbul and São Paulo", "emoji 😀 Bob 👍🏽 Alice went to Zürich today",
             "antidisestablishmentarianism Krzysztofowicz Wojciechowski Szczepański",
             # no spaces: each CJK ideograph is a word, as the pipeline's tokenizer splits it (the whole sentence
             # was one word, one tag); kana are no ideographs and stay one word, as there
             "默克尔在巴黎会见了马克龙", "Merkel在Paris见了 Macron和東京タワー"]
    pipe = transformers_mod.pipeline(
        "token-classification", model=transformers_mod.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf"),
        tokenizer=transformers_mod.BertTokenizerFast.from_pretrained(tmp_path / "hf"), aggregation_strategy="first")
    served = [with_entities(t, p)["entities"] for t, p in zip(texts, bertkit.predict(tmp_path / "hf", texts))]
    theirs = [[(e["entity_group"], e["start"], e["end"]) for e in pipe(t)] for t in texts]
    assert [[(e["type"], e["start"], e["end"]) for e in ents] for ents in served] == theirs
    assert sum(map(len, theirs)) >= 5 and any(e[2] - e[1] > 12 for ents in theirs for e in ents)  # several, multi-word
    # evaluate mode scores them: entity F1 of the pipeline's entities against the file's, counted by hand
    entities = [[(0, 2, "PER"), (3, 5, "PER"), (6, 7, "LOC")], [(0, 2, "PER"), (3, 5, "ORG"), (6, 7, "ORG")]]
    sentences = [" ".join(t.split()) for t in texts[:2]]  # a CoNLL file's words, read joined by one space
    lines = []
    for sentence, ents in zip(sentences, entities):
        tags = ["O"] * len(sentence.split())
        for a, b, typ in ents:
            tags[a:b] = [f"B-{typ}"] + [f"I-{typ}"] * (b - a - 1)
        lines += [f"{w} {t}" for w, t in zip(sentence.split(), tags)] + [""]
    (tmp_path / "gold.txt").write_text("\n".join(lines), encoding="utf-8")
    words = [[m.span() for m in re.finditer(r"\S+", s)] for s in sentences]
    want = {(i, typ, words[i][a][0], words[i][b - 1][1]) for i, ents in enumerate(entities) for a, b, typ in ents}
    got = {(i, e["entity_group"], e["start"], e["end"]) for i, s in enumerate(sentences) for e in pipe(s)}
    scores = predict_file(tmp_path / "hf", tmp_path / "gold.txt", tmp_path / "p.tsv", log=lambda s: None).metrics
    assert scores["f1"] == pytest.approx(2 * len(got & want) / (len(got) + len(want)))


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl", ".json"])
def test_a_tables_columns_are_written_back_as_they_were_with_the_predictions_after_them(models, tmp_path, capsys,
                                                                                         suffix):
    """`bertkit predict MODEL in.tsv` wrote 'text, prediction, details': the text column renamed 'text' (its own name,
    'sentence', gone) and every other column (an id, the label, a score) left out, so a prediction could not be
    joined back to its row. Each predicted row now keeps its columns as they were, names and cells, in every table
    format, and the two columns predict adds come after them; an input column named like one of them ('prediction')
    stays, the added one is 'prediction.1', said in one line. The references: the file's own rows, read by the
    csv module or json, and bertkit.predict of their texts."""
    import csv

    header = ["id", "sentence", "label", "score", "prediction"]
    rows = [["1", "the movie was good .", "pos", "0.9", "maybe"], ["2", "", "neg", "0.1", ""],  # an empty text
            ["3", "it was bad , \"really\"", "neg", "0.25", "no"], ["4", "this day was fine .", "", "1", "yes"]]
    src = tmp_path / f"in{suffix}"
    if suffix in (".jsonl", ".json"):
        objects = [dict(zip(header, [int(r[0]), r[1], r[2] or None, float(r[3]), r[4]])) for r in rows]
        src.write_text("".join(json.dumps(o) + "\n" for o in objects), encoding="utf-8")
        given = [[str(o["id"]), o["sentence"], o["label"] or "", json.dumps(o["score"]), o["prediction"]]
                 for o in objects]
    else:
        with open(src, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t" if suffix == ".tsv" else ",", quoting=csv.QUOTE_MINIMAL if
                                suffix == ".csv" else csv.QUOTE_NONE, escapechar=None, quotechar='"' if
                                suffix == ".csv" else "\x00")
            writer.writerows([header, *rows])
        with open(src, newline="", encoding="utf-8") as f:
            given = list(csv.reader(f, delimiter="\t" if suffix == ".tsv" else ",",
                                    quoting=csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL))[1:]
    out = tmp_path / "p.tsv"
    assert main(["predict", str(models["classify"]), str(src), "-o", str(out), "--no-evaluate", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert f"{src}: its column 'prediction' is written back as it was; the model's prediction is in column " \
           "'prediction.1'" in said
    written = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert written[0] == [*header, "prediction.1", "details"]
    kept = [r for r in given if r[1]]  # the row without a text is skipped, as before
    assert [r[:5] for r in written[1:]] == kept
    expected = bertkit.predict(models["classify"], [r[1] for r in kept])
    assert [r[5] for r in written[1:]] == [p["label"] for p in expected]
    assert [r[6] for r in written[1:]] == [" ".join(f"{k}={v:.4f}" for k, v in p["probabilities"].items())
                                          for p in expected]


# --- the probabilities' cell ---------------------------------------------------------------------------------


def read_probabilities(cell: str) -> dict:
    """The details cell of a classifier's prediction as its format says to read it: a JSON object where a label
    name holds a space or '=', else 'name=p' pairs separated by spaces."""
    if cell.startswith("{"):
        return json.loads(cell)
    return {name: float(p) for name, p in (pair.rsplit("=", 1) for pair in cell.split(" "))}


@pytest.mark.parametrize("labels", [["neg", "pos"], ["pets, cats", "x y", "a=b", "plain"]])
def test_the_probabilities_cell_reads_back_as_the_labels_probabilities(models, tmp_path, labels):
    """predict's details column (and finetune's dev_predictions.tsv) wrote a classifier's probabilities as
    'name=p' pairs joined by spaces: labels 'x y' and 'a=b' wrote 'x y=0.5 a=b=0.5', which reads back as other
    labels. Where a name holds a space or '=', the cell is now a JSON object {name: p}; else the pairs as they
    were. Reference: bertkit.predict's probabilities, to the cell's 4 decimals; finetune's writer gives the same cell."""
    from bertkit.data.tables import TextExample
    from bertkit.model.config import MULTI_LABEL
    from bertkit.tasks.classification import prediction_lines

    kind = "multi_label" if len(labels) > 2 else "classify"
    model = task_dir(tmp_path / "m", models["tiny"], "BertForSequenceClassification",
                     {"task": kind, "max_length": 32, "text_column": "sentence"}, labels,
                     problem_type=MULTI_LABEL if kind == "multi_label" else None)
    texts = ["the movie was good .", "it was bad", "fine"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["predict", str(model), str(tmp_path / "in.txt"), "-o", str(tmp_path / "p.tsv")]) == 0
    header, *rows = [line.split("\t") for line in (tmp_path / "p.tsv").read_text().splitlines()]
    cells = [row[header.index("details")] for row in rows]
    want = [p["probabilities"] for p in bertkit.predict(model, texts)]
    for cell, probabilities in zip(cells, want, strict=True):
        got = read_probabilities(cell)
        assert list(got) == labels and got == pytest.approx(probabilities, abs=5e-5), cell
    examples = [TextExample(t, label=[labels[0]] if kind == "multi_label" else labels[0]) for t in texts]
    lines = list(prediction_lines(examples, bertkit.predict(model, texts), MULTI_LABEL if kind == "multi_label"
                                  else "single_label_classification", ",", labels))
    assert [line.rstrip("\n").split("\t")[-1] for line in lines[1:]] == cells


def test_a_table_whose_label_column_is_empty_is_read_once(models, tmp_path, monkeypatch, capsys):
    """A table with a label column left empty holds no answers: predict only predicts it. The labelled reader
    read every row, found no label, and the table was read again, whole, for its inputs. It is read once now
    (passes over its rows counted at `read_rows`), and predicted as before: every row, its columns written back,
    the column choice and the skipped row said once each, no scores."""
    import bertkit.data.tables as tables

    rows = [("1", "the movie was good ."), ("2", ""), ("3", "it was bad")]
    src = tmp_path / "t.tsv"
    src.write_text("id\treview\tlabel\n" + "".join(f"{i}\t{t}\t\n" for i, t in rows), encoding="utf-8")
    passes, read_rows = [], tables.read_rows

    def counted(path, report):
        passes.append(0)
        for row in read_rows(path, report):
            passes[-1] += 1
            yield row

    monkeypatch.setattr(tables, "read_rows", counted)
    hf = tmp_path / "hf"  # no text column recorded: the text column is found, and said
    shutil.copytree(models["classify"], hf)
    (hf / "bertkit_task.json").unlink()
    assert main(["predict", str(hf), str(src), "-o", str(tmp_path / "p.tsv")]) == 0
    said = capsys.readouterr().out
    assert passes.count(len(rows)) == 1, passes  # one whole pass (first_row's peeks read one row each)
    header, *written = [line.split("\t") for line in (tmp_path / "p.tsv").read_text(encoding="utf-8").splitlines()]
    assert header == ["id", "review", "label", "prediction", "details"]
    assert [w[:3] for w in written] == [[i, t, ""] for i, t in rows if t]
    assert said.count("reading the texts from column 'review'") == 1 and said.count("skipped 1 (1 empty texts)") == 1
    assert "accuracy" not in said, said


def test_a_file_of_one_text_per_line_is_read_whole_once(models, tmp_path, monkeypatch):
    """`bertkit predict MODEL mine.txt` (the README's way to classify one's own sentences): whether a .txt is a
    table was decided by reading the whole file for its first line, then the file was read again for its texts.
    The first line alone decides now (whole reads counted at `read_text`); the texts are predicted as before."""
    import bertkit.data.tables as tables

    texts = ["the movie was good .", "it was bad", "fine"]
    (tmp_path / "mine.txt").write_text("\n".join(texts) + "\n\n", encoding="utf-8")
    whole, read_text = [], tables.read_text
    monkeypatch.setattr(tables, "read_text", lambda path, *a: (whole.append(path), read_text(path, *a))[1])
    assert main(["predict", str(models["classify"]), str(tmp_path / "mine.txt"), "-o", str(tmp_path / "p.tsv")]) == 0
    assert len(whole) == 1, whole
    written = [line.split("\t") for line in (tmp_path / "p.tsv").read_text(encoding="utf-8").splitlines()]
    assert written[0][:2] == ["text", "prediction"]
    assert [(t, p) for t, p, _ in written[1:]] == [(t, p["label"]) for t, p in zip(texts, bertkit.predict(
        models["classify"], texts))]


@pytest.mark.parametrize("task, header, info", [
    ("classify", ("id", "sentence", "label"), {"text_column": "sentence"}),  # labelled: read_text_examples' cells
    ("classify", ("id", "sentence"), {"text_column": "sentence"}),  # no label column: read_inputs's rows
    ("ner", ("id", "sentence"), {}),
    ("qa", ("id", "question", "context"), {}),
])
def test_a_tables_rows_are_kept_only_for_the_caller_that_writes_them_back(tmp_path, task, header, info):
    """Every task's reader kept each row of a table as read ({column: cell}) for predict to write back, and held
    them for every other caller too (distill layers' task_features: 200,000 SST-2 rows held 83 MB where their
    inputs and labels take 48). The caller asks for them (keep_rows=True: predict); else rows is None and the
    inputs the same. Reference: the file's rows as csv.DictReader reads them."""
    import csv

    from bertkit.tasks.registry import TASKS

    cells = {"id": "7", "sentence": "the movie was good", "label": "pos", "question": "who", "context": "bob ran"}
    path = tmp_path / "t.tsv"
    path.write_text("".join("\t".join(row) + "\n" for row in [header, *(
        [f"{cells[c]}{i}" if c == "id" else cells[c] for c in header] for i in range(3))]), encoding="utf-8")
    quiet = {"every_input": True, "log": lambda *_: None}
    read = TASKS[task].read_labelled(path, info, **quiet)
    assert read.rows is None  # main: every row
    kept = TASKS[task].read_labelled(path, info, **quiet, keep_rows=True)
    with open(path, encoding="utf-8", newline="") as f:
        assert kept.rows == list(csv.DictReader(f, delimiter="\t"))
    labels = [lambda r: r._replace(rows=None, answers=r.answers and [a.label for a in r.answers])][0]
    assert labels(read) == labels(kept) and len(read.texts) == 3

