"""A selection record: what one gather-like call picked, as plain data.

    >>> rec = record_gather(torch.arange(12.).view(3, 4), 0, torch.tensor([[2, 0, 1, 2]]))
    >>> rec.source_coords[0, 1]          # output element (0, 1) came from source element (0, 1)
    tensor([0, 1])
    >>> rec.to_svg()                     # drawn by gatherlens.render (imported on call)

A record is plain data; its pictures (`to_svg`, `to_html`, `to_png`, `to_terminal`,
`print_terminal`, the Jupyter hooks) come from the `Drawable` mixin, the one door into render.
Renderers read only these records. The promise a record keeps (and the tests check over
hypothesis cases): for every output element whose coordinate is valid,
``source[tuple(source_coords.unbind(-1))] == output``, so a picture cannot lie about the op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.drawable import Drawable


@dataclass
class GatherRecord(Drawable):
    """For a gather-like call: source, index, output and where each output element came from.

    op:            "gather" | "index_select" | "indexing" | "take_along_dim" | "embedding" |
                   "topk_attention" (what made the record).
    source:        the tensor gathered from (kept by reference; renderers elide large ones).
    index:         the index tensor as the user passed it, or None when there is no single one
                   (advanced indexing with several index tensors).
    output:        what the op returned.
    source_coords: (*output.shape, source.ndim) int64: the source coordinate of every output
                   element; -1 in every slot where an output element has no source (the -1
                   padding of top-k attention).
    index_coords:  (*output.shape, index_view.ndim) int64 or None: the index cell that chose each
                   output element (for hover highlighting and drawing).
    dim:           the gathered dimension of `source` (None when several dims are indexed);
                   cells are coloured by their coordinate along it, so colour == index value.
    call:          the call as code, e.g. "W.gather(0, ids)".
    *_axes:        axis names for shape captions, e.g. ("V", "d") -> "(V, d) = (10, 4)".
    *_row_labels:  text for each row of a tensor viewed as (-1, last dim), e.g. token strings.
    index_as_column: draw the index with a trailing axis of 1, so each id sits beside its
                   output row (embedding lookups).
    caption:       an optional sentence under the title (used as given, in any language).
    lang:          default language of the built-in captions ("en" or "zh").
    meta:          anything else worth showing (attention weights, diagnostic findings).
    """

    op: str
    source: torch.Tensor
    index: torch.Tensor | None
    output: torch.Tensor
    source_coords: torch.Tensor
    index_coords: torch.Tensor | None = None
    dim: int | None = None
    call: str = ""
    source_name: str = "input"
    index_name: str = "index"
    output_name: str = "out"
    source_axes: tuple[str, ...] | None = None
    index_axes: tuple[str, ...] | None = None
    output_axes: tuple[str, ...] | None = None
    source_row_labels: list[str] | None = None
    source_col_labels: list[str] | None = None
    output_row_labels: list[str] | None = None
    index_as_column: bool = False
    caption: str = ""
    lang: str = "en"
    meta: dict = field(default_factory=dict)

    # -- derived views ------------------------------------------------------------------------
    @property
    def valid(self) -> torch.Tensor:
        """(*output.shape) bool: output elements that came from a source element."""
        if self.source.ndim == 0:
            return torch.ones(self.output.shape, dtype=torch.bool)
        return (self.source_coords >= 0).all(dim=-1)

    def gathered(self) -> torch.Tensor:
        """Source values at `source_coords` (output shape); equals `output` where `valid`."""
        if self.source.ndim == 0:
            return self.source.expand(self.output.shape)
        coords = self.source_coords.clamp(min=0)
        return self.source[tuple(coords.unbind(-1))]

    @property
    def index_view(self) -> torch.Tensor | None:
        """The index as drawn: with a trailing axis of 1 when `index_as_column`."""
        if self.index is None:
            return None
        return self.index.unsqueeze(-1) if self.index_as_column else self.index

    def picked_source(self) -> set[tuple[int, ...]]:
        """Coordinates of every source element that some output element came from."""
        coords = self.source_coords[self.valid]  # (N, source.ndim)
        return {tuple(c) for c in coords.tolist()}

    def __repr__(self) -> str:
        return (
            f"GatherRecord(op={self.op!r}, call={self.call!r}, source={tuple(self.source.shape)}, "
            f"index={None if self.index is None else tuple(self.index.shape)}, "
            f"output={tuple(self.output.shape)}, dim={self.dim})"
        )
