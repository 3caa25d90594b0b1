"""The record of one sampled token: the cut as a gather of logits by the kept ids.

    >>> token, rec = sample(logits, SamplingConfig(temperature=0.8, top_k=40), record=True)
    >>> gr = record_sampling(rec, labels=tokenizer.convert_ids_to_tokens(range(V)))
    >>> gr.output[0]            # the kept logits, best first: rec.logits[rec.kept]
    >>> rec.to_svg()            # the same, through as_record

Source: the (1, V) row of logits after the penalties; index: (n,) the kept ids, best first (what
the last cut left); output: (1, n) their logits, `logits.index_select(1, kept)`. `meta` carries
the rest of the SampleRecord as plain lists for a page to draw: each cut's ids, the renormalized
probabilities, the uniform and the chosen token.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.i18n import check_lang, text
from gatherlens.ops.sampling.record import SampleRecord
from gatherlens.trace.record import GatherRecord

__all__ = ["record_sampling"]


def _labels(labels, V: int) -> list[str] | None:
    if labels is None:
        return None
    out = [str(t) for t in labels]
    if len(out) != V:
        raise GatherValueError(f"labels has {len(out)} entries; expected one per vocabulary id, {V}")
    return out


def record_sampling(rec: SampleRecord, labels=None, lang: str = "en") -> GatherRecord:
    """The GatherRecord of a SampleRecord (see the module doc). labels: one string per vocabulary id."""
    if not isinstance(rec, SampleRecord):
        raise GatherTypeError(f"record_sampling(rec): rec must be a SampleRecord, got {type(rec).__name__}")
    check_lang(lang)
    V, kept = rec.vocab_size, rec.kept.long()  # (n,)
    source = rec.logits.float().unsqueeze(0)  # (1, V)
    output = source.index_select(1, kept)  # (1, n)
    n = kept.numel()
    coords = torch.stack([torch.zeros_like(kept), kept], dim=-1).unsqueeze(0)  # (1, n, 2)
    stages = ", ".join(f"{c.stage} {c.ids.numel()}" for c in rec.cuts) or ("greedy" if rec.greedy else "no cut")
    caption = text("caption_sampling", lang, n=n, V=V, stages=stages, temperature=f"{rec.temperature:g}",
                   token=rec.token, uniform="-" if rec.uniform is None else f"{rec.uniform:.4f}")
    return GatherRecord(
        op="index_select", source=source, index=kept, output=output, source_coords=coords,
        index_coords=torch.arange(n).view(1, n, 1).clone(), dim=1,
        call="logits.index_select(1, kept)  # the sampler's candidates", source_name="logits",
        index_name="kept", output_name="candidates", source_axes=("1", "V"), index_axes=("n",),
        output_axes=("1", "n"), source_col_labels=_labels(labels, V), caption=caption, lang=lang,
        meta={"kind": "sampling", "token": rec.token, "uniform": rec.uniform, "temperature": rec.temperature,
              "probs": rec.probs.tolist(), "cuts": {c.stage: c.ids.tolist() for c in rec.cuts},
              "penalized": rec.penalized.tolist()},
    )
