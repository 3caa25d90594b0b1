"""What top-k and sparse quality share: per-layer recall and cosine sums, one row and report base.

    >>> stats = LayerStats()
    >>> stats.add(0, recall=torch.tensor([1.0, 0.5]), cosine=torch.tensor([1.0, 1.0]))
    >>> stats.add(1, recall=torch.tensor([0.5]), cosine=torch.tensor([0.8]))
    >>> stats.summary()["recall"], stats.summary()["recall_min_layer"]   # layer means 0.75 and 0.5
    (0.625, 0.5)

A quality run measures dense attention and then each setting (a k, a budget) the same way: switch
the model, watch every attention call with a `LayerStats` subclass (its `measure(call)` gives
recall and cosine per query row and head), score the text, and make one row. The rows share the
`EvalRow` fields; a report is rows plus meta, written by `gatherlens.eval.io`.
"""
from __future__ import annotations

import abc
import math
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch

from gatherlens.errors import GatherValueError

__all__ = ["LayerStats", "EvalRow", "EvalReport", "positive_settings", "check_ids", "perplexity", "wilson_interval",
           "bootstrap_interval"]


class LayerStats(abc.ABC):
    """Running sums of attention-mass recall and output cosine per layer; an observer of calls.

    Calls without a layer number (models that do not number their layers) share one bucket, -1.
    """

    def __init__(self):
        self.recall: dict[int, float] = {}
        self.cosine: dict[int, float] = {}
        self.count: dict[int, int] = {}

    @abc.abstractmethod
    def measure(self, call) -> tuple[torch.Tensor, torch.Tensor]:
        """Recall and cosine of one attention call, one value per query row and head (same shape)."""

    def __call__(self, call) -> None:
        recall, cosine = self.measure(call)
        self.add(call.layer if call.layer is not None else -1, recall, cosine)

    def add(self, layer: int, recall: torch.Tensor, cosine: torch.Tensor) -> None:
        """Add the values of one call at `layer` (recall and cosine: any equal shapes)."""
        self.recall[layer] = self.recall.get(layer, 0.0) + float(recall.sum())
        self.cosine[layer] = self.cosine.get(layer, 0.0) + float(cosine.sum())
        self.count[layer] = self.count.get(layer, 0) + recall.numel()

    def means(self) -> tuple[list[float], list[float]]:
        """(recall, cosine) means per layer, layers in order."""
        layers = sorted(self.count)
        return [self.recall[i] / self.count[i] for i in layers], [self.cosine[i] / self.count[i] for i in layers]

    def summary(self) -> dict:
        """The EvalRow fields: means over layers, the worst layer, per-layer lists (None / {} if no calls)."""
        rec, cos = self.means()
        if not rec:
            return {"recall": None, "cosine": None, "recall_min_layer": None, "cosine_min_layer": None,
                    "per_layer": {}}
        return {"recall": sum(rec) / len(rec), "cosine": sum(cos) / len(cos), "recall_min_layer": min(rec),
                "cosine_min_layer": min(cos), "per_layer": {"recall": rec, "cosine": cos}}


@dataclass(kw_only=True)
class EvalRow:
    """One setting of a quality run (dense, or one k / budget) against dense."""

    setting: str                       # "dense", "k=32", "budget=1024"
    perplexity: float | None           # None for models without a language-model head
    nll: float | None                  # mean negative log-likelihood per scored token (nats)
    tokens: int                        # tokens scored
    recall: float | None = None        # mean attention-mass recall (None for dense)
    cosine: float | None = None        # mean output cosine to dense (None for dense)
    recall_min_layer: float | None = None
    cosine_min_layer: float | None = None
    per_layer: dict = field(default_factory=dict)  # {"recall": [...], "cosine": [...]}


@dataclass
class EvalReport:
    """Rows (dense first) and what was measured how (meta); `columns` are the CSV columns."""

    rows: list
    meta: dict
    columns: ClassVar[tuple[str, ...]] = ("setting", "perplexity", "nll", "tokens", "recall", "cosine")

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def positive_settings(values, name: str, unit: str = "") -> list[int]:
    """Sorted unique positive ints, or a GatherValueError naming `name`.

        >>> positive_settings((32, 8, 32), "ks")
        [8, 32]
    """
    out = sorted({int(v) for v in values})
    if not out or out[0] < 1:
        raise GatherValueError(f"{name} must be positive ints{unit}, got {out}")
    return out


def check_ids(ids: torch.Tensor, length: str) -> None:
    """Refuse token ids that are not one row (1, length)."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise GatherValueError(f"ids must have shape (1, {length}), got {tuple(ids.shape)}")


def perplexity(nll: float | None) -> float | None:
    """exp(mean negative log-likelihood), None when there is none."""
    return None if nll is None else math.exp(nll)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval of a proportion (95% for z = 1.96): honest at 0 / n and n / n.

        >>> [round(x, 3) for x in wilson_interval(10, 10)], [round(x, 3) for x in wilson_interval(5, 10)]
        ([0.722, 1.0], [0.237, 0.763])
    """
    if n < 1 or not 0 <= successes <= n:
        raise GatherValueError(f"successes = {successes} of n = {n}: need n >= 1 and 0 <= successes <= n")
    p, z2 = successes / n, z * z
    mid = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def bootstrap_interval(values, draws: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (seeded: the same on every run).

        >>> bootstrap_interval([1.0, 1.0, 1.0])
        (1.0, 1.0)
    """
    import random

    values = [float(v) for v in values]
    if not values:
        raise GatherValueError("bootstrap_interval needs at least one value")
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(draws))
    cut = (1 - level) / 2
    return means[int(cut * (draws - 1))], means[int(round((1 - cut) * (draws - 1)))]
