"""Block-sparse prefill (ops/prefill): every block kept equals SDPA; the fast path equals the reference on any map;
the selection rules keep the sink, the local window and their budget."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.attention.variants import AttentionVariant
from gatherlens.ops.prefill import PrefillConfig, select_blocks, sparse_prefill
from gatherlens.ops.prefill.blocked import block_prefill, whole_blocks
from gatherlens.ops.prefill.config import DEFAULT, EXACT, POOLED
from gatherlens.ops.prefill.naive import block_prefill_reference
from gatherlens.ops.prefill.rules import antidiagonal_scores, pooled_scores
from gatherlens.ops.prefill.selection import block_geometry


def _qkv(B=1, Hq=4, Hkv=2, Q=37, L=37, D=16, Dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Q, D, generator=g).to(dtype)                       # (B, Hq, Q, D)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)                      # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, Dv or D, generator=g).to(dtype)                # (B, Hkv, L, Dv)
    return q, k, v


def _dense(q, k, v, scale=None, variant=AttentionVariant()):
    """Float64 dense attention, bottom-right causal, the variant written out."""
    B, Hq, Q, D = q.shape
    G, L = Hq // k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    kk, vv = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)  # (B, Hq, L, D|Dv)
    s = q.double() @ kk.transpose(-1, -2) * scale                             # (B, Hq, Q, L)
    if variant.softcap is not None:
        s = variant.softcap * torch.tanh(s / variant.softcap)
    qpos, kpos = torch.arange(L - Q, L)[:, None], torch.arange(L)[None, :]
    seen = kpos <= qpos
    if variant.window is not None:
        seen &= (qpos - kpos) < variant.window
    s = s.masked_fill(~seen, float("-inf"))
    if variant.sinks is not None:
        s = torch.cat([s, variant.sinks.double().view(1, Hq, 1, 1).expand(B, Hq, Q, 1)], -1)
        vv = torch.cat([vv, torch.zeros(B, Hq, 1, vv.shape[-1], dtype=torch.float64)], 2)
    return torch.softmax(s, -1) @ vv                                          # (B, Hq, Q, Dv)


EXACT_CASES = [
    pytest.param(dict(Hq=4, Hkv=2, Q=37, L=37), 8, id="gqa2-L37-block8"),
    pytest.param(dict(Hq=4, Hkv=4, Q=64, L=64), 16, id="mha-L64-block16"),
    pytest.param(dict(Hq=6, Hkv=1, Q=50, L=50), 7, id="mqa-L50-block7"),
    pytest.param(dict(B=2, Hq=6, Hkv=3, Q=33, L=33), 32, id="batch2-L33-block32"),
    pytest.param(dict(Hq=4, Hkv=2, Q=1 + 20, L=45), 8, id="chunk-Q21-of-L45"),
    pytest.param(dict(Hq=4, Hkv=2, Q=10, L=10, D=16, Dv=8), 4, id="narrow-values"),
]


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
@pytest.mark.parametrize("shape,block", EXACT_CASES)
def test_every_block_equals_sdpa(shape, block, share):
    q, k, v = _qkv(**shape)
    config = EXACT.replace(block_size=block, share_selection=share)
    out = sparse_prefill(q, k, v, config)                                     # (B, Hq, Q, Dv)
    torch.testing.assert_close(out.double(), _dense(q, k, v), atol=2e-6, rtol=2e-5)
    if q.shape[2] == k.shape[2] and q.shape[-1] == v.shape[-1]:
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(out, sdpa, atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(sparse_prefill(q, k, v, config, method="naive"), out, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_every_block_in_other_dtypes(dtype):
    q, k, v = _qkv(Q=40, L=40, dtype=dtype)
    out = sparse_prefill(q, k, v, EXACT.replace(block_size=16))
    assert out.dtype == dtype
    tol = 1e-10 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(out.double(), _dense(q, k, v), atol=tol, rtol=tol)


VARIANTS = [
    pytest.param(AttentionVariant(softcap=3.0), id="softcap"),
    pytest.param(AttentionVariant(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0])), id="sinks"),
    pytest.param(AttentionVariant(window=13), id="window13"),
    pytest.param(AttentionVariant(softcap=5.0, sinks=torch.tensor([1.0, 0.0, -2.0, 3.0]), window=20), id="all-three"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_block_with_each_variant(variant):
    q, k, v = _qkv(Q=45, L=45)
    config = EXACT.replace(block_size=8)
    out, lse = sparse_prefill(q, k, v, config, variant=variant, return_lse=True)
    torch.testing.assert_close(out.double(), _dense(q, k, v, variant=variant), atol=2e-6, rtol=2e-5)
    ref, ref_lse = block_prefill_reference(q, k, v, select_blocks(q, k, config, variant=variant).blocks, 8,
                                           variant=variant)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_window_drops_blocks_no_query_can_see():
    allowed = block_geometry(64, 64, 8, window=10)                            # (8, 8)
    assert allowed.sum(-1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]
    sel = select_blocks(*_qkv(Q=64, L=64)[:2], EXACT.replace(block_size=8), variant=AttentionVariant(window=10))
    assert sel.blocks[0, 0].equal(allowed)


@st.composite
def _problems(draw):
    G, Hkv = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    L = draw(st.integers(2, 70))
    Q = draw(st.integers(1, L))
    block = draw(st.integers(1, 24))
    return dict(B=draw(st.integers(1, 2)), Hq=G * Hkv, Hkv=Hkv, Q=Q, L=L, D=8), block, draw(st.integers(0, 2 ** 16))


@settings(max_examples=40, deadline=None)
@given(_problems(), st.booleans())
def test_fast_path_equals_the_reference_on_any_map(problem, share):
    """Odd sizes (L not a multiple of the block, Q < L), any random map within the allowed blocks."""
    shape, block, seed = problem
    q, k, v = _qkv(**shape, seed=seed)
    nq, nk = -(-shape["Q"] // block), -(-shape["L"] // block)
    H = shape["Hkv"] if share else shape["Hq"]
    g = torch.Generator().manual_seed(seed)
    blocks = (torch.rand(shape["B"], H, nq, nk, generator=g) < 0.5) & block_geometry(shape["Q"], shape["L"], block)
    out, lse = block_prefill(q, k, v, blocks, block)
    ref, ref_lse = block_prefill_reference(q, k, v, blocks, block)
    torch.testing.assert_close(out.double(), ref.double(), atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=2e-5)


RULES = [pytest.param(DEFAULT.replace(block_size=8, stride=4), id="antidiagonal"),
         pytest.param(POOLED.replace(block_size=8), id="pooled")]


@pytest.mark.parametrize("config", RULES)
@pytest.mark.parametrize("budget,threshold", [(3, None), (None, 0.5), (5, 0.8)],
                         ids=["budget3", "mass0.5", "budget5-mass0.8"])
def test_rules_keep_sink_local_and_their_budget(config, budget, threshold):
    q, k, v = _qkv(Q=77, L=77)
    config = config.replace(budget=budget, threshold=threshold)
    sel = select_blocks(q, k, config)
    blocks, allowed = sel.blocks, sel.allowed()                               # (B, H, nq, nk), (nq, nk)
    assert blocks.shape == (1, 2, 10, 10) and not (blocks & ~allowed).any()
    assert blocks[..., 0].all()                                               # the sink
    diag = torch.arange(10)
    assert blocks[..., diag, diag].all() and blocks[..., diag[1:], diag[1:] - 1].all()   # local: 2 blocks
    if budget is not None:
        assert int(blocks.sum(-1).max()) <= max(budget, 3)
    out = sparse_prefill(q, k, v, config)
    torch.testing.assert_close(out, sparse_prefill(q, k, v, config, method="naive"), atol=2e-6, rtol=2e-5)
    assert 0 < sel.kept_share() <= 1


@pytest.mark.parametrize("rule", ["antidiagonal", "pooled"])
def test_scores_are_shares_of_the_allowed_blocks(rule):
    q, k, _ = _qkv(Q=50, L=50)
    s = (antidiagonal_scores(q, k, 8, 4, 0.25) if rule == "antidiagonal" else pooled_scores(q, k, 8, 0.25))
    torch.testing.assert_close(s.sum(-1), torch.ones(s.shape[:-1]), atol=1e-5, rtol=0)
    assert (s[..., ~block_geometry(50, 50, 8)] == 0).all()


def test_antidiagonal_scores_sum_the_antidiagonals():
    """One head, L = 8, stride 2, block 4: the tile sums (over the stride: a mean logit) written out literally."""
    q, k, _ = _qkv(Hq=1, Hkv=1, Q=8, L=8, D=4)
    logits = (q[0, 0] @ k[0, 0].T).double()                                   # (8, 8)
    tiles = torch.tensor([[logits[2 * a + 1, 2 * b] + logits[2 * a, 2 * b + 1] for b in range(4)] for a in range(4)]) / 2
    tiles = tiles.masked_fill(torch.arange(4)[None, :] > torch.arange(4)[:, None], float("-inf"))
    p = torch.softmax(tiles, -1)                                              # (4, 4)
    blocks = p.view(2, 2, 2, 2).sum((1, 3))
    blocks = blocks / blocks.sum(-1, keepdim=True)
    torch.testing.assert_close(antidiagonal_scores(q, k, 4, 2, 1.0)[0, 0].double(), blocks.double(),
                               atol=1e-5, rtol=1e-5)


def test_whole_blocks_need_no_mask():
    whole = whole_blocks(20, 20, 8)                                           # (3, 3)
    assert whole.int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]


def test_kept_share_of_a_tight_budget_falls_with_length():
    q, k, _ = _qkv(Q=512, L=512, D=8)
    shares = [select_blocks(q[:, :, :n], k[:, :, :n], DEFAULT.replace(block_size=16, threshold=None, budget=4))
              .kept_share() for n in (128, 256, 512)]
    assert shares[0] > shares[1] > shares[2]


@pytest.mark.parametrize("change,err", [
    (dict(rule="vertical"), GatherValueError), (dict(block_size=0), GatherValueError),
    (dict(block_size=60, stride=16), GatherValueError), (dict(budget=0), GatherValueError),
    (dict(threshold=1.5), GatherValueError), (dict(threshold=0), GatherValueError),
    (dict(local_blocks=0), GatherValueError), (dict(share_selection=1), GatherTypeError),
    (dict(min_length=-1), GatherValueError),
], ids=["rule", "block0", "stride", "budget0", "threshold1.5", "threshold0", "local0", "share-int", "min-length"])
def test_bad_settings_name_the_argument(change, err):
    with pytest.raises(err, match=next(iter(change))):
        PrefillConfig(**change)


def test_bad_arguments():
    q, k, v = _qkv()
    with pytest.raises(GatherValueError, match="query length"):
        sparse_prefill(q, k[:, :, :5], v[:, :, :5])
    with pytest.raises(GatherValueError, match="method"):
        sparse_prefill(q, k, v, method="fast")
    with pytest.raises(GatherValueError, match="config"):
        sparse_prefill(q, k, v, {"budget": 3})
    with pytest.raises(GatherValueError, match="multiple"):
        sparse_prefill(q[:, :3], k, v)
