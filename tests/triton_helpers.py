"""Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1), in a fresh process: the
interpreter must be chosen before triton is imported.

    results = interpreted_results(__file__, tmp_path_factory)   # the script's torch.save'd dict
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def interpreted_results(script: str, tmp_path_factory):
    """Run `script` (which writes torch.save(results, argv[1])) under TRITON_INTERPRET=1; its results."""
    pytest.importorskip("triton")
    path = tmp_path_factory.mktemp("triton") / "results.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(Path(script)), str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path)
