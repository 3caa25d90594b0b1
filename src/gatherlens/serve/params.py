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

import json
import re
from dataclasses import dataclass
from typing import Mapping

from gatherlens.errors import GatherValueError
from gatherlens.i18n import check_lang
from gatherlens.params import parse_int
from gatherlens.serve.settings import ServeSettings

__all__ = ["ExplainParams", "GenerateParams", "explain_params", "generate_params", "query_int", "query_float",
           "sampling_params", "chat_messages"]


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


_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]+)?|-?\.[0-9]+")


def query_float(q: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    """Query parameter `name` as a plain decimal in [lo, hi]; `default` when missing or empty."""
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 30 or not _FLOAT.fullmatch(raw):
        raise GatherValueError(f"{name} = {raw[:40]!r} is not a number; give one in [{lo:g}, {hi:g}]")
    value = float(raw)
    if not lo <= value <= hi:
        raise GatherValueError(f"{name} = {value:g} is outside the valid range [{lo:g}, {hi:g}]")
    return value


def sampling_params(q: Mapping[str, str]):
    """The sampler's settings of the live page (temperature, top_k, top_p, min_p, seed) as a SamplingConfig;
    defaults: llama-server's (report/sampling.OFFLINE). Its own checks name any value out of range."""
    from gatherlens.report.sampling import OFFLINE

    return OFFLINE.replace(
        temperature=query_float(q, "temperature", OFFLINE.temperature, 0.0, 2.0),
        top_k=query_int(q, "top_k", OFFLINE.top_k, 0, 1 << 20), top_p=query_float(q, "top_p", OFFLINE.top_p, 0.0, 1.0),
        min_p=query_float(q, "min_p", OFFLINE.min_p, 0.0, 1.0), seed=query_int(q, "seed", 0, 0, (1 << 63) - 1))


def chat_messages(q: Mapping[str, str]) -> list:
    """The conversation of GET /api/chat: `messages`, a JSON list of {"role", "content"} (checked later by
    models/runtime/chat.check_messages)."""
    raw = q.get("messages")
    if not raw:
        raise GatherValueError('messages is missing: give a JSON list such as [{"role": "user", "content": "Hi"}]')
    try:
        return json.loads(raw)
    except ValueError as e:
        raise GatherValueError(f"messages is not JSON ({e.msg} at character {e.pos})") from None
