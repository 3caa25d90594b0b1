"""A GGUF file's tokenizer, built from its metadata with `tokenizers` (no transformers GGUF converter).

    >>> reader = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")        # gatherlens.models.gguf.config
    >>> tok = gguf_tokenizer(reader)                                  # a transformers.PreTrainedTokenizerFast
    >>> tok("The cat")["input_ids"], tok.eos_token
    ([504, 2644], '<|im_end|>')

`tokenizer.ggml.model` "gpt2": byte-level BPE from `tokenizer.ggml.tokens` and `.merges`, the
tokens the file marks CONTROL (3) added as special tokens and USER_DEFINED (4) as plain added
tokens, the pre-tokenizer picked by `tokenizer.ggml.pre` from `PRE_TOKENIZER_SPLITS` (GPT-2's
byte-level split for any other), exactly as transformers' GGUF converter builds it (its
`gguf_tokenizer_mapping` was the reference); the special tokens, `add_bos_token` /
`add_eos_token` and the chat template come from the metadata too.

`tokenizer.ggml.model` "llama" (SentencePiece, with `tokenizer.ggml.scores`): BPE with byte fallback
over the merges the vocabulary implies (`spm_merges`: every split of a token into two tokens, best
score first; Gemma's in token order, its tokens of spaces spelled with U+2581), with Gemma's or
Llama's normalizer, pre-tokenizer and decoder: what transformers' GGUF converter builds (its
`gemma_tokenizer` / `sentencepiece_tokenizer` are the reference), in a fraction of its time for
Gemma 3's 262,144 tokens (one array sort for the merges, no copy of the built tokenizer). Any other
tokenizer model (Phi-3's sentencepiece, "t5", ...) gives None (`load_gguf_tokenizer` then asks
transformers).
"""
from __future__ import annotations

import functools
from pathlib import Path

from gatherlens.models.gguf.config import metadata_value
from gatherlens.models.gguf.spm import sentencepiece_backend, spm_style
from gatherlens.models.hf_adapter import tokenizer_over

__all__ = ["gguf_tokenizer", "gguf_backend", "kept_backend", "load_gguf_tokenizer", "PRE_TOKENIZER_SPLITS", "SPECIAL_TOKENS"]

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types

# the wrapper's special token -> the metadata key holding its id
SPECIAL_TOKENS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split its merges were learned on (any other: GPT-2's byte-level regex)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"], _LLAMA3),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2),
    "qwen35": _QWEN35,
    "tekken": _TEKKEN,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O),
}


def gguf_tokenizer(reader, path=None):
    """The file's tokenizer as a transformers.PreTrainedTokenizerFast (see module doc), or None; `path`:
    the file's (its built tokenizer kept in the cache: `kept_backend`)."""
    built = kept_backend(reader, path)
    if built is None:
        return None
    backend, settings = built
    return tokenizer_over(backend, **settings)


def builds(reader) -> str | None:
    """The tokenizer model this module builds for the file ("gpt2": byte-level BPE with merges; "llama":
    sentencepiece with scores, in a style `spm_style` knows), or None: the one rule `gguf_backend` and the
    native runtime's refusal (models/gguf/spec.py) read."""
    model = metadata_value(reader, "tokenizer.ggml.model")
    if model == "gpt2" and "tokenizer.ggml.merges" in reader.fields:
        return model
    if model == "llama" and "tokenizer.ggml.scores" in reader.fields and spm_style(reader) is not None:
        return model
    return None


def gguf_backend(reader):
    """(the file's `tokenizers.Tokenizer`, its settings: the special tokens by name, add_bos_token /
    add_eos_token where the file states them, the chat template), or None for a tokenizer model this
    module does not build (byte-level BPE, "gpt2", and sentencepiece, "llama"). The transformers wrapper
    (`gguf_tokenizer`) and the native runtime's (models/gguf/text.py) both take these."""
    model = builds(reader)
    tokens = metadata_value(reader, "tokenizer.ggml.tokens")
    types = metadata_value(reader, "tokenizer.ggml.token_type") or ()
    if model == "gpt2":
        backend = _byte_level_bpe(tokens, metadata_value(reader, "tokenizer.ggml.merges"),
                                  metadata_value(reader, "tokenizer.ggml.pre"))
        _add_marked_tokens(backend, tokens, types)
    elif model == "llama":
        backend = sentencepiece_backend(tokens, reader)
        _add_marked_tokens(backend, tokens, types, byte_level=False)
    else:
        return None
    ids = {name: metadata_value(reader, key) for name, key in SPECIAL_TOKENS.items()}
    specials = {name: tokens[i] if i is not None else None for name, i in ids.items()}
    extra = {key: value for key in ("add_bos_token", "add_eos_token")
             if (value := metadata_value(reader, f"tokenizer.ggml.{key}")) is not None}
    if model == "llama":
        extra.setdefault("add_bos_token", True)  # llama.cpp adds BOS to a sentencepiece vocabulary unless told
    return backend, {"chat_template": metadata_value(reader, "tokenizer.chat_template"), **specials, **extra}


TOKENIZER_KEPT = "tokenizer-2"  # the cache's memo of a file's built tokenizer (-2: kept as tokenizer_blob.py's bytes)


def kept_backend(reader, path=None):
    """gguf_backend(reader), built once per file: the built `tokenizers.Tokenizer` (as tokenizer_blob.py's bytes,
    with their xxh3) and settings are kept in the cache for the file as it is (files/cache.py's `file_memo` /
    `kept_path`: path, size, mtime_ns), so a warm load reads them back (Llama 3's 128K vocabulary and merges:
    about half the build's time; Gemma 3's 262K: 0.46 s where its JSON took 0.70); a write to the file, or a kept
    copy that no longer matches its hash or does not read back, builds it again. path None: built, not kept."""
    from gatherlens.models.files.cache import file_memo
    from gatherlens.models.gguf.tokenizer_blob import from_blob

    memo = file_memo(path, TOKENIZER_KEPT) if path is not None else None
    if isinstance(memo, dict) and Path(memo.get("kept", "")).is_file():
        try:
            import xxhash

            blob = Path(memo["kept"]).read_bytes()
            if xxhash.xxh3_128_hexdigest(blob) == memo.get("xxh3"):
                return from_blob(blob), memo["settings"]
        except Exception:  # noqa: BLE001 - a damaged kept copy is built again
            pass
    built = gguf_backend(reader)
    if built is not None and path is not None:
        _keep(path, built)
    return built


def _keep(path, built) -> None:
    """Write the built tokenizer's bytes where the cache keeps them for this file (a temporary of this process's,
    replaced whole) and remember them with their hash and settings; best effort (an unwritable cache only costs
    a build next time)."""
    import json
    import os

    import xxhash

    from gatherlens.models.files.cache import kept_path, remember
    from gatherlens.models.gguf.tokenizer_blob import to_blob

    target = kept_path(path, TOKENIZER_KEPT, ".bin")
    try:
        json.dumps(built[1])  # settings that JSON cannot hold are not kept
        blob = to_blob(built[0])
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(blob)
        temporary.replace(target)
        remember(path, TOKENIZER_KEPT, {"kept": str(target), "xxh3": xxhash.xxh3_128_hexdigest(blob), "settings": built[1]})
    except (OSError, TypeError, ValueError):
        pass


def load_gguf_tokenizer(path, reader):
    """gguf_tokenizer(reader), else transformers' `AutoTokenizer.from_pretrained(folder, gguf_file=)` on `path`,
    handed the metadata `reader` already parsed (`hf_adapter.gguf_tokenizer_from_metadata`): one parse a load."""
    tokenizer = gguf_tokenizer(reader, path)
    if tokenizer is None:
        from gatherlens.models.hf_adapter import gguf_tokenizer_from_metadata

        tokenizer = gguf_tokenizer_from_metadata(Path(path), _as_transformers_reads(reader),
                                                 tuple(t.name for t in reader.tensors))
    return tokenizer


KEPT_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")  # the string arrays transformers reads in full


def _as_transformers_reads(reader) -> dict:
    """Every metadata value as transformers' own GGUF reader gives it: a string array other than
    KEPT_ARRAYS as its length, everything else as Python data."""
    from gguf import GGUFValueType

    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own header fields (version, counts), not metadata
            continue
        strings = field.types[:2] == [GGUFValueType.ARRAY, GGUFValueType.STRING]
        out[key] = len(field.data) if strings and key not in KEPT_ARRAYS else field.contents()
    return out


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the vocabulary of a byte-level BPE is written in it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    spelling = {b: chr(b) for b in printable}
    spelling.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return spelling


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None):
    """The `tokenizers.Tokenizer`: BPE over the byte-spelled vocabulary, byte-level pre-tokenizer and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): i
             for i, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ")) for merge in merges]
    backend = Tokenizer(BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                  use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _add_marked_tokens(backend, tokens: list[str], types, byte_level: bool = True) -> None:
    """CONTROL tokens as special added tokens (in a byte-level vocabulary one spelled outside the byte
    alphabet is a llama.cpp mislabel, skipped), USER_DEFINED ones in the vocabulary as plain added
    tokens: both stay whole."""
    from tokenizers import AddedToken

    alphabet = set(_byte_alphabet().values())
    control = [AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, types)
               if kind == CONTROL and (not byte_level or set(t) <= alphabet)]
    marked = [t for t, kind in zip(tokens, types) if kind == USER_DEFINED]
    vocab = backend.get_vocab() if marked else {}  # a dict of every token: only when some are marked
    user = [AddedToken(t, normalized=False, special=False) for t in marked if t in vocab]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
