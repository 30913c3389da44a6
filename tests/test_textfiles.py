"""User text files (bertkit.data.textfiles): the one corpus finder, strict UTF-8 with byte offsets."""

import gzip

import pytest

from bertkit.errors import BertkitError
from bertkit.data.corpus import corpus_files
from bertkit.data.textfiles import existing_file, first_invalid_utf8, read_text
from bertkit.text.vocab_training import VocabTrainingConfig, train_vocab_from_files


def test_first_invalid_utf8_finds_the_byte(tmp_path):
    text = ("\u00e9" * 700_000 + "x").encode("utf-8")  # 2-byte characters across the 1 MiB scan blocks
    path = tmp_path / "a.txt"
    path.write_bytes(text)
    assert first_invalid_utf8(path) is None
    path.write_bytes(text + b"\xe9 caf" + text)
    assert first_invalid_utf8(path) == (len(text), "invalid continuation byte")
    path.write_bytes(text + b"\xc3")  # cut in the middle of a character at the end
    assert first_invalid_utf8(path) == (len(text), "unexpected end of data")


def test_read_text_names_file_offset_and_problem(tmp_path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("sentence\tlabel\ncaf\u00e9\tpos\n".encode("latin-1"))
    with pytest.raises(BertkitError, match=r"latin1.tsv is not UTF-8 text: the bytes at offset 18 \(e9 09 70 6f\) "
                                           r"are not UTF-8 \(invalid continuation byte\)"):
        read_text(path)
    with pytest.raises(BertkitError, match="is a directory; pass a file"):
        existing_file(tmp_path)
    with pytest.raises(BertkitError, match="does not exist"):
        existing_file(tmp_path / "nope.txt")


def test_vocab_train_and_prepare_find_the_same_files_gz_included(tmp_path):
    (tmp_path / "a.txt").write_text("plain zebra text\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("gzipped quokka words\n" * 3)
    (tmp_path / ".hidden.txt").write_text("hidden\n")
    (tmp_path / "notes.md").write_text("markdown\n")
    # files inside hidden folders are hidden files too: Jupyter keeps a copy of each text file it edits in
    # .ipynb_checkpoints/NAME-checkpoint.txt, which was read as more corpus (every such line counted twice)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("plain zebra text\n")
    assert [p.name for p in corpus_files([tmp_path])] == ["a.txt", "b.txt.gz"]
    assert corpus_files([tmp_path / ".ipynb_checkpoints"]) == [tmp_path / ".ipynb_checkpoints" / "a-checkpoint.txt"]
    tokens = train_vocab_from_files([tmp_path], VocabTrainingConfig(vocab_size=200, min_frequency=1))
    assert "quokka" in tokens and "zebra" in tokens  # the .gz file was read, decompressed


def test_a_vocabulary_written_inside_the_corpus_folder_is_not_read_the_next_time(tmp_path):
    """`vocab train corpus/ -o corpus/v1` then `vocab train corpus/ -o corpus/v2`: the second read v1's vocab.txt
    as text, so its vocabulary held "cls", "mask", "pad" and "#", learned from the first one's lines. A vocab.txt
    beside a tokenizer_config.json (or a model's config.json) is a tokenizer, not corpus; one alone is text."""
    from bertkit.text.vocab_training import save_trained_vocab

    (tmp_path / "a.txt").write_text("the cat sat on the mat\n" * 3)
    config = VocabTrainingConfig(vocab_size=200, min_frequency=1)
    first = train_vocab_from_files([tmp_path], config)
    save_trained_vocab(first, tmp_path / "v1", config)
    assert train_vocab_from_files([tmp_path], config) == first
    assert corpus_files([tmp_path]) == [tmp_path / "a.txt"]
    (tmp_path / "words").mkdir()
    (tmp_path / "words" / "vocab.txt").write_text("a list of words, as text\n")
    assert corpus_files([tmp_path]) == [tmp_path / "a.txt", tmp_path / "words" / "vocab.txt"]


@pytest.mark.parametrize("name, text", [
    ("t.csv", 'sentence,label\r\n"good, fun",pos\r\nbad,neg\r\n'),  # Excel's "CSV UTF-8" (BOM, CRLF)
    ("t.tsv", "sentence\tlabel\ngood fun\tpos\nbad\tneg\n"),
    ("t.jsonl", '{"sentence": "good fun", "label": "pos"}\n{"sentence": "bad", "label": "neg"}\n'),
])
def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path, name, text):
    """Windows tools write UTF-8 with a byte order mark (EF BB BF); it was read as part of the header
    ('\\ufeffsentence': "no column 'sentence'") or as a JSON syntax error. The rows read with it are
    the rows read without it."""
    from bertkit.data.tables import read_text_examples

    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir(), marked.mkdir()
    (plain / name).write_bytes(text.encode("utf-8"))
    (marked / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    want, _ = read_text_examples(plain / name)
    got, _ = read_text_examples(marked / name)
    first = "good, fun" if name == "t.csv" else "good fun"
    assert [(e.text, e.label) for e in got] == [(e.text, e.label) for e in want] == [(first, "pos"), ("bad", "neg")]


def test_a_byte_order_mark_before_a_conll_docstart(tmp_path):
    from bertkit.data.tables import looks_like_conll, read_conll

    path = tmp_path / "t.conll"
    path.write_bytes(b"\xef\xbb\xbf" + "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n".encode())
    sentences, report = read_conll(path)
    assert looks_like_conll(path) and report.skipped["-DOCSTART- lines"] == 1
    assert [(s.words, s.tags) for s in sentences] == [(["EU", "rejects"], ["I-ORG", "O"])]


def test_a_csv_error_names_the_line_of_its_record_when_a_field_spans_lines(tmp_path):
    """A quoted CSV field may hold newlines, so record numbers are not line numbers: the bad score on line
    6 was reported on line 4."""
    from bertkit.data.tables import read_text_examples

    path = tmp_path / "t.csv"
    path.write_text('sentence,score\n"first line\nsecond line\nthird",1.0\n"ok",2.0\n"bad one",abc\n')
    assert path.read_text().splitlines()[5] == '"bad one",abc'  # line 6
    with pytest.raises(BertkitError, match=r"t.csv:6: score 'abc' is not a number"):
        read_text_examples(path, label_column="score", problem_type="regression")
    path.write_text('sentence,score\n"first line\nsecond",1.0\n\n"ok",2.0\n')
    examples, _ = read_text_examples(path, label_column="score", problem_type="regression")
    assert [(e.text, e.row) for e in examples] == [("first line\nsecond", 2), ("ok", 5)]


def test_standard_input_ends_its_lines_where_a_file_of_the_same_bytes_does(tmp_path):
    # `bertkit tokenize < f` split standard input at "\n" only, while every file reader (embed's read_texts,
    # predict's, Python's own files) also ends a line at a lone "\r": one text of a file with classic-Mac line
    # ends or a stray CR was one line on standard input and two rows of embed, so the outputs did not align
    import io

    from bertkit.data.textfiles import read_texts, stdin_lines

    data = "\ufefffirst\rsecond line\r\nthird\r\r\nfifth\u2028still fifth\x85and\x0cfifth\nlast\r".encode("utf-8")
    python = [line.rstrip("\n") for line in io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig")]  # universal
    assert list(stdin_lines(io.BytesIO(data))) == python
    (tmp_path / "in.txt").write_bytes(data)
    assert list(read_texts(tmp_path / "in.txt")[0]) == [line for line in python if line.strip()]


def test_a_pipe_is_read_once_as_standard_input_or_named_as_a_pipe(tmp_path):
    """A shell's <(command) (or /dev/stdin fed by one) names a pipe: `bertkit embed <(cut -f1 data.tsv)` said
    "input file /dev/fd/63 does not exist". One text per line is read from it once, as from "-" (the texts'
    readers read their input more than once: the second pass would find the pipe empty); a reader of tables,
    which reads a file more than once, says it is a pipe."""
    import os
    import re
    import subprocess
    import sys

    from bertkit.data.textfiles import numbered_texts

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('first\\n\\nsecond\\r\\nthird')"])
    try:
        texts = numbered_texts(fifo)
        assert list(texts()) == [(1, "first"), (3, "second"), (4, "third")]
        assert list(texts()) == [(1, "first"), (3, "second"), (4, "third")]  # a second pass: the same, not empty
        assert writer.wait(10) == 0
    finally:
        writer.kill()  # blocked in open() when nothing read the pipe
    # bytes that are not UTF-8 name the pipe the user gave (it said "standard input line 2")
    latin = tmp_path / "latin"
    os.mkfifo(latin)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(latin)!r}, 'wb').write(b'ok\\n\\xe9t\\xe9\\n')"])
    try:
        with pytest.raises(BertkitError, match=re.escape(f"{latin} line 2 is not UTF-8 (bytes e9 74 e9 0a)")):
            list(numbered_texts(latin)())
        assert writer.wait(10) == 0
    finally:
        writer.kill()
    with pytest.raises(BertkitError, match=r"is a pipe, not a file: .* write it to a file first"):
        existing_file(fifo)
    with pytest.raises(BertkitError, match="does not exist"):
        existing_file(tmp_path / "missing.txt")
