"""Server metrics in the Prometheus text exposition format (version 0.0.4).

Three kinds, as Prometheus defines them: a counter only grows (requests by
endpoint and status), a gauge goes up and down (requests waiting or running),
a histogram counts observations into cumulative `le` buckets and keeps their sum
and count (batch rows, batch tokens, request latency). Metrics are updated from
the event loop and from the batcher thread, so every update holds one lock.

Written by hand rather than with prometheus_client: the format is a few lines
of text, and the server then needs no global registry.
"""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    escaped = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in labels.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(labels, escaped)) + "}"


class Histogram:
    """Counts per bucket (non-cumulative inside, cumulative when rendered), sum and count."""

    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: dict) -> list:
        out, running = [], 0
        for bound, n in zip((*self.buckets, "+Inf"), self.counts):
            running += n
            out.append(f"{name}_bucket{_labels({**labels, 'le': bound})} {running}")
        out.append(f"{name}_sum{_labels(labels)} {self.sum:.6f}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class Metrics:
    """What /metrics reports; `render()` gives the exposition text."""

    PREFIX = "bertkit_serve"

    def __init__(self, model: dict | None = None):
        self.model = model or {}  # labels of the served model: name, task, precision
        self._lock = threading.Lock()
        self.requests = {}  # (endpoint, status) -> count
        self.inputs = {}  # endpoint -> texts answered
        self.truncated = {}  # endpoint -> texts answered that the model read cut at its input limit
        self.latency = {}  # endpoint -> Histogram of seconds
        self.batch_rows = Histogram(SIZE_BUCKETS)
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.padding_tokens = 0
        self.scan_queries = Histogram(SIZE_BUCKETS)  # /search: queries per gathered scan of the index
        self.scan_seconds = Histogram(LATENCY_BUCKETS)
        self.disconnects = 0
        self.in_flight = 0  # accepted, not yet answered (the admission queue)

    def request_done(self, endpoint: str, status: int, seconds: float, n_inputs: int = 0, truncated: int = 0) -> None:
        with self._lock:
            key = (endpoint, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            if status == 200:
                if n_inputs:
                    self.inputs[endpoint] = self.inputs.get(endpoint, 0) + n_inputs
                if truncated:
                    self.truncated[endpoint] = self.truncated.get(endpoint, 0) + truncated
                self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch_done(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        with self._lock:
            self.batch_rows.observe(rows)
            self.batch_tokens.observe(padded_tokens)
            self.padding_tokens += padded_tokens - real_tokens

    def scan_done(self, queries: int, seconds: float) -> None:
        with self._lock:
            self.scan_queries.observe(queries)
            self.scan_seconds.observe(seconds)

    def disconnected(self) -> None:
        with self._lock:
            self.disconnects += 1

    def set_in_flight(self, n: int) -> None:
        with self._lock:
            self.in_flight = n

    def render(self) -> str:
        p = self.PREFIX
        with self._lock:
            lines = []
            if self.model:
                lines += [f"# HELP {p}_model_info The served model: its name, task and the precision of its passes.",
                          f"# TYPE {p}_model_info gauge", f"{p}_model_info{_labels(self.model)} 1"]
            lines += [f"# HELP {p}_requests_total HTTP requests answered, by endpoint and status code.",
                      f"# TYPE {p}_requests_total counter"]
            lines += [f"{p}_requests_total{_labels({'endpoint': e, 'status': s})} {n}"
                      for (e, s), n in sorted(self.requests.items())]
            lines += [f"# HELP {p}_inputs_total Texts answered with status 200, by endpoint.",
                      f"# TYPE {p}_inputs_total counter"]
            lines += [f"{p}_inputs_total{_labels({'endpoint': e})} {n}" for e, n in sorted(self.inputs.items())]
            lines += [f"# HELP {p}_truncated_inputs_total Texts answered with status 200 that the model read cut at its "
                      "input limit, by endpoint.", f"# TYPE {p}_truncated_inputs_total counter"]
            lines += [f"{p}_truncated_inputs_total{_labels({'endpoint': e})} {n}"
                      for e, n in sorted(self.truncated.items())]
            lines += [f"# HELP {p}_queue_depth Requests accepted and not yet answered (waiting or in a batch).",
                      f"# TYPE {p}_queue_depth gauge", f"{p}_queue_depth {self.in_flight}",
                      f"# HELP {p}_client_disconnects_total Requests whose client left before the answer.",
                      f"# TYPE {p}_client_disconnects_total counter", f"{p}_client_disconnects_total {self.disconnects}",
                      f"# HELP {p}_padding_tokens_total Padding positions computed in forward passes.",
                      f"# TYPE {p}_padding_tokens_total counter", f"{p}_padding_tokens_total {self.padding_tokens}",
                      f"# HELP {p}_batch_size Rows (texts or windows) per forward pass.",
                      f"# TYPE {p}_batch_size histogram"]
            lines += self.batch_rows.lines(f"{p}_batch_size", {})
            lines += [f"# HELP {p}_batch_tokens Padded tokens (rows x longest row) per forward pass.",
                      f"# TYPE {p}_batch_tokens histogram"]
            lines += self.batch_tokens.lines(f"{p}_batch_tokens", {})
            if self.scan_queries.count:  # only a server with --index scans
                lines += [f"# HELP {p}_scan_queries Queries per scan of the search index (gathered across requests).",
                          f"# TYPE {p}_scan_queries histogram"]
                lines += self.scan_queries.lines(f"{p}_scan_queries", {})
                lines += [f"# HELP {p}_scan_seconds Time of one scan of the search index.",
                          f"# TYPE {p}_scan_seconds histogram"]
                lines += self.scan_seconds.lines(f"{p}_scan_seconds", {})
            lines += [f"# HELP {p}_request_duration_seconds Time from the request's arrival to its answer (200s).",
                      f"# TYPE {p}_request_duration_seconds histogram"]
            for endpoint, hist in sorted(self.latency.items()):
                lines += hist.lines(f"{p}_request_duration_seconds", {"endpoint": endpoint})
        return "\n".join(lines) + "\n"
