"""An index that stores only compact codes (`bertkit index --vectors int8|binary`, without --keep-float), or
binary codes and int8 rows to rescore with (`--vectors binary --rescore-with int8`): the codes written are
compact's codes of the float index's vectors, the int8 rows sentence-transformers' quantize_embeddings of
them, the float rows are gone, and search, hybrid, evaluate --index, serve --index, the Qdrant export and
--resume work with it; a damaged codes file is one line."""

import importlib.util
import json
import shutil

import numpy as np
import pytest
from conftest import need
from test_evaluate_index import by_hand
from test_index import OVERLAP, TOKENS
from test_reader_checks import _damaged, _edit_info, _truncate, cli
from test_retrieval_beir import scifact_slice
from test_search import brute_force
from test_serve import Server, call

from bertkit.cli import main
from bertkit.data.safetensors_header import read_header
from bertkit.errors import BertkitError
from bertkit.retrieval import index as index_module
from bertkit.retrieval.codes_file import rows_or_decoded
from bertkit.retrieval.compact import decode, encode, int8_ranges
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.search import search

QUERIES = ["vitamin D and bone fractures", "stem cells", "tumour growth in mice"]


@pytest.fixture(scope="module")
def made(shared_data, tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("codes_file")
    folder = scifact_slice(shared_data, root / "sf", n_queries=4, n_extra=6)
    common = dict(passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64, dtype="float32", progress=False)
    for name, kind, rows in (("float", "float32", None), ("binary", "binary", None), ("int8", "int8", "float32"),
                             ("binary_int8", "binary", "int8")):
        build_index(folder / "corpus.jsonl", root / name, str(tiny_dir), vectors=kind, rescore_with=rows, **common)
    return {"root": root, "folder": folder, "tiny": tiny_dir, "common": common}


def test_a_codes_only_index_holds_compact_codes_and_no_float_rows(made):
    plain, binary, int8 = (open_index(made["root"] / n) for n in ("float", "binary", "int8"))
    assert binary.info["vectors"]["stored"] == ["binary"] and int8.info["vectors"]["stored"] == ["int8", "float32"]
    assert binary.vectors is None and set(read_header(made["root"] / "binary" / "vectors.safetensors")) == {
        "document", "passage_offset"}
    np.testing.assert_array_equal(binary.document, plain.document)
    np.testing.assert_array_equal(binary.passage_offset, plain.passage_offset)
    vectors = np.asarray(plain.vectors)
    np.testing.assert_array_equal(binary.codes, encode(vectors, "binary"))  # the same passages, the same model
    np.testing.assert_array_equal(int8.vectors, vectors)
    np.testing.assert_array_equal(int8.codes, encode(vectors, "int8", int8_ranges(vectors)))
    np.testing.assert_array_equal(int8.ranges, int8_ranges(vectors))
    n, dim = vectors.shape
    on_disk = sum(p.stat().st_size for p in (made["root"] / "binary").glob("*.safetensors"))
    assert on_disk < n * (dim // 8 + 16) + 1024  # the codes and the row tables (16 bytes a row), headers
    with pytest.raises(BertkitError, match="stores only binary codes .*--vectors binary --keep-float"):
        binary.float_rows("this step")


def test_binary_codes_with_int8_rows_are_sentence_transformers_quantized_embeddings(made):
    need(importlib.util.find_spec("sentence_transformers") is not None, "sentence-transformers (the oracle)")
    from sentence_transformers.util import quantize_embeddings

    plain, index = open_index(made["root"] / "float"), open_index(made["root"] / "binary_int8")
    vectors = np.asarray(plain.vectors)
    n, dim = vectors.shape
    assert index.info["vectors"] == {"kind": "binary", "stored": ["binary", "int8"], "oversampling": 4,
                                     "bytes_per_vector": dim // 8, "bytes_stored_per_vector": dim // 8 + dim}
    assert index.vectors is None and set(read_header(made["root"] / "binary_int8" / "vectors.safetensors")) == {
        "document", "passage_offset"}
    ranges = np.stack([vectors.min(0), vectors.max(0)])  # calibrated on the corpus
    np.testing.assert_array_equal(index.ranges, ranges)
    np.testing.assert_array_equal(index.codes, quantize_embeddings(vectors, "ubinary"))
    np.testing.assert_array_equal(index.rescore, quantize_embeddings(vectors, "int8", ranges=ranges))
    on_disk = (made["root"] / "binary_int8" / "codes.safetensors").stat().st_size
    assert n * (dim // 8 + dim) + 2 * dim * 4 <= on_disk < n * (dim // 8 + dim) + 2 * dim * 4 + 512
    # what the Qdrant export writes for it: the int8 rows decoded, the vectors its search rescores against
    np.testing.assert_allclose(rows_or_decoded(index, 0, n), decode(np.asarray(index.rescore), "int8", ranges, dim))


def test_binary_codes_rescored_against_int8_rows_search_as_brute_force(made):
    index = open_index(made["root"] / "binary_int8")
    k = 4  # every row a candidate (see below): the answer is brute force over the decoded int8 rows
    assert k * index.info["max_passages_per_document"] * 4 >= len(index)
    got = search(index, QUERIES, k=k, dtype="float32", fusion={"mode": "dense"})
    from bertkit.retrieval.search import embed_queries, query_encoder

    queries = embed_queries(index.info, query_encoder(index.info, dtype="float32"), QUERIES)
    ranges = index.ranges
    middle = ranges[0] + (np.asarray(index.rescore, np.float32) + 128.5) * (ranges[1] - ranges[0]) / 255
    for hits, (_, scores, rows) in zip(got, brute_force(queries, middle, np.asarray(index.document), k)):
        assert [h.id for h in hits] == [p["id"] for p in index.passages(rows)]
        np.testing.assert_allclose([h.score for h in hits], scores, rtol=1e-5)


def test_codes_only_search_scans_the_decoded_codes_and_keep_float_the_float_rows(made):
    plain, binary, int8 = (open_index(made["root"] / n) for n in ("float", "binary", "int8"))
    k = 4  # 4 documents x the most passages per document x oversampling 4 candidates: every row here
    assert k * binary.info["max_passages_per_document"] * 4 >= len(binary)
    dense = {"mode": "dense"}
    got = search(binary, QUERIES, k=k, dtype="float32", fusion=dense)
    from bertkit.retrieval.search import embed_queries, query_encoder

    queries = embed_queries(binary.info, query_encoder(binary.info, dtype="float32"), QUERIES)
    decoded = decode(np.asarray(binary.codes), "binary", None, binary.info["dim"])
    for hits, (_, scores, rows) in zip(got, brute_force(queries, decoded, np.asarray(binary.document), k)):
        assert [h.id for h in hits] == [p["id"] for p in binary.passages(rows)]
        np.testing.assert_allclose([h.score for h in hits], scores, rtol=1e-5)
    want = search(plain, QUERIES, k=k, dtype="float32", fusion=dense)
    kept = search(int8, QUERIES, k=k, dtype="float32", fusion=dense)
    assert [[h.id for h in a] for a in kept] == [[h.id for h in a] for a in want]
    # hybrid: the lexical part does not depend on the vectors
    lexical = {"mode": "lexical"}
    assert ([[h.id for h in a] for a in search(binary, QUERIES, k=k, fusion=lexical)]
            == [[h.id for h in a] for a in search(plain, QUERIES, k=k, fusion=lexical)])
    assert all(len(a) == k for a in search(binary, QUERIES, k=k, dtype="float32"))


@pytest.mark.parametrize("name", ["binary", "binary_int8"])
def test_evaluate_and_serve_through_a_codes_only_index(made, capsys, name):
    setup = {"root": made["root"], "folder": made["folder"], "index": made["root"] / name}
    out = made["root"] / "figures.json"
    assert main(["evaluate", "retrieval", str(made["folder"]), "--index", str(setup["index"]), "--dtype", "float32",
                 "--mode", "dense", "--output", str(out), "--quiet"]) == 0
    capsys.readouterr()
    got = json.loads(out.read_text())
    want = by_hand(setup, capsys, "--mode", "dense")
    assert got["ndcg@10"] == pytest.approx(want["ndcg@10"], abs=1e-9)
    server = Server(made["tiny"], "--index", setup["index"], "--threads", 1, "--dtype", "float32")
    try:
        status, _, answer = call(server.port, "POST", "/search", {"query": QUERIES, "k": 3, "mode": "dense"})
        _, _, about = call(server.port, "GET", "/info")
    finally:
        assert server.stop() == 0, "".join(server.lines)
    assert status == 200
    assert about["index"]["vectors"] == json.loads((setup["index"] / "index.json").read_text())["vectors"]
    (made["root"] / "q.txt").write_text("\n".join(QUERIES) + "\n")
    assert main(["search", str(setup["index"]), "--queries", str(made["root"] / "q.txt"), "--json", "-k", "3",
                 "--mode", "dense", "--dtype", "float32"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert [[h["id"] for h in a] for a in answer] == [[h["id"] for h in a] for a in want]
    np.testing.assert_allclose([h["score"] for a in answer for h in a], [h["score"] for a in want for h in a],
                               atol=1e-6)


def test_a_codes_only_index_exports_to_qdrant_its_decoded_codes(made, capsys):
    need(importlib.util.find_spec("qdrant_client") is not None, "qdrant-client")
    index, qdrant = made["root"] / "binary", made["root"] / "qdrant"
    assert main(["index", "export", str(index), "--qdrant", str(qdrant), "--collection", "c", "--quiet"]) == 0
    (made["root"] / "q.txt").write_text("\n".join(QUERIES) + "\n")
    answers = {}
    for where in (["--qdrant", str(qdrant), "--collection", "c"], [str(index)]):
        capsys.readouterr()
        assert main(["search", *where, "--queries", str(made["root"] / "q.txt"), "--json", "-k", "4", "--mode",
                     "dense", "--dtype", "float32"]) == 0
        answers[where[0]] = json.loads(capsys.readouterr().out)
    # Qdrant's cosine over the decoded -1/+1 vectors is bertkit's rescoring divided by their norm, sqrt(D): the
    # same scores, and the same documents where a score is not tied (this tiny model codes passages alike)
    dim = open_index(index).info["dim"]
    for got, want in zip(answers["--qdrant"], answers[str(index)]):
        np.testing.assert_allclose([h["score"] * dim**0.5 for h in got], [h["score"] for h in want], rtol=1e-5)
        scores = [round(h["score"], 4) for h in want]
        assert [h["doc_id"] for h, s in zip(got, scores) if scores.count(s) == 1] == [
            h["doc_id"] for h, s in zip(want, scores) if scores.count(s) == 1]


@pytest.mark.parametrize("name, rows", [("binary", None), ("binary_int8", "int8")])
def test_a_codes_only_build_resumes_to_the_same_bytes(made, monkeypatch, tmp_path, name, rows):
    corpus, tiny, common = made["folder"] / "corpus.jsonl", str(made["tiny"]), made["common"]
    real = index_module.write_json

    def fail_at_index_json(path, data):
        if path.name == "index.json":
            raise KeyboardInterrupt  # killed after the float rows were dropped, before the folder became an index
        real(path, data)

    monkeypatch.setattr(index_module, "write_json", fail_at_index_json)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "ix", tiny, vectors="binary", rescore_with=rows, **common)
    monkeypatch.setattr(index_module, "write_json", real)
    assert "vectors" not in read_header(tmp_path / "ix" / "vectors.safetensors")
    with pytest.raises(BertkitError, match=f"rescore_with was {rows!r} in the interrupted run and is 'float32'"):
        build_index(corpus, tmp_path / "ix", tiny, vectors="binary", rescore_with="float32", resume=True, **common)
    build_index(corpus, tmp_path / "ix", tiny, vectors="binary", rescore_with=rows, resume=True, **common)
    for file in ("index.json", "codes.safetensors", "vectors.safetensors", "passages.jsonl"):
        assert (tmp_path / "ix" / file).read_bytes() == (made["root"] / name / file).read_bytes(), file


def _nan_range(folder):
    entry = read_header(folder / "codes.safetensors")["ranges"]
    with open(folder / "codes.safetensors", "r+b") as f:
        f.seek(entry.begin + 4 * 3)
        f.write(np.array([np.nan], dtype="<f4").tobytes())


def _truncate_codes(folder):
    _truncate(folder / "codes.safetensors", lambda n: n - 2 * 32 * 4 - 7)  # into the int8 rows, past the ranges


def _claim(**vectors):
    def edit(folder):
        info = json.loads((folder / "index.json").read_text())
        _edit_info(vectors={**info["vectors"], **vectors})(folder)
    return edit


DAMAGES = {
    "codes missing": ("binary", lambda f: (f / "codes.safetensors").unlink(), "codes.safetensors is missing"),
    "codes truncated": ("binary", lambda f: _truncate(f / "codes.safetensors", lambda n: n - 10), "is truncated"),
    "another kind": ("binary", _claim(kind="int8"), "codes should be I8 \\[\\d+, 32\\]"),
    "an unknown kind": ("binary", _claim(kind="int4"), "vectors kind 'int4' is not float32, int8 or binary"),
    "float rows claimed": ("binary", _claim(stored=["binary", "float32"]), "vectors should be F32 .* no such tensor"),
    "fewer passages": ("binary", _edit_info(passages=3), "should be I64 \\[3\\]"),
    "a NaN range": ("int8", _nan_range, "int8 calibration ranges are not finite"),
    "ranges missing": ("int8", lambda f: shutil.copy(f.parent / "binary_codes", f / "codes.safetensors"),
                       "codes should be I8"),
    "int8 rows missing": ("binary_int8", lambda f: shutil.copy(f.parent / "binary_codes", f / "codes.safetensors"),
                          "rescore should be I8 \\[\\d+, 32\\], .* found no such tensor"),
    "int8 rows claimed": ("binary", _claim(stored=["binary", "int8"]), "rescore should be I8 .* no such tensor"),
    "int8 rows cut short": ("binary_int8", _truncate_codes, "is truncated"),
    "a NaN range beside int8 rows": ("binary_int8", _nan_range, "int8 calibration ranges are not finite"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_codes_file_is_one_line(made, tmp_path, damage):
    which, spoil, says = DAMAGES[damage]
    (tmp_path / "binary_codes").write_bytes((made["root"] / "binary" / "codes.safetensors").read_bytes())
    with pytest.raises(BertkitError, match=says) as err:
        open_index(_damaged(made["root"] / which, tmp_path, spoil))
    assert "bertkit index CORPUS -o INDEX" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flags, says", [
    (["--keep-float"], "--keep-float keeps the float rows beside compact codes: add --vectors int8 or binary"),
    (["--vectors", "int8", "--rescore-with", "int8"], "--rescore-with int8 keeps int8 rows beside binary codes, "
     "and --vectors int8 has none to rescore: use --vectors binary --rescore-with int8"),
    (["--rescore-with", "int8"], "and --vectors float32 has none to rescore"),
    (["--vectors", "binary", "--keep-float", "--rescore-with", "int8"],
     "--keep-float is --rescore-with float32: give one of them, not --rescore-with int8 too"),
])
def test_rows_to_rescore_without_codes_to_rescore_are_one_line(made, tmp_path, flags, says):
    status, err = cli("index", made["folder"], "-o", tmp_path / "ix", *flags)
    assert status == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "ix").exists()
