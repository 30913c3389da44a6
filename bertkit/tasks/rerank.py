"""Reranking: a cross-encoder re-scores what the bi-encoder index found.

A bi-encoder embeds the query and each passage apart, so the index can be
searched fast; a cross-encoder reads (query, passage) together, which is
slower and more accurate, so it re-scores only the best `top` documents of the
first stage (the "retrieve and rerank" of Nogueira and Cho 2019,
sentence-transformers' `CrossEncoder` examples).

The cross-encoder is a model fine-tuned on text pairs with one score: `bertkit
finetune rerank` (one logit, binary cross-entropy; its probability), `bertkit
finetune regression`, or `bertkit finetune pair` (or `classify
--text-pair-column`) with two labels. Whether a model is one, and how its
prediction becomes a score (a regression's score, or the probability of its
second label), is its task's record's (`bertkit.tasks.registry`: `can_rerank`,
`pair_score`), which `bertkit serve`'s /rerank asks too. It is run by
`bertkit.tasks.predict`. The reranked hits come first, best first, with the
cross-encoder's score; ties keep the first stage's order; the hits below `top`
follow as they were.

A reranker pays only when it ranks better than the first stage: `bertkit
finetune rerank --dev` records the figures it was evaluated with in
OUTPUT/retrieval.json (nDCG@10 of the first stage alone and reranked), and
`recorded_effect` turns them into the one line `search --rerank` and `serve
--rerank` say at start-up: a warning when the model lowered nDCG@10, a note
when it has no figures, nothing when it helped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from bertkit.errors import BertkitError, int_at_least, say_cut
from bertkit.runtime.loading import Loaded, load
from bertkit.tasks.predict import predict, task_of

FIGURES_FILE = "retrieval.json"  # in a reranker's folder: the retrieval figures it was evaluated with


def reranker(model, device=None, dtype=None, fast=True) -> Loaded:
    """A cross-encoder: a model fine-tuned on text pairs with one score (regression, or two labels);
    `fast` as `bertkit.runtime.loading.load` takes it (a server passes its SpeedSettings)."""
    loaded = load(model, head="task", device=device, dtype=dtype, fast=fast)
    task, info = task_of(loaded), loaded.info
    labels = task.labels(loaded.config)
    if not task.can_rerank(info, labels):
        kind = f"a {task.name} model" + (" of single texts" if task.refuses_pairs(info) else "") + (
            f" with {len(labels)} labels" if labels is not None and task.pair_score is not None else "")
        raise BertkitError(f"{model} is {kind}: --rerank needs a cross-encoder trained on (query, passage) pairs by "
                           "bertkit finetune rerank (or finetune regression, or finetune pair or classify "
                           "--text-pair-column with two labels)")
    return loaded


def score(prediction: dict, loaded: Loaded) -> float:
    """A cross-encoder's score of one pair, from its prediction (its task's `pair_score`)."""
    task = task_of(loaded)
    return task.pair_score(prediction, task.labels(loaded.config))


def pair_scores(loaded: Loaded, query: str, passages: list[str], batch_size: int = 32, on_cut=None,
                on_tokens=None) -> list[float]:
    """The cross-encoder's score of each (query, passage); on_cut(cut, seen): told how many of the pairs it read
    cut at its max_length, counted as they were encoded for it (`bertkit.tasks.predict.predict`'s); on_tokens(n):
    told the pairs' tokens as encoded, before it reads them."""
    preds = predict(None, [query] * len(passages), pairs=passages, batch_size=batch_size, loaded=loaded,
                    on_cut=on_cut, on_tokens=on_tokens)
    return [score(p, loaded) for p in preds]


def rerank(loaded: Loaded, query: str, hits: list, top: int = 50, batch_size: int = 32, on_cut=None,
           on_tokens=None) -> list:
    """`hits` (`bertkit.retrieval.search.Hit`s) with the first `top` re-scored by the cross-encoder and
    sorted (see the module docstring); on_cut(cut, seen): told how many of those pairs it read cut (`PairsCut`
    sums them over the queries and says them); on_tokens(n): told the pairs' tokens before it reads them."""
    int_at_least(top, 1, "--rerank-top", says="at least {least}")
    head, tail = hits[:top], hits[top:]
    if not head:
        return hits
    scores = pair_scores(loaded, query, [h.text for h in head], batch_size, on_cut, on_tokens)
    order = sorted(range(len(head)), key=lambda i: -scores[i])  # stable: ties keep the first stage's order
    return [replace(head[i], score=scores[i]) for i in order] + tail


@dataclass
class PairsCut:
    """How many of the (query, passage) pairs `loaded`, a cross-encoder, re-scored (each answer's best `top`) it
    read cut at its max_length, summed over the queries as `rerank` counts them (pass it as on_cut), and said in one
    warning (`say`). A cross-encoder fine-tuned at 128 tokens (finetune's default) read every pair of a 256-token
    passage cut, unsaid; the server's /search puts `cut` in its X-Truncated-Inputs header."""

    loaded: Loaded
    cut: int = 0
    seen: int = 0

    def __call__(self, cut: int, seen: int) -> None:
        self.cut, self.seen = self.cut + cut, self.seen + seen

    def say(self) -> None:
        say_cut([("(query, passage) pairs", self.cut, self.seen)], self.loaded.info.get("max_length", 512),
                "longest side first (pairs are never windowed)", head=f"--rerank {self.loaded.directory}: ")


def recorded_effect(model) -> str | None:
    """The start-up line about the figures `model` (a reranker's folder) was evaluated with: a warning
    when reranking lowered nDCG@10, a note when there are none, None when it did not lower it."""
    path = Path(model) / FIGURES_FILE
    if not path.is_file():
        return (f"note: {model} has no recorded retrieval figures (no {FIGURES_FILE}; bertkit finetune rerank --dev "
                "records them): whether it helps this search is unmeasured")
    try:
        figures = json.loads(path.read_text(encoding="utf-8"))
        before, after = float(figures["before"]["ndcg@10"]), float(figures["after"]["ndcg@10"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"note: {path} is unreadable ({type(err).__name__}: {err}): the reranker's effect is unknown"
    if after >= before:
        return None
    return (f"warning: {model} lowered nDCG@10 from {before:.4f} to {after:.4f} when it was evaluated "
            f"({figures.get('dataset')} split {figures.get('split')}, top {figures.get('rerank_top')} of "
            f"{figures.get('first_stage')}): reranking with it may make this search worse")
