"""`gatherlens bench models`: its pieces on fake results, and one run on tiny files (slow: fresh processes)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gatherlens.bench.model_files import REAL_MODELS, hf_config, model_vocab, write_model
from gatherlens.bench.models import agree_cells, markdown, reference_of
from gatherlens.cli import main


def test_reference_is_the_f16_file_beside_it(tmp_path):
    for name in ("m.Q4_K_M.gguf", "m.F16.gguf"):
        (tmp_path / name).write_bytes(b"")
    assert reference_of(tmp_path / "m.Q4_K_M.gguf", None) == tmp_path / "m.F16.gguf"
    assert reference_of(tmp_path / "m.F16.gguf", None) is None  # never itself
    assert reference_of(tmp_path / "other.Q8_0.gguf", None) is None
    assert reference_of(tmp_path / "m.Q4_K_M.gguf", tmp_path / "x.gguf") == tmp_path / "x.gguf"


def test_agreement_splits_at_the_window(monkeypatch, tmp_path):
    import gatherlens.bench.models as bm

    monkeypatch.setattr(bm, "_ours", lambda case, **spec: {"top1": [1, 2, 3, 9]})
    monkeypatch.setattr(bm, "_theirs", lambda python, **spec: {"top1": [1, 9, 3, 4]})
    reference = {"ids": list(range(10)), "top1": [1, 2, 3, 4]}
    spec = dict(prefix=6, steps=4, threads=1, budget=8)
    row = agree_cells(tmp_path / "f.gguf", reference, spec, window=8, python="py")  # steps 0, 1 before 8
    gap, half = row.pop("agree_gap"), row.pop("agree_gap_half")
    assert row == {"agree_steps": 4, "agree": 0.75, "agree_before": 1.0, "agree_after": 0.5,
                   "llama_agree": 0.75, "llama_agree_before": 0.5, "llama_agree_after": 1.0}
    # per step (ours right) - (theirs right): 0, +1, 0, -1: mean 0, sample sd sqrt(2/3), half-width 1.96 sd / 2
    assert gap == 0.0 and half == pytest.approx(1.96 * (2 / 3) ** 0.5 / 2)
    assert bm._paired_gap([1], [1], [], 4) == (None, None)  # no step to compare: no gap, no error
    assert "agree_before" not in agree_cells(tmp_path / "f.gguf", reference, spec, window=None, python=None)


def test_load_is_one_cold_run_then_the_median_of_warm_ones(monkeypatch, tmp_path):
    """Cold: the file evicted before each side's run; warm: WARM_RUNS runs alternating ours and llama.cpp's,
    each side's median reported (one slow start does not make the figure), ours kept beside."""
    import gatherlens.bench.models as bm

    log, ours_s, theirs_s = [], iter([3.0, 2.5, 1.5, 1.6]), iter([0.9, 0.7, 0.5, 0.6])
    monkeypatch.setattr(bm, "evict", lambda path: log.append("evict"))
    monkeypatch.setattr(bm, "_ours", lambda case, **spec: log.append("ours") or
                        {"loaded_s": (t := next(ours_s)), "first_token_s": t + 0.1, "load_s": t / 2, "prompt": [1]})
    monkeypatch.setattr(bm, "_theirs", lambda python, **spec: log.append("theirs") or
                        {"loaded_s": (t := next(theirs_s)), "first_token_s": t + 0.1})
    row = bm.load_cells(tmp_path / "f.gguf", 2, "py")
    assert bm.WARM_RUNS == 3 and log == ["evict", "ours", "evict", "theirs"] + ["ours", "theirs"] * 3
    assert row["load_cold_s"] == 3.0 and row["llama_load_cold_s"] == 0.9
    assert row["load_warm_s"] == 1.6 and row["load_warm_runs_s"] == [2.5, 1.5, 1.6]  # the median, not the first
    assert row["llama_load_warm_s"] == 0.6 and row["load_call_warm_s"] == 0.8
    ours_s = iter([1.0] * 4)  # without llama.cpp: ours alone, no llama.cpp columns
    alone = bm.load_cells(tmp_path / "f.gguf", 2, None)
    assert alone["load_warm_s"] == 1.0 and not any(k.startswith("llama_") for k in alone)


def test_markdown_table_has_one_line_a_file():
    row = {"file": "m.Q4_K_M.gguf", "ms_512": 10.0, "llama_ms_512": 15.0, "x_decode_512": 1.5, "prefill_s_512": 1.0,
           "llama_prefill_s_512": 2.0, "x_prefill_512": 2.0, "load_warm_s": 1.5, "load_cold_s": 4.0,
           "rss_mb_512": 500.0, "llama_rss_mb_512": 400.0, "agree": 0.95, "llama_agree": 0.97}
    lines = markdown([row], [512])
    assert len(lines) == 3 and "10.0 (15.0, 1.50x)" in lines[2] and "0.950 (0.970) |" in lines[2]
    lines = markdown([{**row, "agree_gap": -0.02, "agree_gap_half": 0.035}], [512])
    assert "0.950 (0.970) -0.020 ±0.035 |" in lines[2]
    assert "1.5 / 4.0 (- / -)" in lines[2]


@pytest.mark.slow
def test_bench_models_runs_on_tiny_files(tmp_path, monkeypatch):
    monkeypatch.delenv("GATHERLENS_LLAMA_PYTHON", raising=False)
    spec = REAL_MODELS["gemma3-270m"]
    config = hf_config(spec, num_hidden_layers=2, hidden_size=256, intermediate_size=256, vocab_size=2048,
                       sliding_window=16, layer_types=["sliding_attention", "full_attention"], bos_token_id=None,
                       eos_token_id=None, pad_token_id=None)
    vocab = model_vocab(spec, 2048, base=False)
    for dtype in ("F16", "Q8_0"):
        write_model(spec, tmp_path / f"g.{dtype}.gguf", config=config, dtype=dtype, vocab=vocab)
    out = tmp_path / "models.json"
    result = CliRunner().invoke(main, ["bench", "models", str(tmp_path / "g.Q8_0.gguf"), "--context", "64",
                                       "--tokens", "2", "--agree-prefix", "8", "--agree-steps", "16",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["file"] == "g.Q8_0.gguf" and row["ms_64"] > 0 and row["load_warm_s"] > 0
    assert 0 <= row["agree"] <= 1 and "agree_before" in row  # the window splits the steps
    assert "| g.Q8_0.gguf |" in result.output


def test_the_bench_says_when_a_narrower_path_was_asked_for(monkeypatch):
    """The meta's cpu names the CPU's widest path, and the AVX2 loops where they were built on purpose on an
    AVX-512 machine (GATHERLENS_NATIVE_CFLAGS) or torch was held to AVX2 (ATEN_CPU_CAPABILITY)."""
    from gatherlens.bench import models

    monkeypatch.delenv("GATHERLENS_NATIVE_CFLAGS", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    plain = models._cpu()
    assert "GATHERLENS_NATIVE_CFLAGS" not in plain
    monkeypatch.setenv("GATHERLENS_NATIVE_CFLAGS", "-mno-avx512f")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert models._cpu() == f"{plain}; GATHERLENS_NATIVE_CFLAGS=-mno-avx512f, ATEN_CPU_CAPABILITY=avx2"
