"""Take docs/figures/generation-step.png: a clicked generation step of `gatherlens serve` on SmolLM2.

    .venv/bin/python scripts/step_screenshot.py [--out docs/figures/generation-step.png] [--lang zh]

Starts the server on a free port of 127.0.0.1 with a prompt of about 60 tokens (past the
explorer's budget of 16, so each step chooses), picks layer 15 and head 4, generates 12 tokens
with sparse decoding, clicks step 6 and shoots the generation section: the pages x steps picture
with the step outlined, the sentence on its pages (the dense weight they hold, the dense choice)
and the text with the tokens those pages hold highlighted. Every pixel is the page's own.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import quote

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `gatherlens serve` runs
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TEXT = ("The old sailor told the children a story about the sea. He had sailed from the harbour "
        "when he was young, past the lighthouse and the rocks, to islands where the birds were "
        "loud and the water was clear. Every evening, when the fire was low, the children asked")


def shoot(url: str, out: Path, lang: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        page.goto(f"{url}/?text={quote(TEXT)}&layer=15&head=4&lang={lang}", timeout=300000)
        page.fill('input[name="max_new"]', "12")
        page.click('button[name="generate"]')
        page.wait_for_function("() => !document.querySelector('button[name=generate]').disabled"
                               " && document.querySelectorAll('#fig-steps svg').length", timeout=300000)
        page.locator("#fig-steps svg").click(position={"x": 60, "y": 16 + 44 + 6 * 18 + 9})   # step 6
        page.locator("#generate").screenshot(path=str(out))
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs/figures/generation-step.png"))
    ap.add_argument("--lang", default="en", choices=("en", "zh"))
    args = ap.parse_args()
    from gatherlens.models import load
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    lm = load("smollm2")
    settings = ServeSettings(model="smollm2")
    with running_server(create_app(settings, loader=lambda name: lm), http=http_protocol(settings)) as url:
        shoot(url, Path(args.out), args.lang)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
