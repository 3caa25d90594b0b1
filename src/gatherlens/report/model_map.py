"""Which gathers a story's model runs, and where the page draws each: the model map's record.

    >>> m = model_map(story, live=False)      # a trace.model_map.ModelMap
    >>> [(g.key, g.target, g.ours) for g in m.gathers][:3]
    [('embedding', 'embedding', False), ('rope', 'rope', False), ('topk', 'scores', True)]

The model's own gathers: the token rows (W[ids]) and Gemma's scaling of them, a position table (BERT),
RoPE's cos/sin rows by position, a mixture of experts' routing, the next token from the last row of
the logits (and the sampler's cut). gatherlens' change, not how any model was trained: top-k attention
(each query keeps k keys), sparse pages (a decode step reads a budget of pages), sparse prefill (the
prompt's key blocks). `target` is the id of the page element that draws it ("" when this page has
none: sparse prefill off, sparse pages offline are the compare strip).
"""
from __future__ import annotations

from gatherlens.trace.model_map import MapGather, ModelMap

__all__ = ["model_map"]


def _own(story, live: bool) -> list[MapGather]:
    kinds = {e.kind for e in story.embeddings}
    out = [MapGather("embedding", "embed", "embedding", False)]
    if getattr(story, "embed_scale", None) is not None:
        out.append(MapGather("scale", "embed", "embedding-scale", False))
    if "position" in kinds:
        out.append(MapGather("position", "embed", "lookups", False))
    if getattr(story, "rope_record", None) is not None:
        out.append(MapGather("rope", "attention", "rope", False))
    if getattr(story, "moe", None) is not None:
        out.append(MapGather("moe", "mlp", "moe", False))
    if story.prediction is not None:
        out.append(MapGather("next", "head", "prediction", False))
    return out


def model_map(story, live: bool = False) -> ModelMap:
    """The ModelMap of a Story (gatherlens.report.collect); live: the served page (it has Generate)."""
    ours = [MapGather("topk", "attention", "scores", True),
            MapGather("pages", "attention", "generate" if live else "fig-06-compare", True),
            MapGather("prefill", "attention", "prefill" if story.prefill is not None else "", True)]
    own = _own(story, live)
    order = {"embed": 0, "attention": 1, "mlp": 2, "head": 3}
    gathers = sorted(own + ours, key=lambda g: order[g.stage])          # stable: own first on a stage
    kinds = tuple((k.kind, k.window) for k in story.tensors.kinds) if story.tensors else ()
    return ModelMap(model=story.model_name, layers=story.layers, kinds=kinds,
                    mlp="moe" if getattr(story, "moe", None) is not None else "dense",
                    causal=story.is_causal, gathers=tuple(gathers))
