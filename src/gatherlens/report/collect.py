"""Run a real model once on a text, under `trace()`, and keep what the report's story needs.

    >>> lm = gatherlens.models.load("smollm2")
    >>> story = collect(lm, "The cat sat on the mat because it was", top_k=4)
    >>> story.tokens[:3], story.ids[:3]
    (['The', ' cat', ' sat'], [504, 2644, 2643])
    >>> story.embeddings[0].record.to_svg()     # the embedding gather from the real table
    >>> collect(load("smollm2", quantized=True), "The cat").embeddings[0].record   # from its blocks

A model run from its GGUF blocks (its embedding module holds a QuantizedTable as `.table`) gets its
word lookup recorded with `record_quantized_embedding` on that table and the user's own ids.

One forward pass with top-k attention on (every layer gathers `top_k` keys per query) runs
inside `gatherlens.trace()`; an attention observer keeps the query/key/value tensors of the
one layer the report draws. A second, untraced forward with dense attention gives the
prediction top-k attention is compared against. Nothing here draws or writes files.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.params import head_index, layer_index, query_index
from gatherlens.report.defaults import DEFAULT_TEXT, LIVE_MAX_TOKENS, MAX_PICKS, MAX_TOKENS
from gatherlens.report.explore import explore_run
from gatherlens.report.prefill import prefill_maps
from gatherlens.report.run_tensors import run_tensors
from gatherlens.report.scores import call_scale, layer_scores
from gatherlens.trace.story_records import HeadMap

__all__ = ["Story", "EmbeddingStep", "HeadMap", "AttentionView", "Prediction", "collect",
           "DEFAULT_TEXT", "MAX_TOKENS", "shown_token", "token_texts", "too_long"]


@dataclass
class EmbeddingStep:
    """One embedding lookup of the forward pass (word, position or token-type table)."""

    kind: str            # "word" | "position" | "token_type" | "other"
    module: str          # module path, e.g. "model.embed_tokens"
    table_shape: tuple[int, int]
    ids: list[int]       # the ids looked up (batch 0)
    record: object       # GatherRecord (trace.builders.record_embedding), or from GGUF blocks a
    #                      QuantizedGatherRecord (trace.quantized.record_quantized_embedding)
    quantized: bool = False  # the table is a QuantizedTable: rows of GGUF blocks


@dataclass
class AttentionView:
    """One head of one layer: every score, the keys top-k kept, and one query's value gather."""

    layer: int
    module: str
    head: int
    kv_head: int
    query: int                 # the query position drawn in detail
    top_k: int
    scale: float
    scores: torch.Tensor       # (Q, L) scaled logits q.k * scale, -inf where not allowed
    allowed: torch.Tensor      # (Q, L) bool: the causal / padding rule
    dense: torch.Tensor        # (Q, L) softmax over all allowed keys (what dense attention uses)
    indices: torch.Tensor      # (Q, k) selected key positions, best first, -1 = none
    weights: torch.Tensor      # (Q, k) softmax over the selected keys
    score_record: object       # GatherRecord: scores.gather(-1, topk_idx) for this head
    value_record: object       # GatherRecord: V.index_select(0, topk_idx[query])
    output: torch.Tensor       # (Dv,) sum of weights x gathered value rows, for `query`
    model_output: torch.Tensor  # (Dv,) what the model's attention returned there (equal)
    mass: float                # share of the dense weight of `query` on its selected keys


@dataclass
class Prediction:
    """The next token: a gather of the last position's row of the logits."""

    record: object                        # GatherRecord: logits[-1].gather(0, top5)
    top: list[tuple[int, str, float, float]]        # (id, token, logit, prob), top-k attention
    dense_top: list[tuple[int, str, float, float]]  # the same with dense attention


@dataclass
class Story:
    """Everything the report tells, as plain data and records."""

    model_name: str
    model_class: str
    arch: str
    is_causal: bool
    text: str
    ids: list[int]
    tokens: list[str]
    vocab_size: int
    hidden_size: int
    layers: int
    embeddings: list[EmbeddingStep]
    heads: HeadMap
    attention: AttentionView
    prediction: Prediction | None
    gathers: list[dict]                   # Trace.summary() rows
    events: int
    bytes_read: int
    top_k: int
    tied: bool = False                    # the LM head reuses the word embedding table
    rope: bool = False                    # positions enter as rotations of q and k (RoPE)
    seconds: dict = field(default_factory=dict)
    explore: object = None                # ExploreData: every layer and head, for the page
    dense_run: bool = False               # top-k off: every query kept every allowed key
    quantized: bool = False               # the model ran from its GGUF blocks (load(quantized=True))
    tensors: object = None                # RunTensors: every layer's q, k, v and picks (report.run_tensors)
    prefill: object = None                # PrefillMaps: a sparse prefill's block maps (report.prefill), or None
    rope_record: object = None            # GatherRecord: RoPE's cos rows gathered by position_ids, or None
    embed_scale: object = None            # ScaleRecord: Gemma's W[ids] x sqrt(d), or None
    moe: object = None                    # MoeRouting: one MoE layer's routing, or None for a dense model
    tokenizer: object = None              # the model's tokenizer (the sampling picture names its candidates)

    @property
    def shown_tokens(self) -> list[str]:
        return [shown_token(t) for t in self.tokens]


def shown_token(tok: str) -> str:
    """A token as a learner should see it: a leading space as '␣', newlines escaped."""
    s = tok.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if s.startswith(" "):
        s = "␣" + s[1:]
    return s if s else "∅"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: printable stand-in character -> byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token decoded alone; a token holding part of a UTF-8 character (byte-level BPE splits
    Chinese characters into bytes) is shown by its bytes, e.g. '<0xE7><0x8C>', not as '�'."""
    out, table = [], None
    for i in ids:
        text = tokenizer.decode([i])
        if "\ufffd" in text:
            piece = tokenizer.convert_ids_to_tokens(i)
            table = table or _byte_decoder()
            if isinstance(piece, str) and piece and all(c in table for c in piece):
                text = "".join(f"<0x{table[c]:02X}>" for c in piece)
        out.append(text)
    return out


# -- the run ---------------------------------------------------------------------------------
def collect(lm, text: str, *, top_k: int | None = 4, layer: int | None = None, head: int = 0,
            query: int = -1, say: Callable[[str], None] | None = None,
            max_tokens: int = LIVE_MAX_TOKENS, prefill=None) -> Story:
    """Run `lm` (a gatherlens.models.LoadedModel) once on `text` and gather the story.

    top_k: keys each query keeps in every layer; None keeps every allowed key (top-k off: the
    run is dense attention, drawn as a selection of all keys). layer: the attention layer
    drawn in detail (default: the middle one); head: its query head; query: the query
    position whose value gather is drawn (default: the last token). max_tokens: the longest text
    (LIVE_MAX_TOKENS, the offline and the live page's); past MAX_TOKENS `story.explore` is None (no
    full grids: the live page reads `story.tensors`, the offline page a window of rows). prefill: a
    PrefillConfig (ops/prefill/config.py) to also prefill the text block-sparsely once and keep every
    layer's block map (`story.prefill`, report/prefill.py); None: no sparse prefill.
    """
    say = say or (lambda message: None)
    if not isinstance(text, str) or not text.strip():
        raise GatherValueError(f"text must be a non-empty string, got {text!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GatherValueError(f"top_k {top_k!r} is outside the valid range [1, inf) (or None: dense)")
    enc = lm.tokenizer(text, return_tensors="pt")
    ids = enc["input_ids"]                                                   # (1, S)
    n_layers, layer, query = _positions(lm.model, ids.shape[1], layer, query, max_tokens)
    _check_picks(ids.shape[1], top_k)
    dense_run, top_k = top_k is None, min(top_k or ids.shape[1], ids.shape[1])  # k as run: at most S keys
    tokens = token_texts(lm.tokenizer, ids[0].tolist())
    run = _run(lm, enc, top_k, say)
    say("collecting the gathers")
    path, call = _chosen_call(run.calls, layer, lm.model)
    Hq, Hkv = call.query.shape[1], call.key.shape[1]
    head_index(head, Hq, layer)
    heads = HeadMap(q_heads=Hq, kv_heads=Hkv)
    display = [shown_token(x) for x in tokens]
    prediction = None
    if run.dense_out is not None:
        prediction = _prediction(run.out.logits, run.dense_out.logits, lm, display)
    tensors = dataclasses.replace(run_tensors(run.calls, top_k, dense_run), ids=tuple(ids[0].tolist()),
                                  logits=_last_logits(run.out) if lm.is_causal else None)
    embeddings = _embeddings(run.trace, lm.model, ids, display)
    return _story(lm, text, ids, tokens, n_layers or len(run.calls), run, heads, top_k,
                  embeddings=embeddings, **_model_gathers(lm.model, run.seen, embeddings, display, layer),
                  attention=_attention(call, path, layer, head % Hq, heads, query, top_k, display),
                  prediction=prediction, dense_run=dense_run, tensors=tensors,
                  explore=explore_run(tensors, [p for p, _ in run.calls]) if ids.shape[1] <= MAX_TOKENS else None,
                  prefill=_prefill(lm, ids, prefill, say))


def _last_logits(out):
    """(V,) float32: the last position's logits of a causal LM's output (None for an encoder)."""
    logits = getattr(out, "logits", None)
    return None if logits is None or logits.dim() != 3 else logits[0, -1].detach().float().cpu()


def _model_gathers(model, seen, embeddings: list, display: list[str], layer: int) -> dict:
    """The Story's rope_record, embed_scale and moe from the run's hooks (report/model_gathers.py)."""
    from gatherlens.report.model_gathers import moe_routing, rope_record, scale_record

    word = next((e for e in embeddings if e.kind == "word"), None)
    return {"rope_record": rope_record(model, seen, display), "embed_scale": scale_record(model, seen, word, display),
            "moe": moe_routing(seen, layer, display)}


def _prefill(lm, ids, config, say):
    """Every layer's block map of one sparse prefill of ids (1, S) with `config`, or None without one."""
    if config is None:
        return None
    say("prefilling block-sparsely: the key blocks each query block gathers")
    return prefill_maps(lm, ids, config)


def too_long(S: int, max_tokens: int = LIVE_MAX_TOKENS) -> str:
    """The one refusal of a text past the explorer's limit (explain, serve): the range, and what runs longer."""
    return (f"text has {S} tokens; the explorer (gatherlens explain and serve) holds every layer's queries and "
            f"keys of one run, so keep it within [1, {max_tokens}] tokens (shorten the text); "
            f"gatherlens generate runs longer texts")


def _check_picks(S: int, top_k: int | None) -> None:
    """Every layer keeps S x k picks per head: refuse more than MAX_PICKS (top-k off keeps S)."""
    k = S if top_k is None else min(top_k, S)
    if S * k > MAX_PICKS:
        most = max(1, MAX_PICKS // S)
        raise GatherValueError(f"k = {k} {'(top-k off keeps every key) ' if top_k is None else ''}"
                               f"with {S} tokens keeps {S * k:,} keys per head and layer; the limit is "
                               f"{MAX_PICKS:,}: use k in [1, {most}] (top-k on) for a text this long")


def _positions(model, S: int, layer: int | None, query: int,
               max_tokens: int = LIVE_MAX_TOKENS) -> tuple[int, int, int]:
    """(number of layers, layer, query), negatives counted from the end; clear range errors."""
    if S > max_tokens:
        raise GatherValueError(too_long(S, max_tokens))
    n_layers = _num_layers(model)
    if layer is None:
        layer = n_layers // 2 if n_layers else 0
    layer = layer_index(layer, n_layers) if n_layers else layer
    return n_layers, layer, query_index(query, S)


@dataclass
class _Run:
    calls: list            # (module path, attention call) of every attention layer, in order
    trace: object          # the Trace of the top-k forward
    out: object            # its model output
    dense_out: object      # the dense forward's output (causal LMs only), else None
    seconds: float         # time of the traced forward
    seen: object = None    # report.model_gathers.Seen: the rotary call, the routers, the embedding's output


def _run(lm, enc, top_k: int, say) -> _Run:
    """One forward with top-k attention under trace(); a second, dense one for the prediction."""
    from gatherlens.models import observe_attention, use_dense_attention, use_topk_attention
    from gatherlens.models.attention.topk import attention_restored
    from gatherlens.report.model_gathers import observe_model_gathers
    from gatherlens.trace.tracer import trace

    model = lm.model
    names = {id(m): n for n, m in model.named_modules()}
    calls = []

    def keep(call) -> None:
        calls.append((names.get(id(call.module), ""), call))

    inputs = {k: v for k, v in enc.items()
              if k in ("input_ids", "attention_mask", "token_type_ids")}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        inputs["logits_to_keep"] = 1       # the prediction reads the last position's logits only
    say(f"running {lm.name} on {enc['input_ids'].shape[1]} tokens under trace() "
        f"(top-k attention, k={top_k})")
    t0 = time.perf_counter()
    with attention_restored(model):  # the model's attention afterwards is the one it had
        use_topk_attention(model, top_k=top_k)
        with torch.no_grad(), observe_attention(keep), trace() as t, observe_model_gathers(model) as seen:
            out = model(**inputs)
        seconds = time.perf_counter() - t0
        dense_out = None
        if lm.is_causal and hasattr(out, "logits") and top_k >= enc["input_ids"].shape[1]:
            dense_out = out                # k >= L keeps every allowed key: the run was dense
        elif lm.is_causal and hasattr(out, "logits"):
            say("running it again with dense attention, to compare the prediction")
            use_dense_attention(model)     # what top-k replaced
            with torch.no_grad():
                dense_out = model(**inputs)
    return _Run(calls=calls, trace=t, out=out, dense_out=dense_out, seconds=seconds, seen=seen)


def _chosen_call(calls: list, layer: int, model):
    """The attention call of `layer`: by module path (layers.N) or, failing that, by call order."""
    for path, call in calls:
        if _layer_number(path, call) == layer:
            return path, call
    if not calls:
        raise GatherValueError(
            f"{type(model).__name__} ran no attention through transformers' attention "
            f"interface, so there is no top-k selection to draw")
    return calls[layer_index(layer, len(calls))]


def _story(lm, text: str, ids, tokens: list[str], layers: int, run: _Run, heads: HeadMap,
           top_k: int, **steps) -> Story:
    """The Story: the model's facts, the run's gathers and the steps (embeddings, attention...)."""
    model, cfg = lm.model, lm.model.config
    rows = run.trace.summary()
    return Story(
        model_name=lm.name, model_class=type(model).__name__, arch=getattr(cfg, "model_type", "?"),
        is_causal=lm.is_causal, text=text, ids=ids[0].tolist(), tokens=tokens,
        vocab_size=int(getattr(cfg, "vocab_size", 0) or 0),
        hidden_size=int(getattr(cfg, "hidden_size", 0) or 0), layers=layers, heads=heads,
        gathers=rows, events=len(run.trace.events), bytes_read=sum(r["bytes_read"] for r in rows),
        top_k=top_k, tied=_tied(model), rope=any("rope" in str(k) for k in cfg.to_dict()),
        seconds={"load": float(getattr(lm, "seconds", 0.0)), "forward": run.seconds},
        quantized=bool(getattr(lm, "info", {}).get("quantized")), tokenizer=lm.tokenizer, **steps,
    )


# -- pieces ----------------------------------------------------------------------------------
def _num_layers(model) -> int:
    cfg = model.config
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        n = getattr(cfg, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return 0


def _tied(model) -> bool:
    head = getattr(model, "get_output_embeddings", lambda: None)()
    emb = model.get_input_embeddings()
    return head is not None and (getattr(head, "weight", None) is getattr(emb, "weight", 0)
                                 or getattr(head, "table", None) is getattr(emb, "table", 0))


def _layer_number(path: str, call) -> int | None:
    if isinstance(call.layer, int):
        return call.layer
    m = re.search(r"\.(\d+)(?:\.|$)", path)
    return int(m.group(1)) if m else None


def _embeddings(t, model, ids, display) -> list[EmbeddingStep]:
    """The embedding lookups of the first forward: the word table first, then the others."""
    word = getattr(model.get_input_embeddings(), "weight", None)
    steps = []
    for e in t.of(op="embedding"):
        table, index = e.tensors["input"], e.tensors["index"]               # (V, d), (B, S)
        if e.forward != 0 or not isinstance(table, torch.Tensor):
            continue  # a later forward, or a lookup in GGUF blocks (_quantized_word records it)
        looked = index[0].tolist() if index.dim() == 2 else index.reshape(-1).tolist()
        name = e.module.rsplit(".", 1)[-1]
        if word is not None and table is word:
            kind, labels, sym = "word", display, "W_tok"
        elif "position" in name or name in ("wpe",):
            kind, labels, sym = "position", display, "W_pos"
        elif "token_type" in name or "segment" in name:
            kind, labels, sym = "token_type", display, "W_type"
        else:
            kind, labels, sym = "other", None, "W"
        idx = index[:1] if index.dim() == 2 else index.reshape(1, -1)          # (1, S)
        from gatherlens.trace.builders import record_embedding

        if labels is not None and len(labels) != idx.numel():
            labels = None
        rec = record_embedding(idx, table, labels=labels, name=sym, index_name="ids",
                               call=f"{sym}[ids]  # {e.module}")
        steps.append(EmbeddingStep(kind=kind, module=e.module, table_shape=tuple(table.shape),
                                   ids=looked, record=rec))
    quantized = _quantized_word(model, ids, display)
    steps = ([quantized] if quantized else []) + steps
    steps.sort(key=lambda s: {"word": 0, "position": 1, "token_type": 2}.get(s.kind, 3))
    return steps


def _quantized_word(model, ids, display) -> EmbeddingStep | None:
    """The word lookup of a model run from its GGUF blocks, recorded on its real QuantizedTable
    with the user's ids (batch 0); None when the embedding module holds no QuantizedTable."""
    from gatherlens.ops.quant import QuantizedTable
    from gatherlens.trace.quantized import record_quantized_embedding

    emb = model.get_input_embeddings()
    table = getattr(emb, "table", None)
    if not isinstance(table, QuantizedTable):
        return None
    idx = ids[:1]                                                            # (1, S)
    labels = display if len(display) == idx.numel() else None
    rec = record_quantized_embedding(idx, table, labels=labels)
    module = next((n for n, m in model.named_modules() if m is emb), "")
    return EmbeddingStep(kind="word", module=module, table_shape=tuple(table.shape),
                         ids=idx[0].tolist(), record=rec, quantized=True)


def _attention(call, path, layer, head, heads: HeadMap, query, top_k, display) -> AttentionView:
    from gatherlens.trace.builders import record_attention_selection, record_index_select

    sel = call.selection
    kv = heads.kv_of(head)
    v = call.value[0, kv].detach().float().cpu()                            # (L, Dv)
    all_scores, all_allowed = layer_scores(call)                             # (Hq, Q, L) each
    scores, allowed = all_scores[head], all_allowed[head]                    # (Q, L)
    Q, L = scores.shape
    scale = call_scale(call)
    dense = torch.softmax(scores, dim=-1).nan_to_num(0.0)                   # (Q, L)
    indices = sel.indices[0, head].cpu()                                     # (Q, k)
    weights = sel.weights[0, head].float().cpu()                             # (Q, k)
    labels = display[-L:] if len(display) >= L else None
    score_record = record_attention_selection(sel, batch=0, head=head, labels=labels)
    qrow = query - (len(display) - Q) if len(display) >= Q else query        # row in (Q, L)
    qrow = min(max(qrow, 0), Q - 1)
    picked = indices[qrow][indices[qrow] >= 0]                               # (k',)
    qname = display[query] if query < len(display) else str(query)
    value_record = record_index_select(
        v, 0, picked, name="V", index_name="topk_idx", call="V.index_select(0, topk_idx)",
        source_row_labels=labels, output_row_labels=[labels[i] for i in picked.tolist()] if labels else None,
        source_axes=("L", "Dv"), index_axes=("k",), output_axes=("k", "Dv"),
        meta={"weights": weights[qrow][: picked.numel()].unsqueeze(-1).expand(-1, v.shape[-1]),
              "note": ("note_value_gather", {"layer": layer, "kv": kv, "query": query, "tok": repr(qname)})},
    )
    w = weights[qrow][: picked.numel()]                                      # (k',)
    output = (w.unsqueeze(-1) * value_record.output).sum(0)                  # (Dv,)
    mass = float(dense[qrow, picked].sum()) if picked.numel() else 0.0
    return AttentionView(layer=layer, module=path, head=head, kv_head=kv, query=query, top_k=top_k,
                         scale=scale, scores=scores, allowed=allowed, dense=dense, indices=indices,
                         weights=weights, score_record=score_record, value_record=value_record,
                         output=output, model_output=call.output[0, head, qrow].detach().float().cpu(),
                         mass=mass)


def _prediction(logits, dense_logits, lm, display) -> Prediction:
    from gatherlens.trace.builders import record_gather

    row = logits[0, -1:].detach().float().cpu()                              # (1, V)
    top = torch.topk(row, 5, dim=-1)                                         # (1, 5)
    probs = torch.softmax(row[0], dim=-1)                                    # (V,)
    ids = top.indices[0].tolist()
    toks = [shown_token(lm.tokenizer.decode([i])) for i in ids]
    rec = record_gather(
        row, 1, top.indices, name="logits", index_name="top5",
        call="logits[:, -1].gather(-1, top5)", meta={"note": ("note_last_row", {})},
        source_col_labels={i: s for i, s in zip(ids, toks)}, source_row_labels=[display[-1]],
        output_row_labels=[display[-1]], source_axes=("1", "V"), index_axes=("1", "5"),
        output_axes=("1", "5"),
    )
    drow = dense_logits[0, -1].detach().float().cpu()                        # (V,)
    dprobs = torch.softmax(drow, dim=-1)
    dtop = torch.topk(drow, 5)
    return Prediction(
        record=rec,
        top=[(i, s, float(row[0, i]), float(probs[i])) for i, s in zip(ids, toks)],
        dense_top=[(i, shown_token(lm.tokenizer.decode([i])), float(drow[i]), float(dprobs[i]))
                   for i in dtop.indices.tolist()],
    )
