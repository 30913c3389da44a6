"""User text files: finding them, opening them, and saying plainly when they are not text.

Every command that reads a file a user wrote goes through here, so that a wrong file gets the same one-line
answer everywhere (the CLI prints a BertkitError and exits with status 2): a missing path, a directory where a
file belongs, or bytes that are not UTF-8, named by file and byte offset.

Two kinds of input, two policies:

- record files (what `embed`, `predict` and `finetune` read; vocab.txt; tokenizer_config.json) hold one text,
  label or token per line, so every byte counts: the file must be UTF-8, and the first byte that does not
  decode stops the command (`open_text`, `read_text`). Guessing another encoding would silently change labels
  and tokens.
- corpora (`vocab train`, `pretrain prepare`): files and folders found by
  `bertkit.data.corpus.corpus_files` (.txt and .gz, recursively; a file named explicitly
  is read whatever its name), decoded by `bertkit.data.corpus.read_lines`, which
  skips binary files and repairs stray invalid bytes, counting both for the
  summary. A line that does not decode stops them as it stops the record
  readers, naming the file, the line and the fixes (`not_decodable`):
  `--encoding` for a file in another encoding, or `--encoding-errors replace`
  to repair stray bytes (a web crawl with one bad byte in ten gigabytes), which are then counted. A corpus with
  no text left is an error, and so, even with repairs, is a file where most lines do not decode: it is in
  another encoding, which `--encoding` names (`bertkit.data.corpus.check_encoding`, `wrong_encoding`).

Record files come as plain text (one record per line), JSONL (`json_objects`: one JSON
object per line, the line named when it is not one), TSV or CSV with a header; `read_texts`
streams the texts of any of these without loading the file (what `bertkit embed` reads).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import zlib
from array import array
from bisect import bisect_right
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from pathlib import Path

from bertkit.errors import BertkitError

_SCAN_BLOCK = 1 << 20


def existing_file(path, what: str = "input file") -> Path:
    """`path` as a Path, or a BertkitError saying that it is missing or a directory."""
    path = Path(path)
    if path.is_dir():
        raise BertkitError(f"{what} {path} is a directory; pass a file")
    if path.exists() and not path.is_file():  # a pipe: <(command), /dev/stdin; it said "does not exist"
        raise BertkitError(f"{what} {path} is a pipe, not a file: this reader reads its input more than once; write "
                           "it to a file first")
    if not path.is_file():
        raise BertkitError(f"{what} {path} does not exist")
    return path


def hidden_in(f: Path, folder: Path) -> bool:
    """Whether `f`, found inside `folder`, is a hidden file (".name") or in a hidden folder below it: skipped by
    every folder reader (a folder opened in Jupyter holds .ipynb_checkpoints/NAME-checkpoint.txt, a copy of each
    text file edited there). A hidden folder named as the input itself is read."""
    return any(part.startswith(".") for part in f.relative_to(folder).parts)


def tokenizer_vocab(f: Path) -> bool:
    """A vocab.txt beside a tokenizer_config.json or config.json, which every folder reader skips: a vocabulary or
    model folder left in the corpus (`vocab train -o corpus/v1`, a model save), whose tokens were read as text
    ("cls", "##ing" counted into the next vocabulary; a search found them). A vocab.txt alone is a text."""
    return f.name == "vocab.txt" and any((f.parent / n).is_file() for n in ("tokenizer_config.json", "config.json"))


def binary_bytes(head: bytes) -> bool:
    """NUL bytes or >10% control bytes in the first bytes: binary in any ASCII-based encoding."""
    if b"\x00" in head:
        return True
    text_bytes = bytes(range(32, 127)) + b"\t\n\r\f\b" + bytes(range(128, 256))
    return len(head.translate(None, text_bytes)) > 0.1 * len(head)


def looks_binary(head: bytes) -> bool:
    """`binary_bytes`, or >10% invalid UTF-8 in the first bytes (like `file`)."""
    if not head:
        return False
    if binary_bytes(head):
        return True
    decoded = head.decode("utf-8", errors="replace")
    return decoded.count("\ufffd") > 0.1 * len(decoded)


def wrong_encoding(path, encoding: str, bad: int, lines: int, line: int, sample: bytes) -> BertkitError:
    """The one-line error for a corpus file most of whose lines do not decode in `encoding`."""
    fix = ("pass its encoding, e.g. --encoding latin-1 (or cp1252, as Windows writes Western European text)"
           if codecs.lookup(encoding).name == "utf-8" else "pass the encoding it is written in with --encoding")
    return BertkitError(
        f"{path} is not {encoding} text: {bad:,} of its {lines:,} lines do not decode (line {line}: bytes "
        f"{sample.hex(' ')}); {fix}, or convert it to UTF-8 (iconv -f latin1 -t utf-8)"
    )


def utf8_read_as(path, encoding: str) -> BertkitError:
    """The one-line error for a corpus file that is UTF-8 text, read with another --encoding (`corpus.read_lines`)."""
    return BertkitError(
        f"{path} is UTF-8 text, not {encoding}: read as {encoding} each of its accented letters would become other "
        f"characters (in latin-1, 'é' as 'Ã©'); if the corpus mixes encodings, convert the {encoding} files to UTF-8 (iconv -f {encoding} "
        "-t utf-8) and leave out --encoding"
    )


def not_decodable(path, encoding: str, line: int, sample: bytes) -> BertkitError:
    """The one-line error for a corpus line that does not decode in `encoding` (the strict rule)."""
    other = "e.g. --encoding latin-1 (or cp1252)" if codecs.lookup(encoding).name == "utf-8" else "with --encoding"
    return BertkitError(
        f"{path} line {line} is not {encoding} text (bytes {sample.hex(' ')}): if the file is in another encoding, "
        f"name it, {other}; to repair stray bad bytes and go on, pass --encoding-errors replace (they are counted)"
    )


def first_invalid_utf8(path) -> tuple[int, str] | None:
    """(byte offset, reason) of the first byte of `path` that is not UTF-8, or None if all decode."""
    offset, pending = 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_SCAN_BLOCK)
            data = pending + block
            try:
                data.decode("utf-8")
                offset, pending = offset + len(data), b""
            except UnicodeDecodeError as err:
                # a character cut by the block boundary is completed by the next block
                if block and err.reason == "unexpected end of data" and len(data) - err.start < 4:
                    offset, pending = offset + err.start, data[err.start:]
                else:
                    return offset + err.start, err.reason
            if not block:
                return None


def not_utf8(path) -> BertkitError | None:
    """The one-line error for a file that is not UTF-8 text (None when it is)."""
    found = first_invalid_utf8(path)
    if found is None:
        return None
    offset, reason = found
    with open(path, "rb") as f:
        head = f.read(8192)
        f.seek(offset)
        bad = f.read(4)
    kind = " (it looks like a binary file)" if looks_binary(head) else ""
    return BertkitError(
        f"{path} is not UTF-8 text{kind}: the bytes at offset {offset} ({bad.hex(' ')}) are not UTF-8 ({reason}); "
        "pass a UTF-8 text file (convert one in another encoding, e.g. `iconv -f latin1 -t utf-8`)"
    )


@contextmanager
def open_text(path, what: str = "input file", newline: str | None = None):
    """Open a user's text file for reading as UTF-8 (a leading byte order mark dropped; a gzip file unpacked, told
    by its first bytes, peeked in the one opening that is read: a save replacing the file meanwhile cannot mix two);
    a byte that does not decode is a BertkitError. The error is raised wherever the caller's reading hits the bad
    byte, and names the file and the byte's offset in it (a rescan: the decoder only knows its place in a buffer).
    """
    path = existing_file(path, what)
    with open(path, "rb") as raw:
        gz = raw.peek(2)[:2] == b"\x1f\x8b"  # gzip by its magic bytes, whatever the name (BEIR's HF copies: .jsonl.gz)
        try:  # utf-8-sig: a byte order mark (Windows tools, Excel's "CSV UTF-8") is not part of the first record
            with (gzip.open(raw, "rt", encoding="utf-8-sig", newline=newline) if gz
                  else io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline)) as f:
                yield f
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            if not gz:
                raise
            raise BertkitError(f"{path} is a damaged gzip file ({e}): download it again, or pass it unpacked") from None
        except UnicodeDecodeError:
            if gz:
                raise BertkitError(f"{path} unpacks to text that is not UTF-8: unpack it (gunzip) and convert it to "
                                   "UTF-8 (e.g. `iconv -f latin1 -t utf-8`)") from None
            err = not_utf8(path)
            if err is None:  # not this file's bytes: someone else's decoding failed
                raise
            raise err from None


def read_text(path, what: str = "input file") -> str:
    """The whole of a user's UTF-8 text file (see `open_text`)."""
    with open_text(path, what) as f:
        return f.read()


def stdin_lines(stream=None, name: str = "standard input"):
    """The lines of standard input (`stream`: a binary file, for tests; a pipe given by its path, `name`), without
    their newline, as a record file's: UTF-8 (a leading byte order mark dropped), the first line that does not
    decode a BertkitError naming it. Read as bytes, so the locale's encoding plays no part; a line ends where a
    file's does (`open_text`, Python's universal newlines): at "\n", "\r\n" or a lone "\r", never at U+2028
    and the other breaks only `str.splitlines` knows."""
    stream = sys.stdin.buffer if stream is None else stream
    for number, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise BertkitError(f"{name} line {number} is not UTF-8 (bytes {raw[err.start:err.start + 4].hex(' ')}): "
                               "pipe UTF-8 text (convert it, e.g. `iconv -f latin1 -t utf-8`)") from None
        line = line[:-1] if line.endswith("\n") else line
        line = line[:-1] if line.endswith("\r") else line  # a CRLF's, or a last line's lone CR
        yield from line.split("\r")  # bytes split at "\n" only: a lone CR inside ends a line too


def tsv_rows(lines, path, width: int, first: int = 2):
    """(line number, cells) for each non-blank line of a TSV text, numbered from `first` (2: after
    a header); a line with fewer than `width` cells (the header's) is a BertkitError naming it."""
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        cells = line.rstrip("\r\n").split("\t")
        if len(cells) < width:
            raise BertkitError(f"{path} line {number} has {len(cells)} columns, the header {width}")
        yield number, cells


def json_objects(lines, path, on_blank=None):
    """(line number, object) for each line of a JSONL text, numbered from 1: one JSON object per
    line, blank lines skipped (`on_blank()` is called for each); any other line is a BertkitError
    naming the file and line."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            if on_blank is not None:
                on_blank()
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertkitError(f"{path}:{number}: line {number} is not JSON ({err.msg}): JSONL needs one JSON "
                               "object per line") from None
        if not isinstance(row, dict):
            raise BertkitError(f"{path}:{number}: a JSON {type(row).__name__}, not an object: JSONL needs one "
                               "JSON object per line")
        yield number, row


def read_texts(path, column: str | None = None, on_blank=lambda: None) -> tuple:
    """(an iterator over the texts of a file, how many there are), without loading them all; the count's pass
    calls `on_blank()` for each blank record it leaves out (a line of whitespace; a CSV row of empty cells, never
    a blank line inside a quoted cell), so the rows are known to be the others.

    .txt (or anything else): one text per non-empty line (`column` is refused). .jsonl (and .json, read as
    JSON Lines): the "text" field (or `column`) of each line. .tsv, .csv: the column named `column` (default
    "sentence", else "text", else its one column of text: `_text_column`) under a header row (a .csv
    as the csv module reads it: quoted cells, commas and newlines inside them). The file must
    be UTF-8 (`bertkit.data.textfiles`); a malformed line is an error naming it.
    """
    told = [on_blank]  # during the count's pass only: the texts' pass leaves out the same records
    numbered = numbered_texts(path, column, lambda: told[0]())
    count = sum(1 for _ in numbered())
    told[0] = lambda: None
    return (text for _, text in numbered()), count


def text_line(path, position: int, column: str | None = None) -> str:
    """Where the text at `position` (from 0) of `read_texts(path, column)` is: "path:line", as a reader's
    error names a line (read again: only an error about one text asks)."""
    number = next(n for i, (n, _) in enumerate(numbered_texts(path, column)()) if i == position)
    return f"{'standard input' if str(path) == STDIN else path}:{number}"


def csv_records(f, path):
    """(the line its record starts on, its fields) per record of a CSV file opened with newline="": a quoted
    field may hold newlines (a record then spans lines, so its number is not the reader's line) and be one
    long text; a record the csv module cannot read is a BertkitError naming its line."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # a long text is one long field
    reader, last = csv.reader(f), 0
    try:
        for fields in reader:
            yield last + 1, fields
            last = reader.line_num
    except csv.Error as err:
        raise BertkitError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None


def _text_column(path, header: list, column: str | None, first: list) -> tuple:
    """(index, name, header) of a table's text column: `column`, else `text_column_in`'s. The first column was taken
    whatever it held: a captions table's image ids, an STS-B file's sentence1 alone (sentence2 never read)."""
    name = column or text_column_in(path, header, first, "--column (embed)")
    if name not in header:
        raise BertkitError(f"{path} has no column {name!r}; its columns are {', '.join(header)}")
    return header.index(name), name, header


def text_column_in(path, header: list, first: list, flag: str, labels=()) -> str:
    """The column of a table's texts when none is named: "sentence", else "text", else its one column of text
    (`holds_words` in the `first` row's cells, a 'label' or 'labels' column and `labels` aside; a table of one
    column: that one). Several or none are refused in one line naming the columns and `flag`, the option that
    names one. embed's rule for a table (`_text_column`) and predict's (`bertkit.data.tables.text_column_of`):
    they said one refusal in two wordings."""
    name = next((c for c in ("sentence", "text") if c in header), None)
    if name is not None:
        return name
    skip = {"label", "labels", *labels}
    texts = list(header) if len(header) == 1 else [c for c, v in zip(header, first) if c not in skip and holds_words(v)]
    if len(texts) != 1:
        what = f"several columns of text ({', '.join(map(repr, texts))})" if texts else "no column of text"
        raise BertkitError(f"{path} has {what} and none named 'sentence' or 'text' (its columns: "
                           f"{', '.join(header)}): name the one to read with {flag}, or head it 'text'")
    return texts[0]


def holds_words(value) -> bool:
    """Whether a table's cell holds text, not a number (an id, a score, a label)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return isinstance(value, str) and bool(value.strip())
    return False


def numbered_texts(path, column: str | None = None, on_blank=lambda: None):
    """A function giving a new iterator over (line number from 1, text) of the file `read_texts` reads
    ("-": standard input, one text per line, as a .txt); `on_blank()` is called for each blank record it
    leaves out."""
    if str(path) == STDIN or _pipe(path):  # a pipe (<(command), /dev/stdin) is read once, as standard input
        if column is not None:
            raise BertkitError(f"{'standard input' if str(path) == STDIN else path} is read one text per line: "
                               "--column applies to .tsv, .csv and .jsonl files")
        return _text_lines(lambda: enumerate(_read_once(sys.stdin if str(path) == STDIN else path), 1), on_blank)
    path = existing_file(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _csv_texts(path, column, on_blank)
    if suffix == ".tsv":
        return _tsv_texts(path, column, on_blank)
    if suffix in (".jsonl", ".json"):  # .json: JSON Lines too (datasets' to_json), not plain text (one raw JSON text)
        key = column or "text"
        single = ("" if suffix == ".jsonl" else " (a .json file is read as JSON Lines, one object per line; a single "
                  "JSON document such as SQuAD's holds no list of texts)")

        def lines():
            with open_text(path) as f:
                for number, record in json_objects(f, path, on_blank):
                    if key not in record:
                        raise BertkitError(f"{path}:{number}: no field {key!r} in this line's object: set "
                                           f"--column{single}")
                    yield number, record[key]

        return lines
    if column is not None:  # was silently ignored
        raise BertkitError(f"{path} is read one text per line: --column applies to .tsv, .csv and .jsonl files")

    def numbered_lines():
        with open_text(path) as f:
            yield from enumerate(f, 1)

    return _text_lines(numbered_lines, on_blank)


STDIN = "-"  # the input name that means standard input, as `bertkit tokenize -` reads it


def file_identity(path) -> dict:
    """A file's size and SHA-256, read a block at a time: what an interrupted `bertkit embed` records of its input,
    so that --resume refuses a file that changed since (a line mended, added or removed shifts every row after)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return {"bytes": os.path.getsize(path), "sha256": digest.hexdigest()}


def reads_once(path) -> bool:
    """Whether `path` is standard input ("-") or a pipe, which give their lines once (`OnePass`)."""
    return str(path) == STDIN or _pipe(path)


class OnePass:
    """The texts of standard input or a pipe (`reads_once`), one per line, read once as they stream. What a
    file's readers learn by reading it again (how many blank lines, the line of text i) is counted as the lines
    pass, so nothing is held but each blank line's place: `bertkit embed -` held every line (`_read_once`), to
    count them first, and made no vector before the pipe closed."""

    def __init__(self, path, column: str | None = None):
        self.name = "standard input" if str(path) == STDIN else str(path)
        if column is not None:
            raise BertkitError(f"{self.name} is read one text per line: --column applies to .tsv, .csv and .jsonl "
                               "files")
        self.blank, self._before_blank = 0, array("q")  # per blank line: how many texts came before it
        self._texts = self._stream(path)
        self.first = next(self._texts, None)  # read now: an input without texts is refused before a model loads

    def __iter__(self):
        if self.first is not None:
            yield self.first
            yield from self._texts

    def _stream(self, path):
        texts = 0
        with nullcontext(sys.stdin.buffer) if str(path) == STDIN else open(path, "rb") as f:
            for line in stdin_lines(f, self.name):
                if line.strip():
                    texts += 1
                    yield line
                else:
                    self.blank += 1
                    self._before_blank.append(texts)

    def line(self, position: int) -> str:
        """"NAME:LINE" of the text at `position` (from 0), as `text_line` names a file's."""
        return f"{self.name}:{position + 1 + bisect_right(self._before_blank, position)}"


@lru_cache(maxsize=4)
def _read_once(source) -> tuple:
    """The lines of a pipe, read once, as standard input's (`stdin_lines`): the texts' readers read their input
    more than once (to count it, to name a line), and a pipe gives its lines once. `source`: standard input's
    stream (sys.stdin; a test's own is read afresh), or the path of a pipe (`_pipe`)."""
    if not isinstance(source, (str, os.PathLike)):
        return tuple(stdin_lines(source.buffer))
    with open(source, "rb") as f:
        return tuple(stdin_lines(f, str(source)))  # an error names the pipe the user gave, not standard input


def _pipe(path) -> bool:
    """Whether `path` names a pipe (a FIFO, what a shell's <(command) or /dev/stdin gives), not a file."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _text_lines(numbered_lines, on_blank):
    """`numbered_texts` of one text per line: numbered_lines() gives (number, line); a blank line is left out."""

    def lines():
        for number, line in numbered_lines():
            if not line.strip():
                on_blank()
            else:
                yield number, line.rstrip("\r\n")

    return lines


def _csv_texts(path: Path, column: str | None, on_blank):
    """`numbered_texts` of a .csv: quoted cells may hold commas and newlines, which the csv module reads."""
    with open_text(path, newline="") as f:
        records = csv_records(f, path)
        header = next(records, (1, [""]))[1]
        first = next((cells for _, cells in records if any(c.strip() for c in cells)), [])
        col, name, header = _text_column(path, header, column, first)

    def lines():
        with open_text(path, newline="") as f:
            records = csv_records(f, path)
            next(records, None)
            for number, cells in records:
                if not any(cell.strip() for cell in cells):
                    on_blank()
                    continue
                if col >= len(cells):
                    raise BertkitError(f"{path}:{number}: {len(cells)} field(s), no {name!r} "
                                       f"column (the header has {len(header)})")
                yield number, cells[col]

    return lines


def _tsv_texts(path: Path, column: str | None, on_blank):
    """`numbered_texts` of a .tsv: a header, then one row per line, cells split at tabs (no quoting)."""
    with open_text(path) as f:
        header = f.readline().rstrip("\r\n").split("\t")
        first = next((line.rstrip("\r\n").split("\t") for line in f if line.strip()), [])
    if column is None and len(header) == 1 and header[0].lstrip().startswith("{"):  # its JSON lines were the texts
        raise BertkitError(f"{path} holds JSON lines, not a TSV table (its first line is a JSON object): "
                           "name it .jsonl, or give the TSV a tab-separated header")
    col, name, header = _text_column(path, header, column, first)

    def lines():
        with open_text(path) as f:
            f.readline()
            for number, line in enumerate(f, 2):
                if not line.strip():
                    on_blank()
                    continue
                fields = line.rstrip("\r\n").split("\t")
                if col >= len(fields):
                    raise BertkitError(f"{path}:{number}: {len(fields)} field(s), no {name!r} column "
                                       f"(the header has {len(header)})")
                yield number, fields[col]

    return lines
