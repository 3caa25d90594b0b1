"""Builders: run a gather-like op and record which source element each output element came from.

    >>> W = torch.randn(10, 4)                             # (V, d)
    >>> ids = torch.tensor([[3, 1, 4]])                    # (B, S)
    >>> rec = record_embedding(ids, W, labels=["The", "cat", "sat"])
    >>> rec.output.shape, rec.source_coords.shape          # (B, S, d), (B, S, d, 2)
    (torch.Size([1, 3, 4]), torch.Size([1, 3, 4, 2]))

Each builder calls the real torch op for `output` and works out `source_coords` from the op's
documented semantics, independently; tests check ``source[coords] == output`` exactly.
Bad input raises a `gatherlens.errors` error that names the argument, the bad value, where it
is and the valid range.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError, position_of
from gatherlens.i18n import check_lang
from gatherlens.ops.tensors import require_data
from gatherlens.trace.record import GatherRecord

__all__ = [
    "record_gather",
    "record_index_select",
    "record_indexing",
    "record_take_along_dim",
    "record_embedding",
    "record_attention_selection",
]


# -- checks ------------------------------------------------------------------------------------
def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise GatherTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    require_data(**{name: x})
    return x.detach().cpu()


def _int_index(x, name: str) -> torch.Tensor:
    if isinstance(x, (list, tuple)):
        x = torch.tensor(x)
    x = _tensor(x, name)
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise GatherTypeError(f"{name} must hold integers (torch.long), got dtype {x.dtype}")
    return x.long()


def _dim(dim, ndim: int, name: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise GatherTypeError(f"{name} must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise GatherIndexError(
            f"{name}={dim} is outside the dimensions of a {ndim}-D input [{-ndim}, {ndim})"
        )
    return dim % max(ndim, 1)


def _check_range(index: torch.Tensor, size: int, name: str, what: str) -> None:
    """Raise on the first element of `index` outside [0, size)."""
    bad = (index < 0) | (index >= size)
    if bool(bad.any()):
        flat = int(bad.flatten().nonzero()[0])
        value = int(index.flatten()[flat])
        pos = position_of(flat, tuple(index.shape))
        raise GatherIndexError(
            f"{name} value {value} at position {pos} is outside {what} [0, {size})"
        )


def _grid(shape) -> list[torch.Tensor]:
    """One int64 tensor per axis of `shape`, holding that axis' coordinate (meshgrid 'ij')."""
    if len(shape) == 0:
        return []
    return list(torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij"))


def _stack(parts: list[torch.Tensor], shape) -> torch.Tensor:
    if not parts:
        return torch.zeros((*shape, 0), dtype=torch.long)
    return torch.stack([p.expand(*shape) for p in parts], dim=-1).long()


# -- torch.gather --------------------------------------------------------------------------
def record_gather(input, dim: int, index, *, name: str = "input", index_name: str = "index",
                  call: str | None = None, lang: str = "en", **labels) -> GatherRecord:
    """Record ``torch.gather(input, dim, index)``: out[i][j] = input[index[i][j]][j] (dim=0).

        >>> rec = record_gather(torch.arange(6.).view(2, 3), 1, torch.tensor([[2, 0], [1, 1]]))
        >>> rec.output
        tensor([[2., 0.],
                [4., 4.]])
    """
    src = _tensor(input, name)
    idx = _int_index(index, index_name)
    if src.ndim == 0:
        raise GatherValueError(f"{name} must have at least 1 dimension, got a 0-D tensor")
    d = _dim(dim, src.ndim)
    if idx.ndim != src.ndim:
        from gatherlens.trace.diagnose import explain_ndim_mismatch

        raise GatherValueError(explain_ndim_mismatch(tuple(src.shape), tuple(idx.shape), d,
                                                     name=name, index_name=index_name))
    for ax in range(src.ndim):
        if ax != d and idx.shape[ax] > src.shape[ax]:
            raise GatherValueError(
                f"{index_name} has size {idx.shape[ax]} on dim {ax}, larger than {name}'s "
                f"{src.shape[ax]}; torch.gather needs {index_name}.size({ax}) <= "
                f"{name}.size({ax}) on every dim except dim={d}"
            )
    _check_range(idx, src.shape[d], index_name, f"{name}'s dim {d}")
    out = torch.gather(src, d, idx)  # (*index.shape)
    parts = _grid(idx.shape)
    parts[d] = idx
    coords = _stack(parts, idx.shape)  # (*index.shape, ndim)
    return GatherRecord(
        op="gather", source=src, index=idx, output=out, source_coords=coords,
        index_coords=_stack(_grid(idx.shape), idx.shape), dim=d,
        call=call or f"torch.gather({name}, {d}, {index_name})",
        source_name=name, index_name=index_name, lang=check_lang(lang), **labels,
    )


# -- torch.index_select --------------------------------------------------------------------
def record_index_select(input, dim: int, index, *, name: str = "input",
                        index_name: str = "index", call: str | None = None, lang: str = "en",
                        **labels) -> GatherRecord:
    """Record ``torch.index_select(input, dim, index)``: whole slices along `dim`, in index order.

        >>> record_index_select(torch.arange(6.).view(3, 2), 0, torch.tensor([2, 0])).output
        tensor([[4., 5.],
                [0., 1.]])
    """
    src = _tensor(input, name)
    idx = _int_index(index, index_name)
    if idx.ndim > 1:
        raise GatherValueError(
            f"{index_name} must be 1-D for index_select, got shape {tuple(idx.shape)}"
        )
    idx = idx.reshape(-1)  # (n,)
    if src.ndim == 0:
        raise GatherValueError(f"{name} must have at least 1 dimension, got a 0-D tensor")
    d = _dim(dim, src.ndim)
    _check_range(idx, src.shape[d], index_name, f"{name}'s dim {d}")
    out = torch.index_select(src, d, idx)  # input.shape with dim d -> n
    parts = _grid(out.shape)
    pos = parts[d]  # (*out.shape) position within index
    parts[d] = idx[pos]
    return GatherRecord(
        op="index_select", source=src, index=idx, output=out,
        source_coords=_stack(parts, out.shape), index_coords=pos.unsqueeze(-1).long(), dim=d,
        call=call or f"torch.index_select({name}, {d}, {index_name})",
        source_name=name, index_name=index_name, lang=check_lang(lang), **labels,
    )


# -- torch.take_along_dim ------------------------------------------------------------------
def record_take_along_dim(input, indices, dim: int | None = None, *, name: str = "input",
                          index_name: str = "indices", call: str | None = None,
                          lang: str = "en", **labels) -> GatherRecord:
    """Record ``torch.take_along_dim(input, indices, dim)`` (gather with broadcasting).

        >>> x = torch.tensor([[10., 30., 20.]])
        >>> record_take_along_dim(x, x.argsort(dim=1), dim=1).output
        tensor([[10., 20., 30.]])
    """
    src = _tensor(input, name)
    idx = _int_index(indices, index_name)
    names = dict(source_name=name, index_name=index_name, lang=check_lang(lang), **labels)
    if dim is None:
        return _record_take_flat(src, idx, call or f"torch.take_along_dim({name}, {index_name})", names)
    if src.ndim == 0:
        raise GatherValueError(f"{name} must have at least 1 dimension, got a 0-D tensor")
    d = _dim(dim, src.ndim)
    _check_take_shapes(src, idx, d, name, index_name)
    _check_range(idx, src.shape[d], index_name, f"{name}'s dim {d}")
    out = torch.take_along_dim(src, idx, dim=d)  # (*shape)
    grid = _grid(out.shape)
    src_parts, idx_parts = [], []
    for ax in range(src.ndim):
        i_ax = grid[ax] if idx.shape[ax] != 1 else torch.zeros_like(grid[ax])
        idx_parts.append(i_ax)
    ipos = tuple(p.expand(*out.shape) for p in idx_parts)
    for ax in range(src.ndim):
        if ax == d:
            src_parts.append(idx[ipos])
        else:
            src_parts.append(grid[ax] if src.shape[ax] != 1 else torch.zeros_like(grid[ax]))
    return GatherRecord(
        op="take_along_dim", source=src, index=idx, output=out,
        source_coords=_stack(src_parts, out.shape), index_coords=_stack(idx_parts, out.shape),
        dim=d, call=call or f"torch.take_along_dim({name}, {index_name}, dim={d})", **names,
    )


def _record_take_flat(src, idx, call: str, names: dict) -> GatherRecord:
    """take_along_dim without dim: indices into the flattened input."""
    n = src.numel()
    _check_range(idx, n, names["index_name"], f"the {n} elements of flattened {names['source_name']}")
    out = torch.take_along_dim(src, idx)  # (idx.numel(),)
    flat = idx.reshape(-1)  # (N,)
    parts = [] if src.ndim == 0 else list(torch.unravel_index(flat, tuple(src.shape)))
    coords = _stack([p.long() for p in parts], out.shape)  # (N, src.ndim)
    icoords = torch.stack(torch.unravel_index(torch.arange(flat.numel()), tuple(idx.shape)),
                          dim=-1).long() if idx.ndim else torch.zeros(1, 0, dtype=torch.long)
    return GatherRecord(op="take_along_dim", source=src, index=idx, output=out, source_coords=coords,
                        index_coords=icoords, dim=None, call=call, **names)


def _check_take_shapes(src, idx, d: int, name: str, index_name: str) -> None:
    """indices has input's ndim and broadcasts with it on every dim but d."""
    if idx.ndim != src.ndim:
        raise GatherValueError(
            f"{index_name} must have as many dimensions as {name} ({src.ndim}) for "
            f"take_along_dim with dim={d}, got shape {tuple(idx.shape)}"
        )
    for ax in range(src.ndim):
        a, b = src.shape[ax], idx.shape[ax]
        if ax != d and not (a == b or a == 1 or b == 1):
            raise GatherValueError(
                f"{index_name} shape {tuple(idx.shape)} does not broadcast with {name} shape "
                f"{tuple(src.shape)} on dim {ax} ({b} vs {a}); sizes must match or be 1"
            )


# -- advanced indexing ---------------------------------------------------------------------
def _normalise(indices, ndim: int) -> tuple:
    """A tuple of indices with Ellipsis expanded and lists turned into tensors."""
    if not isinstance(indices, tuple):
        indices = (indices,)
    items = []
    for it in indices:
        if isinstance(it, list):
            it = torch.tensor(it)
        if isinstance(it, torch.Tensor):
            it = it.detach().cpu()
            if it.is_floating_point() or it.is_complex():
                raise GatherTypeError(f"index tensors must hold integers or bools, got {it.dtype}")
            if it.dtype != torch.bool:
                it = it.long()
        elif not (it is None or it is Ellipsis or isinstance(it, (int, slice))):
            raise GatherTypeError(f"unsupported index {it!r} ({type(it).__name__})")
        items.append(it)

    def used(it) -> int:
        if it is None or it is Ellipsis:
            return 0
        if isinstance(it, torch.Tensor) and it.dtype == torch.bool:
            return max(it.ndim, 1)
        return 1

    n_used = sum(used(it) for it in items)
    if sum(it is Ellipsis for it in items) > 1:
        raise GatherValueError("an index can hold at most one Ellipsis (...)")
    if n_used > ndim:
        raise GatherIndexError(f"too many indices: {n_used} for a {ndim}-D input")
    out = []
    for it in items:
        if it is Ellipsis:
            out.extend([slice(None)] * (ndim - n_used))
        else:
            out.append(it)
    return tuple(out)


def _describe(it) -> str:
    if it is None:
        return "None"
    if isinstance(it, slice):
        a = "" if it.start is None else str(it.start)
        b = "" if it.stop is None else str(it.stop)
        c = "" if it.step is None else f":{it.step}"
        return f"{a}:{b}{c}"
    if isinstance(it, torch.Tensor):
        return "mask" if it.dtype == torch.bool else "idx"
    return str(it)


def record_indexing(input, indices, *, name: str = "x", index_name: str = "idx",
                    call: str | None = None, lang: str = "en", **labels) -> GatherRecord:
    """Record advanced indexing ``input[indices]`` (tensors, ints, slices, None, ..., masks).

        >>> record_indexing(torch.arange(6.).view(3, 2), torch.tensor([2, 2, 0])).output
        tensor([[4., 5.],
                [4., 5.],
                [0., 1.]])
    """
    src = _tensor(input, name)
    norm = _normalise(indices, src.ndim)
    _check_indexing(src, norm, name, index_name)  # a clear message before torch gives its own
    out = src[norm]  # the op itself
    coord_src = _stack(_grid(src.shape), src.shape) if src.ndim else torch.zeros(0)
    coords = coord_src[norm] if src.ndim else torch.zeros((*out.shape, 0), dtype=torch.long)
    index, icoords, dim = _index_cells(src, norm, out)
    text = call or f"{name}[{', '.join(_describe(it) for it in norm)}]"
    return GatherRecord(
        op="indexing", source=src, index=index, output=out, source_coords=coords.long(),
        index_coords=icoords, dim=dim, call=text, source_name=name, index_name=index_name,
        lang=check_lang(lang), **labels,
    )


def _check_indexing(src, norm: tuple, name: str, index_name: str) -> None:
    """Every int and index tensor inside its dim; every mask the shape of the dims it covers."""
    ax = 0
    for it in norm:
        if isinstance(it, torch.Tensor) and it.dtype != torch.bool:
            size = src.shape[ax]
            bad = (it < -size) | (it >= size)
            if bool(bad.any()):
                flat = int(bad.flatten().nonzero()[0])
                raise GatherIndexError(
                    f"{index_name} value {int(it.flatten()[flat])} at position "
                    f"{position_of(flat, tuple(it.shape))} is outside {name}'s dim {ax} "
                    f"[-{size}, {size})"
                )
        elif isinstance(it, int) and not -src.shape[ax] <= it < src.shape[ax]:
            raise GatherIndexError(
                f"index {it} on dim {ax} is outside {name}'s dim {ax} [-{src.shape[ax]}, "
                f"{src.shape[ax]})"
            )
        elif isinstance(it, torch.Tensor) and it.dtype == torch.bool:
            want = tuple(src.shape[ax:ax + max(it.ndim, 1)])
            if it.ndim and tuple(it.shape) != want:
                raise GatherValueError(
                    f"mask of shape {tuple(it.shape)} does not match {name}'s shape {want} "
                    f"at dim {ax}"
                )
        ax += 0 if it is None else (max(it.ndim, 1) if isinstance(it, torch.Tensor)
                                    and it.dtype == torch.bool else 1)


def _index_cells(src, norm: tuple, out):
    """(index, index_coords, dim) when one integer tensor indexes: the index cell of each output
    element; (None, None, None) otherwise (no single index to draw)."""
    tens = [i for i, it in enumerate(norm) if isinstance(it, torch.Tensor)]
    if len(tens) != 1 or norm[tens[0]].dtype == torch.bool:
        return None, None, None
    t = tens[0]
    index = norm[t]
    dim = sum(0 if it is None else 1 for it in norm[:t])
    fake_shape = list(src.shape)
    fake_shape[dim] = max(index.numel(), 1)
    fake = _stack(_grid(fake_shape), fake_shape)
    marked = list(norm)
    marked[t] = torch.arange(index.numel()).view(index.shape)
    flat = fake[tuple(marked)][..., dim]  # (*out.shape) flat position in index
    if not index.ndim:
        return index, torch.zeros((*out.shape, 0), dtype=torch.long), dim
    return index, torch.stack(torch.unravel_index(flat, tuple(index.shape)), dim=-1).long(), dim


# -- embedding lookup ----------------------------------------------------------------------
def _position_labels(ids: torch.Tensor, labels, vocab: int) -> list[str] | None:
    """One label per id position, from per-position tokens or from a vocabulary."""
    if labels is None:
        return None
    flat = ids.reshape(-1).tolist()
    if isinstance(labels, Mapping):
        return [str(labels.get(i, "")) for i in flat]
    if callable(labels) and not isinstance(labels, (str, Sequence)):
        return [str(labels(i)) for i in flat]
    if isinstance(labels, str):
        raise GatherTypeError("labels must be a sequence of token strings, got one string")

    def _flatten(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from _flatten(y)
        else:
            yield x

    seq = [str(x) for x in _flatten(list(labels))]
    if len(seq) == len(flat):
        return seq
    if len(seq) == vocab:
        return [seq[i] for i in flat]
    raise GatherValueError(
        f"labels has {len(seq)} entries; expected one per id ({len(flat)}) or one per "
        f"vocabulary row ({vocab})"
    )


def record_embedding(ids, table, labels=None, *, name: str = "W", index_name: str = "ids",
                     call: str | None = None, lang: str = "en") -> GatherRecord:
    """Record an embedding lookup ``table[ids]``: each id picks a whole row of the table.

        >>> rec = record_embedding(torch.tensor([[3, 1]]), torch.randn(5, 4), labels=["a", "b"])
        >>> rec.output.shape                                # (B, S, d)
        torch.Size([1, 2, 4])

    labels: token strings, one per id (flat or nested like `ids`), or a vocabulary (a list of
    V strings, a mapping id -> string, or a callable) to label the picked table rows.
    """
    W = _tensor(table, name)
    x = _int_index(ids, index_name)
    if W.ndim != 2:
        raise GatherValueError(f"{name} must be a 2-D (V, d) table, got shape {tuple(W.shape)}")
    V, d = W.shape
    bad = (x < 0) | (x >= V)
    if bool(bad.any()):
        flat = int(bad.flatten().nonzero()[0])
        raise GatherIndexError(
            f"token id {int(x.flatten()[flat])} at position {position_of(flat, tuple(x.shape))} "
            f"is outside the vocabulary [0, {V})"
        )
    out = W[x]  # (*ids.shape, d)
    coords = _stack([x.unsqueeze(-1), torch.arange(d)], out.shape)  # (*ids.shape, d, 2)
    grid = _grid(out.shape)
    icoords = _stack(grid[:-1] + [torch.zeros_like(grid[-1])], out.shape) if grid else None
    pos_labels = _position_labels(x, labels, V)
    row_labels = None
    if pos_labels is not None:
        row_labels = {}
        for i, tok in zip(x.reshape(-1).tolist(), pos_labels):
            row_labels.setdefault(i, tok)
    lead = {0: (), 1: ("S",), 2: ("B", "S")}.get(x.ndim, tuple(f"n{i}" for i in range(x.ndim)))
    return GatherRecord(
        op="embedding", source=W, index=x, output=out, source_coords=coords,
        index_coords=icoords, dim=0, call=call or f"{name}[{index_name}]",
        source_name=name, index_name=index_name, output_name="emb",
        source_axes=("V", "d"), index_axes=lead, output_axes=(*lead, "d"),
        source_row_labels=row_labels, output_row_labels=pos_labels, index_as_column=True,
        lang=check_lang(lang),
    )


# -- top-k attention -----------------------------------------------------------------------
def record_attention_selection(selection, batch: int = 0, head: int = 0,
                               query: int | None = None, labels=None,
                               lang: str = "en") -> GatherRecord:
    """The score gather of top-k attention for one (batch, head) as a record.

    Source: the (Q, L) score matrix, holding the selected logits (other cells are unknown to
    the selection and drawn blank); index: the (Q, k) key indices (-1 = no key); output: the
    gathered (Q, k) scores the softmax runs over. `query` keeps one query row. `labels`: key
    token strings (length L); query rows take the last Q of them.
    """
    idx_all = _int_index(selection.indices, "selection.indices")  # (B, H, Q, k)
    if idx_all.ndim != 4:
        raise GatherValueError(
            f"selection.indices must be (B, H, Q, k), got shape {tuple(idx_all.shape)}"
        )
    B, H, Q, k = idx_all.shape
    for nm, v, n in (("batch", batch, B), ("head", head, H)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise GatherIndexError(f"{nm}={v!r} is outside [0, {n})")
    L = int(selection.key_len)
    idx = idx_all[batch, head]  # (Q, k)
    scores = _tensor(selection.scores, "selection.scores")[batch, head].float()  # (Q, k)
    weights = _tensor(selection.weights, "selection.weights")[batch, head].float()  # (Q, k)
    rows = list(range(Q))
    if query is not None:
        if isinstance(query, bool) or not isinstance(query, int) or not -Q <= query < Q:
            raise GatherIndexError(f"query={query!r} is outside [{-Q}, {Q})")
        rows = [query % Q]
    idx, scores, weights = idx[rows], scores[rows], weights[rows]  # (Q', k)
    if bool(((idx < -1) | (idx >= L)).any()):
        raise GatherIndexError(f"selection.indices holds a key index outside [-1, {L})")
    valid = idx >= 0  # (Q', k)
    src = torch.full((len(rows), L), float("nan"))  # (Q', L)
    qpos = torch.arange(len(rows)).unsqueeze(-1).expand_as(idx)  # (Q', k)
    src[qpos[valid], idx[valid]] = scores[valid]
    coords = torch.stack([qpos.where(valid, -1), idx.where(valid, -1)], dim=-1)  # (Q', k, 2)
    key_labels = q_labels = None
    if labels is not None:
        key_labels = [str(t) for t in labels]
        if len(key_labels) != L:
            raise GatherValueError(f"labels has {len(key_labels)} entries; expected key_len={L}")
        q_labels = [key_labels[L - Q + r] if Q <= L else "" for r in rows]
    qnames = [str(L - Q + r) if Q <= L else str(r) for r in rows]
    return GatherRecord(
        op="topk_attention", source=src, index=idx, output=scores, source_coords=coords.long(),
        index_coords=_stack(_grid(idx.shape), idx.shape), dim=1,
        call="scores.gather(-1, topk_idx)",
        source_name="scores", index_name="topk_idx", output_name="picked",
        source_axes=("Q", "L"), index_axes=("Q", "k"), output_axes=("Q", "k"),
        source_row_labels=q_labels, source_col_labels=key_labels, output_row_labels=q_labels,
        lang=check_lang(lang),
        meta={"weights": weights, "top_k": int(selection.top_k), "key_len": L,
              "is_causal": bool(selection.is_causal), "batch": batch, "head": head,
              "row_names": qnames, "note": ("note_batch_head", {"batch": batch, "head": head})},
    )
