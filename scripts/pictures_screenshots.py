"""Take the issue-39 screenshots of docs/figures (en and zh): the model map, the sampling gather, the chat,
RoPE's row gather, MoE routing, a hybrid model's window and ring, Gemma's scaled rows, the 400 px page.

    .venv/bin/python scripts/pictures_screenshots.py [--out docs/figures] [--only map,sampling,...]

SmolLM2 (the real model, offline) for the map, the sampling gather, RoPE and the chat (`gatherlens serve`,
its chat template, sampled and decoded with sparse pages); tiny random models (tests/tiny_models.py: no real
MoE or Gemma 3 ships with gatherlens) for MoE routing (Mixtral) and the hybrid model (Gemma 3: sliding window
8, a global layer, the scaled embedding). Debian's Chromium takes every picture from the page itself; each
PNG is cropped to its figure and stored with an adaptive palette, so it stays small.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TEXT = "The capital of France is Paris, and the capital of Italy is"
TINY = "the cat sat on the mat because it was warm and the dog lay by the door all day long"
LANGS = ("en", "zh")


def save(png: bytes, out: Path) -> None:
    """A screenshot as an adaptive-palette PNG (a few tens of KiB)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    img.save(out, optimize=True)
    print(f"wrote {out} ({img.width} x {img.height}, {out.stat().st_size // 1024} KiB)")


def report(model: str, text: str, folder: Path, lang: str, **kw) -> Path:
    """Write the offline report of `model` on `text` into folder/lang; its index.html."""
    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    story = collect(load(model), text, top_k=4, **kw)
    write_report(story, folder / lang, lang=lang, force=True)
    return folder / lang / "index.html"


def shoot_offline(browser, page_file: Path, shots: dict[str, str], out: Path, lang: str) -> None:
    """shots: {name: selector}: each element of the page to docs/figures/<name>.<lang>.png."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(page_file.as_uri())
    for name, sel in shots.items():
        save(page.locator(sel).screenshot(), out / f"{name}.{lang}.png")
    page.close()


def shoot_live(browser, url: str, out: Path, lang: str) -> None:
    """The sampling sliders moved, then a chat of one message with a clicked token (SmolLM2, live)."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.goto(f"{url}/?text={quote(TEXT)}&k=4&lang={lang}", timeout=600000)
    page.eval_on_selector('#gl-sampling input[name="temperature"]',
                          "el => { el.value = '1.2'; el.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.wait_for_function("() => document.querySelector('#fig-08-sampling svg').textContent.includes('T = 1.2')",
                           timeout=120000)
    save(page.locator("#sampling").screenshot(), out / f"sampling.{lang}.png")
    page.fill('#gl-gen input[name="max_new"]', "12")
    page.fill('#gl-chat input[name="message"]', "What is the capital of Italy?" if lang == "en" else "意大利的首都是哪里？")
    page.click('#gl-chat button[name="send"]')
    page.wait_for_function("() => document.getElementById('gl-chat-status').textContent === ''"
                           " && document.querySelectorAll('#gl-chat-log .gl-chat-tok').length", timeout=600000)
    page.locator("#gl-chat-log .gl-chat-tok").nth(2).click()
    save(page.locator("#chat").screenshot(), out / f"chat.{lang}.png")
    page.close()


def shoot_phone(browser, page_file: Path, out: Path, lang: str) -> None:
    page = browser.new_page(viewport={"width": 400, "height": 800}, is_mobile=True, has_touch=True)
    page.goto(page_file.as_uri())
    page.locator("#scores").scroll_into_view_if_needed()
    save(page.screenshot(), out / f"phone.{lang}.png")
    page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    ap.add_argument("--only", default="smollm2,moe,hybrid,live")
    args = ap.parse_args()
    only = set(args.only.split(","))
    from playwright.sync_api import sync_playwright

    from gatherlens.serve import ServeSettings, create_app
    from serve_helpers import running_server
    from tiny_models import make_tiny_hybrid, make_tiny_moe

    tmp = Path(tempfile.mkdtemp(prefix="gl-shots-"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for lang in LANGS:
            if "smollm2" in only:
                page = report("smollm2", TEXT, tmp / "smollm2", lang)
                shoot_offline(browser, page, {"model-map": "#fig-00-model-map", "rope": "#fig-02-rope"}, args.out, lang)
            if "moe" in only:
                page = report(str(make_tiny_moe(tmp / "mixtral")), TINY, tmp / "moe", lang)
                shoot_offline(browser, page, {"moe": "#fig-07-moe-routing"}, args.out, lang)
            if "hybrid" in only:
                model = tmp / "hybrid-model"
                if not model.exists():
                    make_tiny_hybrid(model)
                page = report(str(model), TINY, tmp / "hybrid", lang, layer=0)
                shoot_offline(browser, page, {"window": "#fig-04-scores", "ring": "#fig-06-compare",
                                              "embedding-scale": "#fig-02-embedding-scale"}, args.out, lang)
                shoot_phone(browser, page, args.out, lang)
        if "live" in only:
            with running_server(create_app(ServeSettings(model="smollm2")), timeout=600) as url:
                for lang in LANGS:
                    shoot_live(browser, url, args.out, lang)
        browser.close()


if __name__ == "__main__":
    main()
