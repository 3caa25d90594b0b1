"""Print the logit differences the GGUF tests measure: the quantized model against transformers' float
load of the same file, per architecture and type (tests/test_gguf_architectures.py) and per
mixture-of-experts file (tests/test_quantized_moe.py). The README's table quotes the first.

    python scripts/gguf_differences.py            # runs those tests (a minute or two), then prints both tables

The tests assert the bounds and record what they measured in their module's `MEASURED`; this script
runs them through pytest and prints those records after (they were printed by two tests that asserted
nothing, one of which depended on running last). Exit status: pytest's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ("tests/test_gguf_architectures.py", "tests/test_quantized_moe.py")
MEASURING = "match_transformers"  # the tests that fill MEASURED (-k)


class Modules:
    """A pytest plugin keeping the test modules it collects, to read their MEASURED after the run."""

    def __init__(self):
        self.found = {}

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.found[item.module.__name__] = item.module


def architecture_table(measured: dict) -> list[str]:
    """(arch, qtype) -> max |logit difference| as the lines of the README's table."""
    return [f"  {arch:8s} {qtype:5s} max |quantized - transformers| = {diff:.2e}"
            for (arch, qtype), diff in sorted(measured.items())]


def moe_table(measured: dict) -> list[str]:
    """(test, file) -> (difference, largest logit, flipped expert choices) as lines."""
    return [f"  {test:>22} {file:>26}: max |logit diff| {diff:.2e} of {scale:.2f} ({diff / scale:.2%}), "
            f"{flips} expert choices flipped" for (test, file), (diff, scale, flips) in sorted(measured.items())]


def main() -> int:
    modules = Modules()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-k", MEASURING, *(str(ROOT / t) for t in TESTS)],
                       plugins=[modules])
    for name, title, table in (("test_gguf_architectures", "architectures (quantized against transformers)",
                                architecture_table),
                               ("test_quantized_moe", "mixture of experts (where no changed expert choice reaches)",
                                moe_table)):
        module = modules.found.get(name)
        print(f"\n{title}:")
        print("\n".join(table(module.MEASURED)) if module is not None and module.MEASURED else "  (nothing measured)")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
