"""WindowRing (ops/sparse/ring.py): a local layer's last `window` tokens in a ring of slots stored as pages,
against the plain list of every token: prefill chunks of any size, one-token writes, dense attention over
the ring equal to attention over the last `window` tokens in position order."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse.decode import decode_pages
from gatherlens.ops.sparse.config import OP
from gatherlens.ops.sparse.ring import WindowRing


def _tokens(n: int, seed: int, H: int = 2, D: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, H, n, D, generator=g), torch.randn(1, H, n, D, generator=g)  # (1, H, n, D) x2


def _slots_hold(ring: WindowRing, keys: torch.Tensor) -> None:
    """Every held slot s holds the newest position p < length with p % window == s."""
    L, W = ring.position, ring.window
    held = ring.pages.keys  # (1, H, held, D) in slot order
    assert held.shape[2] == min(L, W)
    for s in range(held.shape[2]):
        p = max(q for q in range(L) if q % W == s)
        assert torch.equal(held[:, :, s], keys[:, :, p]), (s, p)


@settings(max_examples=25, deadline=None)
@given(window=st.integers(1, 11), page_size=st.integers(1, 5), chunks=st.lists(st.integers(1, 14), min_size=1,
                                                                              max_size=5))
def test_prefill_chunks_keep_the_window(window, page_size, chunks):
    keys, values = _tokens(sum(chunks), seed=window * 31 + page_size)
    ring = WindowRing(window, 1, 2, 8, page_size=page_size)
    at = 0
    for n in chunks:
        k, v = ring.append(keys[:, :, at:at + n], values[:, :, at:at + n])
        past = min(at, window - 1)
        assert torch.equal(k, keys[:, :, at - past:at + n]) and torch.equal(v, values[:, :, at - past:at + n])
        at += n
        _slots_hold(ring, keys)
    assert ring.length == at and ring.held == min(at, window) and ring.slot == at % window


@pytest.mark.parametrize("window,page_size", [(5, 2), (8, 4), (1, 3)])
def test_one_token_writes_and_dense_reads(window, page_size):
    """Tokens written one by one through begin_write / end_write (as the planned step writes them): the slots
    hold the window, and dense attention over the pages (any order) equals attention over the last window
    tokens in position order, up to the order of the sum."""
    keys, values = _tokens(3 * window + 2, seed=window)
    ring = WindowRing(window, 1, 2, 8, page_size=page_size)
    ring.append(keys[:, :, :2], values[:, :, :2])
    q = torch.randn(1, 4, 1, 8)  # (1, Hq, 1, D): two query heads a KV head
    for p in range(2, keys.shape[2]):
        ring.begin_write().append(keys[:, :, p:p + 1], values[:, :, p:p + 1])
        ring.end_write()
        _slots_hold(ring, keys)
        out = decode_pages(q, ring.pages, ring.held, OP.choice, 0.3)[2]  # (1, Hq, 1, D): every page
        lo = max(0, p + 1 - window)
        k = keys[:, :, lo:p + 1].repeat_interleave(2, dim=1)  # (1, Hq, n, D)
        v = values[:, :, lo:p + 1].repeat_interleave(2, dim=1)
        ref = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v  # (1, Hq, 1, D)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_int8_rings_store_float16_and_bad_windows_are_refused():
    assert WindowRing(4, 1, 1, 8, kv_dtype="int8").pages.kv_dtype == torch.float16
    with pytest.raises(GatherValueError, match="window = 0"):
        WindowRing(0, 1, 1, 8)
