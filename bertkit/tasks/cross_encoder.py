"""Training a cross-encoder reranker: `bertkit finetune rerank`, and the figures it was evaluated with.

The recipe is sentence-transformers' (v4+) for a reranker trained without MS
MARCO (its CrossEncoder training overview and hard-negative examples): start
from a pretrained encoder (the default model) with a fresh one-logit head; pair
every training query with each of its positives (label 1), with passages the
retriever ranks high that are not positives (mined hard negatives) and with
passages drawn at random (label 0) (`bertkit.retrieval.mining.reranker_pairs`; with
`--mining-index` the hard negatives are an index's first answers, the first stage
the reranker will re-order, as the recipe advises: mine with your retriever);
train with binary cross-entropy on the logit, positives weighted by the number
of negatives per positive (the recipe's `pos_weight`), one epoch at 2e-5
(`bertkit.tasks.classification.train_pair_scorer`, through the one run harness).

With `--dev DIR --index INDEX` the saved model reranks the index's answers to
DIR's `--dev-split` queries, exactly as `bertkit evaluate retrieval --index
--rerank` does, and the figures before and after (nDCG@10, MRR@10, MAP@100,
Recall@10/100; the first stage named) go into OUTPUT/retrieval.json, which
`search --rerank` and `serve --rerank` read at start-up
(`bertkit.tasks.rerank.recorded_effect`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

from bertkit.retrieval.evaluation import check_index_of, evaluate_retrieval, index_answers
from bertkit.retrieval.mining import reranker_pairs
from bertkit.tasks.classification import train_pair_scorer
from bertkit.tasks.rerank import FIGURES_FILE, PairsCut, rerank, reranker
from bertkit.tasks.run import settle, write_json


def finetune_rerank(cfg, log=print, speed=None) -> dict:
    """Train the reranker on cfg.train (a RerankConfig), save it in cfg.output, evaluate it on cfg.dev."""
    settle(cfg, log)
    if cfg.dev:  # said now, not after the training: the dev evaluation searches this index for the dev queries
        check_index_of(cfg.index, cfg.dev, cfg.dev_split)
    tcfg, started = cfg.training, time.perf_counter()
    pairs, counts = reranker_pairs(cfg.train, cfg.train_split, hard=cfg.hard_negatives,
                                   random_negatives=cfg.random_negatives, range_max=cfg.range_max,
                                   relative_margin=cfg.relative_margin, first_stage=None if not cfg.mining_index
                                   else partial(index_answers, cfg.mining_index, depth=cfg.range_max,
                                                batch_size=tcfg.eval_batch_size),
                                   model=cfg.mining_model, seed=tcfg.seed, batch_size=tcfg.eval_batch_size,
                                   progress=tcfg.progress, log=log)
    made, pairs = len(pairs), pairs[: cfg.max_train_examples] if cfg.max_train_examples else pairs
    positives = sum(label >= 0.5 for _, _, label in pairs)
    pos_weight = cfg.pos_weight if cfg.pos_weight is not None else (len(pairs) - positives) / max(positives, 1)
    log(f"rerank: {len(pairs)} training pairs ({positives} relevant, {len(pairs) - positives} not; relevant "
        f"pairs weigh {pos_weight:.3g}): {json.dumps(counts)}")
    info = {"task": "rerank", "max_length": cfg.max_length, "stride": 0, "text_column": "query",
            "text_pair_column": "passage", "label_column": "label",
            "config": json.loads(json.dumps(asdict(cfg), default=str))}
    result = train_pair_scorer(cfg, pairs, pos_weight, info, log, speed)
    if not result.is_main:
        return {}
    # "pairs" counts every pair made; --max-train-examples trains on the first train_examples of pairs_made
    final = {"task": "rerank", "train_examples": len(pairs), "pairs_made": made, "pairs": counts,
             "pos_weight": pos_weight, "train_seconds": round(result.seconds, 1), "epochs": result.history}
    if cfg.dev:
        final["retrieval"] = record_figures(cfg, log)
    final["seconds"] = round(time.perf_counter() - started, 1)
    write_json(Path(cfg.output) / "metrics.json", final)
    return final


def record_figures(cfg, log=print) -> dict:
    """The saved model reranking cfg.index's answers to cfg.dev's queries: the figures before and after,
    written atomically to OUTPUT/retrieval.json."""
    cross = reranker(cfg.output, dtype=cfg.rerank_dtype)
    cut = PairsCut(cross)  # the pairs it read cut, said once for every query
    result = evaluate_retrieval(None, cfg.dev, cfg.dev_split, batch_size=cfg.training.eval_batch_size,
                                index=cfg.index, progress=cfg.training.progress, rerank_top=cfg.rerank_top,
                                rerank=partial(rerank, cross, top=cfg.rerank_top,
                                               batch_size=cfg.training.eval_batch_size, on_cut=cut),
                                rerank_model=str(cfg.output))
    cut.say()
    measures = [k for k, v in result["before_rerank"].items() if isinstance(v, float)]
    fusion = result["before_rerank"]["fusion"]
    stage = fusion["mode"] if fusion["mode"] != "hybrid" else f"hybrid {fusion['fusion']} alpha {fusion['alpha']}"
    figures = {"dataset": result["dataset"], "split": cfg.dev_split, "queries": result["queries"],
               "documents": result["documents"], "rerank_top": cfg.rerank_top,
               "first_stage": f"{cfg.index} ({stage})", "first_stage_model": result["model"], "fusion": fusion,
               # what ran: an index made by an int8 folder is queried in int8 (not the float32 asked for)
               "precision": {"queries": result["precision"], "reranker": cross.precision},
               "before": {m: result["before_rerank"][m] for m in measures}, "after": {m: result[m] for m in measures}}
    path = Path(cfg.output) / FIGURES_FILE
    write_json(path, figures)
    log(f"wrote {path}: nDCG@10 {figures['before']['ndcg@10']:.4f} before reranking, "
        f"{figures['after']['ndcg@10']:.4f} after ({cfg.dev} split {cfg.dev_split}, top {cfg.rerank_top})")
    return figures
