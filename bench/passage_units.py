"""Two indexes of one corpus cut into different passages, compared query by query (issue 40, a fourth pass).

    bertkit index data/scifact -o scifact128.index --passage-tokens 128 --dtype float32
    python bench/passage_units.py scifact.index scifact128.index data/scifact --split train --out train.json

A is the first index (today's cut: the model's max length, 256 tokens for the default model), B the second.
Each index gives its dense and lexical runs as `bench/hybrid_feedback.py` makes them (a document by its best
passage, each run's best 100 documents, fused by DBSF with the default alpha); besides A's and B's own hybrid,
the two mixes fuse one index's dense run with the other's lexical run (documents are shared, passages not).
Every figure is nDCG@10 with the paired per-query difference to A's hybrid and its standard error.
"""

import argparse
import json

from harness import load_line, machine_line
from hybrid_feedback import Split, fused, ndcgs, paired

from bertkit.data.beir import load_beir
from bertkit.retrieval.config import DEFAULT_ALPHA
from bertkit.retrieval.index import open_index


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the first index (the baseline)")
    ap.add_argument("b", help="the second index, of the same corpus")
    ap.add_argument("data", help="the BEIR folder both were built from")
    ap.add_argument("--split", default="test")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    print(f"Machine: {machine_line()}; {load_line()}; queries embedded in float32", flush=True)
    data = load_beir(args.data, args.split)
    a, b = Split(open_index(args.a), data), Split(open_index(args.b), data)
    every = [DEFAULT_ALPHA] * len(a.query_ids)

    def score(answers):
        return paired(ndcgs(data, a.query_ids, answers), a.base)

    figures = {"A dense": score(a.dense), "A lexical": score(a.lexical_run), "A hybrid": score(a.first),
               "B dense": score(b.dense), "B lexical": score(b.lexical_run), "B hybrid": score(b.first),
               "dense B + lexical A": score(fused(b.dense, a.lexical_run, every)),
               "dense A + lexical B": score(fused(a.dense, b.lexical_run, every))}
    for name, figure in figures.items():
        print(f"{name:22s} {figure}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
