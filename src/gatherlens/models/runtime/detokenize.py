"""Text of a generation as it grows, one piece per new token (the one incremental detokenizer).

    >>> detok = Detokenizer(lm.tokenizer, context=prompt_ids[-6:])   # the prompt's end: spaces come out right
    >>> detok.push(2991), detok.push(3458)
    (' mat', ' and')
    >>> detok.text
    ' mat and'

Decoding only the new ids would lose the space before the first new word for SentencePiece
and WordPiece tokenizers (they drop a leading space at the start of what they decode), and
decoding everything again at every step costs O(n) per token. This keeps a short window: each
step decodes the ids since the last emitted piece, together with the tokens just before them,
and emits only what they add. A byte-level token that ends in the middle of a UTF-8 character
adds nothing (the piece is "") until the character is complete, so `text` never holds a
replacement character that a later token would change; a character still incomplete when the
generation ends is left out. Special tokens (end of text) add nothing: skip_special_tokens.
The concatenation of the pieces is `text`.
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["Detokenizer", "CONTEXT_TOKENS"]

CONTEXT_TOKENS = 6  # prompt tokens to seed the window with: enough for any tokenizer's merge of spaces


class Detokenizer:
    """Feed token ids with `push(id)`; each returns the text it added; `text` is all of it."""

    def __init__(self, tokenizer, context: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.ids = [int(i) for i in context]
        self.start = 0              # the window: ids[start:] are decoded together
        self.done = len(self.ids)   # ids[:done] are already in the text (or are the context)
        self.text = ""

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one generated token; the text it completes ("" while a character is incomplete)."""
        self.ids.append(int(token_id))
        before = self.decode(self.ids[self.start:self.done])
        after = self.decode(self.ids[self.start:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        piece = after[len(before):]
        self.start, self.done = self.done, len(self.ids)
        self.text += piece
        return piece
