"""Run a function on N local processes joined by torch.distributed, with a hard deadline.

    >>> results = run_ranks(my_worker, 2, "arg", timeout=60)   # [rank 0's return, rank 1's return]

Each rank is a process forked from a clean server process that has imported torch once (Python's
"forkserver" start method: no rank pays torch's import again, and none inherits the caller's
threads). It joins a gloo (or NCCL) group through a file store in a private temporary folder (no
port to pick), calls `fn(*args)` and sends back its return value. If any rank raises, the others are stopped and a GatherLensError carries the first
failing rank's traceback; if the deadline passes, every rank is killed. So a rank stuck in a
collective cannot hang the caller. `fn` must be importable (a module-level function).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import tempfile
import time
import traceback
from datetime import timedelta

from gatherlens.errors import GatherLensError, GatherValueError

__all__ = ["run_ranks", "DistTimeout", "leave_group"]

PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "gatherlens.dist.launch"]


class DistTimeout(GatherLensError, TimeoutError):
    """The ranks did not all finish before the deadline (they were killed)."""


def _rank_main(rank: int, world: int, store: str, backend: str, threads: int, timeout: float,
               fn, args, results) -> None:
    """One rank: join the group, run fn, send (rank, ok, pickled value or traceback)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    done = False
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        value = fn(*args)
        results.put((rank, True, pickle.dumps(value)))
        done = True
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent, with its traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        leave_group(done)


def leave_group(done: bool, timeout_s: float = 60.0) -> None:
    """Destroy the process group; after a rank's work is `done`, first wait for every rank to be done
    too (a rank that tears its sockets down while another still talks aborts that one: gloo's
    "terminate called without an active exception"). A failed rank leaves at once."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if done:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except Exception:  # noqa: BLE001 - another rank failed: its own error is the one reported
            pass
    dist.destroy_process_group()


def _collect(procs, results, world: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    values: dict[int, object] = {}
    while len(values) < world:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistTimeout(f"ranks {sorted(set(range(world)) - set(values))} of {world} did not "
                              f"finish within timeout = {timeout:g} s; all were stopped")
        try:
            rank, ok, payload = results.get(timeout=min(left, 0.5))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in values]
            if dead:
                raise GatherLensError(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} "
                                      f"before reporting (killed, or out of memory?)")
            continue
        if not ok:
            raise GatherLensError(f"rank {rank} of {world} failed:\n{payload}")
        values[rank] = pickle.loads(payload)
    return [values[r] for r in range(world)]


def run_ranks(fn, world_size: int, *args, timeout: float = 120.0, backend: str = "gloo",
              threads: int = 1) -> list:
    """Call `fn(*args)` on `world_size` processes in one process group; their return values, by rank.

        >>> run_ranks(torch.distributed.get_rank, 3)          # [0, 1, 2]

    Args:
        fn: a module-level function (it is pickled by reference into each spawned process).
        world_size: number of processes (ranks), >= 1.
        timeout: seconds for the whole run (start-up included); past it every rank is killed and
            DistTimeout is raised. Also the process group's own collective timeout.
        backend: "gloo" (CPU) or "nccl" (one CUDA device per rank).
        threads: torch threads per rank.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise GatherValueError(f"world_size = {world_size!r} must be an int >= 1 (processes)")
    if backend not in ("gloo", "nccl"):
        raise GatherValueError(f"backend = {backend!r} must be 'gloo' or 'nccl'")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # used when the server starts (the first call)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gatherlens-dist-") as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(r, world_size, store, backend, threads, timeout, fn, args, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        try:
            values = _collect(procs, results, world_size, timeout)
        except BaseException:
            _stop(procs, grace=0.0)  # the others may wait in a collective for the failed rank
            raise
        _stop(procs, grace=30.0)
        return values


def _stop(procs, grace: float) -> None:
    """Wait up to `grace` seconds for the ranks to exit, then kill what is left."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
