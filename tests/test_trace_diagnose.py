"""diagnose_gather: the article's silent W.gather(0, ids) warns; its 3-D index is explained."""
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.errors import GatherTypeError
from gatherlens.trace import GatherDiagnosticWarning, diagnose_gather

W = torch.arange(60.0).view(10, 6)  # (V, d)
IDS = torch.tensor([[3, 1, 4], [1, 5, 9]])  # (B, S), S <= d


def test_silent_scalar_per_token_warns_and_returns_a_finding():
    with pytest.warns(GatherDiagnosticWarning, match="one scalar per index entry"):
        finding = diagnose_gather(W, 0, IDS)
    assert finding.kind == "scalar_per_token" and finding.severity == "warning"
    assert "input[ids]" in finding.fix
    # and it is right: the call really returns W[ids[b, s], s]
    out = W.gather(0, IDS)
    assert all(out[b, s] == W[IDS[b, s], s] for b in range(2) for s in range(3))
    assert issubclass(GatherDiagnosticWarning, UserWarning)


def test_three_d_index_on_two_d_table_is_explained():
    bad = IDS.unsqueeze(-1).expand(-1, -1, 6)  # (B, S, d): the article's call
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        torch.gather(W, 0, bad)
    with pytest.warns(GatherDiagnosticWarning):
        finding = diagnose_gather(W, 0, bad)
    assert finding.kind == "ndim_mismatch" and finding.severity == "error"
    assert "Index tensor must have the same number of dimensions" in finding.message
    assert "reshape(-1, 1).expand(-1, d)" in finding.message


def test_seq_len_longer_than_d_is_explained():
    ids = torch.zeros(1, 8, dtype=torch.long)  # S = 8 > d = 6: torch raises
    with pytest.raises(RuntimeError):
        W.gather(0, ids)
    finding = diagnose_gather(W, 0, ids, warn=False)
    assert finding.kind == "index_too_large"


def test_out_of_range_is_explained():
    finding = diagnose_gather(W, 0, torch.tensor([[10]]), warn=False)
    assert finding.kind == "out_of_range" and "[0, 10)" in finding.message


@given(ids=st.lists(st.integers(0, 9), min_size=1, max_size=5))
def test_correct_row_lookup_is_quiet(ids):
    t = torch.tensor(ids)
    index = t.reshape(-1, 1).expand(-1, 6)  # (N, d): the fixed, flattened gather
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert diagnose_gather(W, 0, index) is None
    assert torch.equal(W.gather(0, index), W[t])


def test_partial_rows_warns():
    with pytest.warns(GatherDiagnosticWarning, match="first 1 of 6 columns"):
        finding = diagnose_gather(W, 0, torch.tensor([[3], [1]]))
    assert finding.kind == "partial_rows"


def test_other_gathers_are_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert diagnose_gather(W, 1, torch.tensor([[0, 5], [1, 1]])) is None  # dim 1
        x = torch.randn(2, 3, 4)
        assert diagnose_gather(x, 2, torch.zeros(2, 3, 1, dtype=torch.long)) is None


def test_non_tensors_are_refused():
    with pytest.raises(GatherTypeError):
        diagnose_gather([[1]], 0, IDS)
