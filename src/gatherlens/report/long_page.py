"""The page's data for a text past the offline page's limit, and the limits the page states.

    >>> data = long_explore(story, k=4)     # shapes + the first window: the script asks for the rest
    >>> data["remote"], data["window"]["rows"]
    (True, [2027, 2043])
    >>> limits_text(story, data, "zh", live)   # what this page holds, how big, up to how many tokens

A story of more than MAX_TOKENS tokens (only `gatherlens serve` runs one) carries no full grids:
its page gets the shapes and one window (report.window) for the run's own layer, head and query,
and its script fetches the window of every other choice from GET /api/attention.
"""
from __future__ import annotations

import json

from gatherlens.i18n import text
from gatherlens.render.theme import human_bytes
from gatherlens.report.defaults import LIVE_MAX_TOKENS, MAX_PICKS, MAX_TOKENS
from gatherlens.report.explore import FORMAT_VERSION, value_columns
from gatherlens.report.run_tensors import kind_data
from gatherlens.report.window import WINDOW_KEYS, WINDOW_ROWS, attention_window

__all__ = ["long_explore", "limits_text"]


def long_explore(story, k: int) -> dict:
    """The explorer's data of a long story: shapes, scales and the window of the run's choice."""
    t, att = story.tensors, story.attention
    N, Hq, Q, L = t.shape
    qrow = att.query - (len(story.shown_tokens) - Q)
    dv = t.value.shape[-1]
    return {"v": FORMAT_VERSION, "remote": True, "layers": N, "heads": Hq, "kv_heads": t.key.shape[1],
            "Q": Q, "L": L, "run_k": t.run_k, "k_stored": t.picks.shape[-1], "dense_run": t.dense_run,
            "causal": t.causal, "dv": dv, "value_cols": value_columns(dv),
            "kinds": [kind_data(k) for k in t.kinds],
            "scales": [round(s, 6) for s in t.scales], "run_bytes": t.nbytes,
            "window": attention_window(t, att.layer, att.head, qrow, k)}


def limits_text(story, explore: dict, lang: str, live: dict | None) -> str:
    """The page's sentence on its limits: offline, the size of its data and the scores' precision;
    live, the longest text, the window and what the server keeps."""
    if live is None:
        size = len(json.dumps(explore, separators=(",", ":")))
        if explore["rows"] != [0, explore["Q"]]:                        # a long text: the rows around the query
            r0, r1 = (len(story.ids) - explore["Q"] + r for r in explore["rows"])
            return text("lim_offline_long", lang, n=len(story.ids), offline=MAX_TOKENS, live=LIVE_MAX_TOKENS,
                        r0=r0, r1=r1 - 1, size=human_bytes(size), err=f"{explore.get('score_err', 0.0):.2g}")
        return text("lim_offline", lang, offline=MAX_TOKENS, live=LIVE_MAX_TOKENS, size=human_bytes(size),
                    err=f"{explore.get('score_err', 0.0):.2g}")
    S = len(story.ids)
    return text("lim_live", lang, live=live.get("max_tokens", LIVE_MAX_TOKENS), n=S, offline=MAX_TOKENS,
                rows=WINDOW_ROWS, keys=WINDOW_KEYS, size=human_bytes(story.tensors.nbytes), picks=MAX_PICKS,
                kmax=max(1, MAX_PICKS // S))
