"""The look shared by every picture: fonts, colours, text measuring and value formatting.

    >>> colour(2), fmt_value(0.12345), text_width("cat", 11), human_bytes(1536)
    ('#bebada', '0.12', 21, '1.5 KiB')

Every renderer (svg.py, html.py, terminal.py, png.py, report_figures.py, summary.py) takes its
fonts, palette, widths and number formats from here, so one change restyles all of them.
"""
from __future__ import annotations

import math
import re

__all__ = ["FONTS", "MONO", "PALETTE", "UNPICKED", "BLANK", "MASKED", "PICKED", "OUTSIDE", "BAND", "TONES", "BLOCK_KEPT",
           "BLOCK_SKIPPED", "BLOCK_OUTSIDE", "colour", "palette", "figure_colours", "weight_colour", "text_width", "wrap", "fmt_value", "short", "human_bytes"]

FONTS = {
    "en": "DejaVu Sans, Noto Sans, Arial, sans-serif",
    "zh": "Noto Sans CJK SC, Droid Sans Fallback, WenQuanYi Micro Hei, Microsoft YaHei, "
          "PingFang SC, sans-serif",
}
MONO = "DejaVu Sans Mono, Noto Sans Mono, Menlo, Consolas, monospace"

# ColorBrewer Set3 without its grey: light hues with dark text stay readable in print.
PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
           "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f")
UNPICKED = "#f2f2f2"     # a source cell no output copied
BLANK = "#ffffff"
MASKED = "#e4e4e4"       # a score a query may not look at
PICKED = "#d62728"       # the outline of what top-k kept
OUTSIDE = "#f4e2c4"      # an earlier key a local layer's window hides (sliding / chunked)
BAND = "#b35806"         # the edge of a local layer's window in the score grid
TONES = {                # text boxes: tone -> (fill, stroke)
    "error": ("#fdecea", "#d62728"),
    "warn": ("#fff4e5", "#ff7f0e"),
    "ok": ("#edf7ed", "#2ca02c"),
}


def colour(key: int | None) -> str:
    """The palette colour of position `key` (blank for None): for keys below len(PALETTE) only; a figure
    with more rows takes its colours from `figure_colours`, which never repeats one."""
    return BLANK if key is None else PALETTE[key % len(PALETTE)]


GOLDEN = 0.6180339887498949      # hue step: consecutive colours land far apart on the wheel
LIGHTNESS = (0.80, 0.70, 0.88)   # three light tones in turn: dark text stays readable


def _hsl_hex(h: float, s: float, l: float) -> str:
    """HSL in [0, 1] -> '#rrggbb' (the CSS rule, rounded to the nearest 8-bit value)."""
    def f(n: float) -> int:
        k = (n + h * 12) % 12
        a = s * min(l, 1 - l)
        return round(255 * (l - a * max(-1.0, min(k - 3, 9 - k, 1.0))))
    return "#" + "".join(f"{f(n):02x}" for n in (0, 8, 4))


def palette(n: int) -> list[str]:
    """n distinct colours: PALETTE's first n when n <= len(PALETTE), else n light hues a golden step
    apart, three lightnesses in turn (explore.js: palette, the same rule)."""
    if n <= len(PALETTE):
        return list(PALETTE[:n])
    out: list[str] = []
    seen: set[str] = set()
    for i in range(n):
        c = _hsl_hex((i * GOLDEN) % 1.0, 0.62, LIGHTNESS[i % 3])
        for nudge in range(1, 8):                              # rounding met an earlier one: nudge the hue
            if c not in seen:
                break
            c = _hsl_hex((i * GOLDEN + nudge * 0.37 / n) % 1.0, 0.62, LIGHTNESS[(i + nudge) % 3])
        j = i
        while c in seen:                                       # past ~1,000 light hues: a distinct light RGB
            c = "#" + "".join(f"{128 + (j >> s) % 128:02x}" for s in (0, 7, 14))
            j += 1                                             # the next code: the codes of 0..2^21 differ
        seen.add(c)
        out.append(c)
    return out


def figure_colours(keys) -> dict[int, str]:
    """One distinct colour per key of one figure: key -> PALETTE[key] while every key is below
    len(PALETTE) (stable across figures), else by rank among the figure's keys from `palette`.

        >>> len(set(figure_colours(range(0, 300, 7)).values()))
        43
    """
    keys = sorted({int(k) for k in keys if k is not None})
    if not keys or keys[-1] < len(PALETTE):
        return {k: PALETTE[k] for k in keys}
    return dict(zip(keys, palette(len(keys))))


def weight_colour(w: float) -> str:
    """A weight in [0, 1] -> white .. dark blue."""
    w = min(max(w, 0.0), 1.0) ** 0.6
    lo, hi = (255, 255, 255), (33, 84, 160)
    r, g, b = (round(a + (c - a) * w) for a, c in zip(lo, hi))
    return f"#{r:02x}{g:02x}{b:02x}"


# the block map of a sparse prefill (render/prefill_map.py, the explorer's prefill section)
BLOCK_KEPT = weight_colour(0.9)   # a key block the query block gathered
BLOCK_SKIPPED = "#e2e2e2"         # allowed by causality, skipped by the rule
BLOCK_OUTSIDE = BLANK             # not allowed (a later block, outside the window)


def text_width(s: str, size: float) -> int:
    """Estimated width in px: CJK glyphs are square, Latin ones about 0.6 em."""
    w = 0.0
    for ch in s:
        w += size if ord(ch) >= 0x2E80 else size * 0.62
    return int(w + 0.999)


def wrap(s: str, width_px: int, size: float) -> list[str]:
    """Greedy wrap of English words and single CJK characters to `width_px`."""
    tokens = re.findall(r"[\u2e80-\uffff]|[^\s\u2e80-\uffff]+\s*|\s+", s)
    lines, cur = [], ""
    for tok in tokens:
        if cur and text_width((cur + tok).rstrip(), size) > width_px:
            lines.append(cur.rstrip())
            cur = tok.lstrip()
        else:
            cur += tok
    if cur.strip():
        lines.append(cur.rstrip())
    return lines or [""]


def fmt_value(v) -> str:
    """Short, fixed text for a tensor value (deterministic, <= 6 characters where possible)."""
    if isinstance(v, bool):
        return "T" if v else "F"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, complex):
        return f"{v.real:.1f}{v.imag:+.1f}j"
    if math.isnan(v):
        return ""
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    a = abs(v)
    if a >= 1e6 or a < 1e-3:                       # '8e-4', '-2e6': no padded exponent
        m, e = f"{v:.0e}".split("e")
        return f"{m}e{int(e)}"
    if a < 0.01:                                   # one significant digit, never '-0'
        return f"{v:.3f}".rstrip("0")
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "0") else s


def short(s: str, n: int) -> str:
    """`s` on one line, cut to `n` characters with '…'."""
    s = s.replace("\n", "\\n").replace("\t", "\\t")
    return s if len(s) <= n else s[: n - 1] + "…"


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
