"""The benchmarks page is a view of the JSON files the bench commands write."""
from __future__ import annotations

import json

from click.testing import CliRunner

from gatherlens.bench.output import write_results
from gatherlens.cli import main


def test_page_shows_every_row_and_meta(tmp_path):
    f = tmp_path / "decode.json"
    write_results(f, "decode", {"threads": 2, "dense": "sdpa_folded"},
                  [{"context": 32768, "method": "sparse", "speedup": 4.9012},
                   {"context": 131072, "method": "sparse", "speedup": 13.03}])
    assert json.loads(f.read_text())["suite"] == "decode"
    out = tmp_path / "benchmarks.md"
    r = CliRunner().invoke(main, ["bench", "page", str(f), "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "## decode" in text and "- dense: sdpa_folded" in text
    assert "| context | method | speedup |" in text
    assert "| 32768 | sparse | 4.901 |" in text and "| 131072 | sparse | 13.03 |" in text
    again = CliRunner().invoke(main, ["bench", "page", str(f), "-o", str(out)])
    assert again.exit_code != 0 and "--force" in again.output


def test_page_refuses_a_file_that_is_not_results(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"a": 1}')
    r = CliRunner().invoke(main, ["bench", "page", str(f)])
    assert r.exit_code != 0 and "not a benchmark result" in r.output


def test_json_path_checked_before_timing(tmp_path):
    (tmp_path / "exists.json").write_text("{}")
    r = CliRunner().invoke(main, ["bench", "decode", "--json", str(tmp_path / "exists.json")])
    assert r.exit_code != 0 and "--force" in r.output
    r = CliRunner().invoke(main, ["bench", "decode", "--json", str(tmp_path / "no" / "d.json")])
    assert r.exit_code != 0 and "does not exist" in r.output


def test_profiles_become_tables_and_sections_name_their_file(tmp_path):
    f = tmp_path / "generate-ablation.json"
    ops = [{"op": "aten::mm", "ms": 49.4, "calls": 211.0, "share": 0.66}]
    write_results(f, "generate", {"threads": 2, "profiles": {"8192": {"sparse-512": ops}}},
                  [{"context": 8192, "method": "sparse-512", "ms": 105.1}])
    out = tmp_path / "benchmarks.md"
    r = CliRunner().invoke(main, ["bench", "page", str(f), "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "## generate (generate-ablation.json)" in text and "profiles:" not in text
    assert "One decode step at 8192 tokens, sparse-512" in text and "| aten::mm | 49.4 | 211 | 0.66 |" in text
