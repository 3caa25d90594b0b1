"""The decode-step table (models/runtime/step.py): the C++ stack (ops/layer/stack.py) against its reference, the
planned loop, and both against transformers' own forward.

Tiny random Llama / Mistral / Qwen2 models written to GGUF (tests/tiny_gguf.py) and run from their blocks: the
stack row against the planned row (the same operators called one by one from Python on the same plan:
bit-equal logits and caches), sparse and dense, over pages stored in every dtype; which row takes which
call, and why the others do not (`DECODE_STEP.why`, `backends.describe`); nothing falls back silently.
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

gguf = pytest.importorskip("gguf")

from lanes import sweep  # noqa: E402
from tiny_gguf import tiny_model, write_gguf  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import load  # noqa: E402
from gatherlens.models.attention.sparse import meter_pages  # noqa: E402
from gatherlens.models.runtime import step  # noqa: E402
from gatherlens.models.runtime.decoding import (SparseKVCache, observe_sparse, use_dense_decoding,  # noqa: E402
                                                use_sparse_decoding)
from gatherlens.ops import backends  # noqa: E402
from gatherlens.ops.layer import stack  # noqa: E402
from gatherlens.ops.sparse.config import OP  # noqa: E402

pytestmark = pytest.mark.skipif(not stack.kernel_loaded(), reason="the native operators did not build")
PROMPT = torch.randint(0, 317, (1, 45), generator=torch.Generator().manual_seed(3))  # (1, 45): no control tokens
STEPS = 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(arch, qtype) -> a tiny model loaded from its GGUF blocks (made once)."""
    folder, made = tmp_path_factory.mktemp("stack"), {}

    def get(arch: str, qtype: str):
        if (arch, qtype) not in made:
            path = write_gguf(tiny_model(arch), arch, qtype, folder / f"{arch}.{qtype}.gguf")
            made[arch, qtype] = load(str(path), quantized=True, progress=False).model
        return made[arch, qtype]
    return get


def _prefilled(model, kv_dtype, page_size=4) -> SparseKVCache:
    cache = SparseKVCache(config=model.config, page_size=page_size, kv_dtype=kv_dtype)
    cache.reserve(PROMPT.shape[1] + STEPS + 1)
    with torch.inference_mode():
        model(input_ids=PROMPT, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def _steps(model, cache, tokens) -> list[torch.Tensor]:
    out = []
    with torch.inference_mode():
        for t in tokens:
            out.append(model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True).logits[0, -1])  # (V,)
    return out


def _same_cache(a: SparseKVCache, b: SparseKVCache) -> bool:
    pa, pb = [layer.paged for layer in a.layers], [layer.paged for layer in b.layers]
    return all(x.length == y.length and all(torch.equal(s, t) for s, t in zip(x.writable(0), y.writable(0)))
               for x, y in zip(pa, pb))


AUTO = dict(mass=0.6, min_pages=2, max_pages=8)  # the auto budget on a 45-token cache in pages of 4 (12 pages)


def _rows(model, cache, tokens, row, metered: list | None = None) -> list[torch.Tensor]:
    """The steps' logits with the model's steps kept at `row` (the table's fastest row it may take);
    `metered` gets (layer, pages each selection head read, chose) of every layer's step (meter_pages)."""
    use_sparse_decoding(model, config=model.gatherlens_sparse, step=row)
    backends.reset_ran()
    meter = (lambda layer, counts, chose: metered.append((layer, counts.tolist(), chose))) if metered is not None \
        else (lambda *args: None)
    with meter_pages(meter):
        out = _steps(model, cache, tokens)
    assert backends.ran()["decode_step"] == {row: len(tokens)}  # every step ran on that row
    return out


def _both_rows(model, kv_dtype, seed: int) -> list:
    """STEPS tokens through the stack and the planned loop from one prefilled cache (use_sparse_decoding already
    on): asserts both give bit-equal logits and caches and the same pages per head; returns the stack's metered
    (layer, pages each selection head read, chose) of every layer's step."""
    try:
        native_cache = _prefilled(model, kv_dtype)
        planned_cache = copy.deepcopy(native_cache)
        tokens = torch.randint(0, 317, (STEPS,), generator=torch.Generator().manual_seed(seed)).tolist()
        counts = {"stack": [], "planned": []}
        native = _rows(model, native_cache, tokens, "stack", counts["stack"])
        planned = _rows(model, planned_cache, tokens, "planned", counts["planned"])
    finally:
        use_dense_decoding(model)
    assert _same_cache(native_cache, planned_cache)
    assert all(torch.equal(a, b) for a, b in zip(native, planned))
    assert counts["stack"] == counts["planned"] and len(counts["stack"]) == 2 * STEPS
    return counts["stack"]


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("budget", [8, 12, "auto", None], ids=["sparse", "sparse-wider", "auto", "dense"])
def test_the_stack_equals_the_planned_loop(models, qtype, kv_dtype, budget):
    """The same tokens through both rows of one plan: bit-equal logits, the caches bit-equal after every
    step (the planned loop is the C++ stack's reference: the same operators in the same order), and the
    same pages read by each head of each layer (the stack's counts against the planned loop's selections)."""
    model = models("llama", qtype)
    use_sparse_decoding(model, budget=budget, page_size=4, dense_layers=1, recent=4, kv_dtype=kv_dtype, dense_cover=None,
                        **AUTO)
    assert step.step_declarations(model) == {"stack": None, "planned": None, "hf": None,
                                             "chunk": step.row_refusal(step.installed_plan(model), "chunk")}
    counts = _both_rows(model, kv_dtype, seed=5)
    assert all(not chose for layer, _, chose in counts if layer == 0)  # layer 0 dense: every page
    if budget == "auto":  # the second layer chooses per head, within [min_pages, max_pages]
        assert all(chose and all(2 <= c <= 8 for c in row) for layer, row, chose in counts if layer == 1)


@pytest.mark.parametrize("kv_dtype", ["float16", "int8"])
@pytest.mark.parametrize("cover", [0.05, 1.0], ids=["every-step", "never-all"])
def test_dense_runs_are_the_same_steps_on_both_rows(models, kv_dtype, cover):
    """A layer whose sparse step needed at least dense_cover of its pages reads every page for its next
    dense_steps steps, then chooses again (ops/sparse/dense_runs.py). The stack (the pages its KV groups needed
    counted in C++) and the planned loop (counted in torch) run the same steps densely: bit-equal logits and
    caches, the same pages per head. Cover 0.05: every sparse step starts a run of 2; cover 1.0 on an auto
    budget whose ceiling is below the cache: no step needs every page, none starts one."""
    model = models("llama", "Q8_0")
    use_sparse_decoding(model, budget="auto", page_size=4, dense_layers=1, recent=4, kv_dtype=kv_dtype,
                        dense_cover=cover, dense_steps=2, **AUTO)
    counts = _both_rows(model, kv_dtype, seed=7)
    chose = [chose for layer, _, chose in counts if layer == 1]  # (STEPS,): layer 1 chose its pages
    assert chose == ([True, False, False] * 2 if cover < 1 else [True] * STEPS)
    rows = [row for layer, row, _ in counts if layer == 1]  # (STEPS, Hsel)
    for i, (row, c) in enumerate(zip(rows, chose)):  # a dense step reads every page of its PROMPT + i + 1 tokens
        assert c or row == [-(-(PROMPT.shape[1] + i + 1) // 4)] * len(row)


@pytest.mark.parametrize("arch", sweep(["qwen2", "qwen3", "phi3"], fast="qwen3"))
def test_other_layers_on_every_row(models, arch):
    """Qwen2's q/k/v biases, Qwen3's q/k head norms (head_dim 128), Phi-3's fused q|k|v and gate|up, walked from
    transformers' modules: the stack equals the planned loop bit for bit, and the planned loop equals
    transformers' layers up to the order of sums (F32 weights: nothing rounds x)."""
    model = models(arch, "F32")
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0, kv_dtype="float32")
    try:
        assert {k: v for k, v in step.step_declarations(model).items() if k != "chunk"} == \
            {"stack": None, "planned": None, "hf": None}
        caches = [_prefilled(model, "float32") for _ in range(3)]
        rows = [_rows(model, cache, [3, 8, 13], row) for cache, row in zip(caches, ("stack", "planned", "hf"))]
    finally:
        use_dense_decoding(model)
    assert all(torch.equal(a, b) for a, b in zip(rows[0], rows[1]))
    for a, b in zip(rows[1], rows[2]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


def test_the_plan_rows_equal_transformers(models):
    """The planned loop against transformers' own layers (step="hf") over the same paged cache: the same
    caches up to rounding, logits within it (transformers' norms sum in another order)."""
    model = models("llama", "Q8_0")
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0, kv_dtype="float32")
    try:
        cache = _prefilled(model, "float32")
        other = copy.deepcopy(cache)
        planned = _rows(model, cache, [3, 8, 13], "planned")
        hf = _rows(model, other, [3, 8, 13], "hf")
    finally:
        use_dense_decoding(model)
    for a, b in zip(planned, hf):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


def test_steps_needing_each_layer_take_the_planned_loop(models):
    """Observers (they want every layer's PageSelection) and a batch of two: the table passes the stack over,
    saying why, and runs the planned loop; a prefill takes transformers' forward."""
    model = models("llama", "Q8_0")
    calls = []
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0)
    try:
        cache = _prefilled(model, "float16")
        backends.reset_ran()
        with observe_sparse(calls.append):
            _steps(model, cache, [5])
        assert len(calls) == 2  # both layers, one step
        assert backends.ran()["decode_step"] == {"planned": 1}
        assert "stack: an observer or kept selections want each layer's PageSelection" in backends.describe()
        two = SparseKVCache(config=model.config, page_size=4)
        with torch.inference_mode():
            batch = model(input_ids=PROMPT.repeat(2, 1)[:, :9], cache=two, use_cache=True).logits
            model(input_ids=torch.tensor([[4], [6]]), cache=two, use_cache=True)
        assert batch.shape == (2, 9, 320)
        assert backends.ran()["decode_step"] == {"planned": 2, "hf": 1}
        assert "a batch of several rows" in backends.describe()
    finally:
        use_dense_decoding(model)
    assert step.installed_plan(model) is None and "forward" not in model.__dict__


def test_layers_the_stack_lacks_are_refused_by_name(models):
    """What a row does not compute is refused by name: Gemma 2's soft-capping (a variant field the stack lacks;
    the planned loop applies it). Mistral's sliding-window layers in transformers' cache are transformers'
    window layers, not rings of pages: both plan rows pass each step to transformers' forward, saying why."""
    model = models("gemma2", "Q8_0")
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        rows = step.step_declarations(model)
        assert "softcap" in rows["stack"] and rows["planned"] is None
        with pytest.raises(GatherValueError, match="step = 'stack' cannot run Gemma2ForCausalLM: .*softcap"):
            use_sparse_decoding(model, budget=8, page_size=4, step="stack")
    finally:
        use_dense_decoding(model)
    model = models("mistral", "Q8_0")
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        assert model.config.sliding_window is not None
        rows = step.step_declarations(model)
        assert rows["stack"] is None and rows["planned"] is None and rows["hf"] is None
        cache = _prefilled(model, "float16")
        backends.reset_ran()
        _steps(model, cache, [4, 6])
        assert backends.ran()["decode_step"] == {"hf": 2}
        assert "transformers' window layer" in backends.describe()
    finally:
        use_dense_decoding(model)


def test_a_stack_that_cannot_run_is_passed_over_saying_why(models, monkeypatch):
    """The operator refusing the plan (here: switched off): the table takes the planned loop and describe()
    says why (the same results); decode_stack itself, asked anyway, is an error naming the reason."""
    model = models("llama", "Q4_0")
    monkeypatch.setattr(step, "stack_refusal", lambda plan: "switched off for the test")
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0)
    try:
        cache = _prefilled(model, "float16")
        backends.reset_ran()
        _steps(model, cache, [7, 9])
        assert backends.ran()["decode_step"] == {"planned": 2}
        assert "stack: switched off for the test" in backends.describe()
        with pytest.raises(GatherValueError, match="step = 'stack' cannot run .*switched off for the test"):
            use_sparse_decoding(model, budget=8, page_size=4, step="stack")
    finally:
        use_dense_decoding(model)
    plan = step.plan_model(tiny_model("llama"))  # float weights: nothing the operator multiplies
    view = stack.StackCaches.of([layer.paged for layer in _prefilled(models("llama", "Q8_0"), "float16").layers])
    angles = [(torch.zeros(1, 16), torch.zeros(1, 16))] * 2
    with pytest.raises(GatherValueError, match="decode_stack cannot run this model: layer 0 q_proj is not a "
                                               "q8act weight"):
        stack.decode_stack(torch.zeros(1, 64), angles, plan, view, [None, None], OP.choice, 0.25)
