"""The native (C++) path of block-sparse prefill against the float64 reference and the torch paths: the
attention over the kept blocks (any map, odd sizes, a chunk's offset, GQA / MQA, every budget), the
antidiagonal scores (equal within float rounding, the same blocks on ties), the operators as PyTorch
sees them, and the fallback when they did not build."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from native_helpers import needs_native

from gatherlens.errors import GatherValueError
from gatherlens.ops import backends
from gatherlens.ops.attention.variants import AttentionVariant
from gatherlens.ops.prefill import fused_prefill
from gatherlens.ops.prefill.attend import ANTIDIAGONAL, BLOCK_PREFILL, select_blocks, sparse_prefill
from gatherlens.ops.prefill.blocked import block_prefill
from gatherlens.ops.prefill.config import DEFAULT, EXACT
from gatherlens.ops.prefill.naive import block_prefill_reference
from gatherlens.ops.prefill.rules import antidiagonal_scores
from gatherlens.ops.prefill.selection import block_geometry
from gatherlens.ops.sparse.geometry import ceil_div

needs_kernel = needs_native(fused_prefill)


def _qkv(B=1, Hq=4, Hkv=2, Q=37, L=37, D=16, Dv=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Q, D, generator=g).to(dtype)                       # (B, Hq, Q, D)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)                      # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, Dv or D, generator=g).to(dtype)                # (B, Hkv, L, Dv)
    return q, k, v


def _random_map(B, H, Q, L, block, window, seed, density):
    """(B, H, nq, nk) bool: each allowed block kept with probability `density`."""
    g = torch.Generator().manual_seed(seed)
    allowed = block_geometry(Q, L, block, window)                              # (nq, nk)
    return (torch.rand(B, H, *allowed.shape, generator=g) < density) & allowed  # (B, H, nq, nk)


def _assert_matches_reference(q, k, v, blocks, block, variant=AttentionVariant(), atol=2e-5):
    out, lse = BLOCK_PREFILL(q, k, v, blocks, block, None, variant, backend="native")  # (B, Hq, Q, Dv), (B, Hq, Q)
    ref, ref_lse = block_prefill_reference(q, k, v, blocks, block, None, variant)
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=atol)
    assert torch.equal(lse.isneginf(), ref_lse.isneginf())                    # the rows that saw no key
    seen = ~ref_lse.isneginf()
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=atol, rtol=atol)


@st.composite
def _problems(draw):
    """Odd sizes: Q not a multiple of the block, L > Q (a chunk after earlier ones), GQA / MQA / MHA,
    per-head or shared maps, a window or none, maps from empty to every allowed block."""
    G, Hkv = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    Q = draw(st.integers(1, 70))
    L = Q + draw(st.sampled_from([0, 0, 1, 17, 64]))
    shape = dict(B=draw(st.integers(1, 2)), Hq=G * Hkv, Hkv=Hkv, Q=Q, L=L, D=draw(st.sampled_from([4, 8, 16])),
                 Dv=draw(st.sampled_from([None, 8])))
    H = draw(st.sampled_from([Hkv, G * Hkv]))
    window = draw(st.sampled_from([None, None, 1, 9, 40]))
    return shape, H, draw(st.integers(1, 24)), window, draw(st.sampled_from([0.0, 0.2, 0.6, 1.0])), \
        draw(st.integers(0, 2 ** 16))


@needs_kernel
@settings(max_examples=80, deadline=None)
@given(_problems())
def test_native_equals_the_reference_on_any_map(problem):
    shape, H, block, window, density, seed = problem
    q, k, v = _qkv(**shape, seed=seed)
    blocks = _random_map(shape["B"], H, shape["Q"], shape["L"], block, window, seed, density)
    _assert_matches_reference(q, k, v, blocks, block, AttentionVariant(window=window))


@needs_kernel
@pytest.mark.parametrize("shape,block", [
    (dict(Hq=4, Hkv=2, Q=37, L=37), 8), (dict(Hq=6, Hkv=1, Q=50, L=50), 7), (dict(Hq=4, Hkv=4, Q=64, L=64), 16),
    (dict(B=2, Hq=6, Hkv=3, Q=100, L=100, D=64), 64), (dict(Hq=9, Hkv=3, Q=130, L=300, D=64), 64),
], ids=["gqa2", "mqa-block7", "mha", "batch2-block64", "chunk-Q130-of-L300"])
def test_every_block_kept_equals_sdpa(shape, block):
    q, k, v = _qkv(**shape)
    Q, L = shape["Q"], shape["L"]
    out = sparse_prefill(q, k, v, EXACT.replace(block_size=block), method="native")  # (B, Hq, Q, Dv)
    mask = torch.ones(Q, L, dtype=torch.bool).tril(L - Q)                    # bottom-right causal
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, sdpa, atol=2e-6, rtol=2e-5)


@needs_kernel
@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
def test_every_budget_from_all_blocks_to_few(share):
    q, k, v = _qkv(Hq=6, Hkv=2, Q=90, L=150, D=16)
    nk = ceil_div(150, 16)
    for budget in range(nk, 0, -3):
        config = DEFAULT.replace(block_size=16, stride=4, threshold=None, budget=budget, share_selection=share)
        blocks = select_blocks(q, k, config).blocks                            # (B, H, nq, nk)
        _assert_matches_reference(q, k, v, blocks, 16)


@needs_kernel
def test_sinks_join_after_the_operator_and_16_bit_inputs_are_widened():
    q, k, v = _qkv(Hq=4, Hkv=2, Q=45, L=60)
    blocks = _random_map(1, 2, 45, 60, 8, None, 3, 0.6)
    _assert_matches_reference(q, k, v, blocks, 8, AttentionVariant(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0])))
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    out, _ = BLOCK_PREFILL(qb, kb, vb, blocks, 8, None, AttentionVariant(), backend="native")
    ref, _ = block_prefill_reference(qb, kb, vb, blocks, 8)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref.double(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_queries_and_keys_of_any_strides():
    """transformers hands q as a transposed view (B, Q, Hq, D) and a cache's keys as slices."""
    q, k, v = _qkv(Hq=6, Hkv=2, Q=40, L=70)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)                       # (B, Hq, Q, D) strided
    kt = torch.cat([k, k], 2)[:, :, :70]                                       # (B, Hkv, L, D) a slice
    blocks = _random_map(1, 2, 40, 70, 8, None, 1, 0.5)
    _assert_matches_reference(qt, kt, v, blocks, 8)
    torch.testing.assert_close(ANTIDIAGONAL(qt, kt, 8, 4, 0.3, None, backend="native"),
                               antidiagonal_scores(q, k, 8, 4, 0.3), atol=1e-6, rtol=1e-5)


@st.composite
def _score_problems(draw):
    G, Hkv = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    stride = draw(st.sampled_from([1, 2, 4, 8]))
    block = stride * draw(st.integers(1, 4))
    Q = draw(st.integers(1, 90))
    L = Q + draw(st.sampled_from([0, 0, 3, 29, 64]))
    window = draw(st.sampled_from([None, None, 5, 33]))
    return dict(B=draw(st.integers(1, 2)), Hq=G * Hkv, Hkv=Hkv, Q=Q, L=L, D=8), block, stride, window, \
        draw(st.integers(0, 2 ** 16))


@needs_kernel
@settings(max_examples=80, deadline=None)
@given(_score_problems())
def test_native_scores_equal_the_reference_rule(problem):
    shape, block, stride, window, seed = problem
    q, k, _ = _qkv(**shape, seed=seed)
    got = ANTIDIAGONAL(q, k, block, stride, 0.35, window, backend="native")   # (B, Hq, nq, nk)
    ref = antidiagonal_scores(q, k, block, stride, 0.35, window)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(got == 0, ref == 0)                                    # the same blocks get nothing


@needs_kernel
@pytest.mark.parametrize("config", [
    DEFAULT.replace(block_size=8, stride=4, threshold=None, budget=3),
    DEFAULT.replace(block_size=8, stride=2, threshold=None, budget=5, share_selection=False),
], ids=["budget3", "budget5-per-head"])
def test_ties_keep_the_same_blocks_as_the_reference_rule(config):
    """Every key the same and integer queries: every tile of a row ties exactly in both paths, and the
    choice (choose_blocks: the lower block wins) keeps the same blocks."""
    q = torch.randint(-2, 3, (1, 4, 61, 8)).float()                           # (B, Hq, Q, D)
    k = torch.randint(-2, 3, (1, 2, 1, 8)).float().expand(1, 2, 77, 8)        # (B, Hkv, L, D) one key repeated
    scores = ANTIDIAGONAL(q, k, 8, config.stride, 0.35, None, backend="native")  # (B, Hq, nq, nk)
    assert (scores[0, :, -1, 1:6] == scores[0, :, -1, 1:2]).all()             # the ties are there
    native = select_blocks(q, k, config.replace(backend="native")).blocks      # (B, H, nq, nk)
    assert torch.equal(native, select_blocks(q, k, config.replace(backend="torch")).blocks)


@needs_kernel
def test_auto_takes_the_native_rows_where_they_fit_and_says_why_not():
    q, k, v = _qkv(Q=40, L=40)
    blocks = _random_map(1, 2, 40, 40, 8, None, 0, 0.7)
    assert BLOCK_PREFILL.select(q, k, v, blocks, 8, None, AttentionVariant()).name == "native"
    why = dict(BLOCK_PREFILL.why(q, k, v, blocks, 8, None, AttentionVariant(softcap=5.0)))
    assert "softcap" in why["native"] and why["torch"] is None
    why = dict(BLOCK_PREFILL.why(q.double(), k.double(), v.double(), blocks, 8, None, AttentionVariant()))
    assert "float64" in why["native"]
    assert ANTIDIAGONAL.select(q, k, 8, 4, 0.25, None).name == "native"
    with pytest.raises(GatherValueError, match="softcap"):
        sparse_prefill(q, k, v, DEFAULT.replace(block_size=8, min_length=0), softcap=5.0, method="native")
    backends.reset_ran()
    sparse_prefill(q, k, v, DEFAULT.replace(block_size=8, stride=4))
    assert backends.ran() == {"antidiagonal_scores": {"native": 1}, "block_prefill": {"native": 1}}
    backends.reset_ran()
    out = sparse_prefill(q, k, v, DEFAULT.replace(block_size=8, stride=4, backend="torch"))   # the comparison switch
    assert backends.ran() == {"antidiagonal_scores": {"torch": 1}, "block_prefill": {"torch": 1}}
    torch.testing.assert_close(out, sparse_prefill(q, k, v, DEFAULT.replace(block_size=8, stride=4)),
                               atol=2e-6, rtol=2e-5)
    with pytest.raises(GatherValueError, match="backend"):
        DEFAULT.replace(backend="cuda")


def test_without_the_kernel_the_torch_paths_run(monkeypatch):
    monkeypatch.setattr(fused_prefill, "kernel_loaded", lambda: False)
    q, k, v = _qkv(Q=40, L=40)
    config = DEFAULT.replace(block_size=8, stride=4)
    blocks = select_blocks(q, k, config).blocks
    assert "did not build" in dict(BLOCK_PREFILL.why(q, k, v, blocks, 8, None, AttentionVariant()))["native"]
    assert BLOCK_PREFILL.select(q, k, v, blocks, 8, None, AttentionVariant()).name == "torch"
    assert ANTIDIAGONAL.select(q, k, 8, 4, 0.25, None).name == "torch"
    out = sparse_prefill(q, k, v, config)
    torch.testing.assert_close(out, block_prefill(q, k, v, blocks, 8)[0])
    with pytest.raises(GatherValueError, match="did not build"):
        sparse_prefill(q, k, v, config, method="native")


@needs_kernel
def test_the_operators_pass_opcheck_and_compile_with_their_fake_kernels():
    q, k, v = _qkv(Hq=6, Hkv=2, Q=30, L=50, D=8)
    blocks = _random_map(1, 2, 30, 50, 8, None, 0, 0.6)
    args = (q, k, v, blocks, 8, 0.35, None)
    tests = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.gatherlens.block_prefill.default, args, test_utils=tests)
    torch.library.opcheck(torch.ops.gatherlens.block_prefill.default, (q, k, v, blocks, 8, 0.35, 9), test_utils=tests)
    kp = torch.nn.functional.pad(k, (0, 0, 0, 6))                              # (B, Hkv, 56, D): whole tiles of 8
    torch.library.opcheck(torch.ops.gatherlens.antidiagonal_scores.default, (q, kp, 16, 8, 0.35, None, 50),
                          test_utils=tests)

    def f(qq):
        out, _ = torch.ops.gatherlens.block_prefill(qq, *args[1:])
        return out * 2 + torch.ops.gatherlens.antidiagonal_scores(qq, kp, 16, 8, 0.35, None, 50).sum()

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q), f(q))


@needs_kernel
def test_the_operators_check_their_inputs_with_a_clear_message():
    q, k, v = _qkv(Q=30, L=50, D=8)
    blocks = _random_map(1, 2, 30, 50, 8, None, 0, 0.6)
    with pytest.raises(RuntimeError, match="blocks must be"):
        torch.ops.gatherlens.block_prefill(q, k, v, blocks[..., :-1].contiguous(), 8, 0.35, None)
    with pytest.raises(RuntimeError, match="selection heads"):
        torch.ops.gatherlens.block_prefill(q, k, v, blocks[:, :1].expand(1, 3, -1, -1).contiguous(), 8, 0.35, None)
    with pytest.raises(RuntimeError, match="1 <= Q <= L"):
        torch.ops.gatherlens.block_prefill(torch.randn(1, 4, 60, 8), k, v, blocks, 8, 0.35, None)
    with pytest.raises(RuntimeError, match="padded"):
        torch.ops.gatherlens.antidiagonal_scores(q, k, 16, 8, 0.35, None, 50)
