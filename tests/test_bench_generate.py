"""`gatherlens bench generate`'s peers: the llama.cpp case (only where llama-cpp-python's virtualenv
exists), the quantized case's plumbing at a tiny context, the rows, ratios and the profile file.
No timing is asserted: only that each case ran and reported its figures."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from test_generate import tiny_llama_folder  # noqa: E402

from gatherlens.bench import generate as g  # noqa: E402
from gatherlens.bench.fresh import run_fresh  # noqa: E402
from gatherlens.bench.generate_peers import ENV, STEPS, gguf_of, llama_python, quantized_note, run_llamacpp  # noqa: E402

# the llama.cpp virtualenv: $GATHERLENS_LLAMA_PYTHON, else ../llamacpp-venv beside the checkout (docs: peers)
VENV = Path(__file__).resolve().parents[2] / "llamacpp-venv"
LLAMA_PY = os.environ.get(ENV) or str(VENV / "bin" / "python")
needs_llama = pytest.mark.skipif(not (os.environ.get(ENV) or VENV.exists()), reason="no llama-cpp-python virtualenv")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory.mktemp("bg") / "tiny-llama")


@needs_llama
def test_llamacpp_case_prefills_and_times_32_steps():
    from gatherlens.models import load

    lm = load("smollm2")  # the float model's tokenizer: the prompt tokens our cases use
    prompt = g.prompt_tokens(lm, 512)
    assert len(prompt) == 512 and prompt[:256] == prompt[256:] == g.real_prefix(lm)[0].tolist()
    python, note = llama_python(LLAMA_PY)
    assert python == LLAMA_PY and note == ""
    res = run_llamacpp(python, gguf_of("smollm2"), prompt, threads=1)
    assert res["steps"] == STEPS and res["ms"] > 0 and res["cpu_ms"] > 0 and res["prefill_tokens_per_s"] > 0
    assert res["rss_mb"] >= res["model_mb"] > 0
    row = g.llama_row(512, res, hf_s=1.0, threads=1, positions=8192)
    assert row.method == row.case == "llama.cpp" and row.ms == res["ms"] and row.attention_ms is None


def test_llama_python_is_skipped_with_a_note_or_refused(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    python, note = llama_python(None)
    assert python is None and "skipped" in note and ENV in note
    with pytest.raises(click.BadParameter, match="cannot import llama_cpp"):
        llama_python(sys.executable)  # gatherlens' own venv: no llama_cpp, never installed there
    monkeypatch.setenv(ENV, "/nonexistent/python")
    with pytest.raises(click.BadParameter, match="does not exist"):
        llama_python(None)


@pytest.mark.slow  # a bench case: a fresh process per case, the real model
def test_quantized_case_runs_at_a_tiny_context():
    assert quantized_note(gguf_of("smollm2")) == ""
    plan = [vars(m) for m in g.quantized_methods([16])]
    spec = dict(model="smollm2", context=48, tokens=2, rounds=1, threads=1, methods=plan, quantized=True,
                prompt=False, profile=("quantized-sparse-16",))
    res = run_fresh("gatherlens.bench.generate", spec)
    rows = g.rows_of(spec, res, hf_s=1.0, case="quantized")
    assert [r.method for r in rows] == ["quantized-dense", "quantized-sparse-16"]
    assert all(r.case == "quantized" and r.ms > 0 and r.attention_ms > 0 and r.rss_mb > 0 for r in rows)
    assert res["prompt"] is None and res["profile"]["quantized-sparse-16"][0]["calls"] > 0


def test_llama_ratios_and_targets():
    names = ["hf", "quantized-sparse-512"]
    plan = [vars(m) for m in g.methods([512], False)][:1] + [vars(g.quantized_methods([512])[1])]
    result = {"wall": dict(zip(names, [0.4, 0.02])), "cpu": dict.fromkeys(names, 0.01),
              "attention": dict.fromkeys(names, 5.0), "rss_mb": 900.0, "model_mb": 100.0}
    rows = g.rows_of(dict(context=8192, methods=plan, threads=2), result)
    llama = {"ms": 30.0, "cpu_ms": 55.0, "rss_mb": 200.0, "model_mb": 130.0}
    rows = g.with_llama_ratios(rows + [g.llama_row(8192, llama, 0.4, 2, 8192)])
    assert [r.x_llama for r in rows] == pytest.approx([30 / 400, 1.5, 1.0])
    assert rows[2].speedup == pytest.approx(400 / 30) and rows[0].rss_mb == 900.0
    (v,) = g.llama_target_verdicts(rows)
    assert v == {"context": 8192, "target": 1.0, "x_llama": pytest.approx(1.5), "method": "quantized-sparse-512",
                 "met": True}


@pytest.mark.slow  # a bench case: a fresh process per case
def test_tiny_folder_skips_the_peers_and_writes_the_profile(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, sys.executable)  # would be refused if it were used: a folder has no GGUF
    out = tmp_path / "g.json"
    res = CliRunner().invoke(g.command, ["--model", str(tiny), "--context", "64", "--budgets", "16", "--tokens", "2",
                                         "--rounds", "1", "--threads", "1", "--profile", "--json", str(out)])
    assert res.exit_code != 0 and "cannot import llama_cpp" in res.output
    monkeypatch.delenv(ENV)
    res = CliRunner().invoke(g.command, ["--model", str(tiny), "--context", "64", "--budgets", "16", "--tokens", "2",
                                         "--rounds", "1", "--threads", "1", "--profile", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["rows"]] == ["hf", "paged", "sparse-16", "cli", "cli/pages"]
    assert [r["case"] for r in data["rows"]] == ["float"] * 3 + ["cli"] * 2
    assert all(r["rss_mb"] > 0 and r["x_llama"] is None for r in data["rows"])
    assert any("quantized rows skipped" in n for n in data["meta"]["skipped"])
    assert any("llama.cpp row skipped" in n for n in data["meta"]["skipped"])
    profile = (tmp_path / "g.profile.md").read_text()
    assert "L=64, hf" in profile and "L=64, sparse-16" in profile and "| op |" in profile


@pytest.mark.slow  # a bench case: a fresh process per case
def test_cli_rows_time_the_commands_loop(tiny):
    """The cli rows: `stream_generate` as `gatherlens generate` runs it (real prefill, detokenizer), page
    trace off and on, in a fresh process; shaped like the other cases' results."""
    plan = [vars(m) for m in g.cli_methods(16)]
    spec = dict(model=str(tiny), context=40, tokens=2, rounds=2, threads=1, methods=plan, quantized=False)
    res = run_fresh("gatherlens.bench.generate_cli", spec)
    assert set(res["wall"]) == {"cli", "cli/pages"} and res["generated"] == {"cli": 5, "cli/pages": 5}
    rows = g.rows_of(spec, res, hf_s=1.0, case="cli")
    assert [r.method for r in rows] == ["cli", "cli/pages"] and all(r.case == "cli" and r.ms > 0 for r in rows)
    assert all(r.attention_ms is None and r.attention_share is None and r.rss_mb > 0 for r in rows)


def test_cli_verdicts_compare_with_the_bench_row_and_llama():
    def mk(method, ms, budget=512):
        return g.Row(4096, method, ms, 1e3 / ms, ms, 1.0, None, None, budget, True, False, 2, "x")

    rows = g.with_llama_ratios([mk("quantized-sparse-512", 10.0), mk("cli", 10.4), mk(g.LLAMA, 15.0, None)])
    (v,) = g.cli_verdicts(rows)
    assert v["near"] and v["bench"] == "quantized-sparse-512" and v["x_llama"] == pytest.approx(15 / 10.4)
    assert v["target"] == 1.5 and v["met"] is False
    rows[1].ms = 11.0
    assert not g.cli_verdicts(rows)[0]["near"]


def test_budgets_take_auto_first_then_the_ints():
    import click

    assert g._check_options("1024,auto,512", 1, 1, 1) == ["auto", 512, 1024]
    assert [m.name for m in g.quantized_methods(["auto", 512])] == ["quantized-dense", "quantized-sparse-auto",
                                                                     "quantized-sparse-512"]
    with pytest.raises(click.UsageError, match="--budgets = 'fast' must be comma-separated positive integers"):
        g._check_options("auto,fast", 1, 1, 1)  # the one int rule (gatherlens.params), "auto" taken out first
