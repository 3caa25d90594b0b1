"""The model map's plain record: where each gather of a model sits, and whose it is.

    >>> m = ModelMap(model="smollm2", layers=30, kinds=(("full", None),) * 30, mlp="dense", causal=True,
    ...              gathers=(MapGather("embedding", "embed", "embedding", ours=False), ...))
    >>> model_map_svg(m, lang="zh")          # gatherlens.render.model_map

gatherlens.report.model_map builds it from a story (which gathers this model runs, and which page
section draws each); gatherlens.render.model_map draws it: embed -> [attention -> MLP] x N -> norm ->
head -> next token, each gather a clickable tag on its stage, the model's own ones apart from
gatherlens' change (top-k attention, sparse pages, sparse prefill). Plain data only.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MapGather", "ModelMap", "MAP_STAGES"]

MAP_STAGES = ("embed", "attention", "mlp", "head")   # where a gather can sit


@dataclass(frozen=True)
class MapGather:
    """One gather on the map: its key (the label's i18n key is map_<key>), its stage, the page element
    it opens (an id; "" when this page has none), and whether it is gatherlens' change."""

    key: str
    stage: str            # one of MAP_STAGES
    target: str           # the id of the section or figure that draws it ("": not on this page)
    ours: bool            # gatherlens' change, not how the model was trained


@dataclass(frozen=True)
class ModelMap:
    """A model as a row of stages, with its gathers placed on them."""

    model: str
    layers: int
    kinds: tuple[tuple[str, int | None], ...]   # per layer (kind, window)
    mlp: str                                    # "dense" or "moe" (experts routed per token)
    causal: bool                                # a decoder: the head's next token feeds back
    gathers: tuple[MapGather, ...]

    def at(self, stage: str) -> tuple[MapGather, ...]:
        """The gathers placed on `stage`, in the order they run."""
        return tuple(g for g in self.gathers if g.stage == stage)
