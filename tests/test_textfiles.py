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
    assert [p.name for p in corpus_files([tmp_path])] == ["a.txt", "b.txt.gz"]
    tokens = train_vocab_from_files([tmp_path], VocabTrainingConfig(vocab_size=200, min_frequency=1))
    assert "quokka" in tokens and "zebra" in tokens  # the .gz file was read, decompressed
