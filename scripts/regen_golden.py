"""Regenerate the golden SVG files that tests/test_render_svg.py compares byte for byte.

The fixtures that draw them are in tests/golden_cases.py.

    .venv/bin/python scripts/regen_golden.py          # rewrite tests/golden/*.svg
    .venv/bin/python scripts/regen_golden.py --check  # exit 1 if any file would change

Run it after an intended change to the pictures, then look at the diff (git diff tests/golden).
"""
from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))  # the fixtures live next to the tests that use them

from golden_cases import GOLDEN, example_svg  # noqa: E402 - tests/golden_cases.py

GOLDEN_DIR = TESTS / "golden"


def main(check: bool = False) -> int:
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, lang in GOLDEN:
        path = GOLDEN_DIR / f"{name}.{lang}.svg"
        svg = example_svg(name, lang)
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != svg:
            changed.append(path.name)
            if not check:
                path.write_text(svg, encoding="utf-8")
    known = {f"{n}.{lang}.svg" for n, lang in GOLDEN}
    stale = sorted(p.name for p in GOLDEN_DIR.glob("*.svg") if p.name not in known)
    for name in stale:
        print(f"stale golden file (no example makes it): {name}")
    verb = "differ" if check else "rewritten"
    print(f"{len(GOLDEN)} golden SVGs, {len(changed)} {verb}: {', '.join(changed) or '-'}")
    return 1 if check and (changed or stale) else 0


if __name__ == "__main__":
    sys.exit(main(check="--check" in sys.argv[1:]))
