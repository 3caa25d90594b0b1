"""The one page-choice rule in its three languages: torch (`page_choice.choose_pages`, sparse_decode
backend="torch"), the C++ operator (backend="native") and Triton (its interpreter, TRITON_INTERPRET=1,
in one child process: this file run as a script) pick the SAME pages on adversarial ties.

The auto budget (mass) follows one more rule in every language (`mass_reference` below): each selection
head walks the pages in that rank order and stops once their estimated mass (tokens * exp(scale * (bound -
the top bound)), nan weighing 0) reaches mass x the row's total, then clamps to [max(min_pages, forced), n].

The rule: page 0 and the recent window's pages (at least the last page) are always read; the others
rank by bound, nan lowest, -inf just above it, +inf just below the forced pages (`rankable`); equal
bounds (nan with nan, -inf with -inf, +inf with +inf, -0.0 with +0.0) go to the
lower page (select/ties.py: the lower index wins). Each case writes the page summaries [max | min]
of a head_dim-1 cache itself, so every path computes the same bounds exactly (q in {+-1, +-2}:
bound = relu(q) max + (-relu(-q)) min), and `rule_reference` below states the rule in plain Python.
"""
from __future__ import annotations

import math
import sys

import pytest
import torch
from triton_helpers import interpreted_results

from native_helpers import needs_native

from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse import fused_decode
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.ops.sparse.page_choice import choose_pages, pages_to_read

NAN, INF = float("nan"), float("inf")


def _row(*values):
    return [float(v) for v in values]


# id: (B, Hkv, q of the G heads of a group, P, length, budget, recent, share, group_score, max rows, min rows)
# max / min rows: one list per KV head (the same for every batch row but the last, which is reversed in
# page order where B = 2), of the N = page_count(length, P) pages. min None: 0 (the bound is max exactly).
CASES = {
    "all-equal": (1, 1, [1], 4, 48, 20, 0, False, "max", [[3.0] * 12], None),
    "all-equal-recent": (1, 2, [1], 4, 48, 24, 8, False, "max", [[1.0] * 12, [0.0] * 12], None),
    "pairs": (1, 1, [1], 4, 48, 24, 0, False, "max", [_row(9, 5, 5, 2, 2, 7, 7, 1, 1, 5, 5, 9)], None),
    "tie-at-the-cut": (1, 1, [1], 4, 40, 16, 0, False, "max", [_row(0, 8, 3, 6, 3, 3, 6, 3, 1, 0)], None),
    "tie-at-the-cut-batch2": (2, 2, [1], 2, 30, 8, 0, False, "max",
                              [_row(0, 4, 2, 2, 4, 2, 1, 2, 2, 0, 2, 2, 4, 2, 0), [0.5] * 15], None),
    "nan-and-neg-inf": (1, 1, [1], 4, 40, 20, 0, False, "max", [_row(1, NAN, -INF, NAN, 2, -INF, NAN, -INF, NAN, 1)],
                        None),
    "all-nan": (1, 1, [1], 4, 40, 16, 0, False, "max", [[NAN] * 10], None),
    "inf-below-forced": (1, 1, [1], 4, 40, 16, 0, False, "max", [_row(INF, INF, 5, INF, INF, 5, INF, 0, INF, INF)],
                         None),
    "forced-tied-with-others": (1, 1, [1], 4, 44, 20, 6, False, "max", [[2.0] * 11], None),
    "signed-zeros": (1, 1, [1], 4, 40, 16, 0, False, "max", [_row(1, -0.0, 0, -0.0, 0, -0.0, 0, -1, 0, 1)], None),
    "per-head-groups": (1, 2, [1, -1, 2], 4, 40, 16, 0, False, "max",
                        [_row(3, 2, 2, 1, 2, 2, 0, 2, 2, 3), _row(1, 1, 1, 1, 1, 1, 1, 1, 1, 1)],
                        [_row(-1, -2, -1, -2, -1, -2, -1, -2, -1, -2), _row(0, -1, -1, 0, 0, -1, -1, 0, 0, 0)]),
    "shared-max": (1, 2, [1, -1], 4, 40, 16, 0, True, "max",
                   [_row(3, 2, 1, 2, 1, 2, 1, 2, 1, 3), _row(1, 1, 1, 1, 1, 1, 1, 1, 1, 1)],
                   [_row(-1, -1, -2, -1, -2, -1, -2, -1, -2, -1), _row(0, -1, 0, -1, 0, -1, 0, -1, 0, 0)]),
    "shared-sum": (2, 1, [1, 2, -1], 4, 40, 16, 4, True, "sum",
                   [_row(1, 2, 0, 1, 3, 1, 0, 2, 1, 1)], [_row(-1, -1, 1, -1, -3, -1, 0, -2, -1, -1)]),
    "shared-max-nan": (1, 1, [1, -1], 4, 40, 16, 0, True, "max", [_row(1, NAN, 2, 2, INF, 2, -INF, 2, 1, 1)],
                       [_row(0, 0, 0, -1, 0, 0, 0, 0, -1, 0)]),
    "shared-sum-inf": (1, 1, [1, 1], 4, 40, 16, 0, True, "sum", [_row(1, INF, 2, -INF, 2, INF, 2, 2, 1, 1)], None),
}


def build(case):
    """(q (B, Hq, 1, 1), cache, budget, recent, share, group_score) of one case; the summaries written in place."""
    B, Hkv, qs, P, L, budget, recent, share, group, mx, mn = case
    N, G = page_count(L, P), len(qs)
    cache = PagedKVCache(B, Hkv, 1, page_size=P)
    g = torch.Generator().manual_seed(L)
    cache.append(torch.zeros(B, Hkv, L, 1), torch.randn(B, Hkv, L, 1, generator=g))  # (B, Hkv, L, 1) each
    hi = torch.tensor(mx).expand(B, Hkv, N).clone()  # (B, Hkv, N)
    lo = torch.zeros(B, Hkv, N) if mn is None else torch.tensor(mn).expand(B, Hkv, N).clone()  # (B, Hkv, N)
    if B > 1:
        hi[-1], lo[-1] = hi[-1].flip(-1), lo[-1].flip(-1)
    summaries = cache.writable(0)[2]  # (B, Hkv, cap, 2) the storage, [max | min]
    summaries[:, :, :N, 0], summaries[:, :, :N, 1] = hi, lo
    q = torch.tensor(qs, dtype=torch.float32).repeat(Hkv).expand(B, Hkv * G).reshape(B, Hkv * G, 1, 1)  # (B, Hq, 1, 1)
    return q, cache, budget, recent, share, group


def intended_scores(case) -> torch.Tensor:
    """(B, Hsel, N): the bounds every path should compute, reduced over a group when shared."""
    q, cache, _, _, share, group = build(case)
    B, Hq = q.shape[:2]
    s = cache.summaries.float()  # (B, Hkv, N, 2)
    G = Hq // cache.kv_heads
    qq = q.view(B, cache.kv_heads, G, 1)  # (B, Hkv, G, 1)
    bounds = qq.clamp(min=0) * s[:, :, None, :, 0] + qq.clamp(max=0) * s[:, :, None, :, 1]  # (B, Hkv, G, N)
    if not share:
        return bounds.reshape(B, Hq, -1)  # (B, Hq, N)
    return bounds.amax(2) if group == "max" else bounds.sum(2)  # (B, Hkv, N)


def rule_reference(scores: torch.Tensor, n: int, first: int) -> torch.Tensor:
    """The rule in plain Python: (B, Hsel, N) scores -> (B, Hsel, n) pages ascending."""
    B, H, N = scores.shape
    if n >= N:
        return torch.arange(N).expand(B, H, N)

    big = torch.finfo(torch.float32).max

    def rank(v: float) -> float:  # nan lowest, -inf just above it, +inf just below the forced pages
        return -INF if math.isnan(v) else (big if v == INF else (-big if v == -INF else v + 0.0))

    out = []
    for row in scores.reshape(-1, N).tolist():
        forced = {0, *range(first, N)}
        free = sorted((p for p in range(N) if p not in forced), key=lambda p: (-rank(row[p]), p))
        out.append(sorted(forced | set(free[:n - len(forced)])))
    return torch.tensor(out).view(B, H, n)


def expected(name):
    case = CASES[name]
    _, cache, budget, recent, _, _ = build(case)
    n, first = pages_to_read(cache.length, cache.page_size, budget, recent)
    return rule_reference(intended_scores(case), n, first), n, first


def pages_of(name, backend, mass=None, min_pages=1):
    q, cache, budget, recent, share, group = build(CASES[name])
    _, sel = sparse_decode(q, cache, budget, share_selection=share, group_score=group, recent=recent,
                           backend=backend, return_selection=True, mass=mass, min_pages=min_pages)
    return sel.pages, sel.bounds


# -- the auto budget: (case, mass, min_pages); head_dim 1, so the logit scale is 1 --
MASS_CASES = {f"{name}@{mass}/{floor}": (name, mass, floor) for name in
              ("pairs", "tie-at-the-cut", "tie-at-the-cut-batch2", "nan-and-neg-inf", "all-nan", "inf-below-forced",
               "per-head-groups", "shared-max", "shared-sum", "all-equal-recent", "signed-zeros")
              for mass, floor in ((0.55, 1), (0.95, 1), (0.95, 4), (0.999, 2))}


def _rank(v: float) -> float:  # nan lowest, -inf just above it, +inf just below the forced pages
    big = torch.finfo(torch.float32).max
    return -INF if math.isnan(v) else (big if v == INF else (-big if v == -INF else v + 0.0))


def mass_reference(scores: torch.Tensor, n: int, first: int, mass: float, floor: int, L: int, P: int):
    """The auto budget in plain Python: (B, Hsel, N) scores -> (pages (B, Hsel, n) ascending then -1, the
    smallest distance of a walked sum to its target relative to the total (how far from a rounding tie))."""
    B, H, N = scores.shape
    out, margin = [], INF
    for row in scores.reshape(-1, N).tolist():
        forced = sorted({0, *range(max(1, min(first, N - 1)), N)})
        free = sorted((p for p in range(N) if p not in forced), key=lambda p: (-_rank(row[p]), p))
        order, ranks = forced + free, [_rank(v) for v in row]
        top = max(ranks)
        w = [0.0 if top == -INF else min(P, L - p * P) * math.exp(ranks[p] - top) for p in range(N)]
        total, acc, need = sum(w), 0.0, len(order) + 1
        for i, p in enumerate(order):
            acc += w[p]
            margin = min(margin, abs(acc - mass * total) / total) if total else margin
            if acc >= mass * total and need > len(order):
                need = i + 1
        count = min(N, n, max(need, floor, min(n, len(forced))))
        out.append(sorted(order[:count]) + [-1] * (n - count))
    return torch.tensor(out).view(B, H, n), margin


def mass_expected(key):
    name, mass, floor = MASS_CASES[key]
    _, cache, budget, recent, _, _ = build(CASES[name])
    n, first = pages_to_read(cache.length, cache.page_size, budget, recent)
    return mass_reference(intended_scores(CASES[name]), n, first, mass, floor, cache.length, cache.page_size)


def test_the_mass_cases_are_not_at_a_rounding_tie_and_vary():
    """No walked sum lies within 1e-5 of its target (float32 and float64 orders agree), and the counts
    differ between cases (the rule is exercised, not every head at its floor or ceiling)."""
    counts = set()
    for key in MASS_CASES:
        want, margin = mass_expected(key)
        assert margin > 1e-5, key
        counts |= set((want >= 0).sum(-1).reshape(-1).tolist())
    assert len(counts) >= 4, counts


@pytest.mark.parametrize("key", MASS_CASES)
def test_torch_follows_the_mass_rule(key):
    name, mass, floor = MASS_CASES[key]
    want, _ = mass_expected(key)
    pages, bounds = pages_of(name, "torch", mass, floor)
    assert _same_bounds(bounds, intended_scores(CASES[name]))
    assert torch.equal(pages, want), (pages, want)


@pytest.mark.skipif(not fused_decode.kernel_loaded(), reason="no C++ compiler or ninja")
@pytest.mark.parametrize("key", MASS_CASES)
def test_the_cpp_operator_follows_the_mass_rule(key):
    name, mass, floor = MASS_CASES[key]
    want, _ = mass_expected(key)
    pages, _ = pages_of(name, "native", mass, floor)
    assert torch.equal(pages, want), (pages, want)


def _same_bounds(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def test_the_cases_are_adversarial():
    """Each case has a tie that the rule must break: equal scores on both sides of the cut, or among
    the pages it keeps, or non-finite scores."""
    for name, case in CASES.items():
        scores = intended_scores(case)  # (B, Hsel, N)
        ranked = scores.nan_to_num(nan=-INF)  # (B, Hsel, N)
        ties = (ranked[..., :, None] == ranked[..., None, :]).sum() > ranked.numel()
        assert ties or not bool(scores.isfinite().all()), name


@pytest.mark.parametrize("name", CASES)
def test_torch_follows_the_rule(name):
    want, n, first = expected(name)
    assert torch.equal(choose_pages(intended_scores(CASES[name]), n, first), want)
    pages, bounds = pages_of(name, "torch")
    assert _same_bounds(bounds, intended_scores(CASES[name]))
    assert torch.equal(pages.sort(-1).values, want)


@needs_native(fused_decode)
@pytest.mark.parametrize("name", CASES)
def test_the_cpp_operator_picks_the_same_pages(name):
    want, _, _ = expected(name)
    pages, bounds = pages_of(name, "native")
    assert _same_bounds(bounds, intended_scores(CASES[name]))
    assert torch.equal(pages.sort(-1).values, want)


def test_the_sync_free_tie_path_picks_the_same_pages(monkeypatch):
    """choose_pages off the CPU never asks whether a tie crosses the cut: that path, run here on CPU tensors."""
    monkeypatch.setattr(torch.Tensor, "is_cpu", property(lambda self: False))
    for name in CASES:
        want, n, first = expected(name)
        assert torch.equal(choose_pages(intended_scores(CASES[name]), n, first), want), name


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory)


@pytest.mark.slow  # a subprocess: Triton's interpreter
@pytest.mark.parametrize("name", CASES)
def test_triton_picks_the_same_pages(name, triton_results):
    want, _, _ = expected(name)
    pages, bounds = triton_results[name]
    assert _same_bounds(bounds, intended_scores(CASES[name]))
    assert torch.equal(pages.sort(-1).values, want)


@pytest.mark.parametrize("key", MASS_CASES)
def test_triton_follows_the_mass_rule(key, triton_results):
    want, _ = mass_expected(key)
    pages, _ = triton_results[key]
    assert torch.equal(pages, want), (pages, want)


def test_triton_attends_over_each_heads_own_pages(triton_results):
    """The Triton attention over auto-budget pages (-1 padded) equals the float64 reference over each head's pages."""
    out, ref = triton_results["attention"]
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def _attention_case():
    """q (1, 6, 1, 16), a cache of 101 tokens in pages of 4 with loud pages, the auto budget's pages (torch)."""
    g = torch.Generator().manual_seed(3)
    cache = PagedKVCache(1, 2, 16, page_size=4)
    k = torch.randn(1, 2, 101, 16, generator=g)
    k[:, :, 40:48] *= 4
    cache.append(k, torch.randn(1, 2, 101, 16, generator=g))
    q = torch.randn(1, 6, 1, 16, generator=g)
    _, sel = sparse_decode(q, cache, 64, share_selection=False, recent=4, backend="torch", mass=0.9, min_pages=3,
                           return_selection=True)
    return q, cache, sel.pages


def _child(out_path: str, device: str = "cpu") -> None:
    """Every case's pages and bounds from the Triton path (interpreted on CPU), saved for the tests."""
    from gatherlens.ops.sparse.naive import sparse_attention_reference
    from gatherlens.ops.sparse.triton_decode import triton_attend_pages, triton_select_pages

    results = {}
    for name, case in CASES.items():
        q, cache, budget, recent, share, group = build(case)
        pages, bounds = triton_select_pages(q.to(device), cache, budget, share, group, recent)
        results[name] = (pages.cpu(), bounds.cpu())
    for key, (name, mass, floor) in MASS_CASES.items():
        q, cache, budget, recent, share, group = build(CASES[name])
        pages, _ = triton_select_pages(q, cache, budget, share, group, recent, mass=mass, min_pages=floor, scale=1.0)
        results[key] = (pages, None)
    q, cache, pages = _attention_case()
    out, _ = triton_attend_pages(q, cache, pages, 0.25)
    ref, _ = sparse_attention_reference(q, cache.keys, cache.values, pages.clamp(min=0), 4, 0.25)
    results["attention"] = (out, ref)
    torch.save(results, out_path)


if __name__ == "__main__":
    _child(*sys.argv[1:])
