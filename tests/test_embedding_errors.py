"""Each bad input gives the project's error, with the bad value, its position and the valid range."""
import re
import warnings

import pytest
import torch

from gatherlens.errors import GatherIndexError, GatherLensError, GatherTypeError, GatherValueError
from gatherlens.ops.embedding import METHODS, Embedding, OutOfVocabularyWarning, embedding_lookup, get_embeddings
from gatherlens.ops.embedding import methods as methods_module


def test_message_names_id_position_and_range():
    ids = torch.zeros(4, 20, dtype=torch.long)
    ids[3, 17] = 50257
    with pytest.raises(GatherIndexError) as err:
        embedding_lookup(ids, torch.zeros(50257, 1))
    assert str(err.value) == "token id 50257 at position (3, 17) is outside the vocabulary [0, 50257)"
    assert isinstance(err.value, IndexError) and isinstance(err.value, GatherLensError)


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("size", [3, 1000], ids=["few", "many"])  # host list vs one reduction
def test_negative_id(id_dtype, size):
    ids = torch.ones(2, size, dtype=id_dtype)
    ids[1, 2] = -1
    with pytest.raises(GatherIndexError, match=re.escape("token id -1 at position (1, 2) is outside the vocabulary [0, 8)")):
        embedding_lookup(ids, torch.zeros(8, 2))


def test_first_bad_id_reported_with_count():
    ids = torch.tensor([[0, 9, 12], [11, 1, 2]])
    with pytest.raises(GatherIndexError, match=re.escape("token id 9 at position (0, 1)") + ".*3 ids"):
        embedding_lookup(ids, torch.zeros(9, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.int16, torch.uint8], ids=str)
def test_non_integer_ids_name_dtype(dtype):
    with pytest.raises(GatherTypeError, match=re.escape(str(dtype))):
        embedding_lookup(torch.zeros(3, dtype=dtype), torch.zeros(5, 2))


def test_ids_not_a_tensor():
    with pytest.raises(GatherTypeError, match="list"):
        embedding_lookup([1, 2], torch.zeros(5, 2))


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()], ids=["1-D", "3-D", "0-D"])
def test_table_not_2d_names_shape(shape):
    with pytest.raises(GatherValueError, match=re.escape(str(shape))):
        embedding_lookup(torch.tensor([0]), torch.zeros(shape))


def test_get_embeddings_wants_2d_ids():
    with pytest.raises(GatherValueError, match=re.escape("(3,)")):
        get_embeddings(torch.tensor([0, 1, 2]), torch.zeros(5, 2))


def test_out_shape_mismatch():
    with pytest.raises(GatherValueError, match=re.escape("(2, 4)")):
        embedding_lookup(torch.tensor([0, 1]), torch.zeros(5, 3), out=torch.empty(2, 4))


def test_out_with_grad_is_refused():
    table = torch.zeros(5, 3, requires_grad=True)
    with pytest.raises(GatherValueError, match="requires grad"):
        embedding_lookup(torch.tensor([0, 1]), table, out=torch.empty(2, 3))


@pytest.mark.parametrize("padding_idx", [5, -6], ids=str)
def test_padding_idx_out_of_range(padding_idx):
    with pytest.raises(GatherIndexError, match="padding_idx"):
        embedding_lookup(torch.tensor([0]), torch.zeros(5, 3), padding_idx=padding_idx)


def test_unknown_method_and_bounds():
    with pytest.raises(GatherValueError, match="method"):
        embedding_lookup(torch.tensor([0]), torch.zeros(5, 3), method="magic")
    with pytest.raises(GatherValueError, match="bounds"):
        embedding_lookup(torch.tensor([0]), torch.zeros(5, 3), bounds="ignore")


@pytest.mark.parametrize("method", list(METHODS))
def test_error_comes_before_any_kernel(method, monkeypatch):
    """The method's function must never be called with a bad id: validation comes first."""
    def kernel_must_not_run(*args, **kwargs):
        raise AssertionError("kernel ran before validation")
    monkeypatch.setitem(methods_module.METHODS, method, kernel_must_not_run)
    with pytest.raises(GatherIndexError):
        embedding_lookup(torch.tensor([[1, 7]]), torch.zeros(5, 3), method=method)
    with pytest.raises(GatherTypeError):
        embedding_lookup(torch.tensor([[1.0]]), torch.zeros(5, 3), method=method)


def test_bounds_clamp_warns_and_clamps():
    table = torch.randn(5, 3)
    with pytest.warns(OutOfVocabularyWarning, match=re.escape("token id 7 at position (0, 1)")):
        out = embedding_lookup(torch.tensor([[1, 7, -2]]), table, bounds="clamp")
    assert torch.equal(out[0], table[[1, 4, 0]])


@pytest.mark.parametrize("method", list(METHODS))
def test_bounds_zero_warns_and_zeroes_rows(method):
    table = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    with pytest.warns(OutOfVocabularyWarning, match="2 token ids"):
        out = embedding_lookup(torch.tensor([[1, 7, -2, 0]]), table, bounds="zero", method=method)
    assert torch.equal(out[0, 0], table[1].detach())
    assert not out[0, 1:3].any()
    (grad,) = torch.autograd.grad(out.sum(), table)
    assert grad[0].tolist() == [1.0, 1.0, 1.0], "a zeroed row gives no gradient to row 0"


def test_bounds_off_skips_the_check():
    table = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(embedding_lookup(torch.tensor([4]), table, bounds="off"), table[[4]])
    with pytest.raises(IndexError):  # the kernel's own error, not ours
        embedding_lookup(torch.tensor([9]), table, bounds="off")


def test_module_checks_ids():
    emb = Embedding(10, 4)
    with pytest.raises(GatherIndexError, match=re.escape("token id 10 at position (1,)")):
        emb(torch.tensor([0, 10]))
    sparse = Embedding(10, 4, sparse=True)
    with pytest.raises(GatherIndexError):
        sparse(torch.tensor([-1]))
