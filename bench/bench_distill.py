"""Static models against model2vec and the default model, in one process (docs/distill.md).

    python bench/bench_distill.py [--out DIR] [--rounds 3] [--docs 1000] [--skip-distill | --only-ours]

1. Distillation time: `bertkit distill static` (float32 teacher) and model2vec's `distill` of the same
   local default-model folder (pca_dims 256, its defaults), one after the other.
2. Quality, each model embedding the same texts: STS-B dev Spearman of the cosine, SciFact test
   nDCG@10 and, held out (nothing was tuned on it), SQuAD v1.1 dev as retrieval (question -> its
   paragraph among the 2,067) nDCG@10 (bertkit.metrics), for bertkit's static folder (through `bertkit.embed`), model2vec's
   (its own `StaticModel.encode`), and, when --static-trained is given, a trained static folder.
   The default model's figures (0.645 / STS-B from `bertkit evaluate`) are measured too unless
   --skip-teacher-quality.
3. Throughput (texts/s, 2 threads), interleaved round-robin, median of --rounds: bertkit static,
   model2vec's encode, the default model in bf16 (`bertkit.embed(dtype="auto")`), on STS-B dev's
   3,000 sentences and the first --docs SciFact documents; and the tokenizers alone
   (bertkit's ids-only path, its full encode_batch, model2vec's Rust tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, interleaved, machine_line  # noqa: E402

import bertkit  # noqa: E402
from bertkit.data.beir import document_text, load_beir  # noqa: E402
from bertkit.default_model import default_model_dir  # noqa: E402
from bertkit.distill.config import StaticDistillConfig  # noqa: E402
from bertkit.distill.static import distill_static  # noqa: E402
from bertkit.embeddings.features import load_encoder as encoder  # noqa: E402
from bertkit.metrics.retrieval import evaluate_run  # noqa: E402
from bertkit.metrics.tasks import spearman  # noqa: E402
from bertkit.retrieval.evaluation import dense_run, read_sts  # noqa: E402


def load() -> tuple:
    pairs = read_sts(SHARED_DATA / "stsb" / "dev.tsv")
    sentences = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))
    return pairs, sentences, load_beir(SHARED_DATA / "retrieval" / "scifact", "test")


def squad_retrieval() -> tuple[dict, dict, dict]:
    """SQuAD v1.1 dev as retrieval, a set nothing here was tuned on: each question's relevant document is
    the paragraph it was asked about, among all 2,067 dev paragraphs. (corpus, queries, qrels)."""
    data = json.loads((SHARED_DATA / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    corpus, queries, qrels = {}, {}, {}
    for article in data:
        for paragraph in article["paragraphs"]:
            doc = f"p{len(corpus)}"
            corpus[doc] = paragraph["context"]
            for qa in paragraph["qas"]:
                queries[qa["id"]] = qa["question"]
                qrels[qa["id"]] = {doc: 1}
    return corpus, queries, qrels


def squad_quality(encode, squad) -> float:
    """SQuAD dev retrieval nDCG@10 of `encode(texts) -> [N, D]`."""
    corpus, queries, qrels = squad
    docs = unit(encode(list(corpus.values())))
    vectors = unit(encode(list(queries.values())))
    run = dense_run(vectors, list(queries), docs, list(corpus))
    return round(evaluate_run(qrels, run, ("ndcg@10",))["ndcg@10"], 4)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def quality(encode, pairs, sentences, scifact) -> dict:
    """STS-B dev Spearman and SciFact test nDCG@10 of `encode(texts) -> [N, D]`."""
    row = {s: i for i, s in enumerate(sentences)}
    v = unit(encode(sentences))
    sts = spearman([float(v[row[a]] @ v[row[b]]) for a, b, _ in pairs], [float(s) for _, _, s in pairs])
    doc_ids, query_ids = list(scifact.corpus), list(scifact.queries)
    docs = unit(encode([document_text(scifact.corpus[d]) for d in doc_ids]))
    queries = unit(encode([scifact.queries[q] for q in query_ids]))
    ndcg = evaluate_run(scifact.qrels, dense_run(queries, query_ids, docs, doc_ids), ("ndcg@10",))["ndcg@10"]
    return {"stsb_dev_spearman": round(sts, 4), "scifact_ndcg@10": round(ndcg, 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="where the distilled folders go (default: a temporary folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", type=int, default=1000, help="SciFact documents timed (the first N)")
    ap.add_argument("--skip-distill", action="store_true", help="reuse OUT/bertkit and OUT/model2vec")
    ap.add_argument("--only-ours", action="store_true", help="distil bertkit's folder again, reuse OUT/model2vec")
    ap.add_argument("--skip-teacher-quality", action="store_true")
    ap.add_argument("--static-trained", default=None, help="also score this static folder (finetune embed --static)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from model2vec import StaticModel
    from model2vec.distill import distill as m2v_distill

    out = Path(args.out or tempfile.mkdtemp(prefix="bench_distill_"))
    report = {"machine": machine_line("model2vec", "tokenizers"), "load_before": os.getloadavg()}
    teacher = default_model_dir()
    if not args.skip_distill:
        t = time.perf_counter()
        distill_static(str(teacher), out / "bertkit", StaticDistillConfig(), progress=False)
        report["distill_seconds_bertkit"] = round(time.perf_counter() - t, 1)
        if not args.only_ours:
            t = time.perf_counter()
            m2v_distill(str(teacher), pca_dims=256).save_pretrained(str(out / "model2vec"))
            report["distill_seconds_model2vec"] = round(time.perf_counter() - t, 1)
        report["load_after_distill"] = os.getloadavg()
    m2v = StaticModel.from_pretrained(str(out / "model2vec"))
    ours = encoder(str(out / "bertkit"))
    pairs, sentences, scifact = load()

    squad = squad_retrieval()
    encoders = {"bertkit static": lambda t: bertkit.embed(t, ours), "model2vec": lambda t: m2v.encode(t)}
    if args.static_trained:
        trained = encoder(args.static_trained)
        encoders["bertkit static, trained"] = lambda t: bertkit.embed(t, trained)
    report["quality"] = {}
    for name, encode in encoders.items():
        report["quality"][name] = {**quality(encode, pairs, sentences, scifact),
                                   "squad_dev_ndcg@10": squad_quality(encode, squad)}
    teacher_loaded = encoder(None, dtype="auto")
    if not args.skip_teacher_quality:
        encode = lambda t: bertkit.embed(t, teacher_loaded, batch_size=64)  # noqa: E731
        report["quality"]["default model (bf16)"] = {**quality(encode, pairs, sentences, scifact),
                                                     "squad_dev_ndcg@10": squad_quality(encode, squad)}
    report["load_after_quality"] = os.getloadavg()

    docs = [document_text(scifact.corpus[d]) for d in list(scifact.corpus)[: args.docs]]
    tok = ours.tokenizer
    report["throughput"] = {}
    for name, texts in (("stsb_dev_sentences", sentences), ("scifact_documents", docs)):
        contenders = {
            "bertkit static": lambda: bertkit.embed(texts, ours),
            "model2vec": lambda: m2v.encode(texts),
            "bertkit tokenizer ids_batch": lambda: tok.ids_batch(texts),
            "bertkit tokenizer encode_batch": lambda: tok.encode_batch(texts, truncation=False, num_workers=1),
            "model2vec tokenizer (Rust)": lambda: m2v.tokenize(texts),
        }
        times = interleaved(contenders, rounds=args.rounds, warmup=1)
        # the transformer is slow: one timed run after a warm-up batch
        bertkit.embed(texts[:64], teacher_loaded, batch_size=64)
        t = time.perf_counter()
        bertkit.embed(texts, teacher_loaded, batch_size=64)
        times["default model (bf16)"] = [time.perf_counter() - t]
        report["throughput"][name] = {k: round(len(texts) / statistics.median(v), 1) for k, v in times.items()}
        report["throughput"][name]["texts"] = len(texts)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
