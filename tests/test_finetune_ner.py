"""NER fine-tuning: label alignment, windows, CoNLL reading, end to end.

Alignment is checked by hand on a handmade vocabulary and against the
run_ner.py recipe of transformers (labels on each word's first piece through
the fast tokenizer's word_ids) on real CoNLL-2003 sentences.
"""

import json
import random

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.data.tables import TaggedSentence, read_conll
from bertkit.tasks.ner import NerConfig, finetune_ner
from bertkit.tasks.ner_inference import decode, make_features, word_pieces
from bertkit.text.windows import best_span, spans
from bertkit.text.tokenizer import Tokenizer
from test_finetune import fast, tiny  # noqa: F401  (the tiny-model fixture)


@pytest.fixture(scope="module")
def tok(tiny):  # noqa: F811
    return Tokenizer.from_pretrained(tiny)


def test_word_pieces_map_to_conll_words(tok):
    wp = word_pieces(tok, ["john", "visited", "movies", "in", "paris", "."])
    assert tok.convert_ids_to_tokens(wp.ids) == ["john", "visited", "movie", "##s", "in", "paris", "."]
    assert wp.piece_word == [0, 1, 2, 2, 3, 4, 5]
    assert wp.first_piece == [0, 1, 2, 4, 5, 6]


def test_labels_on_first_piece_only(tok):
    sent = TaggedSentence(["mary", "likes", "movies", "."], ["B-PER", "O", "B-MISC", "O"])
    label2id = {"O": 0, "B-MISC": 1, "B-PER": 2}
    feats, _ = make_features(tok, [sent], label2id, max_length=16, stride=0)
    assert len(feats) == 1
    # [CLS] mary likes movie ##s . [SEP]
    assert feats[0]["labels"] == [-100, 2, 0, 1, -100, 0, -100]


def test_iob1_is_trained_as_iob2(tok):
    sent = TaggedSentence(["john", "mary", "paris"], ["I-PER", "B-PER", "I-LOC"])
    label2id = {"O": 0, "B-LOC": 1, "B-PER": 2, "I-PER": 3}
    feats, _ = make_features(tok, [sent], label2id, max_length=16, stride=0, scheme="iob1")
    assert feats[0]["labels"][1:4] == [2, 2, 1]  # every entity start gets B-


def test_spans_and_max_context_by_hand():
    assert spans(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert spans(3, 4, 1) == [(0, 3)]
    # position 3 is the last of window 0 (context 0 right) and first of window 1 (0 left): tie -> first
    w = spans(10, 4, 1)
    assert best_span(w, 3) == 0 and best_span(w, 4) == 1 and best_span(w, 5) == 1
    assert best_span(w, 6) == 1 and best_span(w, 7) == 2  # 6: 0 context in both windows, the first wins
    with pytest.raises(BertkitError, match="overlap"):
        spans(10, 4, 4)


def test_long_sentences_each_word_labelled_once_and_decoded_from_its_window(tok):
    words = ("john visited paris and mary visited london but it was slow " * 3).split()
    tags = ["B-PER" if w in ("john", "mary") else "B-LOC" if w in ("paris", "london") else "O" for w in words]
    label2id = {"O": 0, "B-LOC": 1, "B-PER": 2}
    feats, pieces = make_features(tok, [TaggedSentence(words, tags)], label2id, max_length=12, stride=3)
    windows = spans(len(pieces[0].ids), 10, 3)
    assert len(feats) == len(windows) > 2
    labelled = sum(sum(x != -100 for x in f["labels"]) for f in feats)
    assert labelled == len(words)  # every word trained exactly once
    # logits: window k predicts label k % 3 everywhere; a word's tag must come from its max-context window
    names = ["O", "B-LOC", "B-PER"]
    logits = [np.eye(3)[np.full(len(f["input_ids"]), f["window"] % 3)] for f in feats]
    pred, empty = decode(logits, feats, pieces, names, 12, 3)
    expect = [names[best_span(windows, p) % 3] for p in pieces[0].first_piece]
    assert pred[0] == expect and empty == 0


def test_conll_line_without_tag_is_an_error(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("-DOCSTART- -X- -X- O\n\nJohn NNP I-NP I-PER\nlives\nin IN I-PP O\n")
    with pytest.raises(BertkitError, match=r"bad.txt:4: 'lives' has 1 column"):
        read_conll(p)
    p.write_text("John NNP I-NP I-PER\nlives VBZ O\n")
    with pytest.raises(BertkitError, match=r":2: 3 columns where earlier lines have 4"):
        read_conll(p)



def test_bad_columns_and_a_missing_test_file_are_one_line_before_training(tmp_path, capsys):
    # --tag-column 9 was an IndexError (a traceback); a missing --test was found only after training.
    # --model names no folder: the files are refused before any model is looked at
    from bertkit.cli import main

    train = tmp_path / "train.txt"
    train.write_text("John NNP I-PER\nlives VBZ O\n")
    base = ["finetune", "ner", "--train", str(train), "-o", str(tmp_path / "o"), "--model", str(tmp_path / "none")]
    for flags, words in ((["--tag-column", "9"], f"{train}:1: no column 9 (--tag-column): the line has 3, numbered "
                                                 "0..2 (or -3..-1 from the end)"),
                         (["--token-column", "-4"], "no column -4 (--token-column)"),
                         (["--test", str(tmp_path / "test.txt")],
                          f"input file {tmp_path / 'test.txt'} does not exist")):
        assert main(base + flags) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "o").exists()

def test_conll_reader_counts_docstarts(tmp_path):
    p = tmp_path / "ok.txt"
    p.write_text("-DOCSTART- -X- -X- O\n\nJohn NNP I-NP I-PER\nran VBD I-VP O\n\n\nParis NNP I-NP I-LOC\n")
    sents, report = read_conll(p)
    assert [s.words for s in sents] == [["John", "ran"], ["Paris"]]
    assert [s.tags for s in sents] == [["I-PER", "O"], ["I-LOC"]]
    assert report.skipped["-DOCSTART- lines"] == 1 and sents[1].line == 7


def ner_file(path, n, rng):
    lines = []
    for _ in range(n):
        who, where = rng.choice(["john", "mary"]), rng.choice(["paris", "london", "berlin"])
        sent = [(who, "I-PER"), ("visited", "O"), (where, "I-LOC"), (".", "O")]
        if rng.random() < 0.5:
            sent = [("the", "O"), ("city", "O"), ("of", "O"), (where, "I-LOC"), ("was", "O"),
                    (rng.choice(["slow", "new", "old"]), "O")]
        lines += [f"{w} X X {t}" for w, t in sent] + [""]
    path.write_text("-DOCSTART- -X- -X- O\n\n" + "\n".join(lines))
    return path


def assert_saved_epoch_is_said(final: dict, metric: str) -> None:
    """metrics.json says which epoch the saved model is and why, and finetune prints it, for NER and QA as for the
    text tasks (they printed "saved the best epoch's model" without saying which): the epoch with the best figure
    (the later of a tie: NER and QA have no held-out loss to break it)."""
    from bertkit.tasks.trainer import figure

    best = max(final["epochs"], key=lambda e: (e[metric], e["epoch"]))
    assert final["saved"]["epoch"] == best["epoch"]
    assert figure(best[metric]) in final["saved"]["because"]


def test_ner_end_to_end_iob1(tiny, tmp_path):  # noqa: F811
    import bertkit

    rng = random.Random(0)
    cfg = NerConfig(train=str(ner_file(tmp_path / "train.txt", 80, rng)), dev=str(ner_file(tmp_path / "dev.txt", 20, rng)),
                    test=str(ner_file(tmp_path / "test.txt", 10, rng)), output=str(tmp_path / "o"), model=str(tiny),
                    tag_scheme="iob1", max_length=32, stride=8, training=fast(metric="f1"))
    final = finetune_ner(cfg, log=lambda s: None)
    assert final["dev"]["f1"] > 0.9 and "test" in final and set(final["dev"]["per_type"]) == {"LOC", "PER"}
    assert_saved_epoch_is_said(final, "f1")
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert sorted(config["label2id"]) == ["B-LOC", "B-PER", "O"]
    first = (tmp_path / "o" / "dev_predictions.conll").read_text().split("\n\n")[0].splitlines()
    assert all(len(line.split()) == 3 for line in first)
    out = bertkit.predict(tmp_path / "o", ["mary visited london ."])
    assert out[0]["words"] == ["mary", "visited", "london", "."]
    assert out[0]["tags"] == ["I-PER", "O", "I-LOC", "O"]  # back in the training files' IOB1
    from bertkit.cli import main

    (tmp_path / "new.txt").write_text("john visited berlin .\nthe city of paris was old\n")
    assert main(["predict", str(tmp_path / "o"), str(tmp_path / "new.txt"), "-o", str(tmp_path / "p.tsv"), "--dtype", "float32"]) == 0
    rows = [r.split("\t") for r in (tmp_path / "p.tsv").read_text().splitlines()[1:]]
    assert rows[0][:2] == ["john visited berlin .", "I-PER O I-LOC O"] and len(rows) == 2
    # the dev file itself (CoNLL columns) gives one row per sentence
    assert main(["predict", str(tmp_path / "o"), cfg.dev, "-o", str(tmp_path / "p2.tsv"), "--dtype", "float32"]) == 0
    assert len((tmp_path / "p2.tsv").read_text().splitlines()) == 21


@pytest.mark.parametrize("task, says", [
    ("ner", ["CoNLL", "word ... TAG", "--tag-scheme iob1", "first word piece", "dev_predictions.conll"]),
    ("qa", ["SQuAD JSON", "--version-2-with-negative", "JSON lines", "dev_predictions.json"])])
def test_the_span_tasks_help_says_what_files_they_read_and_write(task, says, capsys):
    """`bertkit finetune ner --help` and `... qa --help` said only "fine-tune for ner": not the CoNLL columns or
    SQuAD JSON they read, CoNLL-2003's IOB1 flag, nor the predictions file they write (the end-to-end tests here
    read them)."""
    from bertkit.cli import main

    with pytest.raises(SystemExit):
        main(["finetune", task, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(s in text for s in says), [s for s in says if s not in text]


def test_unknown_dev_tag_is_an_error(tiny, tmp_path):  # noqa: F811
    (tmp_path / "t.txt").write_text("john X X B-PER\nran X X O\n")
    (tmp_path / "d.txt").write_text("paris X X B-LOC\n")
    cfg = NerConfig(train=str(tmp_path / "t.txt"), dev=str(tmp_path / "d.txt"), output=str(tmp_path / "o"),
                    model=str(tiny), training=fast())
    with pytest.raises(BertkitError, match=r"\['B-LOC'\] do not occur in the training labels"):
        finetune_ner(cfg, log=lambda s: None)


@pytest.mark.oracle
@pytest.mark.data
def test_alignment_matches_run_ner_recipe(shared_data, default_model_dir, transformers_mod):
    """Our first-piece labels equal transformers' run_ner.py labels (label_all_tokens=False)."""
    sents, _ = read_conll(shared_data / "conll2003" / "dev.txt", max_sentences=200)
    ours = Tokenizer.from_pretrained(default_model_dir)
    theirs = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    names = sorted({t for s in sents for t in s.tags})
    label2id = {n: i for i, n in enumerate(names)}
    feats, _ = make_features(ours, sents, label2id, max_length=512, stride=0)
    assert len(feats) == len(sents)
    for f, s in zip(feats, sents):
        enc = theirs(s.words, is_split_into_words=True, truncation=True, max_length=512)
        expect, prev = [], None
        for w in enc.word_ids():
            expect.append(-100 if w is None or w == prev else label2id[s.tags[w]])
            prev = w
        assert f["input_ids"] == enc["input_ids"], s.words
        assert f["labels"] == expect, s.words


@pytest.mark.parametrize("task,options", [
    ("ner", {"max_length": 32, "stride": 32}), ("ner", {"max_length": 8, "stride": 6}),
    ("ner", {"max_length": 34, "stride": 40}),
    ("qa", {"max_length": 128, "doc_stride": 128}), ("qa", {"max_length": 96, "max_query_length": 32, "doc_stride": 64}),
    ("classify", {"max_length": 16, "stride": 20})])
def test_a_stride_too_long_for_the_window_names_the_stride_to_pass(task, options, tmp_path, capsys):
    """A short --max-length leaves an overlap given no room: the one-line error names the exact flag and value,
    and that value is accepted (asserted by running the check again with it). The default overlaps follow
    --max-length (NER: a quarter of it, at most 32; QA: a half, at most 128, and the question a quarter, at most
    64: NerConfig.fit, QAConfig.fit), so it is only an overlap typed that is refused (below)."""
    import re

    from bertkit.cli import main
    from bertkit.tasks.config import NerConfig, QAConfig, TextTaskConfig

    cls = {"ner": NerConfig, "qa": QAConfig, "classify": TextTaskConfig}[task]
    stride_name = "doc_stride" if task == "qa" else "stride"
    def check(**given):
        cfg = cls(train="t", output="o", **{**dict.fromkeys(cls.FITTED), **given})  # as the command line builds it
        cfg.fit(None)  # what a run settles first (the length is given: no model is read)
        cfg.validate()

    with pytest.raises(BertkitError) as err:
        check(**options)
    found = re.search(r"pass --stride (\d+)", str(err.value))
    assert found and "\n" not in str(err.value), str(err.value)
    check(**{**options, stride_name: int(found.group(1))})
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    (tmp_path / "t.txt").write_text("x\n")
    assert main(["finetune", task, "--train", str(tmp_path / "t.txt"), "-o", str(tmp_path / "o"), *flags]) == 2
    assert f"pass --stride {found.group(1)}" in capsys.readouterr().err


@pytest.mark.parametrize("length,stride", [(32, 8), (8, 2), (64, 16), (128, 32), (512, 32)])
def test_the_default_stride_follows_a_typed_max_length_and_is_said(length, stride):
    """`finetune ner --max-length 32` stopped with '--stride ... must be in 0..29 ..., got 32': the default
    overlap, which the user never typed, refused as if typed. Not given, it is now fitted as QA's is: a quarter
    of --max-length, at most the default 32 (its share of 128), said in one line where it is not 32; every
    fitted overlap leaves the window room to move on (the property validate checks: 0 <= stride < window)."""
    from bertkit.tasks.run import settle

    said = []
    cfg = settle(NerConfig(train="t", output="o", **{**dict.fromkeys(NerConfig.FITTED), "max_length": length}),
                 log=said.append)
    assert cfg.stride == stride and 0 <= cfg.stride < length - 2
    assert said == ([] if stride == 32 else [f"stride {stride}: a quarter of max length {length}, as the default "
                                             "32 is of 128 (--stride sets another)"]), said


def test_a_typed_max_length_of_32_trains_with_the_fitted_stride(tiny, tmp_path, capsys):  # noqa: F811
    """The same through the command line, end to end: the run trains, says the overlap, and saves it for
    predict (bertkit_task.json), which reads the sentences in the same windows."""
    from bertkit.cli import main

    (tmp_path / "t.txt").write_text("john B-PER\nran O\n\nparis B-LOC\n")
    assert main(["finetune", "ner", "--train", str(tmp_path / "t.txt"), "-o", str(tmp_path / "o"), "--model",
                 str(tiny), "--max-length", "32", "--epochs", "1", "--no-progress"]) == 0
    assert "stride 8: a quarter of max length 32" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "bertkit_task.json").read_text())["stride"] == 8


def test_cjk_words_are_split_for_training_as_predict_splits_text(tiny, tmp_path):  # noqa: F811
    """Chinese has no spaces: predict read a whole sentence as one word and gave it one tag; it now splits each
    CJK ideograph into a word (as BERT's BasicTokenizer does; transformers' pipeline is the oracle in
    test_predict_inputs). A CoNLL file whose words hold several ideographs ("北京 B-LOC") is split the same way
    for training and evaluation, the tag continued (北 B-LOC, 京 I-LOC): trained on whole words, the model
    learned a label on the first character only and was asked about every character."""
    from bertkit.tasks.ner_inference import read_labelled, split_cjk, split_words
    from bertkit.tasks.predict import predict, predict_file

    s = split_cjk(TaggedSentence(["默克尔", "访问", "北京", "and", "New", "York", "東京タワー"],
                                 ["B-PER", "O", "B-LOC", "O", "B-LOC", "I-LOC", "I-LOC"]))
    assert s.words == ["默", "克", "尔", "访", "问", "北", "京", "and", "New", "York", "東", "京", "タワー"]
    assert s.tags == ["B-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O", "B-LOC", "I-LOC", "I-LOC",
                      "I-LOC", "I-LOC"]
    lines = []
    for who, where in [("默克尔", "北京"), ("马克龙", "巴黎"), ("john", "东京")] * 8:
        lines += [f"{who} B-PER", "访问 O", f"{where} B-LOC", ""]
    (tmp_path / "t.txt").write_text("\n".join(lines))
    said = []
    cfg = NerConfig(train=str(tmp_path / "t.txt"), dev=str(tmp_path / "t.txt"), output=str(tmp_path / "o"),
                    model=str(tiny), max_length=32, stride=8, training=fast(epochs=1))
    finetune_ner(cfg, log=said.append)
    assert any("split into one word per ideograph" in line for line in said), said
    first = (tmp_path / "o" / "dev_predictions.conll").read_text().split("\n\n")[0].splitlines()
    assert [line.split()[:2] for line in first] == [["默", "B-PER"], ["克", "I-PER"], ["尔", "I-PER"], ["访", "O"],
                                                    ["问", "O"], ["北", "B-LOC"], ["京", "I-LOC"]]
    texts, _, gold = read_labelled(tmp_path / "t.txt", {})[:3]
    assert texts[0] == "默 克 尔 访 问 北 京" and gold[0] == [line.split()[1] for line in first]
    got = predict(tmp_path / "o", ["马克龙访问北京", "john访问 东京"])
    assert [p["words"] for p in got] == [split_words("马克龙访问北京"), ["john", "访", "问", "东", "京"]]
    assert [len(p["tags"]) for p in got] == [7, 5]
    assert predict_file(tmp_path / "o", tmp_path / "t.txt", tmp_path / "p.tsv").scored == 24


RAW = ["I flew to Paris.", 'U.S.-based firms (London) said: "Hello, world!"', "José's café, in São  Paulo\tto-day.",
       "我爱Paris, 真的.", "We can't pay $5.50, or 10% -- they're J. Smith's ... [sic]",
       "Hi... the investors' shares of U.N. rose; ok?"]


def test_raw_text_words_are_the_penn_treebanks_and_an_entity_leaves_its_punctuation_out(tiny, tmp_path):
    """predict tagged a raw text's whitespace words ("Paris." one word, the entity's span holding the period), then
    BERT's words (every punctuation character apart: "U.S." four words, U . S ., which a model trained on CoNLL-2003's
    whole "U.S." tagged as two entities U and S, recall 0.02 on such entities). A text's words are now the Penn
    Treebank's, the convention CoNLL-2003 was tokenized by: the oracle is nltk's TreebankWordTokenizer
    (span_tokenize, on one-sentence texts), each CJK ideograph then a word of its own; a list is kept as given."""
    import bertkit
    from bertkit.tasks import ner_inference
    from bertkit.tasks.predict import with_entities
    from conftest import oracle as dev_oracle
    from test_serve import task_dir

    treebank = dev_oracle("nltk.tokenize", "nltk").TreebankWordTokenizer()

    def oracle(text):  # each word's (start, end), in order
        out = []
        for a, b in treebank.span_tokenize(text):
            cut = [a] + [i for i in range(a, b) if "\u4e00" <= text[i] <= "\u9fff" or
                         (i > a and "\u4e00" <= text[i - 1] <= "\u9fff")] + [b]
            out += [(x, y) for x, y in zip(cut, cut[1:]) if x < y]
        return out

    names = ["O", "B-LOC", "B-ORG"]
    model = task_dir(tmp_path / "ner", tiny, "BertForTokenClassification",
                     {"task": "ner", "max_length": 16, "stride": 4, "tag_scheme": "bio"}, names)
    loaded = bertkit.load(model)
    for text, p in zip(RAW, bertkit.predict(None, RAW, loaded=loaded)):
        spans = oracle(text)
        assert p["words"] == [text[a:b] for a, b in spans] and len(p["tags"]) == len(spans)
        each = with_entities(text, {**p, "tags": ["B-LOC"] * len(spans)})["entities"]  # every word an entity
        assert [(e["start"], e["end"], e["text"]) for e in each] == [(a, b, text[a:b]) for a, b in spans]
    tok = loaded.tokenizer
    tagged = dict(zip(tok.convert_tokens_to_ids(["paris", "london"]), [1, 2]))

    def run(features, per_token):  # the model: B-LOC on "paris", B-ORG on "london", O elsewhere
        rows = [np.eye(len(names))[[tagged.get(i, 0) for i in f["input_ids"]]] for f in features]
        return {"logits": rows}

    found = []
    for text, p in zip(RAW, ner_inference.predict(run, tok, RAW, None, {"max_length": 16, "stride": 4}, names)):
        found.append([(e["type"], e["text"], e["start"], e["end"]) for e in with_entities(text, p)["entities"]])
        assert found[-1] == [("LOC" if text[a:b].lower() == "paris" else "ORG", text[a:b], a, b)
                             for a, b in oracle(text) if text[a:b].lower() in ("paris", "london")]
    assert found[0] == [("LOC", "Paris", 10, 15)]  # not "Paris." (10, 16)
    words = ["U.S.-based", "firms", "(London)", "said", ":"]
    assert bertkit.predict(None, [words], loaded=loaded)[0]["words"] == words  # pre-split words: as given
    # several sentences: each one's final period apart, an abbreviation's by its form kept ("J.", "U.S.")
    got = bertkit.predict(None, ["I flew to Paris. J. Smith of the U.S. stayed."], loaded=loaded)[0]["words"]
    assert got == ["I", "flew", "to", "Paris", ".", "J.", "Smith", "of", "the", "U.S.", "stayed", "."]
