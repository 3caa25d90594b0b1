"""GET /api/sample: one draw of the sampler from a text's last logits row, and its picture.

    GET /api/sample?text=&model=&k=&topk=&temperature=&top_k=&top_p=&min_p=&seed=&lang=
    -> {"svg": "<svg ...>", "token": 7158, "text": "␣Rome", "kept": 9, "uniform": 0.37,
        "cuts": {"top_k": 40, "top_p": 12, "min_p": 9}, "candidates": [...], "cached": true}

The text's kept run (serve/runs.py: the last logits row rides in its RunTensors) gives the logits, so a
move of a slider runs no model; the draw is ops/sampling's own (report/sampling.sample_view), seeded by
`seed`, the picture render/sampling.py's. A bad setting is a 400 naming it (serve/params.sampling_params).
"""
from __future__ import annotations

__all__ = ["sample_body"]


def sample_body(lm, p, settings, runs, config) -> dict:
    """The answer of GET /api/sample (in a worker thread, with the model's lock held)."""
    from gatherlens.render.sampling import sampling_svg
    from gatherlens.report.sampling import candidates, sample_view, shown_ids
    from gatherlens.serve.attention_api import kept_run

    run, cached = kept_run(lm, p, settings, runs)
    rec, words = sample_view(run.tensors, config, lm.tokenizer)
    return {"svg": sampling_svg(rec, words, p.lang, shown_ids(rec)), "token": rec.token,
            "text": words.get(rec.token, ""), "kept": int(rec.kept.numel()), "uniform": rec.uniform,
            "cuts": {c.stage: int(c.ids.numel()) for c in rec.cuts}, "candidates": candidates(rec, words, 10),
            "cached": cached}
