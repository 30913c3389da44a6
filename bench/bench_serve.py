"""Serving under load: `bertkit serve` against Infinity, loopback only, bounded in count and time.

Both servers hold the same weights (the default model, all-MiniLM-L6-v2, from
its local directory) and get the same request mix: SST-2 dev sentences, 1 and
16 per request, in the OpenAI embeddings shape (`POST /v1/embeddings` for us,
`POST /embeddings` for Infinity), from closed-loop clients (each sends its next
request when the previous answer is in) at concurrency 1, 8 and 64. Per level
and mix: throughput (sentences/s), p50/p95/p99 latency, and failures (any
answer but a 200 with one vector per sentence, or no answer), with ratios.
Contenders alternate level by level (ours, peer, ours, peer) while both servers
are up, as bench/harness.py does, because timing noise on a shared machine
drifts over minutes.

Infinity is run from its own virtual environment (it pins many packages):

    python -m venv /work/venv-infinity
    /work/venv-infinity/bin/pip install --dry-run torch==2.13.0 "infinity-emb[server,torch]==0.0.78"  # first:
    /work/venv-infinity/bin/pip install torch==2.13.0 "infinity-emb[server,torch]==0.0.78"  # torch +cpu, no nvidia-*
    infinity_emb v2 --model-id <default model dir> --engine torch --device cpu

`--also NAME=tree:PATH` adds another bertkit serve to the same alternation, started from the source
tree PATH (a checkout of an earlier commit: `git worktree add --detach /tmp/before COMMIT`), so that
a before/after is measured in one run and, with Infinity there too, as a ratio of ratios;
`--also NAME=model:DIR` adds this tree's server with another model folder (a static model beside the
default one). `--search-modes hybrid dense lexical` measures /search in each mode at every level,
alternating, with each mode's throughput over dense's.

`--soak N` then sends N requests to bertkit serve alone (1 to 6 sentences,
every 50th with a ~300-word text, so passes take many shapes), one in ten bad
(malformed JSON, an empty list, an empty string, a wrong type, an over-long
text: each must get a 4xx) and one in ten abandoned (the client closes the
socket before the answer), and samples the server's resident memory every
second. Flat: the last quarter's mean RSS (by time) at most 3% above the
second quarter's (the first quarter is the warm-up). Zero lost good requests
and a queue depth of 0 afterwards are the other goals. `--levels` with no
value runs the soak alone.

`--search INDEX` (an index folder written by `bertkit index` with the default
model) starts bertkit serve with `--index INDEX` and measures `POST /search`:
one query per request (SciFact's test claims: the queries its qrels/test.tsv
judges), `k` = `--search-k`, from closed-loop clients at each level:
queries/s, p50/p95/p99 latency, failures (any answer but a 200 with, per
query, min(k, documents) hits, best first, each a distinct document with its
passage). There is no peer: Infinity has no search route. The soak then sends
two requests in ten to /search (1 to 3 claims, k from 1 to 100), and its bad
and abandoned requests alternate between the routes. `--mixes` with no value
leaves the embeddings levels out (and Infinity unstarted). With --write, the
/search table and the soak go to their own section of docs/benchmarks.md
(`serve_search`), the embeddings table to `serve`.

    python bench/bench_serve.py [--per-client 10] [--levels 1 8 64] [--soak 20000] [--write]
    python bench/bench_serve.py --per-client 2 --levels 1 8 --soak 500      # a smoke run
    python bench/bench_serve.py --levels --soak 20000                         # the soak alone
    python bench/bench_serve.py --search scifact.index --mixes --per-client 100 --repeat 3 --soak 20000
    python bench/bench_serve.py --infinity-dtype bfloat16 --also before=tree:/tmp/before --also static=model:static
    python bench/bench_serve.py --search scifact.index --mixes --repeat 3 --search-modes hybrid dense lexical
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, SHARED_DATA, machine_line, report  # noqa: E402

from bertkit.data.beir import qrels_path, read_qrels, read_queries  # noqa: E402  (no torch: the ceiling child imports it later)

INFINITY = Path(os.environ.get("INFINITY_VENV", "/work/venv-infinity")) / "bin" / "infinity_emb"


def sst2_dev() -> list:
    lines = (SHARED_DATA / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:]
    return [line.split("\t")[0] for line in lines if line.strip()]


def scifact_claims() -> list:
    """SciFact's test claims: the queries of queries.jsonl that qrels/test.tsv judges (300), in file order."""
    folder = SHARED_DATA / "retrieval" / "scifact"
    judged = read_qrels(qrels_path(folder, "test"))
    return [text for qid, text in read_queries(folder).items() if qid in judged]


def index_documents(index: Path) -> int:
    """Documents an answer can hold: the index's documents that have passages (index.json)."""
    made = json.loads((index / "index.json").read_text())
    return made["documents"] - made.get("documents_without_tokens", 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the servers -------------------------------------------------------------------


class Process:
    def __init__(self, name, argv, port, path, env=None, cwd=None):
        self.name, self.port, self.path = name, port, path
        self.log = open(Path(tempfile.gettempdir()) / f"bench_serve_{name}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                     cwd=cwd)

    def wait_ready(self, timeout=300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}: see {self.log.name}")
            try:
                if post(self.port, self.path, {"input": ["warm up"], "model": MODEL_NAME})[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer in {timeout} s: see {self.log.name}")

    def metric(self, name: str, default: float | None = None) -> float:
        """An unlabelled value of /metrics; `default` when the server does not report it (None: an error)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        if found is None and default is None:
            raise SystemExit(f"{self.name}'s /metrics has no {name}")
        return default if found is None else float(found.group(1))

    def scans(self) -> tuple:
        """(queries, scans) of the search index so far: the server's bertkit_serve_scan_queries histogram,
        (0, 0) where it does not report it."""
        return (self.metric("bertkit_serve_scan_queries_sum", 0.0),
                self.metric("bertkit_serve_scan_queries_count", 0.0))

    def rss_mb(self) -> float:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (a server drains), then SIGKILL after `timeout` s: one that hangs is stopped too, and the
        servers after it in the caller's loop still get their turn."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()


MODEL_NAME = "all-MiniLM-L6-v2"


def start_bertkit(model_dir: Path, threads: int | None, workers: int | None = None, index: Path | None = None,
                  name: str = "bertkit", tree: Path = ROOT) -> Process:
    """`bertkit serve` of the source tree `tree` (another checkout: an earlier commit, for a before/after)."""
    port = free_port()
    argv = [sys.executable, "-m", "bertkit.cli", "serve", str(model_dir), "--port", str(port),
            "--served-model-name", MODEL_NAME]
    if os.environ.get("BENCH_SERVE_ARGV"):  # dev: another launcher (e.g. without the allocator setting)
        argv = os.environ["BENCH_SERVE_ARGV"].split() + argv[3:]
    if threads:
        argv += ["--threads", str(threads)]
    if workers:
        argv += ["--workers", str(workers)]
    if index:
        argv += ["--index", str(index)]
    env = {"PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    return Process(name, argv, port, "/v1/embeddings", env, cwd=tree)  # `python -m` puts the cwd first on the path


def other_contender(spec: str) -> tuple:
    """--also NAME=tree:PATH (bertkit serve of another source tree) or NAME=model:DIR (another model folder)
    -> (name, tree, model folder or None)."""
    name, _, what = spec.partition("=")
    kind, _, path = what.partition(":")
    if not name or kind not in ("tree", "model") or not Path(path).is_dir():
        raise SystemExit(f"--also {spec}: give NAME=tree:PATH or NAME=model:DIR, an existing folder")
    return (name, Path(path), None) if kind == "tree" else (name, ROOT, Path(path))


def start_infinity(model_dir: Path, dtype: str = "float32") -> Process:
    port = free_port()
    argv = [str(INFINITY), "v2", "--model-id", str(model_dir), "--engine", "torch", "--device", "cpu",
            "--port", str(port), "--served-model-name", MODEL_NAME, "--log-level", "warning", "--dtype", dtype]
    env = {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    return Process("infinity", argv, port, "/embeddings", env)


# --- the clients --------------------------------------------------------------------


def post(port, path, body, conn=None):
    """(status, parsed JSON) on `conn` (a fresh connection when None)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)
    finally:
        if own:
            conn.close()


def run_clients(client, concurrency: int) -> float:
    """Run `concurrency` threads of `client` at once; the wall-clock seconds until the last is done."""
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    return time.perf_counter() - t0


def ask_embeddings(server: Process, conn, texts: list) -> bool:
    """One embeddings request (OpenAI shape); good when it is a 200 with one vector per text."""
    status, body = post(server.port, server.path, {"input": texts, "model": MODEL_NAME}, conn)
    return status == 200 and len(body["data"]) == len(texts)


def search_answer_ok(body, queries: int, hits: int) -> bool:
    """/search's answer to `queries` queries: a list per query of `hits` hits, best first (scores not
    increasing), each a distinct document with a passage id and its text."""
    return isinstance(body, list) and len(body) == queries and all(
        len(answer) == hits and len({h["doc_id"] for h in answer}) == hits
        and all(h["id"] and h["text"] and isinstance(h["score"], float) for h in answer)
        and all(a["score"] >= b["score"] for a, b in zip(answer, answer[1:]))
        for answer in body)


def asker_search(k: int, documents: int, mode: str | None = None):
    """One /search request of `k` (documents: how many the index can answer; mode: hybrid, dense or lexical,
    None: the server's default) for closed_loop and the soak."""
    def ask(server: Process, conn, queries: list, k: int = k) -> bool:
        status, body = post(server.port, "/search", {"query": queries, "k": k, **({"mode": mode} if mode else {})},
                            conn)
        return status == 200 and search_answer_ok(body, len(queries), min(k, documents))
    return ask


def closed_loop(server: Process, payloads: list, concurrency: int, total: int, ask=ask_embeddings) -> dict:
    """`concurrency` clients, each with a keep-alive connection, until `total` requests are answered.

    A payload is one request's texts (`ask` sends it: embeddings by default, or /search); the rate
    is texts (sentences, or queries) per second."""
    counter = itertools.count()
    latencies, failures, sentences = [], [0], [0]
    lock = threading.Lock()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while (i := next(counter)) < total:
            texts = payloads[i % len(payloads)]
            t0 = time.perf_counter()
            try:
                ok = ask(server, conn, texts)
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            dt = time.perf_counter() - t0
            with lock:
                if ok:
                    latencies.append(dt)
                    sentences[0] += len(texts)
                else:
                    failures[0] += 1
        conn.close()

    wall = run_clients(client, concurrency)
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else [latencies[0]] * 99
    return {"rate": sentences[0] / wall, "p50": q[49], "p95": q[94], "p99": q[98], "failed": failures[0],
            "requests": total}


# --- the soak -----------------------------------------------------------------------

FLAT_WITHIN = 0.03  # memory is flat when the last quarter's mean RSS is at most 3% above the second quarter's


def soak_texts(sentences: list, i: int) -> list:
    """Request i's texts: 1 to 6 SST-2 sentences (most requests one), every 50th with a ~300-word text,
    so the passes take many shapes (rows x longest row) and, now and then, a large one."""
    n = (1, 1, 2, 1, 1, 3, 1, 6)[i % 8]
    start = (i * 7919) % (len(sentences) - n)
    texts = sentences[start: start + n]
    if i % 50 == 0:
        words, k = [], start
        while len(words) < 300:
            words += sentences[k % len(sentences)].split()
            k += 1
        texts = texts + [" ".join(words[:300])]
    return texts


def soak_search(claims: list, i: int) -> tuple:
    """Request i's /search: 1 to 3 SciFact claims and a k from 1 to 100, so the scans and the query
    passes vary too."""
    j = i // 5  # kinds 1 and 5 of one ten differ
    n = (1, 1, 2, 1, 3)[j % 5]
    start = (i * 7919) % (len(claims) - n)
    return claims[start: start + n], (10, 1, 100, 10, 25, 50)[j % 6]


SEARCH_BAD = [b'{"query": "unclosed', {"query": []}, {"query": ""}, {"k": 10}, {"query": "x", "k": 0},
              {"query": "x", "k": 1001}, {"query": "x", "k": 2.5}, {"query": "x", "rerank": "yes"},
              {"query": "x", "rerank": True}]  # the last: the server has no --rerank model


def soak(server: Process, sentences: list, total: int, concurrency: int = 8, every_s: float = 1.0,
         search=None) -> dict:
    """`total` requests from `concurrency` clients: one in ten bad, one in ten abandoned mid-request.

    Bad: malformed JSON, an empty list, an empty string, a wrong type, a text over the input limit
    with "truncate": false (each must get a 4xx). Abandoned: the client sends a request and closes
    the socket without reading the answer. Resident memory is sampled every `every_s` seconds.
    `search`: (claims, ask) from `asker_search`, for a server with --index: then two in ten are
    /search requests (`soak_search`), and the bad and abandoned ones alternate between
    the embeddings route and /search (`SEARCH_BAD`).
    """
    counter = itertools.count()
    lost, refused_ok, bad_sent, answered = [0], [0], [0], [0]
    searched, search_queries = [0], [0]
    lock = threading.Lock()
    bad_bodies = [b'{"input": ["unclosed', {"input": [], "model": MODEL_NAME}, {"input": "", "model": MODEL_NAME},
                  {"input": 5, "model": MODEL_NAME},
                  # over the limit: served texts are cut there by default (as TEI does), refused with "truncate": false
                  {"input": " ".join(["word"] * 600), "model": MODEL_NAME, "truncate": False}]
    bad = [(server.path, b) for b in bad_bodies]
    if search:
        bad = [r for pair in itertools.zip_longest(bad, [("/search", b) for b in SEARCH_BAD]) for r in pair if r]
    samples, done = [], threading.Event()

    def sample():
        t0 = time.perf_counter()
        while not done.is_set():
            samples.append((time.perf_counter() - t0, server.rss_mb()))
            done.wait(every_s)
        samples.append((time.perf_counter() - t0, server.rss_mb()))

    def abandon(path, request):
        body = json.dumps(request).encode()
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"POST %s HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                      % (path.encode(), len(body), body))

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while (i := next(counter)) < total:
            texts = soak_texts(sentences, i)
            kind = i % 10
            try:
                if kind == 3:
                    if search and (i // 10) % 2:
                        queries, k = soak_search(search[0], i)
                        abandon("/search", {"query": queries, "k": k})
                    else:
                        abandon(server.path, {"input": texts, "model": MODEL_NAME})
                    continue
                if kind == 7:
                    path, body = bad[(i // 10) % len(bad)]
                    status, _ = post(server.port, path, body, conn)
                    with lock:
                        bad_sent[0] += 1
                        refused_ok[0] += 400 <= status < 500
                    continue
                if search and kind in (1, 5):
                    queries, k = soak_search(search[0], i)
                    good = search[1](server, conn, queries, k)
                    with lock:
                        searched[0] += good
                        search_queries[0] += good * len(queries)
                else:
                    good = ask_embeddings(server, conn, texts)
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
                good = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            with lock:
                answered[0] += good
                lost[0] += not good
        conn.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    seconds = run_clients(client, concurrency)
    done.set()
    sampler.join()
    depth = server.metric("bertkit_serve_queue_depth")  # every abandoned request released
    return {"requests": total, "seconds": seconds, "lost": lost[0], "answered": answered[0],
            "bad_refused": refused_ok[0], "bad_sent": bad_sent[0], "rss": samples, "depth_after": depth,
            "with_search": bool(search), "searched": searched[0], "search_queries": search_queries[0],
            "concurrency": concurrency}


def flatness(samples: list) -> tuple:
    """(second quarter's mean RSS, last quarter's mean RSS, growth between them), quarters of the soak's time."""
    end = samples[-1][0]
    q2 = [mb for t, mb in samples if end / 4 <= t < end / 2]
    q4 = [mb for t, mb in samples if t >= 3 * end / 4]
    a, b = statistics.mean(q2), statistics.mean(q4)
    return a, b, b / a - 1


# --- the forward ceiling -----------------------------------------------------------


def ceiling_child(workers: int | None, threads: int | None, seconds: float) -> None:
    """Print {"rate": sentences/s, ...} of the server's own forward, with no HTTP, queue or JSON around it.

    The same settings, runner and pass planner as `bertkit serve` (its defaults: one single-threaded
    worker per core, 2048-token passes), fed the whole SST-2 dev set sorted at once, so that the
    passes are as even as any gather can make them: what the model itself can do on this machine,
    an upper bound for any server of it that computes every sentence."""
    from bertkit.runtime.devices import cores
    from bertkit.cli.serve import bound_kernel_caches
    from bertkit.serve.server import speed

    bound_kernel_caches()  # as `bertkit serve` does, before torch is imported
    import torch

    from bertkit.serve.batching import plan_batches
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    settings = ServeConfig(workers=workers, threads=threads)
    workers, threads = settings.parallelism(cores(), gpu=False)
    torch.set_num_threads(threads)
    runner = load_runner(settings, speed())  # the server's settings: rule 7's row buckets on
    rows = runner.encode(sst2_dev(), truncate=True)
    passes = [[rows[i] for i in b] for b in plan_batches([len(r.input_ids) for r in rows],
                                                          settings.max_batch_tokens, settings.max_batch_size)]
    work = itertools.cycle(passes)
    lock, done, stop = threading.Lock(), [0], time.perf_counter() + seconds

    def worker():
        while time.perf_counter() < stop:
            with lock:
                batch = next(work)
            runner.forward(batch)
            with lock:
                done[0] += len(batch)

    t0 = time.perf_counter()
    run = [threading.Thread(target=worker) for _ in range(workers)]
    [t.start() for t in run]
    [t.join() for t in run]
    print(json.dumps({"rate": done[0] / (time.perf_counter() - t0), "workers": workers, "threads": threads,
                      "kernel": f"float32 on {runner.speed.matmul_kernel}" if runner.precision == "float32" else runner.precision}))


def forward_ceiling(workers: int | None, threads: int | None, seconds: float = 30.0) -> dict:
    """`ceiling_child` in a fresh process (the servers idle meanwhile)."""
    argv = [sys.executable, __file__, "--ceiling-of", str(workers or 0), str(threads or 0), str(seconds)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# --- the report ---------------------------------------------------------------------


def median_run(runs: list) -> dict:
    """Field by field, the median of repeated measurements of one level."""
    return {key: statistics.median(r[key] for r in runs) for key in ("rate", "p50", "p95", "p99")} | {
        "failed": sum(r["failed"] for r in runs), "requests": sum(r["requests"] for r in runs)}


def render(results: dict, levels, mixes, soaked, args, ceilings=()) -> str:
    repeats, results = results, {key: median_run(runs) for key, runs in results.items()}
    load = os.getloadavg()
    lines = ["### Serving: bertkit serve vs Infinity (OpenAI embeddings API, loopback)", "",
             f"{machine_line()}; load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}. "
             f"bertkit serve in its default precision (--dtype auto: bf16 where native)"
             f"{f' with --index {args.search.name} loaded' if args.search else ''}, Infinity with "
             f"--dtype {args.infinity_dtype}."]
    if results:
        lines += ["", f"Default model, SST-2 dev sentences, closed-loop clients, {args.per_client} requests per client "
                  f"per level{f', each level measured {args.repeat} times (medians)' if args.repeat > 1 else ''}. Ratios: throughput ours/peer (above 1 we are faster), p99 ours/peer (below 1 we are "
                  "faster).", "",
                  "| sentences/request | concurrency | contender | sentences/s | p50 ms | p95 ms | p99 ms | failed | "
                  "throughput ratio | p99 ratio |",
                  "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = list(dict.fromkeys(n for n, _, _ in results))  # bertkit first, then as started
    for mix in mixes if results else []:
        for level in levels:
            ours = results[("bertkit", mix, level)]
            for name in [n for n in names if (n, mix, level) in results]:
                r = results[(name, mix, level)]
                ratio = (f"{ours['rate'] / r['rate']:.2f}x", f"{ours['p99'] / r['p99']:.2f}") if name != "bertkit" else ("", "")
                lines.append(f"| {mix} | {level} | {name} | {r['rate']:,.0f} | {r['p50'] * 1e3:.1f} | "
                             f"{r['p95'] * 1e3:.1f} | {r['p99'] * 1e3:.1f} | {r['failed']}/{r['requests']} | "
                             f"{ratio[0]} | {ratio[1]} |")
    others = [n for n in names if n not in ("bertkit", "infinity")]
    if others:
        lines += ["", "Other contenders (`--also`): " + ", ".join(f"{n} = {spec.partition('=')[2]}" for n, spec in
                                                                 zip(others, args.also))
                  + "; on their rows the ratios are bertkit's over theirs, measured in the same alternation."]
        if "infinity" in names:
            lines.append("Each against Infinity (throughput, p99), so that a before/after is a ratio of ratios:")
            lines += [f"- {name}: " + ", ".join(
                f"{mix}/request c={level} {results[(name, mix, level)]['rate'] / results[('infinity', mix, level)]['rate']:.2f}x"
                f" / {results[(name, mix, level)]['p99'] / results[('infinity', mix, level)]['p99']:.2f}"
                for mix, level in itertools.product(mixes, levels)) for name in names if name != "infinity"]
    if args.repeat > 1 and any(n != "bertkit" for n, _, _ in results):
        lines += ["", "Ratios of each repetition (throughput, p99), in the order measured:"]
        for mix, level in itertools.product(mixes, levels):
            pairs = zip(repeats[("bertkit", mix, level)], repeats.get(("infinity", mix, level), []))
            lines.append(f"- {mix} sentence(s) per request, concurrency {level}: " + ", ".join(
                f"{a['rate'] / b['rate']:.2f}x / {a['p99'] / b['p99']:.2f}" for a, b in pairs))
    if ceilings:
        rate = statistics.mean(c["rate"] for c in ceilings)
        top = max(levels)
        lines += ["", f"Forward ceiling: bertkit's own passes on this machine, without the server (the same runner, "
                  f"{ceilings[0]['workers']} worker(s) x {ceilings[0]['threads']} thread(s), matmuls in "
                  f"{ceilings[0].get('kernel', '?')}, 2048-token passes of the "
                  "whole SST-2 dev set sorted at once, no HTTP, queue or JSON), measured before and after the levels: "
                  + " and ".join(f"{c['rate']:,.0f}" for c in ceilings) + " sentences/s."]
        for mix in mixes:
            ours, peer = results.get(("bertkit", mix, top)), results.get(("infinity", mix, top))
            if ours:
                line = (f"At concurrency {top} with {mix} sentence(s) per request, bertkit serve ran at "
                        f"{ours['rate'] / rate:.0%} of it")
                if peer:
                    line += (f"; 1.5x Infinity's rate ({1.5 * peer['rate']:,.0f} sentences/s) would be "
                             f"{1.5 * peer['rate'] / rate:.0%} of it")
                lines.append(line + ".")
    if soaked:
        lines += ["", soak_line(soaked)]
    return "\n".join(lines) + "\n"


def soak_line(soaked: dict) -> str:
    rss = [mb for _, mb in soaked["rss"]]
    q2, q4, growth = flatness(soaked["rss"])
    verdict = "flat" if growth <= FLAT_WITHIN else "NOT flat"
    if soaked["with_search"]:
        mix = ("two in ten /search requests of 1 to 3 SciFact claims with k from 1 to 100, the others 1 to 6 "
               "sentences to /v1/embeddings, every 50th with a ~300-word text), one in ten bad")
        halves = " (half of the bad and of the abandoned ones to /search)"
        searched = (f", {soaked['searched']:,} of them /search ({soaked['search_queries']:,} queries, each "
                    "answered in full, best first)")
    else:
        mix, halves, searched = "1 to 6 sentences each, every 50th with a ~300-word text), one in ten bad", "", ""
    return (f"Soak: {soaked['requests']:,} requests to bertkit serve in {soaked['seconds']:.0f} s from "
            f"{soaked['concurrency']} clients ({mix} ({soaked['bad_refused']}/{soaked['bad_sent']} refused with a 4xx) "
            f"and one in ten abandoned mid-request{halves}; good requests answered {soaked['answered']:,}{searched}, lost "
            f"{soaked['lost']}; queue depth after: {soaked['depth_after']:.0f}. Resident memory, sampled every "
            f"second: {rss[0]:.0f} MB at the start, peak {max(rss):.0f} MB, mean {q2:.0f} MB over the second "
            f"quarter of the time and {q4:.0f} MB over the last ({growth:+.1%}): {verdict} (flat: at most "
            f"{FLAT_WITHIN:.0%} growth between the two), {rss[-1]:.0f} MB at the end.")


def render_search(results: dict, levels, soaked, args, documents: int, claims: int) -> str:
    """The /search section: queries/s and latency per level (medians of the repetitions), then the soak."""
    load = os.getloadavg()
    made = json.loads((Path(args.search) / "index.json").read_text())
    lines = ["### Serving: POST /search (bertkit serve --index, loopback)", "",
             f"{machine_line()}; load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}. "
             f"bertkit serve in its default precision (--dtype auto: bf16 where native) and its default workers, "
             f"with --index {Path(args.search).name}: {made['passages']:,} passages of {documents:,} documents, "
             f"{made['dim']} dimensions, vectors made in {made['model']['precision']}."]
    if results:
        repeats, results = results, {key: median_run(runs) for key, runs in results.items()}
        per_scan = {key: [r["per_scan"] for r in runs if r.get("per_scan")] for key, runs in repeats.items()}
        gathered = all(per_scan.values())
        modes = list(dict.fromkeys(mode for mode, _ in results))
        vs_dense = "dense" in modes and len(modes) > 1
        lines += ["", f"One query per request (SciFact's {claims} test claims in turn), k = {args.search_k}, closed-loop "
                  f"clients, {args.per_client} requests per client per level"
                  f"{f', each level measured {args.repeat} times (medians)' if args.repeat > 1 else ''}. Failed: any "
                  f"answer but a 200 with {min(args.search_k, documents)} hits, best first, each a distinct document "
                  "with its passage." + (" Queries per scan: how many queries one read of the index served "
                                         "(the server's bertkit_serve_scan_queries, over the level)." if gathered else ""),
                  "", "| concurrency | mode | queries/s | p50 ms | p95 ms | p99 ms | failed |"
                  + (" queries per scan |" if gathered else "") + (" throughput / dense's |" if vs_dense else ""),
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if gathered else "")
                  + (" ---: |" if vs_dense else "")]
        for level, mode in itertools.product(levels, modes):
            r = results[(mode, level)]
            ratio = f" {r['rate'] / results[('dense', level)]['rate']:.2f}x |" if vs_dense else ""
            lines.append(f"| {level} | {mode or made.get('fusion', {}).get('mode', 'default')} | {r['rate']:,.1f} | "
                         f"{r['p50'] * 1e3:.1f} | {r['p95'] * 1e3:.1f} | {r['p99'] * 1e3:.1f} | "
                         f"{r['failed']}/{r['requests']} |"
                         + (f" {statistics.median(per_scan[(mode, level)]):.1f} |" if gathered else "") + ratio)
        if args.repeat > 1:
            lines += ["", "Each repetition (queries/s, p99 ms), in the order measured:"]
            lines += [f"- concurrency {level}, {mode or 'default'}: " + ", ".join(
                f"{r['rate']:,.1f} / {r['p99'] * 1e3:.0f}" for r in repeats[(mode, level)])
                for level, mode in itertools.product(levels, modes)]
    if soaked:
        lines += ["", soak_line(soaked)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, nargs="*", default=[1, 8, 64],
                    help="client concurrency levels (none: only the soak)")
    ap.add_argument("--mixes", type=int, nargs="*", default=[1, 16],
                    help="sentences per request (none: no embeddings levels, e.g. with --search)")
    ap.add_argument("--per-client", type=int, default=10, help="requests per client at each level")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each level this many times, contenders alternating; the table gives medians")
    ap.add_argument("--soak", type=int, default=0, help="requests in the soak (0: none); the goal's is 20000")
    ap.add_argument("--threads", type=int, help="torch threads per worker for bertkit serve (default: its own)")
    ap.add_argument("--workers", type=int, help="workers for bertkit serve (default: its own, one per core)")
    ap.add_argument("--no-infinity", action="store_true", help="bertkit serve alone")
    ap.add_argument("--infinity-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="Infinity's --dtype (bertkit serve runs its own default, --dtype auto: bf16 where native)")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip the forward ceiling (bertkit's passes without the server, before and after the levels)")
    ap.add_argument("--search", type=Path, metavar="INDEX",
                    help="an index folder of `bertkit index` (default model): serve it with --index and measure "
                    "POST /search at each level, one SciFact claim per request; the soak mixes /search in")
    ap.add_argument("--search-k", type=int, default=10, help="k of each /search request at the levels")
    ap.add_argument("--search-modes", nargs="+", choices=["hybrid", "dense", "lexical"],
                    help="with --search: measure each of these modes at every level, alternating (default: the "
                    "index's own mode only)")
    ap.add_argument("--model", type=Path, help="the model folder bertkit serve runs (default: the default model)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=tree:PATH|NAME=model:DIR",
                    help="another bertkit serve contender in the same alternation: the source tree PATH (an earlier "
                    "commit's checkout) with the same model, or this tree with the model folder DIR; repeatable")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    ap.add_argument("--ceiling-of", nargs=3, type=float, help=argparse.SUPPRESS)  # internal: the child process
    args = ap.parse_args(argv)
    if args.ceiling_of:
        workers, threads, seconds = args.ceiling_of
        ceiling_child(int(workers) or None, int(threads) or None, seconds)
        return 0

    from bertkit.default_model import default_model_dir

    model_dir = args.model or default_model_dir()
    sentences = sst2_dev()
    if args.search and not (args.search / "index.json").is_file():
        raise SystemExit(f"--search {args.search}: no index.json there; build one with `bertkit index CORPUS -o INDEX`")
    with_infinity = not args.no_infinity and args.levels and args.mixes
    if with_infinity and not INFINITY.exists():  # before any server starts: one left running would outlive this exit
        raise SystemExit(f"Infinity is not installed at {INFINITY}: see this file's docstring, or --no-infinity")
    claims = scifact_claims() if args.search else []
    documents = index_documents(args.search) if args.search else 0
    ask_search = asker_search(args.search_k, documents) if args.search else None
    others = [other_contender(spec) for spec in args.also]  # every --also checked before any server starts
    servers, results, searches, soaked, ceilings = {}, {}, {}, None, []

    def measure_ceiling():  # before and after the levels: the machine's speed drifts meanwhile
        if args.levels and args.mixes and not args.no_ceiling:
            ceilings.append(forward_ceiling(args.workers, args.threads))
            print(f"forward ceiling: {ceilings[-1]['rate']:.1f} sentences/s", file=sys.stderr, flush=True)

    try:  # started inside: a start that fails stops the servers already started (none outlives this run)
        servers["bertkit"] = start_bertkit(model_dir, args.threads, args.workers, args.search)
        for name, tree, model in others:
            servers[name] = start_bertkit(model or model_dir, args.threads, args.workers, None, name, tree)
        if with_infinity:
            servers["infinity"] = start_infinity(model_dir, args.infinity_dtype)
        for server in servers.values():
            server.wait_ready()
        measure_ceiling()
        for mix in args.mixes if args.levels else []:
            payloads = [sentences[i: i + mix] for i in range(0, len(sentences) - mix + 1, mix)]
            for level, _ in itertools.product(args.levels, range(args.repeat)):
                for name, server in servers.items():  # alternate contenders level by level
                    closed_loop(server, payloads, level, min(level, 8))  # a short warm-up at this concurrency
                    r = closed_loop(server, payloads, level, level * args.per_client)
                    results.setdefault((name, mix, level), []).append(r)
                    print(f"{name:9s} {mix:2d}/request  c={level:<3d} {r['rate']:8.1f} sentences/s  "
                          f"p50 {r['p50'] * 1e3:7.1f} ms  p99 {r['p99'] * 1e3:7.1f} ms  failed {r['failed']}",
                          file=sys.stderr, flush=True)
        measure_ceiling()
        if args.search and args.levels:
            for name in [n for n in servers if n != "bertkit"]:
                servers.pop(name).stop()  # /search has no peer: bertkit alone on the machine
            payloads = [[claim] for claim in claims]  # one query per request
            modes = args.search_modes or [None]
            for level, _, mode in itertools.product(args.levels, range(args.repeat), modes):  # modes alternate
                ask = asker_search(args.search_k, documents, mode)
                closed_loop(servers["bertkit"], payloads, level, min(level, 8), ask)  # warm-up
                before = servers["bertkit"].scans()
                r = closed_loop(servers["bertkit"], payloads, level, level * args.per_client, ask)
                queries, scans = (b - a for a, b in zip(before, servers["bertkit"].scans()))
                r["per_scan"] = queries / scans if scans else None  # how many queries each read of the index served
                searches.setdefault((mode, level), []).append(r)
                print(f"/search   k={args.search_k:<3d} {mode or 'default':7s} c={level:<3d} {r['rate']:8.1f} queries/s"
                      f"    p50 {r['p50'] * 1e3:7.1f} ms  p99 {r['p99'] * 1e3:7.1f} ms  failed {r['failed']}"
                      + (f"  {r['per_scan']:.1f} queries/scan" if r["per_scan"] else ""), file=sys.stderr, flush=True)
        if args.soak:
            for name in [n for n in servers if n != "bertkit"]:
                servers.pop(name).stop()  # the soak has the machine to itself
            soaked = soak(servers["bertkit"], sentences, args.soak,
                          search=(claims, ask_search) if args.search else None)
            q2, q4, growth = flatness(soaked["rss"])
            print(f"soak: {soaked['seconds']:.0f} s, lost {soaked['lost']}, RSS {q2:.0f} -> {q4:.0f} MB ({growth:+.1%})",
                  file=sys.stderr, flush=True)
    finally:
        codes = {name: server.stop() for name, server in servers.items()}
    if codes.get("bertkit", 0) != 0:
        print(f"bertkit serve exited with {codes['bertkit']} on SIGTERM (expected 0)", file=sys.stderr)
    if results or not args.search:
        report("serve", render(results, args.levels, args.mixes, None if args.search else soaked, args, ceilings),
               args.write)
    if args.search:
        report("serve_search", render_search(searches, args.levels, soaked, args, documents, len(claims)), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
