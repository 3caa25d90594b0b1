"""The models a server keeps warm, and the one lock every use of a model takes.

    >>> pool = ModelPool(ServeSettings(model="smollm2"))
    >>> async with pool.using("minilm") as lm:     # loads it on first use, then keeps it
    ...     story = await pool.run(collect, lm, "A cat sat.")

One request uses the models at a time: a model's attention is switched per run (top-k,
dense, sparse decoding), so two runs on one model must not interleave, and on a CPU two at
once would only share the same cores. Work runs in a worker thread (the event loop stays free
to accept and answer other requests); the lock is released when the work ends, fails, or its
client goes away (a generation's stream is closed between two steps). After each request the
memory it freed goes back to the system (gatherlens/memory.py).

A model run from its file in place (`--quantized`: models/files/watch.py) has its file checked
when a request takes it (one os.stat) and when the request ends: a file changed between two
requests is loaded again before the request runs (its kept runs forgotten: `on_drop`), and one
that cannot be loaded (cut short, damaged) is refused with `ModelFileChanged`, which the app
answers 503, until it loads again; a file changed during a request refuses that request's answer.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import anyio

from gatherlens.errors import GatherLensError
from gatherlens.memory import release_memory
from gatherlens.serve.settings import ServeSettings

__all__ = ["ModelPool", "file_change"]


def file_change(lm) -> tuple[object, str] | None:
    """(the model file's path, how it changed) when `lm` runs from a file in place that changed
    since it was loaded; None otherwise (unchanged, or a model held in memory)."""
    from gatherlens.models.files.watch import watch_of

    watch = watch_of(lm.model)
    how = None if watch is None else watch.changed()
    return None if how is None else (watch.path, how)


class ModelPool:
    """Loaded models by name (at most `keep`), a lock, and a count of what ran."""

    def __init__(self, settings: ServeSettings, loader: Callable | None = None, keep: int = 3,
                 on_drop: Callable[[str], None] | None = None):
        self.settings = settings
        self.keep = keep
        self.loader = loader
        self.on_drop = on_drop   # on_drop(name): a model was dropped because its file changed
        self.models: dict = {}
        self.broken: dict[str, tuple] = {}   # name -> (path, how): its file changed and did not load again
        self.lock = anyio.Lock()
        self.served = 0          # requests that finished with an answer
        self.failed = 0          # requests whose run raised
        self.cancelled = 0       # generations ended by their client going away
        self.reloaded = 0        # models loaded again because their file changed

    def _load(self, name: str):
        if self.loader is None:
            from gatherlens.models import load

            self.loader = load
        return self.loader(name)

    async def get(self, name: str):
        """The loaded model `name` (call with the lock held); loaded again when its file changed."""
        lm = self.models.get(name)
        change = self.broken.get(name) if lm is None else file_change(lm)
        if lm is not None and change is None:
            return lm
        if lm is not None:
            self.models.pop(name)
            if self.on_drop is not None:
                self.on_drop(name)
        try:
            lm = await anyio.to_thread.run_sync(self._load, name)
        except GatherLensError as e:
            if change is None:
                raise
            self.broken[name] = change
            raise _refused(change, f"loading it again failed: {e}") from None
        if change is not None:
            self.broken.pop(name, None)
            self.reloaded += 1
        while len(self.models) >= self.keep:
            self.models.pop(next(iter(self.models)))
        self.models[name] = lm
        return lm

    @contextlib.asynccontextmanager
    async def using(self, name: str):
        """Hold the lock and give the model (loaded on first use); a model file that changed while
        it was used refuses the answer (ModelFileChanged) and is loaded again by the next request."""
        async with self.lock:
            lm = await self.get(name)
            yield lm
            change = file_change(lm)
            if change is not None:
                raise _refused(change, "this request's answer is dropped; the next request loads it again")

    async def run(self, fn: Callable, *args, **kw):
        """Run `fn(*args, **kw)` in a worker thread, then give the memory it freed back (memory.py);
        count the outcome."""
        try:
            result = await anyio.to_thread.run_sync(lambda: _released(fn, *args, **kw))
        except Exception:
            self.failed += 1
            raise
        self.served += 1
        return result

    def status(self) -> dict:
        return {"models": list(self.models), "busy": self.lock.locked(), "served": self.served,
                "failed": self.failed, "cancelled": self.cancelled, "reloaded": self.reloaded,
                "unavailable": sorted(self.broken)}


def _released(fn: Callable, *args, **kw):
    """fn(*args, **kw), and the heap's free pages back to the system after it (gatherlens/memory.py)."""
    try:
        return fn(*args, **kw)
    finally:
        release_memory()


def _refused(change: tuple, then: str):
    """The ModelFileChanged a request is refused with (the app answers it 503)."""
    from gatherlens.models.files.watch import ModelFileChanged

    path, how = change
    return ModelFileChanged(path, f"{how}; {then}")
