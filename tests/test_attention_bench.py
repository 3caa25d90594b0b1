"""`gatherlens bench attention` on a tiny grid: fresh processes, JSON, table, option checks."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gatherlens.bench.attention import command


@pytest.mark.slow  # two fresh processes, each importing torch
def test_bench_attention_tiny_grid_writes_json(tmp_path):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    result = CliRunner().invoke(command, ["--mode", "decode", "--context", "512", "--top-k", "8,600",
                                          "--dtype", "float32", "--repeats", "1", "--json", str(out),
                                          "--no-share", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["mode"], r["context"], r["top_k"]) for r in rows] == [("decode", 512, 8), ("decode", 512, 600)]
    for r in rows:
        assert r["sdpa_s"] > 0 and r["topk_s"] > 0 and r["sdpa_gqa_s"] > 0
        assert r["baseline"] == "sdpa_folded" and not r["share_selection"]  # the strongest dense form
        assert r["ratio"] == pytest.approx(r["topk_s"] / r["sdpa_s"])
        assert r["topk_extra_mib"] >= 0 and r["q_heads"] == 32 and r["kv_heads"] == 8
    assert "ratio" in result.output and "wrote" in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_ratios_draws_one_line_per_series(tmp_path):
    from gatherlens.bench.plot import plot_ratios

    rows = [{"context": L, "top_k": k, "ratio": r} for L, k, r in
            ((4096, 64, 0.9), (8192, 64, 1.1), (4096, 256, 1.2), (8192, 256, 1.3))]
    path = plot_ratios(rows, tmp_path / "r.svg", x="context", series=("top_k",), title="t")
    text = path.read_text()
    assert "top_k=64" in text and "top_k=256" in text


def test_bench_attention_refuses_a_bad_plot_name(tmp_path):
    result = CliRunner().invoke(command, ["--json", str(tmp_path / "x.json"), "--plot", str(tmp_path / "x.txt")])
    assert result.exit_code != 0 and ".png" in result.output
    assert not (tmp_path / "x.json").exists()


def test_bench_attention_refuses_to_overwrite(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text("keep me")
    result = CliRunner().invoke(command, ["--json", str(out)])
    assert result.exit_code != 0 and "--force" in result.output
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("args", [["--top-k", "0"], ["--top-k", "a"], ["--dtype", "int8"],
                                  ["--repeats", "0"], ["--mode", "train"], ["--context", "-5"]],
                         ids=lambda a: " ".join(a))
def test_bench_attention_rejects_bad_options(tmp_path, args):
    result = CliRunner().invoke(command, args + ["--json", str(tmp_path / "x.json")])
    assert result.exit_code != 0
    assert not (tmp_path / "x.json").exists()
