"""The raw corpus: files and folders of plain text read into documents of sentences.

google-research/bert `create_pretraining_data.py` reads "one sentence per line,
blank lines between documents"; books and web text rather come as hard-wrapped
paragraphs. Two independent choices cover both:

- `documents`: "blank-line" (the original format: a blank line ends a document)
  or "file" (each file is one document, e.g. one book; blank lines only end
  paragraphs);
- `sentences`: "split" (the lines of a paragraph are joined and cut by
  `sentences.split_sentences`) or "line" (each line is already a sentence).

Input: the files `corpus_files` finds (folders are searched
recursively for `*.txt` and `*.gz`; a file named explicitly is read whatever
its name); gzip is recognised by its magic bytes. Lines end in LF or CRLF, or in a
lone CR in a file whose head has no LF (classic Mac OS, `_ClassicMac`). Output: an iterator of documents, each a list of
sentence strings.

Nothing is silently lost: every repair and skip is counted in a `CorpusStats`
(binary files, lines with NUL bytes, invalid UTF-8, over-long lines,
paragraphs or documents that were cut, a file whose reading broke off: an I/O
error, a corrupt gzip), and the prepare summary prints them. A file the user may
not read (no read permission) is no damage to skip: it stops the command, named.

Encoding: files are UTF-8 unless `encoding` says otherwise (latin-1, cp1252,
...; any codec in which a newline is the byte 0x0A). The rule is the one every
user file follows (`bertkit.data.textfiles`): a line that does not decode stops
the command with one line naming the file, the line, the bytes and the fixes
(`not_decodable`): `--encoding` for a file in another encoding, or
`--encoding-errors replace` (`errors="replace"`) for a crawl with stray bad
bytes, which are then repaired (U+FFFD) and counted; even so, a file where
most lines do not decode is in another encoding, not damaged, and stops the
command rather than losing every accented letter to repairs; and a file that is
UTF-8 text read with another `encoding` (a corpus mixing encodings) stops it, named,
as does a line that latin-1 (or another ISO 8859 encoding) reads with C1 control
characters: Windows (cp1252) text, whose quotes and dashes would be lost.
Memory stays bounded whatever the input: lines are read at most
`MAX_LINE_BYTES` at a time, paragraphs and documents are flushed at a cap.
"""

from __future__ import annotations

import codecs
import gzip
import io
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bertkit.errors import BertkitError
from bertkit.data.sentences import split_sentences
from bertkit.data.textfiles import (binary_bytes, hidden_in, not_decodable, tokenizer_vocab, utf8_read_as,
                                   wrong_encoding)

DOCUMENT_MODES = ("blank-line", "file")
ENCODING_ERRORS = ("strict", "replace")  # what a line that does not decode does: stop the command, or get repaired
SENTENCE_MODES = ("split", "line")
CORPUS_SUFFIXES = (".txt", ".gz")  # what `corpus_files` finds inside a folder

MAX_LINE_BYTES = 1 << 20  # a longer line is cut at a space into pieces of at most this
MAX_PARAGRAPH_CHARS = 1 << 20  # a longer paragraph is split and flushed in parts
MAX_DOCUMENT_SENTENCES = 200_000  # a longer document is cut into several
BINARY_SNIFF_BYTES = 8192

# reason -> what the summary says about it
SKIP_REASONS = {
    "binary_files": "files skipped: binary (NUL bytes or mostly non-text bytes)",
    "unreadable_files": "files skipped: unreadable (I/O error or corrupt gzip, read up to the error)",
    "binary_lines": "lines dropped: contained NUL bytes (binary garbage)",
    "invalid_utf8_lines": "lines repaired: invalid UTF-8 bytes (or invalid in the --encoding) replaced, then "
                          "dropped by the tokenizer",
    "long_lines_cut": "over-long lines cut at a space into pieces of at most 1 MiB",
    "long_paragraphs_cut": "over-long paragraphs split and flushed in parts",
    "long_documents_cut": f"documents of more than {MAX_DOCUMENT_SENTENCES:,} sentences cut into several",
    "empty_sentences": "sentences dropped: no tokens after tokenisation (only control characters)",
    "empty_documents": "documents dropped: no sentence with a token",
    "unusable_documents": "documents that gave no instance (too short for the objective)",
}


@dataclass
class CorpusStats:
    """Counts from reading (and later tokenising) a corpus; `skips` maps a SKIP_REASONS key to a count."""

    files: int = 0
    bytes: int = 0
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    skips: dict = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        assert reason in SKIP_REASONS, reason
        self.skips[reason] = self.skips.get(reason, 0) + n

    def merge(self, other: "CorpusStats") -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.documents += other.documents
        self.sentences += other.sentences
        self.tokens += other.tokens
        for k, v in other.skips.items():
            self.skip(k, v)

    def to_dict(self) -> dict:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "documents": self.documents,
            "sentences": self.sentences,
            "tokens": self.tokens,
            "skips": dict(sorted(self.skips.items())),
        }

    def describe_skips(self) -> str:
        """What was skipped or repaired, in one line ("" when nothing was)."""
        return "; ".join(f"{SKIP_REASONS[k]}: {v}" for k, v in sorted(self.skips.items()))

    @classmethod
    def from_dict(cls, d: dict) -> "CorpusStats":
        return cls(d["files"], d["bytes"], d["documents"], d["sentences"], d["tokens"], dict(d["skips"]))


def corpus_files(paths, skip=()) -> list[Path]:
    """Files named directly and the .txt/.gz files inside folders (recursive): sorted, de-duplicated.

    Hidden files (".name") and hidden folders inside folders are skipped, and so is a tokenizer's vocab.txt
    (`tokenizer_vocab`); a file named explicitly
    is read whatever its name. `skip`: the command's own files (folders or files: what it
    writes, the vocabulary it reads), never read from a folder: an output inside the corpus
    folder (its vocab.txt) would be read as text the next time, and a re-run would no longer
    give the same result.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    mine = [Path(s).resolve() for s in skip if s is not None]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*")
                if f.is_file() and f.suffix in CORPUS_SUFFIXES
                # hidden files and the files of hidden folders (.ipynb_checkpoints holds a copy of every text file
                # Jupyter edited: read, each line counted twice); a hidden folder named as the corpus is read
                and not hidden_in(f, p)
                and not tokenizer_vocab(f)
                and not any(f.resolve() == m or m in f.resolve().parents for m in mine)
            )
            if not found:
                raise BertkitError(
                    f"folder {p} holds no .txt files (nor .gz); put the corpus in *.txt files or name the files"
                )
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise BertkitError(f"corpus path not found: {p}")
    seen, out = set(), []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise BertkitError("no corpus files given; pass text files or folders of .txt files")
    return out


def check_encoding(name: str) -> str:
    """`name` if it is a text encoding a corpus can be read in line by line, else a BertkitError."""
    try:
        codec = codecs.lookup(name)
        newline = "\n".encode(codec.name)
    except (LookupError, TypeError):  # TypeError: a bytes-to-bytes codec (base64, zlib), not a text encoding
        raise BertkitError(f"unknown --encoding {name!r}: name a text encoding, e.g. utf-8, latin-1, cp1252") from None
    if newline != b"\n":
        raise BertkitError(f"--encoding {name}: corpora are read line by line, and in {codec.name} a newline is "
                           "not the byte 0x0A; convert the files to UTF-8 (iconv -t utf-8)")
    return name


def check_encoding_errors(errors: str) -> str:
    """`errors` if it is one of ENCODING_ERRORS (what a line that does not decode does), else a BertkitError."""
    if errors not in ENCODING_ERRORS:
        raise BertkitError(f"unknown --encoding-errors {errors!r}: choose one of {', '.join(ENCODING_ERRORS)}")
    return errors


# the byte order marks of UTF-32 and UTF-16 (Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16 LE)
UTF16_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff", b"\xff\xfe", b"\xfe\xff")


def wide_encoding(path: Path) -> BertkitError:
    """The one-line error for a corpus file in UTF-16 or UTF-32: its NUL bytes made it a skipped "binary" file,
    dropped from the corpus (the summary said so, not why); no --encoding reads it, since a corpus is read line
    by line at the byte 0x0A (`check_encoding`)."""
    return BertkitError(f"{path} is UTF-16 or UTF-32 text (it starts with their byte order mark), which corpora "
                        f"are not read in: convert it to UTF-8 (iconv -f utf-16 -t utf-8 {path} > NEW.txt)")


def _open_binary(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


_LONE_CR = re.compile(rb"\r(?!\n)")


class _ClassicMac(io.RawIOBase):
    """A binary stream whose lone CRs read as LF: a classic Mac OS file (lines end in CR alone) was one line to
    the reader, no paragraph or document found. Same length (the byte counts hold), and a CRLF stays CRLF; a CR
    that ends a read waits for the next byte, which may be its LF. Used only for a file whose head has a CR and
    no LF (`read_lines`): LF and CRLF files read byte for byte as before, and so do CR CR LF files (a CRLF file
    converted twice) and stray CRs in LF text, which as lone CRs would become blank lines or line breaks."""

    def __init__(self, f):
        self._f, self._held = f, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._held + self._f.read(len(b) - len(self._held))
        self._held = b""
        if len(data) > 1 and data.endswith(b"\r"):
            data, self._held = data[:-1], b"\r"
        data = _LONE_CR.sub(b"\n", data)
        b[:len(data)] = data
        return len(data)


def text_size(path) -> int:
    """About how many bytes `read_lines` reads from a file (what a progress bar counts to): its size, or for gzip
    the size its trailer records (exact for one member under 4 GiB; the size on disk when that is larger)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 18 or f.read(2) != b"\x1f\x8b":
            return size
        f.seek(-4, 2)
        return max(size, int.from_bytes(f.read(4), "little"))


def _raw_lines(f, stats: CorpusStats) -> Iterator[bytes]:
    """Lines of a binary stream, each at most MAX_LINE_BYTES (cut at a space, counted)."""
    carry = b""
    while True:
        want = MAX_LINE_BYTES - len(carry)
        chunk = f.readline(want)
        if not chunk and not carry:
            return
        line = carry + chunk
        carry = b""
        if line.endswith(b"\n") or len(chunk) < want:  # a whole line, or the file's last one
            yield line
            continue
        # The line goes on: cut at the last space so no word is split, or else
        # before the last character, which may be incomplete UTF-8.
        stats.skip("long_lines_cut")
        cut = line.rfind(b" ")
        if cut > 0:
            yield line[:cut] + b"\n"
            carry = line[cut + 1:]
            continue
        cut = len(line) - 1
        while cut > 0 and (line[cut] & 0xC0) == 0x80:
            cut -= 1
        cut = cut or len(line)
        yield line[:cut] + b"\n"
        carry = line[cut:]


# Non-ASCII bytes, all in valid UTF-8, that make a file read with another --encoding UTF-8 text (two accented
# letters): text in latin-1 or cp1252 is almost never valid UTF-8 (an accent before an ASCII byte is not); in a
# double-byte encoding (GBK, Shift-JIS) a character is by chance for about 1 in 12, and the first line that is
# not valid UTF-8 ends the search (a Chinese line of 10 characters is all valid for 1 in 10^10)
UTF8_EVIDENCE_BYTES = 4


# U+0080..U+009F: what latin-1 (and the other ISO 8859 encodings) make of the bytes 0x80..0x9F, control characters
# no text holds, and which the tokenizer drops. In Windows' cp1252 those bytes are ’ “ ” – — … €: a cp1252 file read
# as latin-1 (the first encoding the errors name) lost them without a word, and "don’t" read as "dont", "end—start"
# as one word "endstart".
_C1_CONTROLS = re.compile("[\x80-\x9f]")


def windows_text(path, encoding: str, line: int, char: str) -> BertkitError:
    """The one-line error for a corpus line whose `encoding` reading holds a C1 control character `char`."""
    return BertkitError(f"{path} line {line} has the byte {ord(char):02x}, an invisible control character in "
                        f"{encoding} (the tokenizer drops it) but a quote, dash or other sign in Windows text: the "
                        "file is likely cp1252; pass --encoding cp1252")


def _utf8_bytes(raw: bytes, seen: int) -> int | None:
    """`seen` plus the non-ASCII bytes of `raw` if it is valid UTF-8, else None (the file is not UTF-8).

    A corpus that mixes encodings, read with --encoding latin-1 (as the error on its first latin-1 line
    advises), read its UTF-8 files too, without an error: every accented letter became two ('café' the
    token 'cafÃ©'). Such a file is found at its first lines and stops the command (`utf8_read_as`)."""
    if raw.isascii():
        return seen
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return seen + len(raw) - len(raw.translate(None, bytes(range(0x80, 0x100))))


def read_lines(path, stats: CorpusStats, encoding: str = "utf-8", errors: str = "strict") -> Iterator[str]:
    """Decoded text lines of one file (without the newline); binary files yield nothing.

    A line that does not decode is a BertkitError naming the file, the line and the fixes
    (errors "strict"), or is repaired and counted (errors "replace"); when such lines are most
    of the file's, the file is in another encoding and the end of it raises a BertkitError that
    says so (see the module docstring).
    """
    check_encoding_errors(errors)
    path = Path(path)
    lines = bad = 0
    first_bad = None  # (line number, the bytes that did not decode)
    # non-ASCII bytes seen so far in lines that are valid UTF-8, while no line is not (None: not looked for)
    utf8 = 0 if not codecs.lookup(encoding).name.startswith("utf-8") else None
    other = utf8 is not None  # an encoding other than UTF-8, whose C1 controls are looked for (`_C1_CONTROLS`)
    try:
        with _open_binary(path) as f:
            head = f.peek(BINARY_SNIFF_BYTES)[:BINARY_SNIFF_BYTES] if hasattr(f, "peek") else b""
            # bytes that only fail to decode are text in another encoding: counted line by line below
            if head.startswith(UTF16_BOMS):
                raise wide_encoding(path)
            if binary_bytes(head):
                stats.skip("binary_files")
                return
            stats.files += 1
            if b"\r" in head and b"\n" not in head:  # classic Mac line ends (`_ClassicMac`)
                f = io.BufferedReader(_ClassicMac(f))
            for number, raw in enumerate(_raw_lines(f, stats), 1):
                stats.bytes += len(raw)
                if b"\x00" in raw:
                    stats.skip("binary_lines")
                    continue
                if utf8 is not None:
                    utf8 = _utf8_bytes(raw, utf8)
                    if utf8 is not None and utf8 >= UTF8_EVIDENCE_BYTES:
                        raise utf8_read_as(path, encoding)
                try:
                    line = raw.decode(encoding)
                except UnicodeDecodeError as err:
                    if errors == "strict":
                        raise not_decodable(path, encoding, number, raw[err.start:err.start + 4]) from None
                    stats.skip("invalid_utf8_lines")
                    bad += 1
                    first_bad = first_bad or (number, raw[err.start:err.start + 4])
                    line = raw.decode(encoding, errors="replace")
                if other and (c1 := _C1_CONTROLS.search(line)):
                    raise windows_text(path, encoding, number, c1.group())
                lines += bool(line.strip())
                yield line.rstrip("\r\n")
    except PermissionError:  # a file the user may not read stops the command as any input does: they can fix it
        raise                # (it was skipped as "unreadable (I/O error or corrupt gzip)" and the run went on without it)
    except (OSError, EOFError, zlib.error):
        stats.skip("unreadable_files")
        return
    if bad * 2 > lines:
        raise wrong_encoding(path, encoding, bad, lines, *first_bad)


def iter_documents(path, stats: CorpusStats, documents: str = "blank-line", sentences: str = "split",
                   encoding: str = "utf-8", errors: str = "strict") -> Iterator[list[str]]:
    """Documents (lists of sentence strings) of one file; see the module docstring."""
    if documents not in DOCUMENT_MODES:
        raise BertkitError(f"unknown document mode {documents!r}; choose one of {', '.join(DOCUMENT_MODES)}")
    if sentences not in SENTENCE_MODES:
        raise BertkitError(f"unknown sentence mode {sentences!r}; choose one of {', '.join(SENTENCE_MODES)}")
    doc: list[str] = []
    para: list[str] = []
    para_chars = 0

    def flush_paragraph(final: bool) -> None:
        nonlocal para, para_chars
        if not para:
            return
        if sentences == "line":
            doc.extend(para)
            para, para_chars = [], 0
            return
        sents = split_sentences(" ".join(para))
        if final or len(sents) < 2:
            doc.extend(sents)
            para, para_chars = [], 0
        else:
            # A huge paragraph flushed early: keep its unfinished last sentence.
            doc.extend(sents[:-1])
            para, para_chars = [sents[-1]], len(sents[-1])

    for line in read_lines(path, stats, encoding, errors):
        stripped = line.strip()
        if not stripped:
            flush_paragraph(final=True)
            if documents == "blank-line" and doc:
                yield doc
                doc = []
            continue
        para.append(stripped)
        para_chars += len(stripped)
        if sentences == "line" or para_chars > MAX_PARAGRAPH_CHARS:
            if sentences == "split":
                stats.skip("long_paragraphs_cut")
            flush_paragraph(final=False)
        if len(doc) >= MAX_DOCUMENT_SENTENCES:
            stats.skip("long_documents_cut")
            yield doc
            doc = []
    flush_paragraph(final=True)
    if doc:
        yield doc
