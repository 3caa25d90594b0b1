"""The one worker pool of the selection (and of the CPU path's prefill chunks).

    >>> map_row_ranges(1000, lambda r0, r1: r1 - r0)             # one range per torch thread (2 here)
    [500, 500]
    >>> in_workers(2, work)                                      # work() on 2 threads, torch 1-threaded in each

numpy's introselect, the C++ operators (the dispatcher) and torch release the GIL, so row blocks
run in parallel on these threads. A task on the pool never waits on the pool: in_workers runs
torch with one thread in each worker, where map_row_ranges then runs inline.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["PARALLEL_MIN", "map_row_ranges", "in_workers", "worker_pool"]

PARALLEL_MIN = 1 << 21    # elements per call below which map_row_ranges runs on the calling thread

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0


def map_row_ranges(rows: int, fn, elements: int | None = None) -> list:
    """[fn(r0, r1) for each range of rows], one range per torch thread, on worker threads;
    here alone when the rows hold fewer than PARALLEL_MIN elements (a thread hand-off costs more)."""
    n = max(1, min(torch.get_num_threads(), rows))
    if elements is not None and elements < PARALLEL_MIN:
        n = 1
    if n == 1:
        return [fn(0, rows)]
    bounds = np.linspace(0, rows, n + 1).astype(int).tolist()
    return list(worker_pool(n).map(fn, bounds[:-1], bounds[1:]))


def in_workers(n: int, work) -> None:
    """work() on n threads at once, each running torch single-threaded (n <= 1: here, as is).

    Whole chunks per thread, not every op split across threads: one join per call instead of a
    dozen thread barriers per chunk, which under a loaded machine cost more than the work.
    """
    if n <= 1:
        work()
        return
    threads, inference = torch.get_num_threads(), torch.is_inference_mode_enabled()

    def single():
        torch.set_num_threads(1)                                # this thread's ops: one thread each
        with torch.inference_mode(inference), torch.no_grad():  # modes are per thread: the caller's
            work()

    try:
        for f in [worker_pool(n).submit(single) for _ in range(n)]:
            f.result()
    finally:
        torch.set_num_threads(threads)                          # MKL's count is process-wide


def worker_pool(n: int) -> ThreadPoolExecutor:
    """A lasting pool of at least n threads."""
    global _POOL, _POOL_SIZE
    if _POOL is None or _POOL_SIZE < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gatherlens-select")
        _POOL_SIZE = n
    return _POOL
