"""What an op returned, as a record: one function, dispatching on the type.

    >>> out, sel = topk_attention(q, k, v, top_k=4, is_causal=True, return_selection=True)
    >>> rec = as_record(sel, head=1)          # record_attention_selection(sel, head=1)
    >>> as_record(rec) is rec                 # a record is its own record
    True

`ops/` returns plain data (AttentionSelection, PageSelection) and never imports `trace/`;
turning that data into a GatherRecord happens here. A new kind of selection registers its
builder with `@as_record.register`.
"""
from __future__ import annotations

from functools import singledispatch

from gatherlens.errors import GatherTypeError
from gatherlens.ops.attention.selection import AttentionSelection
from gatherlens.ops.sampling.record import SampleRecord
from gatherlens.ops.sparse.selection import PageSelection
from gatherlens.trace.builders import record_attention_selection
from gatherlens.trace.pages import record_page_selection
from gatherlens.trace.sampling import record_sampling
from gatherlens.trace.record import GatherRecord

__all__ = ["as_record"]


@singledispatch
def as_record(obj, **kw) -> GatherRecord:
    """The GatherRecord of `obj`: a record itself, or the record of a selection.

    Keyword arguments go to the builder (`batch`, `head`, `query`, `labels`, `lang`).
    """
    raise GatherTypeError(
        f"as_record(obj): obj must be a GatherRecord, AttentionSelection, PageSelection or SampleRecord, "
        f"got {type(obj).__name__}")


@as_record.register
def _(obj: GatherRecord, **kw) -> GatherRecord:
    if kw:
        raise GatherTypeError(
            f"as_record(record, {', '.join(sorted(kw))}=...): a GatherRecord is already built; "
            f"those options choose what to record from a selection")
    return obj


@as_record.register
def _(obj: AttentionSelection, **kw) -> GatherRecord:
    return record_attention_selection(obj, **kw)


@as_record.register
def _(obj: PageSelection, **kw) -> GatherRecord:
    return record_page_selection(obj, **kw)


@as_record.register
def _(obj: SampleRecord, **kw) -> GatherRecord:
    return record_sampling(obj, **kw)
