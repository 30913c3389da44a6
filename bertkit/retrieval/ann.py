"""Approximate search: an HNSW graph (FAISS) built next to an index's exact vectors.

Exact search reads every vector for every query; past a few million vectors a
query takes too long on one core. HNSW (Malkov and Yashunin 2018, "Efficient
and robust approximate nearest neighbor search using Hierarchical Navigable
Small World graphs") links each vector to `M` near neighbours on a few layers
and answers by a greedy walk that keeps the `ef_search` best candidates: a
query touches thousands of vectors instead of all of them, and may miss some
of the true top-k. FAISS's `IndexHNSWFlat` with the inner product (our rows are
unit length, so it is the cosine) is the implementation; its parameters are
the factory string's (`HNSW32`, efConstruction, efSearch).

The graph is `INDEX/hnsw.faiss`; the exact vectors stay beside it, so the
recall can always be measured: `recall_at_10` takes `held_out` passages (a
seeded sample) as queries, drops each query's own row from both answers
(leave-one-out: a passage finds itself trivially), and counts how many of the
exact top 10 the graph also returns. Unlike the exact scan, the graph holds
every vector in memory (N x D x 4 bytes plus about N x M x 8 for the links).

FAISS is optional (`pip install 'bertkit[search]'`) and imported only here,
when an ANN index is built or searched.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bertkit.data.atomic import room_for, write_through
from bertkit.errors import BertkitError, MissingPackage, int_at_least
from bertkit.retrieval.exact import top_k

HNSW_FILE = "hnsw.faiss"
KINDS = ("hnsw",)
HELD_OUT = 200  # passages taken as queries to measure the recall: the mean's standard error <= 0.035


def faiss_module():
    """The faiss package, or one line saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise MissingPackage("--ann hnsw needs FAISS: pip install 'bertkit[search]' (faiss-cpu)") from None
    return faiss


def check_kind(kind: str, m: int = 32, ef_construction: int = 200, ef_search: int = 128) -> None:
    """The graph's kind and sizes, refused before any encoding: FAISS takes M 1 or 0 without a word and then
    ends the process (a segmentation fault, a failed C++ assertion) while it builds the graph."""
    if kind not in KINDS:
        raise BertkitError(f"unknown --ann {kind!r}: use {', '.join(KINDS)}")
    for name, value, least in (("--ann-m", m, 2), ("--ef-construction", ef_construction, 1),
                               ("--ef-search", ef_search, 1)):
        int_at_least(value, least, name)


def build_hnsw(vectors: np.ndarray, path, *, m: int = 32, ef_construction: int = 200,
               block_size: int = 16384, progress: bool = False) -> None:
    """An HNSW graph over unit rows `vectors` [N, D] (a memory map is read a block at a time),
    written to `path` through a temporary file, once its disk is known to have room for it (`hnsw_bytes`)."""
    faiss = faiss_module()
    room_for(Path(path).parent, hnsw_bytes(len(vectors), vectors.shape[1], m), "the HNSW graph's vectors and links")  # before the build
    graph = faiss.IndexHNSWFlat(vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = ef_construction
    with tqdm(total=len(vectors), disable=not progress, desc="building HNSW", unit="vector") as bar:
        for start in range(0, len(vectors), block_size):
            graph.add(np.ascontiguousarray(vectors[start : start + block_size], dtype=np.float32))
            bar.update(min(block_size, len(vectors) - start))
    write_through(path, lambda tmp: faiss.write_index(graph, str(tmp)))


def hnsw_bytes(n: int, dim: int, m: int) -> int:
    """A lower bound of the graph file's size: faiss writes every vector (D float32) and every node's 2M level-0
    neighbour slots (int32, -1 where unused), besides the upper levels, the node levels and offsets, the header."""
    return n * (dim + 2 * m) * 4


def read_hnsw(path, pinned=None, vectors: int | None = None):
    """The graph at `path`, read from `pinned` when given (its file opened beforehand, `Index.files`: the graph
    of that build even if the folder was built again since); `vectors`: the number it must hold."""
    path = Path(path)
    if pinned is None and not path.is_file():
        raise BertkitError(f"{path.parent} has no ANN index ({path.name}): add one with bertkit index add "
                           f"{path.parent} --ann hnsw, or search without --ann")
    faiss = faiss_module()
    if pinned is None:
        graph = faiss.read_index(str(path))
    else:
        fd, read = pinned.fileno(), [0]

        def chunk(n: int) -> bytes:  # pread: no file position shared with another reader
            data = os.pread(fd, n, read[0])
            read[0] += len(data)
            return data

        graph = faiss.read_index(faiss.PyCallbackIOReader(chunk))
    if vectors is not None and graph.ntotal != vectors:
        raise BertkitError(f"{path} holds {graph.ntotal} vectors and its index {vectors}: it was built for another "
                           "index; build the index again with bertkit index ... --ann hnsw --overwrite")
    return graph


def ann_top_k(graph, queries: np.ndarray, k: int, ef_search: int) -> tuple[np.ndarray, np.ndarray]:
    """(cosines [Q, k], rows [Q, k]) from the graph, best first; rows of -1 where it found fewer."""
    queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
    queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)  # as exact.top_k
    # the walk must keep at least k candidates; passed per call, so a graph shared by callers is not changed
    params = faiss_module().SearchParametersHNSW(efSearch=max(ef_search, k))
    scores, rows = graph.search(np.ascontiguousarray(queries), k, params=params)
    return scores, rows.astype(np.int64)


def build_measured(vectors: np.ndarray, path, *, m: int, ef_construction: int, ef_search: int,
                   progress: bool = False) -> dict:
    """Build the graph at `path` (with a progress bar if asked) and measure it: what index.json records
    under "ann"."""
    build_hnsw(vectors, path, m=m, ef_construction=ef_construction, progress=progress)
    return {"kind": "hnsw", "m": m, "ef_construction": ef_construction, "ef_search": ef_search,
            "held_out": min(HELD_OUT, len(vectors)),
            "recall@10": recall_at_10(read_hnsw(path), vectors, ef_search=ef_search)}


def recall_at_10(graph, vectors: np.ndarray, *, held_out: int = HELD_OUT, ef_search: int = 128, seed: int = 0) -> float:
    """Mean share of the exact top 10 that the graph returns, over `held_out` passages as queries,
    each query's own row left out of both answers."""
    n = len(vectors)
    if n < 2:
        return 1.0
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(held_out, n), replace=False))
    queries = np.asarray(vectors[rows], dtype=np.float32)
    k = min(10, n - 1)
    _, exact = top_k(queries, vectors, k + 1, normalized=True)
    _, approx = ann_top_k(graph, queries, k + 1, ef_search)
    found = []
    for own, e, a in zip(rows, exact, approx):
        e = [r for r in e if r != own][:k]
        a = [r for r in a if r != own and r >= 0][:k]
        found.append(len(set(e) & set(a)) / k)
    return float(np.mean(found))
