"""parallelize_embedding (DTensor RowwiseParallel + gatherlens' checks) on 3 and 4 gloo processes.

Vocabulary 50257 (GPT-2's, uneven over 3 and 4 ranks). Forward bitwise equal to one process,
gradients equal, out-of-range ids raising the same GatherIndexError on every rank with no rank
left waiting, vocabulary-parallel cross-entropy (loss_parallel) within 1e-6.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gatherlens
from gatherlens.dist import check_targets, run_ranks, shard_rows
from gatherlens.errors import GatherIndexError

V, D = 50257, 8
TIMEOUT = 90


def _ids(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, 11), generator=g)  # (B, S)
    ids[0, :3] = torch.tensor([0, V - 1, V - 1])  # both ends, a repeat
    ids[2, 5] = 7  # the padding row of one case
    return ids


def _table(seed: int = 0, **kw) -> nn.Embedding:
    torch.manual_seed(seed)
    return nn.Embedding(V, D, **kw)


def _lookup_case(mesh, kw: dict, gatherlens_module: bool = False):
    """(out equal, grad equal, weights after equal, local rows) against one process."""
    from gatherlens.dist import parallelize_embedding

    ref = _table(**kw)
    emb = _table(**kw)
    if gatherlens_module:
        emb = gatherlens.Embedding.from_torch(emb)
    emb = parallelize_embedding(emb, mesh)
    ids = _ids(1)
    out, want = emb(ids), ref(ids)
    weights = torch.arange(D, dtype=torch.float32)
    (out * weights).sum().backward()
    (want * weights).sum().backward()
    grad = emb.weight.grad.full_tensor()
    return (torch.equal(out, want), torch.equal(grad, ref.weight.grad),
            torch.equal(emb.weight.full_tensor(), ref.weight.detach()), emb.weight.to_local().shape[0])


def _bad_ids(mesh):
    from gatherlens.dist import parallelize_embedding

    emb = parallelize_embedding(_table(), mesh)
    found = []
    for bad in (torch.tensor([[3, V]]), torch.tensor([[5, 6], [-1, 2]])):
        try:
            emb(bad)
            found.append(None)
        except GatherIndexError as e:
            found.append(str(e))
    found.append(torch.equal(emb(_ids(2)), _table()(_ids(2))))  # still in step: nobody hung
    return found


def _cross_entropy(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    from gatherlens.dist import vocab_parallel_cross_entropy

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, V, generator=g, requires_grad=True)  # (B, S, V)
    target = _ids(4)[:2, :5].clone()  # (B, S)
    target[1, 2] = -100
    ref = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
    ref.backward()
    sharded = distribute_tensor(logits.detach(), mesh, [Shard(-1)]).requires_grad_()
    with loss_parallel():
        loss = vocab_parallel_cross_entropy(sharded, target)
        loss.backward()
        bad = target.clone()
        bad[0, 4] = V
        try:
            vocab_parallel_cross_entropy(sharded, bad)
            error = None
        except GatherIndexError as e:
            error = str(e)
    return (abs(loss.full_tensor().item() - ref.item()),
            (sharded.grad.full_tensor() - logits.grad).abs().max().item(), error)


def worker():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {
        "plain": _lookup_case(mesh, {}),
        "padding_last_rank": _lookup_case(mesh, {"padding_idx": V - 1}),
        "padding_first_rank": _lookup_case(mesh, {"padding_idx": 7}),
        "max_norm": _lookup_case(mesh, {"max_norm": 1.0}),
        "gatherlens_module": _lookup_case(mesh, {"padding_idx": 7}, gatherlens_module=True),
        "bad_ids": _bad_ids(mesh),
        "cross_entropy": _cross_entropy(mesh),
    }


@pytest.fixture(scope="module", params=[pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],
                ids=["3_ranks", "4_ranks"])  # subprocesses: one per rank
def ranks(request):
    return run_ranks(worker, request.param, timeout=TIMEOUT)


@pytest.mark.parametrize("case", ["plain", "padding_last_rank", "padding_first_rank", "max_norm",
                                  "gatherlens_module"])
def test_lookup_bitwise_and_grads_equal_one_process(ranks, case):
    rows = shard_rows(V, len(ranks))
    for rank, res in enumerate(ranks):
        same_out, same_grad, same_weight, local_rows = res[case]
        assert same_out and same_grad and same_weight, (case, rank, res[case])
        assert local_rows == rows[rank][1] - rows[rank][0]


def test_uneven_split_is_torch_chunks():
    assert [hi - lo for lo, hi in shard_rows(V, 3)] == [16753, 16753, 16751]
    assert [hi - lo for lo, hi in shard_rows(V, 4)] == [12565, 12565, 12565, 12562]
    assert [len(c) for c in torch.arange(V).chunk(4)] == [12565, 12565, 12565, 12562]
    assert shard_rows(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]


def test_bad_id_raises_on_every_rank_without_a_hang(ranks):
    for res in ranks:
        too_big, negative, in_step = res["bad_ids"]
        assert too_big == f"token id {V} at position (0, 1) is outside the vocabulary [0, {V})"
        assert negative == f"token id -1 at position (1, 0) is outside the vocabulary [0, {V})"
        assert in_step


def test_vocab_parallel_cross_entropy(ranks):
    for res in ranks:
        loss_diff, grad_diff, error = res["cross_entropy"]
        assert loss_diff <= 1e-6 and grad_diff <= 1e-6
        assert error == f"target {V} at position (0, 4) is outside the vocabulary [0, {V}) (ignore_index = -100)"


def test_check_targets_alone():
    check_targets(torch.tensor([0, 4, -100]), 5)
    with pytest.raises(GatherIndexError, match=r"target -2 at position \(1,\)"):
        check_targets(torch.tensor([0, -2]), 5)
