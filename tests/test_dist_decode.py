"""sparse_decode_sharded on 2-4 gloo processes equals sparse_decode on the whole cache in one process.

Each world size spawns its ranks once (gatherlens.dist.run_ranks: a hard deadline, so a failing
rank cannot hang the run); every rank runs every case and returns its results; the tests below
compare them with one process. The pure pieces (candidates, merge) are also tested here directly.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.dist import (SequenceLayout, count_traffic, run_ranks, shard_cache, simulate_sharded_decode,
                             sparse_decode_sharded, split_sequence)
from gatherlens.dist.pages import local_candidates, merge_candidates
from gatherlens.errors import GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.naive import dense_decode_reference

TIMEOUT = 90

# name: (lengths by rank, B, Hq, Hkv, D, page, budget, share_selection, group_score, dtype)
CASES = {
    "even_2": ((64, 64), 1, 4, 4, 16, 16, 48, True, "max", torch.float32),
    "uneven_gqa_2": ((96, 37), 2, 8, 2, 16, 16, 64, True, "max", torch.float32),
    "per_head_2": ((80, 45), 1, 6, 2, 8, 8, 40, False, "max", torch.float32),
    "sum_groups_2": ((160, 3), 1, 8, 2, 16, 16, 64, True, "sum", torch.float32),
    "dense_budget_2": ((32, 21), 1, 4, 2, 16, 16, 4096, True, "max", torch.float32),
    "tiny_budget_2": ((48, 48), 1, 4, 1, 16, 16, 1, True, "max", torch.float32),
    "one_group_tail_2": ((64, 45), 1, 4, 1, 16, 16, 40, True, "max", torch.float32),
    "bf16_2": ((64, 50), 1, 8, 2, 32, 16, 48, True, "max", torch.bfloat16),
    "uneven_4": ((64, 32, 96, 7), 1, 8, 2, 16, 16, 64, True, "max", torch.float32),
    "empty_rank_4": ((32, 48, 13, 0), 2, 4, 2, 16, 16, 40, True, "max", torch.float32),
    "per_head_4": ((16, 64, 16, 33), 1, 4, 2, 16, 8, 56, False, "max", torch.float32),
    "dense_4": ((16, 16, 16, 5), 1, 4, 2, 16, 16, 53, True, "max", torch.float32),
}


def case_data(name: str):
    """Full keys, values and the query of a case (the same on every process: a fixed seed)."""
    lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    L = sum(lengths)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)  # (B, Hkv, L, D)
    q = torch.randn(B, Hq, 1, D, generator=g).to(dtype)  # (B, Hq, 1, D)
    return k, v, q


def _decode_case(name: str, rank: int):
    lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
    k, v, q = case_data(name)
    cache = shard_cache(k, v, lengths, P)[rank]
    with count_traffic() as traffic:
        out, lse, sel = sparse_decode_sharded(q, cache, budget, return_lse=True, return_selection=True,
                                              share_selection=share, group_score=gs)
    return {"out": out, "lse": lse, "pages": sel.pages, "calls": traffic.calls}


def _bad_cases(rank: int, world: int):
    """Bad input on some ranks: every rank must raise (and return its message), none may hang."""
    found = {}
    c = PagedKVCache(1, 2, 16, 16)
    c.append(torch.randn(1, 2, 20 if rank == 0 else 16, 16), torch.randn(1, 2, 20 if rank == 0 else 16, 16))
    bad = {"not_whole_pages": lambda: sparse_decode_sharded(torch.randn(1, 4, 1, 16), c, 32),
           "bad_query_on_last": lambda: sparse_decode_sharded(
               torch.randn(1, 4, 1, 8 if rank == world - 1 else 16), c, 32),
           "budget_differs": lambda: sparse_decode_sharded(torch.randn(1, 4, 1, 16), c, 32 + rank)}
    for name, call in bad.items():
        try:
            call()
            found[name] = None
        except GatherValueError as e:
            found[name] = str(e)
    return found


def worker(names: list[str]):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    results = {name: _decode_case(name, rank) for name in names}
    results["bad"] = _bad_cases(rank, world)
    return results


@pytest.fixture(scope="module", params=[pytest.param(2, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],
                ids=["2_ranks", "4_ranks"])  # subprocesses: one per rank
def ranks(request):
    world = request.param
    names = [n for n in CASES if len(CASES[n][0]) == world]
    return names, run_ranks(worker, world, names, timeout=TIMEOUT)


def _one_process(name: str):
    lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
    k, v, q = case_data(name)
    whole = PagedKVCache(B, Hkv, D, P, dtype=dtype)
    whole.append(k, v)
    return sparse_decode(q, whole, budget, share_selection=share, return_lse=True, return_selection=True,
                         group_score=gs, backend="torch")


def test_same_pages_out_and_lse_as_one_process(ranks):
    names, results = ranks
    for name in names:
        out1, lse1, sel1 = _one_process(name)
        for rank, res in enumerate(results):
            r = res[name]
            assert torch.equal(r["pages"], sel1.pages), f"{name}, rank {rank}: pages differ"
            tol = 1e-2 if CASES[name][-1] == torch.bfloat16 else 1e-5
            torch.testing.assert_close(r["out"].float(), out1.float(), atol=tol, rtol=tol, msg=f"{name} out")
            torch.testing.assert_close(r["lse"], lse1, atol=1e-5, rtol=1e-5, msg=f"{name} lse")
            assert torch.equal(r["out"], results[0][name]["out"]), f"{name}: ranks disagree"


def test_budget_at_least_length_is_dense(ranks):
    names, results = ranks
    for name in names:
        lengths, *_, budget, _, _, dtype = CASES[name]
        if budget < sum(lengths):
            continue
        k, v, q = case_data(name)
        out, lse = dense_decode_reference(q, k, v)
        torch.testing.assert_close(results[0][name]["out"], out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(results[0][name]["lse"], lse, atol=1e-5, rtol=1e-5)


def test_traffic_is_small_and_as_stated(ranks):
    names, results = ranks
    for name in names:
        lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
        L = sum(lengths)
        n = results[0][name]["pages"].shape[-1]
        Hsel = Hkv if share else Hq
        partial = 8 if dtype == torch.float64 else 4
        want = [("all_gather", 10 * 8)]
        if n < -(-L // P):
            want.append(("all_gather", B * Hsel * n * 8))
        want.append(("all_gather", B * Hq * (D + 1) * partial))
        for res in results:
            assert res[name]["calls"] == want, name
        cache_bytes = 2 * B * Hkv * L * D * torch.tensor([], dtype=dtype).element_size()
        assert sum(b for _, b in want) < cache_bytes


def test_bad_input_raises_on_every_rank(ranks):
    _, results = ranks
    world = len(results)
    for rank, res in enumerate(results):
        assert "not a whole number of pages" in res["bad"]["not_whole_pages"]
        assert "rank 0 holds 20 tokens" in res["bad"]["not_whole_pages"]
        msg = res["bad"]["bad_query_on_last"]
        assert ("expected (B, Hq, 1, D)" in msg) if rank == world - 1 else (f"rank {world - 1} rejected" in msg)
        assert "budget differs between ranks" in res["bad"]["budget_differs"]


def test_simulation_matches_the_ranks(ranks):
    names, results = ranks
    for name in names:
        lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
        k, v, q = case_data(name)
        out, lse, sel = simulate_sharded_decode(q, shard_cache(k, v, lengths, P), budget,
                                                share_selection=share, group_score=gs)
        assert torch.equal(sel.pages, results[0][name]["pages"])
        torch.testing.assert_close(out, results[0][name]["out"], atol=1e-6, rtol=1e-6)


# -- the pure pieces, in one process ----------------------------------------------------------
def _whole_rule(bounds: torch.Tensor, n: int) -> torch.Tensor:
    """Page 0, the last page, then the best by bound, ties to the lower page id: (B, H, N) -> (B, H, n)."""
    ranked = bounds.clone()
    ranked[..., 0] = ranked[..., -1] = float("inf")
    out = []
    for row in ranked.reshape(-1, ranked.shape[-1]).tolist():
        order = sorted(range(len(row)), key=lambda p: (-row[p], p))[:n]
        out.append(sorted(order))
    return torch.tensor(out).view(*bounds.shape[:-1], n)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=5), n=st.integers(2, 12),
       levels=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_candidates_merge_to_the_whole_cache_choice(sizes, n, levels, seed):
    """With heavy ties (few distinct bounds), any split merges to the one-process rule."""
    total = sum(sizes)
    if total < 1:
        return
    g = torch.Generator().manual_seed(seed)
    bounds = torch.randint(0, levels, (2, 3, total), generator=g).float()  # (B, H, N) many ties
    n = min(n, total)
    cands, start = [], 0
    for size in sizes:
        cands.append(local_candidates(bounds[..., start:start + size], start, n, total))
        start += size
    pages = merge_candidates(torch.stack([c[0] for c in cands]), torch.stack([c[1] for c in cands]), n)
    assert torch.equal(pages, _whole_rule(bounds, n))


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 40), n=st.integers(1, 40), levels=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_best_set_is_the_first_n_of_the_ranking(N, n, levels, seed):
    from gatherlens.dist.pages import best_set, rank_pages

    n = min(n, N)
    bounds = torch.randint(0, levels, (2, 3, N), generator=torch.Generator().manual_seed(seed)).float()
    _, first = rank_pages(bounds, torch.arange(N).expand(2, 3, N), n)  # (2, 3, n) by (bound desc, id asc)
    assert torch.equal(best_set(bounds, n), first.sort(dim=-1).values)


def test_layout_rules():
    assert split_sequence(100, 3, 16) == [48, 48, 4]
    assert split_sequence(20, 4, 16) == [16, 4, 0, 0]
    lay = SequenceLayout((48, 48, 4), 16)
    assert lay.page_offsets == (0, 3, 6) and lay.num_pages == 7 and lay.owner(6) == 2
    assert SequenceLayout((20, 0), 16).num_pages == 2
    with pytest.raises(GatherValueError, match="rank 0 holds 20 tokens"):
        SequenceLayout((20, 16), 16)
    with pytest.raises(GatherValueError, match="empty on every rank"):
        SequenceLayout((0, 0), 16)


def test_needs_an_initialised_group():
    c = PagedKVCache(1, 1, 8, 4)
    c.append(torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8))
    with pytest.raises(GatherValueError, match="init_process_group"):
        sparse_decode_sharded(torch.randn(1, 1, 1, 8), c, 4)


def cuda_worker(name: str):
    import torch.distributed as dist

    lengths, B, Hq, Hkv, D, P, budget, share, gs, dtype = CASES[name]
    k, v, q = (t.cuda() for t in case_data(name))
    world = dist.get_world_size()
    parts = split_sequence(sum(lengths), world, P)
    out, lse = sparse_decode_sharded(q, shard_cache(k, v, parts, P)[dist.get_rank()], budget, return_lse=True)
    return out.cpu(), lse.cpu(), dist.get_backend()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the NCCL path)")
def test_nccl_path_once():
    """One GPU per rank (NCCL allows no two ranks on one device): as many ranks as GPUs, up to 2."""
    name = "uneven_gqa_2"
    world = min(2, torch.cuda.device_count())
    results = run_ranks(cuda_worker, world, name, timeout=TIMEOUT, backend="nccl")
    out1, lse1, _ = _one_process(name)
    for out, lse, backend in results:
        assert backend == "nccl"
        torch.testing.assert_close(out, out1, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse, lse1, atol=1e-4, rtol=1e-4)
