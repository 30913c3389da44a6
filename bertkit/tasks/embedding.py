"""Sentence embeddings: fine-tune an encoder so that the cosine of two texts' vectors says how related they are.

Sentence-BERT (Reimers & Gurevych 2019) with the losses of `bertkit.embeddings.losses`: the encoder and a
pooling (the mean of the last layer's token vectors, their maximum, or [CLS]: `bertkit.model.modeling.pool_sentence`,
the pooling `bertkit embed` uses) make one vector per text; the loss compares the vectors of a batch. Training
goes through the one training loop (`bertkit.tasks.trainer.train`, a run of `bertkit.training.harness` around
`bertkit.training.loop`: accumulation, bf16, checkpoints and exact resume, DDP, metrics.jsonl, curves.png).

Data (`read_examples`), one example per row:

    pairs / n-tuples   columns anchor, positive [, negative | negative_1, negative_2, ...]
                       (+ an optional group_id: rows of one group are never in one batch)
    scored pairs       columns sentence1, sentence2, score           (CoSENT)
    a BEIR folder      its qrels/<split>.tsv turned into (query, relevant passage) pairs

from TSV (header row, no quoting), CSV or JSONL.

Batches (`no_duplicate_batches`): with in-batch negatives every other text of a
batch is scored as a wrong answer, so a text twice in one batch (a claim with
two relevant abstracts, two captions of one picture) would be a false negative.
Batches are drawn so that no text, and no group, appears twice in one.

The batch a model sees: the texts of B examples with C columns tokenised and
stacked column by column, input_ids [C*B, T] (anchors, then positives, then
each negatives column); `SentenceEmbedder.forward` pools each column (padded
to its own longest text), then scores. With `loss="cached-mnrl"` the columns
are embedded in chunks of `mini_batch_size` (GradCache): the batch can be as
big as the task wants at the memory of one chunk. Under torchrun the
candidates of every process are gathered (with gradients) so each anchor is
scored against the whole global batch: W processes x B = one process x W*B.

Saved: the encoder in Hugging Face format and the sentence-transformers layout
(`bertkit.model.sentence_layout`): pooling, normalisation, max_seq_length and any
Matryoshka dimensions, so sentence-transformers and bertkit both embed it as
it was trained.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from bertkit.errors import BertkitError, figure, read_score
from bertkit.tasks.config import EMBED_DEV, EmbedConfig
from bertkit.data.tables import GROUP_COLUMN, ReadReport, read_rows
from bertkit.embeddings.losses import cached, cosent, matryoshka, multiple_negatives_ranking
from bertkit.tasks.run import as_one, fit_length, load_head, load_tokenizer, write_json
from bertkit.tasks.trainer import micro_rows, rows_hash, train, warnings_once
from bertkit.runtime.loading import load as load_model, resolve
from bertkit.model.modeling import BertModel, pool_sentence
from bertkit.embeddings.settings import resolve_output
from bertkit.data.beir import is_corpus_jsonl, qrels_path, read_qrels, training_pairs
from bertkit.retrieval.evaluation import evaluate_retrieval, evaluate_sts
from bertkit.model.sentence_layout import SentenceLayout, read_layout, write_layout
from bertkit.tasks.static_embed import save_static_model, static_rows, static_start
from bertkit.training.distributed import gather_with_grad

NEGATIVE = re.compile(r"^negative(_?\d+)?$")


# --- data -------------------------------------------------------------------------


@dataclass
class EmbeddingExamples:
    """Training or dev examples: the texts of each row, column by column."""

    rows: list[tuple[str, ...]]  # (anchor, positive, negatives...) or (sentence1, sentence2)
    columns: tuple[str, ...]
    scores: list[float] | None = None  # scored pairs only
    groups: list[str] | None = None  # rows sharing a group never share a batch
    negative_groups: dict | None = None  # negative text -> its groups (`bertkit mine`'s negative_N_group)
    source: str = ""

    @property
    def scored(self) -> bool:
        return self.scores is not None


def is_beir_folder(path) -> bool:
    path = Path(path)
    return path.is_dir() and is_corpus_jsonl(path)  # corpus.jsonl, or corpus.jsonl.gz as BEIR's HF copies ship it


def read_examples(path, *, split: str | None = None, max_examples: int | None = None, log=print,
                  flag: str = "--train-split") -> EmbeddingExamples:
    """Examples from a pairs/triplets/scored-pairs table or a BEIR folder (its `split` qrels, default train; beside
    a table, where it would change nothing, a split is refused naming `flag`)."""
    if split is not None and not Path(path).is_dir():
        raise BertkitError(f"{flag} {split} names a BEIR folder's qrels, and {path} is a table of pairs: leave "
                           f"{flag} out, or pass a BEIR folder")
    split = split or "train"
    if Path(path).is_dir():
        if not is_beir_folder(path):
            raise BertkitError(f"{path} is a folder but not a BEIR one (no corpus.jsonl); pass a TSV/JSONL of pairs "
                               "or a folder with corpus.jsonl, queries.jsonl and qrels/")
        pairs = training_pairs(path, split)[:max_examples]
        log(f"{path} ({split}): {len(pairs)} (query, relevant passage) pairs")
        return EmbeddingExamples([tuple(p) for p in pairs], ("anchor", "positive"), source=f"{path}:{split}")
    report = ReadReport(str(path))
    rows, scores, groups, columns, negative_groups = [], [], [], None, {}
    for n, row in read_rows(path, report):
        if columns is None:
            columns = _columns(row, path)
        if any(isinstance(row.get(c), (list, dict)) for c in columns):
            raise BertkitError(f"{path}:{n}: each of {', '.join(columns)} must hold one text; write several "
                               "negatives as columns negative_1, negative_2, ...")
        texts = tuple("" if row.get(c) is None else str(row[c]) for c in columns)
        if not all(t.strip() for t in texts):
            report.skipped["rows with an empty text"] += 1
            continue
        if columns[0] == "sentence1":
            scores.append(read_score(row["score"], f"{path}:{n}"))  # nan would make CoSENT's loss nan
        if GROUP_COLUMN in row:
            groups.append(str(row[GROUP_COLUMN]))
        for column, text in zip(columns[2:], texts[2:]):
            if row.get(f"{column}_group"):
                negative_groups.setdefault(text, set()).update(str(row[f"{column}_group"]).split(","))
        rows.append(texts)
        if max_examples is not None and len(rows) >= max_examples:
            break
    report.kept = len(rows)
    if not rows:
        raise BertkitError(f"{report.summary()}: no usable rows; the file needs a header and at least one row")
    log(report.summary())
    return EmbeddingExamples(rows, columns, scores if columns[0] == "sentence1" else None,
                             groups if len(groups) == len(rows) else None, negative_groups or None, str(path))


def _columns(row: dict, path) -> tuple[str, ...]:
    names = list(row)
    if "anchor" in row and "positive" in row:
        return ("anchor", "positive", *[c for c in names if NEGATIVE.match(c)])
    if all(c in row for c in ("sentence1", "sentence2", "score")):
        return ("sentence1", "sentence2")
    raise BertkitError(f"{path}: columns {', '.join(map(repr, names))} are neither pairs (anchor, positive "
                       "[, negative...]) nor scored pairs (sentence1, sentence2, score); rename the header")


# --- batches without duplicates ------------------------------------------------------------


def no_duplicate_batches(keys: list[frozenset], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Row batches of `batch_size` in a random order where no two rows share a key (a text or a group).

    sentence-transformers' NoDuplicatesBatchSampler: walk the shuffled rows, put
    each into the batch being filled unless one of its keys is already there;
    a row that does not fit waits, in order, for the next batch. Every row is in
    exactly one batch; the last batches may be short (rows that clash with all
    others left at the end).
    """
    order = list(range(len(keys)))
    rng.shuffle(order)
    waiting, batches = deque(order), []
    while waiting:
        batch, seen, passed = [], set(), deque()
        while waiting and len(batch) < batch_size:
            i = waiting.popleft()
            if seen.isdisjoint(keys[i]):
                batch.append(i)
                seen |= keys[i]
            else:
                passed.append(i)
        passed.extend(waiting)
        waiting = passed
        batches.append(batch)
    return batches


def row_keys(examples: EmbeddingExamples) -> list[frozenset]:
    """What two rows of one batch may not share: a text, or a group.

    A row's groups are its own group_id and the groups of every text in it: those of the grouped
    rows that name it as their anchor or positive, and those `bertkit mine` wrote for a negative
    (negative_N_group). A mined negative is a caption of another picture, and a row of that
    picture must not share its batch, where that caption would be a negative of its anchor too.
    Scored pairs score no text against another pair's: duplicates do no harm there.
    """
    if examples.scored:
        return [frozenset()] * len(examples.rows)
    groups = examples.groups or [None] * len(examples.rows)
    of_text: dict[str, set] = {text: set(g) for text, g in (examples.negative_groups or {}).items()}
    for row, group in zip(examples.rows, groups):
        if group is not None and group != "":
            for text in row[:2]:
                of_text.setdefault(text, set()).add(group)
    keys = []
    for row, group in zip(examples.rows, groups):
        own = {group} if group is not None and group != "" else set()
        keys.append(frozenset(row) | {("group", g) for text in row for g in of_text.get(text, own) | own})
    return keys


def least_rows(examples: EmbeddingExamples) -> int:
    """The rows a micro-batch needs for its loss to say anything. MNRL on pairs scores an anchor against
    the batch's other positives and CoSENT a pair against the batch's other pairs: one row alone gives a
    loss of 0 and no gradient (sentence-transformers trains on such a batch all the same). A row with
    negative columns brings its own."""
    return 1 if len(examples.columns) > 2 and not examples.scored else 2


class EmbeddingBatches:
    """The loop's batch stream over embedding examples: seekable micro-batches, epoch after epoch.

    One update's batch holds batch_size x parts examples (no duplicate text in
    it); micro-batch p of the update takes its p-th share. `ids[r][c]` are the
    tokens of row r's column c, tokenised once.
    """

    def __init__(self, examples: EmbeddingExamples, ids: list[list[list[int]]], batch_size: int, parts: int,
                 seed: int, pad_id: int = 0, position: int = 0):
        self.examples, self.ids, self.parts, self.seed, self.pad_id = examples, ids, parts, seed, pad_id
        self.size, self.position = batch_size * parts, position
        self._cache, self.rows = (None, None), None
        self.keys = row_keys(examples)
        n, self.least = len(examples.rows), least_rows(examples)
        if batch_size < self.least:
            raise BertkitError(f"--batch-size {batch_size}: the loss compares the rows of a batch with each other, "
                               f"so a batch of one teaches nothing; use at least {self.least} (the recipes use 32+)")
        # as many updates as rows without duplicates would fill; a short last batch counts when it can give
        # every micro-batch the rows its loss needs (fine-tuning's rule, `EpochBatches`, asks one)
        self.steps_per_epoch = n // self.size + (n % self.size >= parts * self.least)
        if self.steps_per_epoch == 0 and n < self.least:
            against = "pair against the other pairs" if examples.scored else "anchor against the other positives"
            raise BertkitError(f"{n} training example: the loss scores each {against} of its batch, so one row "
                               "alone teaches nothing (its loss is 0); give at least 2 rows"
                               + ("" if examples.scored else ", or negative columns"))
        if self.steps_per_epoch == 0:
            raise BertkitError(f"{n} training examples cannot give each micro-batch of an accumulation step and "
                               f"process ({parts}) the {self.least} rows its loss compares; lower --grad-accum or use "
                               "fewer processes")
        self._cache = (None, None)

    def batches(self, epoch: int) -> list[list[int]]:
        """Each update's row indices in `epoch` (0-based): a pure function of (seed, epoch).

        The sampler may leave rows that clash with every batch for a few extra, short
        batches at the end; past `steps_per_epoch` they sit this epoch out (a
        different, random few each epoch), so every epoch has the same number of updates.
        """
        if self._cache[0] != epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            drawn = [b for b in no_duplicate_batches(self.keys, self.size, rng) if len(b) >= self.parts * self.least]
            if len(drawn) < self.steps_per_epoch:
                raise BertkitError(f"the training rows repeat the same texts too often to make {self.steps_per_epoch} "
                                   f"batches of {self.size} without duplicates; lower --batch-size")
            self._cache = (epoch, drawn[: self.steps_per_epoch])
        return self._cache[1]

    def micro_batch(self, slot: int) -> tuple[dict, str]:
        rows, where = micro_rows(self, slot, "rows")
        return self.collate(rows), where

    def collate(self, rows: list[int]) -> dict:
        """input_ids / attention_mask / token_type_ids [C*B, T], column by column; labels [B] for scored pairs."""
        seqs = [self.ids[r][c] for c in range(len(self.examples.columns)) for r in rows]
        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), T), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        if self.examples.scored:
            batch["labels"] = torch.tensor([self.examples.scores[r] for r in rows], dtype=torch.float32)
        return batch

    def advance(self, micro_batches: int) -> None:
        self.position += micro_batches

    def state(self) -> dict:
        if self.rows is None:  # what a --resume compares: the same count of other rows is other data
            self.rows = rows_hash([self.ids, self.examples.scores])
        return {"position": self.position, "seed": self.seed, "num_instances": len(self.examples.rows),
                "batch": [self.size // self.parts, self.parts], "rows": self.rows}


def tokenize_rows(tok, examples: EmbeddingExamples, max_length: int, log=print) -> list[list[list[int]]]:
    """Token ids of every text, each distinct text tokenised once: ids[row][column]; how many are longer than
    max_length and cut there, as sentence-transformers cuts them, is said (tokenised one piece past the cut)."""
    distinct, budget = list(dict.fromkeys(t for row in examples.rows for t in row)), max_length - 2  # [CLS], [SEP]
    pieces = tok.ids_lists(distinct, budget + 1)
    if cut := sum(len(p) > budget for p in pieces):
        log(f"{cut} of {len(distinct)} distinct texts are longer than --max-length {max_length} tokens: cut there")
    where = {t: [tok.cls_token_id, *p[:budget], tok.sep_token_id] for t, p in zip(distinct, pieces)}
    return [[where[t] for t in row] for row in examples.rows]


# --- the model ------------------------------------------------------------------------


@dataclass
class EmbeddingOutput:
    loss: torch.Tensor


class SentenceEmbedder(nn.Module):
    """An encoder, a pooling and a loss: the model the training loop calls as model(**batch).loss.

    loss: "mnrl" | "cached-mnrl" | "cosent"; columns: texts per example (C);
    dims: Matryoshka dimensions (None: the full vector only).
    """

    def __init__(self, encoder: BertModel, pooling: str = "mean", loss: str = "mnrl", columns: int = 2,
                 scale: float = 20.0, mini_batch_size: int = 32, dims=None, weights=None):
        super().__init__()
        self.encoder, self.pooling, self.kind, self.columns = encoder, pooling, loss, columns
        self.mini_batch_size = mini_batch_size
        base = cosent if loss == "cosent" else multiple_negatives_ranking
        self.loss_fn = matryoshka(base, dims, weights) if dims else base
        self.scale = scale
        if getattr(encoder, "pooler", None) is not None:  # saved, never read by a sentence vector: frozen
            encoder.pooler.requires_grad_(False)  # (DDP would stop on a parameter that never gets a gradient)

    def embed(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """[m, T] tokens -> [m, H] sentence vectors, each row padded only to the rows' longest."""
        if hasattr(self.encoder, "embed_padded"):  # a static table (bertkit.model.static): the rows' mean, no forward
            return self.encoder.embed_padded(input_ids, attention_mask)
        T = int(attention_mask.sum(dim=1).max())
        input_ids, attention_mask = input_ids[:, :T], attention_mask[:, :T]
        token_type_ids = None if token_type_ids is None else token_type_ids[:, :T]
        hidden = self.encoder(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        return pool_sentence(hidden, attention_mask, self.pooling)  # [m, T, H] -> [m, H]

    def score(self, embeddings: torch.Tensor, labels=None) -> torch.Tensor:
        """The loss of [C*B, H] embeddings (column by column), candidates gathered over processes."""
        C = self.columns
        B = embeddings.shape[0] // C
        columns = embeddings.float().reshape(C, B, -1)  # [C, B, H]
        if self.kind == "cosent":
            everything, _ = gather_with_grad(columns.transpose(0, 1).reshape(B, -1))  # [N, C*H] all processes
            both = everything.reshape(everything.shape[0], C, -1)
            labels_all, _ = gather_with_grad(labels[:, None])
            return self.loss_fn(both[:, 0], both[:, 1], labels_all[:, 0], scale=self.scale)
        candidates, first = gather_with_grad(columns[1:].transpose(0, 1).reshape(B, -1))  # [N, (C-1)*H]
        candidates = candidates.reshape(candidates.shape[0], C - 1, -1).transpose(0, 1)  # [C-1, N, H]
        return self.loss_fn(columns[0], candidates, scale=self.scale, first=first)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None) -> EmbeddingOutput:
        rows = input_ids.shape[0]
        if rows % self.columns:
            raise BertkitError(f"a batch of {rows} texts is not {self.columns} columns of equal length")
        B = rows // self.columns
        if self.kind == "cached-mnrl":
            step = self.mini_batch_size
            chunks = [(c * B + s, min(c * B + s + step, (c + 1) * B)) for c in range(self.columns)
                      for s in range(0, B, step)]  # never across columns: each is padded to its own longest
            sizes, _ = gather_with_grad(torch.tensor([[float(B)]], device=input_ids.device))  # [W, 1] rows per process
            loss = cached(lambda ab: self.embed(input_ids[ab[0]:ab[1]], attention_mask[ab[0]:ab[1]],
                                                None if token_type_ids is None else token_type_ids[ab[0]:ab[1]]),
                          chunks, lambda e: self.score(e, labels), list(self.parameters()), input_ids.device,
                          weight=B * sizes.shape[0] / float(sizes.sum()))
            return EmbeddingOutput(loss)
        parts = [self.embed(input_ids[c * B:(c + 1) * B], attention_mask[c * B:(c + 1) * B],
                            None if token_type_ids is None else token_type_ids[c * B:(c + 1) * B])
                 for c in range(self.columns)]
        return EmbeddingOutput(self.score(torch.cat(parts), labels))


# --- the run --------------------------------------------------------------------------


def dev_evaluator(cfg: EmbedConfig, log):
    """(evaluate(model, tok) -> scores, the metric that picks the best epoch) for the dev set: retrieval
    on a BEIR folder (nDCG@10), STS on scored pairs (Spearman); (None, None) without one. Read, and a
    --metric the kind does not give refused, before the model loads."""
    if not cfg.dev:
        return None, None
    tcfg = cfg.training
    kind = "a BEIR folder" if is_beir_folder(cfg.dev) else "scored pairs"
    if tcfg.metric is not None and tcfg.metric not in EMBED_DEV[kind]:
        raise BertkitError(f"--metric {tcfg.metric}: a --dev of {kind} gives {', '.join(EMBED_DEV[kind])}")

    def loaded(m, tok):  # the model in training, embedding as it will be saved
        layout = SentenceLayout(m.pooling, cfg.normalize, cfg.max_length)
        return replace(load_model((m.encoder, tok)), layout=layout)

    def figures(scores: dict) -> dict:
        return {k: v for k, v in scores.items() if isinstance(v, float) and not k.endswith("seconds")}

    if kind == "a BEIR folder":
        split = cfg.dev_split or "dev"
        judged = len(read_qrels(qrels_path(cfg.dev, split)))  # a missing split fails now, not later
        kept = min(judged, cfg.max_dev_examples or judged)
        log(f"{cfg.dev} ({split}): {kept} of {judged} judged queries, ranked against the whole corpus")
        return (lambda m, tok: figures(evaluate_retrieval(loaded(m, tok), cfg.dev, split=split,
                                                          max_length=cfg.max_length, batch_size=tcfg.eval_batch_size,
                                                          progress=tcfg.progress, max_queries=kept)),
                EMBED_DEV[kind][0])
    dev = read_examples(cfg.dev, split=cfg.dev_split, max_examples=cfg.max_dev_examples, log=log, flag="--dev-split")
    if not dev.scored:
        raise BertkitError(f"--dev {cfg.dev}: evaluation needs a BEIR folder (retrieval) or scored pairs "
                           "(sentence1, sentence2, score: STS)")
    pairs = [(a, b, s) for (a, b), s in zip(dev.rows, dev.scores)]

    def sts(m, tok):  # both correlations, None (null) where the model gives every pair one cosine: `figures`
        scores = evaluate_sts(loaded(m, tok), pairs, max_length=cfg.max_length, batch_size=tcfg.eval_batch_size)
        return {k: scores[k] for k in EMBED_DEV[kind]}  # kept numbers only, and stopped with KeyError: 'spearman'

    return sts, EMBED_DEV[kind][0]


def finetune_embed(cfg: EmbedConfig, log=print, speed=None) -> dict:
    """Train sentence embeddings on cfg.train, evaluate on cfg.dev each epoch, save the best; returns its metrics."""
    cfg.validate()
    tcfg = cfg.training
    examples = _settle(cfg, log)
    score_dev, metric = dev_evaluator(cfg, log)
    loss = cfg.loss
    dims, weights = cfg.matryoshka()
    if cfg.static:  # bertkit.tasks.static_embed
        encoder, tok = static_start(cfg, load_tokenizer, log)
    else:
        tok = load_tokenizer(cfg.model, cfg.max_length)
        encoder = load_head(BertModel, cfg.model, tcfg.seed, log)  # an ELECTRA folder: its ElectraModel
    if dims and max(dims) > encoder.config.hidden_size:
        raise BertkitError(f"--matryoshka-dims {dims}: the largest exceeds the model's {encoder.config.hidden_size} "
                           "dimensions")
    model = SentenceEmbedder(encoder, cfg.pooling, loss, len(examples.columns), cfg.scale, cfg.mini_batch_size,
                             dims, weights)
    log(f"embedding task: {len(examples.rows)} examples x {len(examples.columns)} texts "
        f"({', '.join(examples.columns)}), loss {loss}{f' (Matryoshka {dims})' if dims else ''}, "
        f"pooling {cfg.pooling}, max length {cfg.max_length}")
    rows = partial(tokenize_rows, log=log) if not cfg.static else static_rows
    ids = rows(tok, examples, cfg.max_length)
    evaluate = None if score_dev is None else partial(score_dev, tok=tok)
    tcfg.metric, out = tcfg.metric or metric, Path(cfg.output)

    @partial(as_one, out)  # its files replace the last epoch's together
    def save(m):
        if cfg.static:
            return save_static_model(m.encoder, tok, out)
        m.encoder.save_pretrained(out, tokenizer=tok)
        write_layout(out, pooling=cfg.pooling, normalize=cfg.normalize, max_seq_length=cfg.max_length,
                     hidden_size=m.encoder.config.hidden_size, dimensions=dims)

    def batches(parts):
        return EmbeddingBatches(examples, ids, tcfg.batch_size, parts, tcfg.seed, tok.pad_token_id)

    # the starting point, so a gain (or a loss) from training is visible; a resumed run measures it again
    # (the same model, the same figures: its metrics.json and last line equal an uninterrupted run's)
    said = set()  # its warnings (a model giving every pair one cosine) shown once, not again each epoch
    before = warnings_once(lambda: evaluate(model), said) if evaluate is not None else None
    if before is not None:
        log(f"dev before training: {tcfg.metric} {figure(before[tcfg.metric])}")
    result = train(model, ids, tcfg, evaluate=evaluate, save=save, output_dir=out, pad_id=tok.pad_token_id,
                   run_config=asdict(cfg), log=log, batches=batches, speed=speed, said=said)
    if not result.is_main:
        return {}
    final = _report(cfg, len(examples.rows), result, before)
    write_json(out / "metrics.json", final)
    return final


def _settle(cfg: EmbedConfig, log) -> EmbeddingExamples:
    """Read the training examples and settle what "auto" left open, in cfg: pooling and max length (the
    model's layout, else mean and 256) and the loss (CoSENT for scored pairs, else MNRL)."""
    # "auto": the model's own pooling, else mean; a static table has no layout to read (it averages)
    layout = None if cfg.static else read_layout(resolve(cfg.model))
    output = resolve_output(layout, cfg.pooling)
    cfg.pooling = output.pooling
    # normalize None: the layout's too, as sentence-transformers' trainer keeps the modules it loaded (True was
    # forced, so training on a dot-product model made it unit-length); a new sentence model (no layout) is saved
    # unit-length, its losses comparing cosines. A static start decides it in static_start.
    if cfg.normalize is None and not cfg.static:
        cfg.normalize = layout.normalize if layout is not None else True
    # a table: its start's cut (None); a transformer: its sentence-transformers length, else 256, or fewer where
    # the model has fewer positions, said (its own length, or one given, is checked against them)
    cfg.max_length = cfg.max_length or output.length
    if not cfg.static:
        fit_length(cfg, log)
    examples = read_examples(cfg.train, split=cfg.train_split, max_examples=cfg.max_train_examples, log=log)
    loss = cfg.loss or ("cosent" if examples.scored else "mnrl")
    if (loss == "cosent") != examples.scored:
        needs = "scored pairs (sentence1, sentence2, score)" if loss == "cosent" else "pairs (anchor, positive...)"
        raise BertkitError(f"--loss {loss} needs {needs}, but {cfg.train} holds "
                           f"{'scored pairs' if examples.scored else 'pairs'}; "
                           f"use --loss {'cosent' if examples.scored else 'mnrl'}")
    cfg.loss = loss
    return examples


def _report(cfg: EmbedConfig, n_examples: int, result, before: dict | None) -> dict:
    """metrics.json of the run: its settings, the epochs, the dev figures before training and of the kept epoch."""
    final = {"task": "embed", "loss": cfg.loss, "pooling": cfg.pooling, "max_length": cfg.max_length,
             "train_examples": n_examples, "train_seconds": round(result.seconds, 1),
             "epochs": result.history, "metric": cfg.training.metric}
    if before is not None:
        final["dev_before_training"] = before
    if result.best is not None:
        final["dev"] = {k: v for k, v in result.best.items() if k not in ("epoch", "step", "train_loss", "train_seconds")}
        final["best_epoch"] = result.best["epoch"]
    return final
