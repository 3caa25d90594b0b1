"""The facts of every GGUF block format this package reads, one record each (ggml's struct in
`ggml-common.h` plus its row of ggml's type traits): the lowest module of ops/quant, importing none.

    >>> LAYOUTS["Q4_1"].field("m")                      # the fp16 min, bytes [2, 4) of a block
    Field(name='m', offset=2, size=2, kind='fp16')
    >>> LAYOUTS["Q4_1"].weights, LAYOUTS["Q4_1"].block_bytes, LAYOUTS["Q4_1"].ggml_type
    (32, 20, 3)
    >>> formats_taking("int4")                          # the formats a restricted route takes
    ('Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q4_K')

Each record (`BlockLayout`) holds the name (ggml's), ggml's type number, the weights of one block,
its fields in block order (name, byte offset, size, kind; offsets follow from the sizes: ggml's
structs have no padding, so block_bytes is where the last field ends), the weights per scale group
(blocks, or K-quant sub-blocks), the bits of one code, the code offset (w = (q - offset) * scale
+ shift), the formula the picture prints, and `routes`: the restricted kernels that take the blocks
as stored ("int4": matmul.py's int4 and int4_f32 routes; "q8act"); every other route takes any
format. registry.py attaches each format's functions to its record (`FORMATS`); sizes.py, fields.py,
kquants.py, naive.py, terms.py, int4.py and q8act.py read these records, and `c_header()` writes
them for the C++ kernels (quant_formats.h, written by `write_c_header()`; the tests check it).
Adding a format: one record here, its kernels, one row in registry.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Field", "BlockLayout", "LAYOUTS", "QK", "QK_K", "KINDS", "SCALE_KINDS", "formats_taking",
           "c_header", "write_c_header", "HEADER", "IQ4_BOOK"]

QK = 32  # weights in one block of the legacy formats
# ggml's kvalues_iq4nl: the 16 int8 values a 4-bit IQ4_NL / IQ4_XS code stands for
IQ4_BOOK = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
QK_K = 256  # weights in one K-quant super-block
# what a field's bytes hold: an IEEE half scale or min; packed integer sub-block scales (and mins);
# codes (all their bits, or the low ones); the high bits of codes stored apart
# or a plain float value (F32 / F16 / BF16: a "block" of one weight)
KINDS = ("fp16", "scales", "codes", "high", "value")
SCALE_KINDS = ("fp16", "scales")  # the fields that scale and shift codes; the rest are codes
HEADER = Path(__file__).with_name("quant_formats.h")


@dataclass(frozen=True)
class Field:
    """`size` bytes at `offset` in every block, of `kind` (one of KINDS)."""

    name: str
    offset: int
    size: int
    kind: str

    @property
    def end(self) -> int:
        return self.offset + self.size


def _packed(*fields: tuple[str, int, str]) -> tuple[Field, ...]:
    """(name, size, kind) in block order -> Fields at consecutive offsets from 0."""
    out, at = [], 0
    for name, size, kind in fields:
        out.append(Field(name, at, size, kind))
        at += size
    return tuple(out)


@dataclass(frozen=True)
class BlockLayout:
    """One GGUF block format: w = (q - code_offset) * scale + shift, group by group."""

    name: str
    ggml_type: int  # ggml's type number (gguf.GGMLQuantizationType)
    weights: int  # weights in one block (super-block for K-quants)
    fields: tuple[Field, ...]  # the bytes of one block, in order
    group: int  # weights per scale: a block, or a K-quant sub-block
    bits: int  # bits of one code
    code_offset: int  # subtracted from every code
    formula: str  # how a weight is made, as the picture prints it
    routes: tuple[str, ...] = ()  # the restricted kernels that take these blocks as stored
    codebook: tuple[int, ...] = ()  # IQ4: the code -> int8 value table (w = codebook[q] * scale); () linear

    @property
    def block_bytes(self) -> int:
        return self.fields[-1].end

    def field(self, name: str) -> Field:
        """The field called `name` (KeyError if the block has none)."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}")

    def has(self, name: str) -> bool:
        return any(f.name == name for f in self.fields)


LAYOUTS = {layout.name: layout for layout in (
    BlockLayout("Q8_0", 8, QK, _packed(("d", 2, "fp16"), ("qs", QK, "codes")),
                group=QK, bits=8, code_offset=0, formula="q·d", routes=("int4", "q8act")),
    BlockLayout("Q4_0", 2, QK, _packed(("d", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=8, formula="(q − 8)·d", routes=("int4", "q8act")),
    BlockLayout("Q4_1", 3, QK, _packed(("d", 2, "fp16"), ("m", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="q·d + m", routes=("int4", "q8act")),
    BlockLayout("Q5_0", 6, QK, _packed(("d", 2, "fp16"), ("qh", QK // 8, "high"), ("qs", QK // 2, "codes")),
                group=QK, bits=5, code_offset=16, formula="(q − 16)·d", routes=("int4", "q8act")),
    BlockLayout("Q5_1", 7, QK, _packed(("d", 2, "fp16"), ("m", 2, "fp16"), ("qh", QK // 8, "high"),
                                       ("qs", QK // 2, "codes")),
                group=QK, bits=5, code_offset=0, formula="q·d + m", routes=("int4", "q8act")),
    BlockLayout("Q4_K", 12, QK_K, _packed(("d", 2, "fp16"), ("dmin", 2, "fp16"), ("scales", 12, "scales"),
                                          ("qs", QK_K // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("int4", "q8act")),
    BlockLayout("Q6_K", 14, QK_K, _packed(("ql", QK_K // 2, "codes"), ("qh", QK_K // 4, "high"),
                                          ("scales", QK_K // 16, "scales"), ("d", 2, "fp16")),
                group=QK_K // 16, bits=6, code_offset=32, formula="(q − 32)·(d·sc)", routes=("q8act",)),
    BlockLayout("F32", 0, 1, _packed(("v", 4, "value")), group=1, bits=32, code_offset=0, formula="w (float32)",
                routes=("q8act",)),
    BlockLayout("F16", 1, 1, _packed(("v", 2, "value")), group=1, bits=16, code_offset=0, formula="w (float16)",
                routes=("q8act",)),
    BlockLayout("BF16", 30, 1, _packed(("v", 2, "value")), group=1, bits=16, code_offset=0, formula="w (bfloat16)",
                routes=("q8act",)),
    BlockLayout("Q2_K", 10, QK_K, _packed(("scales", QK_K // 16, "scales"), ("qs", QK_K // 4, "codes"),
                                          ("d", 2, "fp16"), ("dmin", 2, "fp16")),
                group=QK_K // 16, bits=2, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("q8act",)),
    BlockLayout("Q3_K", 11, QK_K, _packed(("hmask", QK_K // 8, "high"), ("qs", QK_K // 4, "codes"),
                                          ("scales", 12, "scales"), ("d", 2, "fp16")),
                group=QK_K // 16, bits=3, code_offset=4, formula="(q − 4)·(d·(sc − 32))", routes=("q8act",)),
    BlockLayout("Q5_K", 13, QK_K, _packed(("d", 2, "fp16"), ("dmin", 2, "fp16"), ("scales", 12, "scales"),
                                          ("qh", QK_K // 8, "high"), ("qs", QK_K // 2, "codes")),
                group=QK, bits=5, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("q8act",)),
    BlockLayout("IQ4_NL", 20, QK, _packed(("d", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="book[q]·d", codebook=IQ4_BOOK,
                routes=("q8act",)),
    BlockLayout("IQ4_XS", 23, QK_K, _packed(("d", 2, "fp16"), ("scales_h", 2, "scales"), ("scales_l", QK_K // 64, "scales"),
                                            ("qs", QK_K // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="book[q]·(d·(ls − 32))", codebook=IQ4_BOOK,
                routes=("q8act",)),
)}


def formats_taking(route: str) -> tuple[str, ...]:
    """The formats whose records name `route` ("int4", "q8act"), in LAYOUTS' order."""
    return tuple(name for name, layout in LAYOUTS.items() if route in layout.routes)


def _c_struct(layout: BlockLayout, names: list[str]) -> list[str]:
    held = [name for name in names if layout.has(name)]
    lines = [f"struct {layout.name} {{",
             f"  static constexpr int64_t type = {layout.ggml_type}, weights = {layout.weights}, "
             f"bytes = {layout.block_bytes};",
             f"  static constexpr int64_t group = {layout.group}, bits = {layout.bits}, "
             f"code_offset = {layout.code_offset};"]
    lines += [f"  static constexpr int64_t {f.name}_at = {f.offset}, {f.name}_size = {f.size};  // {f.kind}"
              for f in layout.fields]
    if layout.codebook:
        lines.append(f"  static constexpr int8_t book[{len(layout.codebook)}] = {{"
                     + ", ".join(map(str, layout.codebook)) + "};")
    for flag, group in ((True, held), (False, [name for name in names if name not in held])):
        if group:
            value = "true" if flag else "false"
            lines.append("  static constexpr bool " + ", ".join(f"has_{name} = {value}" for name in group) + ";")
    return lines + ["};", ""]


def c_header() -> str:
    """quant_formats.h as LAYOUTS writes it: one struct per format, for the C++ kernels."""
    names = list(dict.fromkeys(f.name for layout in LAYOUTS.values() for f in layout.fields))
    lines = ["// GENERATED from gatherlens/ops/quant/formats/layout.py (LAYOUTS) by `write_c_header()`: do not edit",
             "// (tests/test_quantized_table.py checks it equals what the table writes).",
             "// One struct per GGUF block format, as ggml-common.h lays it out: ggml's type number, the",
             "// weights and bytes of a block, weights per scale, bits per code, the code offset, each",
             "// field's byte offset (<field>_at) and size (<field>_size), and has_<field> for every field",
             "// name of the table.",
             "#pragma once", "", "#include <cstdint>", "", "namespace gatherlens_quant {", ""]
    for layout in LAYOUTS.values():
        lines += _c_struct(layout, names)
    return "\n".join(lines + ["}  // namespace gatherlens_quant", ""])


def write_c_header() -> Path:
    """Write quant_formats.h from LAYOUTS (after a record changes; the tests say when)."""
    HEADER.write_text(c_header())
    return HEADER
