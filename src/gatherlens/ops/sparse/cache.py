"""A paged KV cache that keeps, per page, the element-wise min and max of its keys (Quest).

    >>> cache = PagedKVCache(batch=1, kv_heads=8, head_dim=128, page_size=16)
    >>> cache.append(k, v)                 # k, v: (B, Hkv, T, D); any T, any number of calls
    >>> cache.length, cache.num_pages      # tokens stored, pages in use (the last may be partial)
    >>> cache.key_max.shape                # (B, Hkv, num_pages, D): the page summaries
    >>> PagedKVCache(1, 1, head_dim=192, value_dim=128)   # latent attention: values Dv wide

Storage is preallocated in pages, (B, Hkv, capacity_pages, page_size, D) for keys (Dv for
values), and grows by
doubling, so `append` costs O(T) amortized. The summaries of only the pages an append touches
are updated (at most ceil(T / page_size) + 1 pages); the whole cache is never rescanned.
The summaries bound every score in a page: for any query q and any key k in page p,
    q . k <= sum_d max(q_d * min_pd, q_d * max_pd)
(see `page_choice.page_bounds`), which is what lets decode skip pages without reading them.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError

from .config import OP
from .geometry import page_count

__all__ = ["PagedKVCache"]


class PagedKVCache:
    r"""Keys and values in pages of ``page_size`` tokens, with each page's key min and max (Quest).

    Inference storage: appended keys and values are copied detached (no autograd through the
    cache; gradients of :func:`sparse_decode` flow to the query only). Storage is preallocated
    in whole pages and grows by doubling; ``append`` updates only the summaries of the pages it
    touches.

    Args:
        batch (int): ``B`` of every append.
        kv_heads (int): ``Hkv``, key/value heads.
        head_dim (int): ``D``, the width of keys (and queries).
        page_size (int): tokens per page, the unit decode selects and reads. Default: 16.
        dtype (torch.dtype): storage dtype of keys and values (floating). Default: float32.
        device (torch.device or str, optional): where the storage lives. Default: CPU.
        capacity (int, optional): tokens to preallocate (rounded up to whole pages).
        summary_dtype (torch.dtype, optional): dtype of the page min/max (exact copies of key
            values). Default: the cache dtype, but float32 for 16-bit caches on CPU, where
            half-precision matmuls are slow.
        value_dim (int, optional): ``Dv``, the width of values, when it differs from the keys'
            (latent attention: ``qk_head_dim != v_head_dim``). Default: ``head_dim``. The
            summaries stay on the keys only.

    Attributes:
        length (int): tokens stored, ``L``; ``num_pages`` (int): pages in use, ``N``.
        keys, values, page_keys, page_values, key_max, key_min, summaries (Tensor): views (no
            copies) over the first ``L`` tokens / ``N`` pages; ``summaries`` is
            ``[key_max | key_min]``, the layout scoring reads.

    Methods:
        append(keys, values): add ``T`` tokens; updates only the touched pages' summaries.
        gather_pages(pages): the chosen pages' keys and values, copied into the workspace.
        page_positions(pages): the key position of every row ``gather_pages`` returns.
        truncate(length): keep the first ``length`` tokens (exact summaries).

    Shape:
        - append keys: :math:`(B, H_{kv}, T, D)`, values: :math:`(B, H_{kv}, T, D_v)`, any ``T``
        - keys: :math:`(B, H_{kv}, L, D)`; values: :math:`(B, H_{kv}, L, D_v)`
        - page_keys: :math:`(B, H_{kv}, N, P, D)`; page_values: :math:`(B, H_{kv}, N, P, D_v)`
          (the last page's tail is unused)
        - key_max, key_min: :math:`(B, H_{kv}, N, D)`; summaries: :math:`(B, H_{kv}, N, 2D)`
        - gather_pages: pages :math:`(B, H_{sel}, n)` -> keys :math:`(B, H_{sel}, nP, D)`, values
          :math:`(B, H_{sel}, nP, D_v)`

    Example::

        >>> cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
        >>> cache.append(torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
        >>> cache.length, cache.num_pages, tuple(cache.summaries.shape)
        (10, 3, (1, 2, 3, 16))
    """

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        head_dim: int,
        page_size: int = OP.page_size,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        capacity: int | None = None,
        summary_dtype: torch.dtype | None = None,
        value_dim: int | None = None,
    ):
        value_dim = head_dim if value_dim is None else value_dim
        for name, value in (("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim),
                            ("page_size", page_size), ("value_dim", value_dim)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise GatherTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value <= 0:
                raise GatherValueError(f"{name} = {value} must be >= 1")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)
                                     or capacity < 0):
            raise GatherValueError(f"capacity = {capacity!r} must be an int >= 0 (tokens) or None")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise GatherTypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.batch, self.kv_heads, self.head_dim, self.page_size = batch, kv_heads, head_dim, page_size
        self.value_dim = value_dim
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if summary_dtype is None:  # CPUs without bf16 GEMM score half-precision summaries slowly
            half = dtype in (torch.bfloat16, torch.float16)
            summary_dtype = torch.float32 if half and self.device.type == "cpu" else dtype
        if not isinstance(summary_dtype, torch.dtype) or not summary_dtype.is_floating_point:
            raise GatherTypeError(f"summary_dtype must be a floating torch.dtype, got {summary_dtype!r}")
        self.summary_dtype = summary_dtype
        self.length = 0
        self._work: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows, self._rows_key = None, None  # gather_pages' row offsets, see _first_rows
        self._alloc(max(1, page_count(capacity or page_size, page_size)))
        self.device = self._k.device  # "cuda" -> "cuda:0": the device the storage is on

    # -- storage --------------------------------------------------------------------------------
    def _alloc(self, pages: int) -> None:
        B, H, P, D = self.batch, self.kv_heads, self.page_size, self.head_dim
        kw = dict(dtype=self.dtype, device=self.device)
        k = torch.zeros(B, H, pages, P, D, **kw)  # (B, Hkv, cap, P, D)
        v = torch.zeros(B, H, pages, P, self.value_dim, **kw)  # (B, Hkv, cap, P, Dv)
        s = torch.zeros(B, H, pages, 2 * D, dtype=self.summary_dtype, device=self.device)  # (B, Hkv, cap, 2D)
        used = self.num_pages if hasattr(self, "_k") else 0
        if used:
            k[:, :, :used] = self._k[:, :, :used]
            v[:, :, :used] = self._v[:, :, :used]
            s[:, :, :used] = self._s[:, :, :used]
        self._k, self._v, self._s = k, v, s

    @property
    def capacity(self) -> int:
        """Tokens the current storage holds before it must grow."""
        return self._k.shape[2] * self.page_size

    @property
    def num_pages(self) -> int:
        return page_count(self.length, self.page_size)

    def __len__(self) -> int:
        return self.length

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` tokens in total (no-op if there is room already)."""
        need = page_count(tokens, self.page_size)
        if need > self._k.shape[2]:
            self._alloc(max(need, 2 * self._k.shape[2]))

    # -- writing --------------------------------------------------------------------------------
    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append T tokens: keys (B, Hkv, T, D), values (B, Hkv, T, Dv). Updates only the touched
        pages' summaries."""
        self._check(keys, "keys", self.head_dim)
        self._check(values, "values", self.value_dim)
        if keys.shape[:3] != values.shape[:3]:
            raise GatherValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must have the same shape in "
                f"(B, Hkv, T)")
        T = keys.shape[2]
        if T == 0:
            return
        if T == 1:
            return self._append_one(keys, values)
        L0, L1, P = self.length, self.length + T, self.page_size
        self.reserve(L1)
        cap = self._k.shape[2]
        flat_k = self._k.view(self.batch, self.kv_heads, cap * P, self.head_dim)  # (B, Hkv, cap*P, D)
        flat_v = self._v.view(self.batch, self.kv_heads, cap * P, self.value_dim)  # (B, Hkv, cap*P, Dv)
        flat_k[:, :, L0:L1] = keys.detach()  # the cache stores values, it is not part of a graph
        flat_v[:, :, L0:L1] = values.detach()
        self.length = L1
        # touched pages p0 .. p1-1; re-reduce their valid tokens only (<= T + P - 1 tokens)
        p0, p1 = L0 // P, page_count(L1, P)
        full = L1 // P  # pages p0..full-1 are complete
        D = self.head_dim
        if full > p0:
            pages = self._k[:, :, p0:full]  # (B, Hkv, n, P, D)
            self._s[:, :, p0:full, :D] = pages.amax(dim=3)
            self._s[:, :, p0:full, D:] = pages.amin(dim=3)
        if p1 > full:  # a partial last page: tokens full*P .. L1-1
            tail = flat_k[:, :, full * P:L1]  # (B, Hkv, r, D)
            self._s[:, :, full, :D] = tail.amax(dim=2)
            self._s[:, :, full, D:] = tail.amin(dim=2)

    def _append_one(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """One decode token: two row copies and a running max/min of its page (4 small ops)."""
        L, P, D = self.length, self.page_size, self.head_dim
        self.reserve(L + 1)
        page, slot = divmod(L, P)
        self._k[:, :, page, slot] = keys.detach()[:, :, 0]  # (B, Hkv, D)
        self._v[:, :, page, slot] = values.detach()[:, :, 0]
        s = self._s[:, :, page].view(self.batch, self.kv_heads, 2, D)  # (B, Hkv, [max|min], D)
        k = self._k[:, :, page, slot:slot + 1].to(self.summary_dtype)  # (B, Hkv, 1, D) as stored
        if slot == 0:  # a new page: its box is the one key
            s.copy_(k.expand(-1, -1, 2, -1))
        else:
            torch.maximum(s[:, :, 0], k[:, :, 0], out=s[:, :, 0])
            torch.minimum(s[:, :, 1], k[:, :, 0], out=s[:, :, 1])
        self.length = L + 1

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (assisted decoding's rollback, a benchmark's reset).

        Exact: pages before the new last page were never touched by the dropped tokens; the new
        last page's summary is recomputed from the tokens it keeps.
        """
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise GatherValueError(f"truncate({length!r}): length must be an int in [0, {self.length}]")
        self.length = length
        page, slot = divmod(length, self.page_size)
        if slot:  # the partial last page: its box over its remaining tokens
            kept = self._k[:, :, page, :slot]  # (B, Hkv, slot, D)
            self._s[:, :, page, :self.head_dim] = kept.amax(dim=2)
            self._s[:, :, page, self.head_dim:] = kept.amin(dim=2)

    def _check(self, x, name: str, width: int) -> None:
        if not isinstance(x, torch.Tensor):
            raise GatherTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        want = (self.batch, self.kv_heads, "T", width)
        if x.ndim != 4 or x.shape[0] != self.batch or x.shape[1] != self.kv_heads or x.shape[3] != width:
            dims = "(B, Hkv, T, D)" if name == "keys" else "(B, Hkv, T, Dv)"
            hint = "" if self.value_dim == self.head_dim else \
                f" (keys are head_dim = {self.head_dim} wide, values value_dim = {self.value_dim})"
            raise GatherValueError(
                f"{name} has shape {tuple(x.shape)}; expected {dims} = {want} for this cache{hint}")
        if not x.dtype.is_floating_point:
            raise GatherTypeError(f"{name} must be a floating tensor, got {x.dtype}")

    def workspace(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two reusable buffers, (rows, page_size * D) for keys and (rows, page_size * Dv) for
        values, that decode gathers pages into.

        Kept across steps so each decode writes into warm memory instead of fresh pages of a
        new allocation (which on CPU costs as much as the gather). Not thread-safe: one decode
        per cache at a time.
        """
        have = self._work[0].shape[0] if self._work else 0
        if rows > have:
            n, P = max(rows, 2 * have), self.page_size
            kw = dict(dtype=self.dtype, device=self.device)
            self._work = (torch.empty(n, P * self.head_dim, **kw), torch.empty(n, P * self.value_dim, **kw))
        return self._work[0][:rows], self._work[1][:rows]

    def writable(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Room for `tokens` more tokens, and the whole storage a kernel writes them into in place:
        keys (B, Hkv, cap, P, D), values (B, Hkv, cap, P, Dv), summaries (B, Hkv, cap, 2D).

            >>> keys, values, summaries = cache.writable(1)   # write token cache.length, its page's box
            >>> cache.advance(1)                               # then count it

        The writer must store the tokens at positions length.. and keep their pages' summaries
        exact ([max | min] of the page's keys), as `append` does (ops/layer's rope_append does both).
        """
        self.reserve(self.length + tokens)
        return self._k, self._v, self._s

    def advance(self, tokens: int) -> None:
        """Count `tokens` tokens a kernel wrote through `writable` (their summaries included)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0 \
                or self.length + tokens > self.capacity:
            raise GatherValueError(f"advance({tokens!r}): tokens must be an int in [0, {self.capacity - self.length}] "
                                   f"(the room writable() made)")
        self.length += tokens

    def clear(self) -> None:
        """Forget every token (keeps the storage)."""
        self.length = 0

    # -- reading the chosen pages ---------------------------------------------------------------
    def gather_pages(self, pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chosen pages' keys and values, copied into (B, Hsel, n * P, D) and (..., Dv) tensors.

            >>> k, v = cache.gather_pages(pages)     # pages (B, Hsel, n) -> (B, Hsel, n * P, D | Dv)

        pages: (B, Hsel, n) page ids; Hsel = kv_heads, or a multiple of it (selection head h
        reads KV head h * kv_heads // Hsel). One index_select per tensor, into the reusable
        `workspace`: the results are valid until the next gather on this cache. Rows of the last
        page at positions >= length hold stale data (see `page_positions`).
        """
        B, Hsel, n = pages.shape
        Hkv, P, D, Dv = self.kv_heads, self.page_size, self.head_dim, self.value_dim
        cap = self._k.shape[2]
        rows = (pages + self._first_rows(Hsel, cap, pages.device)).reshape(-1)  # (B*Hsel*n,) of (B*Hkv*cap, P*D)
        k, v = self.workspace(rows.numel())  # (B*Hsel*n, P*D), (B*Hsel*n, P*Dv), reused across steps
        torch.index_select(self._k.view(B * Hkv * cap, P * D), 0, rows, out=k)  # (B*Hsel*n, P*D)
        torch.index_select(self._v.view(B * Hkv * cap, P * Dv), 0, rows, out=v)  # (B*Hsel*n, P*Dv)
        return k.view(B, Hsel, n * P, D), v.view(B, Hsel, n * P, Dv)

    def _first_rows(self, Hsel: int, cap: int, device) -> torch.Tensor:
        """(B, Hsel, 1): the row of page 0 of each selection head's KV head; kept until storage grows."""
        key = (Hsel, cap, str(device))
        if self._rows_key != key:
            B, Hkv = self.batch, self.kv_heads
            kv_of = torch.arange(Hsel, device=device) * Hkv // Hsel  # (Hsel,) KV head of each
            row0 = (torch.arange(B, device=device).view(B, 1) * Hkv + kv_of.view(1, Hsel)) * cap  # (B, Hsel)
            self._rows, self._rows_key = row0.unsqueeze(-1), key
        return self._rows

    def page_positions(self, pages: torch.Tensor) -> torch.Tensor:
        """(B, Hsel, n * P) int64: the key position of every row `gather_pages(pages)` returns.

        Positions >= length are the unused tail of the last page.
        """
        B, Hsel, n = pages.shape
        P = self.page_size
        pos = pages.unsqueeze(-1) * P + torch.arange(P, device=pages.device)  # (B, Hsel, n, P)
        return pos.reshape(B, Hsel, n * P)

    # -- views ----------------------------------------------------------------------------------
    @property
    def keys(self) -> torch.Tensor:
        cap = self._k.shape[2]
        return self._k.view(self.batch, self.kv_heads, cap * self.page_size, self.head_dim)[:, :, :self.length]

    @property
    def values(self) -> torch.Tensor:
        cap = self._v.shape[2]
        return self._v.view(self.batch, self.kv_heads, cap * self.page_size, self.value_dim)[:, :, :self.length]

    @property
    def page_keys(self) -> torch.Tensor:
        return self._k[:, :, :self.num_pages]

    @property
    def page_values(self) -> torch.Tensor:
        return self._v[:, :, :self.num_pages]

    @property
    def summaries(self) -> torch.Tensor:
        return self._s[:, :, :self.num_pages]

    @property
    def key_max(self) -> torch.Tensor:
        return self._s[:, :, :self.num_pages, :self.head_dim]

    @property
    def key_min(self) -> torch.Tensor:
        return self._s[:, :, :self.num_pages, self.head_dim:]

    def __repr__(self) -> str:
        dv = "" if self.value_dim == self.head_dim else f"value_dim={self.value_dim}, "
        return (f"PagedKVCache(batch={self.batch}, kv_heads={self.kv_heads}, head_dim={self.head_dim}, {dv}"
                f"page_size={self.page_size}, length={self.length}, pages={self.num_pages}, "
                f"capacity={self.capacity}, dtype={self.dtype}, device={self.device})")
