"""`gatherlens bench decode`: runs a tiny case end to end and writes the JSON it promises."""
from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from gatherlens.bench.decode import bytes_read, command, parse_context


@pytest.mark.slow  # a bench case: a fresh process per case
def test_bench_decode_tiny_case_writes_json(tmp_path):
    out = tmp_path / "decode.json"
    res = CliRunner().invoke(command, ["--context", "1K", "--budget", "64",
                                       "--dtype", "float32", "--repeats", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert {r["context"] for r in rows} == {1024}
    methods = {r["method"] for r in rows}
    assert {"sdpa", "sdpa_folded", "sparse", "select"} <= methods
    for r in rows:
        assert r["ms"] > 0 and r["mib_read"] > 0 and r["bound"] > 0
    sparse = next(r for r in rows if r["method"] == "sparse" and r["context"] == 1024)
    assert sparse["bound"] == pytest.approx(1 / (1 / 16 + 64 / 1024))
    assert "sparse" in res.output and data["meta"]["budget"] == 64
    # an existing file is never overwritten without --force
    res = CliRunner().invoke(command, ["--context", "512", "--json", str(out)])
    assert res.exit_code != 0 and "--force" in res.output


@pytest.mark.parametrize("args,text", [
    (["--context", "abc"], "positive integer"),
    (["--context", "0"], "positive integer"),
    (["--budget", "0"], "--budget = 0 is outside the valid range [1, inf)"),
    (["--page-size", "-1"], "--page-size = -1 is outside the valid range [1, inf)"),
    (["--repeats", "0"], "--repeats = 0 is outside the valid range [1, inf)"),
    (["--dtype", "int8"], "int8"),
], ids=["context-abc", "context-0", "budget-0", "page-size", "repeats", "dtype"])
def test_bench_decode_rejects_bad_options(tmp_path, args, text):
    res = CliRunner().invoke(command, args + ["--json", str(tmp_path / "x.json")])
    assert res.exit_code != 0 and text in res.output
    assert not (tmp_path / "x.json").exists()


def test_parse_context_and_bytes():
    assert parse_context("32K") == 32768 and parse_context("128k") == 131072 and parse_context("4096") == 4096
    with pytest.raises(click.BadParameter):
        parse_context("-3")
    dense = bytes_read("sdpa", 32768, "float32", 2048, 16, 2048, 2048)
    sparse = bytes_read("sparse", 32768, "float32", 2048, 16, 2048, 2048)
    assert dense / sparse == pytest.approx(8.0)  # 1 / (1/16 + 2048/32768)
