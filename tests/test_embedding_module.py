"""`Embedding` replaces torch.nn.Embedding: same outputs, gradients, init rules and state_dict."""
import pytest
import torch
from torch import nn

from gatherlens.ops.embedding import Embedding


def _pair(**kwargs):
    torch.manual_seed(0)
    ref = nn.Embedding(11, 5, **kwargs)
    mine = Embedding(11, 5, **kwargs)
    mine.load_state_dict(ref.state_dict())
    return mine, ref


@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 3}, {"padding_idx": -1}, {"max_norm": 1.0},
                                    {"scale_grad_by_freq": True}, {"sparse": True}],
                         ids=["plain", "pad3", "pad-last", "max_norm", "scale_grad", "sparse"])
def test_same_outputs_and_gradients(kwargs):
    mine, ref = _pair(**kwargs)
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 10, 3]])
    out_mine, out_ref = mine(ids), ref(ids)
    assert torch.equal(out_mine, out_ref)
    grad = torch.randn_like(out_ref)
    out_mine.backward(grad)
    out_ref.backward(grad)
    g_mine, g_ref = mine.weight.grad, ref.weight.grad
    if kwargs.get("sparse"):
        g_mine, g_ref = g_mine.to_dense(), g_ref.to_dense()
    assert torch.equal(g_mine, g_ref)
    assert torch.equal(mine.weight, ref.weight)  # max_norm renormalises in place the same way


def test_padding_row_initialised_to_zero():
    emb = Embedding(7, 4, padding_idx=2)
    assert not emb.weight[2].any()
    assert emb.weight[0].any()
    assert emb.padding_idx == 2 and Embedding(7, 4, padding_idx=-1).padding_idx == 6


def test_from_pretrained_and_freeze():
    weights = torch.randn(6, 3)
    emb = Embedding.from_pretrained(weights)
    ref = nn.Embedding.from_pretrained(weights)
    assert not emb.weight.requires_grad
    ids = torch.tensor([5, 0, 2])
    assert torch.equal(emb(ids), ref(ids))
    assert Embedding.from_pretrained(weights, freeze=False).weight.requires_grad


def test_from_torch_shares_weight_and_state_dict_roundtrip():
    ref = nn.Embedding(9, 2, padding_idx=0)
    emb = Embedding.from_torch(ref)
    assert emb.weight is ref.weight
    back = nn.Embedding(9, 2, padding_idx=0)
    back.load_state_dict(emb.state_dict())
    assert torch.equal(back.weight, ref.weight)


def test_int32_ids_and_dtype_device_args():
    emb = Embedding(10, 4, dtype=torch.bfloat16)
    out = emb(torch.tensor([[1, 2]], dtype=torch.int32))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 4)


def test_bounds_policy_on_module():
    emb = Embedding(4, 2, bounds="clamp")
    with pytest.warns(UserWarning, match="clamped"):
        out = emb(torch.tensor([9]))
    assert torch.equal(out, emb.weight[[3]])
    assert "bounds='clamp'" in repr(emb)


def test_module_in_a_model_trains():
    torch.manual_seed(0)
    model = nn.Sequential(Embedding(20, 8), nn.Flatten(), nn.Linear(24, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 20, (16, 3))
    target = torch.randn(16, 1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = ((model(ids) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5
