"""The facts of every GGUF block format this package reads, one record each (ggml's struct in
`ggml-common.h` plus its row of ggml's type traits): the lowest module of ops/quant, importing none.

    >>> LAYOUTS["Q4_1"].field("m")                      # the fp16 min, bytes [2, 4) of a block
    Field(name='m', offset=2, size=2, kind='fp16')
    >>> LAYOUTS["Q4_1"].weights, LAYOUTS["Q4_1"].block_bytes, LAYOUTS["Q4_1"].ggml_type
    (32, 20, 3)
    >>> formats_taking("int4")                          # the formats a restricted route takes
    ('Q8_0', 'Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q4_K')
    >>> LAYOUTS["Q4_1"].kernel, LAYOUTS["Q4_1"].panels, LAYOUTS["F16"].gemm_rows
    ('q8act_linear', True, 0)

Each record (`BlockLayout`) holds the name (ggml's), ggml's type number, the weights of one block,
its fields in block order (name, byte offset, size, kind; offsets follow from the sizes: ggml's
structs have no padding, so block_bytes is where the last field ends), the weights per scale group
(blocks, or K-quant sub-blocks), the bits of one code, the code offset (w = (q - offset) * scale
+ shift), the formula the picture prints, and `routes`: the restricted kernels that take the blocks
as stored ("int4": matmul.py's int4 and int4_f32 routes; "q8act"); every other route takes any
format. The q8act route's facts: `kernel`, the operator that multiplies the blocks as stored;
`panels`, whether they are repacked in panels of 8 rows for the decode product (`PANEL_OP`,
products/x8.py); `gemm_rows`, up to how many rows of x that kernel's blocked integer GEMM beats
dequantizing for float32 GEMM (measured; 0: never). A plain float format names the torch dtype of
its stored values (`value_dtype`). registry.py attaches each format's functions to its record
(`FORMATS`); every other module reads these records (no other table keyed by format), and
`c_header()` writes them for the C++ kernels (quant_formats.h, written by `write_c_header()`; the
tests check it): one struct per format and, per operator, the X-macro list of the formats it takes,
which the kernels' dispatch expands. Adding a format: one record here, its kernels, one row in
registry.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Field", "BlockLayout", "LAYOUTS", "QK", "QK_K", "KINDS", "SCALE_KINDS", "formats_taking",
           "formats_run_by", "KERNEL_OPS", "PANEL_OP", "c_header", "write_c_header", "HEADER", "IQ4_BOOK"]

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
# the q8act route's operators (torch.ops.gatherlens.<op>(x, raw, ggml type)): a record's `kernel` is one
KERNEL_OPS = ("q8act_linear", "q8k_linear", "floatdot_linear")
PANEL_OP = "q8x8_linear"  # the decode product on blocks repacked in panels of 8 rows (products/x8.py)
# The prefill's crossover (a record's `gemm_rows`), measured: the kernel's blocked integer GEMM
# (q8act.cpp, q8k.cpp: x rounded to 8 bits) beats dequantizing to float32 + float32 GEMM up to this
# many rows of x (`gatherlens bench qlinear --gguf synthetic --qtype Q --routes q8act,dequant`:
# SmolLM2's shapes, the K-quants its 1536-wide down projection; M = 32 .. 1024; AMD Zen 3, AVX2, one
# thread: the 4- and 5-bit formats and the K-quants 1.2-10x, at least even at every M; Q8_0's signed
# bytes cost the AVX2 loop twice the work: 1.1-3x up to 256 rows, 0.8-1.15x beyond, where the exact
# float product is kept; two threads on the shared machine: the integer GEMM ahead at every M). Q8_0
# takes it at every M since: its panels' blocked GEMM prefilled Qwen2.5 0.5B Q8_0's 4K prompt (chunks of
# 512) in 20.1 s against 21.2-21.4 s dequantized (Xeon, AVX-512 VNNI, two threads), and the float route
# read the weights from the mapped file beside their panels: peak RSS 966 MB against 1,140. The plain
# floats (no blocked loop) never take it: 0.
ALWAYS = math.inf


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
    kernel: str = ""  # the q8act route's operator for these blocks (one of KERNEL_OPS); "" without the route
    panels: bool = False  # repacked in panels of 8 rows for the decode product (PANEL_OP)
    gemm_rows: float = 0  # the kernel's blocked integer GEMM is faster up to this many rows of x; 0: never
    value_dtype: torch.dtype | None = None  # a plain float format: the dtype a stored value is

    def __post_init__(self):
        if ("q8act" in self.routes) != (self.kernel in KERNEL_OPS):
            raise ValueError(f"{self.name}: a record names the q8act route exactly when it names its kernel "
                             f"(one of {KERNEL_OPS}); got routes {self.routes}, kernel {self.kernel!r}")
        if (self.value_dtype is not None) != (self.fields[0].kind == "value"):
            raise ValueError(f"{self.name}: value_dtype goes with a field of kind 'value', and only there")

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
                group=QK, bits=8, code_offset=0, formula="q·d", routes=("int4", "q8act"), kernel="q8act_linear",
                panels=True, gemm_rows=ALWAYS),
    BlockLayout("Q4_0", 2, QK, _packed(("d", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=8, formula="(q − 8)·d", routes=("int4", "q8act"), kernel="q8act_linear",
                panels=True, gemm_rows=ALWAYS),
    BlockLayout("Q4_1", 3, QK, _packed(("d", 2, "fp16"), ("m", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="q·d + m", routes=("int4", "q8act"), kernel="q8act_linear",
                panels=True, gemm_rows=ALWAYS),
    BlockLayout("Q5_0", 6, QK, _packed(("d", 2, "fp16"), ("qh", QK // 8, "high"), ("qs", QK // 2, "codes")),
                group=QK, bits=5, code_offset=16, formula="(q − 16)·d", routes=("int4", "q8act"), kernel="q8act_linear",
                panels=True, gemm_rows=ALWAYS),
    BlockLayout("Q5_1", 7, QK, _packed(("d", 2, "fp16"), ("m", 2, "fp16"), ("qh", QK // 8, "high"),
                                       ("qs", QK // 2, "codes")),
                group=QK, bits=5, code_offset=0, formula="q·d + m", routes=("int4", "q8act"), kernel="q8act_linear",
                panels=True, gemm_rows=ALWAYS),
    BlockLayout("Q4_K", 12, QK_K, _packed(("d", 2, "fp16"), ("dmin", 2, "fp16"), ("scales", 12, "scales"),
                                          ("qs", QK_K // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("int4", "q8act"),
                kernel="q8k_linear", gemm_rows=ALWAYS),
    BlockLayout("Q6_K", 14, QK_K, _packed(("ql", QK_K // 2, "codes"), ("qh", QK_K // 4, "high"),
                                          ("scales", QK_K // 16, "scales"), ("d", 2, "fp16")),
                group=QK_K // 16, bits=6, code_offset=32, formula="(q − 32)·(d·sc)", routes=("q8act",),
                kernel="q8k_linear", gemm_rows=ALWAYS),
    BlockLayout("F32", 0, 1, _packed(("v", 4, "value")), group=1, bits=32, code_offset=0, formula="w (float32)",
                routes=("q8act",), kernel="floatdot_linear", value_dtype=torch.float32),
    BlockLayout("F16", 1, 1, _packed(("v", 2, "value")), group=1, bits=16, code_offset=0, formula="w (float16)",
                routes=("q8act",), kernel="floatdot_linear", value_dtype=torch.float16),
    BlockLayout("BF16", 30, 1, _packed(("v", 2, "value")), group=1, bits=16, code_offset=0, formula="w (bfloat16)",
                routes=("q8act",), kernel="floatdot_linear", value_dtype=torch.bfloat16),
    BlockLayout("Q2_K", 10, QK_K, _packed(("scales", QK_K // 16, "scales"), ("qs", QK_K // 4, "codes"),
                                          ("d", 2, "fp16"), ("dmin", 2, "fp16")),
                group=QK_K // 16, bits=2, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("q8act",),
                kernel="q8k_linear", gemm_rows=ALWAYS),
    BlockLayout("Q3_K", 11, QK_K, _packed(("hmask", QK_K // 8, "high"), ("qs", QK_K // 4, "codes"),
                                          ("scales", 12, "scales"), ("d", 2, "fp16")),
                group=QK_K // 16, bits=3, code_offset=4, formula="(q − 4)·(d·(sc − 32))", routes=("q8act",),
                kernel="q8k_linear", gemm_rows=ALWAYS),
    BlockLayout("Q5_K", 13, QK_K, _packed(("d", 2, "fp16"), ("dmin", 2, "fp16"), ("scales", 12, "scales"),
                                          ("qh", QK_K // 8, "high"), ("qs", QK_K // 2, "codes")),
                group=QK, bits=5, code_offset=0, formula="q·(d·sc) − dmin·m", routes=("q8act",),
                kernel="q8k_linear", gemm_rows=ALWAYS),
    BlockLayout("IQ4_NL", 20, QK, _packed(("d", 2, "fp16"), ("qs", QK // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="book[q]·d", codebook=IQ4_BOOK,
                routes=("q8act",), kernel="q8act_linear", panels=True, gemm_rows=ALWAYS),
    BlockLayout("IQ4_XS", 23, QK_K, _packed(("d", 2, "fp16"), ("scales_h", 2, "scales"), ("scales_l", QK_K // 64, "scales"),
                                            ("qs", QK_K // 2, "codes")),
                group=QK, bits=4, code_offset=0, formula="book[q]·(d·(ls − 32))", codebook=IQ4_BOOK,
                routes=("q8act",), kernel="q8k_linear", gemm_rows=ALWAYS),
)}


def formats_taking(route: str) -> tuple[str, ...]:
    """The formats whose records name `route` ("int4", "q8act"), in LAYOUTS' order."""
    return tuple(name for name, layout in LAYOUTS.items() if route in layout.routes)


def formats_run_by(op: str) -> tuple[str, ...]:
    """The formats the operator `op` takes (one of KERNEL_OPS: the records naming it; PANEL_OP: the
    records with panels), in LAYOUTS' order."""
    if op == PANEL_OP:
        return tuple(name for name, layout in LAYOUTS.items() if layout.panels)
    if op not in KERNEL_OPS:
        raise ValueError(f"op must be one of {', '.join((*KERNEL_OPS, PANEL_OP))}, got {op!r}")
    return tuple(name for name, layout in LAYOUTS.items() if layout.kernel == op)


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


def _c_lists() -> list[str]:
    """Per operator, the X-macro list of the formats it takes and their names for its error message."""
    lines = ["// Per operator, the formats it takes (the records' `kernel`; `panels` for q8x8_linear), as an",
             "// X-macro for its dispatch, and as words for its error:",
             "//   #define CASE(F) case gatherlens_quant::F::type: return linear<gatherlens_quant::F>(x, raw);",
             "//   switch (qtype) { GATHERLENS_Q8ACT_LINEAR_FORMATS(CASE) }",
             "//   TORCH_CHECK(false, \"qtype must be \", gatherlens_quant::q8act_linear_formats, \", got \", qtype);"]
    for op in (*KERNEL_OPS, PANEL_OP):
        lines.append(f"#define GATHERLENS_{op.upper()}_FORMATS(X) " + " ".join(f"X({q})" for q in formats_run_by(op)))
    lines += ["", "namespace gatherlens_quant {", ""]
    for op in (*KERNEL_OPS, PANEL_OP):
        words = [f"{LAYOUTS[q].ggml_type} ({q})" for q in formats_run_by(op)]
        said = ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)
        lines.append(f'inline constexpr char {op}_formats[] = "{said}";')
    return lines + ["", "}  // namespace gatherlens_quant", ""]


def c_header() -> str:
    """quant_formats.h as LAYOUTS writes it: one struct per format, and each operator's list of formats,
    for the C++ kernels."""
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
    return "\n".join(lines + ["}  // namespace gatherlens_quant", "", *_c_lists()])


def write_c_header() -> Path:
    """Write quant_formats.h from LAYOUTS (after a record changes; the tests say when)."""
    HEADER.write_text(c_header())
    return HEADER
