"""What one draw kept: the record the explorer draws (its shape is stable; fields are only ever added).

    >>> token, rec = sample(logits, SamplingConfig(temperature=0.8, top_k=40, seed=1), record=True)
    >>> [(c.stage, len(c.ids)) for c in rec.cuts]      # [('top_k', 40), ('top_p', 12), ('min_p', 9)]
    >>> rec.kept, rec.probs, rec.uniform, rec.token    # the candidates, their distribution, the draw
    >>> rec.to_svg()                                   # the cut as a gather of logits by the kept ids

Sampling is a gather over the vocabulary: each cut keeps some candidate ids, the kept logits are
gathered (`logits[kept]`), renormalized, and one is drawn. Every tensor is on the CPU, float64 or
int64, and the candidate lists are ordered best first (higher logit first; on equal logits the
lower id first), the order both samplers cut and draw in.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.drawable import Drawable

__all__ = ["Cut", "SampleRecord", "STAGES"]

STAGES = ("top_k", "top_p", "min_p")   # the cuts, in the chain's order (llama.cpp's)


@dataclass(frozen=True)
class Cut:
    """The candidates one stage of the chain left.

    stage: "top_k", "top_p" or "min_p".
    ids:   (n,) int64, the candidate ids kept after this stage, best first.
    """

    stage: str
    ids: torch.Tensor


@dataclass(frozen=True)
class SampleRecord(Drawable):
    """One token's choice, as plain data.

    logits:       (V,) float64: the logits after the penalties (what the cuts gather from).
    penalized:    (m,) int64: the ids the penalties changed, ascending (empty: none did).
    cuts:         one Cut per stage that ran, in chain order (a stage that is off, or greedy: none).
    kept:         (n,) int64: the candidates left for the draw, best first.
    probs:        (n,) float64: their renormalized distribution at the temperature (sums to 1);
                  greedy: [1.0] on the one kept id.
    uniform:      the draw's uniform number in [0, 1) (None when greedy): the token is the first
                  kept id whose cumulative probability exceeds it.
    token:        the chosen id.
    temperature:  the temperature it was drawn at (0: greedy).
    """

    logits: torch.Tensor
    penalized: torch.Tensor
    cuts: tuple[Cut, ...]
    kept: torch.Tensor
    probs: torch.Tensor
    uniform: float | None
    token: int
    temperature: float

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[0]

    @property
    def greedy(self) -> bool:
        return self.uniform is None

    def cut(self, stage: str) -> Cut | None:
        """The Cut of `stage` ("top_k", "top_p", "min_p"), None when it did not run."""
        return next((c for c in self.cuts if c.stage == stage), None)

    def __repr__(self) -> str:
        cuts = ", ".join(f"{c.stage}={c.ids.numel()}" for c in self.cuts) or "none"
        draw = "greedy" if self.uniform is None else f"u={self.uniform:.4f}"
        return (f"SampleRecord(V={self.vocab_size}, cuts: {cuts}, kept={self.kept.numel()}, {draw}, "
                f"token={self.token})")
