"""What the server runs: the model in a directory, turned into batch-level calls.

A model directory holds one of two things, told apart the way `bertkit predict` does (`bertkit_task.json`, else
config.json's `architectures`):

- an encoder (`BertModel`, e.g. the default all-MiniLM-L6-v2): `EmbeddingModel` gives sentence embeddings, the
  layer strategy and pooling of `bertkit.embed` chosen at start-up;
- a fine-tuned model: `TaskModel` answers through `bertkit.tasks.predict` (labels and probabilities, scores, tags
  and entities, answers) and, for a model trained on text pairs, reranks texts against a query.

Both expose `encode` (checks one request's inputs and counts their tokens, on the event loop, so a bad request is
refused before it reaches a batch) and `run_jobs` (answers a pass over parts of requests at once, on a worker
thread; see `bertkit.serve.batching`).

Beside the EmbeddingModel, `--index` loads a `Searcher` for /search: the index folder (`bertkit.retrieval.index`,
checked against the served model the way `bertkit search` checks it) and, with `--rerank`, a cross-encoder
(`bertkit.tasks.rerank`). Query vectors are EmbeddingModel rows like any others, so they share the embeddings'
batches; the scan and the reranking are the library's own (`bertkit.retrieval.search.search_vectors`,
`bertkit.tasks.rerank.rerank`).

`token_list` answers /tokenize: text-embeddings-inference's shape, whose start and stop are UTF-8 byte offsets (its
tokenizer is Rust's).

The EmbeddingModel's forward pass and pooling are `bertkit.embed`'s own (`bertkit.embeddings.features.run_batch`,
`bertkit.embeddings.pooling.pool`: same padding, layer combination and pooling, `resolve_output`'s defaults but
/embed's normalisation) run on rows that are already tokenised: `bertkit.embed` on the same texts gives the same
vectors. Texts longer than the input limit are refused or truncated, never windowed: a server answers within one
forward pass per text, as text-embeddings-inference does.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from bertkit.errors import BertkitError
from bertkit.embeddings.features import run_batch
from bertkit.tasks.predict import predict, reading_info, task_of, with_entities
from bertkit.tasks.registry import TASKS
from bertkit.embeddings.static import check_static_options, static_vectors
from bertkit.tasks.rerank import PairsCut, recorded_effect, rerank, reranker, score
from bertkit.runtime.fast import SpeedSettings, decide
from bertkit.runtime.loading import Loaded, load
from bertkit.embeddings.pooling import l2_normalize, pool
from bertkit.embeddings.settings import resolve_layers, resolve_output
from bertkit.retrieval.index import Index, check_model, model_folder, open_index
from bertkit.retrieval.config import MODES, FusionOptions
from bertkit.retrieval.search import mixed_precision, search_options, search_vectors
from bertkit.serve.batching import plan_batches


class InputError(BertkitError):
    """A request the server refuses; `status` is the HTTP code (422 unless said otherwise)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


@dataclass
class Row:
    """One text as the encoder takes it: token ids with [CLS]/[SEP], segment ids."""

    input_ids: list
    token_type_ids: list
    cut: bool = False  # the text was longer than the input limit and is read cut there (the answer counts these)


def check_text(text, where: str) -> str:
    if not isinstance(text, str):
        raise InputError(f"{where} must be a string, got {_json_type(text)}")
    if not text.strip():
        raise InputError(f"{where} is empty: every input needs at least one non-space character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON lets "\ud800" through; no tokenizer or answer can hold it
        raise InputError(f"{where} holds a lone surrogate ({text[err.start]!r} at character {err.start}), which is "
                         "not a character: send valid Unicode text") from None
    return text


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# --- loading ---------------------------------------------------------------------


def _one_line(err) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def load_runner(settings, speed: SpeedSettings | None = None):
    """The EmbeddingModel or TaskModel for the settings' model (none: the default, or beside --index the index's, as
    `bertkit search` takes it) by `bertkit.runtime.loading`, on `speed` (None: decide()'s); one line if it fails."""
    own = settings.model is None and settings.index is not None and model_folder(settings.index)
    path = own or settings.model_path()  # the default model refused the index of any other at start-up
    name = settings.served_model_name or (path.resolve().name if own or settings.model else "all-MiniLM-L6-v2")
    try:
        speed = decide() if speed is None else speed
        loaded = load(path.resolve(), dtype=settings.dtype, int8=settings.int8, fast=speed)
        if settings.version_2:  # refused beside a model that is no QA model, as predict refuses it
            reading_info(loaded, True)
        if loaded.fine_tuned:
            runner = TaskModel(loaded, settings.for_task_model(name), name)
        else:
            runner = (StaticEncoder if loaded.task == "static" else EmbeddingModel)(loaded, settings, name)
        runner.speed = speed  # the --rerank cross-encoder runs on them too
        runner.warm_up()
    except BertkitError:
        raise
    except Exception as err:  # a corrupt file fails in torch, safetensors or json: say where, in one line
        raise BertkitError(f"cannot load the model in {path}: {type(err).__name__}: {_one_line(err)}") from None
    return runner


# --- embeddings ---------------------------------------------------------------------


class EmbeddingModel:
    """Sentence embeddings from a frozen encoder, one padded forward pass per batch."""

    record = TASKS["embed"]  # the sentence encoder's record: its routes
    task, routes = record.name, record.routes
    budget_in_tokens = True  # a pass is cut by its tokens (max_batch_tokens)

    def __init__(self, loaded: Loaded, settings, name: str):
        model, options = loaded.model, settings.embedding
        self.model, self.tok, self.name, self.precision = model.eval(), loaded.tokenizer, name, loaded.precision
        self.loaded = loaded
        self.layers = resolve_layers(options.layers, model.config.num_hidden_layers, options.combine)
        # /embed normalises unless told not to (text-embeddings-inference's default), whatever the layout says
        output = resolve_output(loaded.layout, options.pooling, True if options.normalize is None else options.normalize)
        self.pooling, self.normalize = output.pooling, output.normalize
        # a static model has no positions to fit: its texts are limited by the batch budget only
        made_for = settings.max_batch_tokens if loaded.task == "static" else loaded.max_length
        self.max_length = settings.check_against_model(loaded.max_positions, made_for)
        tok = loaded.tokenizer
        self.max_batch_tokens, self.max_batch_size = settings.max_batch_tokens, settings.max_batch_size
        self.dim = self.layers.dim(model.config.hidden_size)
        # what `dimensions` may ask for, largest first: the full size and the smaller ones trained (matryoshka_dims)
        smaller = [d for d in (loaded.layout.dimensions or []) if d < self.dim] \
            if loaded.layout is not None and options.layers == "last" and options.combine is None else []
        self.matryoshka = [self.dim, *smaller] if smaller else []
        self.pad_id = getattr(tok, "pad_token_id", 0) or 0
        self.on_batch = None  # metrics hook: (rows, padded tokens, real tokens)

    def info(self) -> dict:
        return {"task": self.task, "static": False, "dimensions": self.dim, "matryoshka_dimensions": self.matryoshka,
                "pooling": self.pooling, "normalize": self.normalize, "layers": list(self.layers.indices),
                "combine": self.layers.combine, "endpoints": list(self.routes)}

    def check_dimensions(self, dims) -> int | None:
        """A request's `dimensions`: None, the full size, or one of the Matryoshka dimensions."""
        if dims is None or (dims == self.dim and not isinstance(dims, bool)):
            return None
        if isinstance(dims, bool) or not isinstance(dims, int):
            got = dims if isinstance(dims, float) else _json_type(dims)  # 16.5 is "a number": say which
            raise InputError(f"`dimensions` must be a whole number, got {got}")
        if not self.matryoshka:
            raise InputError(f"`dimensions` {dims} is not available: this model gives {self.dim} and records no "
                             "Matryoshka dimensions (matryoshka_dims in config_sentence_transformers.json, written "
                             "by bertkit finetune embed with a Matryoshka loss)")
        if dims not in self.matryoshka:
            shown = ", ".join(map(str, self.matryoshka))
            raise InputError(f"`dimensions` {dims} is not available: this model was trained for {shown}")
        return dims

    def encode(self, texts: list, truncate: bool, max_length: int | None = None) -> list:
        """Rows for a request's texts; an over-long text is cut (truncate: its Row says so, and the answer counts
        it) or refused with 413. max_length: another limit than the server's (an index's queries are cut where
        its passages were)."""
        limit = max_length or self.max_length
        rows = []
        for i, text in enumerate(texts):
            # read only as far as shows a text over the limit (Tokenizer.head), not the rest of a long one
            head = self.tok.head(text, limit)
            enc = self.tok.encode(head, max_length=limit, truncation=False)
            ids, types = list(enc.input_ids), list(enc.token_type_ids)
            cut = len(ids) > limit
            if cut and not truncate:
                count = len(ids) if len(head) == len(text) else f"more than {len(ids)}"
                raise InputError(
                    f"input {i} has {count} tokens, over the limit of {limit} "
                    "(--max-input-length): shorten it, or leave truncate at true", status=413)
            if len(ids) <= 2:
                raise InputError(f"input {i} yields no tokens: it holds only characters BERT drops")
            if cut:  # [CLS], the first limit - 2 pieces, [SEP]: a single text as truncation cuts it
                ids, types = [*ids[: limit - 1], ids[-1]], types[:limit]
            rows.append(Row(ids, types, cut))
        return rows

    def run_jobs(self, jobs: list) -> list:
        """Each job's [n_i, D] float32 vectors (not normalised); rows sorted by length across jobs."""
        rows = [(j, k, row) for j, job in enumerate(jobs) for k, row in enumerate(job.items)]
        out = [np.empty((len(job.items), self.dim), dtype=np.float32) for job in jobs]
        for batch in plan_batches([len(r.input_ids) for _, _, r in rows], self.max_batch_tokens, self.max_batch_size):
            vectors = self.forward([rows[i][2] for i in batch])
            for i, vector in zip(batch, vectors):
                out[rows[i][0]][rows[i][1]] = vector
        return out

    def forward(self, rows: list) -> list:
        """One padded batch -> one pooled vector [D] per row: `bertkit.embeddings.features`' forward and pooling."""
        tokens = run_batch(self.model, rows, self.layers, self.pad_id)  # [T_b, D] per row, padding dropped
        if self.on_batch is not None:
            width = max(len(r.input_ids) for r in rows)
            self.on_batch(len(rows), len(rows) * width, sum(len(r.input_ids) for r in rows))
        return [pool(t, self.pooling, normalize=False) for t in tokens]

    def warm_up(self) -> None:
        self.forward(self.encode(["warm up"], truncate=True))


class StaticEncoder(EmbeddingModel):
    """Sentence embeddings from a static model (`bertkit.embeddings.static`): the ids without [CLS]/[SEP]
    and their table rows' mean, the vectors `bertkit.embed` gives; batched and answered as the EmbeddingModel's."""

    def __init__(self, loaded: Loaded, settings, name: str):
        options = settings.embedding
        check_static_options(options.pooling or "auto", options.layers, None, combine=options.combine)
        super().__init__(loaded, settings, name)

    def info(self) -> dict:  # a mean of table rows: no layers to pick and combine ("layers": [0] meant nothing)
        return {**{k: v for k, v in super().info().items() if k not in ("layers", "combine")}, "static": True}

    def encode(self, texts: list, truncate: bool, max_length: int | None = None) -> list:
        limit = max_length or self.max_length
        heads = [self.tok.head(text, limit) for text in texts]  # as the transformer's encode: not the rest
        ids, lengths = self.tok.ids_batch(heads)
        rows, pos = [], 0
        for i, n in enumerate(lengths):
            if n > limit and not truncate:
                count = n if len(heads[i]) == len(texts[i]) else f"more than {n}"
                raise InputError(f"input {i} has {count} tokens, over the limit of {limit} (--max-input-length): "
                                 "shorten it, or leave truncate at true", status=413)
            if n == 0:
                raise InputError(f"input {i} yields no tokens: it holds only characters BERT drops")
            rows.append(Row(ids[pos : pos + min(n, limit)], [], n > limit))
            pos += n
        return rows

    def forward(self, rows: list) -> list:
        """One batch -> one mean vector [D] per row (not normalised)."""
        lengths = [len(r.input_ids) for r in rows]
        if self.on_batch is not None:
            self.on_batch(len(rows), sum(lengths), sum(lengths))
        return list(static_vectors(self.model, [i for r in rows for i in r.input_ids], lengths))


def leading(vectors: list, dims: int | None, normalize: bool) -> list:
    """Each vector cut to its leading `dims` (None: whole), then L2-normalised if asked: Matryoshka's
    truncate-then-renormalise (Kusupati et al. 2022; sentence-transformers' truncate_dim)."""
    cut = vectors if dims is None else [v[:dims] for v in vectors]
    return [l2_normalize(v) for v in cut] if normalize else cut


# --- tokens -------------------------------------------------------------------------


def token_list(tok, text: str, add_special_tokens: bool, most: int | None = None, counted: int = 0) -> list:
    """/tokenize's answer for one text, as text-embeddings-inference gives it: per token its id, its text
    (the input's own characters; a special token's name), whether it is special, and its start and stop
    as UTF-8 byte offsets into the text (null for special tokens). Not truncated: a text that takes the
    request past `most` tokens (`counted`: the earlier inputs') is refused (413) before the answer is built,
    read only as far as its `Tokenizer.head` for the room left."""
    if most is not None and len(tok.head(text, max(most - counted, 0))) < len(text):
        raise_over(most)  # a cut head holds more than the room: the rest is never read
    enc = tok.encode(text, truncation=False, add_special_tokens=add_special_tokens)
    if most is not None and counted + len(enc.input_ids) > most:
        raise_over(most)
    byte_at = [0]  # byte offset of each character, and of the end
    for ch in text:
        byte_at.append(byte_at[-1] + len(ch.encode("utf-8", "surrogatepass")))
    special = enc.special_tokens_mask or [0] * len(enc.input_ids)
    out = []
    for token_id, token, (a, b), is_special in zip(enc.input_ids, enc.tokens, enc.offsets, special):
        if is_special:
            out.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
        else:
            out.append({"id": token_id, "text": text[a:b], "special": False, "start": byte_at[a], "stop": byte_at[b]})
    return out


def raise_over(most: int) -> None:
    raise InputError(f"the inputs hold more than {most} tokens, the limit per request (--max-request-tokens): "
                     "send fewer or shorter texts per request", status=413)


# --- search -------------------------------------------------------------------------


@dataclass
class Searcher:
    """What /search needs beside the EmbeddingModel: the index, the query length its passages were cut at,
    how it ranks by default (`fusion`: the mode and hybrid's fusion, as `bertkit search` resolves them),
    and the --rerank cross-encoder (one pass at a time, outside the embeddings' batching)."""

    index: Index
    max_length: int
    cross: Loaded | None = None
    rerank_top: int = 50
    lock: threading.Lock = field(default_factory=threading.Lock)
    fusion: FusionOptions = field(default_factory=lambda: FusionOptions(mode="dense"))

    def info(self) -> dict:
        made, fused = self.index.info, dataclasses.asdict(self.fusion)
        return {"directory": str(self.index.directory), "passages": made["passages"], "documents": made["documents"],
                "rerank": None if self.cross is None else str(self.cross.directory), "rerank_top": self.rerank_top,
                "mode": fused.pop("mode"), "modes": ["dense", "lexical", "hybrid"] if made.get("lexical") else ["dense"],
                "fusion": fused if made.get("lexical") else None,  # hybrid's: the defaults or index.json's (--tune)
                "vectors": made.get("vectors") or {"kind": "float32"},  # what is stored and scanned (codes_file)
                "precision": made["model"].get("precision")}  # the passages'; /info's own "precision" is the queries'

    def depth(self, k: int, rerank_them: bool) -> int:
        """Documents to find for an answer of k: the cross-encoder re-scores the best rerank_top."""
        return max(k, self.rerank_top) if rerank_them else k

    def mode(self, asked: str | None) -> str:
        """The mode a request asked for (None: the server's), checked against the index."""
        if asked is None:
            return self.fusion.mode
        if asked not in MODES:
            raise InputError(f"`mode` must be one of {', '.join(MODES)}, got {asked!r}")
        if asked != "dense" and not self.index.info.get("lexical"):
            raise InputError(f"`mode` {asked!r} needs the index's lexical part, and {self.index.directory} was built "
                             "with --no-lexical: ask for \"dense\"")
        return asked

    def scan(self, vectors: np.ndarray, depths: list, queries: list | None = None, modes: list | None = None) -> list:
        """Per query vector [Q, D] (and text, and mode: default dense), its best `depths[i]` documents (Hits): one
        scan for the queries of a mode (the deepest answer's prefixes are the shallower ones), and of one fused depth
        for hybrid (max(k, fusion depth) sets its scaling: a k 10 request gathered with a k 150 one changed)."""
        modes, answers = modes or ["dense"] * len(depths), [None] * len(depths)
        groups = [(m, max(d, self.fusion.depth) if m == "hybrid" else 0) for m, d in zip(modes, depths)]
        for mode, deep in dict.fromkeys(groups):
            rows = [i for i, g in enumerate(groups) if g == (mode, deep)]
            found = search_vectors(self.index, vectors[rows], max(depths[i] for i in rows),
                                   queries=None if queries is None else [queries[i] for i in rows],
                                   fusion=dataclasses.replace(self.fusion, mode=mode))
            for i, hits in zip(rows, found):
                answers[i] = hits[: depths[i]]
        return answers

    def rerank(self, queries: list, answers: list, on_tokens=None) -> tuple[list, int]:
        """(each answer's best rerank_top re-scored as `search --rerank` does, the pairs cut); on_tokens: `rerank`'s"""
        cut, top = PairsCut(self.cross), self.rerank_top
        with self.lock:
            answers = [rerank(self.cross, q, hits, top, on_cut=cut, on_tokens=on_tokens) for q, hits in zip(queries, answers)]
        return answers, cut.cut


def load_searcher(settings, runner) -> Searcher | None:
    """The --index folder (and --rerank model) for `runner`; refused at start-up, in one line, when the
    index was made by another model or pooling, or its default search needs a missing bm25s or PyStemmer."""
    if settings.index is None:
        return None
    if not isinstance(runner, EmbeddingModel):
        raise BertkitError(f"--index needs the encoder that made the index; {settings.model} is a fine-tuned "
                           f"{runner.task} model")
    index = open_index(settings.index)
    check_model(index.info, runner.loaded)
    if runner.pooling != (made := index.info["model"])["pooling"]:
        raise BertkitError(f"--pooling {runner.pooling}: the index {settings.index} was made with {made['pooling']} "
                           "pooling; leave out --pooling, or build the index with this pooling")
    fusion = search_options(index, dense_hint=False)  # read now: without bm25s, the server failed every /search
    mixed = mixed_precision(index.info, runner.loaded)  # queries in another precision: `bertkit search` warns too
    cross = reranker(settings.rerank, dtype=settings.dtype, fast=runner.speed) if settings.rerank else None
    for line in filter(None, (mixed and f"note: {mixed}", settings.rerank and recorded_effect(settings.rerank))):
        print(line, file=sys.stderr, flush=True)  # at start-up, beside the server's own lines
    return Searcher(index, int(made["max_length"]), cross, settings.rerank_top, fusion=fusion)


# --- fine-tuned models ----------------------------------------------------------------


@dataclass
class Query:
    """One input of /predict or /rerank: a text and its second text (pair or QA context)."""

    text: str
    pair: str | None = None


class TaskModel:
    """A `bertkit finetune` model answering through `bertkit.tasks.predict`."""

    budget_in_tokens = False  # a pass is cut by its inputs (max_batch_size): predict batches them itself

    def __init__(self, loaded: Loaded, settings, name: str):
        self.model_dir, self.loaded, self.name, self.precision = loaded.directory, loaded, name, loaded.precision
        self.tok = loaded.tokenizer
        # --version-2-with-negative: a Hugging Face QA checkpoint read as SQuAD v2 (None: as its folder says)
        self.version_2 = True if settings.version_2 else None
        info = reading_info(loaded, self.version_2)
        self.info_, self.record = info, task_of(loaded)  # the task's record: pairs, labels, routes, reranking
        self.task, self.max_batch_size = self.record.name, settings.max_batch_size
        self.pairs = self.record.takes_pairs(info)
        self.labels = self.record.labels(loaded.config)
        self.routes = self.record.served_routes(info, self.labels)
        self.dim = self.on_batch = None
        self.max_length = int(info.get("max_length", 512))

    def info(self) -> dict:
        out = {"task": self.task, "labels": self.record.answered(self.labels, self.info_), "pairs": self.pairs,
               "endpoints": list(self.routes)}  # labels: the names its answers use (an IOB1 tagger's I-X)
        if self.record.entities:
            out["tag_scheme"] = self.info_.get("tag_scheme")
        if self.record.no_answer:  # whether a question may get no answer ('')
            out["version_2"] = bool(self.info_.get("version_2"))
        return out

    def can_rerank(self) -> bool:
        """A pair model with one score: its task record's `can_rerank`, as `bertkit search --rerank` asks."""
        return self.record.can_rerank(self.info_, self.labels)

    def check(self, queries: list) -> list:
        for i, q in enumerate(queries):
            if self.pairs and q.pair is None:
                raise InputError(f"this {self.task} model needs {self.record.second} (pairs: [...]) for every input; "
                                 f"input {i} has none")
            if q.pair is not None and self.record.refuses_pairs(self.info_):
                raise InputError(f"this {self.task} model takes single texts: leave out `pairs`")
        return queries

    def count_tokens(self, queries: list, names: tuple = ("`inputs[{i}]`", "`pairs[{i}]`"), cut: bool = True) -> tuple[int, int]:
        """(the tokens the model reads for these inputs, how many of them it reads cut: past max_length, or a QA
        question past max_query_length). The tokens (--max-request-tokens counts them): per input its text's and its
        pair's word pieces with [CLS] and [SEP], cut at the model's max_length as `bertkit.predict` cuts them, or when
        it reads a long input in windows (QA's contexts, NER's sentences, a single text when the model was trained with
        --stride) its windows' tokens, overlaps, [CLS]/[SEP] and QA's question once per window (the task's
        `window_tokens`, from the lengths); a QA question past max_query_length cut there (run_squad.py's cut, which
        `bertkit predict` counts too); a cut text is read only as far as the cut. A text or pair without a word piece
        (only characters BERT drops) is refused, as the embeddings routes refuse it: the model would answer for an
        empty text; with `cut` False (TEI's `truncate: false`) so is an input it would cut (413). `names`: as asked."""
        windows_single = bool(self.info_.get("stride"))
        whole = [self.record.windows or (q.pair is None and windows_single) for q in queries]
        asked = self.record.question_limit and self.record.question_limit(self.info_)  # QA: a question's cut
        # what of a text the count reads: all of a windowed one (a QA question to its cut), else as far as the cut
        heads = [((self.tok.head(q.text, asked) if asked else q.text), q.pair) if w else (
            self.tok.head(q.text, self.max_length), None if q.pair is None else self.tok.head(q.pair, self.max_length))
                 for q, w in zip(queries, whole)]
        _, lengths = self.tok.ids_batch([text for text, _ in heads])
        paired = [pair for _, pair in heads if pair is not None]
        pair_lengths = iter(self.tok.ids_batch(paired)[1] if paired else [])
        total = was_cut = 0
        for i, (q, n, w) in enumerate(zip(queries, lengths, whole)):
            m = None if q.pair is None else next(pair_lengths)
            if n == 0 or m == 0:
                raise InputError(f"{names[n != 0].format(i=i)} yields no tokens: it holds only characters BERT drops")
            if asked and m is not None:  # the model reads a QA question's first max_query_length pieces
                was_cut, n = was_cut + (n > asked), min(n, asked)
            read = n + (2 if m is None else 3 + m)  # as one sequence
            if not (cut or w or read <= self.max_length):
                self._too_long(i, q, read, heads[i], names)
            total += self.record.window_tokens(self.info_, n, m) if w else min(read, self.max_length)
            was_cut += not w and read > self.max_length
        return total, was_cut

    def _too_long(self, i: int, query: Query, n: int, heads: tuple, names: tuple) -> None:
        where = names[0].format(i=i) + ("" if query.pair is None else " with " + names[1].format(i=i))
        whole = heads == (query.text, query.pair)  # else a head was cut: it holds more than max_length
        raise InputError(f"{where} holds {n if whole else f'more than {self.max_length}'} tokens, over this model's "
                         f"max_length of {self.max_length}: shorten it, or leave `truncate` at true (the model then "
                         "reads it cut, longest side first)", status=413)

    def run_jobs(self, jobs: list) -> list:
        """Each job's predictions: one `bertkit.predict` call over every job's inputs together (two when a
        model that reads either, a Hugging Face head checkpoint, is given single texts and pairs at once)."""
        queries = [q for job in jobs for q in job.items]
        preds = [None] * len(queries)
        for paired in (False, True):
            rows = [i for i, q in enumerate(queries) if (q.pair is not None) == paired]
            if rows:
                got = predict(self.model_dir, [queries[i].text for i in rows],
                              [queries[i].pair for i in rows] if paired else None,
                              batch_size=self.max_batch_size, loaded=self.loaded, version_2=self.version_2)
                for i, p in zip(rows, got):
                    preds[i] = p
        if self.on_batch is not None:
            self.on_batch(len(queries), 0, 0)
        if self.record.entities:
            preds = [with_entities(q.text, p) for q, p in zip(queries, preds)]
        out, start = [], 0
        for job in jobs:
            out.append(preds[start : start + len(job.items)])
            start += len(job.items)
        return out

    def rerank_score(self, prediction: dict) -> float:
        return score(prediction, self.loaded)

    def warm_up(self) -> None:
        predict(self.model_dir, ["warm up"], ["warm up"] if self.pairs else None, loaded=self.loaded)
