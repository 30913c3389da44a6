"""The server's limits on one request: what a small body may ask for is bounded before any work.

A request body is at most --max-body-bytes, but what it asks for can be far larger: 3,000
queries at k=1000 in a 45 KB body made a 627 MB answer; 400,000 one-word inputs kept the
event loop busy for seconds. Each limit below is a setting (`bertkit.serve.settings`), checked
as early as its quantity is known, and answered with one message naming the setting:

    --max-json-depth          nesting of the JSON body, scanned before parsing       400
                              (a parser recurses once per level; orjson crashes at ~10^6)
    --body-timeout-s          the whole body must arrive within it                   408
    Content-Type              application/json only (a browser form cannot send it   415
                              cross-site without asking first)
    Content-Encoding          none: a compressed body is refused, not read as JSON   415
    --max-client-batch-size   inputs (texts, queries, pairs) per request: TEI's name  413
                              and default (32); OpenAI's API allows 2,048
    --max-request-tokens      tokens of one request's inputs, after truncation       413
                              (/predict, /rerank: as the model reads them, a windowed input
                              as its windows: the task's `window_tokens`;
                              /search with rerank: its queries and the cross-encoder's
                              --rerank-top pairs per query, `pairs_budget`)
    --max-search-queries      queries per /search request                            413
    --max-search-hits         k x queries per /search request (documents answered)   413
    --max-answer-bytes        the JSON answer; a safety net behind the limits above  413

Body, content type, encoding and depth are checked by `bertkit.serve.requests.read_json`, where the body is
read (the depth by `bertkit.serve.requests.json_depth`, before parsing); the rest here.
"""

from __future__ import annotations

from bertkit.serve.runner import InputError


def check_inputs(n: int, most: int, field: str) -> None:
    if n > most:
        raise InputError(f"`{field}` holds {n} inputs, over the limit of {most} per request "
                         "(--max-client-batch-size): send them in several requests", status=413)


def check_tokens(total: int, most: int, exact: bool = True, fix: str = "send fewer or shorter texts per request",
                 what: str = "") -> None:
    """Refuse a request of more than `most` tokens; `exact`: False when `total` was counted only as far as
    showed it over `most` (the message then says "more than"); `what`: what was counted beside the inputs, `fix`:
    what to change."""
    if total > most:
        held = f"{total} tokens, over the limit of {most}" if exact else f"more than {most} tokens, the limit"
        raise InputError(f"the inputs hold {held} per request (--max-request-tokens){what}: {fix}", status=413)


def pairs_budget(counted: int, most: int, queries: int):
    """/search with rerank: the `on_tokens` that counts each query's (query, passage) pairs as the cross-encoder
    encoded them (cut at its max_length) on top of the `counted` tokens its encoder read of the queries, and refuses
    the request (413) once it passes `most`, before the cross-encoder reads the pairs that took it there. Uncounted,
    one request of 32 queries had it read 32 x --rerank-top pairs of up to 512 tokens: 819,200 against 16,384."""
    seen = [counted, 0]  # tokens, queries told

    def read(n: int) -> None:
        seen[0], seen[1] = seen[0] + n, seen[1] + 1
        check_tokens(seen[0], most, exact=seen[1] == queries, what=", the cross-encoder's (query, passage) pairs "
                     "counted", fix="send fewer queries per request, or start the server with a smaller --rerank-top "
                     "or a larger --max-request-tokens")

    return read


def check_search(n_queries: int, k: int, settings) -> None:
    if n_queries > settings.max_search_queries:
        raise InputError(f"`query` holds {n_queries} queries, over the limit of {settings.max_search_queries} per "
                         "request (--max-search-queries): send them in several requests", status=413)
    if n_queries * k > settings.max_search_hits:
        raise InputError(f"{n_queries} queries x k {k} = {n_queries * k} documents, over the limit of "
                         f"{settings.max_search_hits} per request (--max-search-hits): lower k or send fewer "
                         "queries", status=413)


def check_answer(size: int, most: int) -> None:
    if size > most:
        raise InputError(f"the answer would be {size} bytes, over the limit of {most} (--max-answer-bytes): "
                         "ask for fewer inputs or results per request", status=413)
