"""Several generations at once (models/runtime/slots.py, batch.py) and what they stand on: the products of a few
rows of x (each weight read once for all of them: q8act.cpp / q8k.cpp's FEW_ROWS path, bit-equal to one row at
a time), the batched step against each sequence's own forward, slots against solo generations (greedy and
seeded, with prefix reuse and chunked prefill), and the stop strings of streamed text (serve/stop_text.py)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from chat_helpers import write_chat_model
from gatherlens.models import load
from gatherlens.models.runtime.batch import batch_plan, batched_step
from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding
from gatherlens.models.runtime.generation import generation_steps, last_logits
from gatherlens.models.runtime.prefix import PrefixCache
from gatherlens.models.runtime.slots import Ask, SlotRunner
from gatherlens.ops.quant.products import q8act
from gatherlens.ops.quant.products import q8k
from gatherlens.ops.quant.products.linear import LinearConfig, linear_product, pack_linear
from gatherlens.ops.sampling import SamplingConfig
from gatherlens.ops.sparse.config import DEFAULT
from gatherlens.serve.stop_text import StopText
from test_quantized_linear import blocks, width_for

# the integer kernels' formats (q8act.cpp's 32-weight blocks, q8k.cpp's super-blocks) whose kernel runs here
FEW = [q for q in q8act.Q8ACT_QTYPES if q8act.ready(q) is None and (q in q8act.BLOCK_QTYPES or q in q8k.Q8K_QTYPES)]


@pytest.mark.parametrize("qtype", FEW)
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 8])
def test_a_few_rows_of_x_equal_each_row_alone(qtype, rows):
    """A server's slots multiply their rows together; each row's outputs are the one-row kernel's, bit for bit
    (the x8 panels share each step's unpacked codes; the other formats read each weight row once for all)."""
    w = pack_linear(blocks(qtype, 40, 2 * width_for(qtype)), qtype, LinearConfig("q8act"))
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows))  # (M, K)
    together = linear_product(x, w)  # (M, N)
    alone = torch.cat([linear_product(x[i:i + 1], w) for i in range(rows)])  # (M, N)
    assert torch.equal(together, alone)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load(str(write_chat_model(tmp_path_factory.mktemp("slots") / "chat.gguf")), quantized=True,
                progress=False)


def _prefilled(model, prompt) -> SparseKVCache:
    cache = SparseKVCache(config=model.config, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)
    cache.reserve(prompt.shape[1] + 16)
    with torch.inference_mode():
        last_logits(model, cache, prompt)
    return cache


def test_the_batched_step_equals_each_sequences_own_step(lm):
    model = lm.model
    use_sparse_decoding(model, config=DEFAULT)
    try:
        plan = batch_plan(model)
        assert plan is not None and len(plan.layers) == model.config.num_hidden_layers
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 300, (1, n), generator=g) for n in (3, 17, 41)]  # (1, n): lengths differ
        alone, together = [_prefilled(model, p) for p in prompts], [_prefilled(model, p) for p in prompts]
        tokens = [5, 6, 7]
        for _ in range(4):
            with torch.inference_mode():
                want = torch.stack([model(input_ids=torch.tensor([[t]]), cache=c, use_cache=True).logits[0, -1]
                                    for t, c in zip(tokens, alone)])  # (3, V)
            got = batched_step(model, plan, tokens, together)  # (3, V)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            tokens = want.argmax(-1).tolist()
        assert [c.get_seq_length() for c in together] == [c.get_seq_length() for c in alone]
    finally:
        use_dense_decoding(model)


def _solo(lm, prompt, n, sampling=None):
    return list(list(generation_steps(lm, torch.tensor([prompt]), DEFAULT.budget, n, sampling=sampling,
                                      stop=()))[-1].new_ids)


def test_slots_generate_what_each_generation_alone_does(lm, monkeypatch):
    """Four prompts of different lengths (two past a prefill chunk), greedy and seeded, one sharing a kept
    prefix, one a kept prompt whole: each slot's tokens equal its own generation's (chunks of 16 there too)."""
    from gatherlens.models.runtime import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)   # the solo runs' chunks: the slots' grid
    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(3, 300, (n,), generator=g).tolist()) for n in (6, 40, 23, 70)]
    samplings = [None, SamplingConfig(temperature=0.9, top_k=20, seed=5), None, SamplingConfig(temperature=1.3, seed=9)]
    runner = SlotRunner(lm, PrefixCache(64 << 20, grid=16))
    runner.install()
    try:
        base = tuple(torch.randint(3, 300, (40,), generator=g).tolist())
        for prompt in (base, prompts[3]):
            first = runner.admit(Ask(prompt, 6, None, frozenset()))
            while not first.done:
                runner.advance([first])
            runner.release(first)                                    # kept: its whole chunks, and its logits
        prompts[2] = base[:36] + prompts[2]                          # shares 36 tokens with base: reuses 32
        slots = [runner.admit(Ask(p, 10, s, frozenset())) for p, s in zip(prompts, samplings)]
        assert [s.reused for s in slots] == [0, 0, 32, 70]          # prompts[3] again: whole, with its logits
        while not all(s.done for s in slots):
            runner.advance([s for s in slots if not s.done])
        assert runner.steps["batched"] > 0 and runner.steps["prefill_chunks"] > len(prompts)
    finally:
        runner.uninstall()
    for slot, prompt, sampling in zip(slots, prompts, samplings):
        assert slot.new == _solo(lm, prompt, 10, sampling) and slot.reason == "length"


def test_a_slot_stops_at_its_stop_ids_and_refuses_what_does_not_fit(lm):
    runner = SlotRunner(lm)
    runner.install()
    try:
        prompt = (10, 11, 12, 13)
        want = _solo(lm, prompt, 8)
        slot = runner.admit(Ask(prompt, 8, None, frozenset({want[2]})))
        while not slot.done:
            runner.advance([slot])
        assert slot.new == want[:want.index(want[2]) + 1] and slot.reason == "stop"
        with pytest.raises(Exception, match="do not fit the model's 256 positions"):
            runner.admit(Ask(tuple(range(3, 253)), 10))
    finally:
        runner.uninstall()


@given(text=st.text(alphabet="ab\n:", max_size=30), cuts=st.lists(st.integers(0, 30), max_size=6),
       stops=st.lists(st.text(alphabet="ab\n:", min_size=1, max_size=4), max_size=3))
def test_stop_text_sends_a_prefix_of_the_answer_and_cuts_at_the_first_stop(text, cuts, stops):
    """What is sent joins to the text before the first stop string (cut where it begins), whatever the pieces."""
    pieces, last = [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        pieces.append(text[last:cut])
        last = max(last, cut)
    matcher, sent = StopText(stops), ""
    for piece in pieces:
        out, stopped = matcher.push(piece)
        sent += out
        if stopped:
            break
    else:
        sent += matcher.flush()
    want, seen = text, ""
    for piece in pieces:   # generation stops at the first piece after which the text holds a stop string
        seen += piece
        hits = [seen.find(s) for s in stops if s in seen]
        if hits:
            want = seen[:min(hits)]
            break
    assert sent == want == matcher.text
