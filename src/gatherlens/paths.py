"""Where gatherlens keeps what it makes for itself: the one cache-root rule (rank 0, no torch).

    >>> cache_root()              # $GATHERLENS_CACHE, else $XDG_CACHE_HOME/gatherlens, else ~/.cache/gatherlens
    PosixPath('/root/.cache/gatherlens')

The converted models (`models/files/cache.py`: `<root>/models`), the built native kernels
(`ops/native.py`: `<root>/native`) and a sentencepiece vocabulary's merges (`models/gguf/spm.py`:
`<root>/spm-merges`) live under it; the environment is read on each call.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """$GATHERLENS_CACHE, else $XDG_CACHE_HOME/gatherlens, else ~/.cache/gatherlens (read each call)."""
    own = os.environ.get("GATHERLENS_CACHE")
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatherlens"
