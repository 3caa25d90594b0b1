"""Defaults of the report, importable without torch (so `gatherlens --help` stays light)."""

DEFAULT_TEXT = "The cat sat on the mat because it was"
MAX_TOKENS = 128         # the score grid is Q x L cells; beyond this it stops being readable
