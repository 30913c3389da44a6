"""What the server runs: the model in a directory, turned into batch-level calls.

A model directory holds one of two things, told apart the way `bertkit predict`
does (`bertkit_task.json`, else config.json's `architectures`):

- an encoder (`BertModel`, e.g. the default all-MiniLM-L6-v2): `Encoder` gives
  sentence embeddings, the layer strategy and pooling of `bertkit.embed`
  chosen at start-up;
- a fine-tuned model: `TaskModel` answers through `bertkit.finetune.predict`
  (labels and probabilities, scores, tags and entities, answers) and, for a
  model trained on text pairs, reranks texts against a query.

Both expose `encode` (checks one request's inputs and counts their tokens, on
the event loop, so a bad request is refused before it reaches a batch) and
`run_jobs` (answers a pass over parts of requests at once, on a worker thread;
see `bertkit.serve.batching`).

The Encoder's forward pass and pooling are `bertkit.features`' own
(`run_batch`, `pool_sentence`: same padding, layer combination and pooling,
float32 numpy, mean over every real token) run on rows that are already
tokenised: `bertkit.embed` on the same texts gives the same
vectors. Texts longer than the input limit are refused or truncated, never
windowed: a server answers within one forward pass per text, as
text-embeddings-inference does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertkit.errors import BertkitError
from bertkit.features import run_batch, whitespace_spans
from bertkit.finetune.rerank import score
from bertkit.loading import Loaded, load
from bertkit.pooling import pool_sentence, resolve_layers
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


def check_text(text, where: str) -> str:
    if not isinstance(text, str):
        raise InputError(f"{where} must be a string, got {_json_type(text)}")
    if not text.strip():
        raise InputError(f"{where} is empty: every input needs at least one non-space character")
    return text


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# --- loading ---------------------------------------------------------------------


def _one_line(err) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def load_runner(settings):
    """The Encoder or TaskModel for the settings' model directory (`bertkit.loading`, in the
    precision --dtype chooses); one clear error if it cannot load."""
    path = settings.model_path()
    name = settings.served_model_name or ("all-MiniLM-L6-v2" if settings.model is None else path.resolve().name)
    try:
        loaded = load(path.resolve(), dtype=settings.dtype, int8=settings.int8)
        runner = Encoder(loaded, settings, name) if loaded.task == "embed" else TaskModel(loaded, settings, name)
        runner.warm_up()
    except BertkitError:
        raise
    except Exception as err:  # a corrupt file fails in torch, safetensors or json: say where, in one line
        raise BertkitError(f"cannot load the model in {path}: {type(err).__name__}: {_one_line(err)}") from None
    return runner


# --- embeddings ---------------------------------------------------------------------


class Encoder:
    """Sentence embeddings from a frozen encoder, one padded forward pass per batch."""

    task = "embed"

    def __init__(self, loaded: Loaded, settings, name: str):
        model, options = loaded.model, settings.embedding
        self.model, self.tok, self.name, self.precision = model.eval(), loaded.tokenizer, name, loaded.precision
        self.layers = resolve_layers(options.layers, model.config.num_hidden_layers, options.combine)
        self.pooling = options.pooling or loaded.pooling
        self.normalize = True if options.normalize is None else options.normalize  # /embed's default: TEI's
        self.max_length = settings.check_against_model(loaded.max_positions, loaded.max_length)
        tok = loaded.tokenizer
        self.max_batch_tokens, self.max_batch_size = settings.max_batch_tokens, settings.max_batch_size
        self.dim = self.layers.dim(model.config.hidden_size)
        self.pad_id = getattr(tok, "pad_token_id", 0) or 0
        self.on_batch = None  # metrics hook: (rows, padded tokens, real tokens)

    def info(self) -> dict:
        return {"task": "embed", "dimensions": self.dim, "pooling": self.pooling, "normalize": self.normalize,
                "layers": list(self.layers.indices), "combine": self.layers.combine,
                "endpoints": ["/v1/embeddings", "/embed"]}

    def encode(self, texts: list, truncate: bool) -> list:
        """Rows for a request's texts; over-long texts are cut (truncate) or refused with 413."""
        rows = []
        for i, text in enumerate(texts):
            enc = self.tok.encode(text, max_length=self.max_length, truncation=truncate)
            if len(enc.input_ids) > self.max_length:
                raise InputError(
                    f"input {i} has {len(enc.input_ids)} tokens, over the limit of {self.max_length} "
                    "(--max-input-length): shorten it, or leave truncate at true", status=413)
            if len(enc.input_ids) <= 2:
                raise InputError(f"input {i} yields no tokens: it holds only characters BERT drops")
            rows.append(Row(list(enc.input_ids), list(enc.token_type_ids)))
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
        """One padded batch -> one pooled vector [D] per row: `bertkit.features`' forward and pooling."""
        tokens = run_batch(self.model, rows, self.layers, self.pad_id)  # [T_b, D] per row, padding dropped
        if self.on_batch is not None:
            width = max(len(r.input_ids) for r in rows)
            self.on_batch(len(rows), len(rows) * width, sum(len(r.input_ids) for r in rows))
        return [pool_sentence(t, self.pooling) for t in tokens]

    def warm_up(self) -> None:
        self.forward(self.encode(["warm up"], truncate=True))


# --- fine-tuned models ----------------------------------------------------------------


@dataclass
class Query:
    """One input of /predict or /rerank: a text and its second text (pair or QA context)."""

    text: str
    pair: str | None = None


class TaskModel:
    """A `bertkit finetune` model answering through `bertkit.finetune.predict`."""

    def __init__(self, loaded: Loaded, settings, name: str):
        self.model_dir, self.loaded, self.name, self.precision = loaded.directory, loaded, name, loaded.precision
        model, info = loaded.model, loaded.info
        self.info_ = info
        self.task = info["task"]
        self.max_batch_size = settings.max_batch_size
        self.pairs = self.task == "qa" or bool(info.get("text_pair_column"))
        self.labels = model.config.labels if self.task not in ("regression", "qa") else None
        self.dim = None
        self.max_length = int(info.get("max_length", 512))
        self.on_batch = None

    def info(self) -> dict:
        out = {"task": self.task, "labels": self.labels, "pairs": self.pairs,
               "endpoints": ["/predict"] + (["/rerank"] if self.can_rerank() else [])}
        if self.task == "ner":
            out["tag_scheme"] = self.info_.get("tag_scheme")
        return out

    def can_rerank(self) -> bool:
        """A pair model with one score: regression, or two labels (the second one's probability)."""
        return self.pairs and self.task != "qa" and (self.task == "regression" or len(self.labels or ()) == 2)

    def check(self, queries: list) -> list:
        for i, q in enumerate(queries):
            if self.pairs and q.pair is None:
                what = "a context (pairs: [context, ...])" if self.task == "qa" else "a second text (pairs)"
                raise InputError(f"this {self.task} model needs {what} for every input; input {i} has none")
            if not self.pairs and q.pair is not None:
                raise InputError(f"this {self.task} model takes single texts: leave out `pairs`")
        return queries

    def run_jobs(self, jobs: list) -> list:
        """Each job's predictions: one `bertkit.predict` call over every job's inputs together."""
        from bertkit.finetune.predict import predict

        queries = [q for job in jobs for q in job.items]
        texts = [q.text for q in queries]
        pairs = [q.pair for q in queries] if self.pairs else None
        preds = predict(self.model_dir, texts, pairs, batch_size=self.max_batch_size, loaded=self.loaded)
        if self.on_batch is not None:
            self.on_batch(len(queries), 0, 0)
        if self.task == "ner":
            preds = [with_entities(q.text, p) for q, p in zip(queries, preds)]
        out, start = [], 0
        for job in jobs:
            out.append(preds[start : start + len(job.items)])
            start += len(job.items)
        return out

    def rerank_score(self, prediction: dict) -> float:
        return score(prediction, self.loaded)

    def warm_up(self) -> None:
        from bertkit.finetune.predict import predict

        predict(self.model_dir, ["warm up"], ["warm up"] if self.pairs else None, loaded=self.loaded)


def with_entities(text: str, prediction: dict) -> dict:
    """A NER prediction plus its entities with character offsets into `text`.

    `bertkit.predict` splits the text on whitespace into words and tags each
    word; an entity (conlleval's chunking of the tags) spans from its first
    word's first character to its last word's end.
    """
    from bertkit.finetune.metrics import get_entities

    spans = whitespace_spans(text)
    entities = []
    for kind, first, last in get_entities(prediction["tags"]):
        a, b = spans[first][0], spans[last][1]
        entities.append({"type": kind, "text": text[a:b], "start": a, "end": b, "words": [first, last + 1]})
    return {**prediction, "entities": entities}
