"""Reading labelled examples: TSV/CSV/JSONL tables, CoNLL columns, lines (SQuAD JSON: `bertkit.data.squad`).

Tables have a header row (JSONL: one object per line) and the caller names the columns (`text_column`,
`text_pair_column`, `label_column`). TSV is read with no quoting, the GLUE convention: a field never holds a tab or
newline but may hold a literal `"`. CSV uses standard quoting.

Rows that cannot be used (an empty line or text, a missing label, a TSV line with the wrong number of fields) are
skipped and *counted by reason*; the caller prints the counts, so nothing is dropped silently. A multi-label
row's empty label cell (or JSON null) is no missing label but the empty set, a text with none of the labels
(transformers' all-zero multi-hot target), which the model has to learn too. A missing column, an unparsable score,
an unknown label in the dev set or a CoNLL line without its tag is an error instead, because no count would make the
result right. A column is found by its name regardless of case when only one matches ("Sentence", "LABEL"); a class
label written as a whole-number float ("1.0", pandas' float column) is that number's class ("1").

Outputs are plain dataclasses: `TextExample`, `TaggedSentence`, `QAExample`; what a fine-tuned model's reader
(`bertkit.tasks.registry`) gives `bertkit predict`: `Inputs`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bertkit.errors import BertkitError, read_score
from bertkit.data.textfiles import csv_records, existing_file, json_objects, open_text, read_text, text_column_in

# a pairs table's group column (`bertkit mine` writes it, `bertkit finetune embed` reads it): rows of one group
# never share a training batch
GROUP_COLUMN = "group_id"


@dataclass
class TextExample:
    text: str
    text_pair: str | None = None
    label: object = None  # str class name, float score, list[str] (multi-label) or None
    row: int = 0  # 1-based line number in the source file
    cells: dict | None = None  # its row as read, {column: cell} (`read_text_examples(keep_cells=True)`)


@dataclass
class TaggedSentence:
    words: list[str]
    tags: list[str] | None
    line: int = 0  # line number of the first word


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, character start in context)
    is_impossible: bool = False
    title: str = ""


class Inputs(NamedTuple):
    """What a file holds for a fine-tuned model, as a task's reader read it (`bertkit.tasks.registry`): each list
    one entry per input, in the file's order."""

    texts: list[str]
    pairs: list[str] | None = None  # the second texts (QA: the contexts); None: single texts
    answers: list | None = None  # the file's answers, None for an input without one; None: it carries none
    ids: list[str] | None = None  # the names the file gives its inputs (SQuAD's question ids); None: it names none
    rows: list[dict] | None = None  # a table's rows as read, {column: cell}, where asked (predict writes them back)
    unpredicted: tuple = ()  # the answers of inputs the reader skipped (SQuAD's empty question): nothing is predicted
    # for them and each scores 0, as the official evaluate-v1.1.py scores a question it has no answer for
    words: list | None = None  # per input, the words the file gives it as (a CoNLL sentence's, a JSON list's) or None
    # (a text: a tagger finds its words, BERT's); None: texts alone


@dataclass
class ReadReport:
    """What a reader kept and what it skipped, by reason."""

    path: str
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        if not self.skipped:
            return f"{self.path}: {self.kept} examples"
        why = ", ".join(f"{n} {reason}" for reason, n in self.skipped.most_common())
        return f"{self.path}: {self.kept} examples, skipped {sum(self.skipped.values())} ({why})"


def table_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".txt"):
        return "tsv"
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise BertkitError(f"{path}: unknown table format {suffix!r}; use a .tsv, .csv or .jsonl file")


def read_rows(path, report: ReadReport):
    """Yield (line number, {column: value}) from a TSV/CSV/JSONL file with a header."""
    path = existing_file(path)
    fmt = table_format(path)
    with open_text(path, newline="") as f:
        if fmt == "jsonl":
            def blank():
                report.skipped["empty lines"] += 1

            yield from json_objects(f, path, blank)
            return
        records = csv_records(f, path) if fmt == "csv" else _tsv_records(f, path)
        header = next(records, (1, None))[1]
        if header is None or not any(h.strip() for h in header):
            raise BertkitError(f"{path}: empty file or empty header row; the first line must name the columns")
        header = [h.strip() for h in header]
        if fmt == "csv" and len(header) == 1 and ";" in header[0]:  # Excel's CSV where the decimal mark is ","
            raise BertkitError(f"{path}: the header {header[0]!r} is one column: its cells are separated by ';', "
                               "not commas; save the table as comma-separated CSV (or tab-separated .tsv)")
        for n, fields in records:
            if not any(x.strip() for x in fields):
                report.skipped["empty lines"] += 1
                continue
            if len(fields) != len(header):
                report.skipped[f"rows with {len(fields)} fields instead of {len(header)}"] += 1
                continue
            yield n, dict(zip(header, fields))


# a whole cell in CSV quotes with a quote doubled inside
_CSV_QUOTED = re.compile(r'"(?:[^"]|"")*""(?:[^"]|"")*"')


def _tsv_records(f, path):
    """(line number, fields) per TSV line, read without quoting (GLUE). A cell quoted as CSV quotes it (in
    quotes, a quote inside doubled: how pandas' to_csv(sep="\t") writes a text holding a quote) is refused: read
    literally, its text would keep the quotes, doubled (no GLUE file has such a cell)."""
    for n, line in enumerate(f, 1):
        fields = line.rstrip("\r\n").split("\t")
        quoted = next((c for c in fields if c.startswith('"') and _CSV_QUOTED.fullmatch(c)), None)
        if quoted is not None:
            raise BertkitError(f"{path}:{n}: the cell {quoted[:40]!r} is in CSV quotes; a .tsv is read without "
                               "quoting, as GLUE writes it: save the table unquoted (pandas: quoting=3) or as a .csv")
        yield n, fields


def tsv_cell(text: str) -> str:
    """A text as one cell of a TSV bertkit writes: tab, carriage return and newline made spaces. A lone carriage
    return ends a line for pandas, the csv module and Python's files, so one left in a cell split its row in two
    (the later cells on a row of their own). The tokenizer reads all three as spaces: the cell tokenizes the same."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def column_key(row: dict, name: str) -> str | None:
    """The key of `row` that names column `name`: itself, else the one key equal to it but for case
    ("Sentence", "LABEL": headers as spreadsheets write them), else None."""
    if name in row:
        return name
    alike = [k for k in row if isinstance(k, str) and k.casefold() == name.casefold()]
    return alike[0] if len(alike) == 1 else None


def _column(row: dict, name: str, path, n: int, flag: str):
    key = column_key(row, name)
    if key is None:
        cols = ", ".join(map(repr, row))
        raise BertkitError(f"{path}:{n}: no column {name!r} (columns: {cols}); pass {flag} to name the right one")
    return row[key]


def _text(row: dict, name: str, path, n: int, flag: str) -> str:
    """A text cell as a str: JSON null is no text and a list of strings a text's words (Hugging Face's conll2003
    `tokens`), joined with spaces (str() wrote "['EU', 'rejects']", whose words NER tagged); an object is refused."""
    value = _column(row, name, path, n, flag)
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return " ".join(value)
    if isinstance(value, (list, dict)):
        raise BertkitError(f"{path}:{n}: column {name!r} holds {json.dumps(value)[:40]}, not a text or a list of words")
    return "" if value is None else str(value)


def read_text_examples(
    path,
    *,
    text_column: str = "sentence",
    text_pair_column: str | None = None,
    label_column: str | None = "label",
    problem_type: str = "single_label_classification",  # BertConfig.problem_type: what a label is
    label_separator: str = ",",
    max_examples: int | None = None,
    keep_unlabelled: bool = False,
    keep_cells: bool = False,
) -> tuple[list[TextExample], ReadReport]:
    """Examples from a table; `label_column=None` reads unlabelled input (prediction); `keep_unlabelled`:
    a row whose label is missing is kept with label None (evaluate mode predicts every row), not skipped;
    `keep_cells`: each example keeps its row as read (`TextExample.cells`: predict writes it back)."""
    report = ReadReport(str(path))
    out, labelled = [], False  # labelled: an earlier row had the label column
    for n, row in read_rows(path, report):
        text = _text(row, text_column, path, n, "--text-column")
        pair = _text(row, text_pair_column, path, n, "--text-pair-column") if text_pair_column else None
        if not text.strip() or (pair is not None and not pair.strip()):
            report.skipped["empty texts"] += 1
            continue
        label = None
        if label_column:
            label = _label(row, label_column, problem_type, label_separator, path, n, labelled)
            labelled = labelled or column_key(row, label_column) is not None
            if label is None and not keep_unlabelled:
                report.skipped["missing labels"] += 1
                continue
        out.append(TextExample(text, pair, label, n, row if keep_cells else None))
        if max_examples is not None and len(out) >= max_examples:
            break
    report.kept = len(out)
    if not out:
        raise BertkitError(f"{report.summary()}: no usable rows; check the file and the column names")
    return out, report


def _label(row: dict, column: str, problem_type: str, separator: str, path, n: int, may_lack: bool):
    """A row's label as the problem type reads it; None when its cell is empty or null, or `may_lack` and the
    row has no such key (a JSONL object that leaves it out after others had it; the first row must have
    it: a misspelt column is an error); multi-label: the empty set instead, a text with none of the labels."""
    raw = row.get(column_key(row, column)) if may_lack else _column(row, column, path, n, "--label-column")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if problem_type != "multi_label_classification":
            return None
        raw = ""
    return parse_label(raw, problem_type, separator, f"{path}:{n}")


def text_column_of(path, column: str | None, label_columns=(), log=print) -> str:
    """The column holding a table's texts: `column` (asked for, or the one the model was trained on), else
    "sentence". A table without a "sentence" column, when no column is named (a Hugging Face head checkpoint
    records none), gives its "text" column, else its one column of text (not a label, not numbers such as an
    id), said in one line to `log`; several are refused, naming them (embed's rule and words:
    `bertkit.data.textfiles.text_column_in`)."""
    if column:
        return column
    row = first_row(path)
    if not row:
        return "sentence"
    name = text_column_in(path, list(row), list(row.values()), "--text-column (the model records none; "
                          "--text-pair-column names a pair's second text)", [c for c in label_columns if c])
    if name != "sentence":
        log(f"{path}: reading the texts from column {name!r}, "
            f"{'its text column' if name == 'text' else 'its only column of text'} (the model records no text "
            "column; --text-column names another)")
    return name


def first_row(path) -> dict:
    """A table's first row ({} when it has none)."""
    return next((row for _, row in read_rows(path, ReadReport(str(path)))), {})


def read_text_columns(path, text_column: str, pair_column: str | None = None, log=print, *,
                      keep_rows: bool = False) -> Inputs:
    """The texts (and pairs) of a table's text column (and second-text column), with `keep_rows` the rows they were
    read from (predict writes them back): the inputs of a fine-tuned model, unlabelled; a missing column is a
    one-line error naming the flag; a row whose text (or second text) is empty or null is skipped, as
    `read_text_examples` skips it; skipped rows are counted in one line to `log`. A text cell holding a list of
    words is also kept as that list (`Inputs.words`: a tagger tags those words)."""
    path = existing_file(path)
    report = ReadReport(str(path))
    kept, rows, words = [], [], []
    for n, row in read_rows(path, report):
        cells = [_text(row, name, path, n, "--text-column/--text-pair-column")
                 for name in ((text_column, pair_column) if pair_column else (text_column,))]
        if all(cell.strip() for cell in cells):
            kept.append(cells)
            rows += [row] if keep_rows else []
            given = _column(row, text_column, path, n, "--text-column")
            words.append(given if isinstance(given, list) else None)
        else:  # nothing to predict for: skipped as read_text_examples skips it
            report.skipped["empty texts"] += 1
    report.kept = len(kept)
    if report.skipped:
        log(report.summary())
    return Inputs([r[0] for r in kept], [r[1] for r in kept] if pair_column else None, rows=rows if keep_rows else None,
                  words=words if any(w is not None for w in words) else None)


def one_text_per_line(path, column: str) -> bool:
    """A .txt whose first line does not name `column`: one text per line, as `bertkit embed` reads it (else a table)."""
    if Path(path).suffix.lower() != ".txt":
        return False
    with open_text(path) as f:  # its first line alone: the whole file is read once, for its texts
        first = f.readline()
    return column not in [cell.strip() for cell in first.split("\t")]


def read_text_lines(path) -> list[str]:
    """The texts of a file without a header, one per line: each line stripped, blank lines left out."""
    return [line.strip() for line in read_text(path).split("\n") if line.strip()]


def label_cell(labels: list[str], separator: str, names=()) -> str:
    """A multi-label set as a cell: joined by `separator` (the training cells'), or JSON where a name holds it."""
    held = any(separator in n for n in (*names, *labels))
    return json.dumps(labels, ensure_ascii=False) if held else separator.join(labels)


def probabilities_cell(probabilities: dict) -> str:
    """A prediction's probabilities as one cell: 'name=p name=p' (4 decimals), or a JSON object {name: p} where a
    name holds a space or '=' or opens with '{' (the pairs of labels 'x y' and 'a=b', 'x y=0.5 a=b=0.5', read back
    as other labels). Every row of a model's predictions has the same names, so the same form."""
    cells = [(name, f"{p:.4f}") for name, p in probabilities.items()]
    if any(re.search(r"[\s=]", name) or name.startswith("{") for name, _ in cells):
        return "{" + ", ".join(f"{json.dumps(name, ensure_ascii=False)}: {p}" for name, p in cells) + "}"
    return " ".join(f"{name}={p}" for name, p in cells)


def parse_label(raw, problem_type: str, separator: str, where: str):
    """One label as the problem type reads it: a score (regression), a set of names (multi-label), a name."""
    if problem_type == "regression":
        return read_score(raw, where, "; regression needs numeric labels")
    if problem_type == "multi_label_classification":
        parts = raw if isinstance(raw, list) else str(raw).split(separator)
        return sorted({str(p).strip() for p in parts if str(p).strip()})
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    name = str(raw).strip()
    if re.fullmatch(r"[+-]?\d+\.0+", name):  # "1.0" (a float column saved as text) is the class 1, as JSON's 1.0 is
        name = str(int(float(name)))
    return name


def label_names(labels) -> list[str]:
    """The label vocabulary, sorted; numbers sort numerically ('2' before '10')."""
    names = {name for lab in labels for name in (lab if isinstance(lab, list) else [lab])}

    def key(name):
        try:  # a NaN ('nan') is no number: it compares neither below nor above any, so the sort kept the set's
            value = float(name)  # order, which follows the process's string hash (PYTHONHASHSEED); it sorts as text
        except ValueError:
            value = float("nan")
        return (0, value, name) if value == value else (1, 0.0, name)

    return sorted(names, key=key)


def looks_like_scores(names: list[str]) -> bool:
    """Whether label names are numbers with fractions (0.25, 3.5): scores, a class per value to a classifier."""
    try:
        values = [float(n) for n in names]
    except ValueError:
        return False
    return any(v != int(v) for v in values if v == v and abs(v) != float("inf"))


def check_known_labels(labels, label2id: dict, where: str) -> None:
    """Unknown labels (e.g. in the dev set) are an error: they could never be predicted."""
    seen = set()
    for lab in labels:
        seen.update(lab if isinstance(lab, list) else [lab])
    unknown = sorted(seen - set(label2id))
    if unknown:
        raise BertkitError(f"{where}: labels {unknown[:10]} do not occur in the training labels {sorted(label2id)}; "
                           "fix the labels or add training examples for them")


# --- CoNLL -----------------------------------------------------------------

def looks_like_conll(path) -> bool:
    """CoNLL columns start with -DOCSTART-, or have blank lines between sentences and (nearly) one number of
    columns on every line, a token and its tags; else one sentence per line. A blank line alone does not make
    a file of sentences columns: their word counts differ from line to line (read as columns, each line's
    first word was taken for a token and the rest dropped). Nearly: a line missing its tag is still CoNLL,
    which `read_conll` refuses naming the line."""
    text = read_text(path)
    if text.lstrip().startswith("-DOCSTART-"):
        return True
    blocks = [b for b in re.split(r"\n[^\S\n]*\n", text.strip()) if b.strip()]
    widths = Counter(len(line.split()) for line in text.split("\n") if line.strip())
    return len(blocks) > 1 and widths.most_common(1)[0][1] >= 0.9 * sum(widths.values())


def conll_has_tags(path) -> bool:
    """A CoNLL file (`looks_like_conll`) whose first token line has a second column, the tag: a labelled one.
    One of -DOCSTART- lines alone has none (it was an IndexError): `read_conll` says it holds no sentences."""
    tokens = [line for line in read_text(path).split("\n") if line.strip() and not line.startswith("-DOCSTART-")]
    return bool(tokens) and looks_like_conll(path) and len(tokens[0].split()) >= 2


def read_conll(path, *, token_column: int = 0, tag_column: int = -1, tagged: bool = True, max_sentences=None):
    """Sentences from a CoNLL column file: one token per line, blank line between sentences.

    `-DOCSTART-` lines are document separators and are dropped. Every token
    line must have at least two columns when `tagged`, and the same number of
    columns as the first token line: a line missing its tag is an error with
    its line number, never a shifted label.
    """
    path = existing_file(path)
    report = ReadReport(str(path))
    sentences, words, tags, start, width = [], [], [], 0, None

    def flush():
        if words:
            sentences.append(TaggedSentence(list(words), list(tags) if tagged else None, start))
        words.clear()
        tags.clear()

    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                flush()
                continue
            if cols[0] == "-DOCSTART-":
                flush()
                report.skipped["-DOCSTART- lines"] += 1
                continue
            if tagged:
                if len(cols) < 2:
                    raise BertkitError(f"{path}:{n}: {line.strip()!r} has {len(cols)} column; a tagged CoNLL line "
                                       "needs 'token ... TAG' separated by spaces")
                width = width or len(cols)
                if len(cols) != width:
                    raise BertkitError(f"{path}:{n}: {len(cols)} columns where earlier lines have {width}; "
                                       "tokens and tags are misaligned on this line")
            for flag, column in (("--token-column", token_column), ("--tag-column", tag_column if tagged else 0)):
                if not -len(cols) <= column < len(cols):  # was an IndexError
                    raise BertkitError(f"{path}:{n}: no column {column} ({flag}): the line has {len(cols)}, numbered "
                                       f"0..{len(cols) - 1} (or -{len(cols)}..-1 from the end)")
            if not words:
                start = n
            words.append(cols[token_column])
            if tagged:
                tags.append(cols[tag_column])
            if max_sentences is not None and len(sentences) >= max_sentences:
                break
    flush()
    if max_sentences is not None:
        sentences = sentences[:max_sentences]
    report.kept = len(sentences)
    if not sentences:
        raise BertkitError(f"{path}: no sentences found; expected one 'token ... TAG' per line")
    return sentences, report
