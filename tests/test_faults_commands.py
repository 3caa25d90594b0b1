"""Faults of the commands that load a model and evaluate or benchmark it (issue 40): a model of the
wrong kind refused before it loads, options checked before the slow work and named by their own
flag, sliding-window models in eval-sparse, load()'s switches, bench presets' files and cases.

Each test's docstring says what must hold: what the user sees and what is left on disk.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import error_lines, no_load, run, smollm2_path  # noqa: E402
from fault_helpers import tiny_dir  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherTypeError, GatherValueError  # noqa: E402

ENCODER = ("Error: model 'minilm' is an encoder (BertModel, by its config.json): it does not generate, so {what} "
           "cannot run it; use a causal LM such as smollm2 (or a .gguf file)")


@pytest.mark.parametrize("args", [["generate", "hi"], ["eval-prefill"], ["eval-sparse"], ["bench", "generate"],
                                  ["bench", "prefill"]], ids=lambda a: "-".join(a))
def test_an_encoder_is_refused_before_anything_loads(tmp_path, monkeypatch, args):
    """Must hold: every command that decodes refuses an encoder (minilm) from its config alone, before
    any weight loads: one `Error:` line naming the model, its class and the command, exit 1, nothing
    written. (Before issue 40 eval-prefill loaded it and died: `internal error (... no .logits)`.)"""
    monkeypatch.chdir(tmp_path)
    no_load(monkeypatch)
    result = run(*args, "--model", "minilm")
    what = " ".join(a for a in args if a != "hi")
    assert result.exit_code == 1 and error_lines(result) == [ENCODER.format(what=what)], result.output
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_an_encoder_in_prefill_quality():
    """Must hold: evaluate_prefill_quality on a BERT model is one GatherValueError naming the class."""
    import torch
    import transformers

    from gatherlens.eval.prefill_quality import evaluate_prefill_quality
    from gatherlens.ops.prefill.config import TOY

    bert = transformers.BertModel(transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32)).eval()
    with pytest.raises(GatherValueError, match=r"BertModel \(bert\) is not a causal LM: .*next-token logits"):
        evaluate_prefill_quality(bert, None, torch.arange(40)[None] % 64, {"toy": TOY}, scored=4, greedy=1,
                                 passkey_context=None)


@pytest.mark.parametrize("args,message", [
    (["--threshold", "nan"], "Error: Invalid value for '--threshold': 'nan' is not a finite number; give one in 0<x<=1"),
    (["--block-size", "7"], "Error: Invalid value for --block-size: block_size = 7 must be a multiple of stride"),
], ids=["threshold-nan", "block-size-7"])
def test_eval_prefill_options_are_named_by_their_own_flag(monkeypatch, args, message):
    """Must hold: a bad --threshold or --block-size is one error naming that option (before issue 40:
    reported as an error in --rules), before the model loads."""
    no_load(monkeypatch)
    result = run("eval-prefill", *args)
    assert result.exit_code == 2 and len(error_lines(result)) == 1, result.output
    assert error_lines(result)[0].startswith(message), result.output


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--context", "--passkey-context"])
def test_eval_prefill_past_the_models_positions_is_refused(monkeypatch, option):
    """Must hold: a --context or --passkey-context past the model's positions (SmolLM2: 8,192) is one
    error naming the option and the limit, before any prefill (before issue 40: it ran silently past)."""
    import gatherlens.eval.prefill_quality as quality

    smollm2_path()
    monkeypatch.setattr(quality, "evaluate_prefill_quality", lambda *a, **k: pytest.fail("it evaluated"))
    result = run("eval-prefill", "--quantized", option, "9000", "--scored", "8")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"Error: Invalid value for {option}: 9000 tokens exceed the model's 8192 "
                                   f"positions (smollm2)"], result.output


def test_eval_sparse_head_is_checked_before_the_evaluation(tiny_dir, tmp_path, monkeypatch):
    """Must hold: --head outside the drawn heads is one error naming it and the range, before any
    decode step (before issue 40: after the whole evaluation); the --pictures folder stays empty."""
    import gatherlens.commands.evaluate_sparse as evaluate_sparse

    monkeypatch.setattr(evaluate_sparse, "_measure", lambda *a, **k: pytest.fail("it evaluated"))
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged. " * 40)
    result = run("eval-sparse", "--model", str(tiny_dir), "--text", str(text), "--context", "64", "--budgets", "16",
                 "--decode-tokens", "8", "--passkey-trials", "0", "--pictures", str(tmp_path / "pics"), "--head", "99")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == ["Error: Invalid value for --head: head 99 is outside [-2, 2): the model has 2 "
                                   "query heads to draw (negative counts from the end)"], result.output
    assert not (tmp_path / "pics").exists() or not any((tmp_path / "pics").iterdir())


def test_repage_copies_a_window_layers_ring():
    """Must hold: `repage` of a sliding-window model's prefilled cache keeps each local layer a ring of
    its own (a copy: extending the copy leaves the original as it was) and re-pages the global ones.
    (Before issue 40: AttributeError: 'WindowLayer' object has no attribute 'paged'.)"""
    import torch

    from tiny_gguf import tiny_model

    from gatherlens.eval.sparse_quality import prefill, repage
    from gatherlens.models.attention.cache import PagedLayer, WindowLayer
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    model = tiny_model("gemma2")
    use_sparse_decoding(model, budget=8)
    try:
        cache, _ = prefill(model, torch.arange(3, 40)[None], 8)
        copy = repage(cache, 4, "float16")
        assert [type(layer) for layer in copy.layers] == [type(layer) for layer in cache.layers]
        assert {WindowLayer, PagedLayer} == {type(layer) for layer in cache.layers}
        ring = [layer.ring[0].clone() for layer in cache.layers if isinstance(layer, WindowLayer)]
        model(input_ids=torch.tensor([[5]]), cache=copy, use_cache=True)   # extend the copy only
        after = [layer.ring[0] for layer in cache.layers if isinstance(layer, WindowLayer)]
        assert all(torch.equal(a, b) for a, b in zip(ring, after))
        assert copy.get_seq_length() == cache.get_seq_length() + 1
    finally:
        use_dense_decoding(model)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_eval_sparse_runs_on_a_sliding_window_model(tmp_path, arch):
    """Must hold: `eval-sparse` on a Gemma 2 / Gemma 3 file (local layers keep a window ring, not pages)
    runs and writes its table: the sparse row read fewer pages than dense (recall below 1), exit 0.
    (Before issue 40: `Error: internal error (AttributeError: 'WindowLayer' object has no attribute
    'paged')` on every sliding-window model; `generate --budget` worked.)"""
    from tiny_gguf import tiny_model, write_gguf

    layers = {"gemma3": 6}.get(arch, 2)   # Gemma 3: five local layers, then a global one
    path = write_gguf(tiny_model(arch, num_hidden_layers=layers), arch, "Q8_0", tmp_path / f"{arch}.gguf")
    out = tmp_path / "q.json"
    result = run("eval-sparse", "--model", str(path), "--context", "200", "--budgets", "16", "--decode-tokens", "8",
                 "--passkey-trials", "0", "--dense-layers", "0", "--json", str(out))
    assert result.exit_code == 0 and not error_lines(result), result.output
    rows = {r["setting"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"dense", "budget=16"} and 0 < rows["budget=16"]["recall"] < 1, rows


@pytest.mark.parametrize("kwargs,message", [
    ({"quantized": "no"}, r"quantized = 'no' must be True or False"),
    ({"quantized": 1}, r"quantized = 1 must be True or False"),
    ({"rebuild": "yes"}, r"rebuild = 'yes' must be True or False"),
    ({"top_k": 0}, r"top_k = 0 must be a positive int"),
    ({"top_k": 2.5}, r"top_k = 2.5 must be a positive int"),
])
def test_load_switches_are_true_or_false(monkeypatch, kwargs, message):
    """Must hold: load(..., quantized="no") is an error naming the argument, before anything loads
    (before issue 40: a truthy "no" loaded the quantized model)."""
    import gatherlens.models.loading as loading
    from gatherlens.models import load

    monkeypatch.setattr(loading, "resolve", lambda *a: pytest.fail("it looked for the model"))
    with pytest.raises((GatherTypeError, GatherValueError), match=message):
        load("smollm2", **kwargs)


@pytest.mark.parametrize("case", ["not-gguf", "empty", "text", "threads-0", "threads-arabic"])
def test_bench_presets_refuses_bad_files_and_options_in_one_line(tmp_path, monkeypatch, case):
    """Must hold: `bench presets` on a file that is not a GGUF, an empty .gguf, a text file, or with
    --threads 0 / non-ASCII digits is one `Error:` line before any case runs (before issue 40: raw Python
    tracebacks, after a slow case had run)."""
    import gatherlens.bench.presets as presets

    monkeypatch.setattr(presets, "run_fresh", lambda *a, **k: pytest.fail("a case ran"))
    files = {"not-gguf": ("x.gguf", b"hello"), "empty": ("e.gguf", b""), "text": ("notes.txt", b"hi")}
    name, data = files.get(case, ("ok.gguf", None))
    path = tmp_path / name
    if data is None:
        path = smollm2_path()
    else:
        path.write_bytes(data)
    extra = {"threads-0": ["--threads", "0"], "threads-arabic": ["--threads", "٢"]}.get(case, [])
    result = run("bench", "presets", str(path), *extra, "--json", str(tmp_path / "p.json"))
    assert result.exit_code in (1, 2) and len(error_lines(result)) == 1, result.output
    said = {"not-gguf": "is not a GGUF file (it starts with b'hell', not b'GGUF'); give a .gguf model file",
            "empty": "is empty; give a .gguf model file",
            "text": "is neither a known name", "threads-0": "--threads = 0 is outside the valid range [1, ",
            "threads-arabic": "--threads = '٢' is not an integer"}[case]
    assert said in error_lines(result)[0], result.output
    assert not (tmp_path / "p.json").exists()


def test_a_failed_benchmark_case_is_one_line_never_a_traceback(tmp_path, monkeypatch):
    """Must hold: a case process that fails shows a gatherlens error's own words, or (anything else) one
    `internal error` line whose full output is kept in a file, never the raw traceback."""
    import tempfile

    from gatherlens.bench.fresh import failure

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = {"model": "m.gguf", "threads": 2, "methods": [1, 2]}
    said = failure(spec, 1, "Traceback (most recent call last):\n  ...\ngatherlens.errors.GatherValueError: bad k\n")
    assert said == "bad k (case model=m.gguf, threads=2)"
    said = failure(spec, 1, "Traceback (most recent call last):\n  File x\nKeyError: 'ms'\n")
    assert said.startswith("internal error in a benchmark case (model=m.gguf, threads=2): KeyError: 'ms'; its full "
                           "output is in ") and "\n" not in said
    (kept,) = tmp_path.glob("gatherlens-bench-case-*.txt")
    assert "KeyError: 'ms'" in kept.read_text() and "Traceback" not in said
