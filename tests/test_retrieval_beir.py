"""The BEIR reader on a slice of SciFact, and its one-line errors."""

import json
from pathlib import Path

import pytest

from bertkit.errors import BertkitError
from bertkit.data.beir import document_text, load_beir, training_pairs


def scifact_slice(shared_data: Path, out: Path, n_queries: int = 12, n_extra: int = 30) -> Path:
    """A small BEIR folder: the first `n_queries` test and train claims, the abstracts they cite,
    and `n_extra` other abstracts as distractors (files copied line by line, unchanged)."""
    src = shared_data / "retrieval" / "scifact"
    (out / "qrels").mkdir(parents=True)
    keep_docs, keep_queries = set(), set()
    for split in ("test", "train"):
        lines = (src / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").split("\n")
        rows = [line for line in lines[1:] if line.strip()]
        queries = list(dict.fromkeys(r.split("\t")[0] for r in rows))[:n_queries]
        rows = [r for r in rows if r.split("\t")[0] in queries]
        keep_queries |= set(queries)
        keep_docs |= {r.split("\t")[1] for r in rows}
        (out / "qrels" / f"{split}.tsv").write_text("\n".join([lines[0], *rows]) + "\n", encoding="utf-8")
    corpus_lines = (src / "corpus.jsonl").read_text(encoding="utf-8").split("\n")
    extra = 0
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for line in corpus_lines:
            if not line.strip():
                continue
            doc = json.loads(line)["_id"]
            if doc in keep_docs or extra < n_extra:
                extra += doc not in keep_docs
                f.write(line + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for line in (src / "queries.jsonl").read_text(encoding="utf-8").split("\n"):
            if line.strip() and json.loads(line)["_id"] in keep_queries:
                f.write(line + "\n")
    return out


def test_full_scifact_counts(shared_data):
    """The counts SOURCES.md gives (equal to BEIR's and MTEB's)."""
    test = load_beir(shared_data / "retrieval" / "scifact", "test")
    assert len(test.corpus) == 5183
    assert len(test.queries) == 300 and sum(len(d) for d in test.qrels.values()) == 339
    assert len(training_pairs(shared_data / "retrieval" / "scifact")) == 919


def test_slice_reads_back(shared_data, tmp_path):
    folder = scifact_slice(shared_data, tmp_path / "sf")
    data = load_beir(folder, "test")
    assert len(data.queries) == 12 and set(data.queries) == set(data.qrels)
    first = json.loads((folder / "corpus.jsonl").read_text(encoding="utf-8").split("\n")[0])
    assert document_text(data.corpus[first["_id"]]) == f"{first['title']} {first['text']}"
    pairs = training_pairs(folder, "train")
    assert all(isinstance(q, str) and isinstance(p, str) for q, p in pairs)
    q, p = pairs[0]
    assert q in set(load_beir(folder, "train").queries.values()) and p in {document_text(d) for d in data.corpus.values()}


def test_document_text_without_title():
    assert document_text({"title": "", "text": "Only text."}) == "Only text."
    assert document_text({"title": "T", "text": "x"}) == "T x"


def write_beir(root: Path, corpus: str, queries: str, qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (root / "queries.jsonl").write_text(queries, encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")
    return root


GOOD_CORPUS = '{"_id": "d1", "title": "A", "text": "alpha"}\n{"_id": "d2", "text": "beta"}\n'
GOOD_QUERIES = '{"_id": "q1", "text": "what is alpha"}\n'
GOOD_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"


@pytest.mark.parametrize("corpus, queries, qrels, message", [
    ("", GOOD_QUERIES, GOOD_QRELS, "corpus.jsonl is empty"),
    ('{"_id": "d1", "title": "A"}\n', GOOD_QUERIES, GOOD_QRELS, "no 'text' field"),
    ('{"id": "d1", "text": "x"}\n', GOOD_QUERIES, GOOD_QRELS, "no '_id' field"),
    ("not json\n", GOOD_QUERIES, GOOD_QRELS, "line 1 is not JSON"),
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tdoc\tscore\nq1\td1\t1\n", "no corpus-id column"),
    (GOOD_CORPUS, GOOD_QUERIES, "", "test.tsv is empty"),
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td9\t1\n", "corpus id 'd9'.*not in corpus.jsonl"),
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq7\td1\t1\n", "query id 'q7' is not in queries.jsonl"),
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\thigh\n", "not a number"),
    (GOOD_CORPUS, '{"_id": "q1", "text": " "}\n', GOOD_QRELS, "query 'q1', judged in .*test.tsv, has an empty text"),
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\tinf\n", "not a finite number"),  # a traceback
    (GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\tnan\n", "not a finite number"),
])
def test_one_line_errors(tmp_path, corpus, queries, qrels, message):
    folder = write_beir(tmp_path, corpus, queries, qrels)
    with pytest.raises(BertkitError, match=message) as err:
        load_beir(folder, "test")
    assert "\n" not in str(err.value)


def test_relevance_grades_are_whole_numbers_as_pytrec_eval_takes_them(tmp_path):
    """A fractional grade was cut by int(): 0.5 became 0, a judged-relevant document scored as irrelevant and
    the query's figures silently 0. pytrec_eval refuses it ("Expected relevance to be integer"), and so do we;
    a whole number written as a float is the number."""
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t2.0\nq1\td2\t0\n")
    assert load_beir(folder, "test").qrels == {"q1": {"d1": 2, "d2": 0}}
    for grade in ("0.5", "1.5", "-0.25"):
        write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, f"query-id\tcorpus-id\tscore\nq1\td1\t{grade}\n")
        with pytest.raises(BertkitError, match=f"line 2: score '{grade}' is not a whole number"):
            load_beir(folder, "test")


def test_a_pair_judged_twice_with_two_grades_is_refused(tmp_path):
    """A qrels file that graded one (query, document) pair twice kept the last grade silently (as pytrec_eval's
    dict and BEIR's loader do), so which judgment counted depended on the line order. Two grades are refused,
    naming both lines; the same grade repeated is one judgment."""
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq1\td1\t1\n")
    assert load_beir(folder, "test").qrels == {"q1": {"d1": 1, "d2": 0}}
    write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq1\td1\t0\n")
    with pytest.raises(BertkitError, match="line 4 grades document 'd1' for query 'q1' 0, line 2 graded it 1"):
        load_beir(folder, "test")


def test_missing_split_names_the_ones_there(tmp_path):
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    with pytest.raises(BertkitError, match="split 'dev'.*this folder has test"):
        load_beir(folder, "dev")
    write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t0\n")
    with pytest.raises(BertkitError, match="judges no passage relevant"):
        training_pairs(folder, "test")


@pytest.mark.parametrize("layout", [
    "{q}\t0\t{d}\t{s}",       # TREC qrels as MS MARCO ships them: tabs, no header
    "{q} Q0 {d} {s}",         # TREC qrels as trec_eval reads them: spaces, no header
    "{q}  0\t{d}  {s}  ",     # mixed whitespace, trailing blanks
])
def test_trec_qrels_without_a_header_read_as_pytrec_eval_parses_them(tmp_path, layout, pytrec_eval):
    """A 4-column TREC qrels file (`query-id iteration corpus-id score`, no header) was refused as a qrels file
    whose header lacked the BEIR column names (its first judgment shown as the header). It is read as trec_eval
    reads it: the oracle is pytrec_eval.parse_qrel on the same lines."""
    corpus = "".join(f'{{"_id": "{d}", "text": "doc {d}"}}\n' for d in ("d1", "d2", "10"))
    queries = '{"_id": "q1", "text": "a"}\n{"_id": "7", "text": "b"}\n'
    lines = [layout.format(q=q, d=d, s=s) for q, d, s in [("q1", "d1", 1), ("q1", "d2", 0), ("7", "10", 2)]]
    folder = write_beir(tmp_path, corpus, queries, "\n".join(lines) + "\n")
    assert load_beir(folder, "test").qrels == pytrec_eval.parse_qrel([" ".join(l.split()) for l in lines])


def test_headerless_three_column_qrels_and_padded_ids(tmp_path):
    """BEIR's 3 columns without their header row (BEIR's loader drops the first judgment as a header; trec_eval
    would not read 3 columns): every line is a judgment. Cells padded with spaces matched no id, and were
    refused as an unknown query ' q1 '; trec_eval splits on whitespace, so the ids are the stripped cells."""
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "q1\td1\t1\nq1\td2\t0\n")
    assert load_beir(folder, "test").qrels == {"q1": {"d1": 1, "d2": 0}}
    write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\n q1 \t d1\t1 \r\nq1\td2 \t0\r\n")
    assert load_beir(folder, "test").qrels == {"q1": {"d1": 1, "d2": 0}}
    write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id corpus-id score\nq1 d1 1\nq1  d2 0\n")  # spaces
    assert load_beir(folder, "test").qrels == {"q1": {"d1": 1, "d2": 0}}
    write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "q1\td1\n")
    with pytest.raises(BertkitError, match="first line: q1 d1\\): a qrels file is BEIR.s tab-separated query-id, corpus-id, score"):
        load_beir(folder, "test")


def test_gzipped_corpus_and_queries_as_hf_mirrors_ship_them(tmp_path):
    """corpus.jsonl.gz / queries.jsonl.gz (BEIR's Hugging Face copies) were refused as 'corpus.jsonl does not
    exist'; they read as the plain files do, a byte order mark and CRLF included."""
    import gzip
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    plain = load_beir(folder, "test")
    for name in ("corpus.jsonl", "queries.jsonl"):
        text = (folder / name).read_text(encoding="utf-8")
        (folder / f"{name}.gz").write_bytes(gzip.compress(("\ufeff" + text.replace("\n", "\r\n")).encode()))
        (folder / name).unlink()
    gz = load_beir(folder, "test")
    assert (gz.corpus, gz.queries, gz.qrels) == (plain.corpus, plain.queries, plain.qrels)
    # finetune embed --train/--dev took such a folder for 'not a BEIR one (no corpus.jsonl)'
    from bertkit.tasks.embedding import read_examples
    assert read_examples(folder, split="test", log=lambda _: None).rows == [("what is alpha", "A alpha")]


def test_jsonl_qrels_as_mteb_ships_them(tmp_path):
    """qrels/test.jsonl ({"query-id", "corpus-id", "score"} per line, ids text or numbers: MTEB's Hugging Face
    copies) was refused as 'no qrels for split test'; it reads as the TSV with the same judgments."""
    folder = write_beir(tmp_path, GOOD_CORPUS + '{"_id": 7, "text": "gamma"}\n', GOOD_QUERIES,
                        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq1\t7\t2\n")
    tsv = load_beir(folder, "test").qrels
    (folder / "qrels" / "test.tsv").unlink()
    (folder / "qrels" / "test.jsonl").write_text('{"query-id": "q1", "corpus-id": "d1", "score": 1}\n'
                                                 '{"query-id": "q1", "corpus-id": "d2", "score": 0}\n'
                                                 '{"query-id": "q1", "corpus-id": 7, "score": 2}\n')
    assert load_beir(folder, "test").qrels == tsv == {"q1": {"d1": 1, "d2": 0, "7": 2}}
    (folder / "qrels" / "test.jsonl").write_text('{"query-id": "q1", "corpus-id": "d1"}\n')
    with pytest.raises(BertkitError, match="line 1 lacks one of query-id, corpus-id, score"):
        load_beir(folder, "test")


def test_gzipped_qrels_read_as_the_plain_ones(tmp_path):
    """qrels/test.tsv.gz and qrels/test.jsonl.gz (a folder gzipped whole, as corpus.jsonl.gz already reads) were
    refused as 'no qrels for split test ... this folder has no qrels/*.tsv'; they read as the plain files, and a
    missing split names every split the folder has, whatever its suffix."""
    import gzip
    folder = write_beir(tmp_path, GOOD_CORPUS, GOOD_QUERIES, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n")
    plain = load_beir(folder, "test").qrels
    qrels = folder / "qrels"
    (qrels / "test.tsv.gz").write_bytes(gzip.compress((qrels / "test.tsv").read_bytes()))
    (qrels / "test.tsv").unlink()
    assert load_beir(folder, "test").qrels == plain == {"q1": {"d1": 1, "d2": 0}}
    (qrels / "train.jsonl.gz").write_bytes(gzip.compress(b'{"query-id": "q1", "corpus-id": "d2", "score": 2}\n'))
    assert load_beir(folder, "train").qrels == {"q1": {"d2": 2}}
    with pytest.raises(BertkitError, match=r"split 'dev'.*this folder has test, train$"):
        load_beir(folder, "dev")
