"""The BEIR layout: a corpus, its queries and graded relevance judgments (qrels).

BEIR (Thakur et al. 2021, beir-cellar/beir `datasets/data_loader.py`) stores a
retrieval set as one folder; MTEB's retrieval tasks read the same files:

    corpus.jsonl          {"_id": "4983", "title": "...", "text": "..."}   one per line
    queries.jsonl         {"_id": "1", "text": "...", "metadata": {...}}   one per line
    qrels/<split>.tsv     query-id <TAB> corpus-id <TAB> score             header row first

Variants read the same (what users download): corpus.jsonl.gz / queries.jsonl.gz (BEIR's Hugging Face
copies), a byte order mark, CRLF, a number `_id`, a null or missing title, extra fields; qrels as TREC writes
them, `query-id 0 corpus-id score` without a header (MS MARCO, TREC; split on whitespace as trec_eval
splits them), or BEIR's three columns without their header (or under it, separated by spaces), or
qrels/<split>.jsonl (MTEB's copies: {"query-id", "corpus-id", "score"} per line); ids padded with blanks
are the stripped cells.

A score is a graded relevance (0 = judged not relevant, 1, 2, ... more relevant),
as trec_eval reads qrels. `load_beir` keeps the queries that the split judges, as
BEIR's `GenericDataLoader` does, and `training_pairs` turns a split's positive
judgments into (query, passage) pairs for contrastive training.

A document's text is its title and text joined by one space (`document_text`):
what sentence-transformers' BEIR examples and MTEB's `RetrievalEvaluator` embed,
so our figures compare with theirs.

Every mistake in the files is one BertkitError naming the file, the line and the fix:
a line that is not JSON, a missing `_id` or `text`, a missing qrels column, an empty
file, a qrels id absent from the corpus or the queries. Ids are checked before they
are trusted (`_by_id`): a null `_id` or `text` (which `str` would turn into "None"), an
`_id` that is neither a string nor a whole number, and an id seen twice, with both line
numbers (`7` and `"7"` count as the same id: both are read as "7"). `dedupe=True` keeps
the first line of each id instead and warns how many it dropped.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from bertkit.errors import BertkitError, read_score
from bertkit.data.textfiles import existing_file, json_objects, open_text

QRELS_COLUMNS = ("query-id", "corpus-id", "score")


@dataclass
class BeirSplit:
    """One split of a BEIR folder.

    corpus:  doc id -> {"title": str, "text": str} (every document of the folder)
    queries: query id -> text (only the queries this split judges)
    qrels:   query id -> {doc id: graded relevance}
    """

    corpus: dict[str, dict]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    directory: Path
    split: str

    def head(self, n: int | None) -> "BeirSplit":
        """The split cut to its first `n` judged queries (the qrels file's order; None: all of them); the
        corpus stays whole, so each query is still ranked against every document."""
        if n is None:
            return self
        if n < 1:
            raise BertkitError(f"at least one query must be kept, got {n}")
        keep = list(self.qrels)[:n]
        return replace(self, queries={q: self.queries[q] for q in keep}, qrels={q: self.qrels[q] for q in keep})


def document_text(doc: dict) -> str:
    """A document as one string: title and text joined by a space (sentence-transformers, MTEB)."""
    return f"{doc.get('title', '')} {doc['text']}".strip()


def _read_jsonl(path: Path, fields: tuple, what: str) -> list[tuple[int, dict]]:
    """(line number, object) per line; each object has `fields`, none of them null."""
    rows = []
    with open_text(existing_file(path, what), what) as f:
        for number, row in json_objects(f, path):
            for field in fields:
                if row.get(field) is None:
                    state = "null" if field in row else "no"
                    raise BertkitError(f"{path} line {number} has {state} {field!r} field: each line needs "
                                       f"{', '.join(fields)}, none of them null")
            rows.append((number, row))
    if not rows:
        raise BertkitError(f"{path} is empty: a BEIR {what} has one JSON object per line")
    return rows


def _by_id(rows: list[tuple[int, dict]], path: Path, dedupe: bool) -> dict[str, dict]:
    """id -> row, each id once: a repeated id is refused with both line numbers, or (dedupe) dropped."""
    first: dict[str, tuple[int, object]] = {}
    out, dropped = {}, 0
    for number, row in rows:
        raw = row["_id"]
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise BertkitError(f"{path} line {number}: _id {raw!r} is not a string or a whole number")
        key = str(raw)
        if key in first:
            if dedupe:
                dropped += 1
                continue
            seen_line, seen_raw = first[key]
            how = "" if type(seen_raw) is type(raw) else f" ({seen_raw!r} and {raw!r} read as the same id)"
            raise BertkitError(f"{path}: _id {key!r} appears on line {seen_line} and again on line {number}{how}: "
                               "ids must be unique; fix the file, or pass --dedupe (bertkit index, evaluate retrieval, "
                               "mine) to keep the first of each")
        first[key] = (number, raw)
        out[key] = row
    if dropped:
        warnings.warn(f"{path}: {dropped} line(s) repeat an earlier _id and were dropped (--dedupe keeps the first)",
                      stacklevel=3)
    return out


def _jsonl_in(directory: Path, name: str) -> Path:
    """`name`.jsonl in a BEIR folder, or `name`.jsonl.gz where only that is there (BEIR's Hugging Face copies)."""
    plain, packed = directory / f"{name}.jsonl", directory / f"{name}.jsonl.gz"
    return packed if not plain.exists() and packed.is_file() else plain


def is_corpus_jsonl(path: Path) -> bool:
    """Whether `path` is a BEIR corpus: a folder holding corpus.jsonl (or .jsonl.gz), or a .jsonl(.gz) file."""
    if path.is_dir():
        return _jsonl_in(path, "corpus").is_file()
    return path.name.lower().endswith((".jsonl", ".jsonl.gz")) and existing_file(path, "corpus") is not None


def read_corpus(source, dedupe: bool = False) -> dict[str, dict]:
    """doc id -> {"title", "text"} from a BEIR folder's corpus.jsonl, or a corpus file of that layout
    under any name (title optional, as in BEIR). A repeated id is an error; `dedupe` keeps the first."""
    path = Path(source)
    path = _jsonl_in(path, "corpus") if path.is_dir() else path
    rows = _by_id(_read_jsonl(path, ("_id", "text"), "corpus"), path, dedupe)
    return {i: {"title": str(r.get("title") or ""), "text": str(r["text"])} for i, r in rows.items()}


def read_queries(directory, dedupe: bool = False) -> dict[str, str]:
    """query id -> text from `directory`/queries.jsonl."""
    path = _jsonl_in(Path(directory), "queries")
    rows = _by_id(_read_jsonl(path, ("_id", "text"), "queries file"), path, dedupe)
    return {i: str(r["text"]) for i, r in rows.items()}


QRELS_SUFFIXES = (".tsv", ".jsonl", ".tsv.gz", ".jsonl.gz")  # BEIR's, MTEB's Hugging Face copies, gzipped


def qrels_path(directory, split: str) -> Path:
    """qrels/`split`.tsv, or where only that is there qrels/`split`.jsonl (MTEB's Hugging Face copies) or
    either gzipped."""
    folder = Path(directory) / "qrels"
    path = next((folder / f"{split}{s}" for s in QRELS_SUFFIXES if (folder / f"{split}{s}").is_file()), None)
    if path is None:
        found = sorted({p.name[: -len(s)] for s in QRELS_SUFFIXES for p in folder.glob(f"*{s}")})
        have = f"this folder has {', '.join(found)}" if found else "this folder has no qrels/*.tsv"
        raise BertkitError(f"no qrels for split {split!r} ({folder / split}.tsv is missing): {have}")
    return path


def _grade(raw: str, where: str) -> int:
    """A qrels cell as the whole number it must be: trec_eval's graded relevance. "2.0" is 2; "0.5" is refused
    (pytrec_eval and BEIR's loader refuse it too; `int(0.5)` made a partly relevant document irrelevant)."""
    value = read_score(raw, where, " (graded relevance 0, 1, 2...)")
    if value != int(value):
        raise BertkitError(f"{where}: score {raw!r} is not a whole number: qrels grade relevance 0 (not "
                           "relevant), 1, 2... as trec_eval reads them; map fractional grades onto whole ones")
    return int(value)


def _tab_cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("\t")]


def _qrels_layout(first: str, path) -> tuple[list[int], bool, object]:
    """(the positions of query id, corpus id and score, whether `first` is a header, how a line splits into
    cells) from a qrels file's first line: BEIR's tab-separated columns under their header (or that header
    separated by spaces), or a judgment itself (no header) as `query-id corpus-id score` or TREC's
    `query-id iteration corpus-id score`, split on whitespace as trec_eval splits it (MS MARCO and TREC ship
    qrels so)."""
    for split in (_tab_cells, str.split):
        header = split(first)
        if all(c in header for c in QRELS_COLUMNS):
            return [header.index(c) for c in QRELS_COLUMNS], True, split
    cells = first.split()
    if len(cells) in (3, 4) and _is_number(cells[-1]):
        return ([0, 1, 2] if len(cells) == 3 else [0, 2, 3]), False, str.split
    missing = [c for c in QRELS_COLUMNS if c not in _tab_cells(first)]
    raise BertkitError(f"{path} has no {', '.join(missing)} column (first line: {' '.join(cells)}): a qrels file "
                       f"is BEIR's tab-separated {', '.join(QRELS_COLUMNS)} under that header, or TREC's "
                       "`query-id 0 corpus-id score` lines")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _qrels_rows(lines, path, first: int, split, width: int):
    """(line number from `first`, cells stripped) per judgment; a line narrower than the first is an error."""
    for number, line in enumerate(lines, first):
        if not line.strip():
            continue
        cells = split(line)
        if len(cells) < width:
            raise BertkitError(f"{path} line {number} has {len(cells)} columns, the first line {width}")
        yield number, cells


def _json_qrels(f, path):
    """(line number, [query id, corpus id, score]) per line of a JSONL qrels file ({"query-id", "corpus-id",
    "score"} per line, ids text or numbers)."""
    for number, row in json_objects(f, path):
        if any(row.get(c) is None for c in QRELS_COLUMNS):
            raise BertkitError(f"{path} line {number} lacks one of {', '.join(QRELS_COLUMNS)}: a JSONL qrels file has "
                               "all three on each line")
        yield number, [str(row[c]).strip() for c in QRELS_COLUMNS]


def _qrels_cells(f, path):
    """(positions of query id, corpus id and score, the (line number, cells) of each judgment)."""
    if Path(path).name.lower().endswith((".jsonl", ".jsonl.gz")):
        return [0, 1, 2], _json_qrels(f, path)
    first = f.readline()
    if not first.strip():
        raise BertkitError(f"{path} is empty: a qrels file has a header {' '.join(QRELS_COLUMNS)} and one row each")
    where, header, split = _qrels_layout(first, path)
    if header:
        return where, _qrels_rows(f, path, 2, split, len(split(first)))
    return where, _qrels_rows([first, *f], path, 1, split, len(split(first)))


def read_qrels(path) -> dict[str, dict[str, int]]:
    """query id -> {doc id: graded relevance} from a qrels file: BEIR's TSV with a header row, TREC's lines
    without one (`_qrels_layout`), or JSON lines; ids are the cells without surrounding blanks, as trec_eval
    reads them."""
    with open_text(existing_file(path, "qrels file"), "qrels file") as f:
        where, rows = _qrels_cells(f, path)
        qrels: dict[str, dict[str, int]] = {}
        lines: dict[tuple, int] = {}  # (query, doc) -> the line that judged it
        for number, cells in rows:
            query, doc, score = (cells[i] for i in where)
            grade, judged = _grade(score, f"{path} line {number}"), qrels.setdefault(query, {})
            if judged.get(doc, grade) != grade:  # pytrec_eval and BEIR's loader keep the last one silently
                raise BertkitError(f"{path} line {number} grades document {doc!r} for query {query!r} {grade}, line "
                                   f"{lines[query, doc]} graded it {judged[doc]}: keep one judgment per pair")
            judged[doc], lines[query, doc] = grade, number
    if not qrels:
        raise BertkitError(f"{path} holds no judgments")
    return qrels


def _check_ids(qrels: dict, corpus: dict, queries: dict, path: Path) -> None:
    for query, docs in qrels.items():
        if query not in queries:
            raise BertkitError(f"{path}: query id {query!r} is not in queries.jsonl: fix the qrels or the queries")
        if not queries[query].strip():
            raise BertkitError(f"{path.parent.parent / 'queries.jsonl'}: query {query!r}, judged in {path}, has an "
                               "empty text: give it its text, or drop its judgments")
        for doc in docs:
            if doc not in corpus:
                raise BertkitError(f"{path}: corpus id {doc!r} (query {query!r}) is not in corpus.jsonl: "
                                   "fix the qrels or the corpus")


def load_beir(directory, split: str = "test", dedupe: bool = False) -> BeirSplit:
    """Read a BEIR folder's corpus, queries and the qrels of `split` (checked against each other); `dedupe`:
    keep the first line of a repeated corpus or query id (as `bertkit index --dedupe` does) instead of refusing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BertkitError(f"BEIR folder {directory} does not exist: pass a folder with corpus.jsonl, "
                           "queries.jsonl and qrels/<split>.tsv")
    path = qrels_path(directory, split)
    corpus, queries, qrels = read_corpus(directory, dedupe), read_queries(directory, dedupe), read_qrels(path)
    _check_ids(qrels, corpus, queries, path)
    return BeirSplit(corpus, {q: queries[q] for q in qrels}, qrels, directory, split)


def training_pairs(directory, split: str = "train") -> list[tuple[str, str]]:
    """(query, relevant passage) pairs from a split's positive judgments (score > 0), in qrels order.

    A query judging several passages relevant gives one pair for each."""
    data = load_beir(directory, split)
    pairs = [(data.queries[q], document_text(data.corpus[d])) for q, docs in data.qrels.items()
             for d, score in docs.items() if score > 0]
    if not pairs:
        raise BertkitError(f"{data.directory}/qrels/{split}.tsv judges no passage relevant (every score is 0)")
    return pairs
