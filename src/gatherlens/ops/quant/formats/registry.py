"""The one table of GGUF block formats: a `QuantFormat` record per format, and the calls made through it.

    >>> fmt = FORMATS["Q4_1"]
    >>> fmt.ggml_type, fmt.weights, fmt.block_bytes, fmt.field("qs").offset, fmt.routes
    (3, 32, 20, 4, ('int4', 'q8act'))
    >>> dequantize_rows(torch.zeros(3, 2 * 20, dtype=torch.uint8), "Q4_1").shape   # fmt.dequantize
    torch.Size([3, 64])

A record is its format's facts (layout.py's `BlockLayout`: ggml's type number, weights and bytes of
a block, the named fields with their offsets, weights per scale, bits per code, code offset,
formula, the restricted routes that take it) plus its functions, as ggml's type-traits row holds a
type's: `unpack` (raw rows -> per-row fields: codes, d, ...; fields.py / kquants.py / iquants.py, the plain
floats' values in floats.py), `dequantize`
(vectorised, by block; dequantize.py), `naive` (one block of bytes -> its values, the plain reference;
naive.py), `terms` (row, block -> BlockTerms; terms.py) and, for the super-block formats, `integers`
(raw rows -> the integer terms by sub-block, as q8k's reference sums them; integers.py). The facts live
in layout.py, the lowest module, so the modules that implement the functions read them without
importing this one. `format_of(qtype)` is the one lookup that fails closed: an unknown format, or one
whose record lacks what the caller needs, is an error naming it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.errors import GatherIndexError, GatherValueError
from gatherlens.ops.quant.formats.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.formats.floats import bf16_fields, f16_fields, f32_fields
from gatherlens.ops.quant.formats.dequantize import (dequantize_bf16, dequantize_f16, dequantize_f32, dequantize_iq4_nl,
                                                     dequantize_iq4_xs, dequantize_q2_k, dequantize_q3_k,
                                                     dequantize_q4_0, dequantize_q4_1, dequantize_q4_k, dequantize_q5_0,
                                                     dequantize_q5_1, dequantize_q5_k, dequantize_q6_k, dequantize_q8_0)
from gatherlens.ops.quant.formats.integers import (iq4_xs_integers, q2_k_integers, q3_k_integers, q4_k_integers,
                                                   q5_k_integers, q6_k_integers)
from gatherlens.ops.quant.formats.iquants import iq4_nl_fields, iq4_xs_fields
from gatherlens.ops.quant.formats.kquants import q2_k_fields, q3_k_fields, q4_k_fields, q5_k_fields, q6_k_fields
from gatherlens.ops.quant.formats.layout import LAYOUTS, BlockLayout
from gatherlens.ops.quant.formats.naive import (naive_block_bf16, naive_block_f16, naive_block_f32, naive_block_iq4_nl,
                                                naive_block_iq4_xs, naive_block_q2_k, naive_block_q3_k,
                                                naive_block_q4_0, naive_block_q4_1, naive_block_q4_k, naive_block_q5_0,
                                                naive_block_q5_1, naive_block_q5_k, naive_block_q6_k, naive_block_q8_0,
                                                naive_rows)
from gatherlens.ops.quant.formats.terms import (BlockTerms, bf16_terms, f16_terms, f32_terms, groups, iq4_nl_terms,
                                                iq4_xs_terms, q2_k_terms, q3_k_terms, q4_0_terms, q4_1_terms,
                                                q4_k_terms, q5_0_terms, q5_1_terms, q5_k_terms, q6_k_terms, q8_0_terms)

__all__ = ["QuantFormat", "FORMATS", "DEQUANTIZERS", "format_of", "dequantize_rows", "naive_dequantize_rows",
           "block_terms"]


@dataclass(frozen=True, kw_only=True)
class QuantFormat(BlockLayout):
    """One GGUF block format: its layout (BlockLayout's fields) and its functions."""

    unpack: Callable  # (R, nb * block_bytes) uint8 -> the per-row fields: (q, d), (q, d, m), ...
    dequantize: Callable  # (R, nb * block_bytes) uint8 -> float32 values by block (R, nb, ...)
    naive: Callable  # the bytes of one block (list of ints) -> its weights (list of floats)
    terms: Callable  # (row (row_bytes,) uint8, block) -> BlockTerms of scale group `block`
    integers: Callable | None = None  # super-blocks: raw -> (codes, d, sc, dmin, mn) by sub-block (integers.py)


def _record(name: str, unpack, dequantize, naive, terms, integers=None) -> QuantFormat:
    layout = LAYOUTS[name]
    facts = {f.name: getattr(layout, f.name) for f in dataclasses.fields(BlockLayout)}
    return QuantFormat(**facts, unpack=unpack, dequantize=dequantize, naive=naive, terms=terms, integers=integers)


FORMATS = {fmt.name: fmt for fmt in (
    _record("Q8_0", q8_0_fields, dequantize_q8_0, naive_block_q8_0, q8_0_terms),
    _record("Q4_0", q4_0_fields, dequantize_q4_0, naive_block_q4_0, q4_0_terms),
    _record("Q4_1", q4_1_fields, dequantize_q4_1, naive_block_q4_1, q4_1_terms),
    _record("Q5_0", q5_0_fields, dequantize_q5_0, naive_block_q5_0, q5_0_terms),
    _record("Q5_1", q5_1_fields, dequantize_q5_1, naive_block_q5_1, q5_1_terms),
    _record("Q4_K", q4_k_fields, dequantize_q4_k, naive_block_q4_k, q4_k_terms, q4_k_integers),
    _record("Q6_K", q6_k_fields, dequantize_q6_k, naive_block_q6_k, q6_k_terms, q6_k_integers),
    _record("F32", f32_fields, dequantize_f32, naive_block_f32, f32_terms),
    _record("F16", f16_fields, dequantize_f16, naive_block_f16, f16_terms),
    _record("BF16", bf16_fields, dequantize_bf16, naive_block_bf16, bf16_terms),
    _record("Q2_K", q2_k_fields, dequantize_q2_k, naive_block_q2_k, q2_k_terms, q2_k_integers),
    _record("Q3_K", q3_k_fields, dequantize_q3_k, naive_block_q3_k, q3_k_terms, q3_k_integers),
    _record("Q5_K", q5_k_fields, dequantize_q5_k, naive_block_q5_k, q5_k_terms, q5_k_integers),
    _record("IQ4_NL", iq4_nl_fields, dequantize_iq4_nl, naive_block_iq4_nl, iq4_nl_terms),
    _record("IQ4_XS", iq4_xs_fields, dequantize_iq4_xs, naive_block_iq4_xs, iq4_xs_terms, iq4_xs_integers),
)}
assert tuple(FORMATS) == tuple(LAYOUTS), "every record of layout.py needs its row here, in the same order"
assert all((fmt.integers is not None) == (fmt.kernel == "q8k_linear") for fmt in FORMATS.values()), \
    "the formats of q8k.cpp (and only they) need their integer terms, for its reference"
DEQUANTIZERS = {name: fmt.dequantize for name, fmt in FORMATS.items()}


def format_of(qtype: str, needs: str | None = None) -> QuantFormat:
    """The record of `qtype`. An unknown format, or (with `needs`) one whose record leaves that fact or
    function empty, is a GatherValueError naming it: never a silent default.

        >>> format_of("Q8_0").gemm_rows, format_of("Q4_K", needs="integers").weights
        (inf, 256)
    """
    fmt = FORMATS.get(qtype) if isinstance(qtype, str) else None
    if fmt is None:
        raise GatherValueError(f"qtype must be one of {', '.join(map(repr, FORMATS))}, got {qtype!r}")
    if needs is not None and not getattr(fmt, needs):
        having = [name for name, other in FORMATS.items() if getattr(other, needs)]
        raise GatherValueError(f"the record of {qtype} has no {needs}; the formats with one: {', '.join(having)}")
    return fmt


def dequantize_rows(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """(R, nb * block_bytes) uint8 rows of `qtype` -> (R, nb * block_weights) float32. Unchecked (but a
    strided view of rows, a transpose, is read as its bytes in order)."""
    raw = raw if raw.stride(-1) == 1 else raw.contiguous()  # (R, nb * block_bytes), rows contiguous
    return FORMATS[qtype].dequantize(raw).flatten(1)  # (R, nb*elems)


def naive_dequantize_rows(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """The same, block by block with the plain reference (naive.py): bit-equal, slow."""
    return naive_rows(raw, qtype, FORMATS[qtype].naive)  # (R, nb*elems)


def block_terms(row: torch.Tensor, qtype: str, block: int) -> BlockTerms:
    """The terms of scale group `block` (of the format's `group` weights) of one row of blocks (row_bytes,) uint8."""
    count = groups(qtype, row.numel())
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < count:
        raise GatherIndexError(f"block {block!r} is outside the row's {count} blocks of {FORMATS[qtype].group} "
                               f"weights [0, {count})")
    return FORMATS[qtype].terms(row, block)
