"""A (V, d) table held as rows of GGUF blocks, read in place from the file; rows dequantized on pick.

    >>> table = QuantizedTable.from_gguf(path, "token_embd.weight")      # SmolLM2's tied table
    >>> table.shape, table.qtype, table.row_bytes                        # 612 B a row, not 2304
    (torch.Size([49152, 576]), 'Q8_0', 612)
    >>> table.lookup(torch.tensor([[1, 7, 1]])).shape                    # rows 1 and 7, once each
    torch.Size([1, 3, 576])

`from_gguf` maps the file (numpy memmap, copy-on-write, so nothing is ever written back) and wraps
the tensor's bytes with `torch.from_numpy`: no copy, no float32 anywhere until rows are picked. Every
format of registry.py's `FORMATS` is read so, the plain F32 / F16 / BF16 matrices too (as their bytes).
`embedding_lookup(ids, table)` checks ids exactly as for a dense table and then calls `lookup`.

`reading_rows_from(pick)`: the same table whose lookups take the rows' blocks from `pick(ids)` instead of
`raw`: the same bytes held elsewhere (a tied head's panels), so a prompt's lookups do not pull the mapped
file's pages back in beside them (models/gguf/quantized.py's `panel_rows`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.quant.formats.checks import check_blocks, check_method, check_no_grad, check_qtype
from gatherlens.ops.quant.formats.registry import dequantize_rows, naive_dequantize_rows
from gatherlens.ops.quant.formats.sizes import SIZES

__all__ = ["QuantizedTable"]


@dataclass(frozen=True, eq=False)
class QuantizedTable:
    """Rows of raw blocks `raw` (V, row_bytes) uint8 in format `qtype`; looked up as (V, d) float32."""

    raw: torch.Tensor
    qtype: str
    name: str = ""
    pick: Callable[[torch.Tensor], torch.Tensor] | None = None  # ids (U,) -> their rows of `raw`'s bytes, held
    # elsewhere (`reading_rows_from`); None: lookups index `raw`

    def __post_init__(self):
        check_qtype(self.qtype)
        check_blocks(self.raw, self.qtype, "raw")

    @classmethod
    def from_blocks(cls, blocks, qtype: str, name: str = "") -> "QuantizedTable":
        """From raw blocks (rows, bytes per row) uint8, a numpy array (shared, not copied) or a tensor."""
        check_qtype(qtype)
        raw = torch.from_numpy(blocks) if isinstance(blocks, np.ndarray) else blocks
        return cls(raw, qtype, name)

    @classmethod
    def from_gguf(cls, path, tensor_name: str) -> "QuantizedTable":
        """The 2-D tensor `tensor_name` of the .gguf file at `path`, its blocks mapped in place."""
        from gguf import GGUFReader

        path = Path(path)
        if not path.is_file():
            raise GatherValueError(f"path {str(path)!r} is not a file")
        try:
            reader = GGUFReader(path, mode="c")  # "c": copy-on-write, never written
        except (ValueError, IndexError) as err:  # not a GGUF file, or a damaged one gguf cannot parse
            said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise GatherValueError(f"path {str(path)!r} is not a readable GGUF file ({said})") from None
        return cls.from_reader(reader, tensor_name)

    @classmethod
    def from_reader(cls, reader, tensor_name: str) -> "QuantizedTable":
        """The same from an open `gguf.GGUFReader(path, mode="c")` (whose other fields the caller reads)."""
        tensors = {t.name: t for t in reader.tensors}
        where = Path(str(reader.data.filename)).name
        if tensor_name not in tensors:
            names = ", ".join(list(tensors)[:6]) + (f", … ({len(tensors)} in all)" if len(tensors) > 6 else "")
            raise GatherValueError(f"tensor_name {tensor_name!r} is not in {where}; its tensors: {names}")
        tensor = tensors[tensor_name]
        qtype = tensor.tensor_type.name
        if qtype not in SIZES or len(tensor.shape) != 2:
            raise GatherValueError(f"{tensor_name} in {where} is {qtype} of ggml shape "
                                   f"{[int(n) for n in tensor.shape]}; a QuantizedTable is 2-D in one of "
                                   f"{tuple(SIZES)}")
        data = tensor.data.view(np.uint8)  # (V, row_bytes): gguf maps F32 / F16 as floats, the rest as bytes
        return cls(torch.from_numpy(data), qtype, tensor_name)  # (V, row_bytes), no copy

    # -- what it is -------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """(V, d) in torch order (GGUF lists it as ggml's [d, V])."""
        elems, nbytes = SIZES[self.qtype]
        return torch.Size((self.raw.shape[0], self.raw.shape[1] // nbytes * elems))

    @property
    def row_bytes(self) -> int:
        """Bytes of blocks one row is stored in (612 for a 576-wide Q8_0 row; float32: 2304)."""
        return self.raw.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole table's blocks."""
        return self.raw.shape[0] * self.raw.shape[1]

    @property
    def device(self) -> torch.device:
        return self.raw.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the rows a lookup returns (always float32, as ggml's get_rows)."""
        return torch.float32

    @property
    def requires_grad(self) -> bool:
        return False

    def requires_grad_(self, requires_grad: bool = True) -> "QuantizedTable":
        """Refused (GatherTypeError) when asked for: no gradient flows into integer blocks."""
        check_no_grad(requires_grad)
        return self

    def to(self, device) -> "QuantizedTable":
        """The same blocks on `device` (read from `raw` there)."""
        return QuantizedTable(self.raw.to(device), self.qtype, self.name)

    def reading_rows_from(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> "QuantizedTable":
        """This table, its lookups reading row blocks from `pick(ids)` ((U,) int64 -> (U, row_bytes) uint8, equal
        to `raw[ids]`) rather than from `raw`."""
        return replace(self, pick=pick)

    # -- reading it ---------------------------------------------------------------------------
    def dequantize(self) -> torch.Tensor:
        """The whole table as (V, d) float32 (what a dense copy costs: 4 bytes a weight)."""
        return dequantize_rows(self.raw, self.qtype)  # (V, d)

    def lookup(self, ids: torch.Tensor, method: str = "fast") -> torch.Tensor:
        """Rows `ids` (any shape) as float32 (*ids.shape, d); each distinct row dequantized once.

        Unchecked ids (`embedding_lookup` checks them); `method`: "fast" or "naive" (per block).
        """
        check_method(method)
        flat = ids.reshape(-1)  # (N,)
        unique, inverse = flat, None  # one id: its row
        if flat.numel() > 1:
            unique, inverse = torch.unique(flat, return_inverse=True)  # (U,), (N,)
        blocks = self.raw.index_select(0, unique) if self.pick is None else self.pick(unique)  # (U, row_bytes): the
        # only bytes read
        decode = dequantize_rows if method == "fast" else naive_dequantize_rows
        rows = decode(blocks, self.qtype)  # (U, d) float32
        if inverse is not None:
            rows = rows.index_select(0, inverse)  # (N, d)
        return rows.view(*ids.shape, rows.shape[1])  # (*ids.shape, d)

    def bytes_read(self, ids: torch.Tensor) -> int:
        """Bytes of blocks a lookup of `ids` reads: each distinct row's blocks, once."""
        return torch.unique(ids).numel() * self.row_bytes

    def __repr__(self) -> str:
        name = f"{self.name!r}, " if self.name else ""
        return (f"QuantizedTable({name}{self.qtype}, shape={tuple(self.shape)}, "
                f"{self.row_bytes} B a row, device={self.device})")
