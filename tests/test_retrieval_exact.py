"""Exact cosine top-k: the same ids and scores as a numpy brute force, across blocks and on a memmap."""

import numpy as np
import pytest

from bertkit.errors import BertkitError
from bertkit.retrieval.exact import top_k


def brute_force(queries, vectors, k):
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    scores = q.astype(np.float64) @ v.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("block_size, query_block", [(1000, 64), (37, 5), (1, 3)])
def test_same_ids_and_scores_as_brute_force_across_blocks(block_size, query_block):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((503, 24)).astype(np.float32)
    queries = rng.standard_normal((23, 24)).astype(np.float32)
    scores, ids = top_k(queries, vectors, k=10, block_size=block_size, query_block=query_block)
    want_scores, want_ids = brute_force(queries, vectors, 10)
    assert scores.shape == ids.shape == (23, 10) and scores.dtype == np.float32 and ids.dtype == np.int64
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-6)


def test_memory_mapped_vectors(tmp_path):
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((2000, 16)).astype(np.float32)
    path = tmp_path / "vectors.npy"
    np.save(path, vectors)
    mapped = np.load(path, mmap_mode="r")
    assert isinstance(mapped, np.memmap)
    queries = rng.standard_normal((7, 16)).astype(np.float32)
    scores, ids = top_k(queries, mapped, k=25, block_size=300)
    want_scores, want_ids = brute_force(queries, vectors, 25)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-6)


def test_ties_keep_the_lowest_rows_whatever_the_block_size():
    vectors = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [2, 0], [0, 3]], dtype=np.float32)
    for block in (1, 2, 4, 6):
        scores, ids = top_k(np.array([[1.0, 0.0]]), vectors, k=3, block_size=block)
        assert ids.tolist() == [[0, 2, 3]], block  # rows 0, 2, 3, 4 all score 1: the lowest three win
        np.testing.assert_allclose(scores, [[1, 1, 1]])


def test_normalized_vectors_score_by_dot_product_and_k_is_capped():
    vectors = np.eye(3, dtype=np.float32)
    scores, ids = top_k(np.array([0.6, 0.8, 0.0]), vectors, k=10, normalized=True)
    assert ids.tolist() == [[1, 0, 2]]
    np.testing.assert_allclose(scores, [[0.8, 0.6, 0.0]], atol=1e-7)


def test_mismatched_dimensions_are_refused():
    with pytest.raises(BertkitError, match="same model"):
        top_k(np.ones((1, 3)), np.ones((5, 4)), k=2)
