"""`gatherlens bench serve` on a tiny GGUF chat model: both measurements run against a real server process and
the rows land in the one JSON layout (the figures themselves are the lead's, on a quiet machine)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from chat_helpers import write_chat_model
from gatherlens.cli import main


@pytest.mark.slow
def test_bench_serve_writes_prefix_and_stream_rows(tmp_path, monkeypatch):
    monkeypatch.delenv("GATHERLENS_LLAMA_PYTHON", raising=False)
    model = write_chat_model(tmp_path / "chat.gguf")
    out = tmp_path / "serve.json"
    res = CliRunner().invoke(main, ["bench", "serve", "--model", str(model), "--rounds", "1", "--tokens", "4",
                                    "--chars", "100", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    cases = [r["case"] for r in data["rows"]]
    assert data["suite"] == "serve" and cases == ["prefix: turn 1 first token", "prefix: turn 2 first token",
                                                  "turn 1 / turn 2", "1 streams", "2 streams", "4 streams"]
    assert all(r["value"] > 0 and r["server"] == "gatherlens" for r in data["rows"])
    assert "llama.cpp row skipped" in res.stderr and "turn 1 / turn 2" in res.stdout


def test_bench_serve_refuses_a_model_that_is_not_a_gguf_before_starting_anything(tmp_path):
    from tiny_models import make_tiny_llama

    folder = make_tiny_llama(tmp_path / "tiny")
    res = CliRunner().invoke(main, ["bench", "serve", "--model", str(folder)])
    assert res.exit_code == 2 and "is not a GGUF model" in res.output
