"""Tokenizer vocabularies of the real sizes for the bench's model files (bench/model_files.py).

    >>> v = bpe_vocab(151_936, regular=151_643, specials=QWEN_SPECIALS, pre="qwen2")   # Qwen2.5's shape
    >>> len(v.tokens), len(v.merges), v.model
    (151936, 151387, 'gpt2')
    >>> v = spm_vocab(262_144, specials=GEMMA_SPECIALS)                                 # Gemma 3's shape
    >>> v.model, len(v.scores)
    ('llama', 262144)

A random-weight model still needs a tokenizer of its vocabulary's size, with its merges or scores,
because loading that is part of what the bench measures (a 262K-token list and its merges parse and
build in seconds, or not). The vocabularies start from a real one where it is installed (SmolLM2's
byte-level BPE: 49K tokens and 48,900 merges, so English text tokenizes as it would), then grow by
*synthetic merges*: two tokens already in the vocabulary joined into a new one, each with its merge
(BPE) or a score below every earlier one (SentencePiece-style "llama" files, where llama.cpp merges
the best-scored pair). Every token is reachable, every merge well formed: llama.cpp and
tokenizers accept them. Deterministic for a seed. Without SmolLM2 (`base=False`, the tests) the start
is the 256 byte tokens alone.

Layouts follow the real files: Qwen2.5 (151,643 byte-level tokens, 22 control tokens, padding
`[PAD{i}]` up to 151,936 as llama.cpp's convert writes it), Llama 3 (128,000 + 256 control tokens),
Gemma 3 (SentencePiece: <pad> <eos> <bos> <unk> <mask> and two turn markers first, the 256
`<0xNN>` byte tokens, then pieces spelled with U+2581 for a space).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["Vocab", "bpe_vocab", "spm_vocab", "QWEN_SPECIALS", "LLAMA3_SPECIALS", "GEMMA_SPECIALS", "SPACE"]

NORMAL, CONTROL, UNUSED, BYTE = 1, 3, 5, 6  # llama.cpp's token types (gguf.TokenType)
SPACE = "\u2581"  # SentencePiece's spelling of a space

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
                   *(f"<|reserved_special_token_{i}|>" for i in range(3, 248)))
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as a GGUF states it: `tokenizer.ggml.model` ("gpt2" or "llama"), `.pre`, the token
    list with types, merges (gpt2) or scores (llama), the special ids and whether a BOS is prepended."""

    model: str
    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str] | None
    scores: list[float] | None
    bos: int
    eos: int
    pad: int | None
    unk: int | None
    add_bos: bool

    def write(self, writer) -> None:
        """Add every tokenizer key to a `gguf.GGUFWriter`."""
        writer.add_tokenizer_model(self.model)
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        if self.merges is not None:
            writer.add_token_merges(self.merges)
        if self.scores is not None:
            writer.add_token_scores(self.scores)
        writer.add_bos_token_id(self.bos)
        writer.add_eos_token_id(self.eos)
        if self.pad is not None:
            writer.add_pad_token_id(self.pad)
        if self.unk is not None:
            writer.add_unk_token_id(self.unk)
        writer.add_add_bos_token(self.add_bos)
        if self.model == "llama":
            writer.add_add_space_prefix(False)


@functools.cache
def byte_spelling() -> tuple[str, ...]:
    """GPT-2's printable spelling of the 256 bytes (a byte-level BPE's tokens are written in it)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    spelled = {b: chr(b) for b in keep} | {b: chr(256 + n) for n, b in enumerate(shifted)}
    return tuple(spelled[b] for b in range(256))


def _smollm2_bpe() -> tuple[list[str], list[str]]:
    """SmolLM2's byte-level tokens (its normal ones, in order) and merges, or the 256 bytes alone."""
    try:
        from gatherlens.models.files.registry import resolve
        from gatherlens.models.gguf.config import metadata_value, open_gguf

        reader = open_gguf(resolve("smollm2").path)
    except Exception:  # noqa: BLE001 - not installed: the byte alphabet alone
        return list(byte_spelling()), []
    tokens = metadata_value(reader, "tokenizer.ggml.tokens")
    types = metadata_value(reader, "tokenizer.ggml.token_type")
    keep = [t for t, kind in zip(tokens, types) if kind == NORMAL]
    return keep, list(metadata_value(reader, "tokenizer.ggml.merges"))


def _grow(tokens: list[str], count: int, rng, pool: int = 20_000) -> list[tuple[str, str]]:
    """`count` synthetic merges: pairs of tokens already present (among the first `pool`), each joined
    into a new token appended to `tokens` (in place); the pairs in order."""
    seen, pairs = set(tokens), []
    while len(pairs) < count:
        n = min(pool, len(tokens))
        for a, b in rng.integers(0, n, size=(max(count - len(pairs), 64), 2)):
            left, right = tokens[a], tokens[b]
            joined = left + right
            if joined in seen or len(joined) > 16:
                continue
            seen.add(joined)
            tokens.append(joined)
            pairs.append((left, right))
            if len(pairs) == count:
                break
    return pairs


def bpe_vocab(size: int, regular: int, specials, pre: str, bos: int | None = None, eos: int | None = None,
              add_bos: bool = False, base: bool = True, seed: int = 0) -> Vocab:
    """A byte-level BPE ("gpt2") of `size` tokens: `regular` byte-level tokens with their merges, then
    `specials` (CONTROL), then `[PAD{i}]` (UNUSED) up to `size`. bos / eos default to the first special."""
    if regular + len(specials) > size:
        raise ValueError(f"regular {regular} + {len(specials)} specials exceed size {size}")
    tokens, merges = _smollm2_bpe() if base else (list(byte_spelling()), [])
    tokens, merges = _trim(tokens, merges, regular)
    pairs = _grow(tokens, regular - len(tokens), np.random.default_rng(seed))
    merges = merges + [f"{a} {b}" for a, b in pairs]
    pad = [f"[PAD{i}]" for i in range(regular + len(specials), size)]
    types = [NORMAL] * regular + [CONTROL] * len(specials) + [UNUSED] * len(pad)
    first = regular
    return Vocab("gpt2", pre, tokens + list(specials) + pad, types, merges, None,
                 first if bos is None else bos, first if eos is None else eos, first, None, add_bos)


def _trim(tokens: list[str], merges: list[str], regular: int) -> tuple[list[str], list[str]]:
    """The first `regular` base tokens (the 256 bytes always kept) and the merges among them."""
    if len(tokens) <= regular:
        return tokens, merges
    kept = tokens[:max(regular, 256)]
    inside = set(kept)
    return kept, [m for m in merges if "".join(m.split(" ")) in inside and all(p in inside for p in m.split(" "))]


def _spm_pieces(base: bool) -> list[str]:
    """SentencePiece pieces from the byte-level base: each token's text with U+2581 for a space
    (tokens that are not whole UTF-8 text, or hold a NUL, dropped), in the base's order."""
    tokens, _ = _smollm2_bpe() if base else (list(byte_spelling()), [])
    decode = {c: b for b, c in enumerate(byte_spelling())}
    pieces, seen = [], set()
    for token in tokens:
        try:
            text = bytes(decode[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        piece = text.replace(" ", SPACE)
        if piece and "\x00" not in piece and piece not in seen:  # llama.cpp reads tokens as C strings
            seen.add(piece)
            pieces.append(piece)
    return pieces


def spm_vocab(size: int, specials=GEMMA_SPECIALS, pre: str = "default", base: bool = True, seed: int = 0) -> Vocab:
    """A SentencePiece-style vocabulary ("llama"): `specials` (CONTROL; <unk> and <bos> / <s>, <eos> /
    </s> among them, Gemma's or Llama 2's), the 256 byte tokens, then pieces scored by rank down to `size`."""
    head = list(specials)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    pieces = _spm_pieces(base)[:size - len(head) - 256]
    _grow(pieces, size - len(head) - 256 - len(pieces), np.random.default_rng(seed))
    tokens = head + byte_tokens + pieces
    types = [CONTROL] * len(head) + [BYTE] * 256 + [NORMAL] * len(pieces)
    scores = [0.0] * (len(head) + 256) + [-float(i) for i in range(len(pieces))]
    ids = {t: i for i, t in enumerate(head)}
    types[ids["<unk>"]] = 2  # UNKNOWN, as Gemma's and Llama's files mark it
    bos, eos = ids.get("<bos>", ids.get("<s>")), ids.get("<eos>", ids.get("</s>"))
    return Vocab("llama", pre, tokens, types, None, scores, bos, eos, ids.get("<pad>"), ids["<unk>"], True)
