"""Geometry of the picture of a gather from GGUF blocks: a record -> positioned rects, cells, text.

    >>> scene = quantized_scene(rec, "en")        # rec: trace.quantized.QuantizedGatherRecord
    >>> scene.width, len(scene.cells)

Top: each id (coloured by its position, as in every gather picture) picks a row of the table, drawn
as its blocks; the bytes of each block's scale and min are the dark part. The outlined block is
written out below: its bytes, its scale and min, its codes q and the values w they became (two-line
cells, q above w), with the formula; then the bytes the gather read. The values are the record's
output (the lookup's result), not a recomputation. Integer coordinates: same record, same bytes.
"""
from __future__ import annotations

from gatherlens.i18n import text
from gatherlens.ops.sparse.geometry import ceil_div
from gatherlens.ops.quant import FORMATS
from gatherlens.ops.quant.formats.sizes import SCALE_FIELDS
from gatherlens.render.scene import Scene
from gatherlens.render.theme import PICKED, UNPICKED, colour, fmt_value, human_bytes, short, text_width, wrap

__all__ = ["quantized_scene", "SCALE_FILL", "code_label"]

MARGIN, ID_W, ROW_H, CELL_W, CELL_H, BYTE_W = 16, 58, 30, 46, 34, 22
STRIP_W, MAX_IDS, MIN_WIDTH, PER_LINE = 520, 8, 800, 16
SCALE_FILL = "#9a9a9a"   # the bytes of a block that hold its scale (and min)
INK, GREY = "#1a1a1a", "#555555"


def _text(scene: Scene, x: int, y: int, s: str, size: int = 11, *, fill: str = INK, weight: str = "normal",
          mono: bool = False, anchor: str = "start") -> None:
    scene.texts.append(dict(x=x, y=y, text=s, size=size, fill=fill, weight=weight, mono=mono, anchor=anchor))


def _rect(scene: Scene, x: int, y: int, w: int, h: int, fill: str, stroke: str = "none", sw: float = 0,
          info: str = "") -> None:
    scene.rects.append(dict(x=x, y=y, w=w, h=h, fill=fill, stroke=stroke, sw=sw, rx=1, info=info))


def _cell(scene: Scene, x: int, y: int, w: int, h: int, fill: str, label: str, info: str, key: str,
          sub: str = "", role: str = "code", size: int = 11, mono: bool = False) -> None:
    ty = y + (h // 2 + 4 if not sub else h // 2 - 2)
    scene.cells.append(dict(x=x, y=y, w=w, h=h, fill=fill, text=label, sub=sub, info=info, key=key, role=role,
                            tx=x + w // 2, ty=ty, sy=ty + 12, size=size, mono=mono))


def _strip_geometry(rec) -> tuple[int, int, int]:
    """(blocks in a row, width of one drawn block, blocks drawn)."""
    nb = rec.dim // rec.block_elems
    width = max(4, min(32, STRIP_W // nb))
    return nb, width, min(nb, STRIP_W // width)


def _strip(scene: Scene, rec, x: int, y: int, fill: str, focus: bool) -> None:
    """One row of blocks: each block's code bytes in `fill`, its scale bytes dark."""
    _, width, drawn = _strip_geometry(rec)
    h, offsets = ROW_H - 8, []
    at = 0
    for name, n in ((f.name, f.size) for f in FORMATS[rec.qtype].fields):
        offsets.append((name, at, n))
        at += n
    for b in range(drawn):
        bx = x + b * width
        _rect(scene, bx, y, width - 1, h, fill, "#9a9a9a", 0.5, info=f"block {b}")
        for name, start, n in offsets:
            if name in SCALE_FIELDS and fill != UNPICKED:  # at least 3 px, so that 2 bytes of 34 show
                sx = bx + start * (width - 1) // rec.block_bytes
                _rect(scene, sx, y, max(3, n * (width - 1) // rec.block_bytes), h, SCALE_FILL)
    focus_block = rec.terms.start // rec.block_elems
    if focus and focus_block < drawn:
        _rect(scene, x + focus_block * width - 1, y - 2, width + 1, h + 4, "none", PICKED, 2.5)


def _rows_band(scene: Scene, rec, lang: str, y: int) -> int:
    """The ids and the rows of blocks they pick."""
    flat = rec.ids.reshape(-1).tolist()
    nb, width, drawn = _strip_geometry(rec)
    x_row, x_strip = MARGIN + ID_W + 10, MARGIN + ID_W + 96
    _text(scene, MARGIN, y + 11, text("qg_ids", lang), 11, fill=GREY, weight="bold")
    _text(scene, x_strip, y + 11, text("qg_rows_head", lang, nb=nb, elems=rec.block_elems,
                                       block_bytes=rec.block_bytes, row_bytes=rec.row_bytes), 11, fill=GREY)
    y += 18
    first: dict[int, int] = {}
    for i, row in enumerate(flat[:MAX_IDS]):
        again = row in first
        first.setdefault(row, i)
        label = short(rec.labels[i], 8) if rec.labels else ""
        _cell(scene, MARGIN, y, ID_W - 4, ROW_H, colour(i), str(row), text("qg_id_info", lang, i=i, row=row),
              f"id-{i}", sub=label, role="id")
        _text(scene, x_row, y + 19, text("qg_row", lang, row=row), 11, mono=True)
        _strip(scene, rec, x_strip, y + 4, UNPICKED if again else colour(i), i == rec.position)
        end = x_strip + drawn * width + 8
        if drawn < nb:
            _text(scene, end, y + 19, f"… +{nb - drawn}", 10, fill=GREY)
            end += 44
        note = text("qg_again", lang, j=first[row]) if again else f"{rec.row_bytes} B"
        _text(scene, end, y + 19, note, 10, fill=GREY)
        y += ROW_H + 4
    if len(flat) > MAX_IDS:
        _text(scene, MARGIN, y + 11, text("qg_more_ids", lang, n=len(flat) - MAX_IDS), 11, fill=GREY)
        y += 18
    return y


def _bytes_row(scene: Scene, rec, lang: str, y: int) -> int:
    """The bytes of the written-out block, hex, named by field (legacy blocks only: <= 34 bytes)."""
    raw, at, fill = rec.terms.raw.tolist(), 0, colour(rec.position)
    for name, n in ((f.name, f.size) for f in FORMATS[rec.qtype].fields):
        for k in range(at, at + n):
            _cell(scene, MARGIN + k * BYTE_W, y, BYTE_W - 2, 20, SCALE_FILL if name in SCALE_FIELDS else fill,
                  f"{raw[k]:02x}", text("qg_byte_info", lang, k=k, value=raw[k], field=name), f"byte-{k}",
                  role="byte", size=10, mono=True)
        _text(scene, MARGIN + (2 * at + n) * BYTE_W // 2, y + 32, name, 9, fill=GREY, anchor="middle")
        at += n
    return y + 42


def code_label(terms, k: int) -> str:
    """What code k's cell shows: q; for a codebook format (IQ4) q→book[q]; for a plain float its bits in hex."""
    code = int(terms.codes[k])
    if terms.plain:
        return f"{code:0{2 * terms.raw.numel()}x}"
    return f"{code}→{int(terms.levels[k])}" if terms.levels is not None else str(code)


def _scale_text(terms) -> str:
    """d = … (fp16 0x…), m = …; K-quants: the sub-block's integer scale and min and their products;
    a plain float: its value and bits (no scale)."""
    if terms.plain:
        return f"v = {float(terms.levels[0]):.8g} ({terms.qtype} 0x{code_label(terms, 0)}): the stored value, no scale"
    parts = [f"{name} = {value:.6g} (fp16 {bits})" for name, (value, bits) in terms.halves.items()]
    for name in ("sc", "ls"):
        if name in terms.subscales:
            parts.append(f"{name} = {terms.subscales[name]} → {terms.scale_name} = {terms.scale:.6g}")
    if "m" in terms.subscales:
        parts.append(f"m = {terms.subscales['m']} → dmin·m = {-terms.shift:.6g}")
    return ",  ".join(parts)


def _codes(scene: Scene, rec, lang: str, y: int) -> int:
    """The block's codes q above the values w they became (the record's output)."""
    terms, values = rec.terms, rec.focus_values().tolist()
    _text(scene, MARGIN, y + 11, text("qg_codes", lang, bits=terms.bits, formula=terms.formula), 11, fill=GREY)
    y += 18
    for k, (code, value) in enumerate(zip(terms.codes.tolist(), values)):
        line, col = divmod(k, PER_LINE)
        info = text("qg_code_info", lang, w=terms.start + k, q=code, value=repr(value))
        _cell(scene, MARGIN + col * CELL_W, y + line * (CELL_H + 4), CELL_W - 2, CELL_H, colour(rec.position),
              code_label(terms, k), info, f"code-{k}", sub=fmt_value(value), size=9 if terms.plain else 11)
    return y + ceil_div(len(values), PER_LINE) * (CELL_H + 4) + 4


def _block_band(scene: Scene, rec, lang: str, y: int, width: int) -> int:
    terms = rec.terms
    n = FORMATS[rec.qtype].group  # weights per scale
    _text(scene, MARGIN, y + 12, text("qg_block_title", lang, row=rec.row, i=rec.position,
                                      block=terms.start // rec.block_elems, start=terms.start,
                                      end=terms.start + n - 1), 12, weight="bold")
    y += 22
    if rec.block_bytes <= 34:
        y = _bytes_row(scene, rec, lang, y)
    _text(scene, MARGIN, y + 11, _scale_text(terms), 11, mono=True)
    y = _codes(scene, rec, lang, y + 20)
    notes = [text("qg_nibbles", lang)] if terms.bits in (4, 5) and rec.block_elems == 32 else []
    for line in [*notes, text("qg_order", lang)]:
        for part in wrap(line, width - 2 * MARGIN, 11):
            _text(scene, MARGIN, y + 11, part, 11, fill=GREY)
            y += 15
    return y


def quantized_scene(rec, lang: str = "en") -> Scene:
    """The whole picture of one QuantizedGatherRecord."""
    nb, bw, drawn = _strip_geometry(rec)
    title = text("qg_title", lang, name=rec.table_name, qtype=rec.qtype, V=rec.vocab, d=rec.dim,
                 row_bytes=rec.row_bytes, float_bytes=4 * rec.dim)
    width = max(MIN_WIDTH, MARGIN + ID_W + 96 + drawn * bw + 130, 2 * MARGIN + PER_LINE * CELL_W,
                2 * MARGIN + text_width(title, 14))
    scene = Scene(width=width, height=0, lang=lang, label=title)
    _text(scene, MARGIN, MARGIN + 14, title, 14, weight="bold")
    y = MARGIN + 24
    for line in wrap(rec.describe(lang), width - 2 * MARGIN, 11):
        _text(scene, MARGIN, y + 11, line, 11, fill=GREY)
        y += 15
    y = _rows_band(scene, rec, lang, y + 10)
    y = _block_band(scene, rec, lang, y + 12, width)
    distinct = len(rec.rows)
    footer = text("qg_bytes", lang, n=rec.ids.numel(), distinct=distinct, read=human_bytes(rec.bytes_read),
                  float_read=human_bytes(distinct * rec.dim * 4), size=human_bytes(rec.vocab * rec.row_bytes),
                  float_size=human_bytes(rec.vocab * rec.dim * 4))
    for line in wrap(footer, width - 2 * MARGIN, 11):
        _text(scene, MARGIN, y + 19, line, 11, weight="bold")
        y += 15
    scene.height = y + 20 + MARGIN
    return scene
