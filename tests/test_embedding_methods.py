"""Every lookup method equals F.embedding exactly, forward and backward, and the loop reference agrees."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.ops.embedding import METHODS, embedding_lookup, naive_lookup

TABLE_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
ID_DTYPES = [torch.int64, torch.int32]


@st.composite
def cases(draw):
    vocab = draw(st.integers(1, 37))
    dim = draw(st.integers(1, 13))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    dtype = draw(st.sampled_from(TABLE_DTYPES))
    id_dtype = draw(st.sampled_from(ID_DTYPES))
    transposed = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    if transposed:  # a non-contiguous (V, d) view of a (d, V) tensor
        table = torch.randn(dim, vocab, generator=gen, dtype=torch.float64).to(dtype).t()
    else:
        table = torch.randn(vocab, dim, generator=gen, dtype=torch.float64).to(dtype)
    ids = torch.randint(0, vocab, shape, generator=gen).to(id_dtype)
    return ids, table


@pytest.mark.parametrize("method", list(METHODS))
@given(case=cases())
def test_method_equals_f_embedding(method, case):
    ids, table = case
    expected = F.embedding(ids, table)  # (*S, d)
    got = embedding_lookup(ids, table, method=method)
    assert got.shape == (*ids.shape, table.shape[1])
    assert got.dtype == table.dtype
    assert torch.equal(got, expected)


@given(case=cases())
def test_naive_reference_agrees(case):
    ids, table = case
    assert torch.equal(naive_lookup(ids, table), F.embedding(ids, table))


@pytest.mark.parametrize("padding_idx", [None, 2, -1], ids=["no-pad", "pad2", "pad-last"])
@pytest.mark.parametrize("method", list(METHODS))
@given(case=cases())
def test_gradients_equal_f_embedding(method, padding_idx, case):
    ids, table = case
    table = table.to(torch.float64).contiguous()
    if padding_idx is not None and table.shape[0] < 3:
        padding_idx = -1
    mine = table.clone().requires_grad_(True)
    ref = table.clone().requires_grad_(True)
    grad = torch.randn(*ids.shape, table.shape[1], dtype=torch.float64)
    (g_mine,) = torch.autograd.grad(embedding_lookup(ids, mine, method=method, padding_idx=padding_idx), mine, grad,
                                    allow_unused=True)
    (g_ref,) = torch.autograd.grad(F.embedding(ids, ref, padding_idx=padding_idx), ref, grad, allow_unused=True)
    g_mine = torch.zeros_like(table) if g_mine is None else g_mine
    g_ref = torch.zeros_like(table) if g_ref is None else g_ref
    assert torch.allclose(g_mine, g_ref, rtol=0, atol=1e-12)
    if padding_idx is not None:
        assert not g_mine[padding_idx].any(), "the padding row must get no gradient"


@pytest.mark.parametrize("method", [m for m in METHODS if m != "naive"] + ["naive"])
def test_gradcheck_float64(method):
    table = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[1, 6, 1], [0, 2, 1]])
    assert torch.autograd.gradcheck(lambda w: embedding_lookup(ids, w, method=method), (table,))
    # (padding_idx is deliberately not a true gradient, for F.embedding too: tested against it above)


def test_naive_gradient_agrees_with_padding():
    table = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[5, 0, 5, 3]])
    (g,) = torch.autograd.grad(naive_lookup(ids, table, padding_idx=5).sum(), table)
    (r,) = torch.autograd.grad(F.embedding(ids, table, padding_idx=5).sum(), table)
    assert torch.equal(g, r)


@pytest.mark.parametrize("dtype", TABLE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 4096), (5000,)], ids=["small", "many-repeats"])
def test_default_backward_is_deterministic_and_exact(dtype, shape):
    """Repeated ids make the order of accumulation matter; two runs agree bit for bit with F.embedding."""
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(50, 16, generator=gen).to(dtype)
    ids = torch.randint(0, 50, shape, generator=gen)
    grad = torch.randn(*shape, 16, generator=gen).to(dtype)
    grads = []
    for lookup in (embedding_lookup, embedding_lookup, F.embedding):
        w = table.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(lookup(ids, w), w, grad)[0])
    assert torch.equal(grads[0], grads[1])
    assert torch.equal(grads[0], grads[2])


def test_large_cpu_path_forward_and_backward_exact():
    """Big enough for the huge-page output and the lazily zeroed gradient (>= 32 MiB)."""
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(8192, 1024, generator=gen)  # 32 MiB: the gradient takes the lazy path
    many = torch.randint(0, 8192, (2, 4100), generator=gen)  # output 32 MiB + a little
    few = torch.randint(0, 8192, (3, 7), generator=gen)  # lazily zeroed huge-page gradient
    few[0, :3] = 7  # the padding row, repeated
    for ids, padding_idx in ((many, None), (many, 7), (few, None), (few, 7)):
        w1, w2 = table.clone().requires_grad_(True), table.clone().requires_grad_(True)
        out1 = embedding_lookup(ids, w1, padding_idx=padding_idx)
        out2 = F.embedding(ids, w2, padding_idx=padding_idx)
        assert torch.equal(out1, out2)
        grad = torch.randn_like(out2)
        assert torch.equal(torch.autograd.grad(out1, w1, grad)[0], torch.autograd.grad(out2, w2, grad)[0])
    with torch.no_grad():
        assert torch.equal(embedding_lookup(ids, table), F.embedding(ids, table))


@pytest.mark.parametrize("method", list(METHODS))
def test_out_buffer_is_filled_and_reused(method):
    table = torch.randn(20, 5)
    out = torch.empty(2, 3, 5)
    for ids in (torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[19, 0, 0], [7, 7, 7]])):
        result = embedding_lookup(ids, table, method=method, out=out)
        assert result.data_ptr() == out.data_ptr()
        assert torch.equal(out, F.embedding(ids, table))


def test_zero_d_and_empty_ids():
    table = torch.randn(9, 4)
    assert torch.equal(embedding_lookup(torch.tensor(3), table), table[3])
    empty = embedding_lookup(torch.empty(0, 5, dtype=torch.long), table)
    assert empty.shape == (0, 5, 4)
