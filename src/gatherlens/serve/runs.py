"""The runs a server keeps: what each text's forward produced, so a change of layer, head or query
answers without running the model again.

    >>> runs = RunCache(max_bytes=600 << 20)
    >>> runs.put(("smollm2", "The cat sat", True, 4), story.tensors, story.shown_tokens)
    >>> runs.get(("smollm2", "The cat sat", True, 4)).tokens[:2]
    ['The', '␣cat']

Least recently used first out: the cache keeps the newest runs whose RunTensors fit in
`max_bytes` together (always the newest one, whatever its size). At 2,048 tokens of SmolLM2 a
run holds 233 MiB (float32 q, k and v of 30 layers, the int16 picks), so the default 600 MiB
keeps two such texts, or many short ones. Used with the model's lock held (serve/pool.py).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["RunCache", "KeptRun", "run_key"]


@dataclass(frozen=True)
class KeptRun:
    tensors: object          # gatherlens.report.run_tensors.RunTensors
    tokens: list[str]        # the shown tokens of the text


def run_key(p) -> tuple:
    """What makes two requests the same run: model, text, top-k on/off and k (ExplainParams)."""
    return (p.model, p.text, p.topk, p.k if p.topk else None)


class RunCache:
    """Kept runs by key, newest last, within max_bytes (see the module doc)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.runs: OrderedDict[tuple, KeptRun] = OrderedDict()

    @property
    def nbytes(self) -> int:
        return sum(r.tensors.nbytes for r in self.runs.values())

    def get(self, key: tuple) -> KeptRun | None:
        run = self.runs.get(key)
        if run is not None:
            self.runs.move_to_end(key)
        return run

    def put(self, key: tuple, tensors, tokens: list[str]) -> KeptRun:
        self.runs[key] = run = KeptRun(tensors, list(tokens))
        self.runs.move_to_end(key)
        while len(self.runs) > 1 and self.nbytes > self.max_bytes:
            self.runs.popitem(last=False)
        return run

    def forget(self, model: str) -> None:
        """Drop every kept run of `model` (its file changed: the runs are of the old weights)."""
        for key in [k for k in self.runs if k[0] == model]:
            del self.runs[key]

    def status(self) -> dict:
        return {"runs": len(self.runs), "bytes": self.nbytes, "max_bytes": self.max_bytes}
