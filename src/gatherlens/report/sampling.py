"""The next token's sampling gather from a run's last logits row: the sampler's own record, and the
candidates' words.

    >>> rec, words = sample_view(run, SamplingConfig(temperature=0.8, top_k=40, seed=0), lm.tokenizer)
    >>> [(c.stage, c.ids.numel()) for c in rec.cuts]        # what each cut left
    >>> sampling_svg(rec, words, lang="zh")                 # gatherlens.render.sampling
    >>> candidates(rec, words, n=5)                         # JSON: the best 5 by logit, kept or cut, p

The record is ops/sampling's SampleRecord (llama.cpp's chain: penalties over the text's ids, top-k,
top-p, min-p, temperature, the seeded draw), made by the sampler itself (`sample(..., record=True)`);
nothing here re-implements a cut. `words` maps the ids a picture shows to their text.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.sampling import LLAMA_CPP, SamplingConfig, sample

__all__ = ["sample_view", "candidates", "shown_ids", "OFFLINE", "SHOWN"]

OFFLINE = LLAMA_CPP.replace(seed=0)   # the offline page's one draw: llama-server's defaults, seed 0
SHOWN = 10                            # candidates a picture lists (the best by logit, and the chosen one)


def shown_ids(rec, n: int = SHOWN) -> list[int]:
    """The ids a picture lists: the n highest logits (ties: the lower id first), and the chosen token."""
    best = torch.topk(rec.logits, min(n, rec.vocab_size)).indices.tolist()
    best.sort(key=lambda i: (-float(rec.logits[i]), i))
    return best + ([rec.token] if rec.token not in best else [])


def sample_view(run, config: SamplingConfig, tokenizer) -> tuple:
    """(SampleRecord, {id: text}) of one draw from `run`'s (a RunTensors) last logits row under `config`."""
    from gatherlens.report.collect import shown_token

    if run.logits is None:
        raise GatherValueError("this model is an encoder: it predicts no next token, so there is nothing to sample")
    generator = torch.Generator().manual_seed(config.seed if config.seed is not None else 0)
    _, rec = sample(run.logits, config, list(run.ids), generator, record=True)
    kept = rec.kept.tolist()
    ids = list(dict.fromkeys(shown_ids(rec) + kept[:SHOWN]))
    return rec, {i: shown_token(tokenizer.decode([i])) for i in ids}


def candidates(rec, words: dict, n: int = 5) -> list[dict]:
    """JSON of the n best candidates by logit: id, text, logit, p (renormalized, 0 when cut), kept, chosen."""
    kept = {i: float(p) for i, p in zip(rec.kept.tolist(), rec.probs.tolist())}
    return [{"id": i, "text": words.get(i, str(i)), "logit": round(float(rec.logits[i]), 4),
             "p": round(kept.get(i, 0.0), 5), "kept": i in kept, "chosen": i == rec.token}
            for i in shown_ids(rec, n)]
