"""The API's engine: up to N generations decoding together on the served model, a bounded queue behind them.

    >>> engine = Engine(pool, settings)                  # started in the app's lifespan: engine.run()
    >>> job = engine.submit(Ask(ids, 64, sampling))      # Busy (-> 503) when slots and queue are full
    >>> async for kind, data in job.events():            # ("token", (id, text)) ..., ("end", reason)
    ...     ...
    >>> job.cancel()                                     # the client went away: its slot is free at once

One task runs the model (models/runtime/slots.py's SlotRunner, in a worker thread, one call at a time).
It takes the pool's model lock (serve/pool.py) while it has work, so the explorer's own requests and the
API never run the model together; between two steps it gives the lock up when one of them waits (and
switches the model back to dense decoding, as the explorer expects to find it). Each turn it admits
waiting jobs into free slots (at most `settings.slots` run), gives every running slot one turn (a
prefill chunk or one batched decode step) and delivers each token to its job's stream. A job whose
client went away (`cancel`) leaves at the next turn, or the queue at once; its cache is kept for prefix
reuse like a finished one's. A failure of the model (its file changed: ModelFileChanged) ends every
running job with that error; the engine goes on with the next.
"""
from __future__ import annotations

import collections
import math
import traceback

import anyio

from gatherlens.errors import GatherLensError
from gatherlens.serve.settings import ServeSettings

__all__ = ["Engine", "Job", "Busy"]


class Busy(Exception):
    """Every slot runs and the queue is full: the request is answered 503 with Retry-After."""


class Job:
    """One request's generation as the engine sees it: its ask, its slot, the stream of its events."""

    def __init__(self, ask, engine: "Engine"):
        self.ask, self.engine = ask, engine
        self.slot = self.runner = None   # once admitted: its Slot and the SlotRunner it runs on
        self.cancelled = False
        self.finished = False
        self.send, self.receive = anyio.create_memory_object_stream(math.inf)

    def cancel(self) -> None:
        """The client is gone (or has all it wants): free the slot at the next turn, or leave the queue now."""
        if not self.finished:
            self.cancelled = True
            self.engine.wake()

    def events(self):
        """("token", (id, text)) per token, then ("end", reason) or ("error", exception)."""
        return self.receive


class Engine:
    """See the module doc."""

    def __init__(self, pool, settings: ServeSettings, runner_of=None):
        self.pool, self.settings = pool, settings
        self.runner_of = runner_of or _runner_of(settings)
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Job] = []
        self.event = anyio.Event()
        self.served = self.cancelled = self.refused = 0

    @property
    def capacity(self) -> int:
        return self.settings.slots + self.settings.api_queue

    def submit(self, ask) -> Job:
        """A job for `ask`, waiting for a slot; Busy when slots and queue are full."""
        if len(self.running) + len(self.waiting) >= self.capacity:
            self.refused += 1
            raise Busy(f"the server is busy: {self.settings.slots} slots are generating and "
                       f"{self.settings.api_queue} requests wait; try again in {self.settings.retry_after} s")
        job = Job(ask, self)
        self.waiting.append(job)
        self.wake()
        return job

    def wake(self) -> None:
        self.event.set()

    def status(self) -> dict:
        return {"slots": self.settings.slots, "running": len(self.running), "waiting": len(self.waiting),
                "served": self.served, "cancelled": self.cancelled, "refused": self.refused}

    def runner_status(self) -> dict | None:
        """The served model's runner: its prefix store and the steps it ran (None before the first API request)."""
        runner = self.runner_of.current() if hasattr(self.runner_of, "current") else None
        return None if runner is None else {"prefix": runner.prefix.status(), "steps": dict(runner.steps)}

    async def run(self) -> None:
        """The engine's loop (runs for the app's lifetime)."""
        while True:
            self._drop_cancelled()
            if not (self.waiting or self.running):
                await self.event.wait()
                self.event = anyio.Event()
                continue
            try:
                async with self.pool.using(self.settings.model) as lm:
                    await self._burst(lm)
            except GatherLensError as e:   # the model could not be used (its file changed): these jobs fail
                self._fail_all(e)
            except Exception as e:  # noqa: BLE001 - an unexpected failure ends these jobs, never the engine
                traceback.print_exception(type(e), e, e.__traceback__)
                self._fail_all(e)

    async def _burst(self, lm) -> None:
        """Turns of the running slots while there is work and nobody else waits for the model."""
        runner = self.runner_of(lm)
        await anyio.to_thread.run_sync(runner.install)
        from gatherlens.models.runtime.threads import ThreadControl

        threads = ThreadControl.start()   # the cores other programs leave free (models/runtime/threads.py)
        try:
            while self.waiting or self.running:
                self._admit(runner)
                if self.running:
                    turn = await anyio.to_thread.run_sync(_turn, runner, [j.slot for j in self.running], threads)
                    self._deliver(turn)
                self._drop_cancelled()
                if self.pool.lock.statistics().tasks_waiting:
                    break   # the explorer waits: the running slots go on after it
        except GatherLensError as e:
            self._fail_running(runner, e)
        finally:
            threads.finish()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(runner.uninstall)

    def _admit(self, runner) -> None:
        while self.waiting and len(self.running) < self.settings.slots:
            job = self.waiting.popleft()
            if job.cancelled:
                self._end(job, None, "cancelled")
                continue
            try:
                job.slot, job.runner = runner.admit(job.ask), runner
            except GatherLensError as e:
                self._end(job, None, "error", e)
                continue
            self.running.append(job)

    def _deliver(self, turn) -> None:
        by_slot = {id(j.slot): j for j in self.running}
        for slot, token, piece in turn:
            job = by_slot[id(slot)]
            try:
                job.send.send_nowait(("token", (token, piece)))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                job.cancelled = True   # its reader is gone
        for job in [j for j in self.running if j.slot.done and not j.cancelled]:
            self.running.remove(job)
            self._end(job, job.slot, "end", job.slot.reason)
            self.served += 1

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self._end(job, None, "cancelled")
        for job in [j for j in self.running if j.cancelled]:
            self.running.remove(job)
            self._end(job, job.slot, "cancelled")

    def _end(self, job: Job, slot, kind: str, detail=None) -> None:
        """Close a job's stream with its last event; its slot's cache kept for prefix reuse."""
        if slot is not None and job.runner is not None:
            job.runner.release(slot)
        if kind == "cancelled":
            self.cancelled += 1
        job.finished = True
        if kind != "cancelled":
            try:
                job.send.send_nowait((kind, detail))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        job.send.close()

    def _fail_running(self, runner, error: Exception) -> None:
        for job in list(self.running):
            self.running.remove(job)
            self._end(job, None, "error", error)

    def _fail_all(self, error: Exception) -> None:
        for job in list(self.running) + list(self.waiting):
            self._end(job, None, "error", error)
        self.running.clear()
        self.waiting.clear()


def _turn(runner, slots, threads):
    """One turn of the slots on a worker thread, the thread count the controller's (it follows the free cores)."""
    threads.before_step()
    try:
        return runner.advance(slots)
    finally:
        threads.after_step()


def _runner_of(settings: ServeSettings):
    """runner_of(lm): one SlotRunner per loaded model (made on first use, kept with the model)."""
    from gatherlens.models.runtime.prefix import PrefixCache
    from gatherlens.models.runtime.slots import SlotRunner

    made: dict = {}

    def get(lm):
        key = id(lm.model)
        if key not in made or made[key][0] is not lm:
            made.clear()   # the model was loaded again (its file changed): the old caches are stale
            made[key] = (lm, SlotRunner(lm, PrefixCache(settings.prefix_cache_bytes, grid=settings.prefill_chunk)))
        return made[key][1]

    get.current = lambda: next((runner for _, runner in made.values()), None)
    return get
