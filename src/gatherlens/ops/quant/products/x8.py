"""GGUF blocks repacked in panels of 8 weight rows, for the decode product (`gatherlens::q8x8_linear`).

    >>> packed = pack_x8(raw, "Q4_1")            # raw (N, row_bytes) uint8 -> (N, row_bytes), N % 8 == 0
    >>> torch.equal(unpack_x8(packed, "Q4_1"), raw)
    True
    >>> y = x8_matmul(x, packed, "Q4_1")         # x (M, K) float32 -> (M, N), as q8act_matmul(x, raw, ...)
    >>> torch.equal(x8_rows(packed, ids, "Q4_1"), raw[ids])   # rows gathered from the panels, as stored
    True

A decode step multiplies one row of x by every weight row. Row by row (q8act.cpp's row_dot) each
32-weight block costs ~20 instructions: its nibbles, one multiply-add, and its scale and min turned
from fp16 and applied one block at a time. In a panel, block b of 8 consecutive rows is stored
together, the codes interleaved so that one 32-byte load holds 4 codes of each of the 8 rows (an
int32 lane a row): x's 4 codes broadcast meet all 8 rows in one multiply-add, and the 8 scales are
one fp16 load and one conversion. The bytes are the blocks' own, moved (the same size as raw):

    panel block (8 rows, block b):  d[8] fp16 | m[8] fp16 (formats with a min) | qh[8] (5-bit) | codes
    qh, 5-bit (Q5_0, Q5_1): each row's 4 bytes of fifth bits, a row an int32 lane (bit i: weight i's)
    codes, 4- and 5-bit (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): 4 chunks of 32 bytes, chunk c = bytes 4c .. 4c+3
        of each row's 16 (a byte holds weight 4c+i in its low nibble and 16+4c+i in its high one, as stored)
    codes, Q8_0: 8 steps of 32 bytes, step s = int8 values 4s .. 4s+3 of each row

`X8_QTYPES` are the formats whose records have `panels` (the 4-, 5- and 8-bit 32-weight blocks; a
5-bit chunk's fifth bits are spread to its 32 bytes in registers: one bit shuffle with AVX512-BITALG,
a byte shuffle and compare without). The product's integer sums equal row_dot's; its float sums over
blocks run in another order (float32 rounding). `unpack_x8` is the exact inverse (the tests hold them so).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.quant.formats.layout import LAYOUTS, PANEL_OP, QK, formats_run_by
from gatherlens.ops.quant.products.q8act import kernel_loaded

__all__ = ["X8_QTYPES", "PANEL", "X8_OP", "pack_x8", "pack_x8_parts", "pack_x8_reference", "unpack_x8", "x8_rows",
           "x8_fits", "x8_matmul", "after_packing"]

PANEL = 8  # weight rows a panel (one per int32 lane of a 256-bit register)
PACK_ROWS = 8192  # rows pack_x8 moves at a time (a multiple of PANEL)
PACKED_ROWS: contextvars.ContextVar = contextvars.ContextVar("gatherlens_packed_rows", default=None)
X8_OP = PANEL_OP  # its operator, torch.ops.gatherlens.<X8_OP>(x, packed, ggml type), in q8act.cpp
X8_QTYPES = formats_run_by(PANEL_OP)  # the records with panels
assert all(LAYOUTS[q].weights == QK and LAYOUTS[q].bits in (4, 5, 8) for q in X8_QTYPES), "panels: 4/5/8-bit blocks of 32"


def x8_fits(raw: torch.Tensor, qtype: str) -> bool:
    """True when `raw` (N, row_bytes) of `qtype` can be packed: a panel format and N a multiple of 8."""
    return qtype in X8_QTYPES and raw.dim() == 2 and raw.shape[0] % PANEL == 0 and raw.shape[0] > 0


def _parts(qtype: str) -> tuple[list[str], int]:
    """The fields before the codes in panel order (d, then m where the format has one, then qh for 5-bit
    codes) and the codes' step width."""
    lay = LAYOUTS[qtype]
    heads = [f.name for f in lay.fields if f.kind == "fp16"] + [f.name for f in lay.fields if f.kind == "high"]
    return heads, (32 if lay.bits == 8 else 16) // 4  # a 4/5-bit row's 16 code bytes: 4 chunks; Q8_0's 32: 8 steps


def pack_x8(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """raw (N, nb * block_bytes) uint8 blocks -> the same bytes in panels (N, nb * block_bytes), contiguous, by
    q8act.cpp's `x8_pack` (the panels' own kernel: without it there are no panels to read; `pack_x8_reference`
    is its plain twin, equal byte for byte). Written PACK_ROWS rows at a time into the output: no whole-weight
    temporaries (a 262K-row head is 178 MB), each piece handed to `after_packing`'s callback once moved."""
    return pack_x8_parts([raw], qtype)


def pack_x8_parts(parts: list[torch.Tensor], qtype: str) -> torch.Tensor:
    """pack_x8(torch.cat(parts)) without the joined copy: parts (N_i, row_bytes) of one width, each N_i a multiple
    of 8 (a panel never spans two), packed one after another into one (sum N_i, row_bytes) output (a layer's q|k|v
    or gate|up whose rows lie apart in the file: models/gguf/quantized.py's `packed_weight`)."""
    if not kernel_loaded():
        raise GatherValueError(f"pack_x8({qtype}): panels are read by q8act.cpp's operators, which did not build "
                               f"here (see the warning); the blocks are read as stored instead")
    return _pack(parts, qtype, lambda rows, order, out: torch.ops.gatherlens.x8_pack(rows, order, out))


def pack_x8_reference(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """pack_x8 in torch: each panel's 2-byte units gathered by indexing (the same bytes, ~10x slower)."""
    def move(rows, order, out):
        pairs = rows.view(torch.int16).reshape(-1, PANEL * rows.shape[1] // 2)  # (n / 8, 4 * row_bytes) units
        out.copy_(pairs[:, order].view(torch.uint8).view(rows.shape))  # (n, row_bytes)
    return _pack([raw], qtype, move)


def _pack(parts: list[torch.Tensor], qtype: str, move) -> torch.Tensor:
    """out (sum N, row_bytes) from the parts one after another, a piece of PACK_ROWS rows at a time: move(rows,
    order, out piece)."""
    row_bytes = parts[0].shape[1]
    out = torch.empty(sum(p.shape[0] for p in parts), row_bytes, dtype=torch.uint8)  # (sum N, row_bytes)
    order, done, at = _panel_order(qtype, row_bytes), PACKED_ROWS.get(), 0
    for raw in parts:
        for start in range(0, raw.shape[0], PACK_ROWS):
            rows = raw[start:start + PACK_ROWS]  # (n, row_bytes), n a multiple of 8
            move(rows if rows.is_contiguous() else rows.contiguous(), order, out[at + start:at + start + rows.shape[0]])
            if done is not None:
                done(rows)
        at += raw.shape[0]
    return out


@functools.lru_cache(maxsize=64)
def _panel_order(qtype: str, row_bytes: int) -> torch.Tensor:
    """Where each 2-byte unit of a packed panel comes from in its 8 stored rows, (4 * row_bytes,) int64:
    `_panels` (the layout, in permutes) applied once to the bytes' own positions, then one gather a chunk.
    Every field of a panel format starts at an even byte and is a whole number of units (checked here)."""
    where = torch.arange(PANEL * row_bytes, dtype=torch.int32).reshape(PANEL, row_bytes)  # (8, row_bytes)
    order = _panels(where, qtype).reshape(-1, 2)  # (4 * row_bytes, 2) the source of each byte pair
    assert bool((order[:, 0] % 2 == 0).all()) and torch.equal(order[:, 1], order[:, 0] + 1), f"{qtype}: odd fields"
    return (order[:, 0] // 2).long()  # (4 * row_bytes,)


def x8_rows(packed: torch.Tensor, ids: torch.Tensor, qtype: str) -> torch.Tensor:
    """Rows `ids` (U,) int64 of the blocks as stored, (U, row_bytes) uint8, gathered from their panels: each row's
    2-byte units picked where its panel holds them (`unpack_x8(packed)[ids]` without unpacking whole panels; a
    tied embedding reads its rows so from the head's panels: models/gguf/quantized.py's `panel_rows`). Unchecked."""
    row_bytes = packed.shape[1]
    units = packed.view(torch.int16).reshape(-1)  # (N * row_bytes / 2,) the panels' units
    where = _row_units(qtype, row_bytes)  # (8, row_bytes / 2): where in its panel each unit of a lane's row lies
    ids = ids.long()  # (U,)
    first = (ids // PANEL * (PANEL * row_bytes // 2)).unsqueeze(1)  # (U, 1) each row's panel's first unit
    return units[first + where[ids % PANEL]].view(torch.uint8)  # (U, row_bytes)


@functools.lru_cache(maxsize=64)
def _row_units(qtype: str, row_bytes: int) -> torch.Tensor:
    """`_panel_order` inverted, (8, row_bytes / 2) int64: [lane, unit] = that unit's place in the packed panel."""
    order = _panel_order(qtype, row_bytes)  # (4 * row_bytes,) source unit of each packed unit
    return torch.argsort(order).reshape(PANEL, row_bytes // 2)  # (8, row_bytes / 2)


@contextlib.contextmanager
def after_packing(done):
    """Inside the block, pack_x8 calls done(rows) with each piece of raw rows once it has moved them (a
    loader lets a mapped file's pages go as it packs: models/gguf/quantized.py)."""
    token = PACKED_ROWS.set(done)
    try:
        yield
    finally:
        PACKED_ROWS.reset(token)


def _panels(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """The panel layout of whole panels of rows, (n, row_bytes) -> (n, row_bytes), any dtype (the bytes, or
    their positions)."""
    lay = LAYOUTS[qtype]
    N, nb = raw.shape[0], raw.shape[1] // lay.block_bytes
    blocks = raw.reshape(N // PANEL, PANEL, nb, lay.block_bytes)  # (P, 8, nb, bytes)
    heads, steps = _parts(qtype)
    pieces = [blocks[..., lay.field(n).offset:lay.field(n).end].permute(0, 2, 1, 3) for n in heads]  # (P, nb, 8, size)
    qs = lay.field("qs")
    codes = blocks[..., qs.offset:qs.end].reshape(N // PANEL, PANEL, nb, steps, 4)  # (P, 8, nb, steps, 4)
    pieces.append(codes.permute(0, 2, 3, 1, 4))  # (P, nb, steps, 8, 4)
    flat = [p.reshape(N // PANEL, nb, -1) for p in pieces]  # (P, nb, bytes of the piece)
    return torch.cat(flat, dim=-1).reshape(N, nb * lay.block_bytes)  # (N, row_bytes)


def unpack_x8(packed: torch.Tensor, qtype: str) -> torch.Tensor:
    """pack_x8's inverse: the blocks as stored, (N, nb * block_bytes)."""
    lay = LAYOUTS[qtype]
    N, nb = packed.shape[0], packed.shape[1] // lay.block_bytes
    panel = packed.reshape(N // PANEL, nb, PANEL * lay.block_bytes)  # (P, nb, 8 * bytes)
    heads, steps = _parts(qtype)
    out = torch.empty(N // PANEL, PANEL, nb, lay.block_bytes, dtype=torch.uint8)  # (P, 8, nb, bytes)
    at = 0
    for name in heads:
        f = lay.field(name)
        out[..., f.offset:f.end] = panel[..., at:at + PANEL * f.size].reshape(N // PANEL, nb, PANEL, f.size).permute(0, 2, 1, 3)
        at += PANEL * f.size
    qs = lay.field("qs")
    codes = panel[..., at:].reshape(N // PANEL, nb, steps, PANEL, 4).permute(0, 3, 1, 2, 4)  # (P, 8, nb, steps, 4)
    out[..., qs.offset:qs.end] = codes.reshape(N // PANEL, PANEL, nb, qs.size)
    return out.reshape(N, nb * lay.block_bytes)


def x8_matmul(x: torch.Tensor, packed: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for panels `packed` of `qtype` (the operator in q8act.cpp). Unchecked."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()  # (M, K)
    return getattr(torch.ops.gatherlens, X8_OP)(x, packed, LAYOUTS[qtype].ggml_type)  # (M, N)
