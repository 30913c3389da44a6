"""The figures of trained static folders (`finetune embed --static`, docs/distill.md), one row each:

    python bench/static_quality.py FOLDER... [--json OUT]

SciFact **train** nDCG@10 (the dev set settings were chosen on: its 809 train claims against the
whole corpus), SciFact test nDCG@10 (the goal), and held out (nothing chosen on them) STS-B dev
Spearman and SQuAD v1.1 dev as retrieval (bench_distill.squad_retrieval), each through `bertkit.embed`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_distill import load, quality, squad_quality, squad_retrieval  # noqa: E402
from harness import SHARED_DATA  # noqa: E402

import bertkit  # noqa: E402
from bertkit.data.beir import load_beir  # noqa: E402
from bertkit.embeddings.features import load_encoder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    pairs, sentences, scifact_test = load()
    scifact_train = load_beir(SHARED_DATA / "retrieval" / "scifact", "train")
    squad = squad_retrieval()
    rows = {}
    for folder in args.folders:
        model = load_encoder(folder)
        encode = lambda t: bertkit.embed(t, model)  # noqa: E731
        test = quality(encode, pairs, sentences, scifact_test)
        train = quality(encode, pairs[:2], sentences, scifact_train)["scifact_ndcg@10"]
        rows[folder] = {"scifact_train_ndcg@10": train, "scifact_test_ndcg@10": test["scifact_ndcg@10"],
                        "stsb_dev_spearman": test["stsb_dev_spearman"], "squad_dev_ndcg@10": squad_quality(encode, squad)}
        print(folder, json.dumps(rows[folder]), f"load {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
