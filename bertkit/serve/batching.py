"""Dynamic batching: a bounded queue of requests, one batcher thread, token-budget batches.

The idea is text-embeddings-inference's and Infinity's: the model runs fastest
on many rows at once, but requests arrive one by one. Each request becomes a
`Job` (its inputs, already checked and tokenised, and a future for its answer).

- Admission: at most `max_queue` jobs are accepted and not yet answered
  (waiting or inside a batch). One more is refused at once (`QueueFull`, HTTP
  429 with Retry-After): a full server says so instead of letting clients hang.
- Gathering: the batcher thread takes the oldest job, then every job already
  waiting, and waits up to `max_wait_ms` for more while the batch's budget
  (`max_batch_tokens` tokens, `max_batch_size` rows) is not yet spent.
- Packing (`plan_batches`): the rows of the gathered jobs are sorted by length
  and cut into forward passes of at most `max_batch_tokens` padded tokens
  (rows x longest row) and `max_batch_size` rows, so short texts never pay for
  a long one's padding. A job larger than the budget spans several passes.
- Answering: each job gets exactly its own rows back, in its order. Rows are
  independent in the model (padding is masked), so a text's vector does not
  depend on what else was in its batch.

The model runs on the batcher thread, off the event loop: the loop keeps
reading requests and tokenising while a batch computes (torch releases the
GIL). A job whose client left before its batch started is dropped; one that
left during its batch is computed and its answer discarded, never blocking the
others. If a batch fails, each of its jobs is retried alone, so one bad request
cannot fail its neighbours. `close()` lets the thread finish every accepted job
before it exits: the drain of a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field


def plan_batches(lengths: list, max_tokens: int, max_rows: int) -> list:
    """Indices of rows grouped into forward passes: sorted by length, cut at the token and row budgets.

    A pass's cost is rows x its longest row (padding counted). A single row
    longer than the budget still gets a pass of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # stable: equal lengths keep their order
    batches, current = [], []
    for i in order:
        width = lengths[i]  # ascending, so the newest row is the longest
        if current and ((len(current) + 1) * width > max_tokens or len(current) + 1 > max_rows):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class QueueFull(Exception):
    """More requests than --max-queue are waiting or running."""


@dataclass
class Job:
    """One request's inputs and the future its handler awaits."""

    items: list
    cost: int  # tokens (encoder) or inputs (task model): what the batch budget counts
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    left: bool = False  # the client disconnected
    started: float = field(default_factory=time.perf_counter)

    def settle(self, result=None, error: BaseException | None = None) -> None:
        """Hand the answer to the event loop (this runs on the batcher thread)."""

        def deliver():
            if self.future.done():  # cancelled: its client left
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(deliver)


_STOP = object()


class Engine:
    """The bounded queue and the batcher thread around a runner's `run_jobs(jobs) -> answers`."""

    def __init__(self, runner, *, max_queue: int, max_batch_tokens: int, max_batch_size: int,
                 max_wait_ms: float, on_depth=None):
        self.runner = runner
        self.max_queue = max_queue
        self.budget = max_batch_tokens if runner.task == "embed" else max_batch_size
        self.max_rows = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.on_depth = on_depth or (lambda n: None)
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._accepted = 0  # jobs accepted and not yet settled
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="bertkit-batcher", daemon=True)

    def start(self) -> "Engine":
        self._thread.start()
        return self

    @property
    def depth(self) -> int:
        return self._accepted

    def submit(self, items: list, cost: int) -> Job:
        """Queue a request; raises QueueFull when --max-queue requests are already accepted."""
        loop = asyncio.get_running_loop()
        job = Job(items, cost, loop.create_future(), loop)
        with self._lock:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if self._accepted >= self.max_queue:
                raise QueueFull(f"{self._accepted} requests are already queued (--max-queue {self.max_queue})")
            self._accepted += 1
            self.on_depth(self._accepted)
        self._queue.put(job)
        return job

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, answer every accepted one, stop the thread."""
        with self._lock:
            self._closing = True
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # --- the batcher thread ---------------------------------------------------

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs, cost = [first], first.cost
            deadline = time.perf_counter() + self.max_wait
            while cost < self.budget:
                wait = deadline - time.perf_counter()
                try:
                    job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stopping = True  # answer what was gathered, then stop (the queue holds nothing after it)
                    break
                jobs.append(job)
                cost += job.cost
            self._answer(jobs)

    def _answer(self, jobs: list) -> None:
        live = [j for j in jobs if not j.left]
        self._release(len(jobs) - len(live))  # their clients left before the batch: nothing to compute
        if not live:
            return
        try:
            answers = self.runner.run_jobs(live)
        except Exception as err:
            if len(live) > 1:  # find the culprit: each job alone, so one bad request fails only itself
                for job in live:
                    self._answer([job])
                return
            self._release(1)
            live[0].settle(error=err)
            return
        self._release(len(live))  # before the answers go out: a client that reads one sees the queue without it
        for job, answer in zip(live, answers):
            job.settle(answer)

    def _release(self, n: int) -> None:
        if n:
            with self._lock:
                self._accepted -= n
                self.on_depth(self._accepted)
