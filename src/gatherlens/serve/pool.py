"""The models a server keeps warm, and the one lock every use of a model takes.

    >>> pool = ModelPool(ServeSettings(model="smollm2"))
    >>> async with pool.using("minilm") as lm:     # loads it on first use, then keeps it
    ...     story = await pool.run(collect, lm, "A cat sat.")

One request uses the models at a time: a model's attention is switched per run (top-k,
dense, sparse decoding), so two runs on one model must not interleave, and on a CPU two at
once would only share the same cores. Work runs in a worker thread (the event loop stays free
to accept and answer other requests); the lock is released when the work ends, fails, or its
client goes away (a generation's stream is closed between two steps).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import anyio

from gatherlens.serve.settings import ServeSettings

__all__ = ["ModelPool"]


class ModelPool:
    """Loaded models by name (at most `keep`), a lock, and a count of what ran."""

    def __init__(self, settings: ServeSettings, loader: Callable | None = None, keep: int = 3):
        self.settings = settings
        self.keep = keep
        self.loader = loader
        self.models: dict = {}
        self.lock = anyio.Lock()
        self.served = 0          # requests that finished with an answer
        self.failed = 0          # requests whose run raised
        self.cancelled = 0       # generations ended by their client going away

    def _load(self, name: str):
        if self.loader is None:
            from gatherlens.models import load

            self.loader = load
        return self.loader(name)

    async def get(self, name: str):
        """The loaded model `name` (call with the lock held)."""
        lm = self.models.get(name)
        if lm is None:
            lm = await anyio.to_thread.run_sync(self._load, name)
            while len(self.models) >= self.keep:
                self.models.pop(next(iter(self.models)))
            self.models[name] = lm
        return lm

    @contextlib.asynccontextmanager
    async def using(self, name: str):
        """Hold the lock and give the model (loaded on first use)."""
        async with self.lock:
            yield await self.get(name)

    async def run(self, fn: Callable, *args, **kw):
        """Run `fn(*args, **kw)` in a worker thread; count the outcome."""
        try:
            result = await anyio.to_thread.run_sync(lambda: fn(*args, **kw))
        except Exception:
            self.failed += 1
            raise
        self.served += 1
        return result

    def status(self) -> dict:
        return {"models": list(self.models), "busy": self.lock.locked(), "served": self.served,
                "failed": self.failed, "cancelled": self.cancelled}
