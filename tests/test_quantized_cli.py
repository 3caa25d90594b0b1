"""`--quantized` on `gatherlens explain` and `generate`, and the report's embedding section when the
model runs from its GGUF blocks: drawn from a real record of the user's ids on the real table.

A tiny random Llama whose embedding module holds a QuantizedTable (its float table quantized by
gguf's own `quantize`) stands in for a quantized load here; the real SmolLM2 runs (slow) once
`gatherlens.load` takes `quantized=True`."""
import html
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from gatherlens.commands.explain import explain
from gatherlens.commands.generate import generate
from gatherlens.ops.embedding import embedding_lookup
from gatherlens.ops.quant import QuantizedTable
from gatherlens.report.build import build_report, story_data, write_report
from gatherlens.report.collect import collect
from gatherlens.report.records import explain_summary
from gatherlens.trace.quantized import record_quantized_embedding
from tiny_models import make_tiny_llama

TEXT = "The cat sat on the mat because the cat was"


class BlockEmbedding(torch.nn.Module):
    """An embedding module that looks its rows up in a QuantizedTable (`.table`), as a quantized load's."""

    def __init__(self, table: QuantizedTable):
        super().__init__()
        self.table = table

    def forward(self, ids):
        return embedding_lookup(ids, self.table)  # (B, S, d)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def blocks_lm(tiny_dir):
    """The tiny Llama with its word table swapped for Q8_0 blocks (gguf's own quantizer)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from gatherlens.models import load

    lm = load(str(tiny_dir))
    weight = lm.model.get_input_embeddings().weight.detach().numpy()        # (V, d)
    raw = np.ascontiguousarray(quantize(weight, GGMLQuantizationType.Q8_0))  # (V, row_bytes)
    table = QuantizedTable.from_blocks(raw, "Q8_0", "token_embd.weight")
    lm.model.set_input_embeddings(BlockEmbedding(table))
    lm.info["quantized"] = True
    return lm


@pytest.fixture(scope="module")
def story(blocks_lm):
    return collect(blocks_lm, TEXT, top_k=2)


# -- the option -------------------------------------------------------------------------------
@pytest.mark.parametrize("command, argv", [
    (explain, ["A cat.", "--model", "minilm", "--quantized"]),
    (generate, ["A cat.", "--model", "minilm", "--quantized"]),
], ids=["explain", "generate"])
def test_quantized_refuses_a_non_gguf_model_in_one_line(command, argv, tmp_path):
    res = CliRunner().invoke(command, argv + (["--out", str(tmp_path / "r")] if command is explain else []))
    if "is not installed" in res.output:
        pytest.skip(res.output.strip())
    assert res.exit_code == 2, res.output
    error = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "--quantized" in error[0] and "'minilm'" in error[0], res.output
    assert "not a .gguf file" in error[0]
    assert not (tmp_path / "r").exists()  # refused before anything is loaded or written


def test_quantized_refuses_a_folder_and_an_unknown_model(tiny_dir, tmp_path):
    res = CliRunner().invoke(explain, ["x", "--model", str(tiny_dir), "--quantized", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--quantized" in res.output and str(tiny_dir) in res.output
    res = CliRunner().invoke(generate, ["x", "--model", "no-such-model", "--quantized"])
    assert res.exit_code == 1 and "neither a known name" in res.output


def test_help_lists_quantized():
    for command in (explain, generate):
        res = CliRunner().invoke(command, ["--help"])
        assert res.exit_code == 0 and "--quantized" in res.output


# -- the report's embedding section, from the blocks -----------------------------------------
def test_word_lookup_is_recorded_from_the_real_table_with_the_users_ids(blocks_lm, story):
    table = blocks_lm.model.get_input_embeddings().table
    ids = blocks_lm.encode(TEXT)                                             # (1, S)
    word = story.embeddings[0]
    assert story.quantized and word.kind == "word" and word.quantized
    assert word.module == "model.embed_tokens" and word.ids == ids[0].tolist() == story.ids
    assert word.table_shape == tuple(table.shape)
    rec = word.record
    assert rec.table_name == "token_embd.weight" and rec.qtype == "Q8_0"
    assert torch.equal(rec.output, table.dequantize()[ids])                   # the plain reference
    assert rec.rows == list(dict.fromkeys(ids[0].tolist())) and len(rec.rows) < ids.numel()
    assert rec.bytes_read == len(rec.rows) * table.row_bytes
    again = record_quantized_embedding(ids, table, labels=story.shown_tokens)
    assert torch.equal(again.output, rec.output) and torch.equal(again.terms.codes, rec.terms.codes)


@pytest.mark.parametrize("lang, words", [
    ("en", ("runs from its GGUF blocks", "Q8_0", "34 B a row instead of float32's 128 B")),
    ("zh", ("直接从 GGUF 块运行", "Q8_0", "每行 34 B，而 float32 每行 128 B")),
])
def test_embedding_section_draws_the_quantized_row_gather(story, lang, words):
    report = build_report(story, lang=lang)
    fig = next(f for f in report.figures if f.name == "01-embedding")
    assert fig.svg == story.embeddings[0].record.to_svg(lang=lang)             # the record's own picture
    ET.fromstring(fig.svg)
    distinct = len(story.embeddings[0].record.rows)
    page = html.unescape(report.html)
    for part in words + (f"read {distinct} rows" if lang == "en" else f"读了 {distinct} 行",):
        assert part in page, part
    data = report.data["embeddings"][0]
    assert report.data["quantized"] is True
    assert data["qtype"] == "Q8_0" and data["rows_read"] == distinct
    assert data["bytes_read"] == distinct * 34


def test_quantized_report_writes_and_summarises(story, tmp_path):
    paths = write_report(story, tmp_path / "r", lang="zh")
    assert {p.name for p in paths} >= {"index.html", "story.json", "01-embedding.svg"}
    assert json.loads((tmp_path / "r" / "story.json").read_text(encoding="utf-8"))["quantized"] is True
    summary = explain_summary(story)
    assert summary.table == "token_embd.weight"
    (line,) = summary.lookups                                                   # the lookup, in blocks
    assert line.row_bytes == story.embeddings[0].record.row_bytes and line.ids == tuple(story.embeddings[0].ids)
    first = story.embeddings[0].record.output[0, 0, :4].tolist()
    assert list(summary.tokens[0].values) == first


def test_float_story_is_unchanged(tiny_dir):
    from gatherlens.models import load

    story = collect(load(str(tiny_dir)), TEXT, top_k=2)
    assert not story.quantized and not story.embeddings[0].quantized
    assert "qtype" not in story_data(story)["embeddings"][0] and story_data(story)["quantized"] is False


# -- the real model ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_real_explain_quantized_writes_the_quantized_figure(tmp_path, lang):
    out = tmp_path / "report"
    res = CliRunner().invoke(explain, ["The cat sat on the mat", "--quantized", "--lang", lang, "--out", str(out)])
    if res.exit_code != 0 and "is not installed" in res.output:
        pytest.skip(res.output.strip())
    assert res.exit_code == 0, res.output
    data = json.loads((out / "story.json").read_text(encoding="utf-8"))
    word = data["embeddings"][0]
    assert data["quantized"] is True and word["kind"] == "word" and word["qtype"] == "Q8_0"
    assert word["ids"] == data["ids"] and word["bytes_read"] == word["rows_read"] * 612
    svg = (out / "01-embedding.svg").read_text(encoding="utf-8")
    ET.fromstring(svg)
    assert "Q8_0" in svg and "token_embd.weight" in svg
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "--quantized" in html and "612 B" in html


@pytest.mark.slow
def test_real_generate_quantized_runs():
    res = CliRunner().invoke(generate, ["It is a truth universally acknowledged", "--quantized",
                                        "--max-new-tokens", "4"])
    if res.exit_code != 0 and "is not installed" in res.output:
        pytest.skip(res.output.strip())
    assert res.exit_code == 0, res.output
    assert "generated 4 tokens" in res.output
