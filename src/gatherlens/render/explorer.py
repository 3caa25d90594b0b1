"""The explorer: the one script that makes the `explain` page explorable, and what it needs.

    >>> js = explorer_js()                           # the page's inline script (templates/explore.js)
    >>> csp(scripts=[js])                            # a Content-Security-Policy naming its hash
    "default-src 'none'; script-src 'sha256-…'; style-src 'unsafe-inline'; img-src data:"
    >>> body = text("values_body", "en", q=Slot("query", 8), ...)
    >>> slotted(body)                                # Markup: <span data-slot="query">8</span>

The offline report and `gatherlens serve` use the same page (templates/report.html.j2) and the
same script: it reads the JSON data block the page carries (gatherlens.report.explore) and draws
the attention figures for any layer, head, query and k, with the theme's colours and sizes
(`theme_data`). Sentences that name the current layer, head, k ... are written by the one string
table with `Slot`s in place of those values, so the script can update them in place.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from functools import lru_cache
from importlib import resources

from markupsafe import Markup, escape

from gatherlens.i18n import STRINGS
from gatherlens.render.templates import render_template
from gatherlens.render.theme import (BAND, BLOCK_KEPT, BLOCK_OUTSIDE, BLOCK_SKIPPED, FONTS, MASKED, MONO, OUTSIDE,
                                     PALETTE, PICKED, UNPICKED)

__all__ = ["explorer_js", "fragment_script", "csp", "script_hash", "inline_scripts", "json_block", "theme_data",
           "strings_data", "Slot", "slotted", "plain", "JS_STRINGS"]

_OPEN, _SEP, _CLOSE = "\ue000", "\ue001", "\ue002"
_SLOT = re.compile(f"{_OPEN}([a-z_]+){_SEP}([^{_SEP}]*){_SEP}([^{_CLOSE}]*){_CLOSE}")
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)

# the i18n keys the script formats itself ({name} placeholders only)
JS_STRINGS = ("ex_scores_title", "ex_gather_title", "ex_value_title", "ex_heads_title",
              "ex_k_run", "ex_k_moved", "ex_k_dense", "scores_legend", "ex_scores_info",
              "ex_not_allowed", "ex_kept", "ex_more", "heads_q", "heads_kv", "ex_sum",
              "ex_weight", "ex_steps_title", "ex_steps_prefill", "ex_busy", "ex_error",
              "ex_stopped", "ex_pages_axis", "ex_no_steps")
JS_STRINGS += ("gal_info", "gal_tag_sink", "gal_tag_previous", "gal_tag_copying", "gal_tag_broad",
               "gal_tag_mixed")                      # the head gallery's line under it
JS_STRINGS += ("ex_window", "st_detail", "st_dense", "st_same", "st_diff", "st_dense_wait",
               "st_prefill")                         # a long text's window; a clicked generation step
JS_STRINGS += ("layer_full", "layer_sliding", "layer_chunked", "layer_window", "scores_window_legend",
               "scores_axes", "panel_source", "panel_index", "panel_output", "ex_step_status",
               "ex_steps_ring", "st_ring", "ex_k_all")
JS_STRINGS += ("chat_tok", "chat_u", "chat_greedy", "chat_pages", "chat_prefill", "chat_ring", "chat_dense", "chat_kept",
               "chat_cut", "chat_chosen", "col_token", "col_id", "col_logit", "col_prob")   # the live page's chat   # issue 39: each layer's kind; no English
JS_STRINGS += ("ex_prefill_title", "ex_prefill_info", "ex_prefill_kept", "ex_prefill_skipped", "ex_prefill_outside",
               "ex_prefill_dense", "prefill_map_axes")   # a sparse prefill's block map (report/prefill.py)


@lru_cache(maxsize=1)
def explorer_js() -> str:
    """The explorer script (plain JavaScript, no dependencies)."""
    return resources.files("gatherlens.render").joinpath("templates/explore.js").read_text("utf-8")


@lru_cache(maxsize=1)
def fragment_script() -> str:
    """The hover script every record fragment carries (so a policy can allow it up front)."""
    return inline_scripts(render_template("fragment.html.j2", svg=Markup("")))[0]


def script_hash(js: str) -> str:
    """The CSP source that allows one inline script: 'sha256-<base64 digest>'."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode() + "'"


def inline_scripts(html: str) -> list[str]:
    """The bodies of the executable inline <script> elements in `html` (no type attribute)."""
    return _SCRIPT.findall(html)


def csp(scripts: list[str], connect_self: bool = False) -> str:
    """A policy that runs exactly these inline scripts and fetches nothing (or only its server)."""
    hashes = " ".join(sorted({script_hash(s) for s in scripts})) or "'none'"
    connect = "; connect-src 'self'" if connect_self else ""
    return (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
            f"img-src data:{connect}; base-uri 'none'; form-action 'none'")


def json_block(data) -> Markup:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' left as such."""
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    raw = raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(raw.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def theme_data(lang: str) -> dict:
    """The theme the script draws with: the same fonts and colours as the Python figures."""
    return {"font": FONTS[lang], "mono": MONO, "palette": list(PALETTE), "masked": MASKED,
            "outside": OUTSIDE, "band": BAND, "ring": PALETTE[5],
            "picked": PICKED, "unpicked": UNPICKED,
            "block": {"kept": BLOCK_KEPT, "skipped": BLOCK_SKIPPED, "outside": BLOCK_OUTSIDE}}


def strings_data(lang: str) -> dict:
    """The raw (unformatted) strings the script fills in, from the one string table."""
    return {key: STRINGS[key][lang] for key in JS_STRINGS}


class Slot:
    """A value in a sentence that the page's script may change: formats as a marked placeholder.

    `text("scores_body", lang, layer=Slot("layer", 15))` keeps the sentence whole in the string
    table; `slotted` turns each marker into `<span data-slot="layer" data-fmt="">15</span>`.
    """

    def __init__(self, name: str, value):
        self.name, self.value = name, value

    def __format__(self, spec: str) -> str:
        return f"{_OPEN}{self.name}{_SEP}{spec}{_SEP}{format(self.value, spec)}{_CLOSE}"

    def __str__(self) -> str:
        return format(self, "")


def slotted(sentence: str) -> Markup:
    """Escape `sentence` and turn its Slot markers into spans the script can update."""
    out, at = [], 0
    for m in _SLOT.finditer(sentence):
        name, spec, shown = m.groups()
        out.append(str(escape(sentence[at:m.start()])))
        out.append(f'<span class="gl-slot" data-slot="{name}" data-fmt="{escape(spec)}">'
                   f"{escape(shown)}</span>")
        at = m.end()
    out.append(str(escape(sentence[at:])))
    return Markup("".join(out))


def plain(sentence: str) -> str:
    """The sentence with its Slot markers replaced by their values (for files and the terminal)."""
    return _SLOT.sub(lambda m: m.group(3), sentence)
