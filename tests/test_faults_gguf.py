"""A GGUF is checked before it runs (models/gguf/check.py): wrong shapes, lying metadata, non-finite
block scales, unsupported types, truncation; a damaged block converted by numpy."""
from __future__ import annotations

import shutil
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import fault_worker  # noqa: E402
from fault_helpers import error_lines, run, smollm2_path  # noqa: E402
from fault_helpers import gguf, root  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import loading  # noqa: E402


# -- a GGUF is checked before it runs (issue 29: models/gguf/check.py) -----------------------------
def _gguf_tensor(reader, name: str):
    return next(t for t in reader.tensors if t.name == name)


def _gguf_scale(name: str, row: int, at: int, value: float):
    """Set the fp16 at byte `at` of row `row` of tensor `name` (a block's d or m) to `value`."""
    import numpy as np

    def patch(reader):
        _gguf_tensor(reader, name).data[row, at:at + 2] = np.array([value], np.float16).view(np.uint8)
    return patch


def _gguf_dims(name: str, axis: int, value: int):
    """ggml's dims of tensor `name`: axis 0 is the width, axis 1 the rows."""
    return lambda reader: _gguf_tensor(reader, name).field.parts[3].__setitem__(axis, value)


def _gguf_type(name: str, number: int):
    return lambda reader: _gguf_tensor(reader, name).field.parts[4].__setitem__(0, number)


def _gguf_meta(key: str, value: int):
    def patch(reader):
        field = reader.fields[key]
        field.parts[field.data[0]][0] = value
    return patch


def _patched_gguf(source: Path, path: Path, patch) -> Path:
    """A copy of `source` patched in place through gguf's reader in "r+" mode, as the user did."""
    from gatherlens.models.gguf.config import open_gguf   # gguf.GGUFReader, its header parsed faster

    shutil.copyfile(source, path)
    reader = open_gguf(path, mode="r+")
    patch(reader)
    reader.data.flush()
    del reader
    return path


def _tiny_llama_gguf(path: Path, kinds: dict | None = None, extra: dict | None = None) -> Path:
    """A 2-block Llama GGUF like SmolLM2's (64 wide, 4 heads of 16 over 2 KV heads, 256 feed-forward, 96
    tokens; Q8_0 embedding, Q4_1 matrices, F32 norms) of zero blocks; `kinds`: tensor -> another ggml type
    (any gguf knows: IQ4_XS, Q2_K, F16, ...); `extra`: more tensors (name -> shape, F32 if 1-D; or name ->
    (shape, fill): F32 of that value)."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 2, "context_length": 128, "embedding_length": 64, "feed_forward_length": 256,
                       "attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 16}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_uint32("llama.vocab_size", 96)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_eos_token_id(95)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(96)])
    shapes = {"token_embd": (96, 64), "output_norm": (64,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm": (64,), f"blk.{i}.ffn_norm": (64,), f"blk.{i}.attn_q": (64, 64),
                       f"blk.{i}.attn_k": (32, 64), f"blk.{i}.attn_v": (32, 64), f"blk.{i}.attn_output": (64, 64),
                       f"blk.{i}.ffn_gate": (256, 64), f"blk.{i}.ffn_up": (256, 64), f"blk.{i}.ffn_down": (64, 256)})
    fills = {name: v[1] for name, v in (extra or {}).items() if isinstance(v[0], tuple)}
    shapes.update({name: v[0] if isinstance(v[0], tuple) else v for name, v in (extra or {}).items()})
    for name, shape in shapes.items():
        if name in fills:
            writer.add_tensor(f"{name}.weight", np.full(shape, fills[name], np.float32))
            continue
        kind = (kinds or {}).get(name, T.F32 if len(shape) == 1 else T.Q8_0 if name == "token_embd" else T.Q4_1)
        if kind in (T.F32, T.F16):
            writer.add_tensor(f"{name}.weight", np.ones(shape, np.float32 if kind == T.F32 else np.float16))
            continue
        weights, nbytes = gguf.GGML_QUANT_SIZES[kind]
        raw = np.zeros((shape[0], shape[1] // weights * nbytes), np.uint8)  # (rows, row bytes): zero blocks
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory) -> Path:
    return _tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# case -> (the patch, what the one error line says), on the tiny Llama GGUF (every case B and C of
# issue 29, with the tiny model's sizes: SmolLM2's, in the CLI test below, read the same)
TINY_FAULTS = {
    "B: attn_q with too few rows": (
        _gguf_dims("blk.1.attn_q.weight", 1, 48),
        r"does not match its own metadata: blk.1.attn_q.weight is 48 rows of 64 weights; head_count 4 x head_dim 16 "
        r"and embedding_length 64 expect 64 rows of 64 weights$"),
    "B: attn_q too narrow": (
        _gguf_dims("blk.1.attn_q.weight", 0, 32),
        r"blk.1.attn_q.weight is 64 rows of 32 weights; .* expect 64 rows of 64 weights$"),
    "B: ffn_down one row short": (
        _gguf_dims("blk.0.ffn_down.weight", 1, 63),
        r"blk.0.ffn_down.weight is 63 rows of 256 weights; embedding_length 64 and feed_forward_length 256 expect "
        r"64 rows of 256 weights$"),
    "B: ffn_down rows not whole blocks (gguf's reader fails)": (
        _gguf_dims("blk.0.ffn_down.weight", 0, 255),
        r"blk.0.ffn_down.weight is 64 rows of 255 weights; .* expect 64 rows of 256 weights$"),
    "B: a norm too narrow": (
        _gguf_dims("blk.1.attn_norm.weight", 0, 50),
        r"blk.1.attn_norm.weight is 50 weights; embedding_length 64 expects 64 weights$"),
    "B: embedding_length": (
        _gguf_meta("llama.embedding_length", 32),
        r"token_embd.weight is 96 rows of 64 weights; vocabulary 96 \(tokenizer.ggml.tokens\) and embedding_length 32 "
        r"expect 96 rows of 32 weights \(19 more tensors disagree with it\)$"),
    "C: head_count": (
        _gguf_meta("llama.attention.head_count", 8),
        r"blk.0.attn_q.weight is 64 rows of 64 weights; head_count 8 x head_dim 16 and embedding_length 64 expect "
        r"128 rows of 64 weights \(3 more"),
    "C: head_count_kv": (
        _gguf_meta("llama.attention.head_count_kv", 4),
        r"blk.0.attn_k.weight is 32 rows of 64 weights; head_count_kv 4 x head_dim 16 and embedding_length 64 "
        r"expect 64 rows of 64 weights"),
    "C: head_count_kv that does not divide head_count": (
        _gguf_meta("llama.attention.head_count_kv", 3),
        r"blk.0.attn_k.weight is 32 rows of 64 weights; head_count_kv 3 x head_dim 16"),
    "C: Q4_1 blocks declared Q8_0": (
        _gguf_type("blk.0.attn_q.weight", 8),
        r"blk.0.attn_q.weight as Q8_0 \(64 rows of 64 weights\) is 4,352 bytes, but the next tensor, "
        r"blk.0.attn_k.weight, starts 2,560 bytes after it: its type or shape does not describe its data$"),
    "C: Q8_0 blocks declared Q4_1": (
        _gguf_type("token_embd.weight", 3),
        r"token_embd.weight as Q4_1 \(96 rows of 64 weights\) is 3,840 bytes, but the next tensor, output_norm.weight, "
        r"starts 6,528 bytes after it"),
    "C: block_count one short (its last block unused)": (
        _gguf_meta("llama.block_count", 1),
        r"it holds blk.1.attn_norm.weight and 8 more that nothing reads \(a llama model of block_count 1 reads "
        r"blk.0 to blk.0, token_embd, output_norm and output\)$"),
    "C: block_count one over": (
        _gguf_meta("llama.block_count", 3),
        r"it lacks blk.2.attn_norm.weight and 8 more, which block_count 3 and the llama architecture need$"),
    "C: context_length 0": (
        _gguf_meta("llama.context_length", 0),
        r"has bad metadata: llama.context_length is 0; it must be a positive whole number$"),
    "C: vocab_size against the token list": (
        _gguf_meta("llama.vocab_size", 100),
        r"has bad metadata: llama.vocab_size 100 but tokenizer.ggml.tokens holds 96 tokens$"),
    "D: rope.freq_base NaN": (
        _gguf_meta("llama.rope.freq_base", float("nan")),
        r"has bad metadata: llama.rope.freq_base is nan; it must be a finite number above 0 \(RoPE's base frequency\)"),
    "D: rope.freq_base 0": (
        _gguf_meta("llama.rope.freq_base", 0.0), r"llama.rope.freq_base is 0.0; it must be a finite number above 0"),
    "D: layer_norm_rms_epsilon -1": (
        _gguf_meta("llama.attention.layer_norm_rms_epsilon", -1.0),
        r"llama.attention.layer_norm_rms_epsilon is -1.0; it must be a number in \(0, 1\) \(the epsilon RMSNorm"),
    "D: layer_norm_rms_epsilon inf": (
        _gguf_meta("llama.attention.layer_norm_rms_epsilon", float("inf")),
        r"llama.attention.layer_norm_rms_epsilon is inf; it must be a number in \(0, 1\)"),
    "D: an end-of-sequence id past the vocabulary": (
        _gguf_meta("tokenizer.ggml.eos_token_id", 96),
        r"has bad metadata: tokenizer.ggml.eos_token_id is 96; it must be a whole number in \[0, 96\) \(a token id\)"),
    "a type number ggml does not have (gguf's reader fails)": (
        _gguf_type("blk.0.attn_v.weight", 99),
        r"holds tensors quantized=True cannot run: type 99 \(blk.0.attn_v.weight: 32 rows of 64 weights\); it runs "
        r"matrices in Q8_0, .*F16; use another preset of the model \(a file in those types\)$"),
}


@pytest.mark.parametrize("case", list(TINY_FAULTS))
def test_a_gguf_of_wrong_shapes_or_lying_metadata_is_one_error_naming_what_disagrees(tiny_llama_gguf, tmp_path,
                                                                                    case):
    """Must hold (issue 29, cases B and C): a tensor of the wrong shape, metadata that lies or a type
    that does not describe its data is one GatherValueError naming the file, the tensor or key, what
    the metadata expects and what was found: from the header alone, before anything is loaded."""
    import re

    from gatherlens.models.gguf.check import open_checked

    patch, said = TINY_FAULTS[case]
    path = _patched_gguf(tiny_llama_gguf, tmp_path / "damaged.gguf", patch)
    with pytest.raises(GatherValueError) as caught:
        open_checked(path, quantized=True)
    message = str(caught.value)
    assert message.startswith(f"model file {str(path)!r} ") and "\n" not in message and "np." not in message
    assert re.search(said, message), message


# case -> (the patch of the shipped SmolLM2 Q4_1 GGUF, what the one error line says); block 3 of a
# Q4_1 row starts at byte 3 * 20 (layout.py: d at 0, m at 2)
SMOLLM2_FAULTS = {
    "A: NaN scale in the embedding row of 'The'": (
        _gguf_scale("token_embd.weight", 504, 0, float("nan")),
        r"is damaged: token_embd.weight row 504, block 0: its fp16 scale d is nan; every block scale must be finite"),
    "A: NaN scale in an attn_q block": (
        _gguf_scale("blk.10.attn_q.weight", 7, 3 * 20, float("nan")),
        r"is damaged: blk.10.attn_q.weight row 7, block 3: its fp16 scale d is nan"),
    "A: inf min in an attn_q block": (
        _gguf_scale("blk.10.attn_q.weight", 7, 3 * 20 + 2, float("inf")),
        r"is damaged: blk.10.attn_q.weight row 7, block 3: its fp16 scale m is inf"),
    "B: attn_q 512 rows": (
        _gguf_dims("blk.3.attn_q.weight", 1, 512),
        r"does not match its own metadata: blk.3.attn_q.weight is 512 rows of 576 weights; head_count 9 x "
        r"head_dim 64 and embedding_length 576 expect 576 rows of 576 weights$"),
    "C: head_count 8": (
        _gguf_meta("llama.attention.head_count", 8),
        r"blk.0.attn_output.weight is 576 rows of 576 weights; embedding_length 576 and head_count 8 x head_dim 64 "
        r"expect 576 rows of 512 weights \(59 more tensors disagree with it\)$"),
    "D: rope.freq_base NaN": (
        _gguf_meta("llama.rope.freq_base", float("nan")), r"has bad metadata: llama.rope.freq_base is nan; it must"),
    "D: layer_norm_rms_epsilon -1": (
        _gguf_meta("llama.attention.layer_norm_rms_epsilon", -1.0),
        r"has bad metadata: llama.attention.layer_norm_rms_epsilon is -1.0; it must be a number in \(0, 1\)"),
    "C: block_count 29": (
        _gguf_meta("llama.block_count", 29),
        r"it holds blk.29.attn_norm.weight and 8 more that nothing reads \(a llama model of block_count 29 reads "
        r"blk.0 to blk.28"),
}


@pytest.mark.parametrize("case", [c for c in SMOLLM2_FAULTS if c.startswith("A")])
def test_a_non_finite_block_scale_is_one_error_naming_tensor_block_and_field(tmp_path, case):
    """Must hold (issue 29, case A): a NaN or inf fp16 scale in one block of the shipped file (the
    embedding row of "The", one attn_q block) is found by the load-time scale check, never run."""
    import re

    from gatherlens.models.gguf.check import open_checked

    patch, said = SMOLLM2_FAULTS[case]
    path = _patched_gguf(smollm2_path(), tmp_path / "damaged.gguf", patch)
    with pytest.raises(GatherValueError) as caught:
        open_checked(path, quantized=True)
    assert re.search(said, str(caught.value)) and str(caught.value).startswith(f"model file {str(path)!r}")


def test_a_passed_scan_is_remembered_for_the_file_as_it_is_and_a_write_undoes_it(tmp_path, monkeypatch):
    """The values scan reads every block (the whole file): a warm load of an unchanged file skips it (the
    cache's memo by path, size and mtime_ns); the same path written with a NaN scale is scanned again."""
    import os

    import gatherlens.models.gguf.check as check

    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path(), path)
    check.open_checked(path, quantized=True)  # scanned, and remembered
    scans = []
    real = check._check_values
    monkeypatch.setattr(check, "_check_values", lambda *a: scans.append(1) or real(*a))
    check.open_checked(path, quantized=True)
    assert scans == []  # remembered: not scanned again
    before = os.stat(path).st_mtime_ns
    _patched_gguf(smollm2_path(), path, SMOLLM2_FAULTS["A: NaN scale in an attn_q block"][0])
    os.utime(path, ns=(before + 1_000_000, before + 1_000_000))  # a later write, whatever the clock's grain
    with pytest.raises(GatherValueError, match="is damaged: blk.10.attn_q.weight row 7"):
        check.open_checked(path, quantized=True)
    assert scans == [1]


def test_the_shipped_gguf_passes_the_check_in_milliseconds():
    """Must hold: the check runs on every load, so it costs milliseconds: SmolLM2's 98 MB, 272 tensors,
    every fp16 scale of its 4.9 million blocks (about 25 ms here; the bound leaves room for a loaded machine)."""
    from gatherlens.models.gguf.check import check_gguf
    from gatherlens.models.gguf.config import open_gguf

    path = smollm2_path()
    reader = open_gguf(path, mode="c")
    check_gguf(reader, path, quantized=False)   # the pages mapped once, as the load maps them
    start = time.perf_counter()
    check_gguf(reader, path, quantized=True)
    assert time.perf_counter() - start < 0.5


def test_a_sound_tiny_gguf_passes_and_an_iq2_matrix_runs_in_float_only(tiny_llama_gguf, tmp_path):
    from gguf import GGMLQuantizationType as T

    from gatherlens.models.gguf.check import open_checked

    open_checked(tiny_llama_gguf, quantized=True)
    path = _tiny_llama_gguf(tmp_path / "iq2.gguf", {"blk.0.ffn_down": T.IQ2_XXS})
    open_checked(path, quantized=False)
    with pytest.raises(GatherValueError, match=r"cannot run: IQ2_XXS \(blk.0.ffn_down.weight: 64 rows of 256 "
                                               r"weights\); .*try without --quantized \(quantized=True\)"):
        open_checked(path, quantized=True)


def test_unsupported_types_are_all_named_before_anything_slow(tmp_path, monkeypatch):
    """Must hold: a file in formats the quantized path cannot run is refused at once, before the
    config, tokenizer or any block is read: one line naming every such type by ggml's name (IQ2_XXS
    for an IQ2_XXS tensor), its first tensor and that tensor's shape in plain integers, and the float
    path as the way out; no numpy types in it."""
    from gguf import GGMLQuantizationType as T

    import gatherlens.models.gguf.quantized as quantized
    from gatherlens.ops.quant.formats.registry import FORMATS

    path = _tiny_llama_gguf(tmp_path / "iq.gguf", {"blk.0.ffn_down": T.IQ2_XXS, "blk.1.ffn_down": T.IQ2_XXS,
                                                   "blk.0.attn_output": T.MXFP4})
    monkeypatch.setattr(quantized, "_config_and_tokenizer", lambda *a: pytest.fail("read past the check"))
    result = run("generate", "--quantized", "--model", str(path), "--max-new-tokens", "2", "hi")
    assert result.exit_code == 1 and len(error_lines(result)) == 1, result.output
    assert error_lines(result)[0] == (
        f"Error: model file {str(path)!r} holds tensors quantized=True cannot run: MXFP4 (blk.0.attn_output.weight: "
        f"64 rows of 64 weights); IQ2_XXS (blk.0.ffn_down.weight: 64 rows of 256 weights, and 1 more); it runs "
        f"matrices in {', '.join(FORMATS)} and vectors in F32, F16, BF16; try without --quantized (quantized=True): the "
        f"float32 path dequantizes them")


@pytest.mark.parametrize("case,quantized", [
    ("A: NaN scale in the embedding row of 'The'", True), ("A: NaN scale in the embedding row of 'The'", False),
    ("B: attn_q 512 rows", True), ("C: head_count 8", True), ("C: block_count 29", False),
    ("D: rope.freq_base NaN", True), ("D: rope.freq_base NaN", False), ("D: layer_norm_rms_epsilon -1", True),
    ("D: layer_norm_rms_epsilon -1", False)])
def test_generate_on_a_damaged_gguf_is_one_error_line_and_writes_nothing(root, tmp_path, case, quantized):
    """Must hold: what the user sees from `generate` (and `serve`, which loads the same way) on the
    shipped file damaged: exit 1, one `Error:` line naming the file and the fault, no traceback, no
    internal error, no output file, nothing cached (the float path checks before it converts)."""
    import re

    patch, said = SMOLLM2_FAULTS[case]
    path = _patched_gguf(smollm2_path(), tmp_path / "damaged.gguf", patch)
    pages = tmp_path / "pages.svg"
    flag = ["--quantized"] if quantized else []
    result = run("generate", *flag, "--model", str(path), "--max-new-tokens", "2", "--pages", str(pages), "hi")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"Error: model file {str(path)!r}"), \
        result.output
    assert re.search(said, lines[0]) and "internal error" not in lines[0], lines[0]
    models = root / "models"
    assert not pages.exists() and not (models.exists() and any(models.iterdir()))


def test_a_gguf_cut_inside_its_data_names_the_first_tensor_past_the_end(tmp_path):
    """Must hold: a file truncated after its header (a partial download) names the first tensor whose
    data is missing; one cut inside the header keeps the reader's own words (test above)."""
    from gatherlens.models.gguf.check import open_checked

    path = tmp_path / "partial.gguf"
    with open(smollm2_path(), "rb") as f:
        path.write_bytes(f.read(50_000_000))
    with pytest.raises(GatherValueError, match=r"partial.gguf' is truncated: blk\.\d+\.\w+\.weight's data ends at "
                                               r"byte [\d,]+, past the end of the file \(50,000,000 bytes\)"):
        open_checked(path)


def test_quantized_table_from_a_file_that_is_not_gguf_names_it(tmp_path):
    from gatherlens.ops.quant import QuantizedTable

    path = tmp_path / "notes.gguf"
    path.write_text("just text")
    with pytest.raises(GatherValueError, match=r"path '.*notes.gguf' is not a readable GGUF file \(GGUF magic invalid\)"):
        QuantizedTable.from_gguf(path, "token_embd.weight")


def test_a_tensor_the_model_does_not_apply_is_named_in_a_warning_not_refused(tmp_path):
    """Llama 3.x files carry rope_freqs.weight (RoPE frequency factors transformers does not apply):
    the check warns once, naming it and what differs, and the file runs; any other stray tensor is refused."""
    import gguf

    from gatherlens.errors import GatherLensWarning
    from gatherlens.models.gguf.check import check_gguf

    path = _tiny_llama_gguf(tmp_path / "rope.gguf", extra={"rope_freqs": ((8,), 3.0)})  # none of Llama 3's
    with pytest.warns(GatherLensWarning, match=r"rope.gguf: rope_freqs.weight: .*not applied"):
        check_gguf(gguf.GGUFReader(path), path, quantized=True)
    import warnings

    ones = _tiny_llama_gguf(tmp_path / "ones.gguf", extra={"rope_freqs": (8,)})  # factors of 1 change nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_gguf(gguf.GGUFReader(ones), ones, quantized=True)
    stray = _tiny_llama_gguf(tmp_path / "stray.gguf", extra={"blk.0.attn_q_norm": (16,)})
    with pytest.raises(GatherValueError, match=r"blk.0.attn_q_norm.weight that nothing reads"):
        check_gguf(gguf.GGUFReader(stray), stray, quantized=True)


def test_a_damaged_gguf_block_is_one_error_without_a_numpy_warning(root, gguf, monkeypatch, capfd):
    """Must hold: a GGUF block with an inf scale (dequantized by gguf's numpy code: inf x 0) is the
    one `Error: ... damaged weights` line, with no raw numpy RuntimeWarning before it."""
    import numpy as np

    def convert(path, say):
        model = fault_worker.tiny_model()
        scale, codes = np.float16("inf"), np.array([0, 3], dtype=np.int8)   # what a damaged Q8_0 block holds
        row = torch.from_numpy(scale.astype(np.float32) * codes.astype(np.float32))  # (2,): nan, inf
        with torch.no_grad():
            model.lm_head.weight[5, 7:9] = row
        return model, fault_worker.tokenizer()

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)           # a numpy warning would fail the run
        result = run("generate", "hi", "--model", str(gguf), "--max-new-tokens", "2")
    assert result.exit_code == 1 and "RuntimeWarning" not in result.output + capfd.readouterr().err
    assert error_lines(result)[0].startswith(f"Error: model file {str(gguf)!r} converts to damaged weights"), result.output


@pytest.mark.parametrize("key,value,said", [
    ("gemma2.attention.sliding_window", 0, r"gemma2.attention.sliding_window is 0; it must be a whole number above 0 "
                                           r"\(tokens a local layer attends to\)"),
    ("gemma2.final_logit_softcapping", float("nan"), r"gemma2.final_logit_softcapping is nan; it must be a finite "
                                                     r"number above 0"),
    ("gemma2.attn_logit_softcapping", -50.0, r"gemma2.attn_logit_softcapping is -50.0"),
])
def test_a_gemma_file_with_a_bad_window_or_cap_is_one_error(tmp_path, key, value, said):
    """Must hold: a sliding window of 0 or a NaN / negative soft cap in a Gemma 2 file is one error
    naming the key, its value, what it is and the range, for both paths, before anything loads
    (before issue 40: a window of 0 was an internal error deep in the cache; a NaN cap ran)."""
    from tiny_gguf import tiny_model, write_gguf

    from gatherlens.models.gguf.check import open_checked

    path = write_gguf(tiny_model("gemma2"), "gemma2", "Q8_0", tmp_path / "g.gguf")
    open_checked(path, quantized=True)
    bad = _patched_gguf(path, tmp_path / "bad.gguf", _gguf_meta(key, value))
    for quantized in (True, False):
        with pytest.raises(GatherValueError, match=said):
            open_checked(bad, quantized=quantized)


def test_explain_on_a_gguf_with_a_nan_base_frequency_writes_no_report(root, tmp_path):
    """Must hold: `explain` on the shipped file with rope.freq_base NaN is one `Error:` line, exit 1, no
    report folder (before issue 40: rc 0, garbage text, and a report written from it)."""
    patch, said = SMOLLM2_FAULTS["D: rope.freq_base NaN"]
    path = _patched_gguf(smollm2_path(), tmp_path / "damaged.gguf", patch)
    result = run("explain", "The cat sat", "--model", str(path), "--out", str(tmp_path / "report"))
    assert result.exit_code == 1 and error_lines(result) == [
        f"Error: model file {str(path)!r} has bad metadata: llama.rope.freq_base is nan; it must be a finite number "
        f"above 0 (RoPE's base frequency); reinstall the package that ships it, or use another file"], result.output
    assert not (tmp_path / "report").exists()



def _sentencepiece_tokenizer(writer) -> None:
    """Gemma's kind of tokenizer (tokenizer.ggml.model "llama": sentencepiece, scores, no merges): the 256
    byte tokens, 61 pieces, then <bos>, <eos>, <pad> (CONTROL), in tiny_gguf's vocabulary size."""
    from tiny_gguf import BOS, EOS, MERGES, PAD, VOCAB

    pieces = [m.replace(" ", "").replace("Ġ", "▁") for m in MERGES]
    tokens = [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<bos>", "<eos>", "<pad>"]
    assert len(tokens) == VOCAB and len(set(tokens)) == VOCAB
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 256 + [-float(i) for i in range(len(pieces))] + [0.0] * 3)
    writer.add_token_types([6] * 256 + [1] * len(pieces) + [3] * 3)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_pad_token_id(PAD)


def test_a_sentencepiece_gguf_header_is_parsed_once_per_load(tmp_path, monkeypatch):
    """Must hold: loading a file whose tokenizer transformers builds (sentencepiece, Gemma's kind)
    parses its header once (gatherlens' reader), not three times (before issue 40 transformers read it
    again for the config and again for the tokenizer: a 262K-token Gemma 3 header each time); the
    tokenizer gives the ids transformers' tokenizer of the file gives."""
    import tiny_gguf
    import transformers.integrations.gguf.reader as hf_reader
    from transformers import AutoTokenizer

    from gatherlens.models.gguf import config as gguf_config
    from gatherlens.models.gguf.tokenizer import load_gguf_tokenizer

    monkeypatch.setattr(tiny_gguf, "tokenizer", _sentencepiece_tokenizer)
    path = tiny_gguf.write_gguf(tiny_gguf.tiny_model("gemma3"), "gemma3", "Q8_0", tmp_path / "g.gguf")
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name, local_files_only=True)
    gguf_config.forget_kept()
    reads = []
    real_mapped, real_init = hf_reader._mapped, gguf_config.FastReader.__init__
    monkeypatch.setattr(hf_reader, "_mapped", lambda p: reads.append(("transformers", p)) or real_mapped(p))
    monkeypatch.setattr(gguf_config.FastReader, "__init__",
                        lambda self, *a, **k: reads.append(("gatherlens", a[0])) or real_init(self, *a, **k))
    tokenizer = load_gguf_tokenizer(path, gguf_config.open_gguf(path, mode="c"))
    assert [who for who, _ in reads] == ["gatherlens"], reads
    # (built by gatherlens since issue 36: models/gguf/spm.py; the ids must be transformers' own)
    for text in ("The cat sat on the mat", "  two  spaces", "<bos>x", "ünïcödé"):
        assert tokenizer(text)["input_ids"] == reference(text)["input_ids"], text
