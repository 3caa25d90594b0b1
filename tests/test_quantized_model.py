"""load(..., quantized=True): the modules against plain references, and the real model against float32."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from installed import installed  # noqa: E402

from gatherlens.models.gguf.layers import QuantizedEmbedding, QuantizedLinear  # noqa: E402
from gatherlens.ops.embedding import embedding_lookup  # noqa: E402
from gatherlens.ops.quant import LinearConfig, QuantizedTable, pack_linear, quantized_linear, split_linear  # noqa: E402
from gatherlens.trace import trace  # noqa: E402


def _blocks(rows: int, cols: int, qtype: str, seed: int = 0) -> torch.Tensor:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype]))  # (rows, row_bytes)


@pytest.mark.parametrize("route", ["int4", "bf16", "float32", "dequant"])
@pytest.mark.parametrize("sizes", [(128, 64, 64), (48, 80, 16)])
def test_split_linear_equals_packing_each_part(route, sizes):
    raw = _blocks(sum(sizes), 96, "Q4_1")
    fused = pack_linear(raw, "Q4_1", LinearConfig(route=route))
    x = torch.randn(3, 96)
    start = 0
    for n, part in zip(sizes, split_linear(fused, sizes)):
        alone = pack_linear(raw[start:start + n], "Q4_1", LinearConfig(route=route))
        assert part.shape == alone.shape and torch.equal(part.raw, alone.raw)
        assert all(torch.equal(a, b) for a, b in zip(part.tensors, alone.tensors))
        assert torch.equal(quantized_linear(x, part), quantized_linear(x, alone))
        start += n


def test_split_linear_refuses_sizes_that_do_not_add_up():
    from gatherlens.errors import GatherValueError

    with pytest.raises(GatherValueError, match="sum to the weight's 64 rows"):
        split_linear(pack_linear(_blocks(64, 32, "Q4_1"), "Q4_1"), (32, 16))


def test_quantized_linear_module_is_quantized_linear():
    w = pack_linear(_blocks(48, 64, "Q8_0"), "Q8_0", LinearConfig(route="bf16"))
    lin, x = QuantizedLinear(w), torch.randn(2, 5, 64)
    assert torch.equal(lin(x), quantized_linear(x, w)) and lin(x).shape == (2, 5, 48)
    assert torch.equal(lin.dequantized_weight(), w.dequantize())


def test_quantized_embedding_traces_one_embedding_event():
    table = QuantizedTable.from_blocks(_blocks(37, 64, "Q8_0"), "Q8_0", "token_embd.weight")
    emb, ids = QuantizedEmbedding(table), torch.tensor([[3, 9, 3, 36]])
    with trace() as t:
        out = emb(ids)
    assert torch.equal(out, embedding_lookup(ids, table))
    assert [e.op for e in t.events] == ["embedding"]  # not the index_select on raw bytes it runs
    event = t.events[0]
    assert event.bytes_read == ids.numel() * 8 + 3 * table.row_bytes  # ids + 3 distinct rows of blocks
    assert event.input_shape == (37, 64)
    record = event.record()
    assert torch.equal(record.output, out) and record.rows == [3, 9, 36]


# -- the real model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models():
    from gatherlens.models import load

    installed("smollm2")  # skips only when the model package is missing: a load that fails, fails
    return load("smollm2"), load("smollm2", quantized=True)


def _austen(lm, n: int) -> torch.Tensor:
    from gatherlens.eval.corpus import austen_available, load_text

    return lm.encode(load_text("austen" if austen_available() else "pydoc")[:20000])[0, :n]  # (n,)


@pytest.mark.slow
def test_quantized_weights_are_the_float_models(models):
    dense, quant = models
    assert quant.info["quantized"] and type(quant.model.model.embed_tokens) is QuantizedEmbedding
    assert torch.equal(quant.model.model.embed_tokens.table.dequantize(), dense.model.model.embed_tokens.weight)
    for i in (0, 29):
        qd, dd = quant.model.model.layers[i], dense.model.model.layers[i]
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            assert torch.equal(qd.get_submodule(name).dequantized_weight(), dd.get_submodule(name).weight), name
        assert torch.equal(qd.input_layernorm.weight, dd.input_layernorm.weight)
    assert not any(p.is_meta for p in quant.model.parameters())


@pytest.mark.slow
def test_quantized_logits_and_perplexity_match_float(models, monkeypatch):
    """The prefill's products run the q8act kernels' integer GEMM where it is faster (the records' gemm_rows:
    x rounded to 8 bits per block, as every decode step and llama.cpp round it; measured +0.50% here):
    perplexity within 1% of the float model's, 95% of next-token argmaxes the same. Without it (every
    prefill product dequantized, float32 GEMM) the logits are the float model's, perplexity within 0.5%."""
    from gatherlens.ops.quant.products import linear

    dense, quant = models
    ids = _austen(dense, 1000)
    with torch.no_grad():
        ref = dense.model(ids.view(1, -1)).logits[0]  # (S, V)
        pre = quant.model(ids.view(1, -1)).logits[0]  # (S, V): the integer GEMM, x rounded to 8 bits
        monkeypatch.setattr(linear, "integer_gemm_faster", lambda x, weight: False)
        exact = quant.model(ids.view(1, -1)).logits[0]  # (S, V): prefill dequantizes, float32 GEMM
    assert torch.allclose(exact[:16], ref[:16], atol=1e-3, rtol=0)

    def ppl(logits):
        return math.exp(torch.nn.functional.cross_entropy(logits[:-1], ids[1:]).item())

    assert abs(ppl(exact) / ppl(ref) - 1) < 0.005 and abs(ppl(pre) / ppl(ref) - 1) < 0.01
    assert (pre.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95


@pytest.mark.slow
def test_decode_route_agrees_with_float(models):
    from transformers import DynamicCache

    dense, quant = models
    ids = _austen(dense, 64)
    cache, rows = DynamicCache(), []
    with torch.no_grad():
        ref = dense.model(ids.view(1, -1)).logits[0]  # (S, V)
        for i in range(ids.shape[0]):  # one token a step: int4 kernel, bf16 head
            rows.append(quant.model(ids[i:i + 1].view(1, 1), cache=cache, use_cache=True).logits[0, -1])
    dec = torch.stack(rows)  # (S, V)
    agree = int((dec[:32].argmax(-1) == ref[:32].argmax(-1)).sum())
    assert agree >= 28, f"{agree} of 32 next-token argmaxes agree"
    nll = torch.nn.functional.cross_entropy
    assert abs(nll(dec[:-1], ids[1:]).item() - nll(ref[:-1], ids[1:]).item()) < 0.05  # nats a token


@pytest.mark.slow
def test_sparse_decoding_runs_the_quantized_stack(models):
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding
    from gatherlens.models.runtime.step import step_declarations

    _, quant = models
    ids = quant.encode("The capital of France is Paris. The capital of Germany is")
    with torch.no_grad():
        plain = quant.model.generate(ids, max_new_tokens=12, do_sample=False)
        use_sparse_decoding(quant.model, budget=None)
        try:
            rows = step_declarations(quant.model)
            assert rows["stack"] is None and rows["planned"] is None and rows["hf"] is None
            assert "transformers model's" in rows["chunk"]  # the native runtime's prefill row
            stacked = quant.model.generate(ids, max_new_tokens=12, do_sample=False)
        finally:
            use_dense_decoding(quant.model)
    assert torch.equal(plain, stacked)


@pytest.mark.slow
def test_trace_records_the_quantized_embedding(models):
    _, quant = models
    ids = quant.encode("The cat sat")
    with trace() as t, torch.no_grad():
        quant.model(ids)
    events = t.of(op="embedding")
    assert len(events) == 1 and events[0].module == "model.embed_tokens"
    assert events[0].record().qtype == "Q8_0"
