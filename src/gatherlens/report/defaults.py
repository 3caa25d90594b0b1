"""Defaults of the report, importable without torch (so `gatherlens --help` stays light).

The one home of the explorer's text limits: MAX_TOKENS for the offline page (`gatherlens explain`:
it carries every layer's and head's full score grid), LIVE_MAX_TOKENS for `gatherlens serve`
(its page asks the server for the rows it shows), MAX_PICKS for what every layer's top-k keeps.
"""

# long enough (about 25 tokens) that top-4 has keys to leave out: a shorter default kept 100% everywhere
DEFAULT_TEXT = "The cat sat on the mat because it was warm. The dog lay by the door and watched the cat, because it was"
MAX_TOKENS = 128         # the offline page: Q x L cells of every head stored; the full grid stays readable
LIVE_MAX_TOKENS = 2048   # the live page: the grid is windowed around the query, rows fetched on demand
MAX_CHARS = 16000        # the longest text in characters (2,048 tokens of prose fit): refused before any load
MAX_PICKS = MAX_TOKENS * MAX_TOKENS   # tokens x k of each head's picks (k <= 8 at 2,048 tokens)
