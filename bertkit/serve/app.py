"""The HTTP API: Starlette routes over the batching engine.

Endpoints (JSON in, JSON out); each takes the fields listed (FIELDS) and refuses any other with 422:

    POST /v1/embeddings  the OpenAI embeddings API: {"input": str | [str], "model" (any name: the one
                         model answers, and the answer names it), "encoding_format": "float" | "base64",
                         "dimensions", "user" (taken, changes nothing), "truncate": true} -> {"object":
                         "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
                         "usage": {"prompt_tokens", "total_tokens"}}; vectors L2-normalised, as
                         OpenAI's are; errors as {"error": {"message", "type", "code"}}
    POST /embed          text-embeddings-inference's shape: {"inputs": str | [str], "normalize": true,
                         "truncate": true, "truncation_direction": "right", "prompt_name": null,
                         "dimensions"} -> [[float, ...], ...]
                         Both take "dimensions" for a Matryoshka-trained model (its layout's
                         matryoshka_dims): the leading ones, renormalised (/embed: if normalize)
    POST /tokenize       TEI's: {"inputs": str | [str], "add_special_tokens": true, "prompt_name": null}
                         -> per input [{"id", "text", "special", "start", "stop"}] (UTF-8 byte offsets,
                         null for special tokens)
    POST /search         with --index: {"query": str | [str], "k": 10, "rerank": false, "mode": the index's
                         default (hybrid when it has a lexical part) | "dense" | "lexical"} -> per query
                         a best-first [{"id", "doc_id", "score", "text"}], `bertkit search --json`'s
                         answer; the query vectors are batched with the embeddings, the
                         scans of the index across requests (`bertkit.serve.scans`)
    POST /predict        a fine-tuned model: {"inputs": str | [str], "pairs": str | [str], "truncate": true,
                         "truncation_direction": "right", "raw_scores": false} (pairs: second texts, or
                         QA contexts) -> one prediction per input
    POST /rerank         a pair model: {"query", "texts": [str], "return_text": false, "truncate": true,
                         "truncation_direction": "right", "raw_scores": false} -> [{"index", "score"(,
                         "text")}], best first
    GET  /health         {"status": "ok"} (no API key needed)
    GET  /info           model, task, dimensions, input limit, batching settings
    GET  /metrics        Prometheus text format

TEI's options: "truncation_direction" "left" is refused (a long input is cut at its end); "prompt_name"
other than null is refused (no prompts are applied); "raw_scores": true is refused where the scores are
probabilities and taken where they are the head's output as it is (a regression's, a QA answer's). "truncate": false
refuses (413) an input longer than the limit where "truncate": true, the default, cuts it there, as TEI
does with --auto-truncate: the embeddings' input limit (the model's sentence-transformers max_seq_length,
or --max-input-length), the fine-tuned model's max_length (an input it reads in windows is never cut). Every
answer of a route that cuts says how many of its inputs were read cut: the X-Truncated-Inputs header (`TRUNCATED`;
/v1/embeddings' usage too, as "truncated_inputs"), counted by /metrics.

Every request is checked before it is queued (JSON, types, empty inputs, the
token limit), so a bad request costs no model time and never reaches a batch.
Errors elsewhere are {"error": message, "error_type": kind}, TEI's shape.
Answers are written by orjson, which takes float32 numpy vectors as they are
and prints each number in the fewest digits that read back to the same
float32 (a third of the bytes of Python's float repr, and without a Python
float object per number, as `json` makes; docs/benchmarks.md has the timing).
The JSON body is read by Starlette; the size limit is enforced on the
Content-Length header and again while the body streams in, so an oversized
body is refused without being held in memory. What is left of a refused body
is read and dropped (up to LINGER_BYTES, nginx's "lingering close"), so that a
client that writes its whole body before reading (Python's urllib) reads the
413 instead of a connection reset.

Each route is a named handler, `handler(request) -> (response, inputs
counted)`, that finds the model, settings, batching engine and metrics in
`request.app.state.service` (a `Service`); `endpoint` wraps every handler the
same way: the API key, errors as JSON, the request metrics. Reading a body and checking the
fields that several routes share live in `bertkit.serve.requests`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from dataclasses import dataclass

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route

from bertkit import __version__
from bertkit.serve.batching import Engine, QueueFull
from bertkit.serve.limits import check_answer, check_inputs, check_search, check_tokens, pairs_budget
from bertkit.serve.scans import ScanQueue
from bertkit.serve.runner import EmbeddingModel, InputError, Query, check_text, leading, load_searcher, token_list
from bertkit.serve.requests import (RETRY_AFTER_S, ApiError, ClientLeft, JSONResponse, plain,
                                     check_key, direction_field, discard_body, error_response, flag_field, k_field,
                                     known_fields, no_prompt, raw_scores_field, read_json, texts_field)

log = logging.getLogger("bertkit.serve")
# the fields each route takes; any other is refused (422 naming it): ignoring one would answer another question
# than the one asked. TEI's and OpenAI's clients send theirs: each is honoured, or taken where its value asks for
# what the route does anyway, or refused where it asks for something else (`bertkit.serve.requests`).
FIELDS = {
    "/v1/embeddings": ("input", "model", "encoding_format", "dimensions", "user", "truncate"),
    "/embed": ("inputs", "normalize", "truncate", "truncation_direction", "dimensions", "prompt_name"),
    "/tokenize": ("inputs", "add_special_tokens", "prompt_name"),
    "/predict": ("inputs", "pairs", "truncate", "truncation_direction", "raw_scores"),
    "/rerank": ("query", "texts", "return_text", "truncate", "truncation_direction", "raw_scores"),
    "/search": ("query", "k", "rerank", "mode"),
}
# how many of a request's inputs the model read cut at its input limit, on every answer of a route that cuts (0
# when none): a long text's answer is its head's, and a bare-list answer (TEI's shape) has no room for a field, so
# the count rides in a header, as text-embeddings-inference sends its x-compute-tokens beside such answers
TRUNCATED = "X-Truncated-Inputs"


@dataclass
class Service:
    """What the handlers share, kept in `app.state.service`: the model, the settings (a ServeConfig),
    the batching engine and the metrics."""

    runner: object
    settings: object
    metrics: object
    engine: Engine
    searcher: object = None  # a runner.Searcher with --index
    scans: object = None  # its ScanQueue

    @property
    def is_encoder(self) -> bool:
        return isinstance(self.runner, EmbeddingModel)


def service(request) -> Service:
    return request.app.state.service


# --- what every route shares ---------------------------------------------------------


def need(svc: Service, path: str) -> None:
    """Refuse a route the loaded model does not answer (its task record's routes: an encoder's, a fine-tuned
    model's, /rerank for a cross-encoder)."""
    runner = svc.runner
    if path in runner.routes:
        return
    if svc.is_encoder:
        raise ApiError(400, f"{path} needs a fine-tuned model; this server holds an encoder: "
                            "use /embed or /v1/embeddings")
    if "/predict" in runner.routes and path == "/rerank":
        raise ApiError(400, f"/rerank needs a model fine-tuned on text pairs with one score (regression, "
                            f"or two labels); this server holds a {runner.task} model")
    raise ApiError(400, f"{path} needs an encoder model; this server holds a fine-tuned "
                        f"{runner.task} model: use /predict")


async def run(request, items: list, costs: list):
    """Queue a job and await its answer, watching for the client leaving meanwhile."""
    svc = service(request)
    try:
        job = svc.engine.submit(items, costs)
    except QueueFull as err:
        raise ApiError(429, f"the server is busy: {err}; retry after {RETRY_AFTER_S} s",
                       {"Retry-After": str(RETRY_AFTER_S)}) from None
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not job.future.done():
        job.left = True  # the batcher skips it if its batch has not started
        job.future.cancel()
        svc.metrics.disconnected()
        raise ClientLeft()
    return job.future.result()  # the job's own error, if its batch failed on it


def endpoint(name: str, handler, openai: bool = False, keyed: bool = True):
    """The route for `handler`: the API key checked, every error answered as JSON, the request counted."""

    async def wrapped(request):
        svc = service(request)
        start, n_inputs, cut = time.perf_counter(), 0, 0
        try:
            if keyed:
                check_key(request, svc.settings)
            response, n_inputs = await handler(request)
            check_answer(len(response.body), svc.settings.max_answer_bytes)
            cut = int(response.headers.get(TRUNCATED, 0))
        except ApiError as err:
            if err.status != 408:  # a body that timed out is not coming: nothing to drain
                await discard_body(request)
            response = error_response(err.status, err.message, openai, err.headers)
        except InputError as err:
            await discard_body(request)
            response = error_response(err.status, str(err), openai)
        except ClientLeft:
            response = Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        except ClientDisconnect:  # gone while sending its body: the client's doing, one line, no traceback
            log.warning("%s: the client closed the connection before its request body was read", name)
            svc.metrics.disconnected()
            response = Response(status_code=499)
        except Exception as err:  # a bug, not the client's fault: log it, answer 500, keep serving
            log.exception("error while answering %s", name)
            response = error_response(500, f"internal error: {type(err).__name__}: {err}", openai)
        svc.metrics.request_done(name, response.status_code, time.perf_counter() - start, n_inputs, cut)
        return response

    return wrapped


def answer(body, cut: int) -> JSONResponse:
    """The JSON answer of a route that may cut its inputs, with the count of those it cut (`TRUNCATED`)."""
    return JSONResponse(body, headers={TRUNCATED: str(cut)})


async def encode(svc: Service, texts: list, field: str | None, **options) -> list:
    """The runner's rows for a request's texts (`field`: their name, for the inputs limit; None: counted
    already), tokenised off the event loop (work that grows with the input must not hold up /health and the
    other requests), within the request limits."""
    if field is not None:
        check_inputs(len(texts), svc.settings.max_client_batch_size, field)
    rows = await asyncio.to_thread(svc.runner.encode, texts, **options)
    check_tokens(sum(len(r.input_ids) for r in rows), svc.settings.max_request_tokens)
    return rows


async def check_pair_tokens(svc: Service, queries: list, data: dict,
                            names: tuple = ("`inputs[{i}]`", "`pairs[{i}]`")) -> int:
    """/predict and /rerank: TEI's options checked (`truncate`: false refuses an input the model would cut),
    and the tokens the model will read, counted off the event loop, within the limit (`names`: the request's
    fields for a text and its pair, to name one that yields no tokens or is too long); returns how many
    inputs the model reads cut."""
    direction_field(data)
    raw_scores_field(data, svc.runner.record.raw_scores, svc.runner.task, svc.runner.record.entities)
    cut = flag_field(data, "truncate", True)
    total, was_cut = await asyncio.to_thread(svc.runner.count_tokens, queries, names, cut)
    check_tokens(total, svc.settings.max_request_tokens)
    return was_cut


# --- the routes ---------------------------------------------------------------------


async def openai_embeddings(request):
    svc = service(request)
    runner = svc.runner
    need(svc, "/v1/embeddings")
    data = await read_json(request, svc.settings.max_body_bytes)
    texts = texts_field(data, "input")
    known_fields(data, FIELDS["/v1/embeddings"])
    fmt = data.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ("float", "base64"):
        raise InputError(f"`encoding_format` must be \"float\" or \"base64\", got {json.dumps(fmt)}")
    dims = runner.check_dimensions(data.get("dimensions"))
    for name in ("model", "user"):  # any name: one model answers (its name is in the answer); `user` changes nothing
        if not isinstance(data.get(name), (str, type(None))):
            raise InputError(f"`{name}` must be a string")
    rows = await encode(svc, texts, "input", truncate=flag_field(data, "truncate", True))
    costs = [len(r.input_ids) for r in rows]
    tokens = sum(costs)
    vectors = leading(await run(request, rows, costs), dims, normalize=True)
    items = [{"object": "embedding", "index": i,
              "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v}
             for i, v in enumerate(vectors)]
    cut = sum(r.cut for r in rows)  # OpenAI's usage, and how many inputs were read cut (also in the header)
    body = {"object": "list", "data": items, "model": runner.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "truncated_inputs": cut}}
    return answer(body, cut), len(texts)


async def tei_embed(request):
    svc = service(request)
    need(svc, "/embed")
    data = await read_json(request, svc.settings.max_body_bytes)
    texts = texts_field(data, "inputs")
    known_fields(data, FIELDS["/embed"])
    direction_field(data)
    no_prompt(data)
    normalize = flag_field(data, "normalize", svc.runner.normalize)
    dims = svc.runner.check_dimensions(data.get("dimensions"))
    rows = await encode(svc, texts, "inputs", truncate=flag_field(data, "truncate", True))
    vectors = await run(request, rows, [len(r.input_ids) for r in rows])
    return answer(leading(vectors, dims, normalize), sum(r.cut for r in rows)), len(texts)


async def tokenize(request):
    svc = service(request)
    data = await read_json(request, svc.settings.max_body_bytes)
    texts = texts_field(data, "inputs")
    known_fields(data, FIELDS["/tokenize"])
    check_inputs(len(texts), svc.settings.max_client_batch_size, "inputs")
    no_prompt(data)
    special = flag_field(data, "add_special_tokens", True)
    answer = await asyncio.to_thread(token_lists, svc.runner.tok, texts, special, svc.settings.max_request_tokens)
    return JSONResponse(answer), len(texts)


def token_lists(tok, texts: list, special: bool, most: int) -> list:
    """/tokenize's answer, text by text while the request's tokens stay within `most` (refused once over it)."""
    out, counted = [], 0
    for text in texts:
        out.append(token_list(tok, text, special, most, counted))
        counted += len(out[-1])
    return out


async def search(request):
    svc = service(request)
    searcher = svc.searcher
    if searcher is None:
        raise ApiError(400, "/search needs an index: start the server with --index INDEX (a folder written by "
                            "bertkit index with this model)")
    data = await read_json(request, svc.settings.max_body_bytes)
    known_fields(data, FIELDS["/search"], ": the fusion (alpha, fusion, rrf_k) is the index's, read from its index.json "
                                      "when the server starts (bertkit evaluate retrieval --tune writes it)")
    queries = texts_field(data, "query")
    k = k_field(data)
    check_search(len(queries), k, svc.settings)
    rerank_them = flag_field(data, "rerank", False)
    mode = searcher.mode(data.get("mode"))
    if rerank_them and searcher.cross is None:
        raise InputError("`rerank`: true needs a cross-encoder: start the server with --rerank MODEL")
    limit = svc.settings.max_request_tokens
    if mode != "dense" and most_tokens(queries) > limit:  # BM25 reads each query whole: count it whole
        count, exact = await asyncio.to_thread(whole_tokens, svc.runner.tok, queries, limit)
        check_tokens(count, limit, exact)
    if mode == "lexical":  # BM25 alone: no query vector to make (the rows are placeholders the scan ignores)
        vectors = np.zeros((len(queries), int(searcher.index.info["dim"])), np.float32)
        cut = read = 0  # BM25 reads each query whole (counted above when it may be long); the encoder reads none
    else:  # a query longer than the index's passages is cut as they were (`bertkit search` says so too)
        rows = await encode(svc, queries, None, truncate=True, max_length=searcher.max_length)
        costs = [len(r.input_ids) for r in rows]
        vectors = np.stack(leading(await run(request, rows, costs), None, normalize=True))
        cut, read = sum(r.cut for r in rows), sum(costs)
    answers = await svc.scans.scan(vectors, searcher.depth(k, rerank_them), queries, mode)
    if rerank_them:  # off the event loop: torch releases the GIL; the pairs read cut are counted beside the queries,
        # and their tokens on top of the queries' (413 before the cross-encoder reads past the limit)
        answers, pairs_cut = await asyncio.to_thread(searcher.rerank, queries, answers,
                                                     pairs_budget(read, limit, len(queries)))
        cut += pairs_cut
    return answer([[h.to_dict() for h in hits[:k]] for hits in answers], cut), len(queries)


def most_tokens(texts: list) -> int:
    """A bound on `whole_tokens` read off the lengths alone: a word piece spans a character at least, and one
    character lower-cases to two at most (a capital I with a dot above: i and a combining dot), so a request of
    short queries, every /search a client sends in practice, skips the count and its thread hop."""
    return sum(2 * len(t) + 2 for t in texts)


def whole_tokens(tok, texts: list, most: int) -> tuple[int, bool]:
    """The word pieces of `texts`, uncut, with [CLS] and [SEP] (a /search query as its lexical part reads it),
    counted until they pass `most`: (the count, True), or once over it (a count past `most`, whether it is the
    whole request's), the rest unread: each text is read only as far as its `Tokenizer.head` for the room left,
    so a 4 MB query costs what its first `most` pieces cost. Uncounted, a 4 MB body of 32 long queries held
    the shared scan thread, and so every other /search, while BM25 read them."""
    total = 0
    for i, text in enumerate(texts):
        head = tok.head(text, max(most - total - 2, 0))  # a cut head holds more than the room: over the limit
        total += tok.ids_batch([head])[1][0] + 2
        if total > most:
            return total, len(head) == len(text) and i == len(texts) - 1
    return total, True


async def predict(request):
    svc = service(request)
    need(svc, "/predict")
    data = await read_json(request, svc.settings.max_body_bytes)
    texts = texts_field(data, "inputs")
    known_fields(data, FIELDS["/predict"])
    check_inputs(len(texts), svc.settings.max_client_batch_size, "inputs")
    pairs = texts_field(data, "pairs", required=False)
    if pairs is not None and len(pairs) != len(texts):
        raise InputError(f"{len(texts)} inputs but {len(pairs)} pairs: give one pair per input")
    queries = svc.runner.check([Query(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)])
    cut = await check_pair_tokens(svc, queries, data)
    preds = await run(request, queries, [1] * len(queries))
    return answer(plain(preds), cut), len(texts)


async def rerank(request):
    svc = service(request)
    need(svc, "/rerank")
    data = await read_json(request, svc.settings.max_body_bytes)
    known_fields(data, FIELDS["/rerank"], ": every text is ranked and returned, best first")
    if data.get("query") is None:
        raise InputError("`query` is required: the text that `texts` are ranked against")
    query = check_text(data["query"], "`query`")
    texts = texts_field(data, "texts")
    check_inputs(len(texts), svc.settings.max_client_batch_size, "texts")
    return_text = flag_field(data, "return_text", False)
    queries = [Query(query, t) for t in texts]
    cut = await check_pair_tokens(svc, queries, data, ("`query`", "`texts[{i}]`"))
    preds = await run(request, queries, [1] * len(texts))
    scores = [svc.runner.rerank_score(p) for p in preds]
    ranked = sorted(range(len(texts)), key=lambda i: -scores[i])
    out = [{"index": i, "score": scores[i], **({"text": texts[i]} if return_text else {})} for i in ranked]
    return answer(out, cut), len(texts)


async def health(request):
    return JSONResponse({"status": "ok"}), 0


async def info(request):
    svc = service(request)
    runner, settings = svc.runner, svc.settings
    body = {"model": runner.name, "version": __version__, **runner.info(),
            "max_input_length": runner.max_length,
            "precision": runner.precision,
            "int8": runner.precision == "int8",  # what runs: a folder save_quantized wrote is int8 without --int8
            "batching": {k: getattr(settings, k) for k in
                         ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue", "max_body_bytes",
                          "workers", "threads")},
            "auth": settings.api_key is not None}
    if svc.searcher is not None:
        body["index"] = svc.searcher.info()
        body["endpoints"] = [*body["endpoints"], "/search"]
    return JSONResponse(body), 0


async def metrics_text(request):
    return Response(service(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"), 0


async def not_found(request, exc: HTTPException):
    return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                          request.url.path.startswith("/v1/"))


# (path, handler, method, options of `endpoint`)
ROUTES = [
    ("/v1/embeddings", openai_embeddings, "POST", {"openai": True}),
    ("/embed", tei_embed, "POST", {}),
    ("/predict", predict, "POST", {}),
    ("/rerank", rerank, "POST", {}),
    ("/tokenize", tokenize, "POST", {}),
    ("/search", search, "POST", {}),
    ("/health", health, "GET", {"keyed": False}),
    ("/info", info, "GET", {}),
    ("/metrics", metrics_text, "GET", {}),
]


@contextlib.asynccontextmanager
async def lifespan(app):
    engine = app.state.service.engine
    engine.start()
    try:
        yield
    finally:  # uvicorn has answered every open request by now; the engine drains what is left
        await asyncio.get_running_loop().run_in_executor(None, engine.close)


def create_app(runner, settings, metrics) -> Starlette:
    """The Starlette app serving `runner` with `settings` (a ServeConfig); the engine lives in its lifespan."""
    searcher = load_searcher(settings, runner)  # before the port opens: a wrong index is one line at start-up
    engine = Engine(runner, max_queue=settings.max_queue, max_batch_tokens=settings.max_batch_tokens,
                    max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
                    workers=settings.workers or 1, on_depth=metrics.set_in_flight)
    runner.on_batch = metrics.batch_done
    routes = [Route(path, endpoint(path, handler, **options), methods=[method])
              for path, handler, method, options in ROUTES]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.service = Service(runner, settings, metrics, engine, searcher,
                                None if searcher is None else ScanQueue(searcher, metrics.scan_done))
    return app


async def _disconnected(request) -> None:
    """Return when the client closes the connection (the ASGI server sends http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
