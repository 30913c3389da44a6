"""The HTTP API: Starlette routes over the batching engine.

Endpoints (JSON in, JSON out):

    POST /v1/embeddings  the OpenAI embeddings API: {"input": str | [str], "model",
                         "encoding_format": "float" | "base64"} -> {"object": "list",
                         "data": [{"object": "embedding", "index", "embedding"}], "model",
                         "usage": {"prompt_tokens", "total_tokens"}}; vectors L2-normalised,
                         as OpenAI's are; errors as {"error": {"message", "type", "code"}}
    POST /embed          text-embeddings-inference's shape: {"inputs": str | [str],
                         "normalize": true, "truncate": false} -> [[float, ...], ...]
    POST /predict        a fine-tuned model: {"inputs": str | [str], "pairs": str | [str]}
                         (pairs: second texts, or QA contexts) -> one prediction per input
    POST /rerank         a pair model: {"query", "texts": [str], "return_text": false}
                         -> [{"index", "score"(, "text")}], best first
    GET  /health         {"status": "ok"} (no API key needed)
    GET  /info           model, task, dimensions, input limit, batching settings
    GET  /metrics        Prometheus text format

Every request is checked before it is queued (JSON, types, empty inputs, the
token limit), so a bad request costs no model time and never reaches a batch.
Errors elsewhere are {"error": message, "error_type": kind}, TEI's shape.
Answers are written by orjson, which takes float32 numpy vectors as they are
and prints each number in the fewest digits that read back to the same
float32 (a third of the bytes of Python's float repr, and ~20x faster than
`json` on a list of floats).
The JSON body is read by Starlette; the size limit is enforced on the
Content-Length header and again while the body streams in, so an oversized
body is refused without being held in memory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import time

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route

from bertkit import __version__
from bertkit.serve.batching import Engine, QueueFull
from bertkit.serve.runner import Encoder, InputError, Query, check_text

log = logging.getLogger("bertkit.serve")

KINDS = {400: "invalid_request", 401: "authentication", 404: "not_found", 405: "method_not_allowed",
         413: "too_large", 422: "validation", 429: "overloaded", 500: "backend", 503: "unavailable"}
RETRY_AFTER_S = 1


class JSONResponse(Response):
    """A JSON answer written by orjson; numpy arrays and scalars are written as they are."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class ClientLeft(Exception):
    """The client closed the connection before its answer was ready."""


def error_response(status: int, message: str, openai: bool, headers: dict | None = None) -> JSONResponse:
    kind = KINDS.get(status, "error")
    body = {"error": {"message": message, "type": kind, "code": status}} if openai else \
        {"error": message, "error_type": kind}
    return JSONResponse(body, status_code=status, headers=headers)


def _plain(value):
    """numpy scalars and arrays -> JSON-able Python values."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


# --- request parsing -------------------------------------------------------------


async def read_json(request, limit: int):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body has {length} bytes, over the limit of {limit} (--max-body-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the request body must be a JSON object")
    return data


def texts_field(data: dict, name: str, required: bool = True) -> list | None:
    """A string or a non-empty list of strings, as a list."""
    if name not in data or data[name] is None:
        if required:
            raise InputError(f"`{name}` is required: a string or a list of strings")
        return None
    value = data[name]
    if isinstance(value, str):
        return [check_text(value, f"`{name}`")]
    if not isinstance(value, list):
        raise InputError(f"`{name}` must be a string or a list of strings, got {type(value).__name__}")
    if not value:
        raise InputError(f"`{name}` is an empty list: send at least one text")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value) or \
            all(isinstance(v, list) for v in value):
        raise InputError(f"`{name}` holds token ids: this server takes text (its tokenizer is the model's own)")
    return [check_text(v, f"`{name}[{i}]`") for i, v in enumerate(value)]


def flag_field(data: dict, name: str, default: bool) -> bool:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"`{name}` must be true or false, got {json.dumps(value)}")
    return value


# --- the app ----------------------------------------------------------------------


def create_app(runner, settings, metrics) -> Starlette:
    """The Starlette app serving `runner` with `settings` (a ServeConfig); the engine lives in its lifespan."""
    engine = Engine(runner, max_queue=settings.max_queue, max_batch_tokens=settings.max_batch_tokens,
                    max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
                    workers=settings.workers or 1, on_depth=metrics.set_in_flight)
    runner.on_batch = metrics.batch_done
    is_encoder = isinstance(runner, Encoder)

    def check_key(request) -> None:
        if settings.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                           {"WWW-Authenticate": "Bearer"})

    def need(kind: str, path: str) -> None:
        if kind == "embed" and not is_encoder:
            raise ApiError(400, f"{path} needs an encoder model; this server holds a fine-tuned "
                                f"{runner.task} model: use /predict")
        if kind == "task" and is_encoder:
            raise ApiError(400, f"{path} needs a fine-tuned model; this server holds an encoder: "
                                "use /embed or /v1/embeddings")
        if kind == "rerank" and not runner.can_rerank():
            raise ApiError(400, f"/rerank needs a model fine-tuned on text pairs with one score (regression, "
                                f"or two labels); this server holds a {runner.task} model")

    async def run(request, items: list, costs: list):
        """Queue a job and await its answer, watching for the client leaving meanwhile."""
        try:
            job = engine.submit(items, costs)
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
            metrics.disconnected()
            raise ClientLeft()
        return job.future.result()  # the job's own error, if its batch failed on it

    def endpoint(name: str, handler, openai: bool = False, keyed: bool = True):
        async def wrapped(request):
            start, n_inputs = time.perf_counter(), 0
            try:
                if keyed:
                    check_key(request)
                response, n_inputs = await handler(request)
            except ApiError as err:
                response = error_response(err.status, err.message, openai, err.headers)
            except InputError as err:
                response = error_response(err.status, str(err), openai)
            except ClientLeft:
                response = Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            except Exception as err:  # a bug, not the client's fault: log it, answer 500, keep serving
                log.exception("error while answering %s", name)
                response = error_response(500, f"internal error: {type(err).__name__}: {err}", openai)
            metrics.request_done(name, response.status_code, time.perf_counter() - start, n_inputs)
            return response

        return wrapped

    async def openai_embeddings(request):
        need("embed", "/v1/embeddings")
        data = await read_json(request, settings.max_body_bytes)
        texts = texts_field(data, "input")
        fmt = data.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise InputError(f"`encoding_format` must be \"float\" or \"base64\", got {json.dumps(fmt)}")
        dims = data.get("dimensions")
        if dims is not None and dims != runner.dim:
            raise InputError(f"`dimensions` {json.dumps(dims)} is not available: this model gives {runner.dim}")
        if "model" in data and not isinstance(data["model"], (str, type(None))):
            raise InputError("`model` must be a string")
        rows = runner.encode(texts, truncate=False)
        costs = [len(r.input_ids) for r in rows]
        tokens = sum(costs)
        vectors = normalized(await run(request, rows, costs))
        items = [{"object": "embedding", "index": i,
                  "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v}
                 for i, v in enumerate(vectors)]
        body = {"object": "list", "data": items, "model": runner.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return JSONResponse(body), len(texts)

    async def tei_embed(request):
        need("embed", "/embed")
        data = await read_json(request, settings.max_body_bytes)
        texts = texts_field(data, "inputs")
        normalize = flag_field(data, "normalize", True)
        rows = runner.encode(texts, truncate=flag_field(data, "truncate", False))
        vectors = await run(request, rows, [len(r.input_ids) for r in rows])
        if normalize:
            vectors = normalized(vectors)
        return JSONResponse(vectors), len(texts)

    async def predict(request):
        need("task", "/predict")
        data = await read_json(request, settings.max_body_bytes)
        texts = texts_field(data, "inputs")
        pairs = texts_field(data, "pairs", required=False)
        if pairs is not None and len(pairs) != len(texts):
            raise InputError(f"{len(texts)} inputs but {len(pairs)} pairs: give one pair per input")
        queries = runner.check([Query(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)])
        preds = await run(request, queries, [1] * len(queries))
        return JSONResponse(_plain(preds)), len(texts)

    async def rerank(request):
        need("task", "/rerank")
        need("rerank", "/rerank")
        data = await read_json(request, settings.max_body_bytes)
        query = check_text(data.get("query"), "`query`")
        texts = texts_field(data, "texts")
        return_text = flag_field(data, "return_text", False)
        preds = await run(request, [Query(query, t) for t in texts], [1] * len(texts))
        scores = [runner.rerank_score(p) for p in preds]
        ranked = sorted(range(len(texts)), key=lambda i: -scores[i])
        out = [{"index": i, "score": scores[i], **({"text": texts[i]} if return_text else {})} for i in ranked]
        return JSONResponse(out), len(texts)

    async def health(request):
        return JSONResponse({"status": "ok"}), 0

    async def info(request):
        body = {"model": runner.name, "version": __version__, **runner.info(),
                "max_input_length": runner.max_length,
                "int8": settings.int8,
                "batching": {k: getattr(settings, k) for k in
                             ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue", "max_body_bytes",
                              "workers", "threads")},
                "auth": settings.api_key is not None}
        return JSONResponse(body), 0

    async def metrics_text(request):
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"), 0

    async def not_found(request, exc: HTTPException):
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                              request.url.path.startswith("/v1/"))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:  # uvicorn has answered every open request by now; the engine drains what is left
            await asyncio.get_running_loop().run_in_executor(None, engine.close)

    routes = [
        Route("/v1/embeddings", endpoint("/v1/embeddings", openai_embeddings, openai=True), methods=["POST"]),
        Route("/embed", endpoint("/embed", tei_embed), methods=["POST"]),
        Route("/predict", endpoint("/predict", predict), methods=["POST"]),
        Route("/rerank", endpoint("/rerank", rerank), methods=["POST"]),
        Route("/health", endpoint("/health", health, keyed=False), methods=["GET"]),
        Route("/info", endpoint("/info", info), methods=["GET"]),
        Route("/metrics", endpoint("/metrics", metrics_text), methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})


def normalized(vectors) -> list:
    """Each vector divided by its L2 norm, one at a time as bertkit.embed does (bit-identical to it)."""
    from bertkit.features import l2_normalize

    return [l2_normalize(v) for v in vectors]


async def _disconnected(request) -> None:
    """Return when the client closes the connection (the ASGI server sends http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
