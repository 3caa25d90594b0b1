"""Long-context tasks (eval/long_tasks.py) answered by a real model, dense and sparse, with intervals.

    >>> records = answer_samples(lm, hay, lengths=(2048, 4096), samples=4)   # one record per answer
    >>> report = long_report(records)                                         # accuracy per row, task, length
    >>> report.rows[0]                  # {"setting": "dense", "length": 2048, "task": "niah_single", ...}

Protocol. Each haystack of a sample (one per group of tasks, long_tasks.GROUPS and make_sample) is
prefilled once, densely, into a paged cache (float32 pages, generate's 512-token chunks); each
question is then asked from a copy of that cache, by each row's decoding:

- "dense": dense decoding over float32 pages (the baseline every other row is judged against);
- "auto", "512", "256": sparse decoding with the default SparseConfig at that budget (pages in
  float16, the default);
- "float16 pages", "int8 pages": dense decoding over pages stored so (the storage alone);
- "sparse prefill": the sample prefilled block-sparsely (ops/prefill's default), then dense decoding.

The question's tokens run as a prefill chunk over the copied cache (dense attention, as generate's
prompt), then at most the task's ANSWER_TOKENS greedy tokens (stopping at a new line or the end of
sequence once it has said something); the answer's score is long_tasks.score. A row's accuracy on a task and length is the
mean score over the samples, with a 95% interval (Wilson's for 0/1 scores, a seeded bootstrap
otherwise), and the paired difference to dense on the same samples with its bootstrap interval: a
row is "equal to dense within the interval" where that interval holds 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.long_tasks import GROUPS, TASKS, Haystack, Question, make_sample, score
from gatherlens.eval.stats import bootstrap_interval, wilson_interval

__all__ = ["ROWS", "answer_samples", "answer_sample", "long_report", "LongReport", "row_setup"]

ROWS = ("dense", "auto", "512", "256", "sparse prefill", "float16 pages", "int8 pages")


def row_setup(row: str) -> tuple[dict | None, str | None, bool]:
    """(use_sparse_decoding keywords or None for dense, the pages' storage dtype, sparse prefill) of a row."""
    table = {"dense": (None, None, False), "float16 pages": (None, "float16", False),
             "int8 pages": (None, "int8", False), "sparse prefill": (None, None, True)}
    if row in table:
        return table[row]
    if row == "auto" or row.isdigit():
        return {"budget": "auto" if row == "auto" else int(row)}, "float16", False
    raise GatherValueError(f"row {row!r} is not one of {ROWS} (or a budget in tokens)")


@torch.no_grad()
def _prefilled(lm, ids: torch.Tensor, sparse_prefill: bool):
    """A dense-decoding model's SparseKVCache (float32 pages of 8) after ids (1, S), prefilled densely or block-sparsely."""
    from gatherlens.models.attention.prefill import use_dense_prefill, use_sparse_prefill
    from gatherlens.models.runtime.decoding import SparseKVCache, use_sparse_decoding
    from gatherlens.models.runtime.generation import last_logits

    use_sparse_decoding(lm.model, budget=None, page_size=8, kv_dtype=None)
    if sparse_prefill:
        use_sparse_prefill(lm.model)
    try:
        cache = SparseKVCache(config=lm.model.config, page_size=8)
        last_logits(lm.model, cache, ids)
    finally:
        use_dense_prefill(lm.model)
    return cache


@torch.no_grad()
def _answer(lm, cache, question: Question, stop: set[int]) -> str:
    """The greedy answer to `question` after the context in `cache` (extended in place)."""
    from gatherlens.models.runtime.generation import last_logits

    ids = torch.tensor([lm.tokenizer("\n\n" + question.text, add_special_tokens=False)["input_ids"]])  # (1, Q)
    cache.reserve(cache.get_seq_length() + ids.shape[1] + question.max_new)
    logits, made = last_logits(lm.model, cache, ids), []
    for _ in range(question.max_new):
        token = int(logits.argmax())
        if token in stop:
            break
        made.append(token)
        if "\n" in lm.tokenizer.decode([token]) and any(c.isalnum() for c in lm.tokenizer.decode(made)):
            break  # a new line after some answer: done (one before it is the answer's own layout)
        logits = last_logits(lm.model, cache, torch.tensor([[token]]))
    return lm.tokenizer.decode(made)


def answer_sample(lm, hay: Haystack, length: int, seed: int, rows=ROWS, tasks=TASKS,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """One sample's answers by every row: a record per (row, task) with its score and answer (a
    haystack per group of `tasks`, prefilled once densely and once block-sparsely when a row asks)."""
    out = []
    for group in GROUPS:
        mine = tuple(t for t in group if t in tasks)
        if mine:
            out += _answer_group(lm, make_sample(hay, length, seed, mine), rows, progress or (lambda message: None))
    return out


def _answer_group(lm, sample, rows, say) -> list[dict]:
    """Every row's answers to one haystack's questions."""
    from gatherlens.eval.sparse_quality import repage
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding
    from gatherlens.models.runtime.generation import stop_ids

    stop, out, base = stop_ids(lm), [], {}
    where = f"{sample.length} seed {sample.seed} {'+'.join(q.task for q in sample.questions)}"
    try:
        for row in rows:
            sparse, kv, sparse_prefill = row_setup(row)
            if sparse_prefill not in base:
                say(f"{where}: {'sparse' if sparse_prefill else 'dense'} prefill")
                base[sparse_prefill] = _prefilled(lm, sample.prompt_ids, sparse_prefill)
            say(f"{where}: {row}")
            for q in sample.questions:
                use_sparse_decoding(lm.model, **(sparse or {"budget": None}), kv_dtype=kv, page_size=8)
                answer = _answer(lm, repage(base[sparse_prefill], 8, kv), q, stop)
                out.append({"row": row, "length": sample.length, "seed": sample.seed, "task": q.task,
                            "score": score(q, answer), "answer": answer, "wanted": list(q.wanted),
                            "depths": sample.depths[q.task], "context": sample.prompt_ids.shape[1]})
    finally:
        use_dense_decoding(lm.model)
    return out


def answer_samples(lm, hay: Haystack, lengths=(2048, 4096, 8192), samples: int = 10, first_seed: int = 0,
                   rows=ROWS, tasks=TASKS, progress=None) -> list[dict]:
    """Every sample's answers (answer_sample), `samples` per length, seeds first_seed.."""
    records = []
    for length in lengths:
        for seed in range(first_seed, first_seed + samples):
            records += answer_sample(lm, hay, length, seed, rows, tasks, progress)
    return records


@dataclass
class LongReport:
    """Accuracy per (row, length, task), dense's own first, with intervals and the paired difference to dense."""

    rows: list
    meta: dict = field(default_factory=dict)

    def as_dicts(self) -> list[dict]:
        return list(self.rows)


def _cell(scores: list[float], dense: list[float] | None, seed: int) -> dict:
    """Mean, its 95% interval and, against dense's scores on the same samples, the paired difference."""
    n = len(scores)
    mean = sum(scores) / n
    binary = all(s in (0.0, 1.0) for s in scores)
    lo, hi = wilson_interval(int(sum(scores)), n) if binary else bootstrap_interval(scores, seed=seed)
    cell = {"n": n, "accuracy": mean, "ci": [lo, hi]}
    if dense is not None:
        diffs = [a - b for a, b in zip(scores, dense)]
        dlo, dhi = bootstrap_interval(diffs, seed=seed)
        cell.update(diff=sum(diffs) / n, diff_ci=[dlo, dhi], equal=dlo <= 0.0 <= dhi)
    return cell


def long_report(records: list[dict], meta: dict | None = None) -> LongReport:
    """Aggregate answer records (answer_samples, or read back from a JSON lines file) into a LongReport."""
    if not records:
        raise GatherValueError("no answers to report (an empty records file?)")
    cells = {}
    for r in records:
        cells.setdefault((r["row"], r["length"], r["task"]), {})[r["seed"]] = r["score"]
    order = [row for row in ROWS if any(k[0] == row for k in cells)] + \
        sorted({k[0] for k in cells} - set(ROWS))
    rows = []
    for row in order:
        for length in sorted({k[1] for k in cells}):
            for task in [t for t in TASKS if (row, length, t) in cells]:
                mine, dense = cells[(row, length, task)], cells.get(("dense", length, task))
                seeds = sorted(set(mine) & set(dense)) if dense is not None and row != "dense" else sorted(mine)
                cell = _cell([mine[s] for s in seeds], [dense[s] for s in seeds] if row != "dense" and dense else None,
                             seed=length)
                rows.append({"setting": row, "length": length, "task": task, **cell})
    return LongReport(rows, dict(meta or {}, interval="95%: Wilson for 0/1 scores, else a 2000-draw bootstrap; diff: "
                                 "paired bootstrap of (row - dense) over the same samples"))
