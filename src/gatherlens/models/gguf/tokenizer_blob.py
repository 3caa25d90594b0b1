"""A built `tokenizers.Tokenizer` as the cache keeps it: bytes that read back faster than its JSON.

    >>> blob = to_blob(tokenizer)              # models/gguf/tokenizer.py's kept_backend writes these
    >>> from_blob(blob).to_str() == tokenizer.to_str()
    True

Why: `Tokenizer.from_str` parses a model through serde_json's Value tree, so Gemma 3's 262,144 tokens
and 324,301 merges take ~0.70 s to read back from the 12 MB JSON (0.31 s of it the vocabulary alone).
A BPE model is kept as Python data instead (marshal: its vocabulary dict and merges as pairs) and
handed to `tokenizers.models.BPE`, beside the tokenizer's JSON without them (normalizer,
pre-tokenizer, decoder, post-processor, the model's settings) and its added tokens, added back last
so that each takes its vocabulary id: ~0.46 s for Gemma 3's (Intel Xeon, AVX-512 host, stop 49),
the same tokenizer (`to_str` equal: checked once when it is kept, else the JSON is kept). Any other model
(Unigram, WordPiece, a BPE whose merges are kept as "a b" strings) is kept as its JSON whole.
"""
from __future__ import annotations

import json
import marshal

__all__ = ["to_blob", "from_blob"]

BPE_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                "byte_fallback", "ignore_merges")  # models.BPE's keyword arguments, as its JSON names them
ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")  # AddedToken's, as the JSON names them


def to_blob(tokenizer) -> bytes:
    """The tokenizer as kept (see the module doc): ("bpe", rest JSON, vocab, merges, added) or ("json", JSON)."""
    whole = tokenizer.to_str()
    data = json.loads(whole)
    model = data.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not isinstance(merges, list) or not all(isinstance(m, list) for m in merges):
        return marshal.dumps(("json", whole))
    vocab, pairs, added = model["vocab"], [tuple(m) for m in merges], data.get("added_tokens") or []
    rest = {**data, "model": {**model, "vocab": {}, "merges": []}, "added_tokens": []}
    blob = marshal.dumps(("bpe", json.dumps(rest), vocab, pairs, added))
    if json.loads(from_blob(blob).to_str()) != data:  # read back as another tokenizer (an added token's id moved)
        return marshal.dumps(("json", whole))
    return blob


def from_blob(blob: bytes):
    """to_blob's tokenizer back. A blob that is not one (another Python's marshal, damaged bytes) raises
    ValueError, EOFError or TypeError: the caller builds the tokenizer again."""
    from tokenizers import AddedToken, Tokenizer, models

    parts = marshal.loads(blob)
    if parts[0] == "json":
        return Tokenizer.from_str(parts[1])
    _, rest, vocab, pairs, added = parts
    settings = json.loads(rest)["model"]
    tokenizer = Tokenizer.from_str(rest)
    tokenizer.model = models.BPE(vocab, pairs, **{k: settings[k] for k in BPE_SETTINGS if settings.get(k) is not None})
    tokenizer.add_tokens([AddedToken(a["content"], **{k: a[k] for k in ADDED_FLAGS if k in a}) for a in added])
    return tokenizer
