"""The one rule for an integer a user types (an API query parameter, a command-line option) and
for a position counted from the end: ASCII digits with an optional leading "-", one range wording.

    >>> parse_int("12", "k", 1, 4096)
    12
    >>> parse_int("²", "run_k", 1, 4096)
    Traceback (most recent call last):
    GatherValueError: run_k = '²' is not an integer; give one in [1, 4096]
    >>> parse_int("0", "--threads", 1, 2)
    GatherValueError: --threads = 0 is outside the valid range [1, 2]
    >>> layer_index(-31, 30)
    GatherIndexError: layer -31 is outside the model's layers [-30, 30): there are 30 layers (negative ...

`str.isdigit()` and `int()` accept more than a user means ('²', '٣', '1_000', ' +4'); this
module accepts `-?[0-9]+` only. A range is written `[lo, hi]` ("inf" where open). A position
counted from the end (a layer, a head, a query) lies in [-n, n) and is returned in [0, n).
"""
from __future__ import annotations

import math
import os
import re

import click

from gatherlens.errors import GatherIndexError, GatherValueError, shorten

__all__ = ["parse_int", "check_int", "span", "from_end", "layer_index", "head_index", "query_index", "Int",
           "cpu_count", "int_list", "positive_ints", "budget_list", "Real"]

_INT = re.compile(r"-?[0-9]+")   # ASCII only: [0-9], not \d
_MOST_DIGITS = 30                 # longer is outside any range (and int() of 5,000 digits is refused)


def span(lo: int | None, hi: int | None) -> str:
    """The valid range as every message writes it.

    >>> span(1, 4096), span(1, None), span(None, None)
    ('[1, 4096]', '[1, inf)', '(-inf, inf)')
    """
    return f"{'(-inf' if lo is None else f'[{lo}'}, {'inf)' if hi is None else f'{hi}]'}"


def check_int(value: int, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """`value` when lo <= value <= hi (None: open), else a GatherValueError naming `name` and the range."""
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise GatherValueError(f"{name} = {shorten(value)} is outside the valid range {span(lo, hi)}")
    return value


def parse_int(raw: str, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """The int a user typed (ASCII digits, an optional leading "-"; spaces around are ignored),
    checked against [lo, hi]; a GatherValueError naming `name`, the text and the range otherwise."""
    text = raw.strip(" \t") if isinstance(raw, str) else raw
    if not isinstance(text, str) or not _INT.fullmatch(text):
        way = "write it with the digits 0-9 and an optional leading -" if lo is None and hi is None \
            else f"give one in {span(lo, hi)}"
        raise GatherValueError(f"{name} = {shorten(str(raw))} is not an integer; {way}")
    if len(text.lstrip("-")) > _MOST_DIGITS:
        raise GatherValueError(f"{name} = {shorten(text)} is outside the valid range {span(lo, hi)}")
    return check_int(int(text), name, lo, hi)


def from_end(value: int, n: int, name: str, among: str, why: str) -> int:
    """`value` in [-n, n) as an index in [0, n) (negatives count from the end), else a
    GatherIndexError: "{name} {value} is outside {among} [-n, n): {why} (negative counts from the end)"."""
    if not -n <= value < n:
        raise GatherIndexError(f"{name} {shorten(value)} is outside {among} [{-n}, {n}): {why} "
                               f"(negative counts from the end)")
    return value % n


def layer_index(layer: int, n_layers: int) -> int:
    """A layer of a model with `n_layers` attention layers (what the report and the explorer check)."""
    return from_end(layer, n_layers, "layer", "the model's layers", f"there are {n_layers} layers")


def head_index(head: int, n_heads: int, layer: int) -> int:
    """A query head of `layer`, which has `n_heads`."""
    return from_end(head, n_heads, "head", "the query heads", f"there are {n_heads} heads in layer {layer}")


def query_index(query: int, n_tokens: int) -> int:
    """A query position of a text of `n_tokens` tokens."""
    return from_end(query, n_tokens, "query", "the token positions", f"the text has {n_tokens} tokens")


class Int(click.ParamType):
    """click's type of every int option and argument: `gatherlens.params.parse_int`'s rule (ASCII
    digits, an optional "-") and its one wording, `Error: --threads = 999 is outside the valid
    range [1, 16]`. `Int(1)` is [1, inf); `Int(1, 64)` is [1, 64]; `Int()` any int."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        name = max(param.opts, key=len) if param is not None and param.opts else "value"
        try:
            if isinstance(value, int) and not isinstance(value, bool):   # a default, or a caller's int
                return check_int(value, name, self.lo, self.hi)
            return parse_int(value, name, self.lo, self.hi)
        except GatherValueError as e:
            raise click.UsageError(str(e), ctx) from None


def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the system tells it): --threads' ceiling."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def int_list(value: str, hint: str, lo: int | None = None, hi: int | None = None) -> list[int]:
    """"3,1,4" -> [3, 1, 4]: each item by `parse_int`'s rule (spaces and empty items ignored); one
    click error naming `hint` and the bad item otherwise."""
    try:
        return [parse_int(s, hint, lo, hi) for s in value.split(",") if s.strip(" \t")]
    except GatherValueError as e:
        kind = "positive integers" if lo == 1 else "integers"
        raise click.UsageError(f"{hint} = {shorten(value)} must be comma-separated {kind}: "
                               f"{str(e).removeprefix(f'{hint} = ')}") from None


def positive_ints(value: str, hint: str, what: str, hi: int | None = None) -> list[int]:
    """"8,32,128" -> [8, 32, 128] (sorted, unique, each in [1, hi]); a clear error for anything else, an
    empty list included."""
    values = sorted(set(int_list(value, hint, lo=1, hi=hi)))
    if not values:
        raise click.BadParameter(f"{value!r}: give at least one {what}, like 8,32,128", param_hint=hint)
    return values


def budget_list(value: str, hint: str, hi: int | None = None) -> list:
    """"auto,512,256" -> ["auto", 256, 512] ("auto" first, then the ints sorted, unique, each in [1, hi]);
    a clear error else (sparse budgets: SparseConfig's budget "auto" or tokens)."""
    words = [w.strip() for w in value.split(",")]
    auto = ["auto"] if "auto" in (w.lower() for w in words) else []
    rest = ",".join(w for w in words if w.lower() != "auto")
    return auto + (positive_ints(rest, hint, 'budget (or "auto")', hi=hi) if rest or not auto else [])


class Real(click.FloatRange):
    """click's FloatRange, refusing NaN and inf (FloatRange lets NaN through: every comparison with it is
    false): `Real(0, 1, min_open=True)` is (0, 1]."""

    name = "number"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; give one in {self._describe_range()}", param, ctx)
        return number
