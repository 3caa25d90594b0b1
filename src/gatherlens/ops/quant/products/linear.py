"""`F.linear` with a weight held as GGUF blocks: packed once per route, never expanded to float32 for decode.

    >>> weight = pack_linear(raw, "Q4_1")               # raw (N, nb*20) uint8 blocks; route "int4"
    >>> quantized_linear(x, weight).shape               # x (..., K) -> (..., N), x's dtype
    torch.Size([1, 576])
    >>> head = pack_linear(table_raw, "Q8_0", LinearConfig(route="int4"))   # the tied head, two planes

The routes are in matmul.py (their table says what each keeps exact). `naive_quantized_linear`
(linear_naive.py) is the reference with the same signature: the blocks dequantized to float32, then
`F.linear`. With `LinearConfig.prefill_rows` set, an x of at least that many rows takes the "dequant"
route (blocks -> float32 for this call only, bit-equal to the reference; tiled.py): on a 2-core AVX2
machine the int4 kernel is ~2x slower than float32 GEMM from ~128 rows on, while at one row it is the
fastest. A q8act weight whose kernel multiplies several rows of x as a blocked integer GEMM (q8act.cpp,
q8k.cpp) keeps to it where that is faster (its record's `gemm_rows`, measured), x rounded to 8 bits as
in decode.

Fused projections (q|k|v, gate|up) are one weight: blocks are rows, so `torch.cat` the raw rows and
split the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.quant.formats.checks import check_blocks, check_qtype
from gatherlens.ops.backends import Impl, Operator
from gatherlens.ops.quant.products import q8act as _q8act
from gatherlens.ops.quant.products.matmul import ROUTES, makes_panels
from gatherlens.ops.quant.formats.registry import dequantize_rows, format_of
from gatherlens.ops.quant.formats.sizes import SIZES
from gatherlens.ops.quant.products.tiled import tiled_dequant_matmul
from gatherlens.ops.quant.products.x8 import PANEL, pack_x8_parts, unpack_x8
from gatherlens.ops.sparse.geometry import ceil_div

__all__ = ["LinearConfig", "QuantizedWeight", "pack_linear", "pack_apart", "quantized_linear", "split_linear",
           "LINEAR_ROUTES", "linear_product", "LINEAR_PRODUCT", "q8act_ready", "integer_gemm_faster"]

LINEAR_ROUTES = tuple(ROUTES)  # the route names, in matmul.py's order

_X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class LinearConfig:
    """How a quantized weight is packed and multiplied.

    route: one of ROUTES ("int4": PyTorch's CPU int4 kernel on the codes as stored, bf16 arithmetic).
    prefill_rows: x with at least this many rows takes the "dequant" route (unless a q8act weight's
        integer GEMM is faster there: the format record's gemm_rows); None: never.
    """

    route: str = "int4"
    prefill_rows: int | None = 128


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A linear's weight (N, K) as GGUF blocks plus the tensors its route packed from them."""

    qtype: str
    shape: tuple[int, int]  # (N, K): F.linear's weight shape
    raw: torch.Tensor  # (N, nb * block_bytes) uint8: the blocks as stored (the reference reads these), or
    # their shape on the meta device where only the route's panels hold them (`without_raw`): `blocks()` reads either
    tensors: tuple[torch.Tensor, ...]  # the route's packed weight
    planes: int  # int4 routes: 2 when codes over 4 bits are split into two 4-bit planes
    config: LinearConfig

    @property
    def route(self) -> str:
        return self.config.route

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device if self.raw.is_meta else self.raw.device

    @property
    def panels(self) -> torch.Tensor | None:
        """The blocks repacked in panels of 8 rows (N, row_bytes) uint8 (x8.py), or None: the q8act route's one
        tensor, where it made them (a panel format, N a multiple of 8, the kernel built)."""
        return self.tensors[0] if self.route == "q8act" and self.tensors else None

    def blocks(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of the blocks as stored, (n, nb * block_bytes) uint8: a view of `raw`, or unpacked
        from the route's panels (whole panels of 8 rows unpacked, then cut) where only they hold them."""
        stop = self.shape[0] if stop is None else min(stop, self.shape[0])
        if not self.raw.is_meta:
            return self.raw[start:stop]
        first, last = start // PANEL * PANEL, ceil_div(stop, PANEL) * PANEL  # the panels covering the rows
        return unpack_x8(self.panels[first:last], self.qtype)[start - first:stop - first]  # (n, row_bytes)

    def without_raw(self) -> "QuantizedWeight":
        """The same weight with `raw` reduced to its shape (meta device) where the route's panels hold every
        row: a loader's copy of the blocks (rows joined, or un-permuted) need not stay beside its panels."""
        if self.route != "q8act" or not self.tensors or self.raw.is_meta:
            return self
        meta = torch.empty(self.raw.shape, dtype=torch.uint8, device="meta")  # (N, row_bytes)
        return QuantizedWeight(self.qtype, self.shape, meta, self.tensors, self.planes, self.config)

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype its matmul computes x in (bfloat16 for the int4 and bf16 routes): an x already
        in it is not converted again."""
        if self.route in ("int4", "int4_f32", "int4_requant"):
            return self.tensors[1].dtype  # scales_zeros: the kernel's activation dtype
        return torch.bfloat16 if self.route == "bf16" else torch.float32

    def nbytes(self) -> int:
        """Bytes of the packed tensors (what this route keeps beside the blocks)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 (N, K), bit-equal to gguf's `dequantize`."""
        return dequantize_rows(self.blocks(), self.qtype)  # (N, K)


def _check_raw(raw, qtype: str, config: LinearConfig) -> None:
    check_blocks(raw, check_qtype(qtype), "raw")
    if config.route not in ROUTES:
        raise GatherValueError(f"route must be one of {', '.join(map(repr, ROUTES))}, got {config.route!r}")
    route = ROUTES[config.route]
    if qtype not in route.qtypes:
        raise GatherValueError(f"route {config.route!r} takes qtype {', '.join(route.qtypes)}, got {qtype!r}; "
                               f"use route 'bf16' or 'float32' for it")
    if route.cpu_only and raw.device.type != "cpu":
        raise GatherValueError(f"route {config.route!r} runs on the CPU only; raw is on {raw.device}")
    rows = config.prefill_rows
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise GatherValueError(f"prefill_rows must be None or an int >= 1, got {rows!r}")


def pack_linear(raw: torch.Tensor, qtype: str, config: LinearConfig = LinearConfig()) -> QuantizedWeight:
    """Blocks (N, nb * block_bytes) uint8 of a weight (N, K) -> a QuantizedWeight for `config.route`."""
    _check_raw(raw, qtype, config)
    raw = raw if raw.stride(-1) == 1 else raw.contiguous()  # a strided view of blocks (a transpose): its bytes in order
    elems, nbytes = SIZES[qtype]
    shape = (raw.shape[0], raw.shape[1] // nbytes * elems)  # (N, K)
    tensors, planes = ROUTES[config.route].pack(raw, qtype)
    return QuantizedWeight(qtype, shape, raw, tuple(tensors), planes, config)


def pack_apart(raws: list[torch.Tensor], qtype: str, config: LinearConfig = LinearConfig()) -> QuantizedWeight:
    """pack_linear(torch.cat(raws), qtype, config) for the rows of weights that lie apart (q, k and v in a GGUF file),
    without their joined copy where the route packs them in panels (each part's N a multiple of 8): every part
    packed into its rows of one panel tensor (x8.py's `pack_x8_parts`), `raw` the joined shape on the meta device
    (as `without_raw` leaves it). Else the joined copy, packed. Gemma 3 1B's load: 41 joined copies of 0.08 s."""
    if config.route == "q8act" and len({r.shape[1] for r in raws}) == 1 and all(makes_panels(r, qtype) for r in raws):
        for r in raws:
            _check_raw(r, qtype, config)
        elems, nbytes = SIZES[qtype]
        rows, width = sum(r.shape[0] for r in raws), raws[0].shape[1]
        meta = torch.empty((rows, width), dtype=torch.uint8, device="meta")  # (sum N, row_bytes)
        return QuantizedWeight(qtype, (rows, width // nbytes * elems), meta, (pack_x8_parts(raws, qtype),), 1, config)
    return pack_linear(torch.cat(raws), qtype, config)


_SHARED_ROWS = 64  # the int4 packing interleaves rows within blocks of at most 64 (AVX512's BLOCK_N)


def _part(weight: QuantizedWeight, start: int, stop: int) -> QuantizedWeight:
    """Rows start:stop of a packed weight, sharing its packed rows where the layout allows."""
    raw = weight.raw[start:stop]  # (n, row_bytes): a view (of the meta shape where only panels hold the blocks)
    shape = (stop - start, weight.shape[1])
    route = weight.route
    if route in ("int4", "int4_f32", "int4_requant") and start % _SHARED_ROWS == 0 and stop % _SHARED_ROWS == 0:
        packed, scales_zeros = weight.tensors  # (N', K'/2), (K'/32, N', 2)
        tensors = (packed[start:stop], scales_zeros[:, start:stop].contiguous())  # a view, a small copy
    elif route in ("bf16", "float32"):
        tensors = (weight.tensors[0][start:stop],)  # (n, K): a view
    elif route == "q8act" and weight.tensors and start % PANEL == 0 and stop % PANEL == 0:
        tensors = (weight.tensors[0][start:stop],)  # whole panels of 8 rows: a view
    elif route in ("dequant", "q8act"):
        tensors = ()  # rows cut inside a panel read their blocks as stored
        raw = weight.blocks(start, stop) if raw.is_meta else raw  # (n, row_bytes): unpacked from the panels
    else:
        return pack_linear(raw, weight.qtype, weight.config)  # packed again for these rows
    return QuantizedWeight(weight.qtype, shape, raw, tensors, weight.planes, weight.config)


def split_linear(weight: QuantizedWeight, sizes) -> list[QuantizedWeight]:
    """A fused weight (q|k|v, gate|up) -> one QuantizedWeight per part of `sizes` rows, each equal
    to `pack_linear` of its rows (tested) and sharing the fused weight's memory where it can.

        >>> q, k, v = split_linear(pack_linear(torch.cat([q_raw, k_raw, v_raw]), "Q4_1"), (576, 192, 192))
    """
    sizes = [int(n) for n in sizes]
    if sum(sizes) != weight.shape[0] or min(sizes, default=0) < 1:
        raise GatherValueError(f"sizes must be positive and sum to the weight's {weight.shape[0]} rows, got {sizes}")
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    return [_part(weight, end - n, end) for n, end in zip(sizes, ends)]


def _check_x(x, weight) -> None:
    if not isinstance(weight, QuantizedWeight):
        raise GatherTypeError(f"weight must be a QuantizedWeight (from pack_linear), got {type(weight).__name__}")
    if not isinstance(x, torch.Tensor):
        raise GatherTypeError(f"x must be a torch.Tensor (..., K), got {type(x).__name__}")
    if x.dtype not in _X_DTYPES:
        raise GatherTypeError(f"x must be float32, bfloat16 or float16, got dtype {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise GatherValueError(f"x must be (..., K) with K = {weight.shape[1]} (the weight's in-features), "
                               f"got shape {tuple(x.shape)}")
    if x.device != weight.device:
        raise GatherValueError(f"x is on {x.device} but the weight is on {weight.device}; move one of them")


def quantized_linear(x: torch.Tensor, weight: QuantizedWeight, backend: str = "auto") -> torch.Tensor:
    """y = x @ W.T for W held as blocks: x (..., K) -> (..., N), in x's dtype (no bias).
    backend: a row of LINEAR_PRODUCT ("prefill", "q8act", "packed", "dequant"), default the first that fits."""
    _check_x(x, weight)
    flat = x if x.dim() == 2 else x.reshape(-1, weight.shape[1])  # (M, K)
    y = linear_product(flat, weight, backend)  # (M, N)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], weight.shape[0])  # (..., N)


def linear_product(x: torch.Tensor, weight: QuantizedWeight, backend: str = "auto") -> torch.Tensor:
    """x (M, K) -> (M, N) in x's dtype, unchecked: the one entrance that picks where a quantized
    product runs (LINEAR_PRODUCT's rows) and runs it; `quantized_linear` calls it after its checks,
    the planned decode step (models/runtime/step.py) directly."""
    return LINEAR_PRODUCT(x, weight, backend=backend)


def q8act_ready(qtype: str | None = None) -> str | None:
    """None when the q8act route can run `qtype` here (the kernel its record names built: q8act.py's
    `kernel_of`), else why not; without a qtype, None when any of the route's kernels built."""
    if qtype is not None:
        return _q8act.ready(qtype)
    reasons = [_q8act.ready(q) for q in _q8act.Q8ACT_QTYPES]
    return None if None in reasons else "; ".join(dict.fromkeys(reasons)) or "no format takes the q8act route"


def integer_gemm_faster(x, weight) -> bool:
    """True where the q8act kernel's blocked integer GEMM is faster than the "prefill" row for x (M, K):
    up to the format record's `gemm_rows` (the prefill's crossover, measured: formats/layout.py), on a
    build whose blocked loop is vectorised (its scalar twin never is)."""
    return (x.shape[0] <= format_of(weight.qtype).gemm_rows and _q8act_fits(x, weight) is None
            and _q8act.kernel_of(weight.qtype).blocked() not in (None, "scalar"))


def _prefill_fits(x, weight) -> str | None:
    rows = weight.config.prefill_rows
    if rows is None or x.shape[0] < rows:
        return "fewer rows than prefill_rows (a decode step)"
    if integer_gemm_faster(x, weight):
        return f"the q8act kernel's integer GEMM is faster for {weight.qtype} at {x.shape[0]} rows"
    return None


def _q8act_fits(x, weight) -> str | None:
    if weight.config.route != "q8act":
        return f"the weight's route is {weight.config.route!r}"
    return q8act_ready(weight.qtype)  # per format: a kernel that did not build sends only its formats on


def _packed_fits(x, weight) -> str | None:
    if weight.route == "q8act":
        return "a q8act weight's panels are the q8act row's (its operator)"
    return None if weight.tensors else f"route {weight.route!r} keeps no packed weight"


# where a quantized product runs: a prefill dequantizes (float32 GEMM, bit-equal to the reference)
# unless the weight's q8act kernel multiplies those rows faster (the record's gemm_rows); a q8act weight
# takes its C++ operator where it built; a packed route its own kernel; else dequant
LINEAR_PRODUCT = Operator("quantized_linear", [
    Impl("prefill", _prefill_fits, tiled_dequant_matmul),  # dequant's product, a large weight in tiles (tiled.py)
    Impl("q8act", _q8act_fits, ROUTES["q8act"].matmul, ready=q8act_ready),
    Impl("packed", _packed_fits, lambda x, weight: ROUTES[weight.route].matmul(x, weight)),
    Impl("dequant", lambda x, weight: None, ROUTES["dequant"].matmul),
])
