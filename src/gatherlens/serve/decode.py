"""The explorer's generation: the one generation loop's events as the plain data the page draws.

    >>> for kind, data in decode_steps(lm, "The cat sat on the", max_new=8, budget=16, page_size=4):
    ...     print(kind, data.get("token"), data.get("layers", [[]])[0])
    start ' mat' None                 # the prompt runs densely (prefill) and gives the first token
    step ' and' [[0, 2, 3], [0, 1, 3]]    # layer 0: the pages each KV head read

The loop is gatherlens.models.runtime.generation.generation_steps (greedy; it stops at the model's
end-of-sequence token); this module only turns its events into dicts. A plain generator, so the
server can run one step at a time in a worker thread and stop between two steps when its client
goes away (closing it puts the model back to dense decoding). Every layer reports the pages it
read at every step (`pages=True`). The settings are the TOY preset (gatherlens.ops.sparse.config)
at the request's budget and page size: every layer chooses at every step, at every budget below
the cache.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.runtime.generation import (GenerationEnd, GenerationStart, GenerationStep, generation_steps,
                                          require_causal)
from gatherlens.ops.sparse.config import TOY
from gatherlens.ops.sparse.geometry import page_count
from gatherlens.models.runtime.decoding import observe_sparse
from gatherlens.report.collect import shown_token, token_texts
from gatherlens.serve.step_detail import StepMass, dense_choices

__all__ = ["decode_steps", "chat_steps", "layer_kinds_data"]


def _prompt(lm, text: str, max_tokens: int) -> torch.Tensor:
    """The prompt's (1, S) ids, or a clear error (an encoder, a prompt over the limit)."""
    require_causal(lm)
    ids = lm.encode(text)                                                    # (1, S)
    if ids.shape[1] > max_tokens:
        raise GatherValueError(f"text has {ids.shape[1]} tokens; the limit is {max_tokens}")
    return ids


def _start_data(text: str, start: GenerationStart, first: GenerationStep, kinds: list[dict]) -> dict:
    return {"prompt": text, "prompt_tokens": start.prompt_tokens, "page_size": start.page_size,
            "budget": start.budget, "layers": start.layers, "pages": page_count(start.prompt_tokens, start.page_size),
            "token": first.token, "shown": shown_token(first.token), "kinds": kinds}


def layer_kinds_data(model) -> list[dict]:
    """Each decoder layer's kind as JSON ({"kind", "window"}): a local layer reads its ring densely and
    chooses no pages (models/attention/window.py), which the pages x steps picture draws as such."""
    from gatherlens.models.attention.features import layer_kinds
    from gatherlens.report.run_tensors import kind_data

    try:
        return [kind_data(k) for k in layer_kinds(model.config)]
    except GatherValueError:        # a layer type the sparse path refuses: generation_steps says so itself
        return []


def _step_data(step: GenerationStep, page_size: int) -> dict:
    counts = [] if step.page_counts is None else step.page_counts.tolist()  # (layers, heads): pages each head read
    return {"step": step.index, "token_id": step.token_id, "token": step.token, "shown": shown_token(step.token),
            "length": step.length, "pages_total": page_count(step.length, page_size), "layers": step.page_ids(),
            "counts": counts, "chose": list(step.chose)}


def decode_steps(lm, text: str, max_new: int, budget: int | str, page_size: int,
                 max_tokens: int = 4096, detail: bool = False) -> Iterator[tuple[str, dict]]:
    """("start", {...}) for the prompt, then ("step", {...}) per decode step, ("done", {...}).

    start: prompt, prompt_tokens, page_size, budget, layers, pages (of the prompt), token (the
    first new token, from the dense prefill), kinds (each layer's {"kind", "window"}: a local layer's
    steps read its ring, no pages). step: step, token, token_id, shown, length (tokens
    in the cache), pages_total, layers[l][h] = the page ids KV head h of layer l read, counts[l][h]
    = how many (budget "auto": each head its own), chose[l] = whether layer l chose (else every page).
    detail (the live page's): start adds tokens (the prompt's, shown); step adds mass[l][h], the
    dense weight query head h of layer l put on the pages it read (serve/step_detail.py); done
    adds dense, what dense decoding would have chosen at every step (step_detail.dense_choices).
    """
    ids = _prompt(lm, text, max_tokens)                                      # (1, S)
    config = TOY.replace(budget=budget, page_size=page_size)               # the explorer's preset
    events = generation_steps(lm, ids, config.budget, max_new, pages=True, config=config)
    mass = StepMass() if detail else None
    start = end = None
    with observe_sparse(mass) if detail else contextlib.nullcontext():
        try:
            for event in events:
                if isinstance(event, GenerationStart):
                    start = event
                elif isinstance(event, GenerationEnd):
                    end = event
                else:
                    yield _event(lm, text, ids, start, event, mass)
        finally:
            events.close()  # back to dense decoding
    if end is not None:
        done = {"message": f"{len(end.new_ids)} tokens generated", "tokens": len(end.new_ids)}
        if detail:
            done["dense"] = dense_choices(lm, ids, end.new_ids, config)
        yield "done", done


def _event(lm, text: str, ids, start: GenerationStart, event: GenerationStep, mass: StepMass | None):
    """The ("start" | "step", data) of one step of the loop; with `mass` (detail), its extra fields."""
    if event.index == 0:
        data = _start_data(text, start, event, layer_kinds_data(lm.model))
        if mass is not None:
            data["tokens"] = [shown_token(t) for t in token_texts(lm.tokenizer, ids[0].tolist())]
        return "start", data
    data = _step_data(event, start.page_size)
    if mass is not None:
        data["mass"] = mass.take(start.layers)
    return "step", data


def chat_steps(lm, messages, sampling, max_new: int, budget: int, page_size: int,
               max_tokens: int = 4096) -> Iterator[tuple[str, dict]]:
    """The live page's chat: ("start", {...}), ("step", {...}) per new token, ("done", {...}).

    The conversation (a list of {"role", "content"}) becomes the prompt through the model's own chat template
    (models/runtime/chat.py; a clear error when it has none), and the reply stops at the template's
    end-of-turn token. Each token is sampled with `sampling` (ops/sampling's SamplingConfig) through the one
    generation loop; its step carries what generate's does (the pages each layer read) and `candidates`:
    the best five by logit from the sampler's own record (report/sampling.candidates: kept or cut, the
    renormalized p, the chosen one), with `kept` (how many candidates the cuts left) and `uniform` (the draw).
    """
    from gatherlens.models.runtime.chat import chat_prompt, chat_template_of, check_messages
    from gatherlens.report.sampling import candidates, shown_ids

    template = chat_template_of(lm)
    ids = chat_prompt(lm, check_messages(messages), template)                 # (1, S)
    if ids.shape[1] > max_tokens:
        raise GatherValueError(f"the conversation has {ids.shape[1]} tokens; the limit is {max_tokens} (reset it)")
    config, records = TOY.replace(budget=budget, page_size=page_size), []
    events = generation_steps(lm, ids, config.budget, max_new, pages=True, config=config, sampling=sampling,
                              stop=template.stop_ids, on_sample=records.append)
    start = None
    try:
        for event in events:
            if isinstance(event, GenerationStart):
                start = event
            elif isinstance(event, GenerationEnd):
                yield "done", {"text": event.text, "reason": event.reason, "tokens": len(event.new_ids)}
            else:
                rec = records.pop()                # this token's choice; the list holds one at most
                records.clear()
                words = {i: shown_token(lm.tokenizer.decode([i])) for i in shown_ids(rec, 5)}
                data = _step_data(event, start.page_size)
                data.update(candidates=candidates(rec, words), kept=int(rec.kept.numel()),
                            uniform=rec.uniform, prompt_tokens=start.prompt_tokens)
                if event.index == 0:
                    data.update(kinds=layer_kinds_data(lm.model), budget=start.budget, page_size=start.page_size)
                yield ("start" if event.index == 0 else "step"), data
    finally:
        events.close()  # back to dense decoding
