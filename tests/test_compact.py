"""Compact vectors: int8 codes equal sentence-transformers' quantize_embeddings, binary codes its ubinary,
search by codes + rescoring equals brute force over the decoded vectors when every row is a candidate, and
binary codes rescored against int8 rows (sentence-transformers' binary index + int8 rescoring) equal Hamming
candidates and the float query's dot products with their decoded int8 rows, computed by hand, reading only
the candidates' rows."""

import importlib.util

import numpy as np
import pytest
from conftest import need

from bertkit.errors import BertkitError
from bertkit.retrieval import compact
from bertkit.retrieval.compact import _candidates, compact_top_k, decode, encode, int8_ranges


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_codes_equal_sentence_transformers_quantize_embeddings():
    need(importlib.util.find_spec("sentence_transformers") is not None, "sentence-transformers (the oracle)")
    from sentence_transformers.util import quantize_embeddings

    rng = np.random.default_rng(0)
    corpus, queries = unit(rng, 500, 37), unit(rng, 20, 37)
    ranges = int8_ranges(corpus, block=64)  # read in blocks: the same ranges as in one piece
    np.testing.assert_array_equal(ranges, np.stack([corpus.min(0), corpus.max(0)]))
    for x in (corpus, queries):
        np.testing.assert_array_equal(encode(x, "int8", ranges), quantize_embeddings(x, "int8", ranges=ranges))
        np.testing.assert_array_equal(encode(x, "binary"), quantize_embeddings(x, "ubinary"))
    # decoding: within half a step of the original, and the sign of every coordinate for binary
    step = (ranges[1] - ranges[0]) / 255
    assert np.all(np.abs(decode(encode(corpus, "int8", ranges), "int8", ranges, 37) - corpus) <= step / 2 + 1e-6)
    np.testing.assert_array_equal(decode(encode(corpus, "binary"), "binary", None, 37), np.where(corpus > 0, 1, -1))


@pytest.mark.parametrize("kind", ["int8", "binary"])
def test_rescoring_every_row_is_brute_force_over_the_decoded_vectors(kind):
    rng = np.random.default_rng(1)
    corpus, queries = unit(rng, 300, 40), unit(rng, 9, 40)
    ranges = int8_ranges(corpus)
    codes = encode(corpus, kind, ranges)
    scores, rows = compact_top_k(queries, codes, kind, 10, ranges=ranges, oversampling=30, block_size=64)
    brute = queries @ decode(codes, kind, ranges, 40).T
    want = np.argsort(-brute, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, want, 1), rtol=1e-5)
    # rescored with the original float rows instead: every row a candidate gives the exact float search
    scores, rows = compact_top_k(queries, codes, kind, 10, ranges=ranges, oversampling=30, rescore_rows=corpus)
    exact = queries @ corpus.T
    np.testing.assert_array_equal(rows, np.argsort(-exact, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(scores, np.sort(exact, axis=1)[:, ::-1][:, :10], rtol=1e-5)


class Recorded:
    """Rows whose reads are recorded: what a memory map would page in."""

    def __init__(self, rows):
        self.rows, self.read = rows, []

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, key):
        self.read.append(np.asarray(key))
        return self.rows[key]


def test_binary_candidates_rescored_against_int8_rows_as_computed_by_hand():
    need(importlib.util.find_spec("sentence_transformers") is not None, "sentence-transformers (the oracle)")
    from sentence_transformers.util import quantize_embeddings

    rng = np.random.default_rng(3)
    n, d, k, over = 400, 40, 5, 3
    corpus, queries = unit(rng, n, d), unit(rng, 7, d)
    ranges = np.stack([corpus.min(0), corpus.max(0)])
    int8_rows = Recorded(quantize_embeddings(corpus, "int8", ranges=ranges))
    scores, rows = compact_top_k(queries, quantize_embeddings(corpus, "ubinary"), "binary", k, ranges=ranges,
                                 oversampling=over, block_size=64, rescore_rows=int8_rows)
    middle = ranges[0] + (int8_rows.rows.astype(np.float32) + 128.5) * (ranges[1] - ranges[0]) / 255
    assert len(int8_rows.read) == len(queries)  # one read per query, of its candidates' rows alone
    for q, got_scores, got_rows, read in zip(queries, scores, rows, int8_rows.read):
        differing = ((corpus > 0) != (q > 0)).sum(1)  # Hamming distance of the sign bits
        candidates = np.sort(np.lexsort((np.arange(n), differing))[: k * over])  # fewest, ties to the lower row
        np.testing.assert_array_equal(np.sort(read), candidates)
        rescored = middle[candidates] @ q  # the float query against the decoded int8 rows
        best = np.argsort(-rescored, kind="stable")[:k]
        np.testing.assert_array_equal(got_rows, candidates[best])
        np.testing.assert_allclose(got_scores, rescored[best], rtol=1e-5)


@pytest.mark.parametrize("kind, d, tile_rows", [("binary", 128, 0), ("binary", 24, 0), ("int8", 8, 0), ("int8", 8, 3)])
def test_candidates_are_the_fewest_differing_bits_ties_to_the_lower_row_whatever_the_block(kind, d, tile_rows,
                                                                                            monkeypatch):
    # few dimensions: many equal scores, so the tie rule decides most candidates; 64-bit and 8-bit words;
    # int8 codes widened 3 rows at a time as well as whole
    if tile_rows:
        monkeypatch.setattr(compact, "INT8_TILE_BYTES", tile_rows * d * 4)
    rng = np.random.default_rng(5)
    corpus, queries = unit(rng, 300, d), unit(rng, 6, d)
    ranges = int8_ranges(corpus)
    codes, query_codes = encode(corpus, kind, ranges), encode(queries, kind, ranges)
    for depth in (1, 13, 40):
        want = []
        for q, v in zip(queries, query_codes):
            if kind == "binary":  # the sign bits compared by hand
                score = -((corpus > 0) != (q > 0)).sum(1)
            else:
                score = codes.astype(np.int64) @ v.astype(np.int64)
            want.append(np.lexsort((np.arange(len(corpus)), -score))[:depth])  # best, ties to the lower row
        for block in (1, 7, 64, 300):
            got = _candidates(query_codes, codes, kind, depth, block)
            np.testing.assert_array_equal(np.sort(got, 1), np.sort(np.array(want), 1))


def test_codes_find_the_float_neighbours_with_oversampling():
    """A property, not a figure: on clustered vectors the int8 top 10 is nearly the float one, binary's less."""
    rng = np.random.default_rng(2)
    centres = unit(rng, 40, 64)
    corpus = centres[rng.integers(0, 40, 4000)] + 0.3 * rng.standard_normal((4000, 64)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    queries = corpus[:50] + 0.2 * rng.standard_normal((50, 64)).astype(np.float32)  # near the data
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    ranges = int8_ranges(corpus)
    recall = {}
    for kind in ("int8", "binary"):
        _, rows = compact_top_k(queries, encode(corpus, kind, ranges), kind, 10, ranges=ranges, oversampling=4)
        recall[kind] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact)])
    # chance would find 10 / 4000 of them
    assert recall["int8"] >= 0.95 and 0.2 <= recall["binary"] <= recall["int8"], recall


def test_bad_kinds_are_one_line():
    with pytest.raises(BertkitError, match="unknown vector kind 'int4'"):
        encode(np.ones((1, 8), np.float32), "int4")
    with pytest.raises(BertkitError, match="oversampling must be at least 1"):
        compact_top_k(np.ones((1, 8), np.float32), np.zeros((3, 1), np.uint8), "binary", 2, oversampling=0)


@pytest.mark.parametrize("kind, flags", [("int8", ["--keep-float"]), ("binary", ["--rescore-with", "float32"])])
def test_an_index_with_codes_and_float_rows_answers_as_the_float_scan(shared_data, tmp_path, kind, flags):
    from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus

    from bertkit.cli import main
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.search import search

    tiny = make_tiny(tmp_path / "tiny")
    corpus = scifact_corpus(shared_data, tmp_path / "corpus.jsonl", n=8)
    assert main(["index", str(corpus), "-o", str(tmp_path / "ix"), "--model", str(tiny), "--passage-tokens",
                 str(TOKENS), "--overlap", str(OVERLAP), "--dtype", "float32", "--vectors", kind, *flags,
                 "--no-lexical", "--quiet"]) == 0
    index = open_index(tmp_path / "ix")
    assert index.info["vectors"]["kind"] == kind
    vectors = np.asarray(index.vectors)
    ranges = int8_ranges(vectors) if kind == "int8" else None
    np.testing.assert_array_equal(index.codes, encode(vectors, kind, ranges))  # the codes written are compact's
    queries = ["vitamin D and bone fractures", "stem cells", "tumour growth in mice"]
    # 4 documents x the most passages per document x oversampling 4 candidates cover every row here: the
    # rescored answer is the float scan's
    assert 4 * index.info["max_passages_per_document"] * 4 >= len(index)
    coded = search(index, queries, k=4, dtype="float32", fusion={"mode": "dense"})
    index.codes = None
    plain = search(index, queries, k=4, dtype="float32", fusion={"mode": "dense"})
    assert [[h.id for h in a] for a in coded] == [[h.id for h in a] for a in plain]
    np.testing.assert_allclose([h.score for a in coded for h in a], [h.score for a in plain for h in a], rtol=1e-6)
