"""KV pages stored in 16 bits (float16, bfloat16) or int8 with scales as KIVI (keys per page channel, values
per token) (PagedKVCache(kv_dtype=)).

The summaries are exact for the stored values (so the page bound holds for every key attention
reads), every backend equals the float64 reference over the same stored values, each storage dtype
stays within a stated tolerance of float32, rope_append writes pages as `append` does, and the
setting travels through SparseConfig, the model adapter and the command line.
"""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from native_helpers import needs_native

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.layer import fused, naive
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse import fused_decode
from gatherlens.ops.sparse.cache import INT8_MAX, grown_scale
from gatherlens.ops.sparse.config import DEFAULT, KV_DTYPES, SparseConfig
from gatherlens.ops.sparse.naive import page_bound_reference, sparse_attention_reference
from gatherlens.ops.sparse.page_choice import page_bounds

NARROW = ("float16", "bfloat16", "int8")
# max |sparse_decode(stored in kv_dtype) - sparse_decode(float32)| / max(1, max |out|) on randn keys
# and values (D = 16..64, the same pages): what each storage costs (the tolerance these tests state)
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.5e-2, "int8": 4e-2}
needs_kernel = needs_native(fused_decode)
needs_layer_kernel = needs_native(fused)


def filled(kv_dtype, B=1, Hkv=2, L=61, D=16, P=8, chunks=None, seed=0, growth=0.0, Dv=None):
    """A cache of L random tokens (magnitudes growing by `growth` per token: int8 pages re-scale),
    appended in `chunks`; returns keys (B, Hkv, L, D), values and the cache."""
    g = torch.Generator().manual_seed(seed)
    gain = (1 + growth * torch.arange(L, dtype=torch.float32)).view(1, 1, L, 1)  # (1, 1, L, 1)
    k = torch.randn(B, Hkv, L, D, generator=g) * gain  # (B, Hkv, L, D)
    v = torch.randn(B, Hkv, L, Dv or D, generator=g) * gain  # (B, Hkv, L, Dv)
    cache = PagedKVCache(B, Hkv, D, page_size=P, kv_dtype=kv_dtype, value_dim=Dv)
    s = 0
    for t in chunks or [L]:
        cache.append(k[:, :, s:s + t], v[:, :, s:s + t])
        s += t
    return k, v, cache


def boxes(keys: torch.Tensor, P: int):
    """[max | min] of every page straight from keys (B, Hkv, L, D) as read."""
    L = keys.shape[2]
    hi = torch.stack([keys[:, :, s:s + P].amax(dim=2) for s in range(0, L, P)], dim=2)  # (B, Hkv, N, D)
    lo = torch.stack([keys[:, :, s:s + P].amin(dim=2) for s in range(0, L, P)], dim=2)  # (B, Hkv, N, D)
    return hi, lo


# -- the summaries are exact for the stored values: the bound holds for every stored key -----------

@settings(max_examples=60, deadline=None)
@given(kv=st.sampled_from(NARROW), L=st.integers(1, 70), D=st.integers(1, 24), P=st.sampled_from([1, 3, 8, 16]),
       cut=st.lists(st.integers(1, 20), max_size=6), growth=st.sampled_from([0.0, 0.2]),
       spread=st.sampled_from([0.01, 1.0, 100.0]), seed=st.integers(0, 10_000))
def test_bounds_hold_for_every_stored_key(kv, L, D, P, cut, growth, spread, seed):
    chunks = [c for c in cut if c <= L][:3]
    chunks = chunks + [1] * min(5, L - sum(chunks)) if sum(chunks) < L else [L]
    chunks.append(L - sum(chunks)) if sum(chunks) < L else None
    k, v, cache = filled(kv, Hkv=1, L=L, D=D, P=P, chunks=chunks, seed=seed, growth=growth)
    cache_keys = cache.keys  # (1, 1, L, D) what attention reads
    hi, lo = boxes(cache_keys, P)
    assert torch.equal(cache.key_max.float(), hi) and torch.equal(cache.key_min.float(), lo)  # exact, not nearly
    q = torch.randn(D, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) * spread  # (D,)
    fast = page_bounds(q.float().view(1, 1, 1, D), cache.summaries)[0, 0, 0].double()  # (N,)
    for p in range(cache.num_pages):
        page = cache_keys[0, 0, p * P:(p + 1) * P].double()  # (T, D) the stored keys of page p
        bound = page_bound_reference(q, page)
        assert bool(((page @ q) <= bound + 1e-9 * (1 + bound.abs())).all())
        torch.testing.assert_close(fast[p], bound, rtol=1e-4, atol=1e-4 * (1 + float(q.abs().sum())))


@pytest.mark.parametrize("kv", NARROW)
def test_every_summary_stays_exact_through_truncate_and_store_as(kv):
    k, v, cache = filled(kv, L=45, chunks=[20, 1, 1, 1, 22], growth=0.1)
    cache.truncate(29)
    assert torch.equal(torch.cat(boxes(cache.keys, 8), dim=-1), cache.summaries.float())
    cache.append(k[:, :, :5] * 3, v[:, :, :5] * 3)  # into the kept partial page, its scale grows
    assert torch.equal(torch.cat(boxes(cache.keys, 8), dim=-1), cache.summaries.float())
    before = cache.keys.clone()  # (B, Hkv, L, D)
    cache.store_as(None)  # back to float32: the values as read
    assert cache.kv_dtype == torch.float32 and torch.equal(cache.keys, before)
    cache.store_as(kv)
    assert torch.equal(torch.cat(boxes(cache.keys, 8), dim=-1), cache.summaries.float())


# -- the int8 rule: scales only grow, the error stays within a step ----------------------------------

def test_a_page_written_whole_gets_its_best_scales_and_half_a_step():
    """Keys: one scale per page channel (amax / 127 of that channel in that page); values: one per token."""
    k, v, cache = filled("int8", L=64, D=32, P=8)
    k[:, :, :, 5] *= 40  # an outlier channel keeps its own scale
    cache = PagedKVCache(1, 2, 32, page_size=8, kv_dtype="int8")
    cache.append(k, v)
    amax = k.abs().view(1, 2, 8, 8, 32).amax(dim=3)  # (B, Hkv, N, D)
    torch.testing.assert_close(cache.key_scales, amax / INT8_MAX, rtol=0, atol=0)
    step = cache.key_scales.repeat_interleave(8, dim=2)  # (B, Hkv, L, D)
    assert bool(((cache.keys - k).abs() <= 0.5 * step * (1 + 1e-6)).all())
    torch.testing.assert_close(cache.value_scales.reshape(1, 2, 64), v.abs().amax(-1) / INT8_MAX, rtol=0, atol=0)
    vstep = cache.value_scales.reshape(1, 2, 64, 1)  # (B, Hkv, L, 1)
    assert bool(((cache.values - v).abs() <= 0.5 * vstep * (1 + 1e-6)).all())
    assert int(cache.page_keys.abs().max()) <= 127 and int(cache.page_values.abs().max()) <= 127
    assert float((cache.keys - k)[..., :5].abs().max()) < 0.05  # the other channels are not rounded to the outlier's


def test_a_page_filled_token_by_token_loses_less_than_one_step():
    k, v, cache = filled("int8", L=64, D=32, P=8, chunks=[1] * 64, growth=0.15)
    step = cache.key_scales.repeat_interleave(8, dim=2)  # (B, Hkv, L, D) the final channel scales
    assert bool(((cache.keys - k).abs() < step).all())
    vstep = cache.value_scales.reshape(1, 2, 64, 1)  # (B, Hkv, L, 1): a token's scale is set once
    assert bool(((cache.values - v).abs() <= 0.5 * vstep * (1 + 1e-6)).all())
    assert bool((grown_scale(torch.tensor([1.0]), torch.tensor([0.5])) == 0.5).all())  # fits: kept
    assert float(grown_scale(torch.tensor([128.0]), torch.tensor([1.0]))) == 2.0  # grows: at least doubles


# -- every backend equals the reference over the stored values; each dtype near float32 ------------

def _backends():
    return ["torch", pytest.param("triton", marks=pytest.mark.slow),  # a subprocess: Triton's interpreter
            pytest.param("native", marks=needs_native(fused_decode))]


def _case(kv):
    """The cache and query every backend decodes: pages filled in chunks and token by token, values Dv = 12."""
    k, v, cache = filled(kv, B=2, Hkv=2, L=77, D=16, P=8, chunks=[40, 1, 1, 35], growth=0.05, Dv=12)
    return torch.randn(2, 6, 1, 16, generator=torch.Generator().manual_seed(5)), cache  # q (B, Hq, 1, D)


def _child(out_path: str) -> None:
    """Under TRITON_INTERPRET=1 (tests/triton_helpers.py): the Triton row's results for every case."""
    results = {}
    for kv in NARROW:
        for share in (True, False):
            q, cache = _case(kv)
            out, lse, sel = sparse_decode(q, cache, 24, share_selection=share, return_lse=True,
                                          return_selection=True, backend="triton")
            results[kv, share] = (out, lse, sel.pages)  # plain tensors: torch.load's safe types
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    from triton_helpers import interpreted_results

    return interpreted_results(__file__, tmp_path_factory)


@pytest.mark.parametrize("share", [True, False], ids=["shared", "per-head"])
@pytest.mark.parametrize("budget", [24, 10_000], ids=["sparse", "dense"])
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("kv", NARROW)
def test_every_backend_equals_the_reference_at_its_storage_dtype(kv, backend, budget, share, request):
    q, cache = _case(kv)
    if backend == "triton":
        if budget > 1000:
            pytest.skip("a budget covering the cache is dense in place on the torch / native rows")
        out, lse, pages = request.getfixturevalue("triton_results")[kv, share]
    else:
        out, lse, sel = sparse_decode(q, cache, budget, share_selection=share, return_lse=True,
                                      return_selection=True, backend=backend)
        pages = sel.pages  # (B, Hsel, n)
    ref, ref_lse = sparse_attention_reference(q, cache.keys, cache.values, pages, 8)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    _, _, plain = filled(None, B=2, Hkv=2, L=77, D=16, P=8, chunks=[40, 1, 1, 35], growth=0.05, Dv=12)
    exact = sparse_attention_reference(q, plain.keys, plain.values, pages, 8)[0]  # the same pages, float32
    assert float((out - exact).abs().max()) <= TOLERANCE[kv] * max(1.0, float(exact.abs().max()))


@pytest.mark.parametrize("kv", NARROW)
def test_each_storage_dtype_is_within_its_tolerance_of_float32(kv):
    worst = 0.0
    for seed, D in ((0, 16), (1, 64), (2, 32)):
        k, v, cache = filled(kv, L=300, D=D, P=16, seed=seed)
        _, _, plain = filled(None, L=300, D=D, P=16, seed=seed)
        q = torch.randn(1, 4, 1, D, generator=torch.Generator().manual_seed(seed))  # (B, Hq, 1, D)
        for budget in (64, 400):
            exact = sparse_decode(q, plain, budget)  # (B, Hq, 1, D)
            err = float((sparse_decode(q, cache, budget) - exact).abs().max())
            worst = max(worst, err / max(1.0, float(exact.abs().max())))
    assert worst <= TOLERANCE[kv]


@needs_kernel
@pytest.mark.parametrize("kv", NARROW)
def test_auto_takes_the_native_row_for_narrow_pages(kv):
    from gatherlens.ops.attention.variants import PLAIN
    from gatherlens.ops.sparse.config import PageChoice
    from gatherlens.ops.sparse.decode import SPARSE_DECODE

    _, _, cache = filled(kv, L=90)
    q = torch.randn(1, 4, 1, 16)
    choice = PageChoice(share_selection=True, group_score="max", recent=0, choose="bound")
    assert dict(SPARSE_DECODE.why(q, cache, 16, choice, 0.25, PLAIN, None, False))["native"] is None


@needs_kernel
def test_the_operators_take_scales_and_pass_opcheck():
    _, _, cache = filled("int8", L=90, D=8, P=4)
    q = torch.randn(1, 4, 8)
    ks, vs = cache.scale_storage()
    keys, values, summaries = cache.writable(0)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.gatherlens.paged_decode.default,
                          (q, keys, values, summaries, cache.length, 10, 20, 0.35, True, False, ks, vs),
                          test_utils=checks)
    torch.library.opcheck(torch.ops.gatherlens.dense_decode.default, (q, keys, values, cache.length, 0.35, ks, vs),
                          test_utils=checks)
    with pytest.raises(RuntimeError, match="scales must be given"):
        torch.ops.gatherlens.paged_decode(q, keys, values, summaries, cache.length, 10, 20, 0.35, True, False)


# -- rope_append writes 16-bit and int8 pages as `append` does ----------------------------------------

def _rope_inputs(B, Hq, Hkv, D, gain, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h * D, generator=g) * gain for h in (Hq, Hkv, Hkv))  # (B, H*D) each
    angle = torch.rand(B, D // 2, generator=g) * 6
    return q, k, v, torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # cos, sin (B, D)


@needs_layer_kernel
@pytest.mark.parametrize("kv", NARROW)
@pytest.mark.parametrize("B,Hq,Hkv,D,P,L0", [(1, 9, 3, 64, 8, 13), (2, 4, 2, 6, 4, 0), (1, 2, 1, 8, 3, 5)], ids=str)
def test_rope_append_writes_narrow_pages_as_append_does(kv, B, Hq, Hkv, D, P, L0):
    caches = [PagedKVCache(B, Hkv, D, page_size=P, kv_dtype=kv) for _ in range(2)]
    pre = torch.randn(B, Hkv, L0, D)
    for c in caches:
        c.append(pre, pre)
    for step in range(2 * P + 1):  # token by token, magnitudes growing: int8 pages re-scale
        args = _rope_inputs(B, Hq, Hkv, D, 1 + 0.3 * step, step)
        torch.testing.assert_close(fused.rope_append(*args, caches[0]), naive.rope_append_reference(*args, caches[1]))
    a, b = caches
    step = 1e-6 if kv != "int8" else float(a.key_scales.max())  # RoPE's sums may round a code the other way
    torch.testing.assert_close(a.keys, b.keys, atol=step, rtol=1e-2)
    torch.testing.assert_close(a.values, b.values, atol=step, rtol=1e-2)
    assert torch.equal(torch.cat(boxes(a.keys, P), dim=-1), a.summaries.float())  # exact for what it stored
    if kv == "int8":
        torch.testing.assert_close(a.key_scales, b.key_scales, rtol=1e-5, atol=0)


# -- memory, settings, the adapter and the command line ----------------------------------------------

def test_bytes_per_token_halve_and_quarter():
    per_token = {}
    for kv in (None, *NARROW):  # SmolLM2's shape: 3 KV heads of 64, pages of 8 (per layer)
        cache = PagedKVCache(1, 3, 64, page_size=8, kv_dtype=kv, capacity=4096)
        cache.append(torch.randn(1, 3, 4096, 64), torch.randn(1, 3, 4096, 64))
        per_token[kv] = cache.nbytes() / 4096
    assert per_token[None] == 3 * (2 * 64 * 4 + 2 * 64 * 4 / 8)  # K + V float32 and the float32 summaries
    assert per_token["float16"] == per_token["bfloat16"] == per_token[None] / 2  # 16-bit summaries too
    assert per_token["int8"] == 3 * (2 * 64 + 2 * 64 * 4 / 8 + 4 * (64 + 8) / 8)  # float32 summaries and scales:
    # 64 channel scales a key page, one a value token


def test_16_bit_pages_keep_16_bit_summaries_or_float32_ones_when_asked():
    for kv, want in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("int8", torch.float32)):
        assert PagedKVCache(1, 1, 4, kv_dtype=kv).summary_dtype == want
    k, v, wide = filled("float16", L=50)
    wide32 = PagedKVCache(1, 2, 16, page_size=8, kv_dtype="float16", summary_dtype=torch.float32)
    wide32.append(k, v)
    assert torch.equal(wide.summaries.float(), wide32.summaries)
    q = torch.randn(1, 4, 1, 16)
    a, sa = sparse_decode(q, wide, 16, return_selection=True)
    b, sb = sparse_decode(q, wide32, 16, return_selection=True)
    assert torch.equal(sa.pages, sb.pages) and torch.equal(a, b)


def test_the_setting_is_checked_where_it_is_given():
    assert SparseConfig(kv_dtype="int8").kv_dtype == "int8" and DEFAULT.replace(kv_dtype=None).kv_dtype is None
    assert set(KV_DTYPES) == {"float32", "float16", "bfloat16", "int8"}
    with pytest.raises(GatherValueError, match="kv_dtype = 'fp8'"):
        SparseConfig(kv_dtype="fp8")
    with pytest.raises(GatherTypeError, match="kv_dtype"):
        PagedKVCache(1, 1, 4, kv_dtype=torch.int32)


def test_a_model_decodes_over_narrow_pages_and_the_cache_follows_the_config():
    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 101, (1, 70))
    outs = {}
    for kv in (None, "float16", "int8"):
        use_sparse_decoding(model, budget=24, page_size=8, dense_layers=0, kv_dtype=kv)
        cache = SparseKVCache(config=model.config, page_size=8)  # made without the setting: it follows it
        with torch.no_grad():
            outs[kv] = model.generate(ids, cache=cache, max_new_tokens=6, do_sample=False, output_logits=True,
                                      return_dict_in_generate=True)
        want = {None: torch.float32, "float16": torch.float16, "int8": torch.int8}[kv]
        assert cache.paged(0).kv_dtype == want and cache.paged(1).kv_dtype == want
        use_dense_decoding(model)
    for kv in ("float16", "int8"):
        diff = max(float((a - b).abs().max()) for a, b in zip(outs[kv].logits, outs[None].logits))
        assert diff < (1e-2 if kv == "float16" else 0.1)


def test_the_command_line_takes_kv_dtype():
    from gatherlens.cli import main

    res = CliRunner().invoke(main, ["generate", "hi", "--dense", "--kv-dtype", "float16"])
    assert res.exit_code != 0 and "--kv-dtype and --dense" in res.output
    res = CliRunner().invoke(main, ["generate", "hi", "--kv-dtype", "fp8"])
    assert res.exit_code != 0 and "fp8" in res.output
    res = CliRunner().invoke(main, ["eval-sparse", "--budgets", "64", "--kv-dtype", "float16,fp8"])
    assert res.exit_code != 0 and "--kv-dtype" in res.output


def test_eval_sparse_rows_for_16_and_8_bit_pages():
    from gatherlens.commands.evaluate_sparse import _plan
    from gatherlens.eval.sparse_quality import comparison_setups

    names = [s.name for s in _plan("512", None, 2048, 8, 64, 0, 2, None, "max", True, ("float16", "int8")).setups]
    assert names == ["budget=512", "budget=512 kv_dtype=float16", "budget=512 kv_dtype=int8",
                     "dense kv_dtype=float16", "dense kv_dtype=int8"]
    table = {s.kv_dtype for s in comparison_setups()}
    assert {"float16", "bfloat16", "int8"} <= table


if __name__ == "__main__":
    import sys

    _child(sys.argv[1])
