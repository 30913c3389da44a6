"""The server's limits (issue 38, items 1, 2, 9 and 10's API key), against real server processes on 127.0.0.1.

Two servers (test_serve's `Server`) on the tiny odd-shaped encoder of test_index with an index of six
SciFact abstracts: "defaults" with the default limits (the issue's abusive requests, as written there),
its API key from the BERTKIT_API_KEY environment variable; "tight" with small limits and short timeouts
so each is cheap to reach, its API key from --api-key-file. For every abusive request: the answer is
the status that names the limit, /health sent meanwhile answers within 1 s, the server's resident
memory (VmRSS in /proc/PID/status) is back within 10% of what it was before, and a normal request
still gets its answer.
"""

import json
import os
import resource
import socket
import threading
import time

import pytest
from test_index import make_tiny, scifact_corpus
from test_serve import Server, call

from bertkit.errors import BertkitError
from bertkit.retrieval.index import build_index
from bertkit.serve.limits import json_depth
from bertkit.serve.settings import ServeConfig

KEY = "limits-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_limits")
    tiny = make_tiny(root / "tiny")
    build_index(scifact_corpus(shared_data, root / "corpus.jsonl", n=6), root / "index", str(tiny),
                passage_tokens=32, overlap=6, dtype="float32", progress=False)
    (root / "key").write_text(KEY + "\n")
    return {"tiny": tiny, "index": root / "index", "key": root / "key"}


@pytest.fixture(scope="module")
def servers(made):
    os.environ["BERTKIT_API_KEY"] = KEY  # read by the "defaults" process when it starts
    try:
        started = {
            "defaults": Server(made["tiny"], "--index", made["index"], "--threads", 1, "--dtype", "float32"),
            "tight": Server(made["tiny"], "--index", made["index"], "--threads", 1, "--dtype", "float32",
                            "--api-key-file", made["key"], "--max-client-batch-size", 8, "--max-request-tokens", 300,
                            "--max-search-queries", 4, "--max-search-hits", 20, "--max-json-depth", 8,
                            "--max-answer-bytes", 12000, "--header-timeout-s", HEADER_TIMEOUT_S,
                            "--body-timeout-s", 2, "--max-connections", 300),
        }
    finally:
        del os.environ["BERTKIT_API_KEY"]
    yield started
    for name, server in started.items():
        assert server.stop() == 0, f"{name}: {''.join(server.lines)}"


def rss(server) -> int:
    """The server process's resident memory in KiB (VmRSS)."""
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def post(port, path, body, headers=AUTH, timeout=120):
    return call(port, "POST", path, body, headers, timeout=timeout)


def refused_while_healthy(server, path, body, status, says, headers=AUTH):
    """Send `body`; meanwhile /health must answer within 1 s; the answer must be `status` naming the limit;
    RSS afterwards within 10% of before. Returns (the answer's message, the slowest /health in s)."""
    port = server.port
    post(port, "/embed", {"inputs": ["warm up the routes"]})
    post(port, "/search", {"query": "warm up", "k": 2})
    before = rss(server)
    answer = []
    sender = threading.Thread(target=lambda: answer.append(post(port, path, body, headers)))
    started = time.perf_counter()
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        t0 = time.perf_counter()
        assert call(port, "GET", "/health", timeout=5)[0] == 200
        slowest = max(slowest, time.perf_counter() - t0)
        time.sleep(0.02)
    sender.join()
    took = time.perf_counter() - started
    got, _, data = answer[0]
    message = data["error"] if isinstance(data["error"], str) else data["error"]["message"]
    assert got == status and says in message, (got, data)
    assert slowest < 1.0, f"/health took {slowest:.3f} s during the request"
    after = rss(server)
    size = len(body if isinstance(body, str) else json.dumps(body))
    print(f"\n{path} ({size} bytes): {got} in {took:.2f} s, slowest /health {slowest:.3f} s, "
          f"RSS {before / 1024:.0f} -> {after / 1024:.0f} MB: {message}")
    assert after <= 1.10 * before, f"RSS {before} KiB -> {after} KiB"
    assert post(port, "/embed", {"inputs": ["still serving"]})[0] == 200
    return message, slowest


# --- item 1: /search cannot multiply a small body into gigabytes ---------------------------------------

def test_search_3000_queries_at_k_1000_is_413_naming_the_limit(servers):
    body = {"query": [f"protein {i}" for i in range(3000)], "k": 1000}  # the 45 KB body
    assert 40_000 < len(json.dumps(body)) < 50_000
    refused_while_healthy(servers["defaults"], "/search", body, 413, "over the limit of 32 per request "
                          "(--max-search-queries)")


def test_search_queries_times_k_is_bounded(servers):
    body = {"query": [f"protein {i}" for i in range(32)], "k": 1000}  # 32 queries: allowed; x k: not
    refused_while_healthy(servers["defaults"], "/search", body, 413, "32000 documents, over the limit of 10000")
    status, _, answer = post(servers["tight"].port, "/search", {"query": ["a", "b", "c", "d"], "k": 5})
    assert status == 200 and len(answer) == 4  # 4 x 5 = 20 = the tight limit: answered


# --- item 2: inputs per request, tokens per request, work off the event loop ------------------------------

def test_100000_inputs_to_v1_embeddings_is_413(servers):
    body = {"input": [f"protein {i}" for i in range(100_000)], "model": "x"}
    message, _ = refused_while_healthy(servers["defaults"], "/v1/embeddings", body, 413,
                                       "over the limit of 32 per request (--max-client-batch-size)")
    assert "100000 inputs" in message


def test_300000_inputs_to_tokenize_is_413(servers):
    refused_while_healthy(servers["defaults"], "/tokenize", {"inputs": ["a"] * 300_000}, 413,
                          "(--max-client-batch-size)")


def test_long_texts_to_tokenize_are_tokenized_off_the_event_loop_then_refused(servers):
    """32 inputs of 100 KB: allowed by count and body size; tokenizing them takes seconds of Python, in a
    thread, while /health keeps answering; then the total tokens are over --max-request-tokens."""
    text = "interleukin signalling in regulatory lymphocytes " * 2000
    refused_while_healthy(servers["defaults"], "/tokenize", {"inputs": [text] * 32}, 413,
                          "16384 tokens, the limit per request (--max-request-tokens)")


def test_tokens_per_request_on_embed(servers):
    port = servers["tight"].port
    texts = ["a fairly long sentence about proteins and their many functions in cells " * 5] * 8  # 8 x 64 tokens
    status, _, data = post(port, "/embed", {"inputs": texts, "truncate": True})
    assert status == 413 and "(--max-request-tokens)" in data["error"]
    assert post(port, "/embed", {"inputs": texts[:2]})[0] == 200


def test_answer_size_limit(servers):
    port = servers["tight"].port
    status, _, data = post(port, "/tokenize", {"inputs": ["word " * 70] * 4})  # 288 tokens, ~60 bytes each
    assert status == 413 and "over the limit of 12000 (--max-answer-bytes)" in data["error"], data
    status, _, data = post(port, "/tokenize", {"inputs": ["word " * 70]})
    assert status == 200 and len(data[0]) == 72


# --- item 9: the body itself ------------------------------------------------------------------------

def test_json_depth_by_hand():
    assert json_depth(b'{"a": [1, {"b": "[[[["}]}') == 3
    assert json_depth(b'["\\\\", ["\\"[["]]') == 2  # an escaped backslash, then an escaped quote
    assert json_depth(b'"no containers"') == 0


def test_a_deeply_nested_body_is_400_not_a_500(servers):
    server = servers["defaults"]
    body = "[" * 200_000 + "]" * 200_000
    refused_while_healthy(server, "/embed", body, 400, "nests 200000 levels deep, over the limit of 32 "
                          "(--max-json-depth)")
    assert "Traceback" not in "".join(server.lines)


def test_a_lone_surrogate_is_422(servers):
    port = servers["defaults"].port
    for path in ("/tokenize", "/embed"):
        status, _, data = post(port, path, json.dumps({"inputs": "a\ud800b"}))  # sent as the escape \ud800
        assert status == 422 and "lone surrogate" in data["error"], data
    assert "Traceback" not in "".join(servers["defaults"].lines)


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", None])
def test_only_application_json_is_read(servers, kind):
    port = servers["defaults"].port
    conn_headers = {**AUTH, "Content-Type": kind} if kind else AUTH
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"inputs": "hello"})
    conn.putrequest("POST", "/embed")
    for name, value in {**conn_headers, "Content-Length": str(len(body))}.items():
        conn.putheader(name, value)
    conn.endheaders(body.encode())
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    assert response.status == 415 and "application/json" in data["error"]
    assert post(port, "/embed", {"inputs": "hello"}, {**AUTH, "Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_a_client_that_leaves_mid_body_is_one_log_line(servers):
    server = servers["tight"]
    port = server.port
    before = len(server.lines)
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                     + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [\"half")
        time.sleep(0.2)
        sock.close()
    deadline = time.monotonic() + 10
    while sum("before its request body was read" in line for line in server.lines[before:]) < 3:
        assert time.monotonic() < deadline, "".join(server.lines[before:])
        time.sleep(0.05)
    time.sleep(0.3)
    new = "".join(server.lines[before:])
    assert new.count("before its request body was read") == 3 and "Traceback" not in new and " 500" not in new, new


def test_a_body_that_never_ends_is_408(servers):
    port = servers["tight"].port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"inputs\": ")
    t0 = time.monotonic()
    answer = chunk = sock.recv(4096)
    while chunk and b"}" not in answer:  # headers and body may come in two reads
        chunk = sock.recv(4096)
        answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout-s" in answer, answer
    assert 1.5 < time.monotonic() - t0 < 6


def _half_sent(port, n):
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        socks.append(sock)
    return socks


def _all_closed_by_the_server(socks, deadline_s):
    deadline = time.monotonic() + deadline_s
    for sock in socks:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        assert sock.recv(100) == b""  # EOF: the server closed it
        sock.close()


def test_half_sent_headers_are_closed_after_the_header_timeout(servers):
    server = servers["tight"]
    port = server.port
    before = rss(server)
    socks = _half_sent(port, 200)
    t0 = time.perf_counter()
    assert call(port, "GET", "/health")[0] == 200
    assert time.perf_counter() - t0 < 1.0
    _all_closed_by_the_server(socks, HEADER_TIMEOUT_S + 5)
    assert rss(server) <= 1.10 * before
    # a keep-alive connection must send its next request's headers in time too
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):  # the whole first answer: headers and body
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\n")
    _all_closed_by_the_server([sock], HEADER_TIMEOUT_S + 5)


def test_beyond_the_connection_limit_is_503(servers):
    port = servers["tight"].port
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
    try:
        time.sleep(0.3)
        status = call(port, "GET", "/health")[0]
        assert status == 503
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 5
    while call(port, "GET", "/health")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_300_half_sent_connections_at_ulimit_256_do_not_starve_the_server(servers):
    """The issue's attack: at `ulimit -n 256`, 300 connections that never finish their headers. While the
    descriptors are used up, a new connection is accepted and closed at once (libuv's answer to EMFILE, under
    uvloop); the header timeout frees them, so a client that retries is answered within it, and after it
    /health is answered at once."""
    server = servers["tight"]
    port = server.port
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (256, 256))
    socks = _half_sent(port, 300)  # the kernel queues what the server cannot accept yet
    t0 = time.perf_counter()
    while True:
        try:
            if call(port, "GET", "/health", timeout=HEADER_TIMEOUT_S * 4)[0] == 200:
                break
        except (ConnectionError, OSError):
            pass
        assert time.perf_counter() - t0 < HEADER_TIMEOUT_S * 3, "starved past the header timeout"
        time.sleep(0.1)
    waited = time.perf_counter() - t0
    for sock in socks:
        sock.close()
    print(f"/health answered {waited:.2f} s after 300 half-sent connections at ulimit -n 256")
    time.sleep(0.5)
    t0 = time.perf_counter()
    assert call(port, "GET", "/health")[0] == 200 and time.perf_counter() - t0 < 1.0


# --- item 10: the API key from a file or the environment ----------------------------------------------

def test_api_key_from_the_environment_and_from_a_file(servers):
    for name in ("defaults", "tight"):
        server = servers[name]
        assert post(server.port, "/embed", {"inputs": "x"}, {})[0] == 401
        assert post(server.port, "/embed", {"inputs": "x"})[0] == 200
        cmdline = open(f"/proc/{server.proc.pid}/cmdline", "rb").read()
        assert KEY.encode() not in cmdline  # not visible in ps


def test_api_key_settings(tmp_path):
    (tmp_path / "k").write_text("  s3cret \nignored\n")
    assert ServeConfig(api_key_file=str(tmp_path / "k")).with_api_key({}).api_key == "s3cret"
    assert ServeConfig().with_api_key({"BERTKIT_API_KEY": "from-env"}).api_key == "from-env"
    assert ServeConfig(api_key="flag").with_api_key({"BERTKIT_API_KEY": "from-env"}).api_key == "flag"
    assert ServeConfig().with_api_key({}).api_key is None
    (tmp_path / "empty").write_text("\n")
    for config, says in [(ServeConfig(api_key="a", api_key_file=str(tmp_path / "k")), "not both"),
                         (ServeConfig(api_key_file=str(tmp_path / "empty")), "is empty"),
                         (ServeConfig(api_key_file=str(tmp_path / "none")), "does not exist")]:
        with pytest.raises(BertkitError, match=says):
            config.with_api_key({})
