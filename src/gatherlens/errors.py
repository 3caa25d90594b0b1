"""The project's one family of errors.

Every message names the argument, the bad value, where it is, and the valid range::

    >>> raise GatherIndexError("token id 50257 at position (3, 17) is outside the vocabulary [0, 50257)")

`GatherLensError` is the class to catch. Its three subclasses also derive from the built-in
exception a Python user expects for that kind of mistake, so `except IndexError` keeps working.
"""
from __future__ import annotations

__all__ = [
    "GatherLensError",
    "GatherIndexError",
    "GatherTypeError",
    "GatherValueError",
    "GatherLensWarning",
    "position_of",
    "shorten",
]


class GatherLensError(Exception):
    """Base class of every error gatherlens raises on bad input."""


class GatherIndexError(GatherLensError, IndexError):
    """An index (token id, key index, page, dim) outside its valid range."""


class GatherTypeError(GatherLensError, TypeError):
    """An argument of the wrong kind: float ids, a non-tensor, a non-int top_k."""


class GatherValueError(GatherLensError, ValueError):
    """An argument of the right kind but a bad value or shape: a 3-D table, mismatched shapes."""


class GatherLensWarning(UserWarning):
    """Something about the environment the user should fix (shown once, as one line)."""


def shorten(value, limit: int = 40) -> str:
    """repr() of a user's input for an error message, cut to `limit` characters with '…'.

    >>> shorten("9" * 5000)
    "'9999999999999999999999999999999999999999…' (5,000 characters)"
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    cut = repr(text[:limit])
    return f"{cut[:-1]}…{cut[-1]} ({len(text):,} characters)"


def position_of(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The coordinate of element `flat_index` in a row-major tensor of `shape`.

    >>> position_of(7, (2, 4))
    (1, 3)
    """
    coord = []
    for size in reversed(shape):
        coord.append(flat_index % size if size else 0)
        flat_index //= size if size else 1
    return tuple(reversed(coord))
