"""The server's settings: one typed dataclass, from which `bertkit serve`'s flags are built.

Each field is defined once here (name, default, help); `bertkit.options` turns
the fields into argparse options (`max_batch_tokens` -> `--max-batch-tokens`) and
builds the config back from the flags a user gave. `validate` checks what
needs no model, `model_path` that the model directory is there (before torch
loads), `check_against_model` what needs the model's size (the input limit must
fit its position table). `with_api_key` reads the key from the flag, a file or the
environment (BERTKIT_API_KEY), read when the command starts and passed down as a value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.embeddings.settings import AUTO, SENTENCE_CHOICES, EmbedOptions
from bertkit.options import DTYPE_CHOICES, RERANK_TOP_SAYS
from bertkit.default_model import default_model_dir

API_KEY_ENV = "BERTKIT_API_KEY"  # the API key, when neither --api-key nor --api-key-file is given


@dataclass
class ServeConfig:
    model: str | None = field(default=None, metadata={
        "positional": True, "metavar": "MODEL_DIR", "help": "a model directory: an encoder (embeddings) or a `bertkit finetune` output "
        "(default: the embedded all-MiniLM-L6-v2; with --index, the model that made it)"})
    host: str = field(default="127.0.0.1", metadata={"help": "address to bind; 0.0.0.0 exposes the server to the network"})
    port: int = field(default=8080, metadata={"help": "TCP port; 0 picks a free one (printed at start-up)"})
    max_batch_tokens: int = field(default=2048, metadata={
        "help": "token budget of one forward pass: rows x longest row (padding counted); an encoder's (a "
                "fine-tuned model's passes are cut by --max-batch-size inputs)"})
    max_batch_size: int = field(default=64, metadata={"help": "most rows (texts) in one forward pass"})
    max_wait_ms: float = field(default=0.0, metadata={
        "help": "how long a free worker waits for more requests to fill a batch once one is there (default 0: it "
        "starts at once with what is waiting; a busy server batches anyway, as requests pile up meanwhile)"})
    max_queue: int = field(default=512, metadata={
        "help": "most requests accepted and not yet answered; beyond it a request gets 429 with Retry-After"})
    max_input_length: int | None = field(default=None, metadata={
        "help": "embeddings: most tokens per text, [CLS]/[SEP] included (default: the model's sentence-transformers "
        "max_seq_length, else its positions, 512); longer texts are truncated there, or refused (413) when the "
        "request sets truncate: false"})
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "largest request body; beyond it 413"})
    # what one request may ask for (bertkit.serve.limits; docs/serving.md compares them with TEI's and OpenAI's)
    max_client_batch_size: int = field(default=32, metadata={
        "help": "most inputs (texts, queries, pairs) in one request, as TEI's flag of that name; beyond it 413"})
    max_request_tokens: int = field(default=16384, metadata={
        "help": "most tokens of one request's inputs together, after truncation (embeddings, /tokenize, /search; "
        "/predict and /rerank: as the model reads them, a windowed input (QA, NER, --stride) as its windows' tokens, "
        "overlaps and a QA question once per window; /search with rerank: the "
        "cross-encoder's pairs too); beyond it 413"})
    max_search_queries: int = field(default=32, metadata={"help": "most queries in one /search request; beyond it 413"})
    max_search_hits: int = field(default=10000, metadata={
        "help": "most documents one /search request may ask for (k x queries); beyond it 413"})
    max_answer_bytes: int = field(default=16 * 1024 * 1024, metadata={
        "help": "largest JSON answer; beyond it 413 (a safety net behind the limits above)"})
    max_json_depth: int = field(default=32, metadata={"help": "deepest nesting of a JSON body; beyond it 400"})
    max_connections: int = field(default=1024, metadata={
        "help": "most open connections (fewer when the descriptor limit, ulimit -n, leaves less room): a new one "
        "beyond it closes the connection that has waited longest for a request's headers, or, when every one is "
        "in the middle of a request, gets 503"})
    header_timeout_s: float = field(default=10.0, metadata={
        "help": "seconds a new connection has to send its request's headers before it is closed"})
    body_timeout_s: float = field(default=30.0, metadata={
        "help": "seconds a request has to send its whole body; beyond it 408"})
    send_timeout_s: float = field(default=30.0, metadata={
        "help": "seconds an answer may wait for its client to read any of it (nginx's send_timeout); beyond it "
        "the connection is dropped and its unsent answer freed"})
    keep_alive_s: float = field(default=5.0, metadata={
        "help": "seconds an idle keep-alive connection stays open (uvicorn's --timeout-keep-alive)"})
    api_key: str | None = field(default=None, metadata={
        "help": "require `Authorization: Bearer KEY` on every endpoint but /health; on the command line it is "
        "visible to other users (ps): prefer --api-key-file or the BERTKIT_API_KEY environment variable"})
    api_key_file: str | None = field(default=None, metadata={
        "help": "read the API key from the first line of this file (instead of --api-key)"})
    workers: int | None = field(default=None, metadata={
        "help": "forward passes run at once, each on its own thread (default: on a CPU, the cores divided by "
        "--threads; on a GPU, 1)"})
    threads: int | None = field(default=None, metadata={
        "help": "torch CPU threads per worker (default: 1 with the default workers, else the cores divided "
        "among the workers)"})
    embedding: EmbedOptions = field(default_factory=EmbedOptions)  # --layers, --combine, --pooling, --normalize
    dtype: str = field(default="auto", metadata={
        "choices": list(DTYPE_CHOICES), "help": "the precision of the forward passes: auto (bfloat16 where the CPU or "
        "GPU multiplies it natively, else float32), float32 or bfloat16; embeddings are answered as float32"})
    int8: bool = field(default=False, metadata={
        "help": "int8 dense layers (bertkit.quantize; CPU): faster for a small accuracy cost. Activations are "
        "quantized per token on a CPU with VNNI or AMX (a text's numbers do not depend on its batch), per batch "
        "elsewhere (they then vary slightly with the batch: docs/deployment.md)"})
    served_model_name: str | None = field(default=None, metadata={
        "help": "the name /info and /v1/embeddings report (default: the model directory's name)"})
    index: str | None = field(default=None, metadata={
        "help": "an index folder written by `bertkit index` with this model: adds POST /search "
        "(the query vectors are batched with the embeddings traffic; an index made by another model is refused)"})
    version_2: bool = field(default=False, metadata={
        "flags": ["--version-2-with-negative"], "help": "a question-answering model trained on SQuAD v2: a question "
        "may get no answer (''), as `bertkit predict --version-2-with-negative` reads it; for a Hugging Face "
        "checkpoint, whose folder does not say (a bertkit folder says it itself)"})
    rerank: str | None = field(default=None, metadata={
        "help": "with --index: a cross-encoder (`bertkit finetune rerank`; or regression, or pair "
        "with two labels) that re-scores a /search answer's best --rerank-top documents when the request sets rerank: true"})
    rerank_top: int = field(default=50, metadata={"help": "documents the --rerank cross-encoder re-scores per query",
                                                   "needs": ("rerank", None), "says": RERANK_TOP_SAYS})

    def validate(self) -> "ServeConfig":
        positive = ("max_batch_tokens", "max_batch_size", "max_queue", "max_body_bytes", "max_client_batch_size",
                    "max_request_tokens", "max_search_queries", "max_search_hits", "max_answer_bytes",
                    "max_json_depth", "max_connections")
        for name in positive:
            if getattr(self, name) < 1:
                raise BertkitError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "send_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise BertkitError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.max_input_length is not None and self.max_input_length < 3:  # 0 served the default silently
            raise BertkitError(f"--max-input-length must be at least 3 ([CLS], a token, [SEP]), got "
                               f"{self.max_input_length}; leave it out for the model's own length")
        if self.served_model_name is not None and not self.served_model_name.strip():  # was the folder's, silently
            raise BertkitError("--served-model-name is empty: name the model, or leave the flag out for the model "
                               "directory's name")
        if self.max_wait_ms < 0:
            raise BertkitError(f"--max-wait-ms cannot be negative, got {self.max_wait_ms}")
        if not 0 <= self.port <= 65535:
            raise BertkitError(f"--port must be between 0 and 65535, got {self.port}")
        for name in ("threads", "workers"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise BertkitError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.embedding.pooling not in SENTENCE_CHOICES:
            shown = self.embedding.pooling or "none"
            raise BertkitError(f"--pooling {shown} gives no sentence vector: the server answers one "
                               f"vector per text (--pooling {', '.join(SENTENCE_CHOICES)})")
        if self.rerank_top < 1:
            raise BertkitError(f"--rerank-top must be at least 1, got {self.rerank_top}")
        if self.rerank is not None and self.index is None:
            raise BertkitError("--rerank re-scores /search answers: give --index INDEX too")
        if self.index is not None and (self.embedding.layers != "last" or self.embedding.combine is not None):
            raise BertkitError(f"--index: the index's vectors come from the last layer; leave out --layers "
                               f"{self.embedding.layers}{' and --combine' if self.embedding.combine else ''} "
                               "(queries must be embedded as the passages were)")
        if self.api_key is not None and not self.api_key.strip():
            raise BertkitError("--api-key is empty: give a key, or leave the flag out to serve without one")
        return self

    def for_task_model(self, name: str) -> "ServeConfig":
        """The settings, for a fine-tuned model's server: one that answers /predict as `bertkit predict` reads its
        inputs (at its own max_length), so the flags that shape only the embeddings endpoints would change
        nothing: refused, naming them."""
        e = self.embedding
        given = [flag for flag, on in (("--max-input-length", self.max_input_length is not None),
                                       ("--layers", e.layers != "last"), ("--combine", e.combine is not None),
                                       ("--pooling", e.pooling != AUTO), ("--normalize", e.normalize is not None))
                 if on]
        if given:
            one = len(given) == 1
            raise BertkitError(f"{', '.join(given)} shape{'s' * one} the embeddings endpoints, and {name} is a "
                               "fine-tuned model: /predict reads inputs as `bertkit predict` does, at the model's "
                               f"own max_length; leave {'it' if one else 'them'} out")
        return self

    def with_api_key(self, environ: dict) -> "ServeConfig":
        """The settings with `api_key` read from where it was given: --api-key, else --api-key-file (its first
        line), else the environment variable API_KEY_ENV in `environ`; None: no key."""
        if self.api_key is not None and self.api_key_file is not None:
            raise BertkitError("give the API key once: --api-key or --api-key-file, not both")
        key = self.api_key
        if self.api_key_file is not None:
            path = Path(self.api_key_file)
            if not path.is_file():
                raise BertkitError(f"--api-key-file {path} does not exist: write the key on its first line")
            try:  # utf-8-sig: Notepad's byte order mark is no part of the key (str.strip keeps U+FEFF)
                lines = path.read_text(encoding="utf-8-sig").splitlines()
            except UnicodeDecodeError:
                raise BertkitError(f"--api-key-file {path} is not UTF-8 text: write the key in ASCII or UTF-8 on "
                                   "its first line") from None
            key = lines[0].strip() if lines else ""
            if not key:
                raise BertkitError(f"--api-key-file {path} is empty: write the key on its first line")
        elif key is None and environ.get(API_KEY_ENV, "").strip():
            key = environ[API_KEY_ENV].strip()
        return dataclasses.replace(self, api_key=key, api_key_file=None)

    def parallelism(self, cores: int, gpu: bool) -> tuple:
        """(workers, torch threads per worker) on `cores` CPU cores, or on a GPU.

        On a CPU the default is one single-threaded worker per core: passes run side by
        side instead of each matmul being split across threads (bertkit.serve.batching).
        A GPU runs one pass at a time.
        """
        if gpu:
            return self.workers or 1, self.threads or max(1, cores)
        if self.workers is None:
            threads = self.threads or 1
            return max(1, cores // threads), threads
        return self.workers, self.threads or max(1, cores // self.workers)

    def model_path(self) -> Path:
        """The model directory (the default model's when none is given), checked before anything loads."""
        path = default_model_dir() if self.model is None else Path(self.model)
        if not path.is_dir():
            raise BertkitError(f"model directory {path} does not exist: pass a directory with config.json "
                               "(an encoder or a `bertkit finetune` output), or none for the default model")
        # a sentence-transformers static model has modules.json and no config.json (the loader tells them apart)
        if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
            raise BertkitError(f"{path} is not a model directory: it has no config.json")
        return path

    def check_against_model(self, max_positions: int, made_for: int | None = None) -> int:
        """The input limit in tokens, which must fit the model's positions and the batch budget:
        --max-input-length, else the length the model was made for (`made_for`), else its positions."""
        limit = self.max_input_length if self.max_input_length is not None else made_for or max_positions
        if not 3 <= limit <= max_positions:
            raise BertkitError(
                f"--max-input-length {limit} must be between 3 and the model's {max_positions} positions")
        if limit > self.max_batch_tokens:
            raise BertkitError(
                f"--max-batch-tokens {self.max_batch_tokens} is below --max-input-length {limit}: "
                "one long text would never fit a batch; raise the budget")
        return limit
