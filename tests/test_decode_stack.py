"""The whole decode step in one operator (ops/layer/stack.py, models/runtime/stack.py) against the lean step.

Tiny random Llama / Mistral models written to GGUF (tests/tiny_gguf.py) and run from their blocks: the
operator against its plain reference (the same operators called one by one from Python: bit-equal),
and the model's one-operator step against its lean step (models/runtime/step.py: the same cache bits, logits
within the final norm's rounding), sparse and dense, over pages stored in every dtype.
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

gguf = pytest.importorskip("gguf")

from tiny_gguf import tiny_model, write_gguf  # noqa: E402

from gatherlens.models import load  # noqa: E402
from gatherlens.models.runtime.stack import remove_stack, stack_active, stack_weights  # noqa: E402
from gatherlens.models.runtime.decoding import (SparseKVCache, observe_sparse, use_dense_decoding,  # noqa: E402
                                      use_sparse_decoding)
from gatherlens.ops.layer import stack  # noqa: E402
from gatherlens.ops.sparse.decode import choice_of_config  # noqa: E402

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


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("budget", [8, "auto", None], ids=["sparse", "auto", "dense"])
def test_one_operator_step_is_the_lean_step(models, qtype, kv_dtype, budget):
    """The same tokens through both: the caches bit-equal after every step, the logits within the
    final norm's float rounding (the lean path's final norm is transformers' module)."""
    model = models("llama", qtype)
    use_sparse_decoding(model, budget=budget, page_size=4, dense_layers=0, recent=0, kv_dtype=kv_dtype, **AUTO)
    try:
        assert stack_active(model)
        native_cache = _prefilled(model, kv_dtype)
        lean_cache = copy.deepcopy(native_cache)
        tokens = torch.randint(0, 317, (STEPS,), generator=torch.Generator().manual_seed(5)).tolist()
        native = _steps(model, native_cache, tokens)
        remove_stack(model)
        lean = _steps(model, lean_cache, tokens)
    finally:
        use_dense_decoding(model)
    assert _same_cache(native_cache, lean_cache)
    for a, b in zip(native, lean):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("budget", [8, 12, "auto", None], ids=["sparse", "sparse-wider", "auto", "dense"])
def test_operator_equals_its_reference(models, qtype, budget):
    """decode_stack (C++) and stack_reference (the same operators from Python): bit-equal logits, the
    last layer's output (no head), caches and the pages each head of each layer read."""
    model = models("llama", qtype)
    use_sparse_decoding(model, budget=budget, page_size=4, dense_layers=1, recent=4, kv_dtype="float16", **AUTO)
    try:
        weights, config = stack_weights(model), model.gatherlens_sparse
        a = _prefilled(model, "float16")
        b = copy.deepcopy(a)
        caches = [stack.StackCaches.of([layer.paged for layer in c.layers]) for c in (a, b)]
        x, cos, sin = torch.randn(1, 64), torch.randn(1, 16), torch.randn(1, 16)
        budgets = [config.budget_for(PROMPT.shape[1] + 1, i) for i in range(2)]
        how = choice_of_config(config)
        counts = [torch.full((2, 4), -7, dtype=torch.long) for _ in range(2)]  # (layers, Hq): per-head choice
        with torch.inference_mode():
            fast = stack.decode_stack(x, cos, sin, weights, caches[0], budgets, how, 0.25, counts[0])
            slow = stack.stack_reference(x, cos, sin, weights, caches[1], budgets, how, 0.25, counts[1])
            headless = type(weights)(**{**weights.__dict__, "head": None, "_flat": {}})
            fast2 = stack.decode_stack(x, cos, sin, headless, caches[0], budgets, how, 0.25)
            slow2 = stack.stack_reference(x, cos, sin, headless, caches[1], budgets, how, 0.25)
    finally:
        use_dense_decoding(model)
    assert fast.shape == (1, 320) and torch.equal(fast, slow)
    assert fast2.shape == (1, 64) and torch.equal(fast2, slow2)
    assert _same_cache(a, b)
    assert torch.equal(counts[0], counts[1]) and bool((counts[0][0] == 12).all())  # layer 0 dense: every page
    if budget == "auto":  # the second layer chooses per head, within [min_pages, max_pages]
        assert bool((counts[0][1] >= 2).all()) and bool((counts[0][1] <= 8).all())


def test_steps_needing_each_layer_run_the_lean_step(models):
    """Observers (they want every layer's PageSelection), kept selections and a batch of two take the
    model's own forward; the operator runs again once they are gone."""
    model = models("llama", "Q8_0")
    calls = []
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0)
    try:
        cache = _prefilled(model, "float16")
        with observe_sparse(calls.append):
            _steps(model, cache, [5])
        assert len(calls) == 2  # both layers, one step
        with torch.inference_mode():
            batch = model(input_ids=PROMPT.repeat(2, 1)[:, :9], use_cache=False).logits
        assert batch.shape == (2, 9, 320)
        assert stack_active(model)
    finally:
        use_dense_decoding(model)
    assert not stack_active(model)


def test_layers_the_operator_lacks_keep_the_lean_step(models):
    """Qwen2's q/k/v biases: no stack. Mistral's sliding-window layers keep a ring, not pages: its
    steps take the lean step (the same logits with the operator installed or not)."""
    model = models("qwen2", "Q8_0")
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        assert stack_weights(model) is None and not stack_active(model)
    finally:
        use_dense_decoding(model)
    model = models("mistral", "Q8_0")
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        assert stack_active(model) and model.config.sliding_window is not None
        cache = _prefilled(model, "float16")
        other = copy.deepcopy(cache)
        installed = _steps(model, cache, [4, 6])
        remove_stack(model)
        removed = _steps(model, other, [4, 6])
    finally:
        use_dense_decoding(model)
    assert all(torch.equal(a, b) for a, b in zip(installed, removed))


def test_without_the_operator_the_reference_runs(models, monkeypatch):
    """stack_fits saying no: decode_stack runs stack_reference (the same results)."""
    model = models("llama", "Q4_0")
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0)
    try:
        cache = _prefilled(model, "float16")
        other = copy.deepcopy(cache)
        fast = _steps(model, cache, [7, 9])
        monkeypatch.setattr(stack, "stack_fits", lambda weights: "switched off for the test")
        slow = _steps(model, other, [7, 9])
    finally:
        use_dense_decoding(model)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow)) and _same_cache(cache, other)
