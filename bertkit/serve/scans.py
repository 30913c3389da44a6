"""Scans of the search index, gathered across requests (the /search route of `bertkit serve`).

A scan reads every vector of the index once whatever the number of queries, so the
queries that arrive while one scan runs wait and go together into the next one: the
gathering of `bertkit.serve.batching`, without a window.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np


class ScanQueue:
    """/search's scans of the index, gathered across requests.

    A scan reads every vector of the index once whatever the number of queries
    (its time is memory's, reading the vectors: one query or eight cost about
    the same; docs/benchmarks.md, "Numbers that left the docstrings"), so
    while one scan runs on its thread, the queries that arrive wait and go
    together into the next: the gathering of `bertkit.serve.batching` without a
    window (an idle server scans at once). Each request then takes its own rows.
    """

    def __init__(self, searcher, on_scan=None):
        self.searcher = searcher
        self.on_scan = on_scan  # (queries, seconds) after each scan: the metrics
        self.waiting = []  # (vectors [Q, D], depth, future, texts, mode)
        self.busy = False

    async def scan(self, vectors: np.ndarray, depth: int, texts: list | None = None, mode: str = "dense") -> list:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((vectors, depth, future, texts or [None] * len(vectors), mode))
        if not self.busy:
            self.busy = True
            asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                vectors = np.concatenate([v for v, *_ in batch])
                depths = [depth for v, depth, *_ in batch for _ in range(len(v))]
                texts = [t for *_, ts, _ in batch for t in ts]
                modes = [mode for v, *_, mode in batch for _ in range(len(v))]
                t0 = time.perf_counter()
                try:
                    answers = await asyncio.to_thread(self.searcher.scan, vectors, depths, texts, modes)
                except Exception as err:  # every request of the scan gets the error (answered as a 500)
                    for _, _, future, *_ in batch:
                        if not future.done():
                            future.set_exception(err)
                    continue
                if self.on_scan is not None:
                    self.on_scan(len(vectors), time.perf_counter() - t0)
                start = 0
                for v, _, future, *_ in batch:
                    if not future.done():  # not cancelled
                        future.set_result(answers[start : start + len(v)])
                    start += len(v)
        finally:
            self.busy = False
