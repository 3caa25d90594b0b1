"""Take docs/figures/gallery.png: the head gallery of SmolLM2's report, in Debian's Chromium.

    .venv/bin/python scripts/gallery_screenshot.py [--out docs/figures/gallery.png] [--lang zh]

Runs `gatherlens explain`'s collect on a text with a repeat (so copying heads show), writes the
offline report to a temporary folder, opens it, clicks layer 17, head 4 (the outline moves there)
and shoots the gallery figure. Nothing is drawn by hand: every pixel is the page's own.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
TEXT = "The cat sat on the mat. The cat sat on the hat because it was"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "gallery.png")
    ap.add_argument("--lang", default="en")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    story = collect(load("smollm2"), TEXT, top_k=4)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        write_report(story, Path(tmp) / "rep", lang=args.lang)
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1320, "height": 900}, device_scale_factor=1)
        page.goto((Path(tmp) / "rep" / "index.html").as_uri())
        tile = page.locator('.gl-thumb[data-layer="17"][data-head="4"] use[href="#gl-frame"]')
        tile.click()
        tile.hover()
        page.locator("#fig-02-heads-gallery").screenshot(path=str(args.out))
        browser.close()
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
