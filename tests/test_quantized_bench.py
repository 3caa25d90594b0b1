"""`gatherlens bench quantized-embedding`: one tiny run end to end, and the JSON it promises."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from gatherlens.commands.bench import bench

OPS = {"blocks", "dequantize-all", "gguf rows", "F.embedding f32"}


def test_tiny_run_writes_rows(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    table = np.random.default_rng(0).standard_normal((33, 576)).astype(np.float32)
    writer.add_tensor("token_embd.weight", quantize(table, GGMLQuantizationType.Q8_0),
                      raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    out = tmp_path / "q.json"
    args = ["quantized-embedding", "--gguf", str(path), "--tokens", "1,4", "--threads", "1", "--repeats", "1",
            "--json", str(out)]
    res = CliRunner().invoke(bench, args)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["suite"] == "quantized-embedding" and data["meta"]["row_bytes"] == 612
    rows = data["rows"]
    assert {r["op"] for r in rows} == OPS and {r["tokens"] for r in rows} == {1, 4}
    for r in rows:
        assert r["median_s"] > 0 and r["ratio_f32"] > 0 and r["qtype"] == "Q8_0"
    one = {r["op"]: r["bytes_read"] for r in rows if r["tokens"] == 1}
    assert one == {"blocks": 612, "dequantize-all": 33 * 612, "gguf rows": 612, "F.embedding f32": 2304}
    assert "blocks" in res.output
    res = CliRunner().invoke(bench, args)  # an existing --json is never overwritten without --force
    assert res.exit_code != 0 and "--force" in res.output


def test_bad_tokens_are_refused(tmp_path):
    res = CliRunner().invoke(bench, ["quantized-embedding", "--tokens", "0,x", "--json", str(tmp_path / "q.json")])
    assert res.exit_code != 0 and "--tokens = '0,x' must be comma-separated positive integers" in res.output
