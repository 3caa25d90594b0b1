"""Query parameters of the API -> checked values; a bad one is a GatherValueError naming it.

    >>> p = explain_params({"text": "The cat sat", "k": "4"}, ServeSettings())
    >>> p.text, p.k, p.topk, p.layer
    ('The cat sat', 4, True, None)
    >>> explain_params({"text": "x", "k": "0"}, ServeSettings())
    Traceback (most recent call last):
    GatherValueError: k = 0 is outside the valid range [1, 4096]

The app answers such an error with 400 and {"error": message}. Range checks that need the
model (layer, head, query, text length in tokens) are made by gatherlens.report.collect, whose
messages name the range too ("layer 999 is outside the model's layers [-30, 30): there are 30
layers (negative counts from the end)"), with gatherlens.params' position rule; GET /api/attention
checks its kept run with the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from gatherlens.errors import GatherValueError
from gatherlens.i18n import check_lang
from gatherlens.params import parse_int
from gatherlens.serve.settings import ServeSettings

__all__ = ["ExplainParams", "GenerateParams", "explain_params", "generate_params", "query_int"]


@dataclass(frozen=True)
class ExplainParams:
    text: str
    model: str
    k: int
    topk: bool
    layer: int | None
    head: int
    query: int
    lang: str
    html: bool
    explore: bool
    prefill: bool = False       # also prefill the text block-sparsely: the page's prefill map (report/prefill.py)


@dataclass(frozen=True)
class GenerateParams:
    text: str
    model: str
    max_new: int
    page_size: int
    budget: int | str  # tokens a decode step reads, or "auto" (pages by estimated attention mass)


def query_int(q: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    """Query parameter `name` as an int in [lo, hi] (gatherlens.params.parse_int's rule); `default`
    when it is missing or empty. Every int parameter of the API is read here."""
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    return parse_int(raw, name, lo, hi)


def _flag(q: Mapping[str, str], name: str, default: bool) -> bool:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "on", "yes"):
        return True
    if raw.lower() in ("0", "false", "off", "no"):
        return False
    raise GatherValueError(f"{name} = {raw[:40]!r} must be 1 or 0 (true or false)")


def _text(q: Mapping[str, str], s: ServeSettings) -> str:
    text = q.get("text")
    text = s.text if text is None else text
    if not text.strip():
        raise GatherValueError("text is empty; type a sentence")
    if len(text) > s.max_chars:
        raise GatherValueError(f"text has {len(text):,} characters; the limit is {s.max_chars:,} "
                               f"(and {s.max_tokens} tokens)")
    return text


def _model(q: Mapping[str, str], s: ServeSettings) -> str:
    model = q.get("model") or s.model
    if model not in s.models:
        raise GatherValueError(f"model = {model[:80]!r} is not one this server offers: {s.models}")
    return model


def explain_params(q: Mapping[str, str], s: ServeSettings) -> ExplainParams:
    """The checked parameters of GET /api/explain (and of the page itself)."""
    lang = check_lang(q.get("lang") or s.lang)
    big = 1 << 20
    return ExplainParams(
        text=_text(q, s), model=_model(q, s), k=query_int(q, "k", s.top_k, 1, s.max_k),
        topk=_flag(q, "topk", True), layer=query_int(q, "layer", None, -big, big),
        head=query_int(q, "head", 0, -big, big), query=query_int(q, "query", -1, -big, big), lang=lang,
        html=_flag(q, "html", False), explore=_flag(q, "explore", False),
        prefill=_flag(q, "prefill", s.sparse_prefill))


def generate_params(q: Mapping[str, str], s: ServeSettings) -> GenerateParams:
    """The checked parameters of GET /api/generate."""
    return GenerateParams(
        text=_text(q, s), model=_model(q, s),
        max_new=query_int(q, "max_new", s.default_new_tokens, 1, s.max_new_tokens),
        page_size=query_int(q, "page_size", s.page_size, 1, 64),
        budget="auto" if q.get("budget") == "auto" else query_int(q, "budget", s.budget, 1, 4096))
