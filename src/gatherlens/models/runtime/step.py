"""A causal LM's forward as one backend table, `DECODE_STEP`: the C++ stack, the planned loop, transformers.

    >>> install_step(model)                      # use_sparse_decoding does this: the plan, and the table as forward
    >>> installed_plan(model).layers[0].shape    # what the walker read once (plan.py)
    >>> DECODE_STEP.why(plan, model, (ids,), {"cache": cache})   # which rows run this call, and why not
    >>> remove_step(model)                       # use_dense_decoding does this

Every forward of the model goes through `DECODE_STEP` (ops/backends.py), whose rows are tried in order:

- **stack**: `gatherlens::decode_stack` (ops/layer/stack.py), every layer, the final norm and the head in
  one C++ operator. Declares (`_COMPUTES`): Llama's layer and q/k/v biases (Qwen2), q/k head norms
  (Qwen3, Gemma 3), sandwich norms, GeGLU and norms scaling by 1 + w (Gemma), a fused q|k|v (Phi-3), a
  scaled embedding; the variant field window (a local layer's ring, read densely), none other (no
  soft-capping, no sinks); angles that do not depend on the call (default, linear, llama3, yarn: each
  layer's kind its own table), one geometry and one activation for every layer, every product a q8act
  weight (`stack_refusal`); per call: one token, batch 1, no padding, no observer or kept selection
  (they want each layer's PageSelection), every layer paged (a global layer's PagedKVCache, a local
  layer's WindowRing) and read in float32.
- **planned**: the planned loop (`planned_run`, `planned_layer`): the same operators called one by one
  from Python on the same plan, the C++ stack's reference (bit-equal, tested). Declares: what the stack
  computes, the variant fields softcap, sinks and window (decode_attention hands the first two to sparse
  decode's own table), any products; per call: one-token steps of any batch over a cache whose layers
  are all paged (transformers' SparseKVCache, the native runtime's), transformers' 2-D padding mask (not
  over a ring), no training.
- **chunk**: a prefill of the native runtime's plan (models/runtime/chunk.py: the products' prefill
  row, SDPA under the causal and window mask), for plans read from a GGUF (`plan.origin == "gguf"`).
- **hf**: transformers' own forward (every prefill of a transformers model, other caches, anything the
  others refuse; never a native plan, which has no transformers module).

So `backends.describe()` (`explain`, `bench generate --profile`) names the step that ran and why the
others did not; nothing falls back silently. The model is a transformers causal LM (`install_step`
makes its forward this table) or the native runtime's `NativeModel` (models/runtime/native.py), whose
forward calls the table itself. `use_sparse_decoding(step=...)` names the fastest row a
model's steps may take ("auto": the stack; "planned"; "hf": transformers' layers, the old lean=False);
a named row that cannot run the model is an error at install, naming why. A new way of running a
step (issue 37's batched step over several sequences, each with its own cache, reading the weights
once) is one more row here, reading the same plan.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch
import torch.nn.functional as F

from gatherlens.errors import GatherValueError
from gatherlens.models.attention.sparse import decode_attention, metered, metering, observed, sparse_settings
from gatherlens.models.hf_adapter import causal_lm_output, is_causal_lm, replace_forward, restore_forward
from gatherlens.models.runtime.chunk import chunk_forward
from gatherlens.models.runtime.plan import plan_model
from gatherlens.ops.attention.variants import capped
from gatherlens.ops.backends import AUTO, EVERY_VARIANT, Impl, Operator
from gatherlens.ops.layer import add_rms_norm_cast, glu_cast, rms_norm_cast, rope_append
from gatherlens.ops.layer.plan import DecodePlan, LayerPlan
from gatherlens.ops.layer.stack import StackCaches, decode_stack, kernel_loaded, stack_refusal
from gatherlens.ops.quant.products.linear import LINEAR_PRODUCT
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import DEFAULT
from gatherlens.ops.sparse.dense_runs import note_cover, step_budget
from gatherlens.ops.sparse.decode import SPARSE_DECODE, decode_pages
from gatherlens.ops.sparse.fused_decode import native_cache_fits
from gatherlens.ops.sparse.ring import WindowRing

__all__ = ["DECODE_STEP", "STEPS", "install_step", "step_plan", "remove_step", "installed_plan", "step_declarations",
           "planned_run", "planned_layer", "layer_caches", "row_refusal", "COMPUTES"]

_PLAN = "gatherlens_decode_plan"  # the model's DecodePlan, in its __dict__ while installed
STEPS = ("stack", "planned", "hf")  # DECODE_STEP's rows, fastest first
ANGLES = 256  # positions of rotary angles the stack makes at once (the model's own rotary module)
# what each row computes beyond Llama's layer (LayerShape fields, models/gguf/arch.py): all but experts
_LAYERS = frozenset({"qkv_bias", "qk_norm", "sandwich_norms", "fused_qkv", "activation", "norm_offset", "embed_scale"})
COMPUTES = {"stack": _LAYERS, "planned": _LAYERS}
_COMPUTES = COMPUTES
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # angles of a position that do not depend on the call
# the arguments of a causal LM's forward the two plan rows read (anything else goes to transformers)
_KNOWN = frozenset({"input_ids", "attention_mask", "position_ids", "cache", "past_key_values", "use_cache",
                    "cache_position", "logits_to_keep", "return_dict", "output_attentions", "output_hidden_states",
                    "inputs_embeds"})


# -- the one installer ---------------------------------------------------------------------------------
def install_step(model, step: str | DecodePlan = AUTO, transposed: bool = True) -> DecodePlan:
    """Make the model's forward DECODE_STEP over its plan (`step_plan(model, step, transposed)`, or the
    plan given); returns the plan."""
    plan = step if isinstance(step, DecodePlan) else step_plan(model, step, transposed)
    remove_step(model)
    model.__dict__[_PLAN] = plan
    replace_forward(model, step_forward)
    return plan


def step_plan(model, step: str = AUTO, transposed: bool = True) -> DecodePlan:
    """The model's plan (plan_model: built now, once), checked against `step`, the fastest row its steps
    may take ("auto", "stack", "planned", "hf"): a row named that cannot run this model is an error naming
    why (before anything is switched). transposed: see plan_model."""
    if step not in (AUTO, *STEPS):
        raise GatherValueError(f"step = {step!r} must be one of {(AUTO, *STEPS)}")
    plan = plan_model(model, step, transposed)
    if step in _COMPUTES:
        why = DECODE_STEP.by_name[step].refusal((plan.variants, None)) or _declared(plan, step)
        if why is not None:
            raise GatherValueError(f"step = {step!r} cannot run {type(model).__name__}: {why}")
    return plan


def remove_step(model) -> None:
    """The model's class forward back, its plan (and the head's transposed copy) dropped."""
    if model.__dict__.pop(_PLAN, None) is not None:
        restore_forward(model)


def installed_plan(model) -> DecodePlan | None:
    """The model's DecodePlan while install_step is in effect, else None."""
    return model.__dict__.get(_PLAN)


def step_declarations(model) -> dict[str, str | None]:
    """{row: None where it runs the installed model's one-token steps, else why not (its declaration: the
    model's layers, variants, products, the step asked for)}; {} when install_step is not in effect.

        >>> step_declarations(model)     # a quantized SmolLM2
        {'stack': None, 'planned': None, 'hf': None}
    """
    plan = installed_plan(model)
    if plan is None:
        return {}
    used = plan.variants
    return {impl.name: impl.refusal((used, None)) or row_refusal(plan, impl.name) for impl in DECODE_STEP.impls}


def row_refusal(plan: DecodePlan, row: str) -> str | None:
    """None when `row` runs this plan's model (its declaration), else why not."""
    if row in _COMPUTES:
        return _declared(plan, row)
    native = plan.origin == "gguf"
    if row == "chunk":
        return None if native else "the plan is a transformers model's (its prefill runs transformers' layers)"
    return "a native plan has no transformers module" if native else None


def step_forward(self, *args, **kwargs):
    """The causal LM's forward: the first row of DECODE_STEP that takes this call."""
    return DECODE_STEP(self.__dict__[_PLAN], self, args, kwargs)


# -- what each row declares it runs (once per plan) -----------------------------------------------------
def _declared(plan: DecodePlan, row: str) -> str | None:
    """None when `row` runs this plan's model (its declaration), else why not; asked once per plan."""
    known = plan.state.setdefault("declared", {})
    if row not in known:
        known[row] = _declaration(plan, row)
    return known[row]


def _declaration(plan: DecodePlan, row: str) -> str | None:
    if plan.asked != AUTO and STEPS.index(row) < STEPS.index(plan.asked):
        return f"use_sparse_decoding(step={plan.asked!r}) keeps the model's steps at {plan.asked!r} or below"
    if plan.refusal is not None:
        return plan.refusal
    for layer in plan.layers:
        beyond = sorted(set(layer.shape.beyond_llama()) - _COMPUTES[row])
        if beyond:
            return f"layer {layer.index} computes {', '.join(beyond)} beyond Llama's layer (this row does not)"
    return _stack_declaration(plan) if row == "stack" else None


def _stack_declaration(plan: DecodePlan) -> str | None:
    """What the C++ stack adds to the planned loop's declaration: q8act blocks, one geometry, gate|up as one
    weight, static angles."""
    why = stack_refusal(plan)
    if why is not None:
        return why
    first = plan.layers[0]
    if any((l.heads, l.kv_heads, l.head_dim, l.scaling, l.qkv_sizes, l.activation) != (first.heads, first.kv_heads,
           first.head_dim, first.scaling, first.qkv_sizes, first.activation) for l in plan.layers):
        return "its layers differ in heads, head size, scale or activation (the operator takes one of each)"
    if any(kind not in _STATIC_ROPE for kind in plan.rope_type.split(",")):
        return f"rope_type {plan.rope_type!r} (the operator reads angles made {ANGLES} positions at a time)"
    return None


# -- the calls each row takes ---------------------------------------------------------------------------
def _cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def layer_caches(cache) -> list | None:
    """What each layer of `cache` reads and writes (a PagedKVCache, a local layer's WindowRing), or None
    while a layer holds neither (no pages yet, transformers' window layer). The native runtime's cache holds
    them itself; transformers' SparseKVCache holds them as its layers' `paged`."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    kvs = [layer if isinstance(layer, (PagedKVCache, WindowRing)) else getattr(layer, "paged", None) for layer in layers]
    return kvs if all(isinstance(kv, (PagedKVCache, WindowRing)) for kv in kvs) else None


def _one_token(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    """None for a one-token step over a cache whose layers are all paged (what both plan rows take), else
    why not."""
    ids = args[0] if args else kwargs.get("input_ids")
    if len(args) > 1 or ids is None:
        return "positional arguments beyond input_ids, or no input_ids (inputs_embeds)"
    if ids.dim() != 2 or ids.shape[1] != 1:
        return f"a {ids.shape[-1]}-token forward (a prefill: the plan rows run one-token steps)"
    unknown = sorted(k for k, v in kwargs.items() if k not in _KNOWN or (k.startswith(("output_", "inputs_"))
                                                                         and v is not None and v is not False))
    if unknown:
        return f"argument {unknown[0]!r} (the plan rows take token ids and return logits and the cache only)"
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() != 2:
        return f"a {mask.dim()}-D attention mask (the plan rows read transformers' 2-D padding mask)"
    cache = _cache_of(kwargs)
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) != len(plan.layers):
        return f"the cache is a {type(cache).__name__} (the plan rows run over the model's paged cache)"
    seen = plan.state.get("paged")
    if seen is None or seen() is not cache:  # a layer once paged stays paged: asked once per cache
        kvs = layer_caches(cache)
        if kvs is None:
            return "a layer of the cache holds no pages yet (or transformers' window layer)"
        if mask is not None and any(isinstance(kv, WindowRing) for kv in kvs) and not bool(mask.all()):
            return "a padded row over a window ring (its slots are not in position order)"
        plan.state["paged"] = weakref.ref(cache)
    return None


def _planned_fits(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    why = _declared(plan, "planned") or _one_token(plan, model, args, kwargs)
    if why is None and model.training and torch.is_grad_enabled():
        return "the model is training (the plan rows run without autograd)"
    return why


def _stack_fits(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    why = _declared(plan, "stack") or _one_token(plan, model, args, kwargs)
    if why is not None:
        return why
    ids, mask, config = args[0] if args else kwargs["input_ids"], kwargs.get("attention_mask"), sparse_settings(model)
    if ids.shape[0] != 1 or torch.is_grad_enabled():
        return "a batch of several rows, or gradients on (the operator runs one row without autograd)"
    if observed() or config is None or config.keep_selection:
        return "an observer or kept selections want each layer's PageSelection"
    if config.choose != "bound":
        return f"choose = {config.choose!r} (the operator ranks pages by their bound only)"
    if mask is not None and not bool(mask.all()):
        return "a padded row (the operator attends to every cached token)"
    view = _view(plan, _cache_of(kwargs))
    if isinstance(view, str):
        return view
    positions = kwargs.get("position_ids")
    if positions is not None and int(positions[0, -1]) != view.length:
        return "position_ids other than the cache's length"
    plan.state["fitted"] = (kwargs, view)  # this call's view, for its run (another call's run makes its own)
    return None


def _view(plan: DecodePlan, cache) -> StackCaches | str:
    """The StackCaches of `cache` when every layer is batch 1, equally long and read natively (checked
    when a view is made; kept while current), else why not."""
    caches = layer_caches(cache)
    ref, old = plan.state.get("last", (None, None))
    if ref is not None and ref() is cache and old.caches == caches:
        view = StackCaches.of(caches, old)
        if view is old:
            return view
    for c in caches:
        pages = c.pages if isinstance(c, WindowRing) else c
        why = native_cache_fits(pages) or (None if pages.batch == 1 and c.length == caches[0].length else
                                           "the layers' caches differ in batch or length")
        if why is not None:
            return why
    view = StackCaches.of(caches)
    plan.state["last"] = (weakref.ref(cache), view)
    return view


# -- the rows' runs -------------------------------------------------------------------------------------
def _stack_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """The whole step on the C++ operator: the embedding and the angles from the plan, then decode_stack."""
    ids, config = args[0] if args else kwargs["input_ids"], sparse_settings(model)
    fitted, view = plan.state.pop("fitted", (None, None))  # not kept: it holds the call's cache
    view = view if fitted is kwargs else _view(plan, _cache_of(kwargs))  # the view this call's fits made
    position = view.length
    x = plan.embed(ids)  # (1, 1, d)
    angles = _angles(plan, position)
    budgets = _budgets(plan, config, position + 1, view.caches)
    counts = _counts(plan, config) if metered() else None  # (layers, Hsel): the pages each head read
    covered = _covered(plan) if config.dense_cover is not None else None  # (layers,): pages needed, -1 dense
    logits = decode_stack(x.view(1, -1).float(), [angles[layer.angles] for layer in plan.layers], plan, view,
                          budgets, config.choice, plan.layers[0].scaling, counts, covered)  # (1, V)
    for cache, pages in zip(view.caches, [] if covered is None else covered.tolist()):
        if pages >= 0:  # a sparse step: the layer's next steps dense when it needed nearly every page
            note_cover(config, cache, pages)
    for i, row in enumerate(counts if counts is not None else ()):  # (Hsel,) per layer; a ring is no global layer
        if not isinstance(view.caches[i], WindowRing):
            metering(plan.layers[i].index, row, budgets[i] < position + 1)
    products = plan.state.get("products")
    if products is None:
        products = plan.state["products"] = sum(len(l.qkv) + len(l.gate_up) + 2 for l in plan.layers) + 1
    LINEAR_PRODUCT.record("q8act", products, "decode_step.stack")  # the kernels it called are these rows'
    SPARSE_DECODE.record("native", len(plan.layers), "decode_step.stack")
    return _output(model, capped(logits, plan.logit_softcap).view(1, 1, -1), _cache_of(kwargs))


def _output(model, logits: torch.Tensor, cache):
    """What the model's forward returns: transformers' output for a transformers model, the native
    runtime's own (`step_output`) for its model."""
    own = getattr(model, "step_output", None)
    return own(logits, cache) if own is not None else causal_lm_output(logits, cache)


def _budgets(plan: DecodePlan, config, length: int, caches: list) -> list:
    """Each layer's budget for a step over `length` tokens: every one (dense) for the first dense_layers
    ranks, else dense_runs.step_budget's (config.budget_for's, or dense during the layer's dense run; a
    local layer's ring reads every token it holds whatever its budget)."""
    dense = plan.state.get("dense")
    if dense is None or dense[0] is not config:
        dense = plan.state["dense"] = (config, tuple(config.dense_at(layer.rank) for layer in plan.layers))
    return [length if d else step_budget(config, cache, length) for d, cache in zip(dense[1], caches)]


def _covered(plan: DecodePlan) -> torch.Tensor:
    """(layers,) int64 for the operator to fill with the pages each paged layer's KV groups needed (made once)."""
    covered = plan.state.get("covered")
    if covered is None or covered.shape[0] != len(plan.layers):
        covered = plan.state["covered"] = torch.empty(len(plan.layers), dtype=torch.long)
    return covered


def _counts(plan: DecodePlan, config) -> torch.Tensor:
    """(layers, selection heads) int64 for the operator to fill with the pages each head read."""
    first = plan.layers[0]
    return torch.empty(len(plan.layers), first.kv_heads if config.share_selection else first.heads,
                       dtype=torch.long)


def _angles(plan: DecodePlan, position: int) -> dict:
    """{angle table: (cos, sin) (1, D)} of `position`, ANGLES positions made at a time per table (the same
    products as one position's: each angle is one inv_freq x position)."""
    first, tables = plan.state.get("angles", (-1, None))
    if tables is None or not first <= position < first + ANGLES:
        positions = torch.arange(position, position + ANGLES)[None]  # (1, ANGLES)
        first, tables = position, {name: tuple(t[0].float().contiguous() for t in angles(positions))
                                   for name, angles in plan.angles.items()}  # (ANGLES, D) x2 each
        plan.state["angles"] = (first, tables)
    at = position - first
    return {name: (cos[at:at + 1], sin[at:at + 1]) for name, (cos, sin) in tables.items()}  # (1, D) x2 each


def planned_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """The planned loop: one token of B rows through every layer's plan, the final norm and the head,
    from Python, calling the operators the C++ stack calls (the stack's reference)."""
    ids, cache = args[0] if args else kwargs["input_ids"], _cache_of(kwargs)
    B = ids.shape[0]
    x = plan.embed(ids)  # (B, 1, d)
    positions = kwargs.get("position_ids")
    if positions is None:
        at = kwargs.get("cache_position")
        positions = at.view(1, -1).expand(B, -1) if at is not None else torch.full((B, 1), cache.get_seq_length())
    angles = {name: tuple(t.reshape(B, -1).float() for t in table(positions))
              for name, table in plan.angles.items()}  # {table: (B, D) x2}
    mask = kwargs.get("attention_mask")
    mask = None if mask is None or bool(mask.all()) else mask[:, None, None, :].bool()  # (B, 1, 1, L)
    h, kvs = x.view(B, -1), layer_caches(cache)  # (B, d)
    for layer in plan.layers:
        h = planned_layer(layer, h, *angles[layer.angles], mask, kvs[layer.index])  # (B, d)
    h = rms_norm_cast(h, plan.final_norm, plan.final_eps, plan.head.act or h.dtype)  # (B, d)
    return _output(model, capped(plan.head(h), plan.logit_softcap).view(B, 1, -1), cache)  # logits (B, 1, V)


def planned_layer(layer: LayerPlan, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask,
                  kv: PagedKVCache | WindowRing | list) -> torch.Tensor:
    """One decoder layer, one token: x (B, d) -> (B, d), its key and value appended to `kv` (a global layer's
    PagedKVCache, a local layer's WindowRing; or a list of them, one a row: sequences of their own lengths).

        h = rms_norm(x);  q, k, v = h Wq, h Wk, h Wv (+ biases);  q, k = head norms of q, k (Qwen3, Gemma 3)
        rope_append (RoPE(q, k), k and v into the cache);  out = decode_attention (a ring: dense)
        y = out Wo (its sandwich norm);  x, h = x + y, rms_norm(x + y);  y = act_mul(h Wg|u) Wd (its norm);  x + y

    The same operators as the C++ stack, in the same order (bit-equal); gate and up as two float weights
    (a float model's, which the stack does not run) are gated as transformers gates them, act(g) * u.
    """
    B, act = x.shape[0], layer.act or x.dtype  # act: what the products take (bf16 for int4 blocks)
    h = rms_norm_cast(x, layer.norms[0], layer.eps[0], act)  # (B, d)
    out = _attention(layer, h, cos, sin, mask, kv, x.dtype)  # (B, Hq, 1, Dv)
    y = _sandwich(layer.o(_as(out.reshape(B, -1), act)), layer, 0)  # (B, d)
    s, h = add_rms_norm_cast(x, y, layer.norms[1], layer.eps[1], act)  # (B, d) x2: x + attention, its norm
    y = _sandwich(layer.down(_gated(layer, h, act)), layer, 1)  # (B, d)
    return _as(s, x.dtype) + y  # (B, d)


def _attention(layer: LayerPlan, h: torch.Tensor, cos, sin, mask, kv, dtype: torch.dtype) -> torch.Tensor:
    """h (B, d) -> the attention's output (B, Hq, 1, Dv), the token's key and value appended to kv; the
    query in `dtype` (the layer's input's)."""
    if len(layer.qkv) == 1:
        q, k, v = layer.qkv[0](h).split(layer.qkv_sizes, dim=-1)  # (B, Hq*D), (B, Hkv*D), (B, Hkv*Dv)
    else:
        q, k, v = (p(h) for p in layer.qkv)  # (B, Hq*D), (B, Hkv*D), (B, Hkv*Dv)
    if layer.qk_norms is not None:  # each head's q and k normed before RoPE (Qwen3, Gemma 3)
        q, k = (_head_norm(t, w, layer.qk_eps, layer.head_dim) for t, w in zip((q, k), layer.qk_norms))
    if isinstance(kv, list):  # one cache a row (a server's slots, runtime/batch.py): each at its own position
        return torch.cat([_attend(layer, q[i:i + 1], k[i:i + 1], v[i:i + 1], cos[i:i + 1], sin[i:i + 1], None, c,
                                  dtype) for i, c in enumerate(kv)])  # (B, Hq, 1, Dv)
    return _attend(layer, q, k, v, cos, sin, mask, kv, dtype)


def _attend(layer: LayerPlan, q, k, v, cos, sin, mask, kv, dtype: torch.dtype) -> torch.Tensor:
    """q, k, v (B, H*D) of one token -> (B, Hq, 1, Dv): RoPE, the append to kv, attention over it."""
    if isinstance(kv, WindowRing):
        q = rope_append(q, k, v, cos, sin, kv.begin_write()).unsqueeze(2)  # (B, Hq, 1, D); RoPE(k), v in its slot
        kv.end_write()
        return decode_pages(_as(q, kv.pages.dtype), kv.pages, kv.held, DEFAULT.choice, layer.scaling,
                            _ring_variant(layer))[2]  # (B, Hq, 1, Dv): every token the ring holds
    q = rope_append(q, k, v, cos, sin, kv).unsqueeze(2)  # (B, Hq, 1, D); RoPE(k), v in the cache
    return decode_attention(layer.attention, _as(q, dtype), kv, mask, layer.scaling, layer.variant)


def _head_norm(t: torch.Tensor, weight: torch.Tensor, eps: float, D: int) -> torch.Tensor:
    """RMSNorm of each head of t (B, H*D) by weight (D,): (B, H*D), in t's dtype."""
    B = t.shape[0]
    return rms_norm_cast(t.reshape(-1, D), weight, eps, t.dtype).view(B, -1)  # (B, H*D)


def _ring_variant(layer: LayerPlan):
    """The layer's variant without its window (the ring holds exactly the window): made once per variant."""
    held = _RING_VARIANTS.get(id(layer.variant))
    if held is None or held[0] is not layer.variant:
        held = _RING_VARIANTS[id(layer.variant)] = (layer.variant, dataclasses.replace(layer.variant, window=None))
    return held[1]


_RING_VARIANTS: dict = {}


def _gated(layer: LayerPlan, h: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """h (B, d) -> act(h Wg) * h Wu (B, I): one gating call on gate|up (as the C++ stack: one packed weight, or
    two weights of blocks side by side), or transformers' arithmetic on two float weights."""
    if len(layer.gate_up) == 1:
        return glu_cast(layer.gate_up[0](h), layer.activation, act)  # (B, I)
    g, u = (p(h) for p in layer.gate_up)  # (B, I) x2
    if all(p.blocks is not None for p in layer.gate_up):
        return glu_cast(torch.cat([g, u], dim=-1), layer.activation, act)  # (B, I): the stack's one call
    f = F.silu if layer.activation == "silu" else lambda t: F.gelu(t, approximate="tanh")
    return (f(g) * u).to(act)  # (B, I)


def _sandwich(y: torch.Tensor, layer: LayerPlan, which: int) -> torch.Tensor:
    """y normed by the layer's sandwich norm after attention (0) or the MLP (1) (Gemma), else y itself."""
    if layer.sandwich is None:
        return y
    return rms_norm_cast(_as(y, torch.float32), layer.sandwich[which], layer.sandwich_eps[which], torch.float32)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _hf_fits(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    return None if is_causal_lm(model) else f"{type(model).__name__} is no transformers model (a native plan)"


def _hf_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """transformers' own forward (its layers, its head)."""
    return type(model).forward(model, *args, **kwargs)


def _chunk_fits(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    if plan.origin != "gguf":
        return "the plan is a transformers model's (its prefill runs transformers' layers: the hf row)"
    ids = args[0] if args else kwargs.get("input_ids")
    if ids is None or ids.dim() != 2 or ids.shape[0] != 1:
        return "no input_ids, or a batch of several rows (the chunk runs one row)"
    if layer_caches(_cache_of(kwargs)) is None:
        return "the cache is not the native runtime's (a PagedKVCache or WindowRing per layer)"
    return None


def _chunk_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """A prefill chunk of the native runtime through the plan (models/runtime/chunk.py)."""
    ids, cache = args[0] if args else kwargs["input_ids"], _cache_of(kwargs)
    logits = chunk_forward(plan, ids, layer_caches(cache), kwargs.get("logits_to_keep") or None)  # (1, n, V)
    return _output(model, logits, cache)


def _facts(plan: DecodePlan, model, args: tuple, kwargs: dict) -> tuple:
    """What the rows' declarations are checked against: the attention-variant fields any layer uses."""
    return plan.variants, None


def _stack_ready() -> str | None:
    return None if kernel_loaded() else "its C++ operator (decode_stack.cpp) did not build"


DECODE_STEP = Operator("decode_step", [
    Impl("stack", _stack_fits, _stack_run, ready=_stack_ready, variant=frozenset({"window"})),
    Impl("planned", _planned_fits, planned_run, variant=frozenset({"softcap", "sinks", "window"})),
    Impl("chunk", _chunk_fits, _chunk_run, variant=frozenset({"window"})),
    Impl("hf", _hf_fits, _hf_run, variant=EVERY_VARIANT),  # transformers' forward: any call of its model
], facts=_facts)
