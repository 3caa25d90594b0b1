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
