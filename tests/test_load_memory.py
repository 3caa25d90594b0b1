"""Loading keeps a file's pages and a weight's copy apart: panels packed a piece at a time, each piece's
pages let go (ops/quant/products/x8.py's `after_packing`, memory.py's `release_pages`)."""
from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

import gatherlens.ops.quant.products.x8 as x8
from gatherlens.memory import release_pages


@pytest.mark.parametrize("qtype", x8.X8_QTYPES)
def test_pack_x8_in_pieces_equals_one_piece(monkeypatch, qtype):
    from gatherlens.ops.quant.formats.layout import LAYOUTS

    raw = torch.randint(0, 256, (40, 3 * LAYOUTS[qtype].block_bytes), dtype=torch.uint8)  # (40, 3 blocks)
    whole = x8.pack_x8(raw, qtype)
    monkeypatch.setattr(x8, "PACK_ROWS", 16)  # 16 + 16 + 8 rows
    seen = []
    with x8.after_packing(lambda rows: seen.append((rows.data_ptr(), rows.shape[0]))):
        pieces = x8.pack_x8(raw, qtype)
    assert torch.equal(pieces, whole) and torch.equal(x8.unpack_x8(pieces, qtype), raw)
    assert [n for _, n in seen] == [16, 16, 8] and seen[0][0] == raw.data_ptr()
    x8.pack_x8(raw, qtype)  # outside the block: nobody is called
    assert len(seen) == 3


def test_release_pages_lets_go_whole_pages_and_keeps_the_bytes(tmp_path):
    path = tmp_path / "f.bin"
    data = np.arange(5 * mmap.PAGESIZE, dtype=np.uint8) * 7
    data.tofile(path)
    mapped = np.memmap(path, mode="c")
    assert int(mapped.sum()) == int(data.sum())  # every page read (resident)
    base = mapped.ctypes.data
    assert release_pages(mapped, base + 100, 3 * mmap.PAGESIZE)  # pages 1 and 2 (page 0 and 3 partly: kept)
    assert np.array_equal(mapped, data)  # read again from the file: the same bytes
    assert not release_pages(mapped, base + 10 * mmap.PAGESIZE, mmap.PAGESIZE)  # outside the mapping
    assert not release_pages(data, data.ctypes.data, 100)  # not a mapping
