"""A GGUF file's Hugging Face config, read from its own metadata (no transformers GGUF loader).

    >>> reader = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")       # ~0.5 s: header only
    >>> config = gguf_config(reader)                                 # a transformers.LlamaConfig
    >>> config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings
    (9, 3, True)

`open_gguf` is a `gguf.GGUFReader` that parses the header from a plain numpy view of the mapped
file (numpy's memmap subclass costs a Python call per slice: ~3x slower on a 49k-token
vocabulary); afterwards `.data` is the memmap again. It keeps the last file it opened. `gguf_config` maps the metadata with one
table, `CONFIG_KEYS` (a key, "{arch}" standing for `general.architecture` -> a config field,
"a.b" for a field inside a dict field), the same fields transformers' `AutoConfig.from_pretrained(
folder, gguf_file=)` sets (its `GGUF_CONFIG_MAPPING` was the reference), plus rope scaling where
the file states one. An architecture with no class in `CONFIG_CLASSES` gives None
(`load_gguf_config` then asks transformers).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from gatherlens.models.file_watch import file_identity

__all__ = ["open_gguf", "gguf_config", "load_gguf_config", "metadata_value", "CONFIG_KEYS", "CONFIG_CLASSES"]

# general.architecture -> the transformers config class its rows below fill
CONFIG_CLASSES = {"llama": "LlamaConfig"}

# gguf key ("{arch}." = the architecture's own prefix) -> config field ("a.b": key b of dict field a)
CONFIG_KEYS = {
    "general.name": "_model_name_or_path",
    "{arch}.context_length": "max_position_embeddings",
    "{arch}.block_count": "num_hidden_layers",
    "{arch}.feed_forward_length": "intermediate_size",
    "{arch}.embedding_length": "hidden_size",
    "{arch}.rope.dimension_count": "head_dim",
    "{arch}.attention.head_count": "num_attention_heads",
    "{arch}.attention.head_count_kv": "num_key_value_heads",
    "{arch}.attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "{arch}.vocab_size": "vocab_size",
    "{arch}.rope.freq_base": "rope_parameters.rope_theta",
    "{arch}.rope.scaling.type": "rope_parameters.rope_type",
    "{arch}.rope.scaling.factor": "rope_parameters.factor",
    "{arch}.rope.scaling.original_context_length": "rope_parameters.original_max_position_embeddings",
    "{arch}.rope.scaling.attn_factor": "rope_parameters.attention_factor",
    "{arch}.rope.scaling.yarn_beta_fast": "rope_parameters.beta_fast",
    "{arch}.rope.scaling.yarn_beta_slow": "rope_parameters.beta_slow",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}


_KEPT: dict = {}  # the last open_gguf: {(path, mode, file identity): (header bytes, reader)}


class _FastReader(GGUFReader):
    """GGUFReader parsing from a plain ndarray view of its memmap; `.data` is the memmap afterwards."""

    def __init__(self, path, mode: str = "r"):
        super().__init__(path, mode=mode)
        self._gguf_view = self._gguf_map  # parsed: callers get the memmap (its .filename) back

    @property
    def data(self):
        return self._gguf_view

    @data.setter
    def data(self, value) -> None:
        self._gguf_map = value
        self._gguf_view = value.view(np.ndarray)  # (file bytes,) uint8, same memory, no memmap hooks


def open_gguf(path, mode: str = "r") -> GGUFReader:
    """`gguf.GGUFReader(path, mode)`, its header parsed ~3x faster ("c": copy-on-write, never written).

    The last file opened is kept: opening it again (the quantized load reads the config, then the
    blocks) costs one read of its header, which must be byte-equal to the kept one (same file,
    size and mtime too), else it is parsed afresh. A file that ends inside its header raises
    ValueError (GGUFReader's IndexError said so vaguely).
    """
    path = Path(path)
    key = (str(path.resolve()), mode, file_identity(path))  # the one file-identity rule (file_watch.py)
    kept = _KEPT.get(key) if key[2] is not None else None
    if kept is not None:
        header, reader = kept
        with open(path, "rb") as f:
            if f.read(len(header)) == header:
                return reader
    try:
        reader = _FastReader(path, mode=mode)
    except IndexError as err:
        raise ValueError(f"the GGUF header ends early ({err}): the file is truncated") from None
    _KEPT.clear()
    _KEPT[key] = (reader.data[: reader.data_offset].tobytes(), reader)
    return reader


def metadata_value(reader: GGUFReader, key: str, default=None):
    """One metadata value as Python data (str, int, float, bool, list), `default` when absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader: GGUFReader):
    """The transformers config the file's metadata describes (see module doc); None for an
    architecture with no class in CONFIG_CLASSES, or a Llama file transformers reads as Mistral."""
    import transformers

    arch = metadata_value(reader, "general.architecture")
    name = metadata_value(reader, "general.name") or ""
    if arch not in CONFIG_CLASSES or (arch == "llama" and "mistral" in name):
        return None
    fields: dict = {}
    for key, target in CONFIG_KEYS.items():
        value = metadata_value(reader, key.format(arch=arch))
        if value is None:
            continue
        outer, _, inner = target.partition(".")
        if inner:
            fields.setdefault(outer, {})[inner] = value
        else:
            fields[outer] = value
    _settle(fields, reader)
    return getattr(transformers, CONFIG_CLASSES[arch])(**fields)


def load_gguf_config(path, reader: GGUFReader):
    """gguf_config(reader), else transformers' `AutoConfig.from_pretrained(folder, gguf_file=)` on `path`."""
    config = gguf_config(reader)
    if config is None:
        from transformers import AutoConfig

        path = Path(path)
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    return config


def _settle(fields: dict, reader: GGUFReader) -> None:
    """What no single key states: the vocabulary from the token list, the tied head, the rope type."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if "vocab_size" not in fields and tokens is not None:
        fields["vocab_size"] = len(tokens.data)
    # llama.cpp writes the output projection only when it is not the embedding matrix
    fields["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    rope = fields.pop("rope_parameters", {})
    if rope.get("rope_type") in (None, "none"):  # no scaling: any other rope key means nothing
        rope = {"rope_theta": rope["rope_theta"], "rope_type": "default"} if "rope_theta" in rope else {}
    if rope:
        fields["rope_parameters"] = rope
