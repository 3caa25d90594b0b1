"""How big the explorable page is, how fast `gatherlens serve` answers, where `explain` spends its time.

    .venv/bin/python scripts/bench_explorer.py                 # all three, SmolLM2
    .venv/bin/python scripts/bench_explorer.py --only latency --repeat 9

- sizes: index.html of `explain` on SmolLM2 at 32 and 128 tokens (and MiniLM at 32).
- latency: the live page's request (GET /api/explain&html=1: run the model, draw the report,
  send it) on a warm server over HTTP, for sentences of 8, 16 and 32 tokens; median and min.
- explain: `gatherlens explain` as a user runs it (a fresh process, the converted model cached),
  wall time; then the same steps in one process, timed one by one (import, load, run, draw, write).
A benchmark, not a test: numbers depend on the machine and on what else it runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `gatherlens serve` and `explain` run
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
WORDS = ("the quick brown fox jumps over a lazy dog while seven small cats watch from an old red "
         "wall and think about dinner because the evening is cold and long and nobody has fed them "
         "since the morning when the farmer left for the market in town with his cart of apples "
         "pears and plums that he sells every week to the same three families who live near the "
         "river by the mill where the water runs fast in spring and slow in the dry summer months").split()


def text_of(lm, n: int) -> str:
    """A sentence of exactly n tokens for this model's tokenizer (special tokens included)."""
    words_ = WORDS * 4
    for words in range(1, len(words_) + 1):
        text = " ".join(words_[:words])
        if lm.encode(text).shape[1] >= n:
            return text
    raise SystemExit(f"the word list is too short for {n} tokens")


def sizes(lm_names=("smollm2",)) -> None:
    from gatherlens.models import load
    from gatherlens.report.build import build_report
    from gatherlens.report.collect import collect

    print("\npage size (index.html of `gatherlens explain`)")
    for name in lm_names:
        lm = load(name)
        for n in ((32, 128) if name == "smollm2" else (32,)):
            text = text_of(lm, n)
            story = collect(lm, text, top_k=4)
            html = build_report(story).html.encode("utf-8")
            print(f"  {name:8s} {lm.encode(text).shape[1]:4d} tokens: {len(html) / 1e6:6.2f} MB")


def latency(repeat: int) -> None:
    import httpx

    from gatherlens.models import load
    from gatherlens.serve import ServeSettings, create_app
    from serve_helpers import running_server

    lm = load("smollm2")
    print("\nlive page: GET /api/explain?...&html=1 on a warm server (what the page asks after a pause)")
    with running_server(create_app(ServeSettings(model="smollm2"), loader=lambda name: lm)) as url:
        for n in (8, 16, 32):
            text, times = text_of(lm, n), []
            for i in range(repeat + 1):
                t = time.perf_counter()
                r = httpx.get(f"{url}/api/explain", params={"text": text, "html": 1}, timeout=300)
                r.raise_for_status()
                if i:  # the first request of each length warms the caches
                    times.append(time.perf_counter() - t)
            print(f"  {n:3d} tokens: median {statistics.median(times):.2f} s, min {min(times):.2f} s "
                  f"({len(r.content) / 1e3:.0f} kB)")


def explain(repeat: int) -> None:
    print("\n`gatherlens explain` (default sentence, converted model cached): fresh process, wall")
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "gatherlens", "explain", "--out", f"{tmp}/r"],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - t)
    print(f"  median {statistics.median(times):.2f} s, min {min(times):.2f} s over {repeat} runs")
    code = ("import time; t0 = time.perf_counter(); from gatherlens.models import load; "
            "from gatherlens.report.collect import collect; from gatherlens.report.build import write_report; "
            "import tempfile; t1 = time.perf_counter(); lm = load('smollm2'); t2 = time.perf_counter(); "
            "s = collect(lm, 'The cat sat on the mat because it was', top_k=4); t3 = time.perf_counter(); "
            "d = tempfile.mkdtemp(); write_report(s, d + '/r'); t4 = time.perf_counter(); "
            "print(f'  import {t1-t0:.2f} s, load {t2-t1:.2f} s, run (traced top-k + dense) {t3-t2:.2f} s, "
            "draw + write {t4-t3:.2f} s')")
    print("  the same steps in one process:")
    subprocess.run([sys.executable, "-c", code], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("sizes", "latency", "explain"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.only in (None, "sizes"):
        sizes(("smollm2", "minilm"))
    if args.only in (None, "latency"):
        latency(args.repeat)
    if args.only in (None, "explain"):
        explain(args.repeat)


if __name__ == "__main__":
    main()
