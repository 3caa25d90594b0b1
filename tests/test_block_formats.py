"""Every GGUF block format of the one table (registry.FORMATS), bit for bit: the plain reference (naive.py),
the vectorised dequantizer (dequantize.py), the terms the picture draws (terms.py) and the row gather all equal
`gguf.quants.dequantize` on random blocks (any bytes, fp16 scales and plain values made finite).

Property tests draw the rows, the blocks per row and the bytes themselves (hypothesis shrinks a failure to
the fewest, smallest bytes); case ids are the formats' ggml names. test_quantized_table.py holds the table
tests that go through a GGUF file for every format; here are the per-format ones, and the new formats'
edges (codebooks, the Q3_K scale shuffle, plain floats, a file's non-finite values).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize
from hypothesis import given
from hypothesis import strategies as st

from gatherlens import GatherValueError, QuantizedTable, embedding_lookup
from gatherlens.ops.quant import FORMATS, QTYPES, block_terms, dequantize_rows, naive_dequantize_rows
from gatherlens.ops.quant.formats.layout import IQ4_BOOK
from gatherlens.ops.quant.formats.terms import groups
from test_quantized_table import FINITE, random_blocks, same

PLAIN = tuple(q for q in QTYPES if FORMATS[q].fields[0].kind == "value")  # F32, F16, BF16
BOOKED = tuple(q for q in QTYPES if FORMATS[q].codebook)  # IQ4_NL, IQ4_XS


def finite(raw: np.ndarray, qtype: str) -> np.ndarray:
    """(rows, nb, block bytes) uint8, every fp16 field and plain value made finite (the exponent's top bit
    cleared where the exponent is all ones), in place; returned as (rows, row bytes)."""
    for at, size, exponent in FINITE[qtype]:
        kind = np.dtype(f"<u{size}")
        bits = np.ascontiguousarray(raw[:, :, at:at + size]).view(kind)[..., 0]  # (rows, nb)
        top = kind.type(exponent & ~(exponent >> 1))
        bits = np.where((bits & kind.type(exponent)) == kind.type(exponent), bits & ~top, bits)
        raw[:, :, at:at + size] = bits.astype(kind)[..., None].view(np.uint8)
    return raw.reshape(raw.shape[0], -1)


@st.composite
def blocks(draw, qtype: str, max_rows: int = 4, max_blocks: int = 3) -> np.ndarray:
    """(rows, row bytes) uint8 of drawn bytes: 1..max_rows rows of 1..max_blocks blocks (plain floats: weights)."""
    fmt = FORMATS[qtype]
    rows = draw(st.integers(1, max_rows), label="rows")
    nb = draw(st.integers(1, max_blocks if fmt.weights > 1 else 40), label="blocks per row")
    data = draw(st.binary(min_size=rows * nb * fmt.block_bytes, max_size=rows * nb * fmt.block_bytes), label="bytes")
    raw = np.frombuffer(data, np.uint8).reshape(rows, nb, fmt.block_bytes).copy()
    return finite(raw, qtype)


def gguf_rows(raw: np.ndarray, qtype: str) -> torch.Tensor:
    """gguf's own dequantize of the rows, as float32 (R, d)."""
    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType[qtype]), np.float32))


@pytest.mark.parametrize("qtype", QTYPES)
@given(data=st.data())
def test_naive_vectorised_and_gguf_are_bit_equal(qtype, data):
    raw = data.draw(blocks(qtype))
    expected = gguf_rows(raw, qtype)  # (R, d)
    assert same(dequantize_rows(torch.from_numpy(raw), qtype), expected)
    assert same(naive_dequantize_rows(torch.from_numpy(raw), qtype), expected)


@pytest.mark.parametrize("qtype", QTYPES)
@given(data=st.data())
def test_row_gather_is_bit_equal_to_gguf(qtype, data):
    raw = data.draw(blocks(qtype, max_rows=6))
    table = QuantizedTable.from_blocks(raw, qtype)
    shape = data.draw(st.lists(st.integers(1, 3), max_size=2), label="ids shape")
    n = int(np.prod(shape))
    ids = torch.tensor(data.draw(st.lists(st.integers(0, raw.shape[0] - 1), min_size=n, max_size=n)),
                       dtype=torch.long).view(shape)  # (*S,)
    rows = embedding_lookup(ids, table)  # (*S, d)
    expected = gguf_rows(raw[ids.reshape(-1).numpy()], qtype).view(*shape, table.shape[1])  # (*S, d)
    assert same(rows, expected) and same(embedding_lookup(ids, table, method="naive"), expected)


@pytest.mark.parametrize("qtype", QTYPES)
@given(data=st.data())
def test_terms_reproduce_dequantize(qtype, data):
    """Every scale group's terms make the group's weights, from the bytes of the block holding them."""
    fmt = FORMATS[qtype]
    raw = torch.from_numpy(data.draw(blocks(qtype, max_rows=2)))
    values = dequantize_rows(raw, qtype)  # (R, d)
    row = data.draw(st.integers(0, raw.shape[0] - 1), label="row")
    block = data.draw(st.integers(0, groups(qtype, raw.shape[1]) - 1), label="group")
    terms = block_terms(raw[row], qtype, block)
    assert (terms.start, len(terms.codes), terms.offset) == (block * fmt.group, fmt.group, fmt.code_offset)
    assert same(terms.values(), values[row, terms.start:terms.start + fmt.group])
    first = terms.start // fmt.weights * fmt.block_bytes
    assert torch.equal(terms.raw, raw[row, first:first + fmt.block_bytes])
    if fmt.codebook:  # IQ4: each code names its codebook value
        assert terms.levels.tolist() == [float(fmt.codebook[q]) for q in terms.codes.tolist()]
    elif qtype in PLAIN:  # the code is the stored value's bits; no scale
        assert terms.codes.tolist() == [int.from_bytes(bytes(terms.raw.tolist()), "little")] and terms.scale == 1.0
    else:
        assert terms.levels is None and -2 ** (fmt.bits - 1) <= int(terms.codes.min())  # Q8_0's codes are int8
        assert int(terms.codes.max()) < 2 ** fmt.bits


@pytest.mark.parametrize("qtype", QTYPES)
def test_unpack_is_the_codes_in_element_order(qtype):
    """`unpack`'s first output is one code (a plain float: its value) per weight, in the codes' range."""
    fmt = FORMATS[qtype]
    raw = torch.from_numpy(random_blocks(np.random.default_rng(3), qtype, 3, 2 * max(fmt.weights, 32)))
    codes = fmt.unpack(raw)[0]  # (3, d)
    assert codes.shape == (3, raw.shape[1] // fmt.block_bytes * fmt.weights)
    if qtype in PLAIN:
        assert same(codes.float(), dequantize_rows(raw, qtype))
    elif codes.dtype == torch.uint8:  # codes as stored (Q8_0, Q6_K: int8, their offset applied)
        assert (int(codes.min()), int(codes.max())) == (0, 2 ** fmt.bits - 1)


# -- the new formats' edges ---------------------------------------------------------------------------
def _one(qtype: str, fill: int = 0) -> np.ndarray:
    return np.full((1, FORMATS[qtype].block_bytes), fill, np.uint8)


def _set_half(raw: np.ndarray, qtype: str, name: str, value: float) -> np.ndarray:
    field = FORMATS[qtype].field(name)
    raw[0, field.offset:field.end] = np.array([value], "<f2").view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", BOOKED)
def test_iq4_codes_index_the_codebook(qtype):
    """Codes 0..15 in order (byte j: code j low, 15 - j high) with d = 1 and every scale 1 (ls = 33)."""
    raw = _set_half(_one(qtype), qtype, "d", 1.0)
    qs = FORMATS[qtype].field("qs")
    raw[0, qs.offset:qs.end] = np.tile([j | ((15 - j) << 4) for j in range(16)], qs.size // 16)
    if qtype == "IQ4_XS":  # ls = 33 = 0b10_0001: low nibble 1 (scales_l), top bits 2 (scales_h)
        raw[0, FORMATS[qtype].field("scales_l").offset:FORMATS[qtype].field("scales_l").end] = 0x11
        raw[0, FORMATS[qtype].field("scales_h").offset:FORMATS[qtype].field("scales_h").end] = 0xAA
    values = dequantize_rows(torch.from_numpy(raw), qtype)[0]  # (weights,)
    expected = [float(b) for b in IQ4_BOOK] + [float(b) for b in reversed(IQ4_BOOK)]
    assert values.tolist() == expected * (FORMATS[qtype].weights // 32)
    assert same(values.view(1, -1), gguf_rows(raw, qtype))


def test_q3_k_scales_are_ggmls_shuffle():
    """Each of the 16 scales alone set to 33 (d = 1, every code 4 + 1 = 5): only its 16 weights are 1."""
    fmt = FORMATS["Q3_K"]
    at = fmt.field("scales").offset
    for s in range(16):
        raw = _set_half(_one("Q3_K"), "Q3_K", "d", 1.0)
        raw[0, fmt.field("hmask").offset:fmt.field("hmask").end] = 0xFF  # bit 2 of every code set
        raw[0, fmt.field("qs").offset:fmt.field("qs").end] = 0x55  # low bits 1 everywhere: q = 5
        packed = [0x00] * 8 + [0xAA] * 4  # every scale 32 (top bits 2, low nibble 0): sc - 32 = 0
        packed[s % 8] |= 1 << (4 * (s // 8))  # scale s: low nibble 1 -> 33
        raw[0, at:at + 12] = packed
        values = dequantize_rows(torch.from_numpy(raw), "Q3_K")[0]  # (256,)
        assert values.nonzero().view(-1).tolist() == list(range(16 * s, 16 * s + 16)), s
        assert same(values.view(1, -1), gguf_rows(raw, "Q3_K"))


@pytest.mark.parametrize("qtype", PLAIN)
def test_plain_floats_keep_every_bit(qtype):
    """-0.0, subnormals, the largest finite values and inf: each widened exactly (gguf's dequantize too)."""
    dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[qtype]
    info = torch.finfo(dtype)
    values = torch.tensor([-0.0, 0.0, info.tiny / 4, -info.tiny, info.max, -info.max, float("inf"), 1.0 / 3],
                          dtype=dtype).view(1, -1)  # (1, 8)
    raw = values.view(torch.uint8).reshape(1, -1)  # (1, 8 * bytes)
    assert same(dequantize_rows(raw, qtype), values.float())
    assert same(naive_dequantize_rows(raw, qtype), values.float())
    assert same(dequantize_rows(raw, qtype), gguf_rows(raw.numpy(), qtype))


def test_f32_dequantize_is_a_copy():
    raw = torch.tensor([[1.0, 2.0]]).view(torch.uint8)  # (1, 8)
    out = dequantize_rows(raw, "F32")
    out += 1
    assert raw.view(torch.float32).tolist() == [[1.0, 2.0]]


def test_plain_floats_read_misaligned_bytes():
    """A table sliced by one byte: the values are copied to an aligned place, not misread."""
    raw = torch.cat([torch.zeros(2, 1, dtype=torch.uint8), torch.tensor([[1.5, -2.0]] * 2).view(torch.uint8)], 1)
    assert dequantize_rows(raw[:, 1:], "F32").tolist() == [[1.5, -2.0]] * 2


# -- through a GGUF file: mapped in place, and checked finite ----------------------------------------
@pytest.fixture(scope="module")
def new_formats_file(tmp_path_factory):
    """One 5 x 512 table per format, written by gguf's writer."""
    path = tmp_path_factory.mktemp("formats") / "formats.gguf"
    writer = GGUFWriter(path, "llama")
    tables = {}
    for k, qtype in enumerate(QTYPES):
        tables[qtype] = random_blocks(np.random.default_rng(k), qtype, 5, 512)
        writer.add_tensor(qtype, tables[qtype], raw_dtype=GGMLQuantizationType[qtype])
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path, tables


@pytest.mark.parametrize("qtype", QTYPES)
def test_from_gguf_reads_every_format_in_place(new_formats_file, qtype):
    path, tables = new_formats_file
    table = QuantizedTable.from_gguf(path, qtype)
    assert (table.qtype, tuple(table.shape)) == (qtype, (5, 512))
    assert torch.equal(table.raw, torch.from_numpy(tables[qtype]))
    reader = {t.name: t for t in GGUFReader(path).tensors}[qtype]
    assert same(table.dequantize(), torch.from_numpy(np.array(dequantize(reader.data, reader.tensor_type))))
    ids = torch.tensor([[4, 0], [4, 2]])
    assert same(embedding_lookup(ids, table), table.dequantize()[ids])


NONFINITE = {  # a format, the field spoiled, its bytes: an fp16 scale inf / NaN, or a plain value
    "BF16": ("v", b"\xc0\x7f"), "F16": ("v", b"\x00\x7c"), "F32": ("v", b"\x00\x00\xc0\x7f"),
    "IQ4_XS": ("d", b"\x00\x7e"), "IQ4_NL": ("d", b"\x00\xfc"), "Q2_K": ("dmin", b"\x00\x7c"),
    "Q3_K": ("d", b"\x01\x7c"), "Q5_K": ("dmin", b"\x00\x7e"),
}


@pytest.mark.parametrize("qtype", list(NONFINITE))
def test_the_file_check_finds_a_non_finite_scale_or_value(tmp_path, qtype):
    from gatherlens.models.gguf.check import _check_values, tensor_infos

    field, spoil = NONFINITE[qtype]
    fmt = FORMATS[qtype]
    raw = random_blocks(np.random.default_rng(9), qtype, 3, 512)
    for name, blocks_ in (("sound", raw), ("spoiled", raw.copy())):
        if name == "spoiled":  # row 2, block 1
            at = fmt.block_bytes + fmt.field(field).offset
            blocks_[2, at:at + len(spoil)] = np.frombuffer(spoil, np.uint8)
        path = tmp_path / f"{name}.gguf"
        writer = GGUFWriter(path, "llama")
        writer.add_tensor("t", blocks_, raw_dtype=GGMLQuantizationType[qtype])
        writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
        reader = GGUFReader(path)
        if name == "sound":
            _check_values(reader, tensor_infos(reader), path)
        else:
            with pytest.raises(GatherValueError, match=r"is damaged: t .*(nan|inf)"):
                _check_values(reader, tensor_infos(reader), path)
