"""What a generation step read, against dense attention, and what dense decoding would have chosen.

    >>> mass = StepMass()
    >>> with observe_sparse(mass):            # around the sparse generation's steps
    ...     ...                               # one decode step
    >>> mass.take(layers=30)[15][3]           # layer 15, query head 3: dense weight on the pages it read
    0.8421
    >>> dense_choices(lm, prompt_ids, new_ids)[4]
    {'step': 4, 'token_id': 262, 'token': ' the', 'shown': '␣the', 'p': 0.41, 'same': True}

StepMass is an observer of `gatherlens.models.observe_sparse`: at every sparse layer of a decode
step it takes the step's own query and the layer's paged cache (every key, this step's included),
computes dense attention over all of it (the same scale and mask; report.scores.score_rows) and
sums the weight on the keys of the pages the step read, per query head (the pages of its
selection head: its KV head's when the group shares one). Computed, not estimated.

dense_choices replays the generation with every step reading every key: the same prefill, then
the generated tokens fed back one at a time through the very path the steps took (the paged cache,
the planned decode step, the quantized model's one-row products) with the budget lifted (budget None:
dense over the whole cache), and reads the greedy choice after each prefix: what dense decoding
would have chosen at every step, given the same text so far. Only the budget differs, so step 0
(the prompt's own step, dense already) and every step at a budget covering the cache agree. (A
single forward pass over the whole text would be cheaper, but rounds differently: a quantized
model's products of many rows dequantize to float32, one-row steps round x to 8 bits.)
"""
from __future__ import annotations

import torch

from gatherlens.ops.sparse.config import TOY, SparseConfig
from gatherlens.report.collect import shown_token
from gatherlens.report.scores import score_rows

__all__ = ["StepMass", "dense_choices", "read_mass"]


def read_mass(query: torch.Tensor, keys: torch.Tensor, scale: float, read: torch.Tensor,
              allowed: torch.Tensor | None = None) -> torch.Tensor:
    """(Hq,) the dense weight each query head puts on the keys it read.

    query (Hq, D) one step's queries; keys (Hkv, L, D) the whole cache; read (Hsel, L) bool, the
    keys each selection head read (Hsel = Hq, or Hkv when a KV group shares its pages);
    allowed (L,) bool or None (every key).
    """
    Hq, L = query.shape[0], keys.shape[1]
    ok = torch.ones(1, L, dtype=torch.bool) if allowed is None else allowed.reshape(1, L)   # (1, L)
    dense = torch.softmax(score_rows(query.float().unsqueeze(1), keys.float(), scale, ok), dim=-1)[:, 0]  # (Hq, L)
    read = read.repeat_interleave(Hq // read.shape[0], dim=0)                              # (Hq, L)
    return (dense.nan_to_num(0.0) * read).sum(-1)                                          # (Hq,)


class StepMass:
    """Observer: per sparse layer of the current step, read_mass of its query heads (see the module doc)."""

    def __init__(self):
        self.rows: dict[int, list[float]] = {}

    def __call__(self, call) -> None:
        sel, cache = call.selection, call.cache
        L = cache.length
        pages_of = torch.arange(L) // sel.page_size                                       # (L,)
        read = sel.mask()[0].cpu()[:, pages_of]                                            # (Hsel, L)
        allowed = None if call.mask is None else call.mask[0, 0, 0].cpu()                  # (L,)
        mass = read_mass(call.query[0, :, 0].detach().cpu(), cache.keys[0].detach().cpu(), call.scale,
                         read, allowed)                                                    # (Hq,)
        self.rows[int(call.layer if call.layer is not None else len(self.rows))] = [round(float(m), 5) for m in mass]

    def take(self, layers: int) -> list[list[float]]:
        """[layer][query head] of the step just run (1.0 where a layer read every key); then forget it."""
        heads = len(next(iter(self.rows.values()), []))
        out = [self.rows.get(i, [1.0] * heads) for i in range(layers)]
        self.rows = {}
        return out


@torch.no_grad()
def dense_choices(lm, prompt: torch.Tensor, new_ids: tuple[int, ...], config: SparseConfig = TOY) -> list[dict]:
    """Per step (0 = the prompt's), the greedy token of dense decoding over the same text so far:
    the generation's path and SparseConfig (its page size; the explorer's TOY) with the budget lifted."""
    from gatherlens.models.files.watch import check_unchanged
    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding

    model = lm.model
    use_sparse_decoding(model, config=config.replace(budget=None))
    try:
        cache = SparseKVCache(config=model.config, page_size=config.page_size)
        feed = [prompt, *(torch.tensor([[t]], dtype=prompt.dtype) for t in new_ids[:-1])]  # (1, S), then (1, 1)s
        logits = torch.cat([model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
                            for ids in feed]).float()                                         # (T, V)
    finally:
        use_dense_decoding(model)
    check_unchanged(model)   # a model file changed meanwhile: no choices from its new bytes
    probs = torch.softmax(logits, dim=-1)                                                      # (T, V)
    out = []
    for i, b in enumerate(probs.argmax(-1).tolist()):
        tok = lm.tokenizer.decode([b])
        out.append({"step": i, "token_id": b, "token": tok, "shown": shown_token(tok),
                    "p": round(float(probs[i, b]), 5), "same": b == new_ids[i]})
    return out
