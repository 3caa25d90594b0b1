"""How big the explorable page is, how fast `gatherlens serve` answers, where `explain` spends its time.

    .venv/bin/python scripts/bench_explorer.py                 # all four, SmolLM2
    .venv/bin/python scripts/bench_explorer.py --only latency --repeat 9
    .venv/bin/python scripts/bench_explorer.py --only long --json explorer.json   # 128 / 512 / 2,048 tokens
    .venv/bin/python scripts/bench_explorer.py --only long --sizes 32,64 --repeat 2   # a quick check

- sizes: index.html of `explain` on SmolLM2 at 32 and 128 tokens (and MiniLM at 32).
- latency: the live page's request (GET /api/explain&html=1: run the model, draw the report,
  send it) on a warm server over HTTP, for sentences of 8, 16 and 32 tokens; median and min.
- explain: `gatherlens explain` as a user runs it (a fresh process, the converted model cached),
  wall time; then the same steps in one process, timed one by one (import, load, run, draw, write).
- long: for texts of 128, 512 and 2,048 tokens on a warm server: the first answer (the page of a
  new text: GET /?text=..., one model run), then GET /api/attention for a change of query and
  of head (the kept run: no model run), median and min of --repeat; the live page's size, the
  kept run's bytes, and the offline page's size where the offline page holds the text (<= 128).
  A table, and with --json F {"suite": "explorer", "meta", "rows"}.
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
    """The shortest text of the word list with at least n tokens for this model's tokenizer
    (special tokens included): exactly n for this list's words, one token each."""
    words_ = WORDS * (4 + n // 64)
    lo, hi = 1, len(words_)
    if lm.encode(" ".join(words_)).shape[1] < n:
        raise SystemExit(f"the word list is too short for {n} tokens")
    while lo < hi:                                   # the fewest words that reach n tokens
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if lm.encode(" ".join(words_[:mid])).shape[1] < n else (lo, mid)
    return " ".join(words_[:lo])


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


def _timed(get, repeat: int) -> tuple[float, float, object]:
    """(median s, min s, the last answer) of `repeat` calls of get()."""
    times, r = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        r = get()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), r


def _long_row(url: str, lm, n: int, repeat: int) -> dict:
    """One size: first answer, query and head changes, sizes (see the module doc)."""
    import httpx

    from gatherlens.report.build import build_report
    from gatherlens.report.collect import collect
    from gatherlens.report.defaults import MAX_TOKENS

    text = text_of(lm, n)
    S = lm.encode(text).shape[1]
    t = time.perf_counter()
    page = httpx.get(f"{url}/", params={"text": text}, timeout=900)
    page.raise_for_status()
    first = time.perf_counter() - t
    N, H = lm.model.config.num_hidden_layers, lm.model.config.num_attention_heads
    calls = iter(range(10 ** 6))

    def ask(**change):
        r = httpx.get(f"{url}/api/attention", params={"text": text, "layer": N // 2, "head": 0,
                                                      "query": S - 1, **change}, timeout=300)
        r.raise_for_status()
        return r

    q_med, q_min, r = _timed(lambda: ask(query=S - 2 - next(calls) % (S - 1)), repeat)
    h_med, h_min, _ = _timed(lambda: ask(head=1 + next(calls) % (H - 1)), repeat)
    health = httpx.get(f"{url}/api/health", timeout=60).json()
    offline = len(build_report(collect(lm, text, top_k=4)).html.encode()) if S <= MAX_TOKENS else None
    return {"tokens": S, "first_s": round(first, 3), "query_median_s": round(q_med, 4), "query_min_s": round(q_min, 4),
            "head_median_s": round(h_med, 4), "head_min_s": round(h_min, 4), "cached": r.json()["cached"],
            "live_page_bytes": len(page.content), "attention_answer_bytes": len(r.content),
            "kept_run_bytes": health.get("runs", {}).get("bytes"), "offline_page_bytes": offline}


def long_texts(sizes: list[int], repeat: int, json_path: str | None) -> None:
    import json
    import platform

    import torch

    from gatherlens.models import load
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    lm = load("smollm2")
    settings = ServeSettings(model="smollm2")
    print("\nlong texts on a warm server: first answer (one model run), then a change of query / head "
          "(GET /api/attention, the kept run)")
    rows = []
    with running_server(create_app(settings, loader=lambda name: lm), http=http_protocol(settings)) as url:
        for n in sizes:
            rows.append(_long_row(url, lm, n, repeat))
    head = ("tokens", "first s", "query s (med/min)", "head s (med/min)", "live page", "kept run", "offline page")
    print("  " + " | ".join(head))
    for r in rows:
        mb = (lambda b: "n/a (over the offline limit)" if b is None else f"{b / 1e6:.2f} MB")
        print(f"  {r['tokens']:6d} | {r['first_s']:7.2f} | {r['query_median_s']:.3f} / {r['query_min_s']:.3f} | "
              f"{r['head_median_s']:.3f} / {r['head_min_s']:.3f} | {r['live_page_bytes'] / 1e6:.2f} MB | "
              f"{(r['kept_run_bytes'] or 0) / 2 ** 20:.0f} MiB | {mb(r['offline_page_bytes'])}")
    if json_path:
        meta = {"model": "smollm2", "repeat": repeat, "torch": torch.__version__, "threads": torch.get_num_threads(),
                "machine": platform.machine(), "python": platform.python_version()}
        Path(json_path).write_text(json.dumps({"suite": "explorer", "meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"  wrote {json_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("sizes", "latency", "explain", "long"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="128,512,2048", help="token counts of --only long")
    ap.add_argument("--json", default=None, help="write the long-text rows here")
    args = ap.parse_args()
    if args.only in (None, "sizes"):
        sizes(("smollm2", "minilm"))
    if args.only in (None, "latency"):
        latency(args.repeat)
    if args.only in (None, "explain"):
        explain(args.repeat)
    if args.only in (None, "long"):
        long_texts([int(x) for x in args.sizes.split(",")], args.repeat, args.json)


if __name__ == "__main__":
    main()
