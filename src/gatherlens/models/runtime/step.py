"""A causal LM's forward as one backend table, `DECODE_STEP`: the C++ stack, the planned loop, transformers.

    >>> install_step(model)                      # use_sparse_decoding does this: the plan, and the table as forward
    >>> installed_plan(model).layers[0].shape    # what the walker read once (plan.py)
    >>> DECODE_STEP.why(plan, model, (ids,), {"cache": cache})   # which rows run this call, and why not
    >>> remove_step(model)                       # use_dense_decoding does this

Every forward of the model goes through `DECODE_STEP` (ops/backends.py), whose rows are tried in order:

- **stack**: `gatherlens::decode_stack` (ops/layer/stack.py), every layer, the final norm and the head in
  one C++ operator. Declares: Llama's layer (no LayerShape field beyond it), no attention-variant field
  (no soft-capping, sinks or window), a rotary module whose angles do not depend on the call, gate|up
  packed as one weight, every product a bias-free q8act weight (`stack_refusal`); per call: one token, batch 1, no padding, no
  observer or kept selection (they want each layer's PageSelection), every layer paged and read in float32.
- **planned**: the planned loop (`planned_run`, `planned_layer`): the same operators called one by one
  from Python on the same plan, the C++ stack's reference (bit-equal, tested). Declares: Llama's layer
  or q/k/v biases, the variant fields softcap and sinks (decode_attention hands them to sparse decode's
  own table), any products; per call: one-token steps of any batch over a SparseKVCache whose layers
  are all paged, transformers' 2-D padding mask, no training.
- **hf**: transformers' own forward (every prefill, other caches, anything the others refuse).

So `backends.describe()` (`explain`, `bench generate --profile`) names the step that ran and why the
others did not; nothing falls back silently. `use_sparse_decoding(step=...)` names the fastest row a
model's steps may take ("auto": the stack; "planned"; "hf": transformers' layers, the old lean=False);
a named row that cannot run the model is an error at install, naming why. A new way of running a
step (issue 37's batched step over several sequences, each with its own cache, reading the weights
once) is one more row here, reading the same plan.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from gatherlens.errors import GatherValueError
from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.models.attention.sparse import decode_attention, metered, metering, observed, sparse_settings
from gatherlens.models.hf_adapter import causal_lm_output, replace_forward, restore_forward
from gatherlens.models.runtime.plan import plan_model
from gatherlens.ops.backends import AUTO, EVERY_VARIANT, Impl, Operator
from gatherlens.ops.layer import add_rms_norm_cast, rms_norm_cast, rope_append, silu_mul_cast
from gatherlens.ops.layer.plan import DecodePlan, LayerPlan
from gatherlens.ops.layer.stack import StackCaches, decode_stack, kernel_loaded, stack_refusal
from gatherlens.ops.quant.products.linear import LINEAR_PRODUCT
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.decode import SPARSE_DECODE
from gatherlens.ops.sparse.fused_decode import native_cache_fits

__all__ = ["DECODE_STEP", "STEPS", "install_step", "step_plan", "remove_step", "installed_plan", "step_declarations", "planned_run",
           "planned_layer"]

_PLAN = "gatherlens_decode_plan"  # the model's DecodePlan, in its __dict__ while installed
STEPS = ("stack", "planned", "hf")  # DECODE_STEP's rows, fastest first
ANGLES = 256  # positions of rotary angles the stack makes at once (the model's own rotary module)
# what each row computes beyond Llama's layer (LayerShape fields, models/gguf/arch.py)
_COMPUTES = {"stack": frozenset(), "planned": frozenset({"qkv_bias"})}
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
        why = _declared(plan, step)
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
    return {impl.name: impl.refusal((used, None)) or (_declared(plan, impl.name) if impl.name in _COMPUTES else None)
            for impl in DECODE_STEP.impls}


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
    if plan.embed_scale is not None or plan.logit_softcap is not None:
        return "the model scales its embedding or soft-caps its logits (this row does neither)"
    return _stack_declaration(plan) if row == "stack" else None


def _stack_declaration(plan: DecodePlan) -> str | None:
    """What the C++ stack adds to the planned loop's declaration: q8act blocks, one geometry, gate|up as one
    weight, static angles."""
    why = stack_refusal(plan)
    if why is not None:
        return why
    first = plan.layers[0]
    if any((l.heads, l.kv_heads, l.head_dim, l.scaling, l.qkv_sizes) != (first.heads, first.kv_heads,
           first.head_dim, first.scaling, first.qkv_sizes) for l in plan.layers):
        return "its layers differ in heads, head size or scale (the operator takes one of each)"
    if any(len(layer.gate_up) != 1 for layer in plan.layers):
        return ("gate and up are two weights (the planned loop, the operator's reference, gates two weights as "
                "transformers does, not with the operator's one SiLU-gating call)")
    if plan.rope_type not in _STATIC_ROPE:
        return f"rope_type {plan.rope_type!r} (the operator reads angles made {ANGLES} positions at a time)"
    return None


# -- the calls each row takes ---------------------------------------------------------------------------
def _cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def _one_token(plan: DecodePlan, model, args: tuple, kwargs: dict) -> str | None:
    """None for a one-token step over a SparseKVCache whose layers are all paged (what both plan rows
    take), else why not."""
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
    if not isinstance(cache, SparseKVCache) or len(cache.layers) != len(plan.layers):
        return f"the cache is a {type(cache).__name__} (the plan rows run over the model's SparseKVCache)"
    seen = plan.state.get("paged")
    if seen is None or seen() is not cache:  # a layer once paged stays paged: asked once per cache
        if not all(isinstance(getattr(layer, "paged", None), PagedKVCache) for layer in cache.layers):
            return "a layer of the cache holds no pages yet (or a window ring)"
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
    if positions is not None and int(positions[0, -1]) != view.caches[0].length:
        return "position_ids other than the cache's length"
    plan.state["fitted"] = (kwargs, view)  # this call's view, for its run (another call's run makes its own)
    return None


def _view(plan: DecodePlan, cache) -> StackCaches | str:
    """The StackCaches of `cache` when every layer is batch 1, equally long and read natively (checked
    when a view is made; kept while current), else why not."""
    caches = [layer.paged for layer in cache.layers]
    ref, old = plan.state.get("last", (None, None))
    if ref is not None and ref() is cache and old.caches == caches:
        view = StackCaches.of(caches, old)
        if view is old:
            return view
    for c in caches:
        why = native_cache_fits(c) or (None if c.batch == 1 and c.length == caches[0].length else
                                       "the layers' caches differ in batch or length")
        if why is not None:
            return why
    view = StackCaches.of(caches)
    plan.state["last"] = (weakref.ref(cache), view)
    return view


# -- the rows' runs -------------------------------------------------------------------------------------
def _stack_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """The whole step on the C++ operator: embedding and angles from the model's modules, then decode_stack."""
    ids, config = args[0] if args else kwargs["input_ids"], sparse_settings(model)
    fitted, view = plan.state.pop("fitted", (None, None))  # not kept: it holds the call's cache
    view = view if fitted is kwargs else _view(plan, _cache_of(kwargs))  # the view this call's fits made
    position = view.caches[0].length
    x = plan.embed(ids)  # (1, 1, d)
    cos, sin = _angles(plan, x, position)  # (1, D) x2
    budgets = _budgets(plan, config, position + 1)
    counts = _counts(plan, config) if metered() else None  # (layers, Hsel): the pages each head read
    logits = decode_stack(x.view(1, -1).float(), cos, sin, plan, view, budgets, config.choice,
                          plan.layers[0].scaling, counts)  # (1, V)
    for i, row in enumerate(counts if counts is not None else ()):  # (Hsel,) per layer
        metering(plan.layers[i].index, row, budgets[i] < position + 1)
    products = plan.state.get("products")
    if products is None:
        products = plan.state["products"] = sum(len(l.qkv) + len(l.gate_up) + 2 for l in plan.layers) + 1
    LINEAR_PRODUCT.record("q8act", products, "decode_step.stack")  # the kernels it called are these rows'
    SPARSE_DECODE.record("native", len(plan.layers), "decode_step.stack")
    return causal_lm_output(logits.view(1, 1, -1), _cache_of(kwargs))


def _budgets(plan: DecodePlan, config, length: int) -> list:
    """Each layer's budget for a step over `length` tokens: every one (dense) for the first dense_layers
    ranks, else config.budget_for's."""
    dense = plan.state.get("dense")
    if dense is None or dense[0] is not config:
        dense = plan.state["dense"] = (config, tuple(config.dense_at(layer.rank) for layer in plan.layers))
    budget = config.budget_for(length)  # a layer not among the dense ones
    return [length if d else budget for d in dense[1]]


def _counts(plan: DecodePlan, config) -> torch.Tensor:
    """(layers, selection heads) int64 for the operator to fill with the pages each head read."""
    first = plan.layers[0]
    return torch.empty(len(plan.layers), first.kv_heads if config.share_selection else first.heads,
                       dtype=torch.long)


def _angles(plan: DecodePlan, x: torch.Tensor, position: int) -> tuple:
    """cos, sin (1, D) of `position` from the model's rotary module, ANGLES positions made at a time (the
    same products as one position's: each angle is one inv_freq x position)."""
    first, cos, sin = plan.state.get("angles", (-1, None, None))
    if cos is None or not first <= position < first + ANGLES:
        cos, sin = plan.rotary(x, torch.arange(position, position + ANGLES)[None])  # (1, ANGLES, D) x2
        first, cos, sin = position, cos[0], sin[0]
        plan.state["angles"] = (first, cos, sin)
    return cos[position - first:position - first + 1], sin[position - first:position - first + 1]  # (1, D) x2


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
    cos, sin = plan.rotary(x, positions)  # (B, 1, D) x2
    cos, sin = cos.reshape(B, -1), sin.reshape(B, -1)  # (B, D) x2
    mask = kwargs.get("attention_mask")
    mask = None if mask is None or bool(mask.all()) else mask[:, None, None, :].bool()  # (B, 1, 1, L)
    h = x.view(B, -1)  # (B, d)
    for layer in plan.layers:
        h = planned_layer(layer, h, cos, sin, mask, cache.layers[layer.index].paged)  # (B, d)
    h = rms_norm_cast(h, plan.final_norm, plan.final_eps, plan.head.act or h.dtype)  # (B, d)
    return causal_lm_output(plan.head(h).view(B, 1, -1), cache)  # logits (B, 1, V)


def planned_layer(layer: LayerPlan, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask,
                  paged: PagedKVCache) -> torch.Tensor:
    """One decoder layer, one token: x (B, d) -> (B, d), its key and value appended to `paged`.

        h = rms_norm(x);  q, k, v = h Wq, h Wk, h Wv;  rope_append (RoPE(q, k), k and v into the page)
        out = decode_attention;  x, h = x + out Wo, rms_norm(x + out Wo);  x = x + silu_mul(h Wg|u) Wd

    The same operators as the C++ stack, in the same order (bit-equal); gate and up as two weights (a float
    model's, which the stack does not run) are gated as transformers gates them, F.silu(g) * u.
    """
    B, act = x.shape[0], layer.act or x.dtype  # act: what the products take (bf16 for int4 blocks)
    h = rms_norm_cast(x, layer.norms[0], layer.eps[0], act)  # (B, d)
    if len(layer.qkv) == 1:
        q, k, v = layer.qkv[0](h).split(layer.qkv_sizes, dim=-1)  # (B, Hq*D), (B, Hkv*D), (B, Hkv*Dv)
    else:
        q, k, v = (p(h) for p in layer.qkv)  # (B, Hq*D), (B, Hkv*D), (B, Hkv*Dv)
    q = rope_append(q, k, v, cos, sin, paged).unsqueeze(2)  # (B, Hq, 1, D); RoPE(k), v in the cache
    out = decode_attention(layer.attention, _as(q, x.dtype), paged, mask, layer.scaling,
                           layer.variant)  # (B, Hq, 1, Dv)
    y = layer.o(_as(out.reshape(B, -1), act))  # (B, d)
    s, h = add_rms_norm_cast(x, y, layer.norms[1], layer.eps[1], act)  # (B, d) x2: x + attention, its norm
    if len(layer.gate_up) == 1:  # gate|up one weight: SiLU-gating as one operator, as the C++ stack does
        a = silu_mul_cast(layer.gate_up[0](h), act)  # (B, I)
    else:  # two weights (a float model's): transformers' arithmetic (the stack refuses this layout)
        a = (F.silu(layer.gate_up[0](h)) * layer.gate_up[1](h)).to(act)  # (B, I)
    y = layer.down(a)  # (B, d)
    return _as(s, x.dtype) + y  # (B, d)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def _hf_run(plan: DecodePlan, model, args: tuple, kwargs: dict):
    """transformers' own forward (its layers, its head)."""
    return type(model).forward(model, *args, **kwargs)


def _facts(plan: DecodePlan, model, args: tuple, kwargs: dict) -> tuple:
    """What the rows' declarations are checked against: the attention-variant fields any layer uses."""
    return plan.variants, None


def _stack_ready() -> str | None:
    return None if kernel_loaded() else "its C++ operator (decode_stack.cpp) did not build"


DECODE_STEP = Operator("decode_step", [
    Impl("stack", _stack_fits, _stack_run, ready=_stack_ready, variant=frozenset()),
    Impl("planned", _planned_fits, planned_run, variant=frozenset({"softcap", "sinks"})),
    Impl("hf", lambda *args: None, _hf_run, variant=EVERY_VARIANT),  # every call: transformers' forward
], facts=_facts)
