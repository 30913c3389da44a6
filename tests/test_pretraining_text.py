"""Raw text -> documents of sentences: the sentence splitter and the corpus reader.

Hand-checkable cases: each expected split below was decided by reading the
sentence, not by running the code; and the bad-input cases check that every
repair or skip is counted (nothing silently lost).
"""

import gzip

import pytest

from bertkit.errors import BertkitError
from bertkit.data import corpus as corpus_mod
from bertkit.data.corpus import CorpusStats, iter_documents
from bertkit.data.corpus import corpus_files as list_input_files
from bertkit.data.sentences import split_sentences


# --- sentence splitter -------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("It rained. We stayed in.", ["It rained.", "We stayed in."]),
        # titles and abbreviations
        ("Mr. Darcy bowed. Mrs. Bennet smiled.", ["Mr. Darcy bowed.", "Mrs. Bennet smiled."]),
        ("See Dr. Watson at No. 221 Baker St. He waits.", ["See Dr. Watson at No. 221 Baker St. He waits."]),
        ("Bring fruit, e.g. Apples and pears. Then go.", ["Bring fruit, e.g. Apples and pears.", "Then go."]),
        # decimals and dots inside words
        ("It cost 3.50 dollars. The site was example.com today.", ["It cost 3.50 dollars.", "The site was example.com today."]),
        ("Pi is about 3.14159. Everyone knows it.", ["Pi is about 3.14159.", "Everyone knows it."]),
        # initials
        ("J. R. R. Tolkien wrote it. George W. Bush read it.", ["J. R. R. Tolkien wrote it.", "George W. Bush read it."]),
        # quotes: the closing quote stays with its sentence; lower-case after ?/! continues
        ('"Is that all?" he asked. "Yes!" She left.', ['"Is that all?" he asked.', '"Yes!"', "She left."]),
        ("He said, \u201cGo home.\u201d Then he left.", ["He said, \u201cGo home.\u201d", "Then he left."]),
        ("(It was late.) Nobody came.", ["(It was late.)", "Nobody came."]),
        # ellipses
        ("Wait... what? Well... Then we ran.", ["Wait... what?", "Well...", "Then we ran."]),
        ("And so\u2026 Nothing.", ["And so\u2026", "Nothing."]),
        # digits start sentences; hard-wrapped lines are joined
        ("It was 1850.\n1851 came.", ["It was 1850.", "1851 came."]),
        ("  one line\n  wrapped   over two.  ", ["one line wrapped over two."]),
        ("", []),
        ("No terminal punctuation", ["No terminal punctuation"]),
        # scripts without capitals: a letter of one starts a sentence (they were never split: a paragraph, one
        # sentence); Chinese and Japanese ends need no space after them
        ("זה משפט. זה עוד משפט.", ["זה משפט.", "זה עוד משפט."]),
        ("جملة أولى. جملة ثانية؟ نعم.", ["جملة أولى.", "جملة ثانية؟", "نعم."]),
        ("वह घर गया। वह सो गया।", ["वह घर गया।", "वह सो गया।"]),
        ("他说：“走吧。”然后离开了。你好吗？我很好！", ["他说：“走吧。”", "然后离开了。", "你好吗？", "我很好！"]),
        ("今日は晴れ。 明日は雨？ Yes. 終わり", ["今日は晴れ。", "明日は雨？", "Yes.", "終わり"]),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_loses_nothing():
    text = 'Mr. A. B. Smith (b. 1900) said "Hi!" to Dr. Who... Then? "No." 3.5 is U.S. law. End'
    assert " ".join(split_sentences(text)) == " ".join(text.split())
    wide = "「行こう。」と彼は言った。  それから？！ 走吧。。。好。"
    assert "".join(split_sentences(wide)).replace(" ", "") == wide.replace(" ", "")
    assert all(s == s.strip() and s for s in split_sentences(wide))


def test_a_chinese_corpus_is_split_into_its_sentences(tmp_path):
    """pretrain prepare of Chinese text made each paragraph one "sentence" (no space after its 。, no capital
    after that): segments were cut from paragraphs of hundreds of tokens, most of the corpus never reached an
    instance, and the summary said nothing was skipped."""
    f = tmp_path / "zh.txt"
    f.write_text("我们去公园。天气很好！你来吗？\n他说好。\n\n第二个文件。\n")
    docs, _ = _docs(f, documents="file", sentences="split")
    assert docs == [["我们去公园。", "天气很好！", "你来吗？", "他说好。", "第二个文件。"]]


# --- corpus reading ----------------------------------------------------------------------

def _docs(path, **kw):
    stats = CorpusStats()
    return list(iter_documents(path, stats, **kw)), stats


def test_blank_line_documents_one_sentence_per_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("First sentence.\nSecond one.\n\n\n   \nOther doc.\n")
    docs, stats = _docs(f, documents="blank-line", sentences="line")
    assert docs == [["First sentence.", "Second one."], ["Other doc."]]
    assert stats.files == 1 and not stats.skips


def test_file_documents_with_wrapped_paragraphs(tmp_path):
    f = tmp_path / "book.txt"
    f.write_text("CHAPTER I\n\nIt was a dark night. The\nrain fell.\n\nMr. Holmes\nsmiled.\n")
    docs, _ = _docs(f, documents="file", sentences="split")
    assert docs == [["CHAPTER I", "It was a dark night.", "The rain fell.", "Mr. Holmes smiled."]]
    docs, _ = _docs(f, documents="blank-line", sentences="split")
    assert docs == [["CHAPTER I"], ["It was a dark night.", "The rain fell."], ["Mr. Holmes smiled."]]


def test_gzip_and_folders(tmp_path):
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "b.txt.gz", "wt") as g:
        g.write("Zipped text. Here.\n")
    (tmp_path / "a.txt").write_text("Plain.\n")
    (tmp_path / "notes.csv").write_text("ignored,in,folders\n")
    files = list_input_files([tmp_path])
    assert [f.name for f in files] == ["a.txt", "b.txt.gz"]
    docs, _ = _docs(files[1])
    assert docs == [["Zipped text.", "Here."]]


def test_missing_and_empty_inputs(tmp_path):
    with pytest.raises(BertkitError, match="not found"):
        list_input_files([tmp_path / "nope.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertkitError, match="no .txt"):
        list_input_files([tmp_path / "empty"])


def test_binary_file_is_skipped_and_counted(tmp_path):
    f = tmp_path / "garbage.txt"
    f.write_bytes(bytes(range(256)) * 40)
    docs, stats = _docs(f)
    assert docs == [] and stats.skips == {"binary_files": 1} and stats.files == 0


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_file_stops_the_corpus_naming_the_conversion(tmp_path, codec):
    """Windows PowerShell's `>` (and Notepad's "Unicode") write UTF-16 with a byte order mark: its NUL bytes
    made the file a skipped "binary" one, so vocab train and pretrain prepare went on without it, saying only
    that a binary file was skipped. It stops them, naming the file and the conversion, which then reads."""
    from bertkit.text.vocab_training import VocabTrainingConfig, train_vocab_from_files

    text = "The whale surfaced. Ahab saw it.\n"
    f = tmp_path / "ps.txt"
    f.write_bytes(("\ufeff" if codec == "utf-16-be" else "").encode(codec) + text.encode(codec))
    (tmp_path / "other.txt").write_text("Plain text here.\n")
    for read in (lambda: _docs(f), lambda: train_vocab_from_files([tmp_path], VocabTrainingConfig(vocab_size=50))):
        with pytest.raises(BertkitError, match=rf"{f} is UTF-16 or UTF-32 text .*convert it to UTF-8 \(iconv "):
            read()
    f.write_text(f.read_bytes().decode(codec).lstrip("\ufeff"))  # converted, as the message says
    assert _docs(f)[0] == [["The whale surfaced.", "Ahab saw it."]]


def test_random_bytes_without_nul_are_binary(tmp_path):
    import random

    rng = random.Random(0)
    f = tmp_path / "noise.txt"
    f.write_bytes(bytes(rng.randrange(1, 256) for _ in range(5000)))
    docs, stats = _docs(f)
    assert docs == [] and stats.skips == {"binary_files": 1}


def test_invalid_utf8_and_nul_lines_are_counted(tmp_path):
    f = tmp_path / "mixed.txt"
    # 700 clean lines first: a NUL in the sniffed head would (rightly) make it a binary file
    f.write_bytes(b"Good line here.\n" * 700 + b"Bad \xff\xfe bytes here.\nNUL \x00 line.\nLast line.\n")
    # the one rule for user text: a line that does not decode stops the reading, naming it and the fixes
    with pytest.raises(BertkitError, match=r"mixed\.txt line 701 is not utf-8 text \(bytes ff fe 20 62\): .*"
                       r"--encoding latin-1.*--encoding-errors replace"):
        _docs(f, documents="file", sentences="line")
    docs, stats = _docs(f, documents="file", sentences="line", errors="replace")  # asked for: repaired, counted
    sentences = docs[0]
    assert sentences[-2:] == ["Bad \ufffd\ufffd bytes here.", "Last line."]
    assert stats.skips == {"invalid_utf8_lines": 1, "binary_lines": 1}


def test_huge_line_is_cut_at_spaces_without_losing_words(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_mod, "MAX_LINE_BYTES", 64)
    words = [f"w{i}" for i in range(200)]
    f = tmp_path / "long.txt"
    f.write_text(" ".join(words) + "\nshort\n")
    docs, stats = _docs(f, documents="blank-line", sentences="line")
    pieces = docs[0]
    assert all(len(p.encode()) <= 64 for p in pieces)
    assert " ".join(pieces).split() == words + ["short"]
    assert stats.skips["long_lines_cut"] == len(pieces) - 2


def test_huge_line_without_spaces_never_splits_a_character(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_mod, "MAX_LINE_BYTES", 10)
    text = "é" * 25  # 2 bytes each: a cut at an odd byte would break one
    f = tmp_path / "accents.txt"
    f.write_text(text + "\n")
    docs, stats = _docs(f, documents="blank-line", sentences="line")
    assert "".join(docs[0]) == text and "invalid_utf8_lines" not in stats.skips


def test_last_line_without_newline_is_not_counted_as_cut(tmp_path):
    f = tmp_path / "tail.txt"
    f.write_text("One. Two")
    docs, stats = _docs(f)
    assert docs == [["One.", "Two"]] and not stats.skips


@pytest.mark.parametrize("gz", [False, True])
def test_a_classic_mac_file_reads_as_its_lf_copy(tmp_path, monkeypatch, gz):
    """A file whose lines end in CR alone (classic Mac OS) was one line to the reader: no paragraph or document
    found, and in "line" mode the whole file was one sentence cut at 1 MiB. Its lines now end at each lone CR,
    as Python's universal newlines end them; LF, CRLF and CR CR LF files read as before (the reference here:
    the same text written with LF), and a line stays at most MAX_LINE_BYTES."""
    monkeypatch.setattr(corpus_mod, "MAX_LINE_BYTES", 64)
    text = "".join(f"Line {i} of doc {i // 7}.\n" + ("\n" if i % 7 == 6 else "") for i in range(2000))
    text += " ".join(f"w{i}" for i in range(60)) + "\nlast"  # an over-long line, and no line end at the end
    write = (lambda p, b: p.write_bytes(gzip.compress(b))) if gz else (lambda p, b: p.write_bytes(b))
    want = None
    for name, eol in [("lf", "\n"), ("cr", "\r"), ("crlf", "\r\n"), ("crcrlf", "\r\r\n")]:
        write(tmp_path / name, text.replace("\n", eol).encode())
        got = [_docs(tmp_path / name, documents=d, sentences="line") for d in ("blank-line", "file")]
        got = [(docs, stats.skips, stats.documents) for docs, stats in got]
        want = want or got
        assert got == want, name
    assert len(want[0][0]) == 2000 // 7 + 1 and all(len(s.encode()) <= 64 for s in want[1][0][0])
