"""The "q8act" route's kernels: llama.cpp's CPU matmuls on the weight read as its GGUF blocks, x
quantized to 8 bits per block, the dot products in integers; and the plain float formats read as stored.

    >>> if ready("Q4_1") is None:
    ...     y = q8act_matmul(x, raw, "Q4_1")        # x (M, K) float32, raw (N, row_bytes) -> (M, N)

A format's record names the operator that runs it (`kernel`, layout.py); `KERNELS` holds each
operator's kernel, `kernel_of(qtype)` the one of a format (each kernel takes its formats' type
numbers, block bytes and field offsets, and its dispatch the list of its formats, from
quant_formats.h, generated from layout.py):

| formats                                        | kernel       | x rounded to              |
|------------------------------------------------|--------------|---------------------------|
| 32-weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) | q8act.cpp (`block_matmul`) | 8 bits per 32 values |
| 256-weight super-blocks (K-quants, IQ4_XS)     | q8k.cpp (q8k.py's `q8k_matmul`) | 8 bits per 256 values |
| plain floats (F32, F16, BF16)                  | floatdot.cpp (floatdot.py's `float_matmul`) | not at all (float32) |

A 32-value block of a row of x becomes dx = max|x| / 127 and codes qx = round(x / dx); a weight
block (scale d, min m) contributes d dx sum(q qx) + m dx sum(qx) (signed values v: d dx sum(v qx)).
The only rounding beyond float32's is x's to 8 bits (as llama.cpp rounds it); `q8act_reference`
(q8act_naive.py) computes the same sums in float64 and the tests compare with it and with the float
reference. The route takes the formats whose records name it (`Q8ACT_QTYPES`); `ready(qtype)` says
whether that format's kernel built, so a kernel that did not build sends only its formats elsewhere.
No packed copy of the weight at all. x of several rows (a prefill) runs q8act.cpp's and q8k.cpp's
blocked integer GEMM (each weight block decoded once per call, tiles of x in registers; q8_panels.h);
`Kernel.blocked()` says which instructions it runs, and the record's `gemm_rows` up to where it beats
dequantizing for float32 GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.native import load_library
from gatherlens.ops.quant.formats.layout import KERNEL_OPS, LAYOUTS, QK, QK_K, formats_run_by, formats_taking
from gatherlens.ops.quant.products import floatdot, q8k
from gatherlens.ops.quant.products.q8act_naive import q8act_reference
from gatherlens.ops.quant.products.q8k_naive import q8k_reference

__all__ = ["Q8ACT_QTYPES", "BLOCK_QTYPES", "KERNELS", "kernel_of", "Kernel", "kernel_loaded", "ready",
           "q8act_matmul", "block_matmul", "KERNEL", "blocked_simd"]

KERNEL = Path(__file__).with_name("q8act.cpp")
Q8ACT_QTYPES = formats_taking("q8act")  # the formats whose records name this route
BLOCK_QTYPES = formats_run_by("q8act_linear")  # q8act.cpp's formats (the 32-weight blocks)


def kernel_loaded() -> bool:
    """True once `gatherlens::q8act_linear` (the 32-weight blocks) is registered (built on first use)."""
    return load_library(KERNEL, on_load=register_fakes)


SIMD = ("scalar", "avx2", "vnni")  # q8act.cpp's blocked loop, by `gatherlens::q8act_simd()`


@cache
def blocked_simd() -> str | None:
    """The instructions of q8act.cpp's blocked loop (x of several rows) in this build: "vnni" (AVX512-VNNI
    or AVX-VNNI), "avx2", or "scalar" (its plain twin: no AVX2); None where the operator did not build."""
    return SIMD[torch.ops.gatherlens.q8act_simd()] if kernel_loaded() else None


def register_fakes() -> None:
    torch.library.register_fake("gatherlens::q8act_linear", fake_q8act_linear)
    torch.library.register_fake("gatherlens::x8_pack", fake_x8_pack)


def fake_q8act_linear(x, raw, qtype):
    return x.new_empty(x.shape[0], raw.shape[0])


def fake_x8_pack(raw, order, out):
    return None  # writes out in place (x8.py's pack_x8)


def block_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for 32-weight blocks raw (N, row_bytes) of `qtype` (BLOCK_QTYPES). Unchecked."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()  # (M, K)
    return torch.ops.gatherlens.q8act_linear(x, raw, LAYOUTS[qtype].ggml_type)  # (M, N)


@dataclass(frozen=True)
class Kernel:
    """One kernel of the route: its source, whether it loaded, its matmul (x, raw, qtype) -> (M, N)
    float32, its plain reference (same signature, float64 sums), the values of x it rounds to
    8 bits together (0: x is not rounded), its operator's name (`torch.ops.gatherlens.<op>(x, raw,
    ggml type)`: what native callers such as ops/layer's decode_stack call), and the instructions of
    its blocked loop for x of several rows (`blocked()`: "vnni", "avx2", "scalar"; None: it has none,
    or did not build)."""

    source: str
    loaded: Callable[[], bool]
    matmul: Callable
    reference: Callable
    x_block: int
    op: str
    blocked: Callable[[], str | None]


_BLOCKS = Kernel(KERNEL.name, kernel_loaded, block_matmul, q8act_reference, QK, "q8act_linear", blocked_simd)
_SUPER = Kernel(q8k.KERNEL.name, q8k.kernel_loaded, q8k.q8k_matmul, q8k_reference, QK_K, "q8k_linear",
                q8k.blocked_simd)
_FLOATS = Kernel(floatdot.KERNEL.name, floatdot.kernel_loaded, floatdot.float_matmul, floatdot.float_reference, 0,
                 "floatdot_linear", lambda: None)
# each operator's kernel, by the name a record's `kernel` gives (the formats name their operator)
KERNELS = {kernel.op: kernel for kernel in (_BLOCKS, _SUPER, _FLOATS)}
assert tuple(KERNELS) == KERNEL_OPS, "every operator a record may name needs its kernel here"
assert all(LAYOUTS[q].weights == QK_K for q in q8k.Q8K_QTYPES), "q8k takes the 256-weight super-blocks"
assert all(LAYOUTS[q].weights == QK for q in BLOCK_QTYPES), "q8act.cpp takes the 32-weight blocks"


def kernel_of(qtype: str) -> Kernel:
    """The kernel that multiplies `qtype` as stored (its record's `kernel`); a format the route does not
    take, or an unknown one, is a GatherValueError naming it."""
    op = LAYOUTS[qtype].kernel if qtype in LAYOUTS else ""
    if not op:
        raise GatherValueError(f"no kernel of the q8act route takes {qtype!r}; it takes {', '.join(Q8ACT_QTYPES)}")
    return KERNELS[op]


def ready(qtype: str) -> str | None:
    """None when the kernel of `qtype` built here, else why it cannot run (its formats fall back)."""
    if qtype not in Q8ACT_QTYPES:
        return f"no kernel of the q8act route takes {qtype}"
    kernel = kernel_of(qtype)
    return None if kernel.loaded() else f"its C++ operator ({kernel.source}) did not build (see the warning)"


def q8act_matmul(x: torch.Tensor, raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """x (M, K) -> (M, N) float32 for the blocks raw (N, row_bytes) of `qtype`, by its kernel. Unchecked."""
    return kernel_of(qtype).matmul(x, raw, qtype)  # (M, N)
