"""Edge inputs across the public ops and commands: each gives a result or the project's clear error."""
import pytest
import torch
from click.testing import CliRunner

from gatherlens import (Embedding, GatherLensError, GatherValueError, PagedKVCache, apply_attention_scores,
                        embedding_lookup, sparse_decode, topk_attention)
from gatherlens.cli import main


@pytest.mark.parametrize("method", ["fast", "embedding", "index_select"])
def test_int32_ids_backward_on_the_large_table_path(method):
    # (100000, 64) float32 is large enough for the lazily zeroed gradient path
    table = torch.randn(100_000, 64, requires_grad=True)
    ids = torch.tensor([[1, 2, 3, 2]], dtype=torch.int32)
    embedding_lookup(ids, table, method=method).sum().backward()
    ref = torch.randn(100_000, 64).copy_(table.detach()).requires_grad_()
    torch.nn.functional.embedding(ids.long(), ref).sum().backward()
    assert torch.equal(table.grad, ref.grad)


def test_out_with_zero_width_table():
    out = torch.empty(2, 0)
    assert embedding_lookup(torch.tensor([1, 2]), torch.randn(10, 0), out=out) is out


@pytest.mark.parametrize("size", [-1, 2.5, True])
def test_embedding_module_rejects_bad_sizes(size):
    with pytest.raises(GatherValueError, match="num_embeddings"):
        Embedding(size, 3)


def test_mask_may_not_enlarge_the_scores():
    with pytest.raises(GatherValueError, match="does not broadcast"):
        apply_attention_scores(torch.randn(1, 2, 4, 6), torch.randn(1, 2, 6, 3),
                               mask=torch.ones(3, 2, 4, 6, dtype=torch.bool))


def test_topk_attention_with_an_empty_batch():
    q, k = torch.randn(0, 2, 4, 8), torch.randn(0, 2, 6, 8)
    out, sel = topk_attention(q, k, k, 2, return_selection=True)
    assert out.shape == (0, 2, 4, 8) and sel.indices.shape == (0, 2, 4, 2)


@pytest.mark.parametrize("scale", ["x", float("nan"), -1.0, 0.0])
def test_sparse_decode_rejects_bad_scale(scale):
    cache = PagedKVCache(1, 2, 8, page_size=4)
    cache.append(torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
    with pytest.raises(GatherLensError, match="scale"):
        sparse_decode(torch.randn(1, 4, 1, 8), cache, budget=8, scale=scale)


def test_sparse_decode_rejects_zero_query_heads():
    cache = PagedKVCache(1, 2, 8, page_size=4)
    cache.append(torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))
    with pytest.raises(GatherValueError, match="query heads"):
        sparse_decode(torch.randn(1, 0, 1, 8), cache, budget=8)


def test_load_names_a_file_that_is_not_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"x")
    from gatherlens.models import load

    with pytest.raises(GatherValueError, match=r"fake.gguf' is not a GGUF file \(it starts with b'x', not b'GGUF'\)"):
        load(str(fake))


@pytest.mark.parametrize("args", [
    ["gather", "--shape", "100000,100000", "--index", "1"],
    ["gather", "--op", "embedding", "--ids", "3", "--vocab", "100000000", "--dim", "100000"],
    ["bench", "embedding", "--json", "/nonexistent-folder/x.json"],
    ["bench", "decode", "--json", "/nonexistent-folder/x.json"],
])
def test_cli_refuses_before_any_work(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and "Error" in result.output


def test_eval_takes_repeated_and_comma_separated_k(monkeypatch):
    seen = {}

    def fake_load(name, **kw):  # stop right after the options are parsed
        raise GatherValueError("stop")

    import gatherlens.commands.evaluate as ev
    monkeypatch.setattr(ev, "positive_ints", lambda v, h, w: seen.setdefault("ks", v) and [1])
    import gatherlens.models

    monkeypatch.setattr(gatherlens.models, "load", fake_load)
    CliRunner().invoke(main, ["eval", "-k", "8", "-k", "32,64"])
    assert seen["ks"] == "8,32,64"
