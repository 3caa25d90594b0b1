"""Many sparse decoding settings against dense from ONE dense prefill: how issue 38 chose the auto budget.

    .venv/bin/python scripts/sparse_agreement.py --setups "dict(budget=512);dict(budget='auto', mass=0.999)" \
        --out rows.jsonl                                             # 8K of Emma, 256 teacher-forced tokens
    .venv/bin/python scripts/sparse_agreement.py --file legal.txt --setups "dict(budget='auto')" --out rows.jsonl
    .venv/bin/python scripts/sparse_agreement.py --prefill --setups "dict();dict(threshold=0.99)" --out p.jsonl

Decode settings: the first context - N tokens are prefilled densely once (float32 pages of 8; the cache is
kept in /tmp/gatherlens_agreement/ and reused by later calls on the same text, context and N), dense
decodes the last N tokens teacher-forced once (kept too), then every setting (a dict of
`eval.sparse_quality.SparseSetup` keywords; defaults: pages of 8, 2 dense layers, per-head choice,
float16 pages) does the same from a copy of the cache: perplexity ratio to dense with its 95% interval
(paired per-token differences), teacher-forced top-1 agreement with dense, pages a choosing head read
per step. The same measures as `gatherlens eval-sparse --no-recall`, without recomputing the prefill
and the dense run for every call: what made a grid of settings affordable on a 2-core machine.
--prefill: the settings are PrefillConfig changes instead (`eval.prefill_quality`: one prefill forward
per setting, the last --scored tokens, --greedy tokens after them). One JSON line per setting to --out.
--quantized runs the Q4_1 model from its blocks; its top-1 choices move with any change of the
activations' 8-bit rounding (float16 pages alone agree with float32 on 95% of the top-1 tokens at 8K of
Emma), so agreement is measured on the float model (the default), as eval-sparse does.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

HERE = Path("/tmp/gatherlens_agreement")


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="austen:emma")
    ap.add_argument("--file", default=None, help="a UTF-8 text file instead of --corpus")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--decode", type=int, default=256, help="teacher-forced tokens at the end of the context")
    ap.add_argument("--scored", type=int, default=512, help="--prefill: last tokens scored by the prefill")
    ap.add_argument("--greedy", type=int, default=32, help="--prefill: greedy tokens compared after it")
    ap.add_argument("--setups", required=True, help="semicolon-separated dicts of keywords")
    ap.add_argument("--prefill", action="store_true", help="the setups are PrefillConfig changes")
    ap.add_argument("--quantized", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="a .jsonl file the rows are appended to")
    return ap.parse_args()


def _cached_prefill(lm, prefix, key: Path):
    """The dense prefill's SparseKVCache and last logits, from `key` when made before."""
    from gatherlens.eval.sparse_quality import prefill
    from gatherlens.models.runtime.decoding import SparseKVCache, use_sparse_decoding

    if key.exists():
        kv, logits = torch.load(key)
        cache = SparseKVCache(config=None, page_size=8)
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)
        return cache, logits
    use_sparse_decoding(lm.model, budget=None, page_size=8, kv_dtype=None)
    cache, logits = prefill(lm.model, prefix, 8)
    torch.save(([(layer.paged.keys.clone(), layer.paged.values.clone()) for layer in cache.layers], logits), key)
    return cache, logits


def _decode(lm, setup, cache0, logits0, targets):
    """(nll (N,), top-1 ids, mean pages a choosing head read per step, seconds) of one setting."""
    from gatherlens.eval.sparse_quality import PageCounter, decode_teacher_forced, repage
    from gatherlens.models.attention.sparse import meter_pages
    from gatherlens.models.runtime.decoding import use_sparse_decoding

    use_sparse_decoding(lm.model, config=setup.config())
    counter, tops, t0 = PageCounter(), [], time.perf_counter()
    with meter_pages(counter):
        nll = decode_teacher_forced(lm.model, repage(cache0, 8, setup.kv_dtype), logits0, targets, tops=tops)
    return nll, tops, counter.mean(), time.perf_counter() - t0


def _compare(nll, tops, dense) -> dict:
    d = nll - dense[0]  # (N,) paired per-token differences
    se = float(d.std()) / math.sqrt(len(d))
    return {"ppl_ratio": math.exp(float(d.mean())), "ppl_ratio_ci": [math.exp(float(d.mean()) - 1.96 * se),
                                                                      math.exp(float(d.mean()) + 1.96 * se)],
            "top1_agree": sum(a == b for a, b in zip(tops, dense[1])) / len(tops)}


def decode_rows(lm, ids, a) -> list[dict]:
    from gatherlens.eval.sparse_quality import SparseSetup

    HERE.mkdir(exist_ok=True)
    name = (a.file or a.corpus).replace("/", "_").replace(":", "_")
    key = HERE / f"{'q' if a.quantized else 'f'}_{name}_{a.context}_{a.decode}"
    prefix, targets = ids[:, :-a.decode], ids[:, -a.decode:]  # (1, S - N), (1, N)
    cache0, logits0 = _cached_prefill(lm, prefix, key.with_suffix(".pt"))
    dense_key = key.with_name(key.name + "_dense.pt")
    if dense_key.exists():
        dense = torch.load(dense_key)
    else:
        nll, tops, _, _ = _decode(lm, SparseSetup(None, page_size=8, dense_layers=2), cache0, logits0, targets)
        dense = (nll, tops)
        torch.save(dense, dense_key)
    rows = []
    for spec in a.setups.split(";"):
        kw = dict(dict(page_size=8, dense_layers=2, share_selection=False, kv_dtype="float16"), **eval(spec))
        setup = SparseSetup(**kw)
        nll, tops, pages, seconds = _decode(lm, setup, cache0, logits0, targets)
        rows.append({"setting": setup.name, "spec": spec, "perplexity": math.exp(float(nll.mean())),
                     "pages_mean": pages, "seconds": round(seconds, 1), **_compare(nll, tops, dense)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def prefill_rows(lm, ids, a) -> list[dict]:
    from gatherlens.eval.prefill_quality import evaluate_prefill_quality
    from gatherlens.ops.prefill.config import DEFAULT

    configs = {spec: DEFAULT.replace(min_length=0, **eval(spec)) for spec in a.setups.split(";")}
    report = evaluate_prefill_quality(lm.model, lm.tokenizer, ids, configs, scored=a.scored, greedy=a.greedy,
                                      passkey_context=None, progress=lambda m: print(m, flush=True))
    return [{k: v for k, v in r.items() if k != "greedy"} for r in report.as_dicts()]


def main() -> None:
    a = _args()
    torch.set_num_threads(a.threads)
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load

    lm = load("smollm2", quantized=a.quantized, progress=False)
    ids = lm.encode(load_text(a.corpus, path=a.file), truncation=False)[:, :a.context]  # (1, S)
    with torch.inference_mode():
        rows = prefill_rows(lm, ids, a) if a.prefill else decode_rows(lm, ids, a)
    meta = {"text": a.file or a.corpus, "context": ids.shape[1], "decode": a.decode, "quantized": a.quantized,
            "prefill": a.prefill, "when": time.strftime("%Y-%m-%d %H:%M")}
    with open(a.out, "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(dict(meta, **r)) + "\n" for r in rows)


if __name__ == "__main__":
    main()
