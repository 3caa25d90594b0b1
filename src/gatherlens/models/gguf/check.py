"""A GGUF file checked against itself before anything runs it: one error line naming the fault.

    >>> reader = open_checked("SmolLM2-135M-Instruct.Q4_1.gguf")     # gguf's reader, checked: ~20 ms more
    >>> check_gguf(reader, path, quantized=True)                     # None, or one GatherValueError
    GatherValueError: model file 'bad.gguf' does not match its own metadata: blk.3.attn_q.weight is 512
    rows of 576 weights; head_count 9 x head_dim 64 and embedding_length 576 expect 576 rows of 576 weights

The checks, in this order, all from the header (the reader's metadata and tensor infos) but the last:
1. the architecture: quantized=True runs the architectures of models/gguf/arch.py's table (`ARCHS`);
   any other is one error naming it and listing those. Then types: every tensor's ggml type is one
   the path runs. quantized=True: a matrix (or a stack of expert matrices) in a block format of
   ops/quant's `FORMATS`, a vector in a plain float format (`FLOAT_TYPES`: the records with a
   `value_dtype`, F32, F16, BF16); the float path: those or any type
   gguf's own `dequantize` takes. One error names every type it cannot run, by ggml's name, with its
   first tensor and that tensor's shape, and what would run instead.
2. the architecture's tensors (its rows in models/gguf/arch.py: names, shapes in terms of the
   metadata): block_count, embedding_length, head_count, head_count_kv, feed_forward_length,
   context_length, the head size (the architecture's key for it, else embedding_length / head_count),
   the expert counts of a MoE and the vocabulary (the tokenizer's token list) as whole numbers that
   agree; no tensor missing, none unused (a `blk.29.*` beyond block_count 29); every shape the one
   the metadata implies.
3. extents: the bytes a tensor's type and shape imply (layout.py's block sizes, gguf's for other
   types) lie inside the file and fill the space up to the next tensor's data, so a type that lies
   (Q4_1 blocks declared Q8_0) is found.
4. values: every fp16 scale field (layout.py's fields of kind "fp16": d, m, dmin) of every block,
   through one strided numpy view per tensor and field of the mapped file, and every value of an
   F32 / F16 / BF16 tensor (the records whose field is of kind "value"), finite. The scan reads every
   block (the whole file): once it passes, the cache remembers it for the file as it is (path, size,
   mtime_ns: files/cache.py's `file_memo`), so a warm load of the same file skips it; a write moves them.
A file gguf's reader cannot open (an unknown type number, a row that is not whole blocks, data past
the end of a truncated file) is parsed again for its tensor infos alone (`open_reader`), so those
faults are named the same way; a header that does not parse keeps the reader's own error.
"""
from __future__ import annotations

import functools
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from gatherlens.errors import GatherLensWarning, GatherValueError
from gatherlens.memory import release_pages
from gatherlens.models.files.cache import file_memo, remember
from gatherlens.models.gguf.arch import ARCHS, NOT_APPLIED, Arch
from gatherlens.models.gguf.config import config_keys, file_arch, metadata_value, open_gguf
from gatherlens.models.gguf.rope import ROPE_FREQS, llama3_scaling, rope_freqs
from gatherlens.ops.quant.formats.floats import value_dtype
from gatherlens.ops.quant.formats.layout import LAYOUTS
from gatherlens.ops.quant.formats.registry import FORMATS

__all__ = ["TensorInfo", "check_gguf", "open_reader", "open_checked", "tensor_infos", "FLOAT_TYPES", "NOT_APPLIED"]

# the plain float formats (their records name a value_dtype), read as they are: the norms of both paths
FLOAT_TYPES = tuple(q for q, fmt in FORMATS.items() if fmt.value_dtype is not None)
ARCH_INTS = ("block_count", "embedding_length", "attention.head_count", "context_length")
# terms of a shape (models/gguf/arch.py's rows) -> the metadata integer each needs beyond ARCH_INTS
TERM_KEYS = {"F": "feed_forward_length", "2F": "feed_forward_length", "X": "expert_count",
             "FX": "expert_feed_forward_length", "FS": "expert_shared_feed_forward_length"}
HINT = "reinstall the package that ships it, or use another file"
_FLOAT_CHUNK = 1 << 22  # values of a float tensor checked at a time
VALUES_CHECKED = "values-finite-1"  # the cache's memo of a file whose scan passed (files/cache.py; -1: this scan)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header states it: name, ggml's type number, ggml shape (width first), data offset."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order: [width, rows]
    offset: int  # where its data starts, in bytes from the start of the file

    @property
    def type_name(self) -> str:
        """ggml's name of the type ("IQ4_XS"), or "type 99" for a number ggml has no type for."""
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type {self.ggml_type}"

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape in torch order (rows, width)."""
        return tuple(reversed(self.shape))


def tensor_infos(reader) -> list[TensorInfo]:
    """The TensorInfo of every tensor an open `gguf.GGUFReader` holds, shapes as plain ints."""
    return [TensorInfo(t.name, int(t.tensor_type), tuple(int(n) for n in t.shape), int(t.data_offset))
            for t in reader.tensors]


def open_reader(path, mode: str = "c", quantized: bool = False):
    """`open_gguf(path, mode)` (models/gguf/config.py); a file it cannot open whose tensor infos
    show why (checks 1-3) raises that one GatherValueError, any other keeps the reader's error."""
    try:
        return open_gguf(path, mode=mode)
    except ValueError:
        infos = _InfoReader.infos_of(Path(path))
        if infos is not None:
            _check_header(*infos, Path(path), quantized)
        raise


def open_checked(path, mode: str = "c", quantized: bool = False):
    """`open_reader(path, mode)` then `check_gguf`: the reader of a file that passed every check."""
    reader = open_reader(path, mode, quantized)
    check_gguf(reader, path, quantized)
    return reader


def check_gguf(reader, path, quantized: bool = False, applied: tuple[str, ...] = ()) -> None:
    """Every check of the module doc on an open reader of `path`; one GatherValueError at the first fault.
    applied: tensors of NOT_APPLIED the caller does apply (no warning for them: the native runtime's
    rope_freqs).

    >>> check_gguf(open_gguf(path), path, quantized=True)     # None for a sound file
    """
    infos = tensor_infos(reader)
    _check_header(reader, infos, Path(path), quantized, applied)
    if file_memo(path, VALUES_CHECKED) is not True:  # the scan reads every block: once per file as it is
        _check_values(reader, infos, Path(path))
        remember(path, VALUES_CHECKED, True)


def _check_header(reader, infos: list[TensorInfo], path: Path, quantized: bool, applied: tuple = ()) -> None:
    arch = file_arch(reader)
    if arch is None and quantized:
        said = metadata_value(reader, "general.architecture")
        raise GatherValueError(f"model file {str(path)!r} is a {said!r} model; quantized=True runs the GGUF "
                               f"architectures {', '.join(ARCHS)}; try without --quantized (quantized=True): "
                               f"the float32 path reads every architecture transformers reads")
    _check_types(infos, path, quantized)
    if arch is not None:
        _check_arch(reader, infos, path, arch, applied)
    _check_extents(infos, int(reader.alignment), len(reader.data), path)


# -- 1. types -------------------------------------------------------------------------------------
def _runs(info: TensorInfo, quantized: bool) -> bool:
    if quantized:  # a matrix, or a stack of them (a MoE's experts), in a block format; a vector as floats
        return info.type_name in (FORMATS if len(info.shape) in (2, 3) else FLOAT_TYPES)
    return info.type_name in FORMATS or info.type_name in FLOAT_TYPES or _gguf_dequantizes(info.type_name)


@functools.cache
def _gguf_dequantizes(type_name: str) -> bool:
    """Whether gguf's numpy `dequantize` (the float path's fallback) takes one block of `type_name`."""
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType.__members__.get(type_name)
    if qtype is None or qtype not in GGML_QUANT_SIZES:
        return False
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)  # (1, block bytes): one block
    except NotImplementedError:
        return False
    return True


def _check_types(infos: list[TensorInfo], path: Path, quantized: bool) -> None:
    """One error naming every type the path cannot run, each with its first tensor and count."""
    bad: dict[str, list[TensorInfo]] = {}
    for info in infos:
        if not _runs(info, quantized):
            bad.setdefault(info.type_name, []).append(info)
    if not bad:
        return
    listed = "; ".join(f"{kind} ({_first(some)})" for kind, some in bad.items())
    if not quantized:
        raise GatherValueError(f"model file {str(path)!r} holds tensors in types gatherlens cannot dequantize: "
                               f"{listed}")
    floats = all(_runs(TensorInfo("", t, (1,), 0), False) for t in
                 {i.ggml_type for i in infos if i.type_name in bad})
    hint = ("; try without --quantized (quantized=True): the float32 path dequantizes them" if floats else
            "; use another preset of the model (a file in those types)")
    raise GatherValueError(f"model file {str(path)!r} holds tensors quantized=True cannot run: {listed}; it runs "
                           f"matrices in {', '.join(FORMATS)} and vectors in {', '.join(FLOAT_TYPES)}{hint}")


def _first(infos: list[TensorInfo]) -> str:
    """"blk.0.ffn_gate.weight: 256 rows of 64 weights, and 1 more": the first tensor, its shape in plain integers."""
    first = f"{infos[0].name}: {_words(infos[0].dims)}"
    return first if len(infos) == 1 else f"{first}, and {len(infos) - 1:,} more"


def _some(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1:,} more"


# -- 2. the architecture --------------------------------------------------------------------------
def _positive(reader, key: str, path: Path, default=None) -> int:
    value = metadata_value(reader, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        said = "is missing" if value is None else f"is {value!r}"
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: {key} {said}; it must be a "
                               f"positive whole number")
    return value


def _arch_terms(reader, path: Path, arch: Arch) -> dict[str, tuple[int, str]]:
    """{term of the rows' shapes: (value, the metadata it comes from, in words)}, the metadata checked on the way."""
    key = f"{arch.gguf}.{{}}".format
    L, E, H, _ = (_positive(reader, key(k), path) for k in ARCH_INTS)
    KV = _positive(reader, key("attention.head_count_kv"), path, default=H)
    D = _head_dim(reader, path, arch, E, H)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    V = len(tokens.data) if tokens is not None else _positive(reader, key("vocab_size"), path)
    stated = metadata_value(reader, key("vocab_size"), V)
    if stated != V:
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: {key('vocab_size')} {stated!r} but "
                               f"tokenizer.ggml.tokens holds {V:,} tokens")
    terms = {"V": (V, f"vocabulary {V:,} (tokenizer.ggml.tokens)"), "E": (E, f"embedding_length {E}"),
             "H*D": (H * D, f"head_count {H} x head_dim {D}"), "KV*D": (KV * D, f"head_count_kv {KV} x head_dim {D}"),
             "QKV": ((H + 2 * KV) * D, f"head_count {H} + 2 x head_count_kv {KV}, x head_dim {D}"),
             "D": (D, f"head_dim {D}"), "L": (L, f"block_count {L}"), "H": (H, ""), "KV": (KV, "")}
    used = {t for row in arch.rows for t in row.shape}
    for term in sorted(used & set(TERM_KEYS)):
        value = _positive(reader, key(TERM_KEYS[term]), path)
        terms[term] = (2 * value, f"2 x {TERM_KEYS[term]} {value}") if term == "2F" else \
            (value, f"{TERM_KEYS[term]} {value}")
    return terms


def _head_dim(reader, path: Path, arch: Arch, E: int, H: int) -> int:
    """The head size: the architecture's key for it (rope.dimension_count, attention.key_length), else E / H."""
    key = arch.head_dim_key.format(arch=arch.gguf) if arch.head_dim_key else None
    if key is not None and metadata_value(reader, key) is not None:
        return _positive(reader, key, path)
    if E % H:
        said = f"no {key.split('.', 1)[1]}" if key else "nothing"
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: embedding_length {E} is not a multiple "
                               f"of head_count {H}, and {said} gives the head size")
    return E // H


def _check_arch(reader, infos: list[TensorInfo], path: Path, arch: Arch, applied: tuple = ()) -> None:
    terms = _arch_terms(reader, path, arch)
    theta = metadata_value(reader, f"{arch.gguf}.rope.freq_base", 10000.0)
    if llama3_scaling(rope_freqs(reader), theta) is not None:  # Llama 3's scaling, read into the config
        applied = (*applied, ROPE_FREQS)
    _check_tensor_set(infos, terms["L"][0], path, arch, applied)
    wrong = [(info, _expected(info.name, terms, arch)) for info in infos if info.name not in NOT_APPLIED]
    wrong = [(info, want) for info, want in wrong if info.dims != want[0]]
    if wrong:
        (info, (dims, why)), more = wrong[0], len(wrong) - 1
        verb = "expects" if len(why) == 1 else "expect"
        tail = f" ({more:,} more tensors disagree with it)" if more else ""
        raise GatherValueError(f"model file {str(path)!r} does not match its own metadata: {info.name} is "
                               f"{_words(info.dims)}; {' and '.join(why)} {verb} {_words(dims)}{tail}")
    _check_scalars(reader, path, arch, terms["V"][0])
    H, KV = terms["H"][0], terms["KV"][0]
    if H % KV:
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: head_count {H} is not a multiple of "
                               f"head_count_kv {KV} (each KV head serves a whole number of query heads)")


# config field a metadata key fills (models/gguf/config.py's keys) -> (the values it takes, what it is);
# "ratio": a number in (0, 1); "positive": a finite number above 0; "count": a whole number above 0;
# "token": a token id inside the vocabulary; "finite": any finite number
SCALARS = {
    "rope_theta": ("positive", "RoPE's base frequency"),
    "rms_norm_eps": ("ratio", "the epsilon RMSNorm adds to the mean square"),
    "rope_scaling.factor": ("positive", "the RoPE scaling factor"),
    "rope_scaling.attention_factor": ("positive", "YaRN's attention factor"),
    "rope_scaling.beta_fast": ("finite", "YaRN's beta_fast"),
    "rope_scaling.beta_slow": ("finite", "YaRN's beta_slow"),
    "rope_scaling.original_max_position_embeddings": ("count", "the context the model was trained at"),
    "sliding_window": ("count", "tokens a local layer attends to"),
    "attn_logit_softcapping": ("positive", "the cap of attention logits"),
    "final_logit_softcapping": ("positive", "the cap of the output logits"),
    "num_experts_per_tok": ("count", "experts each token uses"),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"), ("token", "a token id")),
}
_RULES = {"ratio": "a number in (0, 1)", "positive": "a finite number above 0", "count": "a whole number above 0",
          "token": "a whole number in [0, {V})", "finite": "a finite number"}


def _scalar_ok(kind: str, value, V: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind in ("count", "token"):
        return isinstance(value, int) and (0 < value if kind == "count" else 0 <= value < V)
    finite = bool(np.isfinite(value))
    return finite and (kind == "finite" or (value > 0 and (kind == "positive" or value < 1)))


def _check_scalars(reader, path: Path, arch: Arch, V: int) -> None:
    """Every scalar the config reads (SCALARS) in its range: a NaN base frequency or a negative epsilon
    would run and write garbage; a sliding window of 0 or an end-of-sequence id past the vocabulary fail
    deep inside. One error naming the key, its value, what it is and the range."""
    for key, target in config_keys(arch).items():
        rule = SCALARS.get(target)
        key = key.format(arch=arch.gguf)
        value = metadata_value(reader, key)
        if rule is None or value is None or _scalar_ok(rule[0], value, V):
            continue
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: {key} is {value!r}; it must be "
                               f"{_RULES[rule[0]].format(V=f'{V:,}')} ({rule[1]}); {HINT}")
    used = metadata_value(reader, f"{arch.gguf}.expert_used_count")
    experts = metadata_value(reader, f"{arch.gguf}.expert_count")
    if isinstance(used, int) and isinstance(experts, int) and used > experts:
        raise GatherValueError(f"model file {str(path)!r} has bad metadata: {arch.gguf}.expert_used_count {used} "
                               f"is more than its expert_count {experts}; {HINT}")


def _expected(name: str, terms: dict, arch: Arch) -> tuple[tuple[int, ...], list[str]]:
    """(torch shape, the metadata that sets it, in words) of a tensor of the set (a bias: its weight's rows)."""
    row = arch.find(name)[0]
    shape = row.shape[:1] if name.endswith(".bias") else row.shape
    parts = [terms[t] for t in shape]
    return tuple(v for v, _ in parts), list(dict.fromkeys(words for _, words in parts))


def _words(dims: tuple[int, ...]) -> str:
    if len(dims) == 2:
        return f"{dims[0]:,} rows of {dims[1]:,} weights"
    return f"{dims[0]:,} weights" if len(dims) == 1 else f"of shape {list(dims)}"


def _check_tensor_set(infos: list[TensorInfo], blocks: int, path: Path, arch: Arch, applied: tuple = ()) -> None:
    """Each tensor of the architecture's rows for `blocks` blocks once (optional rows may be absent), nothing else;
    a NOT_APPLIED tensor warns unless `applied` names it (Llama 3's rope_freqs read as its scaling)."""
    names = [info.name for info in infos]
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    if twice:
        raise GatherValueError(f"model file {str(path)!r} is damaged: tensor {twice[0]} is stored twice")
    rows = [r for r in arch.rows if r.block] + [r for r in arch.rows if not r.block]
    expected = [n for row in rows for n in row.gguf_names(blocks)]
    optional = {n for row in rows if row.optional for n in row.gguf_names(blocks)}
    have = set(names)
    missing = [n for n in expected if n not in have and n not in optional]
    if missing:
        raise GatherValueError(f"model file {str(path)!r} does not match its own metadata: it lacks "
                               f"{_some(missing)}, which block_count {blocks} and the {arch.name} architecture need")
    for name in sorted(have & set(NOT_APPLIED) - set(applied)):
        warnings.warn(f"{path.name}: {name}: {NOT_APPLIED[name]}", GatherLensWarning, stacklevel=2)
    unused = [n for n in names if n not in set(expected) and n not in NOT_APPLIED]
    if unused:
        tops = [r.gguf for r in arch.rows if not r.block]
        raise GatherValueError(f"model file {str(path)!r} does not match its own metadata: it holds "
                               f"{_some(unused)} that nothing reads (a {arch.name} model of block_count {blocks} "
                               f"reads blk.0 to blk.{blocks - 1}, {', '.join(tops[:-1])} and {tops[-1]})")


# -- 3. extents -----------------------------------------------------------------------------------
def _block(type_name: str) -> tuple[int, int] | None:
    """(weights, bytes) of one block: layout.py's record, else gguf's table; None for an unknown type."""
    if type_name in LAYOUTS:
        return LAYOUTS[type_name].weights, LAYOUTS[type_name].block_bytes
    qtype = GGMLQuantizationType.__members__.get(type_name)
    return GGML_QUANT_SIZES.get(qtype) if qtype is not None else None


def _check_extents(infos: list[TensorInfo], alignment: int, size: int, path: Path) -> None:
    """Whole blocks a row; each tensor's bytes inside the file, up to (within padding of) the next one's."""
    spans = sorted(infos, key=lambda info: info.offset)
    for info, after in zip(spans, [*spans[1:], None]):
        block = _block(info.type_name)
        if block is None:
            continue
        weights, nbytes = block
        width, elements = info.shape[0] if info.shape else 1, int(np.prod(info.shape, dtype=np.int64))
        if width % weights:
            raise GatherValueError(f"model file {str(path)!r} is damaged: {info.name} is {info.type_name} with rows "
                                   f"{width:,} wide, not whole {weights}-weight blocks")
        end, limit = info.offset + elements // weights * nbytes, after.offset if after else size
        room = f"the next tensor, {after.name}, starts {limit - info.offset:,} bytes after it" if after else ""
        if end > size:
            raise GatherValueError(f"model file {str(path)!r} is truncated: {info.name}'s data ends at byte {end:,}, "
                                   f"past the end of the file ({size:,} bytes); {HINT}")
        if end > limit or (after is not None and limit - end >= max(alignment, 1)):
            raise GatherValueError(f"model file {str(path)!r} does not match its own metadata: {info.name} as "
                                   f"{info.type_name} ({_words(info.dims)}) is {end - info.offset:,} bytes, but "
                                   f"{room}: its type or shape does not describe its data")


# -- 4. values ------------------------------------------------------------------------------------
def _check_values(reader, infos: list[TensorInfo], path: Path) -> None:
    """Every fp16 scale of every block, and every F32 / F16 / BF16 value, finite: strided views, no copy."""
    for info in infos:
        layout = LAYOUTS.get(info.type_name)
        count = int(np.prod(info.shape, dtype=np.int64))
        if layout is not None and layout.value_dtype is not None:
            _check_floats(reader, info, count, path)
        elif layout is not None:
            blocks = count // layout.weights
            for field in (f for f in layout.fields if f.kind == "fp16"):
                scales = np.ndarray((blocks,), "<f2", buffer=reader.data, offset=info.offset + field.offset,
                                    strides=(layout.block_bytes,))  # one fp16 a block, in place
                if not np.isfinite(scales).all():
                    _bad_scale(info, scales, field.name, info.shape[0] // layout.weights, path)
            # its pages let go: checking a file never holds all of it in memory at once
            release_pages(reader.data, reader.data.ctypes.data + info.offset, blocks * layout.block_bytes)


def _check_floats(reader, info: TensorInfo, count: int, path: Path) -> None:
    """Every value of a plain float tensor finite, read in place as its record's value_dtype."""
    raw = np.ndarray((count * LAYOUTS[info.type_name].block_bytes,), np.uint8, buffer=reader.data,
                     offset=info.offset)  # the tensor's bytes, in place
    with warnings.catch_warnings():  # a read-only map ("r"): torch warns of writes; this only reads
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        values = torch.from_numpy(raw).view(value_dtype(info.type_name))  # (count,)
    for start in range(0, count, _FLOAT_CHUNK):  # a piece at a time: no (count,) mask of a 262K x 640 table
        finite = torch.isfinite(values[start:start + _FLOAT_CHUNK])  # (chunk,)
        if not bool(finite.all()):
            at = start + int((~finite).nonzero()[0])
            raise GatherValueError(f"model file {str(path)!r} is damaged: {info.name} holds {float(values[at])} at "
                                   f"{_position(at, info)}; every weight must be finite; {HINT}")


def _bad_scale(info: TensorInfo, scales: np.ndarray, field: str, per_row: int, path: Path) -> None:
    bad = np.flatnonzero(~np.isfinite(scales))
    first = int(bad[0])
    row, block = divmod(first, per_row)
    where = f"row {row:,}, block {block:,}" if len(info.shape) > 1 else f"block {first:,}"
    also = f" ({len(bad):,} blocks in all)" if len(bad) > 1 else ""
    raise GatherValueError(f"model file {str(path)!r} is damaged: {info.name} {where}: its fp16 scale {field} is "
                           f"{float(scales[first])}{also}; every block scale must be finite; {HINT}")


def _position(flat: int, info: TensorInfo) -> str:
    if len(info.shape) < 2:
        return f"index {flat:,}"
    row, col = divmod(flat, info.shape[0])
    return f"row {row:,}, column {col:,}"


# -- a file gguf's reader cannot open -------------------------------------------------------------
class _InfoReader(GGUFReader):
    """gguf's reader stopping at the tensor infos (no data views): what a failed open stated."""

    def _build_tensors(self, start_offs: int, fields) -> None:
        self.infos = []
        for field in fields:
            _, name, _, dims, kind, offset = field.parts
            self.infos.append(TensorInfo(str(bytes(name), encoding="utf-8"), int(kind[0]),
                                         tuple(int(n) for n in dims), int(start_offs + offset[0])))

    @classmethod
    def infos_of(cls, path: Path):
        """(reader, its TensorInfos), or None when even the header does not parse."""
        try:
            reader = cls(path, mode="r")
        except Exception:  # noqa: BLE001 - the header itself is unreadable: the first error stands
            return None
        return reader, reader.infos
