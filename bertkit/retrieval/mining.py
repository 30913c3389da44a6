"""Hard-negative mining: for each query, passages the model ranks high that are not its answer.

Contrastive training learns most from negatives that are hard: close to the
query in the current model's space but not relevant (Karpukhin et al. 2020, DPR;
Xiong et al. 2021, ANCE). Mining them: embed the corpus and the queries with a
model (`bertkit.retrieval.encoding`), rank the corpus for each query by exact
cosine (`bertkit.retrieval.exact`), and walk down the ranking keeping

- no positive (a passage the query judges relevant), and no passage whose text
  equals a positive's or the query's (a duplicate under another id);
- no passage of the query's own group, when the pairs file has a `group_id`
  column (captions of one picture, answers to one question): another caption of
  the same picture is a positive nobody wrote down, not a negative;
- no candidate scored too close to the positive: the danger of the hardest
  negatives is that many are *unlabelled positives* (Qu et al. 2021, RocketQA;
  Moreira et al. 2024, NV-Retriever). The default rule is NV-Retriever's
  "TopK-PercPos" at 95%, which its ablation found best: keep a candidate only if

      score <= s_pos - |s_pos| * relative_margin        (relative_margin = 0.05)

  with s_pos the query's *lowest* positive score when it has several (the safe
  side). `absolute_margin` m keeps score <= s_pos - m instead (or as well), and
  `max_score` drops any candidate above a fixed cosine. These are the rules and
  names of sentence-transformers' `mine_hard_negatives` (`range_min`,
  `range_max`, `absolute_margin`, `relative_margin`, `max_score`,
  `num_negatives`, sampling "top"), so a recipe carries over;
- not the `range_min` best candidates left by the rules above, when asked (rank
  skipping: sentence-transformers skips them after its margins and max_score);
- until `num_negatives` are found among the `range_max` best candidates. A query
  that cannot fill its negatives is left out (sentence-transformers does the same
  for its n-tuple output) and counted in the report.

Output: one row per (query, positive) pair, `anchor, positive, negative_1 ..
negative_n` and, from a pairs file with groups, the pair's `group_id` and each
negative's groups (`negative_1_group` ..., comma-separated where one text is in
several), as TSV (tabs and newlines inside a text become spaces) or JSONL: the
columns `bertkit finetune embed` reads (it keeps rows that share a group, or
whose texts do, out of one batch).

Input: a BEIR folder (the split's queries, positives from its qrels, the corpus
as candidates) or a pairs file (columns anchor, positive; the positives, deduplicated,
are the candidates).

A cross-encoder reranker trains on labelled pairs instead (`reranker_pairs`, for
`bertkit finetune rerank`; sentence-transformers' recipe): per query its
positives (label 1), its first `hard` negatives by the rules above (a query
whose candidates cannot supply them all gets none, and is counted) and `random`
passages drawn by a seeded `random.Random` from the rest of the corpus (0),
never a positive nor a passage with a positive's text; or a table of query,
passage, label rows as it is.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError, say_cut
from bertkit.data.atomic import write_lines
from bertkit.data.tables import GROUP_COLUMN, ReadReport, read_rows, tsv_cell
from bertkit.data.beir import document_text, load_beir
from bertkit.retrieval.config import MiningOptions
from bertkit.retrieval.encoding import encode, encoder_and_settings
from bertkit.retrieval.exact import top_k


@dataclass
class MiningTask:
    """Queries, candidate passages and which candidates answer which query."""

    queries: list[str]
    passages: list[str]
    positives: list[list[int]]  # per query: rows of `passages` it judges relevant (at least one)
    query_groups: list[frozenset] | None = None  # per query: the group_id of its rows (pairs files with groups)
    passage_groups: list[frozenset] | None = None  # per passage: the group_id of the rows it is a positive in
    pair_groups: dict | None = None  # (query, passage) -> the group_id of that pair's row
    passage_ids: list | None = None  # per passage: its corpus id (a BEIR folder's)

    def same_group(self, query: int, passage: int) -> bool:
        """Whether `passage` belongs to one of the query's groups (never a negative then)."""
        return self.query_groups is not None and not self.query_groups[query].isdisjoint(self.passage_groups[passage])


def task_from_beir(directory, split: str = "train", dedupe: bool = False) -> MiningTask:
    data = load_beir(directory, split, dedupe)
    doc_ids = [d for d in data.corpus if document_text(data.corpus[d])]  # an empty document is no candidate
    row = {d: i for i, d in enumerate(doc_ids)}
    queries, positives = [], []
    for query, judged in data.qrels.items():
        relevant = [row[d] for d, score in judged.items() if score > 0 and d in row]
        if relevant:
            queries.append(data.queries[query])
            positives.append(relevant)
    if not queries:
        raise BertkitError(f"{directory}/qrels/{split}.tsv judges no passage relevant: nothing to mine for")
    return MiningTask(queries, [document_text(data.corpus[d]) for d in doc_ids], positives, passage_ids=doc_ids)


def task_from_pairs(path) -> MiningTask:
    """Queries and positives from a pairs file (anchor, positive); a query's positives are all its rows'."""
    report = ReadReport(str(path))
    passages: dict[str, int] = {}
    by_query: dict[str, list[int]] = {}
    groups: dict[tuple[str, str], str] = {}  # (anchor, positive) -> group_id, when the file has the column
    for number, cells in read_rows(path, report):
        if "anchor" not in cells or "positive" not in cells:
            raise BertkitError(f"{path} has no anchor/positive columns (it has {', '.join(cells)}): "
                               "mine reads pairs with a header anchor, positive, or a BEIR folder")
        anchor, positive = str(cells["anchor"] or ""), str(cells["positive"] or "")
        if anchor.strip() and positive.strip():
            by_query.setdefault(anchor, []).append(passages.setdefault(positive, len(passages)))
            if cells.get(GROUP_COLUMN) is not None and str(cells[GROUP_COLUMN]).strip():
                groups[anchor, positive] = str(cells[GROUP_COLUMN]).strip()
    if not by_query:
        raise BertkitError(f"{path} has no (anchor, positive) rows to mine for")
    task = MiningTask(list(by_query), list(passages), [sorted(set(p)) for p in by_query.values()])
    return with_groups(task, groups) if groups else task


def with_groups(task: MiningTask, groups: dict[tuple[str, str], str]) -> MiningTask:
    """`task` with the groups of its queries and passages from the (anchor, positive) -> group_id of the
    rows: a text's groups are those of every row it is the anchor or the positive of."""
    of_text: dict[str, set] = {}
    for (anchor, positive), group in groups.items():
        of_text.setdefault(anchor, set()).add(group)
        of_text.setdefault(positive, set()).add(group)
    pair_groups = {(q, p): groups[task.queries[q], task.passages[p]]
                   for q, ps in enumerate(task.positives) for p in ps if (task.queries[q], task.passages[p]) in groups}
    return MiningTask(task.queries, task.passages, task.positives,
                      [frozenset(of_text.get(t, ())) for t in task.queries],
                      [frozenset(of_text.get(t, ())) for t in task.passages], pair_groups)


def select_negatives(scores: np.ndarray, rows: np.ndarray, task: MiningTask, options: MiningOptions,
                     positive_scores: list[np.ndarray]) -> tuple[list[list[int] | None], dict]:
    """Apply the rules to each query's ranked candidates ([Q, K] scores and rows, best first).

    Returns per query its negatives' rows (None when it could not fill them) and counts of
    the candidates each rule removed."""
    skipped = {"positive": 0, "duplicate text": 0, "same group": 0, "range_min": 0, "relative_margin": 0,
               "absolute_margin": 0, "max_score": 0}
    chosen: list[list[int] | None] = []
    for q, (q_scores, q_rows) in enumerate(zip(scores, rows)):
        positives = set(task.positives[q])
        same_text = {task.passages[p] for p in positives} | {task.queries[q]}
        floor = float(positive_scores[q].min())  # the hardest positive decides the margin
        negatives, passed = [], 0
        for score, candidate in zip(q_scores.tolist(), q_rows.tolist()):
            if candidate in positives:
                skipped["positive"] += 1
            elif task.passages[candidate] in same_text:
                skipped["duplicate text"] += 1
            elif task.same_group(q, candidate):
                skipped["same group"] += 1
            elif options.relative_margin is not None and score > floor - abs(floor) * options.relative_margin:
                skipped["relative_margin"] += 1
            elif options.absolute_margin is not None and score > floor - options.absolute_margin:
                skipped["absolute_margin"] += 1
            elif options.max_score is not None and score > options.max_score:
                skipped["max_score"] += 1
            elif passed < options.range_min:  # the best that clear every rule above, as sentence-transformers skips
                passed += 1
                skipped["range_min"] += 1
            else:
                negatives.append(candidate)
                if len(negatives) == options.num_negatives:
                    break
        chosen.append(negatives if len(negatives) == options.num_negatives else None)
    return chosen, skipped


def mine(task: MiningTask, model=None, options: MiningOptions = MiningOptions(), *, batch_size: int = 32,
         max_length: int | None = None, dtype: str = "float32", progress: bool = False, fast=True):
    """Each query's negatives by the rules (`select_negatives`) over the model's exact cosine ranking of
    `task.passages`: (chosen, skipped, the encoder's settings, each query's positive scores, (query
    vectors, passage vectors)). fast: the encoder's fast-path settings."""
    loaded, settings = encoder_and_settings(model, max_length, dtype, fast)
    ids = task.passage_ids  # a BEIR corpus's: a passage without tokens is named by its _id (its text is invisible)
    cut = {}  # passages, queries -> how many the model read cut at max_length
    passage_vectors = encode(task.passages, loaded, settings, batch_size=batch_size, progress=progress,
                             names=None if ids is None else lambda i: f"corpus.jsonl _id {ids[i]!r}",
                             on_cut=lambda n, _: cut.setdefault("passages", n))
    query_vectors = encode(task.queries, loaded, settings, batch_size=batch_size,
                           on_cut=lambda n, _: cut.setdefault("queries", n))
    say_cut([("passages", cut["passages"], len(task.passages)), ("queries", cut["queries"], len(task.queries))],
            settings.max_length, "and ranked them by their first tokens (finetune embed cuts them at its --max-length "
            "too)")
    depth = options.range_max + max(len(p) for p in task.positives)  # positives may take places in the ranking
    scores, rows = top_k(query_vectors, passage_vectors, k=min(depth, len(task.passages)), normalized=True)
    positive_scores = [passage_vectors[p] @ query_vectors[q] for q, p in enumerate(task.positives)]
    chosen, skipped = select_negatives(scores, rows, task, options, positive_scores)
    return chosen, skipped, settings, positive_scores, (query_vectors, passage_vectors)


def mine_hard_negatives(source, model=None, *, split: str | None = None, options: MiningOptions = MiningOptions(),
                        batch_size: int = 32, max_length: int | None = None, dtype: str = "float32",
                        progress: bool = False, dedupe: bool = False, fast=True) -> tuple[list[tuple[str, ...]], dict]:
    """(rows, report): rows (anchor, positive, negative_1..n[, group_id, negative_1_group..n]), one per
    (query, positive) pair; the groups ("" where none) when the pairs file has a group_id column.

    source: a BEIR folder (queries of `split`, default train; `dedupe`: the first line of a repeated id kept) or a
    pairs file (neither setting: refused, as it would change nothing).
    The report gives the counts:
    queries, rows, queries left out, candidates skipped by each rule, and the mean
    positive and negative cosine."""
    options.validate()
    source = Path(source)
    if not source.is_dir() and (split is not None or dedupe):
        flag = f"--split {split}" if split is not None else "--dedupe"
        raise BertkitError(f"{flag} reads a BEIR folder's queries and ids, and {source} is a pairs file (its anchors "
                           "are the queries): leave it out, or pass a BEIR folder")
    task = task_from_beir(source, split or "train", dedupe) if source.is_dir() else task_from_pairs(source)
    mined = mine(task, model, options, batch_size=batch_size, max_length=max_length, dtype=dtype, progress=progress,
                 fast=fast)
    chosen, skipped, settings, positive_scores, (query_vectors, passage_vectors) = mined
    out, neg_scores = [], []
    for q, negatives in enumerate(chosen):
        if negatives is None:
            continue
        neg_scores += [float(passage_vectors[n] @ query_vectors[q]) for n in negatives]
        for p in task.positives[q]:
            groups = () if task.pair_groups is None else (
                task.pair_groups.get((q, p), ""), *(",".join(sorted(task.passage_groups[n])) for n in negatives))
            out.append((task.queries[q], task.passages[p], *(task.passages[n] for n in negatives), *groups))
    report = {"queries": len(task.queries), "passages": len(task.passages), "rows": len(out),
              "queries_without_enough_negatives": sum(c is None for c in chosen), "skipped": skipped,
              "mean_positive_cosine": float(np.mean(np.concatenate(positive_scores))),
              "mean_negative_cosine": float(np.mean(neg_scores)) if neg_scores else None,
              "model": settings.model, "precision": settings.dtype, "max_length": settings.max_length,
              "options": options.__dict__, "groups": task.pair_groups is not None}
    if not out:
        raise BertkitError(f"no query found {options.num_negatives} negatives within the top {options.range_max} "
                           "candidates: lower --num-negatives or the margins, or raise --range-max")
    return out, report


def check_output(path) -> Path:
    """The output path, refused before any work when it is neither .tsv nor .jsonl."""
    path = Path(path)
    if path.suffix not in (".tsv", ".jsonl"):
        raise BertkitError(f"cannot write {path}: name the output .tsv or .jsonl")
    return path


def columns(num_negatives: int, groups: bool = False) -> list[str]:
    negatives = [f"negative_{i}" for i in range(1, num_negatives + 1)]
    return ["anchor", "positive", *negatives, *([GROUP_COLUMN, *(f"{n}_group" for n in negatives)] if groups else [])]


def write_rows(rows: list[tuple[str, ...]], path, groups: bool = False) -> None:
    """Write mined rows as .jsonl (exact texts) or .tsv (a header; tabs and newlines become spaces);
    `groups`: each row ends with its group_id and its negatives' groups."""
    path = check_output(path)
    names = columns((len(rows[0]) - 3) // 2 if groups else len(rows[0]) - 2, groups)
    if path.suffix == ".jsonl":
        lines = (json.dumps(dict(zip(names, row)), ensure_ascii=False) + "\n" for row in rows)
    else:
        lines = itertools.chain(["\t".join(names) + "\n"], ("\t".join(map(tsv_cell, row)) + "\n" for row in rows))
    write_lines(path, lines)


# --- labelled pairs for a cross-encoder ---------------------------------------------------

PAIR_COLUMNS = ("query", "passage", "label")  # a reranker's training table


def training_pairs(task: MiningTask, hard: list, random_negatives: int, rng: random.Random):
    """(query, passage, label) rows: per query its positives (1), its hard negatives `hard[q]` (rows of
    task.passages, or None: none) and `random_negatives` passages drawn by `rng` from the others (0),
    never a positive or a passage with a positive's text; and the counts."""
    pairs, counts = [], {"queries": len(task.queries), "positives": 0, "hard_negatives": 0, "random_negatives": 0,
                         "queries_without_hard_negatives": 0}
    for q, query in enumerate(task.queries):
        positives = set(task.positives[q])
        same = {task.passages[p] for p in positives}
        negatives = list(hard[q] or ())
        counts["queries_without_hard_negatives"] += hard[q] is None
        taken = positives | set(negatives)
        pool = [i for i in range(len(task.passages)) if i not in taken and task.passages[i] not in same]
        drawn = rng.sample(pool, min(random_negatives, len(pool)))
        pairs += [(query, task.passages[p], 1.0) for p in sorted(positives)]
        pairs += [(query, task.passages[n], 0.0) for n in negatives + drawn]
        counts["positives"] += len(positives)
        counts["hard_negatives"] += len(negatives)
        counts["random_negatives"] += len(drawn)
    return pairs, counts


def reranker_pairs(source, split: str = "train", *, hard: int = 5, random_negatives: int = 2, range_max: int = 50,
                   relative_margin: float | None = 0.05, model=None, first_stage=None, seed: int = 42,
                   batch_size: int = 32, progress: bool = False, log=print):
    """(pairs, counts): a reranker's (query, passage, label) training rows from a BEIR folder's `split`
    (positives, mined and random negatives; see the module docstring) or a table of such rows.
    first_stage(queries) -> per query the corpus ids of its best documents, best first (an index's search):
    the hard negatives are then its first `hard` that are neither positives nor a positive's text (fused
    scores are no cosine: the margin rules do not apply); without it `model` ranks the corpus by cosine."""
    if not Path(source).is_dir():
        pairs, counts = table_pairs(source)
    else:
        task = task_from_beir(source, split)
        chosen = [[] for _ in task.queries]
        if hard and first_stage is not None:
            log(f"mining {hard} hard negatives per query among the first stage's top {range_max}")
            chosen = first_stage_negatives(task, first_stage(task.queries), hard, range_max)
        elif hard:
            options = MiningOptions(num_negatives=hard, range_max=min(range_max, len(task.passages)),
                                    relative_margin=relative_margin)
            log(f"mining {hard} hard negatives per query among the top {options.range_max} of "
                f"{len(task.passages)} passages ({model or 'the default model'})")
            chosen = mine(task, model, options, batch_size=batch_size, progress=progress)[0]
        pairs, counts = training_pairs(task, chosen, random_negatives, random.Random(seed))
    positives = sum(label >= 0.5 for _, _, label in pairs)
    if not 0 < positives < len(pairs):
        raise BertkitError(f"{source}: {positives} of {len(pairs)} training pairs are relevant: a reranker needs "
                           "relevant and irrelevant pairs both")
    return pairs, counts


def first_stage_negatives(task: MiningTask, ranked: list, hard: int, range_max: int) -> list:
    """Per query, the rows of its first `hard` documents among `ranked`'s top `range_max` (corpus ids, best
    first) that are neither positives nor a positive's text; None when fewer are there."""
    row = {d: i for i, d in enumerate(task.passage_ids)}
    stray = next((d for ids in ranked for d in ids[:range_max] if d not in row), None)
    if stray is not None:
        raise BertkitError(f"the first stage answered document {stray!r}, which the corpus being mined does not "
                           "have: its index was built from another corpus; mine with an index of this corpus")
    chosen = []
    for q, ids in enumerate(ranked):
        same = {task.passages[p] for p in task.positives[q]}
        found = [row[d] for d in ids[:range_max]
                 if row[d] not in task.positives[q] and task.passages[row[d]] not in same][:hard]
        chosen.append(found if len(found) == hard else None)
    return chosen


def table_pairs(path) -> tuple[list, dict]:
    """(query, passage, label) rows of a TSV/CSV/JSONL table with those columns; a label is 0..1."""
    pairs, report = [], ReadReport(str(path))
    for number, cells in read_rows(path, report):
        missing = [c for c in PAIR_COLUMNS if c not in cells]
        if missing:
            raise BertkitError(f"{path} has no {', '.join(missing)} column (it has {', '.join(cells)}): a reranker's "
                               "table has query, passage, label columns; or pass a BEIR folder")
        query, passage = str(cells["query"] or "").strip(), str(cells["passage"] or "").strip()
        if not query or not passage:
            raise BertkitError(f"{path} line {number}: the {'query' if not query else 'passage'} is empty: every "
                               "row needs a query and a passage")
        try:
            label = float(cells["label"])
        except (TypeError, ValueError):
            label = -1.0
        if not 0.0 <= label <= 1.0:
            raise BertkitError(f"{path} line {number}: label {cells['label']!r} is not 1 (relevant), 0 (not) or a "
                               "probability in between")
        pairs.append((str(cells["query"]), str(cells["passage"]), label))
    if not pairs:
        raise BertkitError(f"{path} has no (query, passage, label) rows")
    relevant = sum(label >= 0.5 for _, _, label in pairs)
    return pairs, {"queries": len({q for q, _, _ in pairs}), "positives": relevant, "negatives": len(pairs) - relevant}
