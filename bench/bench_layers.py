"""A `bertkit distill layers` student against its teacher, in one process (docs/distill.md).

    python bench/bench_layers.py STUDENT [--teacher DIR] [--rounds 3] [--docs 300]

Encode throughput (texts/s, 2 threads, bf16 where the CPU has it: `dtype="auto"`), interleaved
round-robin, median of --rounds, on STS-B dev's 3,000 sentences and the first --docs SciFact
documents (cut at the layout's 256 tokens, as both embed them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, machine_line  # noqa: E402

import bertkit  # noqa: E402
from bertkit.data.beir import document_text, read_corpus  # noqa: E402
from bertkit.embeddings.features import load_encoder as encoder  # noqa: E402
from bertkit.retrieval.evaluation import read_sts  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("student")
    ap.add_argument("--teacher", default=None, help="default: the default model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(2)
    pairs = read_sts(SHARED_DATA / "stsb" / "dev.tsv")
    sentences = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))
    corpus = read_corpus(SHARED_DATA / "retrieval" / "scifact")
    docs = [document_text(corpus[d]) for d in list(corpus)[: args.docs]]
    teacher, student = encoder(args.teacher, dtype="auto"), encoder(args.student, dtype="auto")
    report = {"machine": machine_line(), "load_before": os.getloadavg(), "precision": teacher.precision,
              "throughput": {}}
    for name, texts in (("stsb_dev_sentences", sentences), ("scifact_documents", docs)):
        times = interleaved({"teacher": lambda: bertkit.embed(texts, teacher, batch_size=64),
                             "student": lambda: bertkit.embed(texts, student, batch_size=64)},
                            rounds=args.rounds, warmup=1)
        rates = {k: round(len(texts) / statistics.median(v), 1) for k, v in times.items()}
        rates["student / teacher"] = round(rates["student"] / rates["teacher"], 2)
        report["throughput"][name] = rates
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
