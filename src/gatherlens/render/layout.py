"""Layout: a record -> grids of cells (text, colour, links), shared by every renderer.

    >>> fig = layout(record_gather(torch.arange(12.).view(3, 4), 0, torch.tensor([[2, 0, 1, 2]])))
    >>> [p.role for p in fig.panels]
    ['src', 'idx', 'out']

Tensors are shown as 2-D grids (rows x last dim); 3-D and larger as a stack of 2-D slices.
Large tensors are elided with "..." (None in `rows` / `cols` / `slices`) while the rows and
columns that the visible output picked stay visible. Each output cell is coloured like the
source cell it came from and shows the index that picked it; one palette per figure
(theme.figure_colours), so no two source positions of a figure share a colour.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gatherlens.i18n import text
from gatherlens.render.theme import BLANK, UNPICKED, figure_colours, fmt_value, short
from gatherlens.trace.record import GatherRecord


@dataclass
class Limits:
    """How much of each tensor to show before eliding with '...'."""

    rows: int = 10
    cols: int = 10
    slices: int = 3
    most: int = 24      # a source window grows up to this so that every row / column the output picked stays


@dataclass
class Cell:
    key: str                 # unique within a figure: "src-2-0", "idx-0-1", "out-0-1"
    text: str                # main text (value, or the index for output cells)
    sub: str = ""            # second line (output cells: the value copied)
    fill: str = BLANK
    picked: bool = False
    info: str = ""           # tooltip / hover text
    data_src: str = ""       # output cells: key of their source cell
    data_idx: str = ""       # output cells: key of their index cell
    ckey: int | None = None  # the source position its colour follows (figure_colours assigns the fill)


@dataclass
class Slice:
    label: str                      # "[0, :, :]" for slices of 3-D+ tensors, "" otherwise
    rows: list[int | None]          # visible row numbers; None = elided rows
    cols: list[int | None]          # visible column numbers; None = elided columns
    row_heads: list[str]            # one per visible row (None entries get "")
    col_heads: list[str]            # one per visible column
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)


@dataclass
class Panel:
    role: str                       # "src" | "idx" | "out"
    title: str
    shape: str                      # "(V, d) = (10, 4)"
    slices: list[Slice | None]      # None = elided slices
    more: str = ""                  # "... 5 more" when slices were elided
    two_line: bool = False          # cells carry a second text line


@dataclass
class FigureModel:
    title: str                      # the call, as code
    caption: str
    legend: str
    panels: list[Panel]
    lang: str = "en"


# -- small helpers -------------------------------------------------------------------------
def _label(labels, i: int) -> str:
    if labels is None:
        return ""
    if isinstance(labels, dict):
        return str(labels.get(i, ""))
    return str(labels[i]) if 0 <= i < len(labels) else ""


def visible(n: int, keep, budget: int, most: int = 0) -> list[int | None]:
    """Which of n positions to show within `budget`: kept ones first, then the edges; None = gap. With
    `most`, the budget grows (up to `most`) until every kept position fits.

        >>> visible(20, {7}, 5)
        [0, 1, 2, None, 7, None, 19]
        >>> visible(40, {3, 9, 17, 22, 30, 35}, 4, most=24)[:6]
        [0, 1, 2, 3, None, 9]
    """
    budget = min(max(budget, len(keep) + 1), max(most, budget))
    if n <= budget:
        return list(range(n))
    chosen: set[int] = set()
    room = budget if len(keep) >= budget else max(budget - 1, 1)  # the last position too, where the kept allow
    for i in sorted(keep):
        if len(chosen) >= room:
            break
        chosen.add(i)
    if len(chosen) < budget:
        chosen.add(n - 1)
    i = 0
    while len(chosen) < budget:
        chosen.add(i)
        i += 1
    seq: list[int | None] = []
    prev = -1
    for i in sorted(chosen):
        if i != prev + 1:
            seq.append(None)
        seq.append(i)
        prev = i
    if prev != n - 1:
        seq.append(None)
    return seq


def _split(coord: tuple[int, ...], ndim: int) -> tuple[tuple[int, ...], int, int]:
    """Full coordinate -> (slice coordinate, row, column) of the 2-D view."""
    if ndim == 0:
        return (), 0, 0
    if ndim == 1:
        return (), 0, coord[0]
    return tuple(coord[:-2]), coord[-2], coord[-1]


def _view_shape(shape) -> tuple[tuple[int, ...], int, int]:
    shape = tuple(shape)
    if len(shape) == 0:
        return (), 1, 1
    if len(shape) == 1:
        return (), 1, shape[0]
    return shape[:-2], shape[-2], shape[-1]


def _shape_caption(shape, axes) -> str:
    dims = ", ".join(str(s) for s in shape)
    dims = f"({dims},)" if len(shape) == 1 else f"({dims})"
    if axes and len(axes) == len(shape):
        names = ", ".join(axes)
        names = f"({names},)" if len(axes) == 1 else f"({names})"
        return f"{names} = {dims}"
    return dims


def _key(role: str, coord) -> str:
    return "-".join([role, *(str(int(c)) for c in coord)]) if len(coord) else f"{role}-0"


# -- the visible part of one tensor --------------------------------------------------------
@dataclass
class _Window:
    slices: list[tuple[int, ...] | None]
    rows: list[int | None]
    cols: list[int | None]
    n_slices: int


def _window(shape, keep: set[tuple[int, ...]], lim: Limits, rows=None, cols=None,
            slices=None, most: int = 0) -> _Window:
    lead, R, C = _view_shape(shape)
    ndim = len(tuple(shape))
    keep_s, keep_r, keep_c = set(), set(), set()
    for coord in keep:
        s, r, c = _split(coord, ndim)
        keep_s.add(s)
        keep_r.add(r)
        keep_c.add(c)
    n_slices = math.prod(lead) if lead else 1
    if slices is None:
        if lead:
            flat_keep = {_flat(s, lead) for s in keep_s}
            pick = visible(n_slices, flat_keep, lim.slices)
            slices = [None if p is None else _unflat(p, lead) for p in pick]
        else:
            slices = [()]
    return _Window(slices=slices,
                   rows=rows if rows is not None else visible(R, keep_r, lim.rows, most),
                   cols=cols if cols is not None else visible(C, keep_c, lim.cols, most),
                   n_slices=n_slices)


def _flat(coord, shape) -> int:
    f = 0
    for c, s in zip(coord, shape):
        f = f * s + c
    return f


def _unflat(f: int, shape) -> tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(f % s)
        f //= s
    return tuple(reversed(out))


def _coords_in(win: _Window, ndim: int):
    """Every visible full coordinate of a window."""
    for s in win.slices:
        if s is None:
            continue
        for r in win.rows:
            if r is None:
                continue
            for c in win.cols:
                if c is None:
                    continue
                if ndim == 0:
                    yield ()
                elif ndim == 1:
                    yield (c,)
                else:
                    yield (*s, r, c)


# -- the figure ----------------------------------------------------------------------------
def layout(rec: GatherRecord, lang: str = "en", limits: Limits | None = None) -> FigureModel:
    """Turn a record into panels of cells: source, index (when there is one), output."""
    vis = _visible(rec, limits or Limits())
    panels = [_source_panel(rec, vis, lang)]
    if vis.idx is not None:
        panels.append(_index_panel(rec, vis, lang))
    panels.append(_output_panel(rec, vis, lang))
    legend = text("legend" if rec.dim is not None else "legend_nodim", lang)
    _paint(panels)
    return FigureModel(title=call_title(rec, lang), caption=_caption(rec, lang), legend=legend, panels=panels,
                       lang=lang)


def call_title(rec: GatherRecord, lang: str) -> str:
    """The record's call as code, with its comment in `lang` when the record names one
    (meta["note"] = (i18n key, values)): 'V.index_select(0, topk_idx)  # 第 15 层，…'."""
    note = rec.meta.get("note") if isinstance(rec.meta, dict) else None
    return rec.call if not note else f"{rec.call}  # {text(note[0], lang, **note[1])}"


def _paint(panels: list[Panel]) -> None:
    """Fill every coloured cell from one palette for the whole figure: distinct keys, distinct colours."""
    cells = [c for p in panels for sl in p.slices if sl is not None for c in sl.cells.values()]
    colours = figure_colours(c.ckey for c in cells)
    for c in cells:
        if c.ckey is not None:
            c.fill = colours[c.ckey]


@dataclass
class _Visible:
    """The windows of the three tensors and what each visible output cell points at."""

    out: _Window
    src: _Window
    idx: _Window | None
    src_of: dict            # visible output coordinate -> its source coordinate (None: no source)
    idx_of: dict            # visible output coordinate -> the index cell that chose it
    row_names: list | None


def _visible(rec: GatherRecord, lim: Limits) -> _Visible:
    """The output window first (as many rows as `lim.most` allows), then a source window that keeps every
    row and column the visible output picked: the output gives up rows until its picks fit the source."""
    out = rec.output
    rows = max(lim.rows, min(lim.most, _view_shape(out.shape)[1]))
    while True:
        out_win = _window(out.shape, set(), Limits(rows=rows, cols=lim.cols, slices=lim.slices))
        src_of = _sources(rec, list(_coords_in(out_win, out.ndim)))
        keep = {s for s in src_of.values() if s is not None}
        if rows <= 1 or _fits(rec.source.shape, keep, lim.most):
            break
        rows -= 1
    idx_of = {}
    if rec.index_coords is not None and rec.index_view is not None:
        idx_of = {o: tuple(rec.index_coords[o].tolist()) for o in src_of}
    src_win = _window(rec.source.shape, keep, lim, most=lim.most)
    row_names = rec.meta.get("row_names") if isinstance(rec.meta, dict) else None
    return _Visible(out=out_win, src=src_win, idx=_index_window(rec, lim, out_win, idx_of),
                    src_of=src_of, idx_of=idx_of, row_names=row_names)


def _sources(rec: GatherRecord, out_vis: list) -> dict:
    """Visible output coordinate -> the source coordinate it copied (None: no source)."""
    valid = rec.valid
    return {o: tuple(rec.source_coords[o].tolist()) if bool(valid[o]) else None for o in out_vis}


def _fits(shape, keep: set, most: int) -> bool:
    """True when the distinct rows and columns of `keep` each fit within `most` (the last row shown where room is left)."""
    ndim = len(tuple(shape))
    parts = [_split(c, ndim) for c in keep]
    return len({p[1] for p in parts}) <= most and len({p[2] for p in parts}) <= most


def _index_window(rec: GatherRecord, lim: Limits, out_win: _Window, idx_of) -> _Window | None:
    """The index window: aligned with the output rows when their leading shapes agree."""
    iv, out = rec.index_view, rec.output
    if iv is None:
        return None
    if iv.ndim == out.ndim and iv.ndim >= 2 and tuple(iv.shape[:-1]) == tuple(out.shape[:-1]):
        cols = out_win.cols if iv.shape[-1] == out.shape[-1] else None
        return _window(iv.shape, set(), lim, rows=out_win.rows, cols=cols, slices=out_win.slices)
    return _window(iv.shape, set(idx_of.values()), lim)


def _colour_key(rec: GatherRecord, coord: tuple[int, ...]) -> int | None:
    """What a source cell is coloured by: its position along the gathered dim (or its flat id)."""
    if len(coord) == 0:
        return 0
    if rec.dim is not None:
        return coord[rec.dim]
    return _flat(coord, tuple(rec.source.shape))


def _source_panel(rec: GatherRecord, vis: _Visible, lang: str) -> Panel:
    src = rec.source
    picked = rec.picked_source()

    def cell(coord) -> Cell:
        v = fmt_value(src[coord].item() if src.ndim else src.item())
        is_p = coord in picked
        return Cell(key=_key("src", coord), text=v,
                    fill=UNPICKED, ckey=_colour_key(rec, coord) if is_p else None, picked=is_p,
                    info=f"{rec.source_name}[{', '.join(map(str, coord))}] = {v}")

    return _panel("src", f"{rec.source_name} · {text('panel_source', lang)}",
                  _shape_caption(tuple(src.shape), rec.source_axes), src.shape, vis.src, cell,
                  rec.source_row_labels, rec.source_col_labels, lang,
                  vis.row_names if src.ndim == 2 else None)


def _index_panel(rec: GatherRecord, vis: _Visible, lang: str) -> Panel:
    iv, out = rec.index_view, rec.output

    def cell(coord) -> Cell:
        v = int(iv[coord].item()) if iv.ndim else int(iv.item())
        key = v if v >= 0 and (rec.dim is not None or rec.op == "take_along_dim") else None
        return Cell(key=_key("idx", coord), text=str(v), fill=BLANK, ckey=key, picked=v >= 0,
                    info=f"{rec.index_name}[{', '.join(map(str, coord))}] = {v}")

    aligned = iv.ndim >= 2 and tuple(iv.shape[:-1]) == tuple(out.shape[:-1])
    out_labels = rec.output_row_labels if aligned else None
    return _panel("idx", f"{rec.index_name} · {text('panel_index', lang)}",
                  _shape_caption(tuple(rec.index.shape), rec.index_axes), iv.shape, vis.idx,
                  cell, out_labels, None, lang, vis.row_names if out_labels is not None else None,
                  no_col_heads=rec.index_as_column)


def _output_panel(rec: GatherRecord, vis: _Visible, lang: str) -> Panel:
    out = rec.output
    weights = rec.meta.get("weights") if isinstance(rec.meta, dict) else None

    def cell(coord) -> Cell:
        v = fmt_value(out[coord].item() if out.ndim else out.item())
        where = f"{rec.output_name}[{', '.join(map(str, coord))}] = {v}"
        idx = _key("idx", vis.idx_of[coord]) if coord in vis.idx_of else ""
        s = vis.src_of.get(coord)
        if s is None:
            return Cell(key=_key("out", coord), text="-1", sub=v, fill=BLANK,
                        info=f"{where} {text('info_no_source', lang)}", data_idx=idx)
        top = str(s[rec.dim]) if rec.dim is not None else ",".join(map(str, s))
        return Cell(key=_key("out", coord), text=top, sub=v, ckey=_colour_key(rec, s),
                    picked=True, info=where + _provenance(rec, coord, s, weights, lang),
                    data_src=_key("src", s), data_idx=idx)

    p = _panel("out", f"{rec.output_name} · {text('panel_output', lang)}",
               _shape_caption(tuple(out.shape), rec.output_axes), out.shape, vis.out, cell,
               rec.output_row_labels, None, lang, vis.row_names if out.ndim == 2 else None)
    p.two_line = True
    return p


def _provenance(rec: GatherRecord, coord, s, weights, lang: str = "en") -> str:
    """' ← W[2, 0]; weight 0.310 (cat)': where an output cell came from, for its tooltip."""
    note = f" ← {rec.source_name}[{', '.join(map(str, s))}]"
    if weights is not None:
        note += text("info_weight", lang, w=float(weights[coord]))
    out = rec.output
    if rec.output_row_labels is not None and out.ndim >= 1:
        lab = _label(rec.output_row_labels, _flat(coord[:-1], tuple(out.shape[:-1])))
        if lab:
            note += f" ({lab})"
    return note


def _caption(rec: GatherRecord, lang: str) -> str:
    if rec.caption:
        return rec.caption
    if rec.op == "take_along_dim" and rec.dim is None:
        return text("op_take_along_dim_flat", lang)
    if rec.op == "topk_attention":
        return text("op_topk_attention", lang, k=rec.meta.get("top_k", rec.index.shape[-1]))
    return text(f"op_{rec.op}", lang, dim=rec.dim)


def _panel(role, title, shape_caption, shape, win: _Window, make_cell, row_labels, col_labels,
           lang, row_names=None, no_col_heads: bool = False) -> Panel:
    lead, R, C = _view_shape(shape)
    ndim = len(tuple(shape))
    slices: list[Slice | None] = []
    shown = 0
    for s in win.slices:
        if s is None:
            slices.append(None)
            continue
        shown += 1
        base = _flat(s, lead) * R if lead else 0
        row_heads = []
        for r in win.rows:
            if r is None:
                row_heads.append("")
                continue
            name = str(row_names[r]) if row_names and r < len(row_names) else (
                "" if ndim <= 1 else str(r))
            lab = _label(row_labels, base + r)
            row_heads.append(f"{name} {short(lab, 12)}".strip() if lab else name)
        col_heads = []
        for c in win.cols:
            if c is None or no_col_heads:
                col_heads.append("")
            else:
                lab = _label(col_labels, c)
                col_heads.append(short(lab, 6) if lab else str(c))
        label = f"[{', '.join(map(str, s))}, :, :]" if lead else ""
        sl = Slice(label=label, rows=list(win.rows), cols=list(win.cols), row_heads=row_heads,
                   col_heads=col_heads)
        for r in win.rows:
            for c in win.cols:
                if r is None or c is None:
                    continue
                coord = () if ndim == 0 else ((c,) if ndim == 1 else (*s, r, c))
                sl.cells[(r, c)] = make_cell(coord)
        slices.append(sl)
    more = ""
    if win.n_slices > shown and lead:
        more = text("more_slices", lang, n=win.n_slices - shown)
    return Panel(role=role, title=title, shape=shape_caption, slices=slices, more=more)
