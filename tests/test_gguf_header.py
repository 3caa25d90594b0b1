"""The GGUF header read fast (models/gguf/reader.py) and a sentencepiece tokenizer built from it
(models/gguf/spm.py, models/gguf/tokenizer.py), each against its reference: gguf's own GGUFReader and
transformers' GGUF tokenizer converter."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatherlens.bench.model_vocab import GEMMA_SPECIALS, spm_vocab
from gatherlens.models.gguf.config import open_gguf
from gatherlens.models.gguf.reader import FastReader
from gatherlens.models.gguf.spm import spm_merges
from gatherlens.models.gguf.tokenizer import gguf_tokenizer

ODD = "The cat  sat\n\n\ton the mat.   Ünïcödé ✓ 😀 1234567 <bos> <start_of_turn>user x"


def _write(path, arch: str, fill) -> str:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    fill(writer)
    writer.add_tensor("unused", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _every_array(writer) -> None:
    from gguf import GGUFValueType as V

    writer.add_array("t.strings", ["a", "", "Ünï", "😀 x", " " * 3, "\u2581b"])
    writer.add_key_value("t.u8", [1, 2, 255], V.ARRAY, V.UINT8)
    writer.add_key_value("t.i32", [-1, 7, 2 ** 31 - 1], V.ARRAY, V.INT32)
    writer.add_key_value("t.f32", [0.5, -1e30, 3.25], V.ARRAY, V.FLOAT32)
    writer.add_key_value("t.bool", [True, False, True], V.ARRAY, V.BOOL)
    writer.add_key_value("t.u64", [2 ** 40, 0], V.ARRAY, V.UINT64)
    writer.add_uint32("t.scalar", 7)
    writer.add_string("t.text", "hello")


def test_fast_reader_reads_what_gguf_reader_reads(tmp_path):
    from gguf import GGUFReader

    path = _write(tmp_path / "arrays.gguf", "llama", _every_array)
    fast, plain = FastReader(path), GGUFReader(path)
    assert list(fast.fields) == list(plain.fields) and fast.data_offset == plain.data_offset
    for key, field in plain.fields.items():
        ours = fast.fields[key]
        assert ours.types == field.types and len(ours.data) == len(field.data), key
        assert ours.contents() == field.contents(), key
        if len(field.data) > 2 and field.types[0].name == "ARRAY":
            assert ours.contents(1) == field.contents(1) and ours.contents(slice(1, 3)) == field.contents(slice(1, 3))
    assert [t.name for t in fast.tensors] == [t.name for t in plain.tensors]
    assert str(fast.data.filename) == path  # the memmap again after parsing


def test_a_large_string_arrays_end_is_remembered_and_a_warm_open_walks_it_only_when_asked(tmp_path, monkeypatch):
    """The pass over a large string array's lengths is made once per version of the file: a warm open steps
    over it (the cache's memo of where it ends) and walks it on the first contents() call, reading what
    gguf's reader reads; a rewritten file is walked afresh; a memo that no longer holds is an error."""
    import os

    import gatherlens.models.gguf.reader as reader
    from gguf import GGUFReader

    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    words = [f"w{i}" * (i % 5) for i in range(reader.KEEP_FROM + 7)]
    path = _write(tmp_path / "vocab.gguf", "llama", lambda w: (w.add_array("t.words", words), _every_array(w)))
    walks = []
    real = reader._walk
    monkeypatch.setattr(reader, "_walk", lambda *a: walks.append(a[2]) or real(*a))
    FastReader(path)  # cold: every string array walked, the large one's end remembered
    assert sorted(walks) == [6, len(words)]
    walks.clear()
    warm = FastReader(path)
    assert walks == [6]  # the small array only: the large one stepped over
    assert warm.fields["t.text"].contents() == "hello" and walks == [6]
    assert warm.fields["t.words"].contents() == GGUFReader(path).fields["t.words"].contents() == words
    assert warm.fields["t.words"].contents(3) == words[3] and walks == [6, len(words)]  # walked once, when asked
    before = os.stat(path).st_mtime_ns
    longer = [w + "z" for w in words]
    _write(tmp_path / "vocab.gguf", "llama", lambda w: (w.add_array("t.words", longer), _every_array(w)))
    os.utime(path, ns=(before + 1_000_000, before + 1_000_000))
    assert FastReader(path).fields["t.words"].contents() == longer  # a new version: walked afresh
    from gatherlens.models.files.cache import file_memo, remember

    (key, end), = file_memo(path, reader.STRINGS_KEPT).items()
    remember(path, reader.STRINGS_KEPT, {key: end - 1})  # a memo that does not hold: parsed afresh
    assert FastReader(path).fields["t.words"].contents() == longer
    lazy = reader._Strings(memoryview(b"\x01" + b"\0" * 7 + b"a"), None, 0, 1, 8, True)  # one string, 9 bytes
    with pytest.raises(ValueError, match="no longer ends at byte 8"):  # a lazy walk ending elsewhere
        lazy.get(0)


def test_a_header_cut_inside_a_string_array_is_a_value_error(tmp_path):
    path = _write(tmp_path / "arrays.gguf", "llama", _every_array)
    data = open(path, "rb").read()
    start = data.index(b"t.strings") + len(b"t.strings") + 4 + 12  # inside the array's strings
    for cut in (start + 3, start + 20, data.index(b"t.u8") - 2):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ValueError):
            open_gguf(tmp_path / "cut.gguf")


# -- the merges a sentencepiece vocabulary implies --------------------------------------------------
_PIECES = st.text(alphabet="ab \u2581ü😀", max_size=5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_PIECES, st.sampled_from([0.0, -1.0, -2.5, 3.0])), max_size=40))
def test_spm_merges_equal_transformers_generate_merges(pairs):
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores = [t for t, _ in pairs], [s for _, s in pairs]
    reference = generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores)))
    assert spm_merges(tokens, scores) == reference


def test_spm_merges_of_a_large_vocabulary_equal_the_reference():
    from transformers.tokenization_utils_base import generate_merges

    tokens = spm_vocab(20_000, GEMMA_SPECIALS, base=False).tokens  # synthetic merges of byte-level pieces
    positions = {t: -i for i, t in enumerate(tokens)}
    reference = generate_merges({t: i for i, t in enumerate(tokens)}, positions)
    assert spm_merges(tokens, range(0, -len(tokens), -1)) == reference and len(reference) > 15_000


def test_spm_merges_kept_in_the_cache_equal_the_found_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path))
    tokens = spm_vocab(3_000, GEMMA_SPECIALS, base=False).tokens
    scores = range(0, -len(tokens), -1)
    found = spm_merges(tokens, scores)
    assert spm_merges(tokens, scores, cache=True) == found  # found, then kept
    kept = list((tmp_path / "spm-merges").glob("*.npy"))
    assert len(kept) == 1 and spm_merges(tokens, scores, cache=True) == found  # read back
    kept[0].write_bytes(b"damaged")
    assert spm_merges(tokens, scores, cache=True) == found  # a damaged file: found again, rewritten
    assert spm_merges(tokens[:-1], list(scores)[:-1], cache=True) == spm_merges(tokens[:-1], list(scores)[:-1])
    assert len(list((tmp_path / "spm-merges").glob("*.npy"))) == 2  # another vocabulary, another key


# -- the tokenizer of a sentencepiece file ---------------------------------------------------------
def _spm_file(path, arch: str, size: int = 3_000) -> str:
    specials = GEMMA_SPECIALS if arch.startswith("gemma") else ("<unk>", "<s>", "</s>", "<pad>", "<mask>",
                                                                 "<start_of_turn>")  # Llama 2's first three
    vocab = spm_vocab(size, specials, base=False, seed=1)
    tokens = list(vocab.tokens)
    tokens[-1] = "   "  # a token of spaces: Gemma's files spell them so
    return _write(path, arch, lambda w: vocab.__class__(**{**vocab.__dict__, "tokens": tokens}).write(w))


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_sentencepiece_tokenizer_equals_transformers(tmp_path, arch):
    from transformers import AutoTokenizer

    path = _spm_file(tmp_path / f"{arch}.gguf", arch)
    ours = gguf_tokenizer(open_gguf(path))
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file=f"{arch}.gguf", local_files_only=True)
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    ids = ours(ODD)["input_ids"]
    assert ids == ref(ODD)["input_ids"] and ids[0] == ours.bos_token_id  # BOS first, as llama.cpp adds it
    assert ours.decode(ids) == ref.decode(ids)
    assert ours.convert_ids_to_tokens(5) == "<start_of_turn>" and 5 in ours(ODD)["input_ids"]
