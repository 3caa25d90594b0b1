"""Every GGUF architecture of models/gguf/arch.py, run from its blocks and as the float model, against transformers.

For each architecture a tiny random HF model (tests/tiny_gguf.py: 2 layers, hidden 64, 4 query heads
over 2 KV heads, 320 tokens) is written to GGUF with gguf's own GGUFWriter in F32, Q8_0 and Q4_0, and
read back three ways: transformers' own float load (`from_pretrained(folder, gguf_file=)`, the
reference; for a MoE given the config the file was written from), our `float_model` (bit-equal to
it) and our `load(path, quantized=True)` (MoE experts: models/gguf/moe.py, tests/test_quantized_moe.py).

The rounding bound of the quantized model. The q8act route (Q8_0 / Q4_0 blocks, fewer than
PREFILL_ROWS rows) rounds x to 8 bits per block of 32: each x_j moves by at most max|x_block| / 254,
so each product's relative error is about 1/254 / sqrt(3) ~ 0.2% RMS, and a logit sees about ten such
products in series (q, k, v, o, gate, up, down per layer, the head): ~1% RMS, ~4x that at the largest
of 20 x 320 logits. `BOUND` = 5% of the largest reference logit. That this is all the difference is
checked product by product: every QuantizedLinear's output, given the input it saw, equals
transformers' nn.Linear of the same file on that input rounded by q8act's own rule
(`quantize_activations`, only where the weight's route rounds: q8act on 32-weight blocks; F32 weights
are read as stored, x unrounded) to float32 sums (`PRODUCT`). End to end, the rounding of one x that
sits on a boundary can flip with the order of float32 sums, so no tighter end-to-end bound holds.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tiny_gguf import TINY, tiny_model, write_gguf  # noqa: E402
from lanes import sweep  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import load  # noqa: E402
from gatherlens.models.runtime.step import step_declarations  # noqa: E402
from gatherlens.models.attention.features import attention_variant  # noqa: E402
from gatherlens.models.gguf.arch import ARCHS, EXPERTS, NORM  # noqa: E402
from gatherlens.models.gguf.check import check_gguf  # noqa: E402
from gatherlens.models.gguf.config import gguf_config, open_gguf  # noqa: E402
from gatherlens.models.gguf.weights import float_model, hf_name  # noqa: E402
from gatherlens.models.gguf.layers import QuantizedEmbedding, QuantizedLinear  # noqa: E402
from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding  # noqa: E402
from gatherlens.ops.quant.formats.layout import LAYOUTS  # noqa: E402
from gatherlens.ops.quant.products.q8act_naive import quantize_activations  # noqa: E402

QTYPES = ("F32", "Q8_0", "Q4_0")
BOUND = 0.05      # the quantized model's logits: within 5% of the largest reference logit (module doc)
PRODUCT = 1e-5    # each product against transformers' on the same (rounded) input, relative to its largest output
# the planned decode step runs every dense architecture here since issue 36's runtime: Llama, Qwen2's
# biases, Qwen3's and Gemma's head norms, Phi-3's fused products, Gemma 2's soft caps, and sliding-window
# layers (Mistral, Gemma) over their rings
IDS = torch.randint(0, 317, (1, 20), generator=torch.Generator().manual_seed(1))  # (1, 20): no control tokens
MEASURED: dict = {}  # (arch, qtype) -> max |logit difference| of the quantized model (scripts/gguf_differences.py)


def _reference(folder, name: str, config=None):
    """transformers' own float load of the file; `config`: the one it was written from, for a MoE (transformers
    5.24's GGUF mapping reads neither expert_feed_forward_length nor its shared twin)."""
    from transformers import AutoModelForCausalLM

    kw = {} if config is None else {"config": config}
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True,
                                                **kw).eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(arch, qtype) -> its tiny file, transformers' reference, our config, float and quantized models (made once)."""
    folder, made, models = tmp_path_factory.mktemp("archs"), {}, {}

    def get(arch: str, qtype: str):
        if (arch, qtype) not in made:
            model = models.setdefault(arch, tiny_model(arch))
            path = write_gguf(model, arch, qtype, folder / f"{arch}.{qtype}.gguf")
            ref_path = path
            if arch == "mistral":  # transformers 5.24 cannot load a file named "mistral" (gguf has no such
                ref_path = write_gguf(model, arch, qtype, folder / f"as-llama.{qtype}.gguf", general_name="tiny")
            reader = open_gguf(path, mode="c")  # arch); the same file named otherwise loads as Llama
            config = gguf_config(reader)
            ref = _reference(folder, ref_path.name, model.config if ARCHS[arch].moe else None)
            made[arch, qtype] = SimpleNamespace(path=path, hf=model, ref=ref,
                                                config=config, float=float_model(reader, gguf_config(reader)),
                                                lm=load(str(path), quantized=True, progress=False))
        return made[arch, qtype]
    return get


def _logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[0]  # (S, V)


# -- the table against its references ---------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_rows_are_gguf_and_transformers_names(arch):
    """Every parameter of the arch's HF class has its row (gguf's `get_tensor_name_map` names it the same),
    every row a parameter; permuted rows and the norm shift are what transformers' GGUF processors undo."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    row = ARCHS[arch]
    config = getattr(transformers, row.config_class)(vocab_size=64, hidden_size=64, intermediate_size=96,
                                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, num_experts=4,
                                                     num_experts_per_tok=2)
    with torch.device("meta"):
        params = set(getattr(transformers, row.model_class)(config).state_dict())
    gguf_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == row.gguf)
    names = gguf.get_tensor_name_map(gguf_arch, 2)
    ours = {}
    for r in row.rows:
        for name in r.gguf_names(2):
            ours[name] = hf_name(name, row)
            stem, leaf = name.rsplit(".", 1)
            if r.kind != EXPERTS or r.part is None and r.param == "weight":
                assert names.get_name(ours[name].rsplit(".", 1)[0]) == stem, (name, ours[name])
    tied = {"lm_head.weight"} if not any(r.gguf == "output" for r in row.rows) else set()
    assert set(ours.values()) | tied == params
    processor = TENSOR_PROCESSORS.get(row.gguf)
    permuted = {r.gguf for r in row.rows if r.permute}
    assert permuted == ({"blk.{i}.attn_q", "blk.{i}.attn_k"} if processor and processor.__name__ ==
                        "LlamaTensorProcessor" else set())
    assert row.norm_shift == (1.0 if processor and processor.__name__ == "Gemma2TensorProcessor" else 0.0)
    assert all(r.kind == NORM for r in row.rows if "norm" in r.gguf)


# -- each architecture, each type ---------------------------------------------------------------------
@pytest.mark.parametrize("qtype", sweep(QTYPES, fast="Q8_0"))
@pytest.mark.parametrize("arch", sweep(list(TINY), fast="llama"))  # llama's Q8_0 fast, the sweep slow
def test_float_and_quantized_models_match_transformers(files, arch, qtype):
    f = files(arch, qtype)
    ref = _logits(f.ref)  # (S, V)
    if arch != "mistral" and not ARCHS[arch].moe:  # mistral: read under another name; MoE: see _reference
        theirs = transformers.AutoConfig.from_pretrained(f.path.parent, gguf_file=f.path.name).to_dict()
        diff = {k for k, v in f.config.to_dict().items() if theirs.get(k) != v} - {"_name_or_path",
                                                                                    "transformers_version"}
        assert diff == set() and type(f.config).__name__ == ARCHS[arch].config_class
    assert torch.allclose(_logits(f.float), ref, atol=1e-5, rtol=0)  # float_model: bit-equal here
    assert type(f.lm.model).__name__ == ARCHS[arch].model_class
    assert type(f.lm.model.model.embed_tokens) is QuantizedEmbedding
    quant, scale = _logits(f.lm.model), float(ref.abs().max())
    MEASURED[arch, qtype] = float((quant - ref).abs().max())
    assert MEASURED[arch, qtype] <= BOUND * scale, (MEASURED[arch, qtype], scale)
    for name, x, y, expected in _products(f.ref, f.lm.model):
        assert float((y - expected).abs().max()) <= PRODUCT * float(expected.abs().max()), name


def _products(ref, ours) -> list:
    """(name, x, our y, transformers' y) of every QuantizedLinear call of a forward on IDS: the same x
    into the reference's nn.Linear, rounded as q8act rounds it where the weight's route does."""
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, y, name=name: seen.append((name, args[0], y)))
             for name, m in ours.named_modules() if isinstance(m, QuantizedLinear)]
    try:
        _logits(ours)
    finally:
        for h in hooks:
            h.remove()
    out = []
    modules = dict(ref.named_modules())
    for name, x, y in seen:
        w, linear = ours.get_submodule(name).qweight, modules.get(name)
        if not isinstance(linear, torch.nn.Linear):
            continue  # a MoE expert (its stacked parameters in transformers): tests/test_quantized_moe.py
        flat = x.reshape(-1, x.shape[-1])  # (M, K)
        if w.route == "q8act" and LAYOUTS[w.qtype].weights == 32:
            qx, dx = quantize_activations(flat)  # (M, K/32, 32), (M, K/32)
            flat = (qx * dx.unsqueeze(-1)).reshape(flat.shape).float()  # (M, K): x as q8act rounds it
        with torch.no_grad():
            expected = torch.nn.functional.linear(flat.double(), linear.weight.double(),
                                                  None if linear.bias is None else linear.bias.double())  # (M, N)
        out.append((name, x, y.reshape(expected.shape), expected.float()))
    return out


@pytest.mark.parametrize("arch", sweep(list(TINY), fast="llama"))
def test_generate_runs_dense_and_sparse(files, arch):
    """generate on the quantized model: dense decoding; sparse at a budget buying every page gives its
    tokens (its logits within the rounding bound: another order of sums can flip one x's rounding);
    a small budget runs. The planned decode step takes only the layers it declares."""
    model = files(arch, "Q8_0").lm.model
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        use_dense_decoding(model)
        dense = model.generate(IDS, **kw)
        use_sparse_decoding(model, budget=1024, page_size=4, dense_layers=0, kv_dtype=None)  # float32 pages
        assert step_declarations(model)["planned"] is None, step_declarations(model)["planned"]
        full = model.generate(IDS, **kw)
        use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0)
        small = model.generate(IDS, **kw)
        use_dense_decoding(model)
    assert torch.equal(dense.sequences, full.sequences) and small.sequences.shape == (1, 26)
    diff = max(float((a - b).abs().max()) for a, b in zip(dense.logits, full.logits))
    assert diff < BOUND * float(dense.logits[0].abs().max())  # both round x; their sums' order differs
    assert all(torch.isfinite(x).all() for x in small.logits)


@pytest.mark.slow  # a sweep over the MoE architectures (tests/test_quantized_moe.py keeps one fast)
@pytest.mark.parametrize("arch", [a for a in ARCHS if ARCHS[a].moe])
def test_moe_float_model_is_transformers(tmp_path, arch):
    """float_model of a MoE file: the stacked gate and up experts joined into HF's gate_up_proj (rows'
    `part`), qwen2moe's (d,) shared-expert gate as (1, d): bit-equal to transformers' own load."""
    from tiny_gguf import MOE_TINY  # engineer D2's rows (tests/test_quantized_moe.py runs them from blocks)

    if arch not in MOE_TINY:
        pytest.skip(f"tests/tiny_gguf.py has no {arch} row")
    model = tiny_model(arch)
    path = write_gguf(model, arch, "Q8_0", tmp_path / f"{arch}.gguf")
    reader = open_gguf(path, mode="c")
    ours = float_model(reader, gguf_config(reader))
    assert torch.equal(_logits(ours, IDS[:, :8]), _logits(_reference(tmp_path, path.name, model.config), IDS[:, :8]))


def test_gemma2_features_come_from_the_file(tmp_path):
    """Soft-capping and the sliding window are read from the file (transformers' GGUF mapping reads the
    window only) and reach the quantized model's attention variant, which dense and sparse decoding use."""
    model = tiny_model("gemma2", attn_logit_softcapping=20.0, final_logit_softcapping=15.0)
    path = write_gguf(model, "gemma2", "Q8_0", tmp_path / "gemma2.gguf")
    lm = load(str(path), quantized=True, progress=False)
    assert (lm.config.attn_logit_softcapping, lm.config.final_logit_softcapping) == (20.0, 15.0)
    layers = lm.model.model.layers
    assert [attention_variant(layer.self_attn).window for layer in layers] == [8, None]  # sliding, full
    assert attention_variant(layers[1].self_attn).softcap == 20.0
    assert torch.allclose(layers[0].post_feedforward_layernorm.weight, model.model.layers[0].post_feedforward_layernorm
                          .weight, atol=1e-6)  # the file's weight + 1, less 1


@pytest.mark.parametrize("vectors", sweep(["F16", "BF16"], fast="BF16"))
def test_norms_and_biases_in_any_plain_float_format_load(tmp_path, vectors):
    """A vector (norm, bias) in any format whose record names a value_dtype runs on the quantized path,
    its values widened exactly (they were F32 / F16 only: BF16 ones were refused)."""
    model = tiny_model("qwen2")  # q/k/v biases and norms
    path = write_gguf(model, "qwen2", "Q8_0", tmp_path / f"qwen2.{vectors}-vectors.gguf", vectors=vectors)
    assert {t.tensor_type.name for t in open_gguf(path).tensors if len(t.shape) == 1} == {vectors}
    lm = load(str(path), quantized=True, progress=False)
    dtype = LAYOUTS[vectors].value_dtype
    for ours, theirs in ((lm.model.model.norm.weight, model.model.norm.weight),
                         (lm.model.model.layers[1].self_attn.q_proj.bias, model.model.layers[1].self_attn.q_proj.bias)):
        assert torch.equal(ours, theirs.detach().to(dtype).float())
    assert torch.isfinite(_logits(lm.model)).all()


def test_an_architecture_not_in_the_table_is_one_error(tmp_path):
    path = tmp_path / "starcoder.gguf"
    writer = gguf.GGUFWriter(str(path), "starcoder2")
    writer.add_uint32("starcoder2.block_count", 1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = open_gguf(path)
    check_gguf(reader, path, quantized=False)  # the float path hands it to transformers
    with pytest.raises(GatherValueError) as caught:
        check_gguf(reader, path, quantized=True)
    assert str(caught.value) == (
        f"model file {str(path)!r} is a 'starcoder2' model; quantized=True runs the GGUF architectures "
        f"{', '.join(ARCHS)}; try without --quantized (quantized=True): the float32 path reads every "
        f"architecture transformers reads")
