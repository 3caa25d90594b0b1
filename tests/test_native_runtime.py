"""The native runtime (models/gguf/native.py, models/runtime/chunk.py, models/runtime/native.py): a GGUF read
straight into a DecodePlan, against transformers' model of the same file, on the shapes people run.

Tiny random models of each architecture it runs (tests/tiny_gguf.py), Gemma 3 with the real model's head
shape (head_dim 256, one KV head, a sliding window on 5 of 6 layers and its own rope base), Qwen3's q/k
norms at head_dim 128, Qwen2's biases, Phi-3's fused q|k|v and gate|up, written to GGUF and loaded both
ways from the same blocks: transformers' modules (`runtime="transformers"`, the reference) and the
native runtime. The chunked prefill's logits at every position and the decode steps' logits (the C++
stack) are within the products' rounding of transformers'; the C++ stack equals the planned loop bit for
bit (logits and the caches' pages), sparse and dense, over rings and pages.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

gguf = pytest.importorskip("gguf")

from lanes import sweep  # noqa: E402
from native_helpers import needs_native  # noqa: E402
from tiny_gguf import tiny_model, write_gguf  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import load  # noqa: E402
from gatherlens.models.attention.sparse import meter_pages  # noqa: E402
from gatherlens.models.gguf.native import NativeModel  # noqa: E402
from gatherlens.models.runtime.native import native_cache, native_config, use_native_decoding, use_native_dense  # noqa: E402
from gatherlens.ops import backends  # noqa: E402
from gatherlens.ops.layer import stack  # noqa: E402
from gatherlens.ops.sparse.ring import WindowRing  # noqa: E402

pytestmark = needs_native(stack)
PROMPT = torch.randint(0, 317, (1, 45), generator=torch.Generator().manual_seed(3))  # (1, 45): no control tokens
TOKENS = torch.randint(0, 317, (5,), generator=torch.Generator().manual_seed(4)).tolist()
# architecture -> the tiny config's changes: the shapes people run, at small sizes
SHAPES = {
    "llama": {},
    "qwen2": {},                                                   # q/k/v biases, a tied head
    "qwen3": {},                                                   # q/k norms, head_dim 128 (the row's)
    "phi3": {},                                                    # q|k|v and gate|up fused in the file
    "gemma3": dict(head_dim=256, num_key_value_heads=1, num_hidden_layers=7, sliding_window=8),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder, made = tmp_path_factory.mktemp("native"), {}

    def get(arch: str, qtype: str = "Q8_0"):
        if (arch, qtype) not in made:
            model = tiny_model(arch, **SHAPES[arch])
            made[arch, qtype] = write_gguf(model, arch, qtype, folder / f"{arch}.{qtype}.gguf")
        return made[arch, qtype]
    return get


def _native(path, budget=None, **settings) -> NativeModel:
    model = load(str(path), quantized=True, runtime="native").model
    assert isinstance(model, NativeModel)
    return use_native_decoding(model, native_config(budget, page_size=4, **settings))


def _run(model, steps=TOKENS, keep=0) -> tuple[torch.Tensor, list, object]:
    """Prefill logits (1, S, V) (keep=0: every position), then each step's logits (V,), and the cache."""
    cache = native_cache(model, PROMPT.shape[1] + len(steps) + 1)
    with torch.inference_mode():
        prefill = model(input_ids=PROMPT, cache=cache, logits_to_keep=keep).logits
        out = [model(input_ids=torch.tensor([[t]]), cache=cache).logits[0, -1] for t in steps]
    return prefill, out, cache


def _reference(path, steps=TOKENS) -> tuple[torch.Tensor, list]:
    """transformers' model of the same blocks: the prompt's logits (1, S, V), then each step's (V,)."""
    from transformers import DynamicCache

    model = load(str(path), quantized=True).model
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        prefill = model(input_ids=PROMPT, past_key_values=cache, use_cache=True).logits
        out = [model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits[0, -1]
               for t in steps]
    return prefill, out


def _close(a: torch.Tensor, b: torch.Tensor, share: float) -> None:
    """Within `share` of the largest reference logit."""
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= share * float(b.abs().max()), float((a - b).abs().max())


@pytest.mark.parametrize("qtype,share", [("F32", 1e-5), ("Q8_0", 0.05)], ids=["F32", "Q8_0"])
@pytest.mark.parametrize("arch", sweep(list(SHAPES), fast="gemma3"))
def test_the_native_runtime_equals_transformers(files, arch, qtype, share):
    """The chunked prefill (every position) and five decode steps on the C++ stack, against transformers'
    forward of the same blocks, pages in float32 as transformers' cache. F32 weights (read as stored, x not
    rounded): equal up to the order of float32 sums. Q8_0 (x rounded to 8 bits per block, each way): an x on
    a rounding boundary flips with those orders, so within tests/test_gguf_architectures.py's bound."""
    path = files(arch, qtype)
    model = _native(path, kv_dtype="float32")
    backends.reset_ran()
    prefill, steps, _ = _run(model)
    assert backends.ran()["decode_step"] == {"chunk": 1, "stack": len(TOKENS)}
    ref_prefill, ref_steps = _reference(path)
    _close(prefill, ref_prefill, share)
    for a, b in zip(steps, ref_steps):
        _close(a, b, share)


@pytest.mark.parametrize("arch", sweep(["gemma3", "qwen2", "phi3"], fast="gemma3"))
@pytest.mark.parametrize("budget,kv_dtype", [(8, "float16"), (None, "float32"), (12, "int8"), ("auto", "float16")])
def test_the_stack_equals_the_planned_loop(files, arch, budget, kv_dtype):
    """The same steps on both rows of one native plan: bit-equal logits, the same pages read by each selection
    head of each global layer (meter_pages; the auto budget's differ per head), and the same keys and values
    in every layer's pages (a global layer's summaries too; a ring's are not read)."""
    runs, metered = {}, {}
    auto = dict(mass=0.6, min_pages=2, max_pages=8) if budget == "auto" else {}  # 12 pages of 4 by the end
    for row in ("stack", "planned"):
        model = _native(files(arch), budget, kv_dtype=kv_dtype, dense_layers=0, recent=4, **auto)
        use_native_decoding(model, model.__dict__["gatherlens_sparse"], step=row)
        backends.reset_ran()
        metered[row] = []
        with meter_pages(lambda layer, counts, chose: metered[row].append((layer, counts.tolist(), chose))):
            runs[row] = _run(model, keep=1)
        assert backends.ran()["decode_step"] == {"chunk": 1, row: len(TOKENS)}
    (_, stacked, a), (_, planned, b) = runs["stack"], runs["planned"]
    assert all(torch.equal(x, y) for x, y in zip(stacked, planned))
    assert metered["stack"] == metered["planned"] and metered["stack"]
    if budget == "auto":
        assert all(2 <= c <= 8 for _, row, chose in metered["stack"] if chose for c in row)
    for x, y in zip(a.layers, b.layers):
        pages = (x.pages, y.pages) if isinstance(x, WindowRing) else (x, y)
        stored = slice(0, 2) if isinstance(x, WindowRing) else slice(0, 3)
        assert pages[0].length == pages[1].length
        assert all(torch.equal(s, t) for s, t in zip(pages[0].writable(0)[stored], pages[1].writable(0)[stored]))


def test_the_plan_reads_the_file(files):
    """Gemma 3's plan: one KV head of 256, rings on the local layers (every sixth global), two angle tables,
    the sandwich and q/k norms as their factors (the file's 1 + w), GeGLU, the embedding scaled."""
    model = load(str(files("gemma3")), quantized=True, runtime="native").model
    plan, spec = model.plan, model.config
    assert spec.windows == (8, 8, 8, 8, 8, None, 8) and plan.layers[5].rank == 0 and plan.layers[4].window == 8
    assert {layer.angles for layer in plan.layers} == {"sliding_attention", "full_attention"}
    assert plan.layers[0].kv_heads == 1 and plan.layers[0].head_dim == 256 and plan.layers[0].activation == "gelu_tanh"
    assert plan.layers[0].sandwich is not None and plan.layers[0].qk_norms[0].shape == (256,)
    assert plan.embed_scale == pytest.approx(64 ** 0.5) and plan.origin == "gguf"
    cache = native_cache(use_native_decoding(model), 64)
    assert [type(layer).__name__ for layer in cache.layers].count("WindowRing") == 6
    use_native_dense(model)
    with pytest.raises(GatherValueError, match="no decode step installed"):
        model(input_ids=PROMPT)


def test_loading_lets_each_packed_weights_pages_go_as_it_packs(files, monkeypatch):
    """The native load never holds a weight's file pages and its packed copy together: each piece of rows
    pack_x8 moves is let go (models/gguf/quantized.py's `let_go`) while the plan is made, the head's too."""
    import gatherlens.models.gguf.quantized as quantized

    let_go, seen = quantized.let_go, []
    monkeypatch.setattr(quantized, "let_go", lambda rows, reader: seen.append(rows.shape[0]) or let_go(rows, reader))
    model = load(str(files("qwen2")), quantized=True, runtime="native").model
    vocab = model.plan.embed.table.raw.shape[0]
    assert seen and vocab in seen  # the tied head's rows among them (one piece at this size)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_a_chunk_attends_in_query_blocks_with_the_values_of_one_call(files, arch, monkeypatch):
    """The chunk's queries go to SDPA QUERY_BLOCK at a time (a smaller float mask): each query's row is its own,
    so a layer's attention output is one call's within SDPA's own rounding (its kernel splits a short run of
    queries differently: ~1e-6 at Gemma 3's 256-wide heads), over a global layer's pages and a local layer's
    ring (Gemma 3's window of 8: its second chunk reads the first's last keys)."""
    from gatherlens.models.runtime import chunk

    model = _native(files(arch))
    plan = model.plan
    torch.manual_seed(0)
    chunks = [torch.randn(20, plan.layers[0].norms[0].shape[0]), torch.randn(25, plan.layers[0].norms[0].shape[0])]
    outs = {}
    for block in (512, 7):  # one call; blocks of 7 (the last of 6 and of 4)
        monkeypatch.setattr(chunk, "QUERY_BLOCK", block)
        kvs, start, got = native_cache(model, 64).layers, 0, []
        for h in chunks:  # (T, d) each
            positions = torch.arange(start, start + h.shape[0])[None]  # (1, T)
            for layer in plan.layers[:6]:  # local layers and the first global one (gemma3: layer 5)
                cos, sin = (t[0].float() for t in plan.angles[layer.angles](positions))  # (T, D) x2
                got.append(chunk._chunk_attention(layer, h, cos, sin, kvs[layer.index], start))  # (T, Hq*Dv)
            start += h.shape[0]
        outs[block] = got
    for a, b in zip(outs[512], outs[7]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("runtime", ["native", "transformers"])
def test_a_tied_embedding_reads_its_rows_from_the_heads_panels(files, runtime):
    """Qwen2's tied Q8_0 table is packed whole for the head: the embedding picks its rows there (x8_rows), the
    same bytes as the mapped file's, so a prompt's rows do not bring the table's file pages back beside them."""
    from gatherlens.ops.quant import QuantizedTable

    model = load(str(files("qwen2")), quantized=True, runtime=runtime).model
    embed = model.plan.embed if runtime == "native" else model.model.embed_tokens
    table = embed.table
    assert table.pick is not None  # read from the panels
    plain = QuantizedTable(table.raw, table.qtype)  # the same blocks, read in the mapped file
    ids = torch.tensor([[0, 5, 316, 5, 17, 8, 9, 311]])  # (1, 8): repeats, either end, across panels
    for picked in (ids, ids[:, :1]):  # a prompt's rows, a decode step's one
        assert torch.equal(table.lookup(picked), plain.lookup(picked))


def test_the_loading_table_says_why(files, tmp_path):
    """runtime="auto" takes the native runtime where it runs the file and transformers' modules otherwise,
    saying why (Gemma 2's soft-capping, top-k attention); runtime="native" where it cannot is an error."""
    backends.reset_ran()
    gemma2 = write_gguf(tiny_model("gemma2"), "gemma2", "Q8_0", tmp_path / "gemma2.gguf")
    assert type(load(str(gemma2), quantized=True, runtime="auto").model).__name__ == "Gemma2ForCausalLM"
    assert "native: gemma2: soft-capping" in backends.describe()
    with pytest.raises(GatherValueError, match="soft-capping"):
        load(str(gemma2), quantized=True, runtime="native")
    assert type(load(str(files("llama")), quantized=True, runtime="auto", top_k=4).model).__name__ == \
        "LlamaForCausalLM"
    assert isinstance(load(str(files("llama")), quantized=True, runtime="auto").model, NativeModel)
    with pytest.raises(GatherValueError, match="runtime = 'fast'"):
        load(str(files("llama")), quantized=True, runtime="fast")


def test_rope_angles_equal_transformers():
    """The native runtime's inverse frequencies against transformers' own (default, linear, llama3), and a
    file's rope_freqs factors (Llama 3's, as llama.cpp's convert writes them) giving llama3's."""
    import math

    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from gatherlens.ops.layer.rope import Rope, RopeScaling, inverse_frequencies

    llama3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    config = LlamaConfig(hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                         rope_parameters={**llama3, "rope_theta": 500000.0})
    ours = inverse_frequencies(64, 500000.0, RopeScaling("llama3", 32.0, 1.0, 4.0, 8192))
    assert torch.allclose(ours, ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0], rtol=1e-6)
    base = inverse_frequencies(64, 500000.0)
    wavelen = 2 * math.pi / base
    smooth = (8192 / wavelen - 1.0) / 3.0
    factors = torch.where(wavelen < 8192 / 4, 1.0, torch.where(wavelen > 8192, 32.0, 1 / ((1 - smooth) / 32 + smooth)))
    assert torch.allclose(inverse_frequencies(64, 500000.0, factors=factors), ours, rtol=1e-5)
    linear = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=dict(rope_type="linear", factor=4.0,
                                                                                   rope_theta=10000.0))
    assert torch.equal(inverse_frequencies(128, 10000.0, RopeScaling("linear", 4.0)),
                       ROPE_INIT_FUNCTIONS["linear"](linear, "cpu")[0])
    cos, sin = Rope(base)(torch.arange(3, 7)[None])  # (1, 4, 64) x2
    assert cos.shape == (1, 4, 64) and torch.allclose(cos[0, 1, :32], torch.cos(4 * base))
    with pytest.raises(GatherValueError, match="rope scaling 'yarn'"):
        inverse_frequencies(64, 10000.0, RopeScaling("yarn", 4.0))


@pytest.mark.slow
def test_generate_quantized_imports_no_transformers(files):
    """`gatherlens generate --quantized` on a file the native runtime runs, in a fresh process: the text comes
    out and no transformers module was ever imported (the import floor: ~170 MB and seconds)."""
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from gatherlens.cli import main; "
            f"r = CliRunner().invoke(main, ['generate', '--quantized', '--model', {str(files('gemma3'))!r}, "
            "'the cat', '--max-new-tokens', '4']); print(r.exit_code, r.output.count('tokens/s'), "
            "sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split() == ["0", "1", "[]"], out.stdout + out.stderr


@pytest.mark.slow
def test_smollm2_native_text_equals_transformers_path():
    """SmolLM2 as it ships (Q4_1), greedy over a prompt of two prefill chunks (the first on the integer GEMM):
    the same tokens from the native runtime as from transformers' modules over the same blocks (the
    chunked prefill in transformers' arithmetic leaves the same cache; each way the C++ stack decodes)."""
    from installed import installed

    from gatherlens.models.runtime.streaming import stream_generate

    path = installed("smollm2")
    text = " ".join(f"Line {i}: it is a truth universally acknowledged, that a single man in possession of a good "
                    f"fortune must be in want of a wife." for i in range(30))
    runs = []
    for runtime in ("native", "transformers"):
        lm = load(str(path), quantized=True, runtime=runtime)
        ids = lm.encode(text)
        assert ids.shape[1] > 512
        runs.append((ids.tolist(), stream_generate(lm, ids, 1024, 40).new_ids))
    assert runs[0] == runs[1]
