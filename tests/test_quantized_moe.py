"""Mixture-of-experts layers run from their GGUF blocks (models/gguf/moe.py), against transformers.

Tiny random Qwen3MoE / Qwen2MoE models (2 layers, hidden 64, 4 experts, top 2; qwen2_moe with its
shared expert) are written to GGUF by tests/tiny_gguf.py (gguf's own GGUFWriter), in F32 and Q8_0, and
read back by transformers' own GGUF loader (`from_pretrained(folder, gguf_file=...)`) as the float reference. Its
GGUF config mapping (5.24) reads neither `expert_feed_forward_length` nor
`expert_shared_feed_forward_length`, so the reference is given the config the file was written from
(`config=`); its weights still all come from the file.
"""
from __future__ import annotations

import pytest
import torch

from lanes import sweep

from gatherlens.models.gguf.quantized import PREFILL_ROWS, linear_from
from gatherlens.ops.quant.products.matmul import pick_route
from gatherlens.models.gguf.layers import QuantizedLinear
from gatherlens.models.gguf.moe import (ExpertRouter, QuantizedExperts, fill_moe, has_experts, stacked_blocks)
from gatherlens.ops.quant import LinearConfig, pack_linear
from tiny_gguf import tiny_model, write_gguf

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

KINDS = ("qwen3moe", "qwen2moe")  # tests/tiny_gguf.py's rows: 2 layers, hidden 64, 4 experts of 32, top 2


# -- tiny models and files (tests/tiny_gguf.py) ----------------------------------------------------------
def linear_maker(route: str = "auto"):
    """The loader's `linear_from(raw, qtype)` ("auto"), or the same on another route where it takes qtype."""
    def other_route(raw, qtype):
        config = LinearConfig(route=pick_route(qtype, route), prefill_rows=PREFILL_ROWS)
        return QuantizedLinear(pack_linear(raw, qtype, config))
    return linear_from if route == "auto" else other_route


FILES = [(k, q) for k in KINDS for q in ("Q8_0", "F32")]


@pytest.fixture(scope="module", params=sweep(FILES, fast=("qwen2moe", "Q8_0")),  # its shared expert too
                ids=lambda p: "-".join(p))  # one file fast, the sweep slow
def moe_file(request, tmp_path_factory):
    """(source model, path, gguf reader, {name: tensor}, transformers' float load of the file)."""
    kind, qtype = request.param
    model = tiny_model(kind)
    folder = tmp_path_factory.mktemp(f"{kind}-{qtype}")
    path = write_gguf(model, kind, qtype, folder / f"tiny-{qtype}.gguf")
    reader = gguf.GGUFReader(path, mode="c")
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, config=model.config,
                                                            dtype=torch.float32).eval()
    return model, path, reader, {t.name: t for t in reader.tensors}, ref


def filled_block(ref, i: int, reader, tables, route: str = "auto"):
    """Layer i's MoE block built on the meta device, then filled from the file by fill_moe."""
    with torch.device("meta"):
        block = type(ref.model.layers[i].mlp)(ref.config)
    fill_moe(block, i, reader, tables, ref.config, linear_maker(route))
    assert not any(t.is_meta for t in [*block.parameters(), *block.buffers()])
    return block.eval()


def hidden_states(tokens: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, tokens, 64, generator=torch.Generator().manual_seed(seed))  # (1, T, d)


# -- the file as stored -------------------------------------------------------------------------------
def test_gguf_stores_experts_stacked_and_they_are_read_in_place(moe_file):
    model, _, reader, tables, _ = moe_file
    stacks = {k: tables[f"blk.0.{k}.weight"] for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
    qtype = stacks["ffn_gate_exps"].tensor_type.name
    per_row = {"F32": 4 * 64, "Q8_0": 2 * 34}[qtype]
    assert tuple(stacks["ffn_gate_exps"].data.shape)[:2] == (4, 32)                   # (E, I, ...)
    gate = stacked_blocks(stacks["ffn_gate_exps"])
    assert gate.shape == (4, 32, per_row) and gate.dtype == torch.uint8             # (E, I, row_bytes)
    assert stacked_blocks(stacks["ffn_down_exps"]).shape[:2] == (4, 64)               # (E, d, row_bytes)
    start = reader.data.ctypes.data
    assert start <= gate.data_ptr() < start + reader.data.nbytes                     # a view of the mapping
    assert tables["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert has_experts(tables, 1) and not has_experts(tables, 2)


# -- the router: transformers' math, exactly -------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_router_is_transformers_router(kind, tokens):
    block = tiny_model(kind).model.layers[0].mlp
    ours = ExpertRouter(block.gate.weight.detach(), block.gate.top_k, block.gate.norm_topk_prob)
    x = hidden_states(tokens)[0]  # (T, d)
    with torch.no_grad():
        for got, want in zip(ours(x), block.gate(x)):
            assert torch.equal(got, want)


def test_router_refuses_a_top_k_over_the_experts():
    from gatherlens.errors import GatherValueError

    with pytest.raises(GatherValueError, match=r"top_k must be in \[1, 4\].*got 5"):
        ExpertRouter(torch.zeros(4, 8), top_k=5)


# -- grouped experts against the plain per-token gather ---------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_grouped_experts_equal_the_per_token_reference(moe_file, tokens):
    _, _, reader, tables, ref = moe_file
    x = hidden_states(tokens)[0]  # (T, d)
    for route in ("dequant", "auto"):
        block = filled_block(ref, 0, reader, tables, route)
        _, weights, index = block.gate(x)  # (T, k), (T, k)
        with torch.no_grad():
            grouped = block.experts(x, index, weights)  # (T, d)
            one_by_one = torch.cat([block.experts(x[t:t + 1], index[t:t + 1], weights[t:t + 1])
                                    for t in range(tokens)])  # (T, d): each token alone
            plain = block.experts.reference(x, index, weights)  # (T, d)
        torch.testing.assert_close(grouped, one_by_one, rtol=1e-6, atol=1e-6)
        if route == "dequant":  # float32 products from the same blocks
            torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-6)


# -- one block, and the whole model, against transformers' float load of the same file -----------------
def x_rounding_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x W^T - x' W^T| <= sum_k |W[n, k]| dx(k) / 2, x' = x rounded to 8 bits per 32 (q8act): (n, N)."""
    from gatherlens.ops.quant.products.q8act_naive import quantize_activations

    _, dx = quantize_activations(x)  # (n, K/32)
    half_step = (dx / 2).float().repeat_interleave(32, dim=1)  # (n, K)
    return half_step @ w.abs().t() * (1 + 1e-4) + 1e-6  # (n, N), plus float32 sums' slack


def mlp_bound(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """|down(silu(gate x') * up x')' - the float MLP| for x (n, d) with every product's input rounded
    (q8act): |silu(a) - silu(b)| <= 1.1 |a - b|, and h's rounding step taken at |h| + its error."""
    g, u = x @ gate.t(), x @ up.t()  # (n, I)
    eg, eu = x_rounding_bound(x, gate), x_rounding_bound(x, up)  # (n, I)
    eh = 1.1 * eg * (u.abs() + eu) + torch.nn.functional.silu(g).abs() * eu  # (n, I)
    return eh @ down.abs().t() + x_rounding_bound((torch.nn.functional.silu(g) * u).abs() + eh, down)  # (n, d)


def block_bound(block, x: torch.Tensor) -> torch.Tensor:
    """The q8act rounding bound of a filled block's output (T, d): the routed experts' bounds, weighted
    (the float32 router picks the same experts on both sides), plus the shared expert's."""
    _, weights, index = block.gate(x)  # (T, k)
    experts, bound = block.experts, torch.zeros_like(x)  # (T, d)
    for e in range(experts.num_experts):
        parts = [m[e].dequantized_weight() for m in (experts.gate, experts.up, experts.down)]
        chose = (index == e).to(weights.dtype) * weights  # (T, k): token t's weight on expert e, or 0
        bound += chose.sum(-1, keepdim=True) * mlp_bound(x, *parts)  # (T, d)
    shared = getattr(block, "shared_expert", None)
    if shared is not None:
        parts = (getattr(shared, n).dequantized_weight() for n in ("gate_proj", "up_proj", "down_proj"))
        bound += torch.sigmoid(block.shared_expert_gate(x)) * mlp_bound(x, *parts)  # (T, d)
    return bound  # (T, d)


@pytest.mark.parametrize("tokens", [1, 8, 300])  # 300: experts of >= PREFILL_ROWS rows dequantize
def test_filled_block_matches_transformers_block(moe_file, tokens):
    _, _, reader, tables, ref = moe_file
    x = hidden_states(tokens)  # (1, T, d)
    for i in range(2):
        with torch.no_grad():
            want = ref.model.layers[i].mlp(x)  # (1, T, d)
            exact = filled_block(ref, i, reader, tables, "dequant")(x)
            block = filled_block(ref, i, reader, tables)
            fast = block(x)  # (1, T, d)
            bound = block_bound(block, x[0]) if block.experts.gate[0].qweight.route == "q8act" else None
        torch.testing.assert_close(exact, want, rtol=1e-5, atol=1e-6)
        if bound is not None:
            assert ((fast - want)[0].abs() <= bound).all()
        else:  # bf16 weights and x: 8 significant bits each
            assert (fast - want).abs().max() <= 2 ** -6 * want.abs().max()


def moe_model(ref, reader, tables, route: str = "auto"):
    """transformers' float load with every MoE block's router and experts replaced from the file."""
    model = transformers.AutoModelForCausalLM.from_config(ref.config).eval()
    model.load_state_dict(ref.state_dict())
    for i, layer in enumerate(model.model.layers):
        fill_moe(layer.mlp, i, reader, tables, ref.config, linear_maker(route))
    return model


IDS = torch.randint(0, 317, (1, 16), generator=torch.Generator().manual_seed(1))  # (1, 16): no control tokens
# (test, file) -> (max |logit difference| where no changed expert choice reaches, largest, flips):
# scripts/gguf_differences.py prints it
MEASURED: dict = {}


def routed(model, ids=IDS):
    """(logits (S, V), [(router logits (S, X), chosen experts (S, k)) per layer]) of one forward."""
    seen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda module, args, out: seen.append((out[0], out[2])))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(ids).logits[0]  # (S, V)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, seen


def compare_routed(ours, ref, key, ids=IDS) -> None:
    """Our logits against transformers' within tests/test_gguf_architectures.py's BOUND at every position
    no changed expert choice reaches (a change in layer l at token p reaches p, and every later token
    through the attention of the layers above; the last layer's only p). A token may choose other
    experts only where the rounding could swap its k-th and next: the reference's router-logit margin
    between them at most twice the largest move of that token's router logits."""
    from test_gguf_architectures import BOUND

    (got, ours_seen), (want, ref_seen) = routed(ours, ids), routed(ref, ids)
    reached, flips = torch.zeros(got.shape[0], dtype=torch.bool), 0  # (S,)
    for layer, ((their_logits, theirs), (our_logits, chosen)) in enumerate(zip(ref_seen, ours_seen)):
        k = theirs.shape[-1]
        changed = (theirs.sort(-1).values != chosen.sort(-1).values).any(-1)  # (S,)
        top = their_logits.sort(-1, descending=True).values  # (S, X)
        margin, moved = top[:, k - 1] - top[:, k], (their_logits - our_logits).abs().amax(-1)  # (S,), (S,)
        assert (~changed | (margin <= 2 * moved)).all(), "an expert choice changed that the rounding cannot explain"
        flips += int(changed.sum())
        reached |= changed if layer == len(ref_seen) - 1 else changed.cumsum(0) > 0  # (S,)
    assert int((~reached).sum()) >= got.shape[0] // 2, f"changed expert choices reach {reached.tolist()}"
    diff, scale = float((got - want)[~reached].abs().max()), float(want.abs().max())
    MEASURED[key] = (diff, scale, flips)
    assert diff <= BOUND * scale, (diff, scale)


def _label(ref, tables) -> str:
    return f"{ref.config.model_type} {tables['blk.0.ffn_gate_exps.weight'].tensor_type.name}"


def test_moe_logits_match_transformers_float_load(moe_file):
    """transformers' float model with only its MoE blocks from the file: exact on the dequant route."""
    model, _, reader, tables, ref = moe_file
    with torch.no_grad():
        want = ref(IDS).logits  # (1, S, V)
        torch.testing.assert_close(moe_model(ref, reader, tables, "dequant")(IDS).logits, want, rtol=1e-5, atol=1e-5)
        if tables["blk.0.attn_q.weight"].tensor_type.name == "F32":  # the file holds the model's own weights
            torch.testing.assert_close(model(IDS).logits, want, rtol=1e-5, atol=1e-5)
    compare_routed(moe_model(ref, reader, tables), ref, ("MoE blocks only", _label(ref, tables)))


@pytest.fixture(scope="module")
def quantized(moe_file):
    """`load(path, quantized=True)`: the whole model run from the file's blocks (models/gguf/quantized.py)."""
    from gatherlens.models import load

    return load(str(moe_file[1]), quantized=True)


def test_quantized_load_runs_moe_blocks_from_the_mapped_file(moe_file, quantized):
    _, _, _, tables, ref = moe_file
    mlp = quantized.model.model.layers[1].mlp
    assert type(mlp.gate) is ExpertRouter and type(mlp.experts) is QuantizedExperts
    assert mlp.experts.num_experts == 4 and mlp.gate.top_k == 2
    raws = [m.qweight.raw for m in mlp.experts.gate]  # (I, row_bytes) each
    storage = raws[0].untyped_storage().data_ptr()
    assert all(r.untyped_storage().data_ptr() == storage for r in raws)  # views of one stacked tensor
    assert raws[1].data_ptr() - raws[0].data_ptr() == raws[0].numel()  # expert e at e * I * row_bytes
    if ref.config.model_type == "qwen2_moe":  # the shared expert
        assert type(mlp.shared_expert.down_proj) is QuantizedLinear
        assert torch.equal(mlp.shared_expert_gate.weight, ref.model.layers[1].mlp.shared_expert_gate.weight)


def test_quantized_logits_match_transformers_float_load(moe_file, quantized):
    _, _, _, tables, ref = moe_file
    compare_routed(quantized.model, ref, ("load(quantized=True)", _label(ref, tables)))
    if _label(ref, tables) == "qwen3_moe Q8_0":  # these ids change token 5's 2nd expert in layer 1 (a near tie, seen)
        near_tie = torch.tensor([[3, 17, 42, 5, 88, 9, 1, 60, 33, 71, 200, 250, 111, 7, 300, 12]])  # (1, 16)
        compare_routed(quantized.model, ref, ("load(quantized=True)", "qwen3_moe Q8_0 near tie"), near_tie)


def test_generate_runs_dense_and_sparse(quantized):
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    model = quantized.model
    ids = torch.tensor([[3, 17, 42, 5, 88, 9]])  # (1, 6)
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        dense = model.generate(ids, **kw)  # (1, 12)
        use_sparse_decoding(model, budget=8, page_size=4)
        try:
            sparse = model.generate(ids, **kw)  # (1, 12)
        finally:
            use_dense_decoding(model)
    assert dense.shape == sparse.shape == (1, 12)
    assert torch.equal(dense[:, :7], sparse[:, :7])  # the first new token comes from the dense prefill


def test_fill_moe_names_a_missing_tensor(moe_file):
    from gatherlens.errors import GatherValueError

    _, _, reader, tables, ref = moe_file
    with torch.device("meta"):
        block = type(ref.model.layers[0].mlp)(ref.config)
    partial = {k: v for k, v in tables.items() if k != "blk.0.ffn_up_exps.weight"}
    with pytest.raises(GatherValueError, match="'blk.0.ffn_up_exps.weight' is missing"):
        fill_moe(block, 0, reader, partial, ref.config, linear_maker())
