"""A GGUF's tokenizer for the native runtime: `tokenizers` alone, no transformers module.

    >>> tok = text_tokenizer(reader)                 # reader: open_gguf(path)
    >>> tok("The cat", return_tensors="pt")["input_ids"], tok.eos_token_id
    (tensor([[504, 2644]]), 2)
    >>> tok.decode([504, 2644], skip_special_tokens=True)
    'The cat'

The backend is the one models/gguf/tokenizer.py builds for transformers' PreTrainedTokenizerFast
(`gguf_backend`: the vocabulary, merges, pre-tokenizer, decoder and marked tokens of the file); this
wrapper adds what the generation loop reads of a transformers tokenizer: `__call__` / `encode` (the
file's BOS before the text where it says add_bos_token, its EOS after where add_eos_token, as the
transformers wrapper's template does), `decode`, the special tokens and their ids, the chat template's
text. Importing transformers' tokenizer classes costs what its model code costs (~170 MB, seconds);
this costs nothing beyond `tokenizers`. tests/test_native_runtime.py checks it gives the transformers
wrapper's ids and text.
"""
from __future__ import annotations

import torch

from gatherlens.models.gguf.tokenizer import kept_backend

__all__ = ["TextTokenizer", "text_tokenizer"]


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the special tokens and BOS / EOS rule of its file (see the module doc)."""

    def __init__(self, backend, bos_token=None, eos_token=None, unk_token=None, pad_token=None,
                 add_bos_token: bool = False, add_eos_token: bool = False, chat_template: str | None = None):
        self.backend = backend
        self.bos_token, self.eos_token, self.unk_token, self.pad_token = bos_token, eos_token, unk_token, pad_token
        self.add_bos_token, self.add_eos_token, self.chat_template = bool(add_bos_token), bool(add_eos_token), chat_template

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`: BOS first and EOS last where the file asks for them (add_special_tokens)."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        if add_special_tokens and self.add_eos_token and self.eos_token_id is not None:
            ids = [*ids, self.eos_token_id]
        return ids

    def __call__(self, text: str | list[str], return_tensors: str | None = None, add_special_tokens: bool = True,
                 truncation: bool | None = None, **unused) -> dict:
        """{"input_ids": ...} as a transformers tokenizer gives it: a list (of lists for a list of texts), or
        with return_tensors="pt" a (B, S) int64 tensor (texts of one length). truncation: none is done."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t, add_special_tokens) for t in texts]
        if return_tensors == "pt":
            return {"input_ids": torch.tensor(ids, dtype=torch.long)}  # (B, S)
        return {"input_ids": ids[0] if isinstance(text, str) else ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.reshape(-1).tolist() if hasattr(ids, "reshape") else [int(i) for i in ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"TextTokenizer(vocab={len(self)}, bos={self.bos_token!r}, eos={self.eos_token!r})"


def text_tokenizer(reader, path=None) -> TextTokenizer | None:
    """The file's TextTokenizer, or None for a tokenizer model models/gguf/tokenizer.py does not build;
    `path`: the file's (its built tokenizer kept in the cache, `kept_backend`)."""
    built = kept_backend(reader, path)
    if built is None:
        return None
    backend, settings = built
    return TextTokenizer(backend, **settings)
