"""Layout: elision keeps what was picked; value text is short and fixed."""
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.render.layout import visible
from gatherlens.render.theme import fmt_value


@given(n=st.integers(1, 200), budget=st.integers(2, 20), data=st.data())
def test_visible_keeps_picked_and_edges(n, budget, data):
    keep = set(data.draw(st.lists(st.integers(0, n - 1), max_size=budget - 1)))
    seq = visible(n, keep, budget)
    shown = [i for i in seq if i is not None]
    assert shown == sorted(set(shown))
    assert len(shown) == min(n, budget)
    assert keep <= set(shown)
    if n > budget:
        assert None in seq and n - 1 in shown
    else:
        assert seq == list(range(n))
    # a gap is never doubled and always hides something
    for a, b in zip(seq, seq[1:]):
        assert not (a is None and b is None)


def test_fmt_value():
    assert fmt_value(3.0) == "3" and fmt_value(2.1) == "2.1" and fmt_value(-0.25) == "-0.25"
    assert fmt_value(float("-inf")) == "-∞" and fmt_value(float("nan")) == ""
    assert fmt_value(50256.0) == "50256" and fmt_value(123.456) == "123"
    assert fmt_value(True) == "T" and fmt_value(7) == "7"


def test_fmt_value_never_prints_minus_zero_or_padded_exponents():
    """Issue 39: '-0' and '8e-04' were printed in cells."""
    assert fmt_value(-0.001) == "-0.001" and fmt_value(-0.004) == "-0.004" and fmt_value(-0.0) == "0"
    assert fmt_value(0.0008) == "8e-4" and fmt_value(-2e-5) == "-2e-5" and fmt_value(3e7) == "3e7"
    for v in (-0.004999, -0.0001, -0.00499, -1e-9):
        assert fmt_value(v) not in ("-0", "-0.0", "-0.00")


@given(n=st.integers(11, 24), V=st.integers(30, 200), data=st.data())
def test_every_picked_source_row_stays_visible(n, V, data):
    """Issue 39 item 6: an embedding figure of up to 24 ids keeps every row they picked (the caption's promise)."""
    import torch

    from gatherlens.render.layout import Limits, layout
    from gatherlens.trace.builders import record_embedding

    ids = torch.tensor([data.draw(st.lists(st.integers(0, V - 1), min_size=n, max_size=n))])     # (1, n)
    fig = layout(record_embedding(ids, torch.randn(V, 5)), limits=Limits(rows=10, cols=7, slices=3))
    src = next(p for p in fig.panels if p.role == "src")
    shown = {r for sl in src.slices if sl for r in sl.rows if r is not None}
    assert set(ids[0].tolist()) <= shown
    out = next(p for p in fig.panels if p.role == "out")
    cells = [c for sl in out.slices if sl for c in sl.cells.values()]
    keys = {c.key for sl in src.slices if sl for c in sl.cells.values()}
    assert all(c.data_src in keys for c in cells if c.data_src)          # every output cell's source is drawn


def test_a_figure_never_repeats_a_colour():
    """Issue 39: PALETTE[key % 11] gave ids 3 and 14 one colour; one palette per figure does not."""
    import torch

    from gatherlens.render.layout import layout
    from gatherlens.render.theme import figure_colours, palette
    from gatherlens.trace.builders import record_embedding

    fig = layout(record_embedding(torch.tensor([[3, 14, 25, 36, 47, 58, 69, 80, 91, 102, 113, 124]]), torch.randn(130, 4)))
    out = next(p for p in fig.panels if p.role == "out")
    fills = {c.data_src.split("-")[1]: c.fill for sl in out.slices if sl for c in sl.cells.values()}
    assert len(set(fills.values())) == len(fills) == 12
    assert len(set(palette(500))) == 500 and len(set(figure_colours(range(0, 9000, 7)).values())) == len(range(0, 9000, 7))


def test_the_page_script_draws_with_the_same_palette():
    """explore.js's palette(n) is theme.palette(n), colour for colour (node runs the script's own functions)."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    from gatherlens.render.theme import PALETTE, palette

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    for n in (5, 40, 1500):
        out = subprocess.run([node, str(Path(__file__).with_name("palette_js.js")), json.dumps(list(PALETTE)), str(n)],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert json.loads(out) == palette(n)


def test_as_many_picked_rows_as_the_window_holds_all_stay():
    """24 distinct ids of a 30-row table (hypothesis found it): the window's 24 rows are the picked ones, the
    table's last row giving way; with one fewer picked, the last row is shown too."""
    import torch

    from gatherlens.render.layout import Limits, layout
    from gatherlens.trace.builders import record_embedding

    for ids, last_shown in ((list(range(24)), False), (list(range(23)), True)):
        fig = layout(record_embedding(torch.tensor([ids]), torch.randn(30, 5)), limits=Limits(rows=10, cols=7))
        src = next(p for p in fig.panels if p.role == "src")
        shown = {r for sl in src.slices if sl for r in sl.rows if r is not None}
        assert set(ids) <= shown and (29 in shown) == last_shown
    assert visible(30, set(range(5)), 5, most=5) == [0, 1, 2, 3, 4, None]
