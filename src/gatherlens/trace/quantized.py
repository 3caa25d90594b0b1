"""The record of a gather from GGUF blocks: the rows of blocks the ids read, and one block written out.

    >>> table = QuantizedTable.from_gguf(path, "token_embd.weight")       # SmolLM2's tied Q8_0 table
    >>> rec = record_quantized_embedding(torch.tensor([[504, 2365]]), table, labels=["The", " cat"])
    >>> rec.terms.formula, rec.bytes_read                                 # 2 rows of 612 B read
    ('q·d', 1224)
    >>> rec.to_svg()                                                      # drawn by render/quantized.py

The promise a record keeps (tested): `output` is `embedding_lookup(ids, table)`, and the written-out
block's `terms.values()` are, bit for bit, the weights `terms.start ..` of the output row of the id
at flat position `position`; so the picture shows what the gather returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.drawable import Drawable
from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError
from gatherlens.i18n import check_lang, text
from gatherlens.ops.embedding import embedding_lookup
from gatherlens.ops.quant import FORMATS, SIZES, BlockTerms, QuantizedTable, block_terms
from gatherlens.trace.convert import as_record

__all__ = ["QuantizedGatherRecord", "record_quantized_embedding"]


@dataclass
class QuantizedGatherRecord(Drawable):
    """What one gather from a QuantizedTable read and returned, as plain data.

    ids:       the ids as passed (any shape); labels: a token string per id (flat order) or None.
    caption:   `describe(lang)` in the record's language (a picture in another language redraws it).
    output:    (*ids.shape, d) float32, what `embedding_lookup(ids, table)` returned.
    rows:      the distinct rows read, in first-seen order (each read once).
    position:  flat position in `ids` of the id whose block `terms` writes out.
    table_name, qtype, vocab, dim, row_bytes: the table; block_elems, block_bytes: its blocks.
    """

    ids: torch.Tensor
    output: torch.Tensor
    rows: list[int]
    position: int
    terms: BlockTerms
    table_name: str
    qtype: str
    vocab: int
    dim: int
    row_bytes: int
    labels: list[str] | None = None
    caption: str = ""
    lang: str = "en"
    meta: dict = field(default_factory=dict)

    @property
    def block_elems(self) -> int:
        return SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return SIZES[self.qtype][1]

    @property
    def row(self) -> int:
        """The table row of the id whose block is written out."""
        return int(self.ids.reshape(-1)[self.position])

    @property
    def bytes_read(self) -> int:
        """Bytes of blocks the gather read: each distinct row once."""
        return len(self.rows) * self.row_bytes

    def describe(self, lang: str) -> str:
        """The caption in `lang`: what a row is made of and what the gather read."""
        return text("qg_caption", lang, nb=self.dim // self.block_elems, elems=self.block_elems,
                    block_bytes=self.block_bytes, distinct=len(self.rows), n=self.ids.numel())

    def focus_values(self) -> torch.Tensor:
        """(n,) float32: the output weights the written-out block became."""
        n = FORMATS[self.qtype].group  # weights per scale
        return self.output.reshape(-1, self.dim)[self.position, self.terms.start:self.terms.start + n]  # (n,)

    def __repr__(self) -> str:
        return (f"QuantizedGatherRecord({self.table_name!r}, {self.qtype}, ids={tuple(self.ids.shape)}, "
                f"rows={len(self.rows)}, block {self.terms.block} of row {self.row})")


@as_record.register
def _(obj: QuantizedGatherRecord, **kw) -> QuantizedGatherRecord:
    kw.pop("lang", None)  # the language it is drawn in: the renderer's choice
    if kw:
        raise GatherTypeError(f"as_record(record, {', '.join(sorted(kw))}=...): a QuantizedGatherRecord is "
                              f"already built; record_quantized_embedding takes those choices")
    return obj


def record_quantized_embedding(ids: torch.Tensor, table: QuantizedTable, labels=None, *, position: int = 0,
                               block: int = 0, lang: str = "en") -> QuantizedGatherRecord:
    """Record `embedding_lookup(ids, table)` on a QuantizedTable, writing out block `block` of the
    row that the id at flat position `position` picks. Ids are checked as for a dense table."""
    check_lang(lang)
    if not isinstance(table, QuantizedTable):
        raise GatherTypeError(f"table must be a gatherlens.QuantizedTable, got {type(table).__name__}; "
                              f"record_embedding draws a dense table")
    output = embedding_lookup(ids, table)  # (*ids.shape, d): every id checked first
    flat = ids.reshape(-1).tolist()
    if not flat:
        raise GatherValueError(f"ids of shape {tuple(ids.shape)} is empty: there is no row to draw")
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < len(flat):
        raise GatherIndexError(f"position {position!r} is outside the {len(flat)} ids [0, {len(flat)})")
    if labels is not None and len(labels) != len(flat):
        raise GatherValueError(f"labels has {len(labels)} strings for {len(flat)} ids; give one per id")
    terms = block_terms(table.raw[flat[position]], table.qtype, block)
    rows = list(dict.fromkeys(flat))  # distinct, first-seen order
    vocab, dim = table.shape
    rec = QuantizedGatherRecord(ids=ids, output=output, rows=rows, position=position, terms=terms,
                                table_name=table.name or "table", qtype=table.qtype, vocab=vocab, dim=dim,
                                row_bytes=table.row_bytes, labels=None if labels is None else list(labels),
                                lang=lang)
    rec.caption = rec.describe(lang)
    return rec
