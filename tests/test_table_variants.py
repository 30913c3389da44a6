"""Labelled tables as users download them: the variants of GLUE's TSV, a CSV and JSONL read as the plain file."""

import json
import os
import subprocess
import sys

from bertkit.data.tables import label_names, read_text_columns, read_text_examples

ROWS = [("a fine film", "1"), ("dull", "0"), ("not bad at all", "1")]


def test_a_header_in_other_case_names_the_same_columns(tmp_path):
    """`Sentence`/`Label` (a header in title case, as spreadsheets and some exports write it) was refused for
    want of 'sentence'; a column is found by its name regardless of case when only one matches."""
    (tmp_path / "plain.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in ROWS))
    (tmp_path / "upper.tsv").write_text("Sentence\tLABEL\r\n" + "".join(f"{t}\t{l}\r\n" for t, l in ROWS))
    want = [(e.text, e.label) for e in read_text_examples(tmp_path / "plain.tsv")[0]]
    assert want == ROWS
    assert [(e.text, e.label) for e in read_text_examples(tmp_path / "upper.tsv")[0]] == want
    assert read_text_columns(tmp_path / "upper.tsv", "sentence", log=lambda _: None)[:2] == ([t for t, _ in ROWS], None)
    # JSONL whose later objects leave the label out kept reading them as unlabelled under a case-mismatched key
    (tmp_path / "upper.jsonl").write_text("".join(json.dumps({"Sentence": t, "Label": l}) + "\n" for t, l in ROWS))
    assert [(e.text, e.label) for e in read_text_examples(tmp_path / "upper.jsonl")[0]] == want


def test_whole_number_labels_written_as_floats_are_the_same_class(tmp_path):
    """A label column saved from a float column ("1.0", what pandas writes) made classes '0.0' and '1.0', unlike
    the same labels as JSON numbers (1.0 read as '1'), so a model trained on one could not be scored on the
    other. "1.0" is the class 1, as in JSONL; a fractional label stays its own name."""
    (tmp_path / "f.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}.0\n" for t, l in ROWS) + "odd\t2.5\n")
    (tmp_path / "f.jsonl").write_text("".join(json.dumps({"sentence": t, "label": float(l)}) + "\n" for t, l in ROWS))
    tsv = [e.label for e in read_text_examples(tmp_path / "f.tsv")[0]]
    assert tsv == [l for _, l in ROWS] + ["2.5"]
    assert [e.label for e in read_text_examples(tmp_path / "f.jsonl")[0]] == tsv[:3]


def test_squad_in_the_hugging_face_layout_reads_as_the_official_json(tmp_path):
    """SQuAD as Hugging Face's `squad`/`squad_v2` datasets save it (one question per JSON line, answers as
    {'text': [...], 'answer_start': [...]}) was refused as 'not SQuAD JSON'. It reads as the official v2.0
    file: an empty answer list is an unanswerable question (transformers' run_qa.py: the answer is [CLS]),
    and a v2.0 file's `plausible_answers` are no answers."""
    from bertkit.data.squad import read_squad
    ctx = "Paris is the capital of France. It is on the Seine."
    qas = [{"id": "a", "question": "Capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]},
           {"id": "b", "question": "River?", "answers": [{"text": "the Seine", "answer_start": 41},
                                                        {"text": "Seine", "answer_start": 45}]},
           {"id": "c", "question": "Capital of Spain?", "answers": [], "is_impossible": True,
            "plausible_answers": [{"text": "Paris", "answer_start": 0}]}]
    official = {"version": "v2.0", "data": [{"title": "France", "paragraphs": [{"context": ctx, "qas": qas}]}]}
    (tmp_path / "v2.json").write_text(json.dumps(official))
    rows = [{"id": q["id"], "title": "France", "context": ctx, "question": q["question"],
             "answers": {"text": [a["text"] for a in q["answers"]],
                         "answer_start": [a["answer_start"] for a in q["answers"]]}} for q in qas]
    (tmp_path / "hf.jsonl").write_text("".join(json.dumps(r) + "\r\n" for r in rows))
    (tmp_path / "hf_list.json").write_text(json.dumps(rows))
    want, _ = read_squad(tmp_path / "v2.json")
    assert [(e.id, e.answers, e.is_impossible) for e in want] == [
        ("a", [("Paris", 0)], False), ("b", [("the Seine", 41), ("Seine", 45)], False), ("c", [], True)]
    for name in ("hf.jsonl", "hf_list.json"):
        assert read_squad(tmp_path / name)[0] == want


def test_a_tsv_in_csv_quotes_is_refused_not_read_with_its_quotes(tmp_path):
    """pandas' to_csv(sep="\\t") quotes a text holding a quote, doubling it inside; a .tsv is read without
    quoting (GLUE), so the text kept its quotes, doubled, silently. The csv module reads the true text, and the
    same file as CSV (commas) reads it; the TSV is refused naming the line. GLUE's literal quotes still read."""
    import csv
    import io
    import pytest
    from bertkit.errors import BertkitError
    rows = [('he said "hi", twice', "1"), ("plain", "0")]
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows([("sentence", "label"), *rows])
    (tmp_path / "q.tsv").write_text(buf.getvalue())
    assert list(csv.reader(io.StringIO(buf.getvalue()), delimiter="\t"))[1:] == [list(r) for r in rows]
    with pytest.raises(BertkitError, match=r"q.tsv:2: the cell .* is in CSV quotes"):
        read_text_examples(tmp_path / "q.tsv")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([("sentence", "label"), *rows])
    (tmp_path / "q.csv").write_text(buf.getvalue())
    assert [(e.text, e.label) for e in read_text_examples(tmp_path / "q.csv")[0]] == rows
    (tmp_path / "glue.tsv").write_text('sentence\tlabel\nhe called "the witness", of\t1\n"quoted whole"\t0\n')
    assert [e.text for e in read_text_examples(tmp_path / "glue.tsv")[0]] == ['he called "the witness", of',
                                                                              '"quoted whole"']


def test_a_csv_separated_by_semicolons_says_so(tmp_path):
    """Excel writes CSV with ';' where ',' is the decimal mark; the header read as one column, and the error
    asked for --text-column, a flag that could not help."""
    import pytest
    from bertkit.errors import BertkitError
    (tmp_path / "x.csv").write_text("sentence;label\nfine;1\n")
    with pytest.raises(BertkitError, match="separated by ';', not commas"):
        read_text_examples(tmp_path / "x.csv")


def test_the_label_order_is_the_same_in_every_process():
    """The classes are numbered in sorted order (numbers by value), and the numbering decides which head row a
    class gets. A label that reads as a float NaN ('nan', 'NaN': what str() of a missing value writes) compared
    neither below nor above any number, so the sort left it, and every class around it, in the order of the set
    the labels were gathered in, which follows the process's string hash (PYTHONHASHSEED): one training file,
    one --seed, and id2label ['nan', '0', '1'] in one run, ['1', 'nan', '0'] in the next, with other weights.
    Such a name sorts as text, after the numbers; the same answer in processes hashing strings differently."""
    labels = ["1", "nan", "0", "10", "NaN", "2", "-1.5", "inf", "pos"]
    want = ["-1.5", "0", "1", "2", "10", "inf", "NaN", "nan", "pos"]
    assert label_names(labels) == want
    code = f"from bertkit.data.tables import label_names; print(label_names({labels!r}))"
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(h)},
                           capture_output=True, text=True, check=True).stdout for h in range(6)}
    assert seen == {f"{want!r}\n"}
