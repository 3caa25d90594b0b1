"""Records cannot lie: for every builder, source[source_coords] is the op's output exactly."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError
from gatherlens.ops.attention.selection import AttentionSelection
from gatherlens.trace import (
    record_attention_selection,
    record_embedding,
    record_gather,
    record_index_select,
    record_indexing,
    record_take_along_dim,
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.bool]


def _source(data, shape, dtype):
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g, dtype=dtype)


def _index(data, shape, high, label):
    seed = data.draw(st.integers(0, 2**16), label=f"{label} seed")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g)


def assert_faithful(rec, expected):
    """The record's output is the op's, and its coordinates point at the right elements."""
    assert torch.equal(rec.output, expected)
    assert rec.source_coords.shape == (*rec.output.shape, rec.source.ndim)
    assert rec.source_coords.dtype == torch.long
    assert bool(rec.valid.all())
    assert torch.equal(rec.source[tuple(rec.source_coords.unbind(-1))], rec.output)
    if rec.index_coords is not None and rec.index_view is not None and rec.dim is not None \
            and rec.op != "indexing":
        # the index cell drawn beside each output element holds that element's position on dim
        picked_idx = rec.index_view[tuple(rec.index_coords.unbind(-1))]
        assert torch.equal(picked_idx, rec.source_coords[..., rec.dim])


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES))
def test_gather_coords_reproduce_output(data, shape, dtype):
    src = _source(data, shape, dtype)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    d = dim % len(shape)
    ishape = [data.draw(st.integers(0, 6), label="size on dim") if ax == d
              else data.draw(st.integers(1, s), label=f"size {ax}") for ax, s in enumerate(shape)]
    idx = _index(data, ishape, shape[d], "index")
    rec = record_gather(src, dim, idx)
    assert_faithful(rec, torch.gather(src, dim, idx))
    assert rec.dim == d


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES))
def test_index_select_coords_reproduce_output(data, shape, dtype):
    src = _source(data, shape, dtype)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    n = data.draw(st.integers(0, 7), label="n")
    idx = _index(data, (n,), shape[dim], "index")
    rec = record_index_select(src, dim, idx)
    assert_faithful(rec, torch.index_select(src, dim, idx))


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES))
def test_take_along_dim_coords_reproduce_output(data, shape, dtype):
    # broadcasting: either side may hold size 1 where the other does not
    src_shape = [s if data.draw(st.booleans(), label="keep src") else 1 for s in shape]
    src = _source(data, src_shape, dtype)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    d = dim % len(shape)
    ishape = []
    for ax, s in enumerate(src_shape):
        if ax == d:
            ishape.append(data.draw(st.integers(0, 5), label="n on dim"))
        elif s == 1:
            ishape.append(data.draw(st.integers(1, 4), label="broadcast size"))
        else:
            ishape.append(s if data.draw(st.booleans(), label="keep idx") else 1)
    idx = _index(data, ishape, src_shape[d], "indices")
    rec = record_take_along_dim(src, idx, dim)
    assert_faithful(rec, torch.take_along_dim(src, idx, dim))


@given(data=st.data(), shape=shapes, ishape=st.lists(st.integers(0, 4), max_size=3))
def test_take_along_dim_flat_coords_reproduce_output(data, shape, ishape):
    src = _source(data, shape, torch.float32)
    n = 1
    for s in shape:
        n *= s
    idx = _index(data, ishape, n, "indices")
    rec = record_take_along_dim(src, idx)
    assert_faithful(rec, torch.take_along_dim(src, idx))


@st.composite
def index_items(draw, shape):
    """An advanced-indexing key for `shape`: tensors, ints, slices, None, Ellipsis, a mask."""
    items = []
    tshape = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="tensor shape")
    used_ellipsis = False
    ax = 0
    while ax < len(shape):
        kind = draw(st.sampled_from(["tensor", "int", "slice", "none", "ellipsis", "stop",
                                     "mask"]), label="kind")
        size = shape[ax]
        if kind == "stop":
            break
        if kind == "tensor":
            seed = draw(st.integers(0, 999), label="tensor seed")
            g = torch.Generator().manual_seed(seed)
            items.append(torch.randint(-size, size, tshape, generator=g))
        elif kind == "int":
            items.append(draw(st.integers(-size, size - 1), label="int"))
        elif kind == "slice":
            a = draw(st.one_of(st.none(), st.integers(-size, size)), label="start")
            b = draw(st.one_of(st.none(), st.integers(-size, size)), label="stop")
            c = draw(st.one_of(st.none(), st.integers(1, 3)), label="step")
            items.append(slice(a, b, c))
        elif kind == "none":
            items.append(None)
            continue
        elif kind == "ellipsis" and not used_ellipsis:
            items.append(Ellipsis)
            used_ellipsis = True
            # the ellipsis covers the dims from here up to those the remaining items take
            rest = draw(st.integers(0, len(shape) - ax), label="dims after ellipsis")
            for j in range(len(shape) - rest, len(shape)):
                items.append(slice(None) if draw(st.booleans(), label="rest slice") else
                             draw(st.integers(-shape[j], shape[j] - 1), label="rest int"))
            break
        elif kind == "mask":
            seed = draw(st.integers(0, 999), label="mask seed")
            g = torch.Generator().manual_seed(seed)
            items.append(torch.rand((size,), generator=g) > 0.5)
            # a mask next to index tensors must broadcast with them; keep it simple
            if any(isinstance(i, torch.Tensor) and i.dtype != torch.bool for i in items):
                items.pop()
                items.append(slice(None))
        else:
            items.append(slice(None))
        ax += 1
    return tuple(items)


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(DTYPES))
def test_indexing_coords_reproduce_output(data, shape, dtype):
    src = _source(data, shape, dtype)
    key = data.draw(index_items(tuple(shape)), label="key")
    try:
        expected = src[key]
    except (IndexError, RuntimeError, ValueError):
        # torch refuses this key; so must we, with our own error
        with pytest.raises((GatherIndexError, GatherValueError, GatherTypeError, IndexError,
                            RuntimeError)):
            record_indexing(src, key)
        return
    rec = record_indexing(src, key)
    assert torch.equal(rec.output, expected)
    assert rec.source_coords.shape == (*rec.output.shape, rec.source.ndim)
    assert torch.equal(rec.source[tuple(rec.source_coords.unbind(-1))], rec.output)
    if rec.index is not None and rec.index.ndim and rec.index_coords is not None:
        # the index cell of each output element holds the position it picked on `dim`
        picked = rec.index[tuple(rec.index_coords.unbind(-1))] % src.shape[rec.dim]
        assert torch.equal(picked, rec.source_coords[..., rec.dim])


@given(data=st.data(), ids_shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
       V=st.integers(1, 12), d=st.integers(1, 6), dtype=st.sampled_from(DTYPES[:4]))
def test_embedding_coords_reproduce_output(data, ids_shape, V, d, dtype):
    table = _source(data, (V, d), dtype)
    ids = _index(data, ids_shape, V, "ids")
    rec = record_embedding(ids, table)
    assert_faithful(rec, torch.nn.functional.embedding(ids, table))
    assert rec.output.shape == (*ids.shape, d)


def make_selection(data, B, H, Q, L, k):
    """An AttentionSelection built by hand: distinct keys per query, best first, -1 padded."""
    seed = data.draw(st.integers(0, 2**16), label="selection seed")
    g = torch.Generator().manual_seed(seed)
    idx = torch.full((B, H, Q, k), -1, dtype=torch.long)
    scores = torch.full((B, H, Q, k), float("-inf"))
    for b in range(B):
        for h in range(H):
            for q in range(Q):
                n = int(torch.randint(0, min(k, L) + 1, (1,), generator=g))
                keys = torch.randperm(L, generator=g)[:n]
                vals = torch.randn(n, generator=g).sort(descending=True).values
                idx[b, h, q, :n] = keys
                scores[b, h, q, :n] = vals
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    lse = torch.logsumexp(scores, dim=-1)
    return AttentionSelection(indices=idx, weights=weights, scores=scores, lse=lse, key_len=L,
                              top_k=k)


@given(data=st.data(), B=st.integers(1, 2), H=st.integers(1, 3), Q=st.integers(1, 5),
       L=st.integers(1, 7), k=st.integers(1, 4))
def test_attention_selection_coords_reproduce_selected_scores(data, B, H, Q, L, k):
    sel = make_selection(data, B, H, Q, L, k)
    b = data.draw(st.integers(0, B - 1), label="batch")
    h = data.draw(st.integers(0, H - 1), label="head")
    query = data.draw(st.one_of(st.none(), st.integers(0, Q - 1)), label="query")
    rec = record_attention_selection(sel, batch=b, head=h, query=query)
    rows = list(range(Q)) if query is None else [query]
    assert torch.equal(rec.output, sel.scores[b, h, rows])
    assert torch.equal(rec.index, sel.indices[b, h, rows])
    valid = rec.valid
    assert torch.equal(valid, sel.indices[b, h, rows] >= 0)
    got = rec.source[tuple(rec.source_coords.clamp(min=0).unbind(-1))]
    assert torch.equal(got[valid], rec.output[valid])
    assert bool((rec.source_coords[~valid] == -1).all())
    assert bool(torch.isneginf(rec.output[~valid]).all())


def test_attention_selection_from_topk_attention():
    from gatherlens.ops.attention import topk_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    _, sel = topk_attention(q, k, v, 3, is_causal=True, return_selection=True)
    rec = sel.to_record(batch=0, head=1, labels=list("abcdef"))
    assert torch.equal(rec.output, sel.scores[0, 1])
    valid = rec.valid
    assert torch.equal(rec.gathered()[valid], rec.output[valid])
    assert rec.source_col_labels == list("abcdef")
    assert "<svg" in sel.to_svg()


def test_as_record_dispatches_on_type_and_drawing_goes_through_it():
    from gatherlens.ops.attention import topk_attention
    from gatherlens.render import draw, render_html_fragment, render_svg
    from gatherlens.trace import as_record

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    _, sel = topk_attention(q, k, v, 3, is_causal=True, return_selection=True)
    rec = as_record(sel, head=1)
    assert torch.equal(rec.output, record_attention_selection(sel, head=1).output)
    assert as_record(rec) is rec and rec.to_record() is rec
    assert sel.to_svg(head=1) == rec.to_svg() == render_svg(rec, lang=rec.lang)
    assert rec._repr_html_() == render_html_fragment(rec, lang=rec.lang)
    assert rec._repr_svg_() == rec.to_svg()
    with pytest.raises(GatherTypeError, match="already built"):
        as_record(rec, head=1)
    with pytest.raises(GatherTypeError, match="got int"):
        as_record(3)
    with pytest.raises(GatherValueError, match="fmt = 'gif'"):
        draw(rec, "gif")


# -- bad input: clear errors, never a crash ------------------------------------------------
def test_gather_errors_name_the_problem():
    W = torch.randn(10, 6)
    ids = torch.tensor([[3, 1, 4]])
    with pytest.raises(GatherValueError, match="same number of dimensions"):
        record_gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, 6))
    with pytest.raises(GatherIndexError, match=r"value 10 at position \(0, 1\) is outside"):
        record_gather(W, 0, torch.tensor([[3, 10]]))
    with pytest.raises(GatherValueError, match="size 7 on dim 1"):
        record_gather(W, 0, torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(GatherTypeError, match="integers"):
        record_gather(W, 0, torch.tensor([[0.5]]))
    with pytest.raises(GatherIndexError, match="dim=2"):
        record_gather(W, 2, ids)
    with pytest.raises(GatherTypeError, match="torch.Tensor"):
        record_gather([[1, 2]], 0, ids)


def test_embedding_errors_name_the_problem():
    W = torch.randn(10, 4)
    msg = r"token id 10 at position \(0, 2\) is outside the vocabulary \[0, 10\)"
    with pytest.raises(GatherIndexError, match=msg):
        record_embedding(torch.tensor([[1, 2, 10]]), W)
    with pytest.raises(GatherIndexError, match="token id -1"):
        record_embedding(torch.tensor([-1]), W)
    with pytest.raises(GatherValueError, match="2-D"):
        record_embedding(torch.tensor([1]), torch.randn(2, 3, 4))
    with pytest.raises(GatherValueError, match="labels has 2 entries"):
        record_embedding(torch.tensor([1, 2, 3]), W, labels=["a", "b"])


def test_embedding_labels_per_position_or_vocabulary():
    W = torch.randn(5, 2)
    ids = torch.tensor([[4, 1], [1, 0]])
    rec = record_embedding(ids, W, labels=[["d", "a"], ["a", "z"]])
    assert rec.output_row_labels == ["d", "a", "a", "z"]
    assert rec.source_row_labels == {4: "d", 1: "a", 0: "z"}
    vocab = ["zero", "one", "two", "three", "four"]
    rec = record_embedding(ids, W, labels=vocab)
    assert rec.output_row_labels == ["four", "one", "one", "zero"]
    rec = record_embedding(ids, W, labels={4: "four"})
    assert rec.output_row_labels == ["four", "", "", ""]


def test_index_select_and_take_along_dim_errors():
    x = torch.randn(3, 4)
    with pytest.raises(GatherValueError, match="1-D"):
        record_index_select(x, 0, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(GatherIndexError, match="value 3"):
        record_index_select(x, 0, torch.tensor([0, 3]))
    with pytest.raises(GatherValueError, match="does not broadcast"):
        record_take_along_dim(x, torch.zeros(2, 1, dtype=torch.long), dim=1)
    with pytest.raises(GatherIndexError, match="value 12"):
        record_take_along_dim(x, torch.tensor([12]))
    with pytest.raises(GatherIndexError, match="outside x's dim 0"):
        record_indexing(x, torch.tensor([5]))


def test_attention_selection_errors():
    sel = AttentionSelection(indices=torch.zeros(1, 1, 2, 1, dtype=torch.long),
                             weights=torch.ones(1, 1, 2, 1), scores=torch.zeros(1, 1, 2, 1),
                             lse=torch.zeros(1, 1, 2), key_len=3, top_k=1)
    with pytest.raises(GatherIndexError, match="head=1"):
        record_attention_selection(sel, head=1)
    with pytest.raises(GatherIndexError, match="query=5"):
        record_attention_selection(sel, query=5)
    with pytest.raises(GatherValueError, match="key_len=3"):
        record_attention_selection(sel, labels=["a"])
