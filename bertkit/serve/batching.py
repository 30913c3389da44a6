"""Dynamic batching: a bounded queue of requests, a gatherer thread, token-budget passes, workers.

The idea is text-embeddings-inference's and Infinity's: the model runs fastest
on many rows at once, but requests arrive one by one. Each request becomes a
`Job` (its inputs, already checked and tokenised, each input's cost, and a
future for its answer).

- Admission: at most `max_queue` jobs are accepted and not yet answered
  (waiting or inside a pass). One more is refused at once (`QueueFull`, HTTP
  429 with Retry-After): a full server says so instead of letting clients hang.
- Gathering: once a worker is free, the gatherer thread takes the oldest job,
  then every job already waiting, and waits up to `max_wait_ms` for more,
  until it holds `GATHER_PASSES` passes' budget (`max_batch_tokens` tokens
  each) per free worker, or, while other workers are busy, the free workers'
  fair share of the requests in the server (accepted / workers each). While
  every worker is busy, requests wait in the queue, so a loaded server gathers
  many texts (and can sort them into even passes) while an idle one answers at
  once; so `max_wait_ms` is 0 by default (a window delays every lone request by
  its whole length, and measured, it bought nothing at concurrency 8 or 64:
  docs/benchmarks.md, "Numbers that left the docstrings"). The fair share keeps the workers' passes even. Without
  it, closed-loop clients split into uneven groups that persist: a worker that
  frees up takes everything waiting, namely the clients its own last pass
  answered. With 64 clients the groups settled at sizes like 50 and 14, and the
  50 always waited for the long pass.
- Packing (`plan_batches`): the inputs of the gathered jobs are sorted by
  length and cut into forward passes of at most `max_batch_tokens` padded
  tokens (rows x longest row) and `max_batch_size` rows, the cut points chosen
  so that padding and the number of passes together cost least. A job larger
  than the budget spans several passes. When there are fewer passes than free
  workers, the largest passes are halved (`spread`), so that one big request
  uses every core.
- Running: `workers` threads each run one pass at a time. On a CPU, two passes
  on one thread each keep both cores busy without the synchronisation of
  splitting every matmul across threads, and the event loop's work (HTTP,
  JSON, tokenising) delays one pass rather than stalling a matmul that waits
  for its slowest thread. torch releases the GIL inside its kernels.
- Answering: a job is answered when its last input is done, with exactly its
  own rows, in its order. Rows are independent in the model (padding is
  masked), so a text's vector does not depend on what else was in its pass.

A job whose client left before its pass started is dropped; one that left
during its pass is computed and its answer discarded, never blocking the
others. If a pass fails, each job's part of it is retried alone, so one bad
request cannot fail its neighbours. `close()` lets the threads finish every
accepted job before they exit: the drain of a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field


GATHER_PASSES = 4  # a gather takes up to this many passes' budget per free worker, when that much is waiting
PASS_OVERHEAD_TOKENS = 32  # the fixed cost of one forward pass, in padded tokens' worth (see plan_batches)


def plan_batches(lengths: list, max_tokens: int, max_rows: int, overhead: int = PASS_OVERHEAD_TOKENS) -> list:
    """Indices of rows grouped into forward passes: sorted by length, cut where padding costs more than a pass.

    A pass costs `overhead` + rows x its longest row (padding counted), at most
    `max_tokens` padded tokens and `max_rows` rows; a single row longer than the
    budget still gets a pass of its own. Sorting alone is not enough: 80 texts
    of 5 to 55 tokens cut only at the budget carry ~45% padding, since each
    pass spans a wide range of lengths. So the cut points are chosen by dynamic
    programming over the sorted rows for the least total cost: a new pass where
    the lengths jump, one long pass where they are even. `overhead` is what a
    pass costs beyond its tokens (the kernels' set-up over ~100 operations, small
    matrices being slower per row): 32 tokens' worth by default, measured on the
    2-core benchmark machine (docs/benchmarks.md, "Numbers that left the
    docstrings"); the cut points change little between 16 and 64. Among plans of equal cost the one with
    the longest first pass wins (stable: equal lengths keep their order).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0] * (n + 1)  # best[i]: least cost of the rows order[i:]
    cut = [n] * (n + 1)  # cut[i]: where the first pass of that plan ends
    for i in range(n - 1, -1, -1):
        best[i] = None
        for j in range(i + 1, min(n, i + max_rows) + 1):
            width = lengths[order[j - 1]]  # ascending, so the pass's last row is its longest
            if j - i > 1 and (j - i) * width > max_tokens:
                break
            cost = overhead + (j - i) * width + best[j]
            if best[i] is None or cost <= best[i]:  # <=: the longer first pass on a tie
                best[i], cut[i] = cost, j
    batches, i = [], 0
    while i < n:
        batches.append(order[i:cut[i]])
        i = cut[i]
    return batches


def spread(batches: list, parts: int) -> list:
    """Halve the largest passes (by rows) until there are `parts` of them or none has two rows.

    Halves of a pass sorted by length stay sorted, so neither carries more padding than before.
    """
    batches = list(batches)
    while len(batches) < parts:
        big = max(range(len(batches)), key=lambda b: len(batches[b]), default=None)
        if big is None or len(batches[big]) < 2:
            break
        rows = batches.pop(big)
        half = (len(rows) + 1) // 2
        batches[big:big] = [rows[:half], rows[half:]]
    return batches


class QueueFull(Exception):
    """More requests than --max-queue are waiting or running."""


@dataclass
class Job:
    """One request's inputs, their costs, the future its handler awaits, and its answers as they come."""

    items: list
    costs: list  # per input: tokens (encoder) or 1 (task model), what the pass budget counts
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    left: bool = False  # the client disconnected
    started: float = field(default_factory=time.perf_counter)
    answers: list = field(default_factory=list)
    pending: int = 0  # inputs not yet computed (or skipped)
    error: BaseException | None = None

    def __post_init__(self):
        self.answers = [None] * len(self.items)
        self.pending = len(self.items)

    def settle(self) -> None:
        """Hand the answer (or the error) to the event loop (this runs on a worker thread)."""
        result, error = self.answers, self.error

        def deliver():
            if self.future.done():  # cancelled: its client left
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(deliver)


@dataclass
class Part:
    """The inputs of one job that fall into one pass: what a runner's `run_jobs` takes (as `.items`)."""

    job: Job
    indices: list  # positions in job.items

    @property
    def items(self) -> list:
        return [self.job.items[k] for k in self.indices]


_STOP = object()


class Engine:
    """The bounded queue, the gatherer and `workers` threads around a runner's `run_jobs(parts) -> answers`.

    `run_jobs` gets a list of objects with `.items` (parts of requests) and returns, for each,
    one answer per item; the engine puts each request's answers back together.
    """

    def __init__(self, runner, *, max_queue: int, max_batch_tokens: int, max_batch_size: int,
                 max_wait_ms: float, workers: int = 1, on_depth=None):
        self.runner = runner
        self.max_queue = max_queue
        self.budget = max_batch_tokens if runner.budget_in_tokens else max_batch_size
        self.max_rows = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.workers = workers
        self.on_depth = on_depth or (lambda n: None)
        self._queue = queue.Queue()  # jobs, from the event loop to the gatherer
        self._passes = queue.Queue()  # lists of Parts, from the gatherer to the workers
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._accepted = 0  # jobs accepted and not yet settled
        self._outstanding = 0  # passes handed to the workers and not yet done
        self._closing = False
        self._threads = [threading.Thread(target=self._gather, name="bertkit-gatherer", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"bertkit-worker-{i}", daemon=True)
                          for i in range(workers)]

    def start(self) -> "Engine":
        for thread in self._threads:
            thread.start()
        return self

    @property
    def depth(self) -> int:
        return self._accepted

    def submit(self, items: list, costs: list) -> Job:
        """Queue a request (one cost per item); raises QueueFull when --max-queue requests are already accepted."""
        loop = asyncio.get_running_loop()
        job = Job(items, costs, loop.create_future(), loop)
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
        """Refuse new jobs, answer every accepted one, stop the threads."""
        with self._lock:
            self._closing = True
        self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)

    # --- the gatherer thread ----------------------------------------------------

    def _gather(self) -> None:
        stopping = False
        while not stopping:
            with self._free:
                while self._outstanding >= self.workers:  # every worker busy: let requests pile up
                    self._free.wait()
            first = self._queue.get()
            if first is _STOP:
                break
            with self._lock:  # counted now: more workers may have freed up while the queue was empty
                free = self.workers - self._outstanding
            jobs, cost = [first], sum(first.costs)
            deadline = time.perf_counter() + self.max_wait
            while cost < self.budget * free * GATHER_PASSES and len(jobs) < self._share(free):
                wait = deadline - time.perf_counter()
                try:
                    job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is _STOP:
                    stopping = True  # answer what was gathered, then stop (the queue holds nothing after it)
                    break
                jobs.append(job)
                cost += sum(job.costs)
            self._dispatch(jobs, free)
        for _ in range(self.workers):
            self._passes.put(_STOP)

    def _share(self, free: int) -> float:
        """How many requests `free` workers may gather while the others are busy: their share of
        every request accepted so far (arrivals during the wait count); no limit when all are free."""
        if free >= self.workers:
            return float("inf")
        return -(-self._accepted * free // self.workers)  # ceil

    def _dispatch(self, jobs: list, free: int) -> None:
        live = [j for j in jobs if not j.left]
        self._release(len(jobs) - len(live))  # their clients left before any pass: nothing to compute
        rows = [(job, k) for job in live for k in range(len(job.items))]
        batches = spread(plan_batches([job.costs[k] for job, k in rows], self.budget, self.max_rows), free)
        with self._lock:
            self._outstanding += len(batches)
        for batch in batches:
            parts = {}  # job id -> Part, in the order the jobs came
            for i in sorted(batch):
                job, k = rows[i]
                parts.setdefault(id(job), Part(job, [])).indices.append(k)
            self._passes.put(list(parts.values()))

    # --- the worker threads -----------------------------------------------------

    def _work(self) -> None:
        while (parts := self._passes.get()) is not _STOP:
            self._run([p for p in parts if not p.job.left], skipped=[p for p in parts if p.job.left])
            with self._free:
                self._outstanding -= 1
                self._free.notify()

    def _run(self, parts: list, skipped: list = ()) -> None:
        for part in skipped:
            self._done(part)
        if not parts:
            return
        try:
            answers = self.runner.run_jobs(parts)
        except Exception as err:
            if len(parts) > 1:  # find the culprit: each part alone, so one bad request fails only itself
                for part in parts:
                    self._run([part])
                return
            parts[0].job.error = err
            self._done(parts[0])
            return
        for part, answer in zip(parts, answers):
            for k, value in zip(part.indices, answer):
                part.job.answers[k] = value
            self._done(part)

    def _done(self, part: Part) -> None:
        """Count a part's inputs as done; the job's last part settles it."""
        with self._lock:
            part.job.pending -= len(part.indices)
            finished = part.job.pending == 0
            if finished:
                self._accepted -= 1  # before the answer goes out: a client that reads it sees the queue without it
                self.on_depth(self._accepted)
        if finished and not part.job.left:
            part.job.settle()

    def _release(self, n: int) -> None:
        if n:
            with self._lock:
                self._accepted -= n
                self.on_depth(self._accepted)
