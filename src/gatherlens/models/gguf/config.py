"""A GGUF file's Hugging Face config, read from its own metadata (no transformers GGUF loader).

    >>> reader = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")       # ~0.5 s: header only
    >>> config = gguf_config(reader)                                 # a transformers.LlamaConfig
    >>> config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings
    (9, 3, True)

`open_gguf` is a `gguf.GGUFReader` whose header parses in one pass (models/gguf/reader.py: a
262K-token vocabulary in a fraction of a second); afterwards `.data` is the memmap again. It keeps
the last file it opened. `gguf_config` maps the metadata with one
table, `CONFIG_KEYS` (a key, "{arch}" standing for `general.architecture` -> a config field,
"a.b" for a field inside a dict field), the same fields transformers' `AutoConfig.from_pretrained(
folder, gguf_file=)` sets (its `GGUF_CONFIG_MAPPING` was the reference), plus rope scaling where
the file states one, and the rows each architecture of models/gguf/arch.py adds (`Arch.config_keys`:
its head size, sliding window, soft-capping, experts; `Arch.defaults`). An architecture not in that
table gives None (`load_gguf_config` then asks transformers). `file_arch(reader)` is the file's row.
"""
from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader

from gatherlens.models.files.watch import file_identity
from gatherlens.models.gguf.arch import ARCHS, Arch, lookup
from gatherlens.models.gguf.reader import FastReader
from gatherlens.models.gguf.rope import llama3_scaling, rope_freqs

__all__ = ["open_gguf", "gguf_config", "load_gguf_config", "metadata_value", "file_arch", "config_keys",
           "CONFIG_KEYS", "CONFIG_CLASSES"]

# our architecture name -> the transformers config class its rows fill (models/gguf/arch.py)
CONFIG_CLASSES = {name: arch.config_class for name, arch in ARCHS.items()}

# gguf key ("{arch}." = the architecture's own prefix) -> config field ("a.b": key b of dict field a),
# the rows every architecture reads; `config_keys(arch)` adds the architecture's own
CONFIG_KEYS = {
    "general.name": "_model_name_or_path",
    "{arch}.context_length": "max_position_embeddings",
    "{arch}.block_count": "num_hidden_layers",
    "{arch}.feed_forward_length": "intermediate_size",
    "{arch}.embedding_length": "hidden_size",
    "{arch}.attention.head_count": "num_attention_heads",
    "{arch}.attention.head_count_kv": "num_key_value_heads",
    "{arch}.attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "{arch}.vocab_size": "vocab_size",
    "{arch}.rope.freq_base": "rope_theta",
    "{arch}.rope.scaling.type": "rope_scaling.rope_type",
    "{arch}.rope.scaling.factor": "rope_scaling.factor",
    "{arch}.rope.scaling.original_context_length": "rope_scaling.original_max_position_embeddings",
    "{arch}.rope.scaling.attn_factor": "rope_scaling.attention_factor",
    "{arch}.rope.scaling.yarn_beta_fast": "rope_scaling.beta_fast",
    "{arch}.rope.scaling.yarn_beta_slow": "rope_scaling.beta_slow",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}


_KEPT: dict = {}  # the last open_gguf: {(path, mode, file identity): (header bytes, reader)}


def open_gguf(path, mode: str = "r") -> GGUFReader:
    """`gguf.GGUFReader(path, mode)`, its header parsed in one pass ("c": copy-on-write, never written).

    The last file opened is kept: opening it again (the quantized load reads the config, then the
    blocks) costs one read of its header, which must be byte-equal to the kept one (same file,
    size and mtime too), else it is parsed afresh. A file that ends inside its header raises
    ValueError (GGUFReader's IndexError said so vaguely).
    """
    path = Path(path)
    key = (str(path.resolve()), mode, file_identity(path))  # the one file-identity rule (models/files/watch.py)
    kept = _KEPT.get(key) if key[2] is not None else None
    if kept is not None:
        header, reader = kept
        with open(path, "rb") as f:
            if f.read(len(header)) == header:
                return reader
    try:
        reader = FastReader(path, mode=mode)
    except IndexError as err:
        raise ValueError(f"the GGUF header ends early ({err}): the file is truncated") from None
    _KEPT.clear()
    _KEPT[key] = (reader.data[: reader.data_offset].tobytes(), reader)
    return reader


def forget_kept() -> None:
    """Let the kept reader go (open_gguf's last file): its parsed metadata is tens of MB of Python
    objects for a large vocabulary (~40 MB for SmolLM2's 49,152 tokens and merges); a model that
    maps the file keeps only the mapping. The next open_gguf parses the header afresh."""
    _KEPT.clear()


def metadata_value(reader: GGUFReader, key: str, default=None):
    """One metadata value as Python data (str, int, float, bool, list), `default` when absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def file_arch(reader: GGUFReader) -> Arch | None:
    """The file's row of models/gguf/arch.py's table (by `general.architecture` and `general.name`), or None."""
    return lookup(metadata_value(reader, "general.architecture"), metadata_value(reader, "general.name"))


def config_keys(arch: Arch) -> dict[str, str]:
    """The metadata rows `arch` reads: the common `CONFIG_KEYS` and its own (`Arch.config_keys`)."""
    return {**CONFIG_KEYS, **arch.config_keys}


def gguf_config(reader: GGUFReader):
    """The transformers config the file's metadata describes (see module doc); None for an
    architecture models/gguf/arch.py has no row for."""
    import transformers

    arch = file_arch(reader)
    if arch is None:
        return None
    fields: dict = {}
    for key, target in config_keys(arch).items():
        value = metadata_value(reader, key.format(arch=arch.gguf))
        if value is None:
            continue
        outer, _, inner = target.partition(".")
        if inner:
            fields.setdefault(outer, {})[inner] = value
        else:
            fields[outer] = value
    for key, value in arch.defaults.items():
        fields.setdefault(key, value)
    _settle(fields, reader)
    return getattr(transformers, arch.config_class)(**fields)


def load_gguf_config(path, reader: GGUFReader):
    """gguf_config(reader), else transformers' `AutoConfig.from_pretrained(folder, gguf_file=)` on `path`."""
    config = gguf_config(reader)
    if config is None:
        from transformers import AutoConfig

        path = Path(path)
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    return config


def _settle(fields: dict, reader: GGUFReader) -> None:
    """What no single key states: the vocabulary from the token list, the tied head, the rope type (Llama
    3's from its rope_freqs.weight)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if "vocab_size" not in fields and tokens is not None:
        fields["vocab_size"] = len(tokens.data)
    # llama.cpp writes the output projection only when it is not the embedding matrix
    fields["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    scaling = fields.pop("rope_scaling", {})
    if scaling.get("rope_type") in (None, "none"):  # Llama 3's scaling is a tensor, not metadata (models/gguf/rope.py)
        scaling = llama3_scaling(rope_freqs(reader), fields.get("rope_theta", 10000.0)) or {}
    if scaling.get("rope_type") not in (None, "none"):  # no scaling: any other rope key means nothing
        fields["rope_scaling"] = scaling  # the config class merges it with rope_theta (per layer type for Gemma 3)
