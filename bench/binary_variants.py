"""One bit per dimension, other ways: which binary code keeps the most of float32's nDCG@10 when rescored
against the code's own reconstruction (the float query against decoded codes, no float rows kept).

    python bench/binary_variants.py --index scifact.index --data data/scifact --split test

Every variant stores D bits per vector (1/32 of float32) plus a per-index table of D or D x D floats
(calibrated on the corpus's vectors, never on queries or judgements):

- sign, -1/+1: `bertkit.retrieval.compact` (sentence-transformers' ubinary, Qdrant's binary quantization);
- sign, side means: bit d decodes to the mean of the corpus's values of dimension d on that side of 0;
- median, side means, unit: dimension d cut at its corpus median (half the corpus on each side), decoded
  to the side means, the decoded vector normalised;
- rotation s, centred: the corpus mean subtracted and a random orthogonal D x D rotation (seed s) applied
  before the sign; decoded to the side means, rotated back, the mean added, normalised (the float query's
  cosine with that estimate).

Every passage is rescored (the asymmetric score's ceiling: on SciFact and SQuAD the `100 x passages x 4`
candidates of a search cover most of the corpus, so Hamming candidates change nothing); documents by
their best passage, nDCG@10 by bertkit.metrics.retrieval.
"""

import argparse

import numpy as np
from compact_quality import doc_run
from harness import load_line, machine_line

from bertkit.data.beir import load_beir
from bertkit.metrics.retrieval import evaluate_run
from bertkit.retrieval.index import open_index
from bertkit.retrieval.search import embed_queries, query_encoder


def side_means(y: np.ndarray, cut) -> np.ndarray:
    """[N, D] each value replaced by the mean of its dimension's values on its side of `cut`."""
    up = y > cut
    hi = np.where(up, y, 0).sum(0) / np.maximum(up.sum(0), 1)
    lo = np.where(~up, y, 0).sum(0) / np.maximum((~up).sum(0), 1)
    return np.where(up, hi, lo).astype(np.float32)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def estimates(x: np.ndarray, seeds=(0, 1, 2)) -> dict:
    """name -> [N, D] what each variant's codes decode to (see the module docstring)."""
    out = {"sign, -1/+1": np.where(x > 0, 1, -1).astype(np.float32), "sign, side means": side_means(x, 0),
           "median, side means, unit": unit(side_means(x, np.median(x, 0)))}
    mean = x.mean(0)
    for seed in seeds:
        rotation, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((x.shape[1],) * 2))
        rotation = rotation.astype(np.float32)
        out[f"rotation {seed}, centred, side means, unit"] = unit(mean + side_means((x - mean) @ rotation, 0)
                                                                  @ rotation.T)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="test")
    args = p.parse_args()
    print(f"Machine: {machine_line()}; {load_line()}; queries embedded in float32", flush=True)
    index = open_index(args.index)
    data = load_beir(args.data, args.split)
    ids = list(data.queries)
    queries = embed_queries(index.info, query_encoder(index.info, dtype="float32"), [data.queries[q] for q in ids])
    x = np.asarray(index.float_rows("bench/binary_variants.py"), np.float32)
    depth = 100 * int(index.info["max_passages_per_document"])
    base = None
    for name, decoded in {"float32": x, **estimates(x)}.items():
        scores = queries @ decoded.T
        rows = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        ndcg = evaluate_run(data.qrels, doc_run(index, ids, np.take_along_axis(scores, rows, 1), rows))["ndcg@10"]
        base = base or ndcg
        print(f"| {name} | {ndcg:.4f} | {ndcg / base:.3f} |", flush=True)


if __name__ == "__main__":
    main()
