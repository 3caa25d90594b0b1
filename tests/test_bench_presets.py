"""`gatherlens bench presets`: its pieces checked from data (no timing here: benchmarks are not tests)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gatherlens.bench.presets import agree, context_label, resident_bytes, routes_by_type
from gatherlens.cli import main


@pytest.mark.parametrize("a, b, n", [([1, 2, 3], [1, 2, 4], 2), ([5], [6], 0), ([1, 2], [1, 2, 3], 2), ([], [1], 0)],
                         ids=["two-shared", "first-differs", "shorter-run", "empty"])
def test_agree_counts_the_shared_leading_tokens(a, b, n):
    assert agree(a, b) == n


def test_context_label():
    assert [context_label(L) for L in (512, 4096, 32768, 3000)] == ["512", "4K", "32K", "3000"]


@pytest.fixture(scope="module")
def quantized():
    from gatherlens.models import load

    return load("smollm2", quantized=True)


@pytest.mark.slow  # the real model
def test_resident_bytes_count_the_mapping_once_and_the_copies_apart(quantized):
    """The shipped file is mapped in place, its blocks repacked in panels (the same bytes) and its pages
    let go: resident are the copies (panels, fused q|k|v rows, norms: about the file's size) and what
    is read in place since; the routes are named per ggml type."""
    size = Path(quantized.source).stat().st_size
    got = resident_bytes(quantized.model, Path(quantized.source))
    assert 0.9 * size < got["copies"] < 1.25 * size
    assert 0 <= got["file"] < 0.25 * size
    routes = routes_by_type(quantized.model)
    assert "gather" in routes["Q8_0"] and set(routes) >= {"Q4_1", "Q8_0"}


def test_presets_command_refuses_a_missing_file(tmp_path):
    result = CliRunner().invoke(main, ["bench", "presets", str(tmp_path / "none.gguf")])
    assert result.exit_code == 2 and "does not exist" in result.output
