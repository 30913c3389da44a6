"""A `bertkit distill layers` student against its teacher, in one process (docs/distill.md).

    python bench/bench_layers.py STUDENT [--teacher DIR] [--rounds 3] [--docs 300] [--dev FILE]

A sentence model: encode throughput (texts/s, 2 threads, bf16 where the CPU has it: `dtype="auto"`),
interleaved round-robin, median of --rounds, on STS-B dev's 3,000 sentences and the first --docs
SciFact documents (cut at the layout's 256 tokens, as both embed them).
A fine-tuned teacher (--teacher): `bertkit.predict` throughput on --dev's inputs (default SST-2
dev), the same way, and both models' dev scores (`predict_file`'s evaluate mode) in float32 and
in the timed precision.
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
from bertkit.runtime.loading import load  # noqa: E402
from bertkit.tasks.predict import load_task_model, predict_file, task_of  # noqa: E402


def classifier_report(args, report: dict) -> None:
    """Prediction throughput and dev scores of a fine-tuned teacher and its student."""
    teacher, student = (load_task_model(d, dtype="auto") for d in (args.teacher, args.student))
    report["precision"] = teacher.precision
    texts, pairs = task_of(teacher).read_inputs(args.dev, teacher.info)
    times = interleaved({name: (lambda m=m: bertkit.predict(None, texts, pairs, loaded=m, batch_size=64))
                         for name, m in (("teacher", teacher), ("student", student))}, rounds=args.rounds, warmup=1)
    rates = {k: round(len(texts) / statistics.median(v), 1) for k, v in times.items()}
    rates["student / teacher"] = round(rates["student"] / rates["teacher"], 2)
    report["throughput"] = {Path(args.dev).name: rates}
    report["dev"] = {}
    for dtype in (None, "auto"):
        for name, d in (("teacher", args.teacher), ("student", args.student)):
            metrics = predict_file(d, args.dev, os.devnull, dtype=dtype).metrics
            report["dev"][f"{name} {'float32' if dtype is None else teacher.precision}"] = {
                k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("student")
    ap.add_argument("--teacher", default=None, help="default: the default model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--dev", default=str(SHARED_DATA / "sst2" / "dev.tsv"), help="a fine-tuned teacher's dev table")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.teacher is not None and load(args.teacher, fast=False).fine_tuned:
        report = {"machine": machine_line(), "load_before": os.getloadavg()}
        classifier_report(args, report)
        report["load_after"] = os.getloadavg()
        print(json.dumps(report, indent=2))
        return
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
