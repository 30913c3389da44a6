"""Reading and answering requests: what every route of the HTTP API shares below its handlers.

A request is checked before it is queued (`bertkit.serve.app`'s module docstring): the body is read
with its size limit enforced on the Content-Length header and again while it streams in
(`read_json`), and what is left of a refused body is read and dropped up to LINGER_BYTES for
LINGER_S (nginx's "lingering close", `discard_body`), so that a client that writes its whole body
before reading sees the 413 instead of a connection reset. The fields shared by several routes
(`texts_field`, `flag_field`, `k_field`) refuse a wrong type or an empty list with one message
naming the field; `known_fields` refuses the fields a route does not take, and `direction_field`,
`no_prompt`, `raw_scores_field` take TEI's options where they ask for what the server does and refuse them
where they ask for something else (each route's fields: `bertkit.serve.app.FIELDS`). Errors are answered
in TEI's shape ({"error", "error_type"}) or OpenAI's ({"error": {"message", "type", "code"}}), and answers
are written by orjson (`JSONResponse`).

A body's nesting is measured before it is parsed (`json_depth`, --max-json-depth: a parser recurses once per
level): in numpy over the raw bytes, brackets counted only outside strings, a quote only where an even number of
backslashes precedes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json

import numpy as np
import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bertkit.serve.runner import InputError, check_text

KINDS = {400: "invalid_request", 401: "authentication", 404: "not_found", 405: "method_not_allowed",
         408: "timeout", 413: "too_large", 415: "unsupported_media_type", 422: "validation", 429: "overloaded",
         500: "backend", 503: "unavailable"}
RETRY_AFTER_S = 1
MAX_K = 1000  # /search: documents per query
MAX_DIGITS = 100  # the longest integer a body may hold (a field's limit names too large a value, up to this)
# a refused body is read and dropped up to this much, for this long, before the answer (`discard_body`)
LINGER_BYTES = 64 * 1024 * 1024
LINGER_S = 30.0  # nginx's lingering_time


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


def plain(value):
    """numpy scalars and arrays -> JSON-able Python values."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


async def read_json(request, limit: int):
    """The request's JSON object: Content-Type application/json, not compressed (415), at most `limit` bytes
    (413), sent within --body-timeout-s (408), nested at most --max-json-depth (400); parsed off the event loop."""
    settings = request.app.state.service.settings
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"the request's Content-Type is {kind or 'missing'}: send the body as application/json")
    coding = request.headers.get("content-encoding", "").strip()
    if coding.lower() not in ("", "identity"):  # a compressed body would be read as broken JSON: say why
        raise ApiError(415, f"the request body has Content-Encoding {coding}: this server reads bodies as they are; "
                            "send it uncompressed, without Content-Encoding")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body has {length} bytes, over the limit of {limit} (--max-body-bytes)")
    try:
        body = await asyncio.wait_for(_read_body(request, limit), settings.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {settings.body_timeout_s:g} s "
                            "(--body-timeout-s)") from None
    data = await asyncio.to_thread(_parse, bytes(body), settings.max_json_depth)
    if not isinstance(data, dict):
        raise ApiError(422, "the request body must be a JSON object")
    return data


async def _read_body(request, limit: int) -> bytearray:
    body = bytearray()
    async for chunk in body_chunks(request):
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes (--max-body-bytes)")
    return body


STEP = np.zeros(256, np.int8)  # byte -> +1 opens a level, -1 closes one
STEP[list(b"[{")], STEP[list(b"]}")] = 1, -1


def json_depth(body: bytes) -> int:
    """How deeply the JSON text `body` nests arrays and objects ({"a": [1]} is 2); for valid JSON.

    Only the few quotes, backslashes and brackets are looked at one by one: a backslash run of odd
    length escapes the byte after it, and a bracket is inside a string when an odd number of real
    quotes precede it."""
    b = np.frombuffer(body, np.uint8)
    slashes = np.flatnonzero(b == ord("\\"))
    escaped = np.zeros(0, np.int64)
    if len(slashes):
        starts = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)  # each run of consecutive backslashes
        ends = np.append(starts[1:], len(slashes))
        odd = (ends - starts) % 2 == 1
        escaped = slashes[ends[odd] - 1] + 1
    quotes = np.flatnonzero(b == ord('"'))
    quotes = quotes[~np.isin(quotes, escaped)]
    steps = STEP[b]
    where = np.flatnonzero(steps)
    outside = np.searchsorted(quotes, where) % 2 == 0
    levels = np.cumsum(steps[where[outside]].astype(np.int64))
    return int(max(0, levels.max())) if len(levels) else 0


def _parse(body: bytes, max_depth: int):
    """JSON text -> Python values; its nesting is measured first, since the parser recurses once per level."""
    depth = json_depth(body)
    if depth > max_depth:
        raise ApiError(400, f"the JSON body nests {depth} levels deep, over the limit of {max_depth} "
                            "(--max-json-depth)")
    try:
        return json.loads(body, parse_int=whole_number)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None


def whole_number(digits: str) -> int:
    """A JSON integer; one too long for any field is refused here, in the client's terms (Python's own refusal,
    past 4,300 digits, told the client to call sys.set_int_max_str_digits())."""
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise ApiError(400, f"the request body holds a number of {len(digits.lstrip('-'))} digits: no field takes "
                            f"one longer than {MAX_DIGITS}")
    return int(digits)


async def body_chunks(request):
    """The request body's chunks as they arrive; `request.state.body_read` says when the last one came."""
    while not getattr(request.state, "body_read", False):
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        request.state.body_read = not message.get("more_body", False)
        if message.get("body"):
            yield message["body"]


async def discard_body(request) -> None:
    """Read and drop what is left of a refused request's body: at most LINGER_BYTES, for LINGER_S.

    Closing a connection whose received bytes were never read makes the kernel
    send a reset, which destroys the answer in flight; a client that writes its
    whole body before reading (urllib, many simple clients) then sees "connection
    reset" instead of our 413 or 401. Reading the rest first, as nginx's lingering
    close does, lets it read the answer. A body declared larger than the bound is
    not read at all: it would be reset anyway.
    """
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > LINGER_BYTES:
        return

    async def drain() -> None:
        seen = 0
        async for chunk in body_chunks(request):  # nothing left: no iteration at all
            seen += len(chunk)
            if seen > LINGER_BYTES:
                return

    with contextlib.suppress(asyncio.TimeoutError, ClientDisconnect):
        await asyncio.wait_for(drain(), LINGER_S)


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


def known_fields(data: dict, names: tuple, hint: str = "") -> None:
    """Refuse fields a route does not take, where ignoring one would answer another question than the one asked
    (/search's `alpha`: the client would get the index's fusion and never know). At most five names are shown,
    each cut at 40 characters: the message stays one line whatever the keys."""
    unknown = [n for n in data if n not in names]
    if unknown:
        shown = ", ".join(json.dumps(n[:40]) for n in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise InputError(f"unknown field{'s' if len(unknown) > 1 else ''} {shown}: this route takes "
                         f"{', '.join(names)}{hint}")


def shown(value) -> str:
    """A request's value as JSON for a message, cut at 40 characters: the message stays one line."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."


def direction_field(data: dict) -> None:
    """TEI's `truncation_direction`: "right" (cut a long input at its end, what this server does, as the model
    was trained to read it) is taken; "left" (keep the end) is refused rather than answered with the start."""
    value = data.get("truncation_direction")
    if value is None or (isinstance(value, str) and value.lower() == "right"):
        return
    if isinstance(value, str) and value.lower() == "left":
        raise InputError('`truncation_direction` "left" is not available: this server cuts a long input at its '
                         'end; send "right" or leave it out')
    raise InputError(f'`truncation_direction` must be "right" or "left", got {shown(value)}')


def no_prompt(data: dict) -> None:
    """TEI's `prompt_name` (a sentence-transformers prompt put before each text): this server applies none, so
    a name is refused (its answer would be the text's without the prompt); null is taken."""
    if data.get("prompt_name") is not None:
        raise InputError(f"`prompt_name` {shown(data['prompt_name'])}: this server applies no prompts; write the "
                         "prompt's text at the start of each input, or leave prompt_name out")


def raw_scores_field(data: dict, raw: bool, task: str, tags: bool = False) -> None:
    """TEI's `raw_scores` (the model's output before a sigmoid or softmax): taken when false, or when the
    answers are raw already (`raw`: a regression's score); refused when they are probabilities, or (`tags`: a
    tagger's) when the answers carry no scores at all, which the refusal says (it said "probabilities")."""
    if flag_field(data, "raw_scores", False) and not raw:
        why = ("its predictions are tags, which carry no scores" if tags else
               "its scores are probabilities and the server keeps no logits behind them")
        raise InputError(f"`raw_scores`: true is not available for this {task} model: {why}; send false or leave "
                         "it out")


def check_key(request, settings) -> None:
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
        raise ApiError(401, "missing or wrong API key: send the header `Authorization: Bearer <key>`",
                       {"WWW-Authenticate": "Bearer"})


def k_field(data: dict) -> int:
    k = data.get("k", 10)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InputError(f"`k` must be a whole number from 1 to {MAX_K}, got {json.dumps(k)}")
    return k
