"""The sampler (ops/sampling): the fast chain against the float64 reference, seeds, the distribution, errors."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.sampling import (GREEDY, LLAMA_CPP, OPENAI, SampleRecord, Sampler, SamplingConfig, naive_sample,
                                     sample)
from gatherlens.trace import as_record, record_sampling

NEAR = 1e-5  # the fast path's penalties run in float32: its logits agree with the float64 reference's to this


def _cumulative(rec: SampleRecord) -> list[float]:
    return torch.as_tensor(rec.probs).cumsum(0).tolist()


def _boundary_near(values: list[float], target: float) -> bool:
    return any(abs(v - target) < NEAR for v in values)


def _cut_at_a_boundary(stage: str, rec: SampleRecord, before: torch.Tensor, config: SamplingConfig) -> bool:
    """True when the reference's `stage` cut of the candidates `before` sits within NEAR of its threshold."""
    logits = rec.logits[before]
    if stage == "top_p":
        return _boundary_near(torch.softmax(logits, 0).cumsum(0).tolist(), config.top_p)
    return stage == "min_p" and _boundary_near((logits - logits[0]).tolist(), math.log(config.min_p))


def _same_choice(fast: tuple, naive: tuple, config: SamplingConfig) -> None:
    """fast and naive chose alike: the same cuts, kept ids, distribution and token; a cut or a draw may
    differ only where the reference's threshold or the uniform sits within NEAR of a boundary."""
    (tf, rf), (tn, rn) = fast, naive
    assert torch.equal(rf.penalized, rn.penalized)
    assert torch.allclose(rf.logits, rn.logits, rtol=1e-6, atol=1e-6)
    assert [c.stage for c in rf.cuts] == [c.stage for c in rn.cuts]
    before = torch.argsort(rn.logits, descending=True, stable=True)
    for cf, cn in zip(rf.cuts, rn.cuts):
        if not torch.equal(cf.ids, cn.ids):
            assert _cut_at_a_boundary(cf.stage, rn, before, config), (cf, cn)
            return
        before = cn.ids
    assert torch.equal(rf.kept, rn.kept)
    assert torch.allclose(rf.probs, rn.probs, rtol=NEAR, atol=1e-7)
    if tf != tn:
        assert rf.uniform == rn.uniform and _boundary_near(_cumulative(rn), rn.uniform)


configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 0.25, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 1, 2, 5, 40]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
    # powers of two and quarters: the float32 penalties of the fast path equal the float64 reference's
    repeat_penalty=st.sampled_from([1.0, 2.0, 0.5]),
    frequency_penalty=st.sampled_from([0.0, 0.25, -0.5]),
    presence_penalty=st.sampled_from([0.0, 0.5, 1.25]),
    penalty_last_n=st.sampled_from([-1, 0, 3, 64]),
)


@given(config=configs, vocab=st.sampled_from([1, 2, 3, 7, 31, 97, 257, 1031]), seed=st.integers(0, 2**31),
       ties=st.booleans(), masked=st.booleans(), scale=st.sampled_from([0.02, 1.0, 4.0]))
def test_fast_chooses_as_the_reference(config, vocab, seed, ties, masked, scale):
    """The same cuts, distribution and token as naive.py; also without a record, where the fast path
    looks at a best-first prefix first (ops/sampling/fast.PREFIX; a flat distribution (scale 0.02) over
    1,031 ids makes it widen the prefix)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-8, 9, (vocab,), generator=g).float() / 4 if ties else torch.randn(vocab, generator=g)
    logits = logits * scale
    if masked and vocab > 1:
        logits[torch.randint(0, vocab, (vocab // 2,), generator=g)] = -math.inf
        logits[int(torch.randint(0, vocab, (1,), generator=g))] = 0.5   # at least one token stays
    history = torch.randint(0, vocab, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g)
    fast = sample(logits, config, history, torch.Generator().manual_seed(seed), record=True)
    naive = naive_sample(logits, config, history, torch.Generator().manual_seed(seed), record=True)
    _same_choice(fast, naive, config)
    assert float(logits[fast[0]]) > -math.inf
    quick = sample(logits, config, history, torch.Generator().manual_seed(seed))
    assert quick == fast[0] or _boundary_near(_cumulative(naive[1]), naive[1].uniform)


@pytest.mark.parametrize("method", [sample, naive_sample])
def test_the_record_keeps_its_promises(method):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(101, generator=g)
    config = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)
    token, rec = method(logits, config, None, g, record=True)
    assert [c.stage for c in rec.cuts] == ["top_k", "top_p", "min_p"]
    sizes = [c.ids.numel() for c in rec.cuts]
    assert sizes[0] == 20 and sizes == sorted(sizes, reverse=True)
    for before, after in zip(rec.cuts, rec.cuts[1:]):      # each cut keeps a best-first prefix of the last
        assert torch.equal(before.ids[:after.ids.numel()], after.ids)
    assert torch.equal(rec.kept, rec.cuts[-1].ids) and rec.kept.dtype == torch.int64
    assert torch.equal(rec.kept, torch.argsort(logits, descending=True, stable=True)[:rec.kept.numel()])
    assert rec.probs.dtype == torch.float64 and math.isclose(float(rec.probs.sum()), 1.0, rel_tol=1e-12)
    want = torch.softmax(logits.double()[rec.kept] / 0.8, 0)
    assert torch.allclose(rec.probs, want)
    assert 0 <= rec.uniform < 1 and token == rec.token and token in rec.kept.tolist()
    at = int(torch.searchsorted(rec.probs.cumsum(0), torch.tensor([rec.uniform], dtype=torch.float64), right=True))
    assert int(rec.kept[at]) == token     # the first kept id whose cumulative probability exceeds u


def test_greedy_is_the_argmax_after_the_penalties():
    logits = torch.tensor([1.0, 3.0, 3.0, 2.9])
    assert sample(logits, GREEDY) == naive_sample(logits, GREEDY) == 1        # a tie: the lower id
    config = SamplingConfig(repeat_penalty=1.1)
    assert sample(logits, config, history=[1, 2]) == naive_sample(logits, config, history=[1, 2]) == 3
    token, rec = sample(logits, GREEDY, record=True)
    assert rec.greedy and rec.uniform is None and rec.cuts == () and rec.kept.tolist() == [1]


def test_penalties_follow_llama_cpp():
    """llama.cpp: logit <= 0 multiplied, > 0 divided by repeat_penalty; then - count * freq - presence."""
    logits = torch.tensor([2.0, -1.0, 0.5, 4.0])
    config = SamplingConfig(repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    for method in (sample, naive_sample):
        _, rec = method(logits, config, [0, 0, 1, 0], record=True)
        assert rec.logits.tolist() == [2.0 / 2 - 3 * 0.25 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 4.0]
        assert rec.penalized.tolist() == [0, 1]
    window = SamplingConfig(repeat_penalty=2.0, penalty_last_n=1)   # only the last token counts
    assert sample(logits, window, [3, 0], record=True)[1].logits.tolist() == [1.0, -1.0, 0.5, 4.0]


@pytest.mark.parametrize("method", ["fast", "naive"])
def test_the_same_seed_gives_the_same_tokens(method):
    logits = torch.randn(500, generator=torch.Generator().manual_seed(0))
    config = LLAMA_CPP.replace(seed=1234, repeat_penalty=1.1)

    def run(cfg):
        sampler = Sampler(cfg, prompt=[1, 2, 3], method=method)
        return [sampler(logits + 0.01 * i) for i in range(40)]

    first = run(config)
    assert run(config) == first
    assert run(config.replace(seed=1235)) != first
    assert Sampler(OPENAI).seed != Sampler(OPENAI).seed   # no seed: a fresh random one


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """The chi-square test's p-value of `counts` drawn from `probs` (every probability > 0)."""
    n = counts.sum()
    expected = probs * n
    statistic = float(((counts - expected) ** 2 / expected).sum())
    dof = probs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_the_fast_sampler_draws_the_reference_distribution():
    """6,000 draws of the fast sampler against the reference's renormalized probabilities (chi-square);
    the same counts are far from the distribution a wrong temperature would give (the test can fail)."""
    logits = torch.tensor([2.0, 1.7, 1.5, 1.0, 0.6, 0.2, -0.5, -3.0, 1.2, 0.9, -1.0])
    config = SamplingConfig(temperature=0.7, top_k=8, top_p=0.85, min_p=0.05, presence_penalty=0.3)
    history = [1, 4]
    _, ref = naive_sample(logits, config, history, torch.Generator().manual_seed(0), record=True)
    assert 3 <= ref.kept.numel() < 8
    g = torch.Generator().manual_seed(99)
    draws = torch.tensor([sample(logits, config, history, g) for _ in range(6_000)])
    counts = torch.stack([(draws == t).sum() for t in ref.kept]).double()
    assert int(counts.sum()) == draws.numel()        # nothing outside the kept ids was ever drawn
    assert _chi_square_p(counts, ref.probs) > 1e-4
    _, hot = naive_sample(logits, config.replace(temperature=1.0), history, record=True)
    assert _chi_square_p(counts, hot.probs) < 1e-6


def test_record_sampling_is_the_gather_of_the_kept_logits():
    logits = torch.randn(33, generator=torch.Generator().manual_seed(5))
    _, rec = sample(logits, SamplingConfig(temperature=1.0, top_k=6), record=True)
    gr = record_sampling(rec, labels=[f"t{i}" for i in range(33)])
    assert torch.equal(gr.output[0], logits[rec.kept])
    assert torch.equal(gr.gathered(), gr.output)
    assert gr.meta["kind"] == "sampling" and gr.meta["cuts"]["top_k"] == rec.kept.tolist()
    assert as_record(rec).index.tolist() == rec.kept.tolist()
    assert "<svg" in rec.to_svg() and "6" in record_sampling(rec, lang="zh").caption
    with pytest.raises(GatherValueError, match="labels has 2 entries; expected one per vocabulary id, 33"):
        record_sampling(rec, labels=["a", "b"])


@pytest.mark.parametrize("field, value, words", [
    ("temperature", -0.5, r"temperature = -0.5 is outside the valid range \[0, 1000\]"),
    ("temperature", math.nan, r"temperature = nan is outside the valid range \[0, 1000\]"),
    ("top_k", -3, r"top_k = -3 is outside the valid range \[0, 2147483648\]"),
    ("top_p", 0.0, r"top_p = 0.0 is outside the valid range \(0, 1\]"),
    ("top_p", 1.5, r"top_p = 1.5 is outside the valid range \(0, 1\]"),
    ("min_p", 2, r"min_p = 2 is outside the valid range \[0, 1\]"),
    ("repeat_penalty", 0, r"repeat_penalty = 0 is outside the valid range \(0, 1000\]"),
    ("frequency_penalty", 3.0, r"frequency_penalty = 3.0 is outside the valid range \[-2, 2\]"),
    ("presence_penalty", -2.5, r"presence_penalty = -2.5 is outside the valid range \[-2, 2\]"),
    ("penalty_last_n", -2, r"penalty_last_n = -2 is outside the valid range \[-1, 2147483648\]"),
    ("seed", 1 << 64, r"seed = 18446744073709551616 is outside the valid range"),
])
def test_bad_settings_name_the_argument_its_value_and_range(field, value, words):
    with pytest.raises(GatherValueError, match=words):
        SamplingConfig(**{field: value})


def test_bad_kinds_and_logits_are_refused():
    with pytest.raises(GatherTypeError, match="top_k must be an int, got float 2.5"):
        SamplingConfig(top_k=2.5)
    with pytest.raises(GatherTypeError, match="temperature must be a number, got str"):
        SamplingConfig(temperature="hot")
    config = SamplingConfig(temperature=1.0, repeat_penalty=1.2)
    for method in (sample, naive_sample):
        with pytest.raises(GatherValueError, match=r"logits\[2\] = nan is not a finite score"):
            method(torch.tensor([0.0, 1.0, math.nan]), config)
        with pytest.raises(GatherValueError, match="logits are -inf for all 2 tokens"):
            method(torch.full((2,), -math.inf), config)
        with pytest.raises(GatherValueError, match=r"logits must be a 1-D floating tensor \(V,\)"):
            method(torch.zeros(2, 3), config)
        with pytest.raises(GatherValueError, match=r"history\[1\] = 9 is outside the vocabulary \[0, 3\)"):
            method(torch.zeros(3), config, [0, 9])


def test_the_sampler_keeps_a_bounded_history():
    sampler = Sampler(SamplingConfig(temperature=1.0, repeat_penalty=1.3, penalty_last_n=4, seed=0), prompt=range(50))
    assert sampler.history == [46, 47, 48, 49]
    for _ in range(100):
        sampler(torch.zeros(60))
    assert len(sampler.history) <= 16


@pytest.mark.parametrize("case", ["random", "ties", "nan", "all -inf", "float16", "a view"])
def test_greedy_is_torch_argmax(case):
    """greedy() (numpy's argmax for a CPU float32 row) picks what int(logits.argmax()) picks: the first of
    equal maxima, a NaN before any number, on a 262K vocabulary and on other dtypes (torch's own)."""
    from gatherlens.ops.sampling import greedy

    g = torch.Generator().manual_seed(5)
    x = torch.randn(262_144, generator=g)  # (V,)
    if case == "ties":
        x = x.round().clamp(-2, 2)  # many equal maxima
    elif case == "nan":
        x[70_000] = float("nan")
        x[90_000] = float("nan")
    elif case == "all -inf":
        x = torch.full((1000,), float("-inf"))
    elif case == "float16":
        x = x.half()
    elif case == "a view":
        x = torch.randn(3, 2, 4099, generator=g)[1, :, ::2][0]  # strided
    assert greedy(x) == int(x.argmax())
