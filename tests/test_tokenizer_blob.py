"""models/gguf/tokenizer_blob.py: a kept tokenizer reads back as the same tokenizer (its JSON equal, its ids
equal), a BPE through models.BPE, any other model through its JSON; damaged bytes raise, never a wrong one."""
from __future__ import annotations

import json
import marshal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from gatherlens.models import resolve
from gatherlens.models.gguf.config import open_gguf
from gatherlens.models.gguf.tokenizer import gguf_backend
from gatherlens.models.gguf.tokenizer_blob import from_blob, to_blob

ODD = "Ünïcödé — “quotes”, 日本語 😀;  two  spaces,\ttabs\n\nlines <ctl> x<user>y <bos>hi   "


def _spm_like() -> Tokenizer:
    """A sentencepiece-style BPE as models/gguf/spm.py builds one: byte fallback, fused unknowns, ▁ for spaces,
    a special and a plain added token with their flags, a post-processor adding <bos> by id."""
    pieces = ["<unk>", "<bos>", "<ctl>", "<user>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "t", "h", "e", "a", "s", "th", "▁th", "▁the", "he", "as", "▁a", "▁as", "x", "y", "i", "▁h", "▁hi"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("t", "h"), ("▁", "th"), ("▁th", "e"), ("h", "e"), ("a", "s"), ("▁", "a"), ("▁a", "s"), ("▁", "h"), ("▁h", "i")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken("<ctl>", special=True, normalized=False),
                    AddedToken("<user>", special=False, normalized=False, lstrip=True, single_word=True)])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return tok


def _wordpiece() -> Tokenizer:
    vocab = {t: i for i, t in enumerate(["[UNK]", "[CLS]", "the", "##s", "cat", "a"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


@pytest.mark.parametrize("make", [_spm_like, _wordpiece, lambda: gguf_backend(open_gguf(resolve("smollm2").path))[0]],
                         ids=["spm-like BPE", "WordPiece", "SmolLM2's byte-level BPE"])
def test_a_kept_tokenizer_reads_back_as_the_same_tokenizer(make):
    tok = make()
    blob = to_blob(tok)
    back = from_blob(blob)
    assert json.loads(back.to_str()) == json.loads(tok.to_str())
    assert back.encode(ODD).ids == tok.encode(ODD).ids
    assert back.decode(tok.encode(ODD).ids, skip_special_tokens=True) == tok.decode(tok.encode(ODD).ids,
                                                                                     skip_special_tokens=True)
    kind = marshal.loads(blob)[0]
    assert kind == ("json" if make is _wordpiece else "bpe")  # a BPE's vocabulary and merges kept as data


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("the as hi xy\t\n😀<ctl><user>é")), max_size=60))
def test_a_kept_bpe_gives_the_ids_of_the_built_one_on_any_text(text):
    tok = _spm_like()
    back = from_blob(to_blob(tok))
    assert back.encode(text).ids == tok.encode(text).ids
    assert back.encode(text).offsets == tok.encode(text).offsets


def test_damaged_bytes_raise_rather_than_give_another_tokenizer():
    blob = to_blob(_spm_like())
    with pytest.raises((ValueError, EOFError, TypeError)):
        from_blob(blob[: len(blob) // 2])
    with pytest.raises((ValueError, EOFError, TypeError)):
        from_blob(b"not a tokenizer")


def test_a_bpe_that_would_read_back_otherwise_is_kept_as_its_json(monkeypatch):
    """to_blob checks the BPE form reads back as the same tokenizer; where it would not (here: added tokens
    made to come back without their flags), the JSON is kept whole."""
    import gatherlens.models.gguf.tokenizer_blob as tb

    tok = _spm_like()
    monkeypatch.setattr(tb, "ADDED_FLAGS", ())  # the flags dropped on the way back: <user> loses lstrip
    kind, whole = marshal.loads(to_blob(tok))
    assert kind == "json" and json.loads(whole) == json.loads(tok.to_str())
