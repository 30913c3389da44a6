"""/search gathers the queries of concurrent requests into one scan of the index; the server's metrics
count queries per scan and scan time (bertkit_serve_scan_queries, bertkit_serve_scan_seconds)."""

import asyncio
import threading

import numpy as np

from bertkit.serve.metrics import Metrics
from bertkit.serve.scans import ScanQueue


class HeldSearcher:
    """A searcher whose first scan waits until released, so that requests pile up behind it."""

    def __init__(self):
        self.release, self.started, self.calls = threading.Event(), threading.Event(), []

    def scan(self, vectors, depths, queries=None, modes=None):  # as serve.runner's searcher: texts and modes too
        self.calls.append(len(vectors))
        self.started.set()
        self.release.wait(10)
        return [[i] * d for i, d in enumerate(depths)]


def test_scans_gathered_across_requests_are_counted_in_the_metrics():
    searcher, metrics = HeldSearcher(), Metrics()

    async def go():
        queue = ScanQueue(searcher, metrics.scan_done)
        first = asyncio.ensure_future(queue.scan(np.zeros((1, 4)), 2))
        await asyncio.to_thread(searcher.started.wait, 10)  # the first scan runs and holds
        later = [asyncio.ensure_future(queue.scan(np.zeros((n, 4)), 3)) for n in (1, 2, 1)]
        await asyncio.sleep(0)
        searcher.release.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(go())
    assert searcher.calls == [1, 4]  # the three requests that waited went into one scan
    assert first == [[0, 0]] and [len(a) for a in later] == [1, 2, 1]
    text = metrics.render()
    assert "bertkit_serve_scan_queries_sum 5.000000" in text and "bertkit_serve_scan_queries_count 2" in text
    assert 'bertkit_serve_scan_queries_bucket{le="4"} 2' in text and 'bertkit_serve_scan_queries_bucket{le="2"} 1' in text
    assert "bertkit_serve_scan_seconds_count 2" in text
    assert "scan_queries" not in Metrics().render()  # a server without --index shows none
