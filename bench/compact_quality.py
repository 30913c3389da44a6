"""Compact vectors on a real index: nDCG@10 of int8 and binary codes with rescoring against float32.

    python bench/compact_quality.py --index scifact.index --data data/scifact --split test

The index's float32 passage vectors are coded (`bertkit.retrieval.compact`), the split's queries embedded by
the index's model, the passages ranked by the codes and rescored with the float query (k x oversampling
candidates), documents by their best passage; the figures are bertkit.metrics.retrieval's.
Also a synthetic size/speed run: `--synthetic N` unit vectors of the index's dimension.
"""

import argparse
import json
import time

import numpy as np

from bertkit.data.beir import load_beir
from bertkit.metrics.retrieval import evaluate_run
from bertkit.retrieval.compact import compact_top_k, encode, int8_ranges
from bertkit.retrieval.documents import first_per_document
from bertkit.retrieval.exact import top_k
from bertkit.retrieval.index import document_ids, open_index
from bertkit.retrieval.search import embed_queries, query_encoder


def doc_run(index, ids, scores, rows, k=100):
    names = document_ids(index)
    out = {}
    for q, s, r in zip(ids, scores, rows):
        kept = first_per_document(list(zip(r.tolist(), s.tolist())), lambda item: int(index.document[item[0]]), k)
        out[q] = {names[int(index.document[row])]: float(score) for row, score in kept}
    return out


def quality(args):
    index = open_index(args.index)
    data = load_beir(args.data, args.split)
    ids = list(data.queries)
    loaded = query_encoder(index.info, dtype="float32")
    queries = embed_queries(index.info, loaded, [data.queries[q] for q in ids])
    depth = 100 * int(index.info["max_passages_per_document"])
    vectors = np.asarray(index.vectors)
    ranges = int8_ranges(vectors)
    rows = {"float32": top_k(queries, vectors, depth, normalized=True)}
    for kind in ("int8", "binary"):
        codes = encode(vectors, kind, ranges)
        for over in args.oversampling:
            rows[f"{kind} x{over}"] = compact_top_k(queries, codes, kind, depth, ranges=ranges, oversampling=over)
            rows[f"{kind} x{over}, float rescoring"] = compact_top_k(queries, codes, kind, depth, ranges=ranges,
                                                                     oversampling=over, float_vectors=index.vectors)
    base = None
    for name, (scores, found) in rows.items():
        figures = evaluate_run(data.qrels, doc_run(index, ids, scores, found))
        base = base or figures["ndcg@10"]
        print(f"| {name} | {figures['ndcg@10']:.4f} | {figures['ndcg@10'] / base:.4f} | {figures['recall@100']:.4f} |")


def speed(args):
    rng = np.random.default_rng(0)
    n, d = args.synthetic, 384
    vectors = np.empty((n, d), np.float32)
    for start in range(0, n, 100_000):
        part = rng.standard_normal((min(100_000, n - start), d)).astype(np.float32)
        vectors[start : start + len(part)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    queries = vectors[rng.integers(0, n, args.queries)] + 0.1 * rng.standard_normal((args.queries, d)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ranges = int8_ranges(vectors)
    results = {}
    for kind in ("float32", "int8", "binary"):
        codes = vectors if kind == "float32" else encode(vectors, kind, ranges)
        t0 = time.perf_counter()
        if kind == "float32":
            top_k(queries, codes, 10, normalized=True)
        else:
            compact_top_k(queries, codes, kind, 10, ranges=ranges, oversampling=4)
        seconds = time.perf_counter() - t0
        results[kind] = {"bytes": int(codes.nbytes), "queries_per_s": args.queries / seconds}
    print(json.dumps({"n": n, "dim": d, "queries": args.queries, **results}, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index")
    p.add_argument("--data")
    p.add_argument("--split", default="test")
    p.add_argument("--oversampling", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--synthetic", type=int, help="also time N synthetic unit vectors (size and queries/s)")
    p.add_argument("--queries", type=int, default=64)
    args = p.parse_args()
    if args.index:
        quality(args)
    if args.synthetic:
        speed(args)
