"""The CPU fast path of topk_attention (sparse_sum.py, select/threshold_select.py, the C++ operators)
against the references: the numpy selection, select_topk, the chunked path and the per-query loop;
the operators as PyTorch sees them (opcheck, torch.compile, the profiler); the build's fallback."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from native_helpers import needs_native

from gatherlens.errors import GatherLensWarning
from gatherlens.ops import native
from gatherlens.ops.attention import sparse_sum, topk_attention
from gatherlens.ops.attention.naive import naive_topk_attention
from gatherlens.ops.attention.select import select_topk, threshold_kernel, topk_rows, topk_summed_rows, topk_weights_

needs_kernel = needs_native(threshold_kernel)


def _rows(seed, R, W, kind, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (R, W), generator=g).to(dtype) if kind == "ties" else torch.randn(R, W, generator=g, dtype=dtype)
    if kind == "masked":
        x[torch.rand(R, W, generator=g) < 0.4] = float("-inf")
    if kind == "ties":
        x[x == 0] = -0.0                                       # -0.0 and 0.0 tie, as they compare
    return x


def _by_index(idx):
    """select_topk's indices in ascending key order, padding (-1) last."""
    big = torch.where(idx < 0, torch.iinfo(torch.long).max, idx).sort(-1).values
    return torch.where(big == torch.iinfo(torch.long).max, -1, big)


@needs_kernel
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), R=st.integers(1, 9), W=st.integers(1, 400), k=st.integers(1, 90),
       kind=st.sampled_from(["floats", "ties", "masked"]), dtype=st.sampled_from([torch.float32, torch.float64]),
       with_lens=st.booleans(), with_base=st.booleans())
def test_kernel_numpy_and_select_topk_keep_the_same_keys(seed, R, W, k, kind, dtype, with_lens, with_base):
    x = _rows(seed, R, W, kind, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    lens = torch.randint(0, W + 1, (R,), generator=g) if with_lens else None
    base = torch.randint(0, 10**6, (R,), generator=g) if with_base else None
    ref_in = x if lens is None else x.masked_fill(torch.arange(W) >= lens.view(R, 1), float("-inf"))
    _, ref_idx = select_topk(ref_in, k, ordered=False)
    want = _by_index(ref_idx)                                   # (R, k')
    got = [topk_rows(x, k, lens=lens, base=base, weights=True, native=n) for n in (True, False)]
    for vals, idx, w, lse in got:
        keys = idx if base is None else torch.where(vals > float("-inf"), idx - base.view(R, 1), -1)
        assert torch.equal(keys, want)
        assert torch.equal(vals, torch.where(keys < 0, float("-inf"), x.gather(-1, keys.clamp_min(0))))
    (_, _, w1, l1), (_, _, w2, l2) = got
    torch.testing.assert_close(w1, w2, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(l1, l2, atol=1e-6, rtol=1e-5)
    dense = [x.clone() for _ in range(2)]
    lse = [topk_weights_(d, k, lens=lens, native=n) for d, n in zip(dense, (True, False))]
    torch.testing.assert_close(dense[0], dense[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse[0], lse[1], atol=1e-6, rtol=1e-5)
    assert torch.equal(dense[0] != 0, dense[1] != 0)


@needs_kernel
def test_rows_read_in_place_from_a_strided_layout():
    x = torch.randn(6, 300, 4)                                  # (N, W, G): decode logits (B*Hkv, L, G)
    strided = topk_rows(x.transpose(1, 2), 17, weights=True)    # rows read without a copy
    copied = topk_rows(x.transpose(1, 2).reshape(24, 300), 17, weights=True, native=False)
    for a, b in zip(strided, copied):
        torch.testing.assert_close(a, b)


CASES = [  # B, Hq, Hkv, Q, L, D, top_k, causal, mask, share
    (1, 6, 2, 70, 70, 8, 9, True, None, False),                # prefill, GQA, many chunks
    (2, 4, 4, 33, 50, 5, 40, False, "bool", False),            # large k: the dense sum
    (1, 6, 3, 40, 60, 8, 5, True, "float", True),              # shared selection, float mask
    (1, 8, 2, 1, 500, 16, 32, False, None, False),             # decode: strided logits, gather-sum
    (1, 8, 2, 1, 500, 16, 32, False, None, True),              # decode, shared
    (1, 4, 1, 3, 90, 8, 200, False, "bool", False),            # k > L
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-H{}x{}-Q{}-L{}-D{}-k{}-causal{}-{}-share{}".format(*c))
def test_fast_path_equals_the_chunked_reference(case, dtype, monkeypatch):
    B, Hq, Hkv, Q, L, D, k, causal, mask, share = case
    g = torch.Generator().manual_seed(7)
    q, key, v = (torch.randint(-2, 3, s, generator=g).to(dtype) for s in ((B, Hq, Q, D), (B, Hkv, L, D), (B, Hkv, L, D)))
    m = None
    if mask == "bool":
        m = torch.rand(B, 1, Q, L, generator=g) > 0.3
    elif mask == "float":
        m = torch.randn(B, 1, Q, L, generator=g).to(dtype).masked_fill(torch.rand(B, 1, Q, L, generator=g) > 0.7, float("-inf"))
    kw = dict(is_causal=causal, attn_mask=m, scale=0.5, enable_gqa=Hq != Hkv, share_selection=share)
    monkeypatch.setattr(sparse_sum, "CHUNK_ELEMENTS", 600)              # several chunks, on two worker threads
    monkeypatch.setattr(sparse_sum, "CHUNK_ROWS", 12)
    monkeypatch.setattr(sparse_sum, "KEY_BLOCK", 16)
    torch.set_num_threads(2)
    fast, fsel = topk_attention(q, key, v, k, return_selection=True, **kw)
    plain = topk_attention(q, key, v, k, **kw)                 # no selection record: other branches
    monkeypatch.setattr(sparse_sum, "ENABLED", False)
    ref, rsel = topk_attention(q, key, v, k, return_selection=True, **kw)
    assert fsel.meta["path"] in ("sparse", "decode") and rsel.meta["path"] in ("chunked", "decode")
    assert torch.equal(fsel.indices, rsel.indices)
    assert torch.equal(fsel.scores, rsel.scores)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, ref, **tol)
    torch.testing.assert_close(plain, ref, **tol)
    torch.testing.assert_close(fsel.lse, rsel.lse, **tol)
    if dtype == torch.float64:
        naive, nsel = naive_topk_attention(q, key, v, k, **kw)
        assert torch.equal(fsel.indices, nsel.indices)
        torch.testing.assert_close(fast, naive, atol=1e-6, rtol=1e-6)  # chunked.py is as far


def test_random_floats_long_rows_match_the_reference(monkeypatch):
    q, k, v = torch.randn(1, 6, 300, 16), torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
    fast, fsel = topk_attention(q, k, v, 37, is_causal=True, enable_gqa=True, return_selection=True)
    monkeypatch.setattr(sparse_sum, "ENABLED", False)
    ref, rsel = topk_attention(q, k, v, 37, is_causal=True, enable_gqa=True, return_selection=True)
    assert torch.equal(fsel.indices, rsel.indices)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)


def test_inference_mode_and_no_grad_reach_the_worker_threads(monkeypatch):
    monkeypatch.setattr(sparse_sum, "CHUNK_ELEMENTS", 200)
    q, k, v = torch.randn(1, 2, 40, 4), torch.randn(1, 2, 40, 4), torch.randn(1, 2, 40, 4)
    with torch.inference_mode():
        a = topk_attention(q, k, v, 5, is_causal=True)
    b = topk_attention(q, k, v, 5, is_causal=True)
    assert a.is_inference() and not b.is_inference()
    torch.testing.assert_close(a, b)


def test_a_missing_compiler_warns_one_line_and_falls_back_to_numpy(tmp_path, monkeypatch):
    source = tmp_path / "copy.cpp"
    source.write_text(threshold_kernel.KERNEL.read_text() + "\n// a copy, so nothing is cached under its hash\n")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    with pytest.warns(GatherLensWarning, match="numpy path") as caught:
        assert native.load_library(source) is False
    (w,) = caught.list                                          # one warning, one line, no source path
    assert "\n" not in str(w.message) and "no-such-compiler" in str(w.message) and w.filename == "gatherlens"
    monkeypatch.setenv("GATHERLENS_NATIVE", "0")
    assert native.load_library(tmp_path / "other.cpp") is False  # switched off: not even tried
    monkeypatch.setattr(threshold_kernel, "kernel_loaded", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vals, idx = topk_rows(torch.tensor([[1.0, 3.0, 3.0, float("-inf")]]), 2)
    assert idx.tolist() == [[1, 2]]
    with pytest.raises(RuntimeError, match="did not build"):
        topk_rows(torch.zeros(1, 3), 1, native=True)


@needs_kernel
def test_a_failed_build_says_the_compiler_error_in_one_line_and_keeps_the_log(tmp_path, monkeypatch):
    source = tmp_path / "broken.cpp"
    source.write_text("#error this kernel does not compile\n")
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    with pytest.warns(GatherLensWarning) as caught:
        assert native.load_library(source) is False
    (w,) = caught.list
    text = str(w.message)
    assert "\n" not in text and "this kernel does not compile" in text and "numpy path" in text
    (log,) = (tmp_path / "cache" / "native").glob("broken-*/build.log")
    assert "this kernel does not compile" in log.read_text() and str(log) in text


def _op_inputs(seed=0, N=3, n=2, grp=4, W=50):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, n, grp, W, generator=g).transpose(2, 3).contiguous().transpose(2, 3)  # strided rows
    lens = torch.randint(0, W + 1, (N * grp,), generator=g)
    base = torch.randint(0, 1000, (N * grp,), generator=g)
    return x, lens, base


@needs_kernel
def test_the_operators_pass_opcheck():
    x, lens, base = _op_inputs()
    for args in ((x, lens, base, 7, True, 0, 12), (x, None, None, 7, False, 3, 9), (x[:, :1], lens, None, 80, True, 0, 12)):
        torch.library.opcheck(torch.ops.gatherlens.topk_rows.default, args)
    dense = torch.randn(6, 40, dtype=torch.float64)
    torch.library.opcheck(torch.ops.gatherlens.topk_weights_into.default, (dense, torch.arange(6) * 7, 5))


@needs_kernel
def test_the_operators_trace_under_torch_compile_and_show_in_the_profiler():
    x, lens, base = _op_inputs(seed=3)

    def f(x):
        vals, idx, w, lse = torch.ops.gatherlens.topk_rows(x, lens, base, 9, True, 0, 12)
        return (w * vals.exp()).sum(-1) + lse, idx

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for a, b in zip(compiled(x), f(x)):
        assert torch.equal(a, b)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        topk_rows(x[:, 0], 9, weights=True)
        topk_weights_(torch.randn(4, 30), 3)
    names = {e.key for e in prof.key_averages()}
    assert {"gatherlens::topk_rows", "gatherlens::topk_weights_into"} <= names


@needs_kernel
def test_summed_rows_add_the_heads_in_order_on_both_paths():
    s = torch.randn(2, 3, 4, 5, 60)                             # (B, Hkv, G, C, Lc)
    lens = torch.randint(0, 61, (2 * 3 * 5,))
    got = [topk_summed_rows(s, 11, lens=lens, native=n) for n in (True, False)]
    for a, b in zip(*got):
        assert torch.equal(a, b)


@needs_kernel
def test_the_operator_refuses_bad_rows():
    x, lens, _ = _op_inputs()
    with pytest.raises(RuntimeError, match=r"lens\[0\] = 51 is outside \[0, 50\]"):
        torch.ops.gatherlens.topk_rows(x, torch.full_like(lens, 51), None, 3, False, 0, 12)
    with pytest.raises(RuntimeError, match=r"rows \[0, 13\) are outside \[0, 12\]"):
        torch.ops.gatherlens.topk_rows(x, None, None, 3, False, 0, 13)
    with pytest.raises(RuntimeError, match="must be float32 or float64"):
        torch.ops.gatherlens.topk_weights_into(torch.zeros(2, 3, dtype=torch.int64), None, 1)
