"""The command line of sparse prefill on a tiny random Llama: generate --sparse-prefill, eval-prefill, bench prefill."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tiny_models import make_tiny_llama

pytest.importorskip("transformers")

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("prefill") / "tiny-llama")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "austen.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_generate_with_sparse_prefill(tiny):
    from gatherlens.commands.generate import generate

    args = [TEXT[:300], "--model", str(tiny), "--max-new-tokens", "4"]
    plain = CliRunner().invoke(generate, args)
    sparse = CliRunner().invoke(generate, [*args, "--sparse-prefill"])
    assert plain.exit_code == 0 and sparse.exit_code == 0, sparse.output
    assert "generated 4 tokens" in sparse.output
    assert sparse.stdout == plain.stdout  # a prompt under min_length prefills densely: the same continuation


def test_eval_prefill_rows(tiny, text_file, tmp_path):
    from gatherlens.cli import main

    out = tmp_path / "prefill.json"
    res = CliRunner().invoke(main, ["eval-prefill", "--model", str(tiny), "--text", str(text_file), "--context", "320",
                                    "--scored", "64", "--greedy", "4", "--passkey-context", "200",
                                    "--passkey-trials", "1", "--block-size", "16", "--threshold", "0.5",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [r["setting"] for r in data["rows"]] == ["dense", "antidiagonal", "pooled"]
    for row in data["rows"][1:]:
        assert row["ppl_ratio"] > 0 and 0 < row["kept_share"] <= 1 and row["passkey_trials"] == 1
        assert 0 <= row["agree_tokens"] <= 4 and len(row["ppl_ratio_ci"]) == 2 and 0 <= row["top1_agree"] <= 1
        assert row["agree_prefix"] == 4 or row["agree_margin"] >= 0  # dense's token leads where they part
    assert "sparse prefill vs dense" in res.output


def test_eval_prefill_refuses_an_unknown_rule(tiny):
    from gatherlens.cli import main

    res = CliRunner().invoke(main, ["eval-prefill", "--model", str(tiny), "--rules", "vertical"])
    assert res.exit_code == 2 and "--rules" in res.output


@pytest.mark.slow  # a bench case: a fresh process per case
def test_bench_prefill_smoke(tiny, tmp_path):
    """A tiny model, a short context: every row, the ratios, the JSON (no llama.cpp row without --llama-python)."""
    from gatherlens.cli import main

    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "prefill", "--model", str(tiny), "--context", "256", "--block-size", "16",
                                    "--rules", "default,pooled", "--threads", "1", "--json", str(out)],
                             env={"GATHERLENS_LLAMA_PYTHON": ""})
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["suite"] == "prefill"
    assert [r["method"] for r in data["rows"]] == ["dense", "sparse-default", "sparse-pooled"]
    assert all(r["ttft_s"] > 0 and r["x_dense"] > 0 for r in data["rows"])
    assert "llama.cpp row skipped" in res.output


def test_explain_draws_the_prefill_map(tiny, tmp_path):
    from gatherlens.cli import main

    out = tmp_path / "report"
    res = CliRunner().invoke(main, ["explain", TEXT[:400], "--model", str(tiny), "--out", str(out),
                                    "--sparse-prefill"])
    assert res.exit_code == 0, res.output
    svg = (out / "prefill-map.svg").read_text()
    assert svg.startswith("<svg") and "Key blocks each query block gathered" in svg
    assert "sparse prefill:" in res.output


@pytest.mark.parametrize("lang,words", [("en", "query blocks"), ("zh", "查询块")])
def test_prefill_map_picture_in_both_languages(lang, words):
    import torch

    from gatherlens.ops.prefill import select_blocks
    from gatherlens.ops.prefill.config import TOY
    from gatherlens.render.prefill_map import map_pixels, prefill_map_svg

    q, k = torch.randn(1, 4, 200, 8), torch.randn(1, 2, 200, 8)
    sel = select_blocks(q, k, TOY.replace(threshold=None, budget=4))
    svg = prefill_map_svg(sel, head=1, lang=lang, layer=3)
    assert svg.startswith("<svg") and words in svg and "<image" in svg
    img = map_pixels(sel, head=1)                                             # (nq, nk, 3)
    assert img.shape == (13, 13, 3) and (img[0, 1:] == 255).all()             # above the diagonal: white
    assert svg == prefill_map_svg(sel, head=1, lang=lang, layer=3)            # same selection, same bytes
