"""`trace()`: every gather-like operation a forward pass runs, with the module that ran it.

    >>> with trace() as t:
    ...     model(ids)
    >>> [(e.op, e.module) for e in t.events][:2]
    [('embedding', 'model.embed_tokens'), ...]
    >>> t.events[0].record(labels=tokens).to_svg()     # the picture of that lookup

Generic: nothing here knows a model's code. Inside the block a TorchFunctionMode sees every torch
call and keeps the gather-like ones (embedding lookups, index_select, gather, take_along_dim,
take, indexing with tensors; index_put_/index_copy_/scatter writes such as a static KV cache;
the target log-prob gather of cross_entropy / nll_loss), and global module pre/post hooks keep a
stack of the modules running, so each event knows its module path. Top-k attention reports its
selection here too (`emit_attention_selection`). Outside the block nothing is installed:
tracing off costs nothing.

Records for drawing are built lazily by `event.record()` (gatherlens.trace.builders), from the
tensors the event keeps by reference (`trace(keep_tensors=False)` keeps shapes only).
"""
from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules import module as _nn_module
from torch.overrides import TorchFunctionMode

__all__ = ["trace", "Trace", "TraceEvent", "is_tracing", "paused", "emit_attention_selection",
           "emit_embedding"]

_active: list["Trace"] = []
_paused = [0]  # > 0 while a composite op (top-k attention) reports itself as one event


def is_tracing() -> bool:
    """True inside a `with trace():` block (cheap: one list check)."""
    return bool(_active)


@dataclass
class TraceEvent:
    """One gather-like call seen while tracing.

    kind: "read" (a gather), "write" (an index write such as a KV-cache update), "loss" (the
    gather of target log-probs) or "attention" (a top-k attention selection).
    bytes_read: index bytes + the bytes of the elements gathered (for writes: index + values).
    """

    step: int
    op: str
    kind: str
    module: str                      # module path, e.g. "model.layers.3.self_attn" ("" = top)
    module_type: str                 # its class name, e.g. "LlamaAttention"
    forward: int                     # which top-level forward call (0, 1, ... during generate)
    input_shape: tuple[int, ...]     # the tensor read from (or written to)
    index_shape: tuple[int, ...]     # the index (several index tensors: the broadcast shape)
    output_shape: tuple[int, ...]
    dtype: torch.dtype               # dtype of the data gathered
    index_dtype: torch.dtype | None
    dim: int | None
    bytes_read: int
    bytes_written: int = 0
    call: str = ""                   # the call as code, e.g. "torch.gather(input, 2, index)"
    tensors: dict = field(default_factory=dict, repr=False)

    @property
    def module_pattern(self) -> str:
        """The module path with layer numbers as '*': 'model.layers.*.self_attn'."""
        return re.sub(r"\.\d+(?=\.|$)", ".*", self.module)

    def record(self, labels=None, **kw):
        """The GatherRecord of this call, built now (needs keep_tensors=True when tracing)."""
        from gatherlens.trace import builders
        from gatherlens.trace.convert import as_record

        if not self.tensors:
            raise ValueError(
                f"event {self.step} ({self.op} in {self.module or 'top level'}) kept no tensors; "
                f"trace with keep_tensors=True to draw it"
            )
        t = self.tensors
        kw.setdefault("call", self.call)
        if self.op == "embedding" and not isinstance(t["input"], torch.Tensor):  # a QuantizedTable
            from gatherlens.trace.quantized import record_quantized_embedding

            return record_quantized_embedding(t["index"], t["input"], labels=labels)
        if self.op == "embedding":
            return builders.record_embedding(t["index"], t["input"], labels=labels, **kw)
        if self.op == "topk_attention":
            kw.pop("call")
            return as_record(t["selection"], labels=labels, **kw)
        if self.op in ("gather", "scatter", "scatter_add"):
            return builders.record_gather(t["input"], self.dim, t["index"], **kw)
        if self.op in ("index_select", "index_copy"):
            return builders.record_index_select(t["input"], self.dim, t["index"], **kw)
        if self.op == "take_along_dim":
            return builders.record_take_along_dim(t["input"], t["index"], self.dim, **kw)
        if self.op == "take":
            return builders.record_take_along_dim(t["input"].reshape(-1), t["index"].reshape(-1), **kw)
        if self.op in ("index", "index_put"):
            return builders.record_indexing(t["input"], t["indices"], **kw)
        if self.op in ("cross_entropy", "nll_loss"):
            logp = t["input"].detach().float()
            if self.op == "cross_entropy":
                logp = torch.log_softmax(logp, dim=1)                       # (N, C, ...)
            target = t["index"]                                               # (N, ...)
            keep = target != t.get("ignore_index", -100)
            if logp.dim() != 2:  # (N, C, d1, ...) -> (N*d1*..., C)
                logp = logp.movedim(1, -1).reshape(-1, logp.shape[1])
                target, keep = target.reshape(-1), keep.reshape(-1)
            kw.setdefault("name", "log_probs")
            kw.setdefault("index_name", "target")
            return builders.record_gather(logp[keep], 1, target[keep].unsqueeze(1), **kw)  # (n, 1)
        raise ValueError(f"no record builder for op {self.op!r}")

    def as_dict(self) -> dict:
        """Plain data (no tensors), for JSON."""
        return {
            "step": self.step, "op": self.op, "kind": self.kind, "module": self.module,
            "module_type": self.module_type, "forward": self.forward,
            "input_shape": list(self.input_shape), "index_shape": list(self.index_shape),
            "output_shape": list(self.output_shape), "dtype": str(self.dtype).replace("torch.", ""),
            "index_dtype": str(self.index_dtype).replace("torch.", "") if self.index_dtype else None,
            "dim": self.dim, "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "call": self.call,
        }


# -- what counts as a gather --------------------------------------------------------------------
def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _index_items(idx) -> tuple:
    return idx if isinstance(idx, tuple) else (idx,)


def _has_tensor_index(idx) -> bool:
    """True for advanced indexing: a tensor (or a list of ints) among the indices."""
    for it in _index_items(idx):
        if isinstance(it, torch.Tensor):
            return True
        if isinstance(it, list) and it and all(isinstance(v, (int, bool)) for v in it):
            return True
    return False


def _index_shape(idx) -> tuple[int, ...]:
    shapes = [tuple(it.shape) for it in _index_items(idx) if isinstance(it, torch.Tensor)]
    shapes += [(len(it),) for it in _index_items(idx) if isinstance(it, list)]
    try:
        return tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
    except RuntimeError:
        return shapes[0]


def _index_bytes(idx) -> int:
    return sum(_nbytes(it) for it in _index_items(idx))


def _index_dtype(idx):
    for it in _index_items(idx):
        if isinstance(it, torch.Tensor):
            return it.dtype
    return torch.int64


def _describe(func, args, kwargs, out) -> dict | None:
    """The event fields of a gather-like call, or None when `func` is not one."""
    kind = _HANDLERS.get(func)
    if kind is None:
        return None
    return kind(func, args, kwargs, out)


def _embedding(func, args, kwargs, out):
    if func is torch.embedding:        # torch.embedding(weight, indices, ...)
        weight, ids = _arg(args, kwargs, 0, "weight"), _arg(args, kwargs, 1, "indices")
    else:                              # F.embedding(input, weight, ...)
        ids, weight = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
    return dict(op="embedding", kind="read", input=weight, index=ids, out=out, dim=0,
                call="F.embedding(ids, weight)")


def _dim_gather(name):
    def describe(func, args, kwargs, out):
        src, dim, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index")
        return dict(op=name, kind="read", input=src, index=index, out=out, dim=dim,
                    call=f"torch.{name}(input, {dim}, index)")
    return describe


def _take_along_dim(func, args, kwargs, out):
    src, index, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "indices"), _arg(args, kwargs, 2, "dim")
    return dict(op="take_along_dim", kind="read", input=src, index=index, out=out, dim=dim,
                call=f"torch.take_along_dim(input, indices, {dim})")


def _take(func, args, kwargs, out):
    src, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "index")
    return dict(op="take", kind="read", input=src, index=index, out=out, dim=None, call="torch.take(input, index)")


def _getitem(func, args, kwargs, out):
    src, idx = args[0], args[1]
    if not _has_tensor_index(idx) or not isinstance(src, torch.Tensor):
        return None
    return dict(op="index", kind="read", input=src, indices=idx, out=out, dim=None, call="input[indices]")


def _setitem(func, args, kwargs, out):
    dst, idx, values = args[0], args[1], args[2]
    if not _has_tensor_index(idx) or not isinstance(dst, torch.Tensor):
        return None
    return dict(op="index_put", kind="write", input=dst, indices=idx, values=values, out=dst, dim=None,
                call="input[indices] = values")


def _index_put(func, args, kwargs, out):
    dst, idx, values = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "indices"), _arg(args, kwargs, 2, "values")
    idx = tuple(idx) if isinstance(idx, (list, tuple)) else idx
    return dict(op="index_put", kind="write", input=dst if func.__name__.endswith("_") else out,
                indices=idx, values=values, out=out, dim=None, call="input.index_put_(indices, values)")


def _index_copy(func, args, kwargs, out):
    dst, dim, index, src = (_arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim"),
                            _arg(args, kwargs, 2, "index"), _arg(args, kwargs, 3, "source"))
    return dict(op="index_copy", kind="write", input=out if isinstance(out, torch.Tensor) else dst,
                index=index, values=src, out=out, dim=dim, call=f"input.index_copy_({dim}, index, source)")


def _scatter(name):
    def describe(func, args, kwargs, out):
        dst, dim, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index")
        src = _arg(args, kwargs, 3, "src", kwargs.get("value"))
        if not isinstance(index, torch.Tensor):
            return None
        return dict(op=name, kind="write", input=out if isinstance(out, torch.Tensor) else dst, index=index,
                    values=src, out=out, dim=dim, call=f"input.{name}_({dim}, index, src)")
    return describe


def _loss(name):
    def describe(func, args, kwargs, out):
        logits, target = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "target")
        if not isinstance(target, torch.Tensor) or target.is_floating_point():
            return None  # class probabilities: no gather
        ignore = kwargs.get("ignore_index", -100)
        return dict(op=name, kind="loss", input=logits, index=target, out=out, dim=1, ignore_index=ignore,
                    call=f"F.{name}(input, target)")
    return describe


_HANDLERS: dict[Any, Any] = {
    F.embedding: _embedding,
    torch.embedding: _embedding,
    torch.gather: _dim_gather("gather"),
    torch.Tensor.gather: _dim_gather("gather"),
    torch.index_select: _dim_gather("index_select"),
    torch.Tensor.index_select: _dim_gather("index_select"),
    torch.take_along_dim: _take_along_dim,
    torch.Tensor.take_along_dim: _take_along_dim,
    torch.take: _take,
    torch.Tensor.take: _take,
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
    torch.index_put: _index_put,
    torch.Tensor.index_put: _index_put,
    torch.Tensor.index_put_: _index_put,
    torch.index_copy: _index_copy,
    torch.Tensor.index_copy: _index_copy,
    torch.Tensor.index_copy_: _index_copy,
    torch.scatter: _scatter("scatter"),
    torch.Tensor.scatter: _scatter("scatter"),
    torch.Tensor.scatter_: _scatter("scatter"),
    torch.scatter_add: _scatter("scatter_add"),
    torch.Tensor.scatter_add: _scatter("scatter_add"),
    torch.Tensor.scatter_add_: _scatter("scatter_add"),
    F.cross_entropy: _loss("cross_entropy"),
    F.nll_loss: _loss("nll_loss"),
}


# -- the trace ------------------------------------------------------------------------------------
class _Mode(TorchFunctionMode):
    def __init__(self, owner: "Trace"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _HANDLERS and not _paused[0]:
            fields = _describe(func, args, kwargs, out)
            if fields is not None:
                self.owner._add(fields)
        return out


class Trace:
    """The events of one `with trace():` block, in the order they ran."""

    def __init__(self, keep_tensors: bool = True):
        self.keep_tensors = keep_tensors
        self.events: list[TraceEvent] = []
        self._stack: list[tuple[str, str]] = []      # (path, class name) of the modules running
        self._names: dict[int, str] = {}             # id(module) -> path, per top-level module
        self._forwards = -1
        self._mode: _Mode | None = None
        self._hooks: list = []

    # context manager: install on enter, remove everything on exit
    def __enter__(self) -> "Trace":
        self._hooks = [
            _nn_module.register_module_forward_pre_hook(self._pre),
            _nn_module.register_module_forward_hook(self._post, always_call=True),
        ]
        self._mode = _Mode(self)
        self._mode.__enter__()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        self._mode.__exit__(*exc)
        for h in self._hooks:
            h.remove()
        self._hooks, self._mode, self._stack = [], None, []

    # module stack
    def _pre(self, module, args):
        if not self._stack:
            self._forwards += 1
            self._names = {id(m): name for name, m in module.named_modules()}
        path = self._names.get(id(module))
        if path is None:  # a module outside the top-level one's tree
            parent = self._stack[-1][0] if self._stack else ""
            path = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
        self._stack.append((path, type(module).__name__))

    def _post(self, module, args, output):
        if self._stack:
            self._stack.pop()

    # events
    def _where(self) -> tuple[str, str]:
        return self._stack[-1] if self._stack else ("", "")

    def _add(self, f: dict) -> None:
        src, out = f["input"], f.get("out")
        idx = f.get("index", f.get("indices"))
        index_bytes = _index_bytes(idx) if "indices" in f else _nbytes(idx)
        index_shape = _index_shape(idx) if "indices" in f else tuple(getattr(idx, "shape", ()))
        index_dtype = _index_dtype(idx) if "indices" in f else getattr(idx, "dtype", None)
        itemsize = src.element_size() if isinstance(src, torch.Tensor) else 0
        if f["kind"] == "write":
            values = f.get("values")
            n = values.numel() if isinstance(values, torch.Tensor) else 1
            read, written = index_bytes + n * itemsize, n * itemsize
            out_shape = tuple(values.shape) if isinstance(values, torch.Tensor) else ()
        elif f["kind"] == "loss":
            read, written = index_bytes + f["index"].numel() * itemsize, 0
            out_shape = tuple(f["index"].shape)
        else:
            read, written = index_bytes + _nbytes(out), 0
            out_shape = tuple(out.shape) if isinstance(out, torch.Tensor) else ()
        path, mtype = self._where()
        tensors = {}
        if self.keep_tensors:
            tensors = {k: f[k] for k in ("input", "index", "indices", "values", "ignore_index", "selection") if k in f}
        self.events.append(TraceEvent(
            step=len(self.events), op=f["op"], kind=f["kind"], module=path, module_type=mtype,
            forward=max(self._forwards, 0), input_shape=tuple(getattr(src, "shape", ())),
            index_shape=index_shape, output_shape=out_shape, dtype=getattr(src, "dtype", None),
            index_dtype=index_dtype, dim=f.get("dim"), bytes_read=int(read), bytes_written=int(written),
            call=f.get("call", ""), tensors=tensors,
        ))

    # views
    def __iter__(self):
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of(self, op: str | None = None, kind: str | None = None, module: str | None = None) -> list[TraceEvent]:
        """Events filtered by op, kind and/or a module-path prefix."""
        return [e for e in self.events if (op is None or e.op == op) and (kind is None or e.kind == kind)
                and (module is None or e.module == module or e.module.startswith(module + "."))]

    def summary(self) -> list[dict]:
        """One row per (op, module pattern): count, bytes read and written, shapes seen first."""
        rows: "OrderedDict[tuple, dict]" = OrderedDict()
        for e in self.events:
            key = (e.op, e.kind, e.module_pattern, e.module_type)
            row = rows.setdefault(key, {
                "op": e.op, "kind": e.kind, "module": e.module_pattern, "module_type": e.module_type,
                "count": 0, "bytes_read": 0, "bytes_written": 0,
                "input_shape": e.input_shape, "index_shape": e.index_shape, "output_shape": e.output_shape,
                "dtype": str(e.dtype).replace("torch.", ""),
            })
            row["count"] += 1
            row["bytes_read"] += e.bytes_read
            row["bytes_written"] += e.bytes_written
        return list(rows.values())

    def as_dicts(self) -> list[dict]:
        return [e.as_dict() for e in self.events]

    def __repr__(self) -> str:
        return f"Trace({len(self.events)} events, {len(self.summary())} kinds)"


def trace(keep_tensors: bool = True) -> Trace:
    """Record every gather-like op run inside the `with` block; see the module docstring.

    keep_tensors: keep references to the tensors of each call so `event.record()` can draw it
    (costs memory for long runs; False keeps shapes, dtypes and bytes only).
    """
    return Trace(keep_tensors=keep_tensors)


@contextlib.contextmanager
def paused():
    """Record nothing inside: used around a composite op that reports one event of its own."""
    _paused[0] += 1
    try:
        yield
    finally:
        _paused[0] -= 1


def emit_attention_selection(selection, *, query=None, key=None, value=None, output=None) -> None:
    """Called by top-k attention (gatherlens.models.attention.topk) with the selection it made."""
    for t in list(_active):
        idx = selection.indices                                        # (B, H, Q, k)
        itemsize = value.element_size() if value is not None else 4
        dv = value.shape[-1] if value is not None else 0
        f = dict(op="topk_attention", kind="attention", input=key if key is not None else idx,
                 index=idx, out=output, dim=2, selection=selection,
                 call=f"topk_attention(q, k, v, top_k={selection.top_k})")
        t._add(f)
        e = t.events[-1]
        # scores of the kept keys + their value rows (per query head), + the indices
        valid = int((idx >= 0).sum())
        e.bytes_read = int(_nbytes(idx) + valid * itemsize * (1 + dv))
        e.input_shape = tuple(key.shape) if key is not None else ()
        e.dtype = value.dtype if value is not None else e.dtype


def emit_embedding(table, ids, output, call: str = "embedding_lookup(ids, table)") -> None:
    """Called by an embedding whose gather is not `F.embedding` (a QuantizedTable's rows of blocks,
    gatherlens.models' QuantizedEmbedding, run inside `paused()`): one "embedding" event, reading
    `table.bytes_read(ids)` bytes of blocks plus the ids."""
    for t in list(_active):
        t._add(dict(op="embedding", kind="read", input=table, index=ids, out=output, dim=0, call=call))
        t.events[-1].bytes_read = int(_nbytes(ids) + table.bytes_read(ids))
