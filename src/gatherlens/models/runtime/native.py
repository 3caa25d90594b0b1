"""The native runtime's switch: a NativeModel's forward made the decode-step table, no transformers module.

    >>> use_native_decoding(lm.model, config_of_budget(512))   # what generation does for a NativeModel
    >>> cache = native_cache(lm.model, 4096)                    # a PagedKVCache / WindowRing per layer
    >>> lm.model(input_ids=ids, cache=cache, logits_to_keep=1).logits   # the chunk row, then stack / planned
    >>> use_native_dense(lm.model)                              # the forward removed again

`use_sparse_decoding` / `use_dense_decoding` (models/runtime/decoding.py) do this for a transformers
model through transformers' extension points; a NativeModel (models/gguf/native.py) has none: its
forward is `DECODE_STEP(model.plan, model, args, kwargs)` (models/runtime/step.py), which picks the
chunked prefill, the C++ stack or the planned loop per call and says why (`backends.describe()`), and
its one SparseConfig sits where decode_attention and the stack row look for it (`CONFIG_ATTR` on the
model and on each layer's LayerHandle). Nothing here imports transformers: `generate --quantized` on
a file the native runtime runs never loads it (tests/test_native_runtime.py checks it in a subprocess).
"""
from __future__ import annotations

import dataclasses

from gatherlens.errors import GatherValueError
from gatherlens.models.attention.sparse import CONFIG_ATTR
from gatherlens.models.gguf.native import NativeCache, NativeModel
from gatherlens.models.runtime.step import DECODE_STEP, STEPS, row_refusal
from gatherlens.ops.backends import AUTO
from gatherlens.ops.sparse.config import DEFAULT, SparseConfig

__all__ = ["use_native_decoding", "use_native_dense", "native_cache", "is_native", "native_config"]


def is_native(model) -> bool:
    """True for the native runtime's model (models/gguf/native.py)."""
    return isinstance(model, NativeModel)


def native_config(budget: int | str | None, **settings) -> SparseConfig:
    """The SparseConfig of a native generation: DEFAULT with `budget` (tokens, "auto": pages by estimated
    attention mass within min_pages..max_pages, None: dense) and the settings given (mass, min_pages, ...)."""
    return DEFAULT.replace(budget=budget, **settings)


def use_native_decoding(model: NativeModel, config: SparseConfig = DEFAULT, step: str = AUTO) -> NativeModel:
    """Make the model's forward DECODE_STEP over its plan, decoding with `config`; step: the fastest row its
    decode steps may take ("auto", "stack", "planned"), as use_sparse_decoding's."""
    if step not in (AUTO, *STEPS[:2]):
        raise GatherValueError(f"step = {step!r} must be one of {(AUTO, *STEPS[:2])} for the native runtime")
    plan = model.plan if model.plan.asked == step else dataclasses.replace(model.plan, asked=step, state={})
    if step != AUTO:
        why = DECODE_STEP.by_name[step].refusal((plan.variants, None)) or row_refusal(plan, step)
        if why is not None:
            raise GatherValueError(f"step = {step!r} cannot run {model!r}: {why}")
    model.plan = plan
    for holder in (model, *(layer.attention for layer in plan.layers)):
        holder.__dict__[CONFIG_ATTR] = config
    model.runner = DECODE_STEP
    return model


def use_native_dense(model: NativeModel) -> NativeModel:
    """Undo use_native_decoding: no forward, no configuration."""
    model.runner = None
    for holder in (model, *(layer.attention for layer in model.plan.layers)):
        holder.__dict__.pop(CONFIG_ATTR, None)
    return model


def native_cache(model: NativeModel, tokens: int, config: SparseConfig | None = None) -> NativeCache:
    """An empty cache for `tokens` tokens (room made now: no decode step grows it), stored as `config` says
    (default: the one use_native_decoding installed)."""
    config = config or model.__dict__.get(CONFIG_ATTR) or DEFAULT
    return model.new_cache(config.page_size, config.kv_dtype, capacity=tokens)
