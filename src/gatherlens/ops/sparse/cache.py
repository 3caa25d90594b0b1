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

Storage (`kv_dtype`) may be narrower than the dtype keys arrive and are read in (`dtype`):
float16 / bfloat16 (half the bytes) or int8 (about a third) with float32 scales as KIVI
quantizes: keys per channel (one scale per page, KV head and channel: the outlier channels of keys
get their own), values per token (one scale per token and KV head). What attention reads is
`read(stored)`: the 16-bit value as `dtype`, or `code * scale` (the key's channel scale, the
value's token scale) computed in float32 then cast to `dtype`; the summaries are the max / min of
exactly those values, so the bound stays sound for what every backend reads.

The int8 rule (its one home; ops/layer/layer_ops.cpp's rope_append follows it, tested equal):
- values: a token's scale is max |value| / 127 over its channels, set when it is written and never
  changed (no re-rounding);
- keys: a page's channel scale only grows. Tokens written into a page whose channel holds s != 0
  keep s when every new |value| of that channel <= 127 s; else the channel's scale becomes
  max(amax / 127, 2 s) and the page's earlier codes of that channel are re-rounded to it
  (round(code * s / new)). A fresh page (its first slot written) starts from s = 0, so a page
  written whole (prefill) gets amax / 127 per channel, the best scale. Because a scale at least
  doubles when it grows, the re-roundings of a page filled token by token add up to less than one
  step of its final scale (a page written whole: half a step).
Rounding is to nearest, ties to even; codes lie in [-127, 127]. A non-finite value makes its
channel's (key) or token's (value) scale and values non-finite.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.tensors import check_allocation, require_data

from .config import KV_DTYPES, OP
from .geometry import page_count

__all__ = ["PagedKVCache", "STORAGE", "storage_dtype", "grown_scale", "quantize", "INT8_MAX"]

STORAGE = dict(zip(KV_DTYPES, (torch.float32, torch.float16, torch.bfloat16, torch.int8)))  # config name -> dtype
INT8_MAX = 127.0  # codes lie in [-127, 127]


def storage_dtype(kv_dtype, dtype: torch.dtype) -> torch.dtype:
    """The torch dtype pages are stored in: `dtype` for None, else the KV_DTYPES name's (or the dtype given).

        >>> storage_dtype("int8", torch.float32), storage_dtype(None, torch.bfloat16)
        (torch.int8, torch.bfloat16)
    """
    if kv_dtype is None:
        return dtype
    if isinstance(kv_dtype, str) and kv_dtype in STORAGE:
        return STORAGE[kv_dtype]
    if isinstance(kv_dtype, torch.dtype) and (kv_dtype.is_floating_point or kv_dtype == torch.int8):
        return kv_dtype
    raise GatherTypeError(f"kv_dtype must be None, one of {KV_DTYPES} or a floating / int8 torch.dtype, got {kv_dtype!r}")


def _summary_default(dtype: torch.dtype, kv_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """PagedKVCache's default summary dtype (see its summary_dtype argument)."""
    half = (torch.bfloat16, torch.float16)
    if kv_dtype in half and kv_dtype != dtype:
        return kv_dtype  # the max / min of 16-bit values are 16-bit values
    return torch.float32 if dtype in half and device.type == "cpu" else dtype  # CPUs: slow half-precision GEMM


def grown_scale(amax: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """A key page channel's int8 scale after a write whose values reach `amax` (the rule in the module doc;
    a value token's scale is grown_scale(amax, 0) = amax / 127).

        >>> grown_scale(torch.tensor([1.27, 2.0, 0.5]), torch.tensor([0.0, 0.01, 0.01]))
        tensor([0.0100, 0.0200, 0.0100])
    """
    return torch.where(amax <= INT8_MAX * old, old, torch.maximum(amax / INT8_MAX, 2 * old))


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 codes of float32 x at `scale` (broadcast): round(x / scale) in [-127, 127]; 0 where scale is 0."""
    codes = torch.where(scale > 0, torch.round(x / scale), 0.0)  # (..., W) ties to even
    return codes.clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)


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
        dtype (torch.dtype): the dtype keys and values are appended and read in (floating): what
            `keys`, `gather_pages` and decode's query use. Default: float32.
        kv_dtype (str or torch.dtype, optional): the dtype pages are stored in: None (``dtype``),
            "float32", "float16", "bfloat16" or "int8" (float32 scales: keys per page and channel,
            values per token; the rounding rule is in the module doc). Summaries are exact for the
            stored values.
        device (torch.device or str, optional): where the storage lives. Default: CPU.
        capacity (int, optional): tokens to preallocate (rounded up to whole pages).
        summary_dtype (torch.dtype, optional): dtype of the page min/max (exact copies of the
            keys as read). Default: ``dtype``, but float32 for 16-bit ``dtype`` on CPU, where
            half-precision matmuls are slow, and the storage's own 16-bit dtype for 16-bit pages
            read wider (their max and min are 16-bit values: exact, and half the bytes).
        value_dim (int, optional): ``Dv``, the width of values, when it differs from the keys'
            (latent attention: ``qk_head_dim != v_head_dim``). Default: ``head_dim``. The
            summaries stay on the keys only.

    Attributes:
        length (int): tokens stored, ``L``; ``num_pages`` (int): pages in use, ``N``.
        keys, values (Tensor): the first ``L`` tokens as read, in ``dtype`` (views when stored in
            ``dtype``, else converted copies); page_keys, page_values: the stored pages (views,
            ``kv_dtype``); key_scales (B, Hkv, N, D), value_scales (B, Hkv, N, P): int8's float32
            scales per page channel and per token (None otherwise); key_max, key_min, summaries: views over the first ``N`` pages;
            ``summaries`` is ``[key_max | key_min]``, the layout scoring reads.
        storage_version (int): counts the times the storage was made anew (grown, re-stored): a caller
            holding `writable` / `scale_storage`'s tensors holds the current ones while it is unchanged.
        dense_left (int): decode steps this layer still reads densely because its last sparse step
            needed nearly every page (ops/sparse/dense_runs.py's rule; 0 after `truncate`).

    Methods:
        append(keys, values): add ``T`` tokens; updates only the touched pages' summaries.
        gather_pages(pages): the chosen pages' keys and values, copied into the workspace.
        page_positions(pages): the key position of every row ``gather_pages`` returns.
        truncate(length): keep the first ``length`` tokens (exact summaries).
        store_as(kv_dtype): re-store every token in another storage dtype.
        nbytes(): bytes of the storage in use (pages, summaries, scales).

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
        kv_dtype: str | torch.dtype | None = None,
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
        self.kv_dtype = storage_dtype(kv_dtype, dtype)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if summary_dtype is None:
            summary_dtype = _summary_default(dtype, self.kv_dtype, self.device)
        if not isinstance(summary_dtype, torch.dtype) or not summary_dtype.is_floating_point:
            raise GatherTypeError(f"summary_dtype must be a floating torch.dtype, got {summary_dtype!r}")
        self.summary_dtype = summary_dtype
        self.length = 0
        self.dense_left = 0  # dense_runs: steps read densely before the layer chooses pages again
        self._work: tuple[torch.Tensor, torch.Tensor] | None = None
        self._raw: tuple[torch.Tensor, torch.Tensor] | None = None  # gathered stored pages, before reading
        self._rows, self._rows_key = None, None  # gather_pages' row offsets, see _first_rows
        self._ks = self._vs = None  # int8's scales: keys (B, Hkv, cap, D) per channel, values (B, Hkv, cap, P) per token
        self._alloc(max(1, page_count(capacity or page_size, page_size)))
        self.device = self._k.device  # "cuda" -> "cuda:0": the device the storage is on

    @property
    def quantized(self) -> bool:
        """True when pages hold int8 codes with their scales (keys per page channel, values per token)."""
        return self.kv_dtype == torch.int8

    @property
    def plain(self) -> bool:
        """True when pages are stored in `dtype` itself (every view is a view, no conversion)."""
        return self.kv_dtype == self.dtype

    # -- storage --------------------------------------------------------------------------------
    def _alloc(self, pages: int) -> None:
        B, H, P, D = self.batch, self.kv_heads, self.page_size, self.head_dim
        kw = dict(dtype=self.kv_dtype, device=self.device)
        check_allocation("PagedKVCache storage (keys and values)", (B, H, pages, P, D + self.value_dim),
                         self.kv_dtype, self.device)
        k = torch.zeros(B, H, pages, P, D, **kw)  # (B, Hkv, cap, P, D)
        v = torch.zeros(B, H, pages, P, self.value_dim, **kw)  # (B, Hkv, cap, P, Dv)
        s = torch.zeros(B, H, pages, 2 * D, dtype=self.summary_dtype, device=self.device)  # (B, Hkv, cap, 2D)
        scales = [torch.zeros(B, H, pages, D, device=self.device), torch.zeros(B, H, pages, P, device=self.device)] \
            if self.quantized else [None, None]  # keys per page channel, values per token
        used = self.num_pages if hasattr(self, "_k") else 0
        if used:
            k[:, :, :used] = self._k[:, :, :used]
            v[:, :, :used] = self._v[:, :, :used]
            s[:, :, :used] = self._s[:, :, :used]
            for new, old in zip(scales, (self._ks, self._vs)):
                if new is not None:
                    new[:, :, :used] = old[:, :, :used]
        self._k, self._v, self._s = k, v, s
        self._ks, self._vs = scales
        self.storage_version = getattr(self, "storage_version", 0) + 1  # writable()'s tensors changed

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

    def nbytes(self) -> int:
        """Bytes of the storage the `length` tokens occupy: their pages (whole), summaries and scales.

            >>> PagedKVCache(1, 3, 64, page_size=8, kv_dtype="float16").nbytes()   # empty
            0
        """
        N, H = self.num_pages, self.batch * self.kv_heads
        per_page = self.page_size * (self.head_dim + self.value_dim) * self._k.element_size()
        per_page += 2 * self.head_dim * self._s.element_size() + (4 * (self.head_dim + self.page_size) if self.quantized else 0)
        return N * H * per_page

    # -- reading the stored values --------------------------------------------------------------
    def read_pages(self, stored: torch.Tensor, scales: torch.Tensor | None, key: bool = True) -> torch.Tensor:
        """Stored pages (..., P, W) as attention reads them, in `dtype`: a 16-bit value converted, an
        int8 code times its scale computed in float32: a key's channel scale (scales (..., D)), a value's
        token scale (scales (..., P), key=False). The one reading rule: the summaries, gather_pages and
        the views all use it (and every kernel does the same products)."""
        if scales is not None:
            per = scales[..., None, :] if key else scales[..., :, None]  # (..., 1, D) | (..., P, 1)
            return (stored.float() * per).to(self.dtype)  # (..., P, W)
        return stored if stored.dtype == self.dtype else stored.to(self.dtype)  # (..., P, W)

    def _read(self, key: bool, p0: int, p1: int) -> torch.Tensor:
        """Pages p0 .. p1-1 of the keys (or values) as read: (B, Hkv, n, P, D | Dv)."""
        stored, scales = (self._k, self._ks) if key else (self._v, self._vs)
        return self.read_pages(stored[:, :, p0:p1], None if scales is None else scales[:, :, p0:p1], key)

    def _summarize(self, p0: int, p1: int) -> None:
        """The [max | min] of pages p0 .. p1-1 from their valid tokens as read (the last may be partial)."""
        P, D, L = self.page_size, self.head_dim, self.length
        full = min(p1, L // P)  # pages p0 .. full-1 are complete
        if full > p0:
            pages = self._read(True, p0, full)  # (B, Hkv, n, P, D)
            self._s[:, :, p0:full, :D] = pages.amax(dim=3)
            self._s[:, :, p0:full, D:] = pages.amin(dim=3)
        if p1 > full and L > full * P:  # a partial last page: tokens full*P .. L-1
            tail = self._read(True, full, full + 1)[:, :, 0, :L - full * P]  # (B, Hkv, r, D)
            self._s[:, :, full, :D] = tail.amax(dim=2)
            self._s[:, :, full, D:] = tail.amin(dim=2)

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
        if T == 1 and not self.quantized:
            return self._append_one(keys, values)
        L0, L1, P = self.length, self.length + T, self.page_size
        self.reserve(L1)
        if self.quantized:
            self._write_int8(self._k, self._ks, keys.detach(), L0, key=True)
            self._write_int8(self._v, self._vs, values.detach(), L0, key=False)
        else:
            cap = self._k.shape[2]
            flat_k = self._k.view(self.batch, self.kv_heads, cap * P, self.head_dim)  # (B, Hkv, cap*P, D)
            flat_v = self._v.view(self.batch, self.kv_heads, cap * P, self.value_dim)  # (B, Hkv, cap*P, Dv)
            flat_k[:, :, L0:L1] = keys.detach()  # the cache stores values, it is not part of a graph
            flat_v[:, :, L0:L1] = values.detach()
        self.length = L1
        self._summarize(L0 // P, page_count(L1, P))  # only the touched pages (<= T + P - 1 tokens)

    def _write_int8(self, stored: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, L0: int, key: bool) -> None:
        """Tokens x (B, Hkv, T, W) at L0.. as int8 codes by the module doc's rule: keys per page channel
        (scales (B, Hkv, cap, W) only grow, earlier codes re-rounded), values per token (scales (B, Hkv, cap, P))."""
        B, H, T, W = x.shape
        P = self.page_size
        p0, p1 = L0 // P, page_count(L0 + T, P)
        head = L0 - p0 * P  # tokens page p0 already holds
        if not key:  # each token its own scale, set once
            flat_v = stored.view(B, H, -1, W)  # (B, Hkv, cap*P, W)
            flat_s = scales.view(B, H, -1)  # (B, Hkv, cap*P)
            s = grown_scale(x.float().abs().amax(dim=-1), torch.zeros(B, H, T, device=x.device))  # (B, Hkv, T)
            flat_v[:, :, L0:L0 + T] = quantize(x.float(), s[..., None])
            flat_s[:, :, L0:L0 + T] = s
            return
        buf = torch.zeros(B, H, (p1 - p0) * P, W, device=x.device)  # (B, Hkv, n*P, W) the touched pages
        old = torch.zeros(B, H, p1 - p0, W, device=x.device)  # (B, Hkv, n, W): 0 for a fresh page
        if head:
            buf[:, :, :head] = self.read_pages(stored[:, :, p0, :head], scales[:, :, p0]).float()  # (B, Hkv, head, W)
            old[:, :, 0] = scales[:, :, p0]
        buf[:, :, head:head + T] = x.float()
        pages = buf.view(B, H, p1 - p0, P, W)  # (B, Hkv, n, P, W)
        new = grown_scale(pages.abs().amax(dim=3), old)  # (B, Hkv, n, W) per channel
        stored[:, :, p0:p1] = quantize(pages, new[..., None, :])  # (B, Hkv, n, P, W)
        scales[:, :, p0:p1] = new

    def _append_one(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """One decode token: two row copies and a running max/min of its page (4 small ops)."""
        L, P, D = self.length, self.page_size, self.head_dim
        self.reserve(L + 1)
        page, slot = divmod(L, P)
        self._k[:, :, page, slot] = keys.detach()[:, :, 0]  # (B, Hkv, D)
        self._v[:, :, page, slot] = values.detach()[:, :, 0]
        s = self._s[:, :, page].view(self.batch, self.kv_heads, 2, D)  # (B, Hkv, [max|min], D)
        k = self._k[:, :, page, slot:slot + 1]  # (B, Hkv, 1, D) as stored
        k = (k if self.plain else k.to(self.dtype)).to(self.summary_dtype)  # (B, Hkv, 1, D) as read
        if slot == 0:  # a new page: its box is the one key
            s.copy_(k.expand(-1, -1, 2, -1))
        else:
            torch.maximum(s[:, :, 0], k[:, :, 0], out=s[:, :, 0])
            torch.minimum(s[:, :, 1], k[:, :, 0], out=s[:, :, 1])
        self.length = L + 1

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (assisted decoding's rollback, a benchmark's reset).

        Exact: pages before the new last page were never touched by the dropped tokens; the new
        last page's summary is recomputed from the tokens it keeps (an int8 page keeps its scale).
        """
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise GatherValueError(f"truncate({length!r}): length must be an int in [0, {self.length}]")
        self.length, self.dense_left = length, 0
        page, slot = divmod(length, self.page_size)
        if slot:  # the partial last page: its box over its remaining tokens
            self._summarize(page, page + 1)

    def store_as(self, kv_dtype) -> None:
        """Re-store every token with pages in `kv_dtype` (None: `dtype`): each value read as now,
        then written as `append` writes it. A no-op when the storage is that dtype already."""
        want = storage_dtype(kv_dtype, self.dtype)
        if want == self.kv_dtype:
            return
        keys, values = self.keys.clone(), self.values.clone()  # (B, Hkv, L, D), (B, Hkv, L, Dv) as read
        room = self.capacity  # the reserved tokens stay reserved (no regrowth at the next append)
        self.kv_dtype, self.length, self._work, self._raw = want, 0, None, None
        del self._k, self._v, self._s
        self._ks = self._vs = None
        self._alloc(max(1, page_count(max(keys.shape[2], room), self.page_size)))
        self.append(keys, values)

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
        require_data(**{name: x})

    def workspace(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two reusable buffers, (rows, page_size * D) for keys and (rows, page_size * Dv) for
        values, in `dtype`, that decode gathers pages into.

        Kept across steps so each decode writes into warm memory instead of fresh pages of a
        new allocation (which on CPU costs as much as the gather). Not thread-safe: one decode
        per cache at a time.
        """
        self._work = self._grown(self._work, rows, self.dtype)
        return self._work[0][:rows], self._work[1][:rows]

    def _grown(self, work, rows: int, dtype: torch.dtype):
        """`work` (two buffers of `dtype`) if it holds `rows` rows, else larger ones (doubling)."""
        have = work[0].shape[0] if work else 0
        if rows <= have:
            return work
        n, P = max(rows, 2 * have), self.page_size
        kw = dict(dtype=dtype, device=self.device)
        return torch.empty(n, P * self.head_dim, **kw), torch.empty(n, P * self.value_dim, **kw)

    def writable(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Room for `tokens` more tokens, and the whole storage a kernel writes them into in place:
        keys (B, Hkv, cap, P, D), values (B, Hkv, cap, P, Dv), summaries (B, Hkv, cap, 2D).

            >>> keys, values, summaries = cache.writable(1)   # write token cache.length, its page's box
            >>> cache.advance(1)                               # then count it

        The writer must store the tokens at positions length.. and keep their pages' summaries
        exact ([max | min] of the page's keys as read), as `append` does (ops/layer's rope_append
        does both); for int8 pages it also keeps `scale_storage` by the module doc's rule.
        """
        self.reserve(self.length + tokens)
        return self._k, self._v, self._s

    def scale_storage(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """int8 pages' scales over the whole storage, keys (B, Hkv, cap, D) per page channel and values
        (B, Hkv, cap, P) per token, float32 (what kernels read and rope_append writes); (None, None) for
        float pages."""
        return self._ks, self._vs

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
        if not self.plain:  # the stored pages first, then read into the workspace
            self._raw = self._grown(self._raw, rows.numel(), self.kv_dtype)
            rk, rv = self._raw[0][:rows.numel()], self._raw[1][:rows.numel()]  # (B*Hsel*n, P*D | P*Dv) stored
        else:
            rk, rv = k, v
        torch.index_select(self._k.view(B * Hkv * cap, P * D), 0, rows, out=rk)  # (B*Hsel*n, P*D)
        torch.index_select(self._v.view(B * Hkv * cap, P * Dv), 0, rows, out=rv)  # (B*Hsel*n, P*Dv)
        if not self.plain:
            ks = None if self._ks is None else self._ks.view(-1, D)[rows]  # (B*Hsel*n, D) the pages' channel scales
            vs = None if self._vs is None else self._vs.view(-1, P)[rows]  # (B*Hsel*n, P) their token scales
            k.copy_(self.read_pages(rk.view(-1, P, D), ks).view(-1, P * D))  # (B*Hsel*n, P*D) as read
            v.copy_(self.read_pages(rv.view(-1, P, Dv), vs, key=False).view(-1, P * Dv))  # (B*Hsel*n, P*Dv)
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
        """(B, Hkv, L, D) in `dtype`: a view of the storage, or (stored in another dtype) a copy as read."""
        return self._flat(True)

    @property
    def values(self) -> torch.Tensor:
        """(B, Hkv, L, Dv) in `dtype`: a view of the storage, or a copy as read."""
        return self._flat(False)

    def _flat(self, key: bool) -> torch.Tensor:
        W = self.head_dim if key else self.value_dim
        if self.plain:
            store = self._k if key else self._v  # (B, Hkv, cap, P, W)
            return store.view(self.batch, self.kv_heads, -1, W)[:, :, :self.length]  # (B, Hkv, L, W)
        read = self._read(key, 0, self.num_pages)  # (B, Hkv, N, P, W)
        return read.reshape(self.batch, self.kv_heads, -1, W)[:, :, :self.length]  # (B, Hkv, L, W)

    @property
    def page_keys(self) -> torch.Tensor:
        """(B, Hkv, N, P, D) the stored pages (kv_dtype), a view."""
        return self._k[:, :, :self.num_pages]

    @property
    def page_values(self) -> torch.Tensor:
        """(B, Hkv, N, P, Dv) the stored pages (kv_dtype), a view."""
        return self._v[:, :, :self.num_pages]

    @property
    def key_scales(self) -> torch.Tensor | None:
        """(B, Hkv, N, D) float32: int8 key pages' channel scales (None for float pages)."""
        return None if self._ks is None else self._ks[:, :, :self.num_pages]

    @property
    def value_scales(self) -> torch.Tensor | None:
        """(B, Hkv, N, P) float32: int8 values' token scales (None for float pages)."""
        return None if self._vs is None else self._vs[:, :, :self.num_pages]

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
        kv = "" if self.plain else f", kv_dtype={self.kv_dtype}"
        return (f"PagedKVCache(batch={self.batch}, kv_heads={self.kv_heads}, head_dim={self.head_dim}, {dv}"
                f"page_size={self.page_size}, length={self.length}, pages={self.num_pages}, "
                f"capacity={self.capacity}, dtype={self.dtype}{kv}, device={self.device})")
