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


@pytest.mark.parametrize("qtype", x8.X8_QTYPES)
@pytest.mark.parametrize("blocks", [1, 2, 7])
def test_pack_x8_equals_its_reference_for_any_number_of_blocks(qtype, blocks):
    """x8_pack moves a panel's bytes by its first block's runs, repeated (or the whole panel's, one block): the
    same bytes as the plain twin."""
    from gatherlens.ops.quant.formats.layout import LAYOUTS

    raw = torch.randint(0, 256, (24, blocks * LAYOUTS[qtype].block_bytes), dtype=torch.uint8)  # (24, nb blocks)
    assert torch.equal(x8.pack_x8(raw, qtype), x8.pack_x8_reference(raw, qtype))


def _pages(path, nbytes: int) -> tuple[np.memmap, np.ndarray]:
    data = (np.arange(nbytes, dtype=np.int64) * 7 % 251).astype(np.uint8)
    data.tofile(path)
    return np.memmap(path, mode="c"), data


def test_keep_private_makes_a_mappings_pages_the_processs_own(tmp_path):
    """Pages kept private keep their bytes when the file changes; pages not kept follow the file (a private
    mapping's untouched pages are the file's)."""
    from gatherlens.memory import keep_private

    path = tmp_path / "f.bin"
    mapped, data = _pages(path, 6 * mmap.PAGESIZE)
    kept = torch.from_numpy(mapped[mmap.PAGESIZE + 10: 3 * mmap.PAGESIZE])  # pages 1 and 2
    made = keep_private(kept)
    if made == 0:
        pytest.skip("no MADV_POPULATE_WRITE here (Linux >= 5.14)")
    assert made == 2 * mmap.PAGESIZE and np.array_equal(mapped, data)  # the same bytes
    with open(path, "r+b") as f:
        f.write(bytes(6 * mmap.PAGESIZE))  # the file zeroed under the mapping
    assert np.array_equal(mapped[mmap.PAGESIZE: 3 * mmap.PAGESIZE], data[mmap.PAGESIZE: 3 * mmap.PAGESIZE])  # kept
    assert not mapped[4 * mmap.PAGESIZE:].any()  # the rest follows the file
    assert keep_private(torch.empty(0, dtype=torch.uint8)) == 0


def test_keep_in_place_only_where_a_small_share_of_the_file_is_read_in_place(tmp_path):
    """A model that packs most of its file and reads a little in place keeps that little private (its
    neighbours' let-go pages never come back with it); one that reads much in place keeps the mapping shared."""
    from types import SimpleNamespace

    from gatherlens.models.gguf.quantized import PRIVATE_SHARE, keep_in_place

    pages = 64
    mapped, data = _pages(tmp_path / "m.gguf", pages * mmap.PAGESIZE)
    reader = SimpleNamespace(data=mapped)
    small = int(PRIVATE_SHARE * pages) - 2  # pages read in place: under the share
    few = [torch.from_numpy(mapped[i * mmap.PAGESIZE:(i + 1) * mmap.PAGESIZE]) for i in range(0, 2 * small, 2)]
    made = keep_in_place(reader, [*few, None, torch.from_numpy(data[:10].copy())])  # None and a copy: ignored
    if made == 0:
        pytest.skip("no MADV_POPULATE_WRITE here (Linux >= 5.14)")
    assert made == small * mmap.PAGESIZE
    much = [torch.from_numpy(mapped[: pages // 2 * mmap.PAGESIZE])]
    assert keep_in_place(reader, much) == 0  # half the file read in place: the mapping stays shared
    assert np.array_equal(mapped, data)


@pytest.mark.parametrize("qtype", x8.X8_QTYPES)
def test_weights_packed_apart_equal_their_joined_copy_packed(qtype):
    """pack_apart: q, k and v whose rows lie apart packed into one panel tensor without their joined copy, the
    same panels and the same product as pack_linear of the joined rows; rows not in whole panels: the copy."""
    from gatherlens.ops.quant import LinearConfig, pack_linear, quantized_linear
    from gatherlens.ops.quant.formats.layout import LAYOUTS
    from gatherlens.ops.quant.products.linear import pack_apart

    from test_quantized_q8act import random_blocks

    parts = [random_blocks(qtype, n, 2 * LAYOUTS[qtype].weights, seed=n) for n in (24, 8, 16)]  # (N_i, 2 blocks)
    config = LinearConfig(route="q8act")
    apart, joined = pack_apart(parts, qtype, config), pack_linear(torch.cat(parts), qtype, config)
    assert apart.raw.is_meta and apart.shape == joined.shape and torch.equal(apart.panels, joined.panels)
    x = torch.randn(3, apart.shape[1])  # (3, K)
    assert torch.equal(quantized_linear(x, apart), quantized_linear(x, joined))
    odd = [parts[0][:12], parts[1]]  # 12 rows: not whole panels
    kept = pack_apart(odd, qtype, config)
    assert not kept.raw.is_meta and torch.equal(kept.raw, torch.cat(odd))
