"""The plain reference: one block at a time, ggml's C loops written out, float32 arithmetic.

    >>> raw = torch.zeros(2, 20, dtype=torch.uint8)            # (R, 20): 2 rows of one Q4_1 block
    >>> naive_rows(raw, "Q4_1", naive_block_q4_1).shape       # = naive_dequantize_rows(raw, "Q4_1")
    torch.Size([2, 32])

Each `naive_block_*` follows `dequantize_row_*` in ggml's `ggml-quants.c` line by line, on the bytes
of one block as Python ints, each field taken by name (as ggml's struct members) at the offset its
record in layout.py gives; each is the `naive` of its record in registry.py. Every float32
operation is done in Python (double) and rounded to float32 at once by `f32`; for +, - and * of
float32 values this equals float32 arithmetic exactly (double has more than twice float32's
precision), so the reference owes nothing to torch's kernels.
"""
from __future__ import annotations

import struct

import torch

from gatherlens.ops.quant.formats.layout import LAYOUTS

__all__ = ["naive_rows", "f32", "naive_block_q8_0", "naive_block_q4_0", "naive_block_q4_1", "naive_block_q5_0",
           "naive_block_q5_1", "naive_block_q4_k", "naive_block_q6_k", "naive_block_f32", "naive_block_f16",
           "naive_block_bf16", "naive_block_q2_k", "naive_block_q3_k", "naive_block_q5_k", "naive_block_iq4_nl",
           "naive_block_iq4_xs"]


def f32(x: float) -> float:
    """`x` rounded to the nearest float32 (ties to even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _half(b: list[int]) -> float:
    """The little-endian IEEE half in the two bytes b."""
    return struct.unpack("<e", bytes(b))[0]


def _named(b: list[int], qtype: str) -> dict[str, list[int]]:
    """The bytes of one block by field, as ggml's struct names them (`x[i].d`, `x[i].qs`)."""
    return {f.name: b[f.offset:f.end] for f in LAYOUTS[qtype].fields}


def naive_block_q8_0(b: list[int]) -> list[float]:
    x = _named(b, "Q8_0")
    d = _half(x["d"])
    return [f32((q - 256 if q > 127 else q) * d) for q in x["qs"]]


def naive_block_q4_0(b: list[int]) -> list[float]:
    x, y = _named(b, "Q4_0"), [0.0] * 32
    d, qs = _half(x["d"]), x["qs"]
    for j in range(16):
        y[j] = f32(((qs[j] & 0x0F) - 8) * d)
        y[j + 16] = f32(((qs[j] >> 4) - 8) * d)
    return y


def naive_block_q4_1(b: list[int]) -> list[float]:
    x, y = _named(b, "Q4_1"), [0.0] * 32
    d, m, qs = _half(x["d"]), _half(x["m"]), x["qs"]
    for j in range(16):
        y[j] = f32(f32((qs[j] & 0x0F) * d) + m)
        y[j + 16] = f32(f32((qs[j] >> 4) * d) + m)
    return y


def _codes_q5(qh: int, qs: list[int]) -> list[int]:
    """The 32 five-bit codes of a Q5 block: qs nibbles, bit 4 from the uint32 qh."""
    codes = [0] * 32
    for j in range(16):
        codes[j] = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)
        codes[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)
    return codes


def naive_block_q5_0(b: list[int]) -> list[float]:
    x = _named(b, "Q5_0")
    d, qh = _half(x["d"]), int.from_bytes(bytes(x["qh"]), "little")
    return [f32((q - 16) * d) for q in _codes_q5(qh, x["qs"])]


def naive_block_q5_1(b: list[int]) -> list[float]:
    x = _named(b, "Q5_1")
    d, m, qh = _half(x["d"]), _half(x["m"]), int.from_bytes(bytes(x["qh"]), "little")
    return [f32(f32(q * d) + m) for q in _codes_q5(qh, x["qs"])]


def _scale_min_k4(j: int, q: list[int]) -> tuple[int, int]:
    """ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def naive_block_q4_k(b: list[int]) -> list[float]:
    x, y = _named(b, "Q4_K"), []
    d, dmin, scales, qs = _half(x["d"]), _half(x["dmin"]), x["scales"], x["qs"]
    for chunk in range(4):  # 64 weights: sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles)
        for sub, shift in ((2 * chunk, 0), (2 * chunk + 1, 4)):
            sc, m = _scale_min_k4(sub, scales)
            d1, m1 = f32(d * sc), f32(dmin * m)
            y += [f32(f32(d1 * ((q >> shift) & 0x0F)) - m1) for q in qs[32 * chunk:32 * chunk + 32]]
    return y


def naive_block_q6_k(b: list[int]) -> list[float]:
    x, y = _named(b, "Q6_K"), [0.0] * 256
    ql, qh, d = x["ql"], x["qh"], _half(x["d"])
    sc = [s - 256 if s > 127 else s for s in x["scales"]]
    for half in range(2):  # 128 weights: ql[64h:64h+64], qh[32h:32h+32], sc[8h:8h+8]
        lo, hi, s, out = ql[64 * half:], qh[32 * half:], sc[8 * half:], 128 * half
        for l in range(32):
            q1 = ((lo[l] & 0x0F) | (((hi[l] >> 0) & 3) << 4)) - 32
            q2 = ((lo[l + 32] & 0x0F) | (((hi[l] >> 2) & 3) << 4)) - 32
            q3 = ((lo[l] >> 4) | (((hi[l] >> 4) & 3) << 4)) - 32
            q4 = ((lo[l + 32] >> 4) | (((hi[l] >> 6) & 3) << 4)) - 32
            i = l // 16
            for k, q in enumerate((q1, q2, q3, q4)):
                y[out + l + 32 * k] = f32(f32(d * s[i + 2 * k]) * q)
    return y


def naive_block_f32(b: list[int]) -> list[float]:
    return [struct.unpack("<f", bytes(_named(b, "F32")["v"]))[0]]


def naive_block_f16(b: list[int]) -> list[float]:
    return [_half(_named(b, "F16")["v"])]


def naive_block_bf16(b: list[int]) -> list[float]:
    return [struct.unpack("<f", bytes([0, 0, *_named(b, "BF16")["v"]]))[0]]  # the top half of a float32


def naive_block_q2_k(b: list[int]) -> list[float]:
    x, y, i = _named(b, "Q2_K"), [], 0
    d, dmin, scales, qs = _half(x["d"]), _half(x["dmin"]), x["scales"], x["qs"]
    for half in range(2):  # 128 weights: qs[32h:32h+32], four shifts, two sub-blocks of 16 each
        q = qs[32 * half:32 * half + 32]
        for shift in (0, 2, 4, 6):
            for part in (q[:16], q[16:]):
                sc = scales[i]
                i += 1
                dl, ml = f32(d * (sc & 0x0F)), f32(dmin * (sc >> 4))
                y += [f32(f32(dl * ((v >> shift) & 3)) - ml) for v in part]
    return y


def _scales_q3_k(packed: list[int]) -> list[int]:
    """ggml's kmask1/kmask2 shuffle: the sixteen 6-bit scales (0..63) of a Q3_K block."""
    return [((packed[s % 8] >> (4 * (s // 8))) & 0x0F) | (((packed[8 + s % 4] >> (2 * (s // 4))) & 3) << 4)
            for s in range(16)]


def naive_block_q3_k(b: list[int]) -> list[float]:
    x, y, i, m = _named(b, "Q3_K"), [], 0, 1
    d, hm, qs, scales = _half(x["d"]), x["hmask"], x["qs"], _scales_q3_k(x["scales"])
    for half in range(2):
        q = qs[32 * half:32 * half + 32]
        for shift in (0, 2, 4, 6):
            for lo in (0, 16):
                dl = f32(d * (scales[i] - 32))
                i += 1
                y += [f32(dl * (((q[l] >> shift) & 3) - (0 if hm[l] & m else 4))) for l in range(lo, lo + 16)]
            m <<= 1
    return y


def naive_block_q5_k(b: list[int]) -> list[float]:
    x, y = _named(b, "Q5_K"), []
    d, dmin, scales, qh, qs = _half(x["d"]), _half(x["dmin"]), x["scales"], x["qh"], x["qs"]
    for chunk in range(4):  # 64 weights: sub-blocks 2c (low nibbles, qh bit 2c), 2c + 1 (high, bit 2c + 1)
        for sub, shift in ((2 * chunk, 0), (2 * chunk + 1, 4)):
            sc, m = _scale_min_k4(sub, scales)
            d1, m1 = f32(d * sc), f32(dmin * m)
            ql = qs[32 * chunk:32 * chunk + 32]
            y += [f32(f32(d1 * (((ql[l] >> shift) & 0x0F) + (16 if qh[l] & (1 << sub) else 0))) - m1)
                  for l in range(32)]
    return y


def _iq4_values(dl: float, qs: list[int], qtype: str) -> list[float]:
    """16 bytes of IQ4 codes -> 32 weights dl * book[q]: byte j low nibble is weight j, high j + 16."""
    book = LAYOUTS[qtype].codebook
    return [f32(dl * book[q & 0x0F]) for q in qs] + [f32(dl * book[q >> 4]) for q in qs]


def naive_block_iq4_nl(b: list[int]) -> list[float]:
    x = _named(b, "IQ4_NL")
    return _iq4_values(_half(x["d"]), x["qs"], "IQ4_NL")


def naive_block_iq4_xs(b: list[int]) -> list[float]:
    x, y = _named(b, "IQ4_XS"), []
    d, high, low = _half(x["d"]), int.from_bytes(bytes(x["scales_h"]), "little"), x["scales_l"]
    for ib in range(8):
        ls = ((low[ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((high >> (2 * ib)) & 3) << 4)
        y += _iq4_values(f32(d * (ls - 32)), x["qs"][16 * ib:16 * ib + 16], "IQ4_XS")
    return y


def naive_rows(raw: torch.Tensor, qtype: str, block) -> torch.Tensor:
    """(R, nb * block_bytes) uint8 rows of `qtype` -> (R, nb * block_weights) float32, `block(bytes)` on
    each block in turn (registry.py's `naive_dequantize_rows` passes the format's `naive_block_*`)."""
    layout = LAYOUTS[qtype]
    elems, nbytes = layout.weights, layout.block_bytes
    rows, width = raw.shape
    out = []
    for row in raw.tolist():
        values = []
        for start in range(0, width, nbytes):
            values += block(row[start:start + nbytes])
        out.append(values)
    return torch.tensor(out, dtype=torch.float32).view(rows, width // nbytes * elems)  # (R, nb*elems)
