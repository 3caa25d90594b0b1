"""Take docs/figures/explorer.png: `gatherlens serve` on SmolLM2, driven in Debian's Chromium.

    .venv/bin/python scripts/explorer_screenshot.py [--out docs/figures/explorer.png]

Starts the server on a free port of 127.0.0.1, types a sentence, picks layer 29, head 8 and
k = 6, generates 16 tokens with sparse decoding, then stacks four parts of the page (the text
box, the controls, the score grid, the pages x steps picture) into one PNG. Nothing is drawn
by hand: every pixel is the page's own.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `gatherlens serve` runs
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TEXT = "The old sailor told the children a story about the sea, and they listened until the fire went out"
PARTS = ("#gl-live", "#gl-controls", "#fig-04-scores", "#fig-steps")


def shoot(url: str, out: Path) -> None:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
        page.goto(url)
        page.locator('textarea[name="text"]').fill(TEXT)
        page.wait_for_function("() => [...document.querySelectorAll('.chip')].some(c => c.textContent === '␣sailor')",
                               timeout=120000)   # the report of the typed text (the page has one text box)
        page.select_option('select[name="layer"]', "29")
        page.select_option('select[name="head"]', "8")
        page.fill('input[name="k"]', "6")
        page.fill('input[name="max_new"]', "16")
        page.click('button[name="generate"]')
        page.wait_for_function("() => !document.querySelector('button[name=generate]').disabled"
                               " && document.querySelectorAll('#fig-steps svg').length", timeout=300000)
        shots = [Image.open(io.BytesIO(page.locator(sel).screenshot())) for sel in PARTS]
        browser.close()
    width = max(s.width for s in shots)
    sheet = Image.new("RGB", (width, sum(s.height + 8 for s in shots)), "#fafafa")
    y = 0
    for s in shots:
        sheet.paste(s, (0, y))
        y += s.height + 8
    sheet.save(out, optimize=True)
    print(f"wrote {out} ({sheet.width} x {sheet.height})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "explorer.png")
    args = ap.parse_args()
    from gatherlens.serve import ServeSettings, create_app
    from serve_helpers import running_server

    with running_server(create_app(ServeSettings(model="smollm2"))) as url:
        shoot(url + "/", args.out)


if __name__ == "__main__":
    main()
