"""Worker processes: one rule for starting a pool, used by the tokenizer and `pretrain prepare`.

Python runs one thread of Python code at a time, so tokenising and building
instances spread over cores in processes. How a process starts matters:

- fork: the child starts as a copy of the parent, tokenizer, word cache and
  all, at almost no cost; nothing needs pickling. Pure-Python work forks.
- forkserver (spawn where there is none): a forked child deadlocks in its first
  torch op once the parent has run torch's intra-op thread pool (as any caller
  that trained or ran a model has), so workers that use torch start from a
  fresh server process instead.

A daemonic process (a DataLoader worker) may not have children: callers that
choose the number of workers themselves ask `can_start_workers` first.
"""

from __future__ import annotations

import multiprocessing as mp


def can_start_workers() -> bool:
    """False inside a daemonic process (a DataLoader worker), which may not start children."""
    return not mp.current_process().daemon


def start_pool(n: int, initializer=None, initargs=(), uses_torch: bool = False):
    """A multiprocessing Pool of n workers, started the way the module docstring says."""
    methods = mp.get_all_start_methods()
    if uses_torch:
        method = "forkserver" if "forkserver" in methods else "spawn"
    else:
        method = "fork" if "fork" in methods else "spawn"
    return mp.get_context(method).Pool(n, initializer=initializer, initargs=initargs)


def run_jobs(fn, jobs: list, workers: int, initializer, initargs, uses_torch: bool = False):
    """Run fn over jobs in order (in a pool when workers > 1), yielding results as they come."""
    if workers <= 1 or len(jobs) <= 1:
        initializer(*initargs)
        for job in jobs:
            yield fn(job)
        return
    with start_pool(min(workers, len(jobs)), initializer, initargs, uses_torch) as pool:
        yield from pool.imap(fn, jobs)
