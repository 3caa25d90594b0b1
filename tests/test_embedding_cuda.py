"""The same guarantees on CUDA (skipped without a GPU)."""
import re

import pytest
import torch
import torch.nn.functional as F

from gatherlens.errors import GatherIndexError, GatherValueError
from gatherlens.ops.embedding import METHODS, embedding_lookup

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("method", [m for m in METHODS if m != "naive"])
def test_methods_equal_f_embedding_on_cuda(method, dtype):
    table = torch.randn(300, 24, device="cuda").to(dtype)
    ids = torch.randint(0, 300, (4, 33), device="cuda", dtype=torch.int32)
    assert torch.equal(embedding_lookup(ids, table, method=method), F.embedding(ids, table))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_default_backward_deterministic_on_cuda(dtype):
    table = torch.randn(64, 128, device="cuda").to(dtype)
    ids = torch.randint(0, 64, (8192,), device="cuda")  # many repeats: atomics would reorder sums
    grad = torch.randn(8192, 128, device="cuda").to(dtype)
    grads = []
    for _ in range(3):
        w = table.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(embedding_lookup(ids, w, padding_idx=5), w, grad)[0])
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
    assert not grads[0][5].any()
    w = table.clone().requires_grad_(True)
    ref = torch.autograd.grad(F.embedding(ids, w, padding_idx=5), w, grad)[0]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(grads[0].float(), ref.float(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("size", [5, 100_000], ids=["few", "many"])
def test_bad_id_on_cuda_names_position(size):
    ids = torch.zeros(3, size, dtype=torch.long, device="cuda")
    ids[2, 4] = 77
    with pytest.raises(GatherIndexError, match=re.escape("token id 77 at position (2, 4) is outside the vocabulary [0, 50)")):
        embedding_lookup(ids, torch.zeros(50, 8, device="cuda"))


def test_check_syncs_once_on_success():
    """One device-to-host copy for the range check, not one per element."""
    table = torch.randn(1000, 16, device="cuda")
    ids = torch.randint(0, 1000, (64, 512), device="cuda")
    embedding_lookup(ids, table)  # warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            embedding_lookup(ids, table)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in record if "synchroniz" in str(w.message).lower()]
    assert 1 <= len(syncs) <= 2, [str(w.message) for w in record]


def test_device_mismatch():
    with pytest.raises(GatherValueError, match="cuda"):
        embedding_lookup(torch.tensor([1]), torch.zeros(5, 2, device="cuda"))
