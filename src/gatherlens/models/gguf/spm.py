"""A SentencePiece ("llama") vocabulary of a GGUF as a `tokenizers` BPE: its merges recovered fast.

    >>> merges = spm_merges(tokens, scores)              # [("▁t", "he"), ...]: best first
    >>> backend = sentencepiece_backend(tokens, reader)  # a tokenizers.Tokenizer (models/gguf/tokenizer.py)

A SentencePiece file lists tokens and scores but no merges. transformers' GGUF converter recovers them
(`generate_merges`, the reference): every split of a token into two tokens that are both in the
vocabulary is a merge, ranked by the token's score (high first), then by the longer left piece, the
longer right piece, and vocabulary order. Trying every split of Gemma 3's 262,144 tokens with string
slices and dictionary lookups costs seconds of Python; here the splits are found with arrays:
each token's characters become code points, a polynomial hash of every prefix comes from one
cumulative sum (mod 2**64, scaled by powers of the base's inverse), a suffix's hash from its token's
and its prefix's, and a split is a candidate when both hashes are tokens' hashes (`np.searchsorted`).
Candidates are then checked with the strings themselves, so a hash collision can add nothing; no
true split is missed (equal strings hash equal). Tokens go through in chunks, bounding the arrays.
A file's merges are kept under the cache root (`spm-merges/<hash of tokens, scores, rule>.npy`: token
index and cut of each), so a warm load only rebuilds the pairs; the key cannot go stale.
"""
from __future__ import annotations

import os

import numpy as np

from gatherlens.models.gguf.config import metadata_value

__all__ = ["spm_merges", "sentencepiece_backend", "spm_style", "GEMMA_ARCHS", "SPACE"]

SPACE = "\u2581"  # SentencePiece's spelling of a space
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")  # SentencePiece files whose merge order is the token order
_BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_CHUNK = 1 << 16  # tokens hashed at a time


def _powers(base: int, count: int) -> np.ndarray:
    """base ** i mod 2**64 for i < count, (count,) uint64."""
    out = np.empty(count, np.uint64)
    value = 1
    for i in range(count):
        out[i] = value
        value = value * base % (1 << 64)
    return out


def _prefix_hashes(tokens: list[str], power: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lengths (T,), the hash of every prefix (C,), in token order) for the C characters of `tokens`:
    the prefix of k + 1 characters hashes to B**k * sum_{i<=k} c_i B**-i (mod 2**64)."""
    lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))  # (T,)
    codes = np.frombuffer("".join(tokens).encode("utf-32-le", "surrogatepass"), "<u4").astype(np.uint64)  # (C,)
    local = _local(lengths, codes.size)  # (C,)
    ends = np.cumsum(lengths)  # (T,)
    with np.errstate(over="ignore"):
        sums = np.cumsum(codes * inverse[local])  # (C,) wraps mod 2**64
        before = np.concatenate([np.zeros(1, np.uint64), sums])[ends - lengths]  # (T,): the sum before each token
        sums -= np.repeat(before, lengths)  # (C,): the sum within each token
        sums *= power[local]  # (C,): the prefix hashes
    return lengths, sums


def _local(lengths: np.ndarray, size: int) -> np.ndarray:
    """Each character's position in its token, (C,) int64."""
    return np.arange(size, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # (C,)


def _candidates(hashed: tuple[np.ndarray, np.ndarray], known, power) -> tuple[np.ndarray, np.ndarray]:
    """(token index, cut) of every split of a chunk of tokens (`_prefix_hashes`) whose two halves hash to
    tokens' hashes (`known`: `_Known`)."""
    lengths, prefix = hashed
    owner = np.repeat(np.arange(lengths.size), lengths)  # (C,)
    cut = _local(lengths, prefix.size) + 1  # (C,): the left piece's length at a cut after this char
    inner = cut < lengths[owner]  # (C,): a cut that leaves a right piece
    owner, cut, left = owner[inner], cut[inner], prefix[inner]  # (S,) each
    hit = known.has(left)  # (S,)
    owner, cut, left = owner[hit], cut[hit], left[hit]  # (S',) each
    full = prefix[np.cumsum(lengths)[owner] - 1]  # (S',): the whole token's hash
    with np.errstate(over="ignore"):
        right = full - left * power[lengths[owner] - cut]  # (S',)
    hit = known.has(right)  # (S',)
    return owner[hit], cut[hit]


class _Known:
    """The hashes of every non-empty token: sorted, behind a 2**22-bit filter of their low bits (one
    gather rules most misses out before the binary search)."""

    BITS = 22

    def __init__(self, hashed: list[tuple[np.ndarray, np.ndarray]]):
        parts = [prefix[np.cumsum(lengths)[lengths > 0] - 1] for lengths, prefix in hashed]
        self.sorted = np.unique(np.concatenate(parts)) if parts else np.zeros(1, np.uint64)  # (T',)
        self.mask = np.uint64((1 << self.BITS) - 1)
        self.filter = np.zeros(1 << self.BITS, bool)  # (2**22,)
        self.filter[(self.sorted & self.mask).astype(np.int64)] = True

    def has(self, values: np.ndarray) -> np.ndarray:
        """(S,) bool: which of `values` (S,) uint64 are tokens' hashes."""
        out = self.filter[(values & self.mask).astype(np.int64)]  # (S,): maybe
        maybe = np.flatnonzero(out)  # (S',)
        picked = values[maybe]  # (S',)
        at = np.minimum(np.searchsorted(self.sorted, picked), self.sorted.size - 1)  # (S',)
        out[maybe] = self.sorted[at] == picked
        return out


def spm_merges(tokens: list[str], scores, cache: bool = False) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies, best first (see module doc): transformers'
    `generate_merges(vocab, dict(zip(tokens, scores)))` (a repeated token: its last index and score).
    cache: keep the found merges (token index, cut) under the cache root, keyed by a hash of the
    tokens, the scores and this rule's version, and read them from there next time (a warm load of a
    262K vocabulary: the pairs only, not the search)."""
    order = list(dict.fromkeys(tokens))  # each token once, at its first occurrence (the reference's order)
    path = _cache_path(tokens, scores) if cache else None
    found = _read(path, order) if path is not None else None
    if found is None:
        found = _ranked_splits(tokens, scores, order)
        if path is not None:
            _write(path, *found)
    return [(order[o][:c], order[o][c:]) for o, c in zip(*(a.tolist() for a in found))]


def _ranked_splits(tokens: list[str], scores, order: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(index into `order`, cut) of every merge, best first."""
    vocab = {token: i for i, token in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    longest = max(map(len, order), default=0) + 1
    power, inverse = _powers(_BASE, longest), _powers(pow(_BASE, -1, 1 << 64), longest)
    starts = range(0, len(order), _CHUNK)
    hashed = [_prefix_hashes(order[s:s + _CHUNK], power, inverse) for s in starts]
    known = _Known(hashed)
    found = [_candidates(h, known, power) for h in hashed]
    owner = np.concatenate([t + s for (t, _), s in zip(found, starts)] or [[]]).astype(np.int64)  # (M,)
    cut = np.concatenate([c for _, c in found] or [[]]).astype(np.int64)  # (M,): the left piece's length
    lengths = np.concatenate([h[0] for h in hashed] or [[]]).astype(np.int64)  # (T,) of `order`
    score = np.fromiter((score_of[t] for t in order), np.float64, len(order))  # (T,)
    ranked = np.lexsort((owner, cut - lengths[owner], -cut, -score[owner]))  # best score, longer left first
    owner, cut = owner[ranked], cut[ranked]  # (M,)
    real = np.fromiter((order[o][:c] in vocab and order[o][c:] in vocab for o, c in zip(owner.tolist(), cut.tolist())),
                       bool, owner.size)  # the strings themselves: no hash collision gets by
    return owner[real], cut[real]


_VERSION = b"spm-merges-1"  # the rule's version: a change to it makes new keys


def _cache_path(tokens: list[str], scores):
    import xxhash

    from gatherlens.paths import cache_root

    digest = xxhash.xxh3_128()
    digest.update(_VERSION)
    digest.update("\x00".join(tokens).encode("utf-8", "surrogatepass"))
    digest.update(np.asarray(list(scores), np.float64).tobytes())
    return cache_root() / "spm-merges" / f"{digest.hexdigest()}.npy"


def _read(path, order: list[str]):
    """The cached (owner, cut) arrays, or None (absent, unreadable, damaged, or naming a cut no token of
    `order` has: found again)."""
    try:
        pairs = np.load(path, allow_pickle=False)  # (2, M) int64
    except (OSError, ValueError):
        return None
    if pairs.ndim != 2 or pairs.shape[0] != 2 or pairs.dtype.kind != "i":
        return None
    owner, cut = pairs
    if owner.size and (owner.min() < 0 or owner.max() >= len(order)):
        return None
    lengths = np.fromiter(map(len, order), np.int64, len(order))  # (T,)
    return (owner, cut) if owner.size == 0 or ((cut >= 1) & (cut < lengths[owner])).all() else None


def _write(path, owner: np.ndarray, cut: np.ndarray) -> None:
    """Keep them (written aside, then renamed: a reader never sees half a file); an unwritable cache is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        np.save(tmp, np.stack([owner, cut]))
        os.replace(tmp, path)
    except OSError:
        pass


def spm_style(reader) -> str | None:
    """"gemma" (GemmaTokenizer's shape), "llama" (LlamaTokenizer's) or None (Phi-3: transformers builds it)."""
    arch = metadata_value(reader, "general.architecture")
    if arch in GEMMA_ARCHS:
        return "gemma"
    return None if arch == "phi3" else "llama"


def sentencepiece_backend(tokens: list[str], reader):
    """The `tokenizers.Tokenizer` transformers' GGUF converter builds for a sentencepiece vocabulary:
    BPE with byte fallback over merges recovered from the scores (Gemma: from the token order, a
    token of spaces spelled with U+2581), Gemma's or Llama's normalizer, pre-tokenizer and decoder."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    gemma = spm_style(reader) == "gemma"
    if gemma:
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        merges = spm_merges(tokens, range(0, -len(tokens), -1), cache=True)
    else:
        merges = spm_merges(tokens, metadata_value(reader, "tokenizer.ggml.scores"), cache=True)
    unk = metadata_value(reader, "tokenizer.ggml.unknown_token_id")
    model = BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, dropout=None, fuse_unk=True,
                byte_fallback=True, unk_token=tokens[unk] if gemma and unk is not None else None)
    backend = Tokenizer(model)
    fallback = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", SPACE)
        backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        backend.decoder = decoders.Sequence(fallback)
        return backend
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence(fallback + [decoders.Strip(content=" ", left=1)])
    return backend
