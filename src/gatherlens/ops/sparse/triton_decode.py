"""The GPU path: Triton kernels that score the pages and attend over the chosen ones in one pass.

    >>> out = sparse_decode(q, cache, budget=2048, backend="triton")      # CUDA tensors
    >>> pages, bounds = triton_select_pages(q, cache, budget=2048)         # the two steps it runs
    >>> out, lse = triton_attend_pages(q, cache, pages, scale)             # out (B, Hq, 1, Dv)
    >>> out, lse = triton_attend_pages(q, cache, pages, scale, softcap=30.0)  # Gemma 2's cap
    $ TRITON_INTERPRET=1 python ...                                        # runs on CPU tensors

Flash-decoding layout: program (b, selection head, split) walks its share of the chosen pages in
blocks of BLOCK_N tokens, loading each key/value row straight from the paged storage through the
page table (no gathered copy), and keeps a running max, sum and output (online softmax). A second
small kernel merges the splits by their log-sum-exp. Scoring is one more kernel (the same bound
as `page_choice.py`, fp32 accumulation) followed by `page_choice.choose_pages`, the one page-choice
rule of every path (forced pages, ties to the lower page). In float32 every dot is
IEEE (no TF32), so the pages equal the torch path's. Uses only what Triton 3.6 has (tl.dot with
input_precision, masks, constexpr blocks; no runtime loop bounds, see NUM_BLOCKS).
The kernels read the cache through its public views (`summaries`, `page_keys`, `page_values`,
`key_scales`, `value_scales`), whose strides are those of the paged storage; values may be
Dv = cache.value_dim wide. Pages stored narrower than the query (float16 / bfloat16, or int8 codes
times their scales in float32: keys per page channel, values per token) are read as the cache's
`read_pages` reads them. A softcap
caps each scaled logit (softcap * tanh(s / softcap), tanh from exp: Triton 3.6 has no tanh)
before the mask, as ops/attention/variants.py does. This module imports neither `decode.py` nor
`torch_decode.py`: `decode.sparse_decode` imports it when the triton backend runs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .config import OP
from .geometry import ceil_div
from .page_choice import choose_by_mass, choose_pages, pages_to_read

__all__ = ["triton_page_bounds", "triton_select_pages", "triton_attend_pages"]


@triton.jit
def _pages_attn_partial(
    Q, K, V, PAGES, OPART, LPART, KS, VS,
    length, sel_tokens, tokens_per_split, sm_scale, softcap,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_pb, stride_ph,
    stride_ksb, stride_ksh, stride_vsb, stride_vsh,
    HSEL: tl.constexpr, HKV: tl.constexpr, R: tl.constexpr, NSPLIT: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, SOFTCAP: tl.constexpr, QUANT: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # b * HSEL + selection head
    pid_s = tl.program_id(1)  # split
    b = pid_bh // HSEL
    hs = pid_bh % HSEL
    kvh = hs * HKV // HSEL
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    rmask = offs_r < R
    dmask = offs_d < D
    dvmask = offs_dv < DV
    q_ptr = Q + b * stride_qb + (hs * R + offs_r)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=rmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_R, BLOCK_D)
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    p_base = PAGES + b * stride_pb + hs * stride_ph
    ks_base = KS + b * stride_ksb + kvh * stride_ksh  # this head's int8 key channel scales (N, D) (QUANT)
    vs_base = VS + b * stride_vsb + kvh * stride_vsh  # and its values' token scales (N, P)

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    start = pid_s * tokens_per_split
    # NUM_BLOCKS is a constexpr (blocks per split, rounded up to a power of 2): a static loop
    # the compiler can pipeline, one compile per size bucket, and no runtime loop bound (which
    # Triton 3.6's interpreter cannot take under numpy >= 2.4)
    for i in range(NUM_BLOCKS):
        t = start + i * BLOCK_N + offs_n  # token slots of the selection this block covers
        tmask = (t < sel_tokens) & (i * BLOCK_N + offs_n < tokens_per_split)
        page = tl.load(p_base + t // P, mask=tmask, other=0)  # page id of each slot (-1: the auto budget's padding)
        tok = page * P + t % P  # key position in the cache
        valid = tmask & (page >= 0) & (tok < length)
        k_off = tok[:, None] * D + offs_d[None, :]
        k = tl.load(k_base + k_off, mask=valid[:, None] & dmask[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        if QUANT:  # int8 codes times their page's channel scales, in float32 (cache.read_pages)
            k = k.to(tl.float32) * tl.load(ks_base + page[:, None] * D + offs_d[None, :],
                                           mask=valid[:, None] & dmask[None, :], other=0.0)
        k = k.to(q.dtype)  # pages stored narrower than the query: read as it (exact)
        if UPCAST:  # Triton 3.6's CPU interpreter computes bf16 tl.dot wrongly: use fp32 there
            k = k.to(tl.float32)
            q = q.to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * sm_scale  # (BLOCK_R, BLOCK_N)
        if SOFTCAP:  # softcap * tanh(s / softcap), tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})
            e = tl.exp(-2.0 * tl.abs(s / softcap))
            th = (1.0 - e) / (1.0 + e)
            s = softcap * tl.where(s < 0, -th, th)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no valid token
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = tok[:, None] * DV + offs_dv[None, :]
        v = tl.load(v_base + v_off, mask=valid[:, None] & dvmask[None, :], other=0.0)  # (BLOCK_N, BLOCK_DV)
        if QUANT:  # and values times their token's scale
            v = v.to(tl.float32) * tl.load(vs_base + page * P + t % P, mask=valid, other=0.0)[:, None]
        v = v.to(q.dtype)
        if UPCAST:
            v = v.to(tl.float32)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    row = pid_bh * NSPLIT + pid_s
    o_ptr = OPART + (row * R + offs_r)[:, None] * DV + offs_dv[None, :]
    tl.store(o_ptr, out, mask=rmask[:, None] & dvmask[None, :])
    tl.store(LPART + row * R + offs_r, lse, mask=rmask)


@triton.jit
def _merge_splits(
    OPART, LPART, OUT, LSE,
    R: tl.constexpr, NSPLIT: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # (b * HSEL + hs) * R + r  ==  b * Hq + query head
    bh = pid // R
    r = pid % R
    offs_s = tl.arange(0, NSPLIT)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    lse = tl.load(LPART + (bh * NSPLIT + offs_s) * R + r)  # (NSPLIT,)
    m = tl.max(lse, 0)
    w = tl.exp(lse - m)  # empty splits (-inf) weigh 0
    total = tl.sum(w, 0)
    o = tl.load(OPART + ((bh * NSPLIT + offs_s) * R + r)[:, None] * D + offs_d[None, :],
                mask=dmask[None, :], other=0.0)  # (NSPLIT, BLOCK_D)
    out = tl.sum(o * (w / total)[:, None], 0)
    tl.store(OUT + pid * D + offs_d, out.to(OUT.dtype.element_ty), mask=dmask)
    tl.store(LSE + pid, m + tl.log(total))


@triton.jit
def _page_bounds_kernel(
    Q, S, OUT, N,
    stride_qb, stride_qh, stride_sb, stride_sh, stride_ob, stride_oh,
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, REDUCE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
    IEEE: tl.constexpr, WIDEN: tl.constexpr,
):
    """Bounds of BLOCK_P pages for the G query heads of one KV group, reduced over the group
    (REDUCE 0: max, 1: sum) or written per head (2). One pass over the [max | min] summaries."""
    pid = tl.program_id(0)  # b * HKV + kv head
    pid_p = tl.program_id(1)  # block of pages
    b = pid // HKV
    h = pid % HKV
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    gmask = offs_g < G
    dmask = offs_d < D
    pmask = offs_p < N
    q = tl.load(Q + b * stride_qb + (h * G + offs_g)[:, None] * stride_qh + offs_d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_G, BLOCK_D)
    s_ptr = S + b * stride_sb + h * stride_sh + offs_p[:, None] * (2 * D) + offs_d[None, :]
    smask = pmask[:, None] & dmask[None, :]
    hi = tl.load(s_ptr, mask=smask, other=0.0)  # (BLOCK_P, BLOCK_D) page max
    lo = tl.load(s_ptr + D, mask=smask, other=0.0)  # (BLOCK_P, BLOCK_D) page min
    if WIDEN:  # 16-bit summaries of keys read wider: the bound in the query's dtype (exact widening)
        hi, lo = hi.to(q.dtype), lo.to(q.dtype)
    if UPCAST:  # Triton 3.6's CPU interpreter computes bf16 tl.dot wrongly: use fp32 there
        q, hi, lo = q.to(tl.float32), hi.to(tl.float32), lo.to(tl.float32)
    q_pos = tl.maximum(q, 0.0).to(hi.dtype)  # relu(q)
    q_neg = tl.minimum(q, 0.0).to(lo.dtype)  # -relu(-q)
    if IEEE:  # float32: no TF32 rounding, so the bounds equal the torch path's
        bound = tl.dot(q_pos, tl.trans(hi), input_precision="ieee")
        bound += tl.dot(q_neg, tl.trans(lo), input_precision="ieee")
    else:
        bound = tl.dot(q_pos, tl.trans(hi)) + tl.dot(q_neg, tl.trans(lo))
    if REDUCE == 2:
        o_ptr = OUT + b * stride_ob + (h * G + offs_g)[:, None] * stride_oh + offs_p[None, :]
        tl.store(o_ptr, bound, mask=gmask[:, None] & pmask[None, :])
    else:
        if REDUCE == 0:  # torch.amax's max: a nan head makes the group's bound nan (tl.max drops it on GPU)
            red = tl.max(tl.where(gmask[:, None], bound, float("-inf")), 0)
            has_nan = tl.max(tl.where(gmask[:, None] & (bound != bound), 1, 0), 0) > 0
            red = tl.where(has_nan, float("nan"), red)
        else:
            red = tl.sum(tl.where(gmask[:, None], bound, 0.0), 0)
        tl.store(OUT + b * stride_ob + h * stride_oh + offs_p, red, mask=pmask)


def triton_page_bounds(q: torch.Tensor, cache, share_selection: bool = OP.share_selection,
                       group_score: str = OP.group_score, block_p: int = 64):
    """Page bounds (B, Hsel, N) float32 from the summaries in one kernel; same as page_choice.py's."""
    B, Hq, _, D = q.shape
    Hkv, N = cache.kv_heads, cache.num_pages
    G = Hq // Hkv
    qc = q.reshape(B, Hq, D).contiguous()  # (B, Hq, D)
    S = cache.summaries  # (B, Hkv, N, 2D), a view with the storage's strides
    Hsel = Hkv if share_selection else Hq
    out = torch.empty(B, Hsel, N, device=q.device, dtype=torch.float32)  # (B, Hsel, N)
    BLOCK_P = max(16, _next_pow2(block_p))
    _page_bounds_kernel[(B * Hkv, ceil_div(N, BLOCK_P))](
        qc, S, out, N, qc.stride(0), qc.stride(1), S.stride(0), S.stride(1), out.stride(0), out.stride(1),
        HKV=Hkv, G=G, D=D, REDUCE=(0 if group_score == "max" else 1) if share_selection else 2,
        BLOCK_G=max(16, _next_pow2(G)), BLOCK_P=BLOCK_P, BLOCK_D=max(16, _next_pow2(D)),
        UPCAST=q.device.type != "cuda", IEEE=torch.promote_types(q.dtype, S.dtype) == torch.float32,
        WIDEN=torch.promote_types(q.dtype, S.dtype) != S.dtype,
    )
    return out


def triton_select_pages(q: torch.Tensor, cache, budget: int, share_selection: bool = OP.share_selection,
                        group_score: str = OP.group_score, recent: int = OP.recent, *, mass: float | None = None,
                        min_pages: int = 1, scale: float | None = None):
    """Pages (B, Hsel, n) ascending and bounds (B, Hsel, N): the scoring kernel, then the one
    page-choice rule (`page_choice.pages_to_read`, `page_choice.choose_pages`; with mass, the auto
    budget's `page_choice.choose_by_mass`: each head's pages, then -1)."""
    bounds = triton_page_bounds(q, cache, share_selection, group_score)  # (B, Hsel, N)
    n, first = pages_to_read(cache.length, cache.page_size, budget, recent)
    if mass is None or n >= cache.num_pages:
        return choose_pages(bounds, n, first), bounds
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    return choose_by_mass(bounds, n, first, mass, min_pages, scale, cache.length, cache.page_size), bounds


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def triton_attend_pages(q: torch.Tensor, cache, pages: torch.Tensor, scale: float,
                        num_splits: int | None = None, block_n: int = 64, *, softcap: float | None = None):
    """Attention of q (B, Hq, 1, D) over the chosen pages (B, Hsel, n) read in place from `cache` (a -1
    entry, the auto budget's padding, reads nothing).

    softcap: each scaled logit becomes softcap * tanh(logit / softcap) first (None: no cap).
    returns out (B, Hq, 1, Dv) in q.dtype and lse (B, Hq, 1) float32.
    """
    B, Hq, _, D = q.shape
    Dv = cache.value_dim
    Hsel, n = pages.shape[1], pages.shape[2]
    Hkv, P = cache.kv_heads, cache.page_size
    R = Hq // Hsel  # query rows per program: G when shared, 1 when per head
    qc = q.reshape(B, Hq, D).contiguous()  # (B, Hq, D)
    pg = pages.contiguous()  # (B, Hsel, n)
    K, V = cache.page_keys, cache.page_values  # (B, Hkv, N, P, D), (..., Dv) views with the storage's strides
    KS, VS = cache.key_scales, cache.value_scales  # (B, Hkv, N, D) / (B, Hkv, N, P) int8 scales, or None
    quant = KS is not None
    KS, VS = (KS, VS) if quant else (K, V)  # placeholders the kernel never reads
    sel_tokens = n * P
    BLOCK_N = max(16, _next_pow2(block_n))
    if num_splits is None:  # enough programs to fill the machine, each with >= 2 blocks of work
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        want = _next_pow2(ceil_div(4 * sms, B * Hsel))
        num_splits = max(1, min(want, _next_pow2(ceil_div(sel_tokens, 2 * BLOCK_N)), 64))
    NSPLIT = _next_pow2(num_splits)
    tokens_per_split = ceil_div(sel_tokens, NSPLIT)
    num_blocks = _next_pow2(ceil_div(tokens_per_split, BLOCK_N))
    tokens_per_split = num_blocks * BLOCK_N
    opart = torch.empty(B * Hsel * NSPLIT * R, Dv, device=q.device, dtype=torch.float32)
    lpart = torch.empty(B * Hsel * NSPLIT * R, device=q.device, dtype=torch.float32)
    BLOCK_D, BLOCK_DV = max(16, _next_pow2(D)), max(16, _next_pow2(Dv))
    _pages_attn_partial[(B * Hsel, NSPLIT)](
        qc, K, V, pg, opart, lpart, KS, VS,
        cache.length, sel_tokens, tokens_per_split, float(scale), float(softcap or 1.0),
        qc.stride(0), qc.stride(1), K.stride(0), K.stride(1), V.stride(0), V.stride(1), pg.stride(0), pg.stride(1),
        KS.stride(0) if quant else 0, KS.stride(1) if quant else 0, VS.stride(0) if quant else 0,
        VS.stride(1) if quant else 0,
        HSEL=Hsel, HKV=Hkv, R=R, NSPLIT=NSPLIT, NUM_BLOCKS=num_blocks, P=P, D=D, DV=Dv,
        BLOCK_R=max(16, _next_pow2(R)), BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV,
        IEEE=q.dtype == torch.float32, UPCAST=q.device.type != "cuda", SOFTCAP=softcap is not None, QUANT=quant,
    )
    out = torch.empty(B, Hq, 1, Dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, 1, device=q.device, dtype=torch.float32)
    _merge_splits[(B * Hq,)](opart, lpart, out, lse, R=R, NSPLIT=NSPLIT, D=Dv, BLOCK_D=BLOCK_DV)
    return out, lse

