"""gatherlens.trace.tracer: every gather-like op of a forward pass, with its module path."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module

from gatherlens.trace.tracer import TraceEvent, is_tracing, trace


class Toy(nn.Module):
    """One of each gather-like op, each in its own submodule."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.inner = nn.ModuleDict({"pick": Pick()})

    def forward(self, ids):
        x = self.emb(ids)                                      # (B, S, d)
        return self.inner["pick"](x)


class Pick(nn.Module):
    def forward(self, x):
        a = x.index_select(1, torch.tensor([2, 0]))             # (B, 2, d)
        b = torch.gather(x, 2, torch.zeros(1, 3, 2, dtype=torch.long))  # (B, 3, 2)
        c = torch.take_along_dim(x, torch.tensor([[[1], [0], [3]]]), dim=2)  # (B, 3, 1)
        d = x[:, torch.tensor([1, 1])]                          # (B, 2, d)
        e = x[:, 1:]                                            # slice: not a gather
        cache = torch.zeros(1, 6, 4)
        cache.index_copy_(1, torch.tensor([4]), x[:, :1])       # a KV-cache style write
        cache[:, torch.tensor([5])] = x[:, 2:3]                 # index_put via setitem
        s = torch.zeros(1, 3, 4).scatter_(2, torch.ones(1, 3, 1, dtype=torch.long), 1.0)
        return a, b, c, d, e, cache, s


def test_toy_events_in_order_with_module_paths():
    model = Toy()
    ids = torch.tensor([[3, 1, 4]])
    with trace() as t:
        model(ids)
    got = [(e.op, e.module, e.kind) for e in t.events]
    assert got == [
        ("embedding", "emb", "read"),
        ("index_select", "inner.pick", "read"),
        ("gather", "inner.pick", "read"),
        ("take_along_dim", "inner.pick", "read"),
        ("index", "inner.pick", "read"),
        ("index_copy", "inner.pick", "write"),
        ("index_put", "inner.pick", "write"),
        ("scatter", "inner.pick", "write"),
    ]
    emb = t.events[0]
    assert emb.module_type == "Embedding" and emb.input_shape == (10, 4)
    assert emb.index_shape == (1, 3) and emb.output_shape == (1, 3, 4)
    assert emb.dtype == torch.float32 and emb.index_dtype == torch.int64
    assert emb.bytes_read == 3 * 8 + 3 * 4 * 4  # ids + the rows read
    assert [e.step for e in t.events] == list(range(8))


def test_records_reproduce_what_the_ops_returned():
    model = Toy()
    ids = torch.tensor([[3, 1, 4]])
    with torch.no_grad(), trace() as t:
        a, b, c, d, *_ = model(ids)
    emb, sel, gat, tad, idx = t.events[:5]
    table = model.emb.weight.detach()
    assert torch.equal(emb.record(labels=["c", "a", "d"]).output, table[ids])
    assert torch.equal(sel.record().output, a)
    assert torch.equal(gat.record().output, b)
    assert torch.equal(tad.record().output, c)
    assert torch.equal(idx.record().output, d)


def test_loss_counts_as_a_gather_of_target_log_probs():
    logits = torch.randn(5, 7)
    target = torch.tensor([1, 0, 6, -100, 2])
    with trace() as t:
        F.cross_entropy(logits, target)
        F.nll_loss(torch.log_softmax(logits, 1), target.clamp(min=0))
    ce, nll = t.events
    assert (ce.op, ce.kind, ce.index_shape, ce.input_shape) == ("cross_entropy", "loss", (5,), (5, 7))
    assert nll.op == "nll_loss"
    rec = ce.record()
    keep = target != -100
    expected = torch.log_softmax(logits, 1)[keep].gather(1, target[keep][:, None])
    assert torch.allclose(rec.output, expected)


def test_tracing_off_installs_nothing():
    pre, post = dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)
    assert not is_tracing()
    with trace():
        assert is_tracing()
        assert len(nn_module._global_forward_pre_hooks) == len(pre) + 1
        assert torch._C._len_torch_function_stack() >= 1
    assert not is_tracing()
    assert dict(nn_module._global_forward_pre_hooks) == pre and dict(nn_module._global_forward_hooks) == post
    assert torch._C._len_torch_function_stack() == 0


def test_exception_inside_the_block_still_cleans_up():
    with pytest.raises(RuntimeError, match="boom"):
        with trace():
            raise RuntimeError("boom")
    assert not is_tracing() and torch._C._len_torch_function_stack() == 0
    with trace() as t:  # works again afterwards
        nn.Embedding(4, 2)(torch.tensor([1]))
    assert [e.op for e in t.events] == ["embedding"]


def test_keep_tensors_false_keeps_facts_only():
    with trace(keep_tensors=False) as t:
        nn.Embedding(4, 2)(torch.tensor([[1, 3]]))
    (e,) = t.events
    assert e.index_shape == (1, 2) and e.tensors == {}
    with pytest.raises(ValueError, match="keep_tensors=True"):
        e.record()


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Embedding(5, 2) for _ in range(3)])

    def forward(self, ids):
        return [layer(ids) for layer in self.layers]


def test_summary_groups_layers():
    with trace() as t:
        Stack()(torch.tensor([0, 1]))
        nn.Embedding(3, 2)(torch.tensor([2]))  # a module called on its own is a top level: ""
    assert [e.module for e in t.events] == ["layers.0", "layers.1", "layers.2", ""]
    assert [e.forward for e in t.events] == [0, 0, 0, 1]
    row = t.summary()[0]
    assert row["module"] == "layers.*" and row["count"] == 3 and row["bytes_read"] == 3 * (16 + 16)
    assert isinstance(t.events[0], TraceEvent) and t.events[0].as_dict()["op"] == "embedding"


# -- real and tiny HF models -----------------------------------------------------------------------
def _paths_exist(model, events):
    for e in events:
        if e.module:
            model.get_submodule(e.module)  # raises if the path is wrong


def test_tiny_gpt2_a_family_the_tracer_was_not_written_for():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                       bos_token_id=1, eos_token_id=2)).eval()
    ids = torch.randint(3, 100, (1, 6))
    with torch.no_grad(), trace() as t:
        model(ids, labels=ids)
    emb = t.of(op="embedding")
    assert [e.module for e in emb] == ["transformer.wte", "transformer.wpe"]
    assert emb[0].input_shape == (100, 16) and emb[0].index_shape == (1, 6)
    (loss,) = t.of(kind="loss")
    assert loss.module == "" and loss.module_type == "GPT2LMHeadModel"
    _paths_exist(model, t.events)

    from gatherlens.models import use_topk_attention

    use_topk_attention(model, top_k=3)
    with torch.no_grad(), trace() as t:
        model(ids)
    att = t.of(op="topk_attention")
    assert [e.module for e in att] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    # the kernel's own internals are not listed: one event per attention call
    assert [e.op for e in t.events] == ["embedding", "embedding", "topk_attention", "topk_attention"]
    assert att[0].index_shape == (1, 2, 6, 3)
    rec = att[0].record()
    assert rec.op == "topk_attention"


@pytest.fixture(scope="module")
def smollm2():
    from gatherlens.models import load

    return load("smollm2")


@pytest.mark.slow
def test_smollm2_forward_lists_every_gather(smollm2):
    from gatherlens.models import topk_attention_enabled

    model = smollm2.model
    ids = smollm2.encode("The cat sat on the mat.")
    with torch.no_grad(), trace() as t:
        model(ids, labels=ids)
    assert t.events[0].op == "embedding" and t.events[0].module == "model.embed_tokens"
    assert t.events[0].input_shape == (49152, 576) and t.events[0].index_shape == tuple(ids.shape)
    # dense Llama forward: the embedding lookup and the loss gather, nothing else indexes by tensor
    assert [(e.op, e.module) for e in t.events] == [("embedding", "model.embed_tokens"), ("cross_entropy", "")]
    rec = t.events[0].record(labels=smollm2.token_strings(ids))
    assert torch.equal(rec.output[0], model.model.embed_tokens.weight.detach()[ids[0]])

    with torch.no_grad(), topk_attention_enabled(model, 4), trace() as t:
        model(ids)
    att = t.of(op="topk_attention")
    assert [e.op for e in t.events] == ["embedding"] + ["topk_attention"] * 30
    assert [e.module for e in att] == [f"model.layers.{i}.self_attn" for i in range(30)]
    assert att[0].index_shape == (1, 9, ids.shape[1], 4) and att[0].input_shape == (1, 3, ids.shape[1], 64)
    assert all(e.module_type == "LlamaAttention" for e in att)
    _paths_exist(model, t.events)


@pytest.mark.slow
def test_smollm2_static_cache_writes_are_traced(smollm2):
    model = smollm2.model
    ids = smollm2.encode("Hello")
    with torch.no_grad(), trace(keep_tensors=False) as t:
        model.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
    writes = t.of(kind="write")
    assert writes, "no KV-cache write seen"
    assert {e.module_pattern for e in writes} == {"model.layers.*.self_attn"}
    # keys and values, 30 layers, each forward of generate
    assert len(writes) == 2 * 30 * (max(e.forward for e in t.events) + 1)
    assert {e.op for e in writes} <= {"index_copy", "index_put"}


@pytest.mark.slow
def test_minilm_three_tables():
    from gatherlens.models import load

    mini = load("minilm")
    batch = mini.tokenizer(["A man is eating food.", "Hi"], return_tensors="pt", padding=True)
    with torch.no_grad(), trace() as t:
        mini.model(**batch)
    emb = t.of(op="embedding")
    assert [e.module for e in emb] == ["embeddings.word_embeddings", "embeddings.token_type_embeddings",
                                       "embeddings.position_embeddings"]
    assert emb[0].input_shape == (30522, 384)
    _paths_exist(mini.model, t.events)
