"""Decode token by token with page-selected sparse decoding, and say which pages each step read.

    >>> for kind, data in decode_steps(lm, "The cat sat on the", max_new=8, budget=16, page_size=4):
    ...     print(kind, data.get("token"), data.get("layers", [[]])[0])
    start ' mat' None                 # the prompt runs densely (prefill) and gives the first token
    step ' and' [[0, 2, 3], [0, 1, 3]]    # layer 0: the pages each KV head read

A plain generator of plain data, so the server can run one step at a time in a worker thread
and stop between two steps when its client goes away (closing the generator puts the model
back to dense decoding). Greedy decoding; it stops at the tokenizer's end-of-sequence token.
The pages come from `gatherlens.models.sparse.observe_sparse`: every decode step of every layer
reports its PageSelection.
"""
from __future__ import annotations

from typing import Iterator

import torch

from gatherlens.errors import GatherValueError
from gatherlens.report.collect import shown_token

__all__ = ["decode_steps"]


def _prompt(lm, text: str, max_tokens: int) -> torch.Tensor:
    """The prompt's (1, S) ids, or a clear error (an encoder, a prompt over the limit)."""
    if not lm.is_causal:
        raise GatherValueError(f"{lm.name} is an encoder ({type(lm.model).__name__}): it does not "
                               f"generate; switch to a causal LM such as smollm2")
    ids = lm.encode(text)                                                    # (1, S)
    if ids.shape[1] > max_tokens:
        raise GatherValueError(f"text has {ids.shape[1]} tokens; the limit is {max_tokens}")
    return ids


def _step_data(step: int, new_id: int, text: str, picked: dict, length: int, P: int) -> dict:
    layers = [picked.get(i, []) for i in range(max(picked, default=-1) + 1)]
    return {"step": step, "token_id": new_id, "token": text, "shown": shown_token(text),
            "length": length, "pages_total": -(-length // P), "layers": layers}


def decode_steps(lm, text: str, max_new: int, budget: int, page_size: int,
                 max_tokens: int = 4096) -> Iterator[tuple[str, dict]]:
    """("start", {...}) for the prompt, then ("step", {...}) per decode step, ("done", {...}).

    start: prompt, prompt_tokens, page_size, budget, layers, pages (of the prompt), token (the
    first new token, from the dense prefill). step: step, token, token_id, shown, length (tokens
    in the cache), pages_total, layers[l][h] = the page ids KV head h of layer l read.
    """
    from gatherlens.models.sparse import (SparseKVCache, observe_sparse, use_dense_decoding,
                                          use_sparse_decoding)

    model, tok = lm.model, lm.tokenizer
    ids = _prompt(lm, text, max_tokens)                                      # (1, S)
    S, eos = ids.shape[1], getattr(tok, "eos_token_id", None)
    picked: dict[int, list] = {}
    use_sparse_decoding(model, budget=budget, page_size=page_size, dense_layers=0, recent=0,
                        dense_share=1.0, share_selection=True)  # every layer chooses, at every budget below the cache
    try:
        cache = SparseKVCache(config=model.config, page_size=page_size)
        with torch.no_grad(), observe_sparse(lambda c: picked.__setitem__(c.layer, c.selection.pages[0].tolist())):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            new = [int(out.logits[0, -1].argmax())]
            said = tok.decode(new)
            yield "start", {"prompt": text, "prompt_tokens": S, "page_size": page_size, "budget": budget,
                            "layers": model.config.num_hidden_layers, "pages": -(-S // page_size),
                            "token": said, "shown": shown_token(said)}
            for step in range(1, max_new):
                if new[-1] == eos:
                    break
                picked.clear()
                out = model(input_ids=torch.tensor([[new[-1]]]), cache=cache, use_cache=True)
                new.append(int(out.logits[0, -1].argmax()))
                full = tok.decode(new)
                piece, said = full[len(said):], full
                yield "step", _step_data(step, new[-1], piece, picked, S + step, page_size)
        yield "done", {"message": f"{len(new)} tokens generated", "tokens": len(new)}
    finally:
        use_dense_decoding(model)
