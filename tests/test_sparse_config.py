"""The one sparse configuration (ops/sparse/config.py) and the one page geometry (ops/sparse/geometry.py)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.ops.sparse.config import DEFAULT, OP, PRESETS, QUEST, SHARDED, TOY, PageChoice, SparseConfig
from gatherlens.ops.sparse.geometry import (
    ceil_div, page_count, page_offsets, page_range, pages_per_rank, split_sequence, tokens_read,
)


# -- geometry ---------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3, 16])
def test_page_count_and_ranges_tile_the_cache(P):
    for L in range(0, 50):
        n = page_count(L, P)
        assert n == ceil_div(L, P) == len(range(0, L, P))
        ranges = [page_range(p, P, L) for p in range(n)]
        assert [i for a, b in ranges for i in range(a, b)] == list(range(L))  # every token once, in order
        assert all(0 < b - a <= P for a, b in ranges)


def test_page_range_outside_the_cache():
    with pytest.raises(GatherValueError, match=r"page = 7 is outside the cache's pages \[0, 7\)"):
        page_range(7, 16, 100)


@pytest.mark.parametrize("L, P, budget, share", [(100, 16, 40, True), (97, 8, 30, False), (64, 16, 16, True),
                                                 (5, 4, 1, True), (300, 16, 4096, False)])
def test_tokens_read_is_what_a_selection_reads(L, P, budget, share):
    torch.manual_seed(L)
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=P)
    cache.append(torch.randn(1, 2, L, 8), torch.randn(1, 2, L, 8))
    _, sel = sparse_decode(torch.randn(1, 4, 1, 8), cache, budget=budget, share_selection=share,
                           return_selection=True)
    for h in range(sel.pages.shape[1]):
        assert sel.tokens_read == len(sel.token_positions(0, h))  # the positions the pages hold, counted
    assert tokens_read(sel.pages.shape[-1], P, L) == sel.tokens_read
    assert tokens_read(0, P, L) == 0 and tokens_read(10 ** 6, P, L) == L


def _dealt(length: int, world: int, P: int) -> list[int]:
    """The plain rule: deal whole pages like torch.chunk deals rows, the partial page last."""
    pages = [min(P, length - s) for s in range(0, length, P)]
    per = len(torch.arange(len(pages)).chunk(world)[0]) if pages else 0
    out = [sum(pages[r * per:(r + 1) * per]) for r in range(world)]
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_split_sequence_deals_pages_like_chunk(world):
    for L in range(0, 90, 7):
        got = split_sequence(L, world, 16)
        assert got == _dealt(L, world, 16) and sum(got) == L
        offsets = page_offsets(got, 16)
        assert offsets == [sum(pages_per_rank(got, 16)[:r]) for r in range(world)]


def test_split_sequence_errors():
    with pytest.raises(GatherValueError, match="world_size = 0 must be an int >= 1"):
        split_sequence(10, 0, 16)


def test_dist_layout_and_trace_use_the_geometry():
    from gatherlens.dist.layout import SequenceLayout
    from gatherlens.dist.layout import split_sequence as dist_split

    assert dist_split is split_sequence
    lay = SequenceLayout(lengths=(48, 48, 4), page_size=16)
    assert lay.pages_per_rank == (3, 3, 1) and lay.page_offsets == (0, 3, 6) and lay.num_pages == 7


# -- the configuration ------------------------------------------------------------------------
def test_defaults_are_the_measured_best():
    c = SparseConfig()
    assert c == DEFAULT == PRESETS["default"]
    assert (c.budget, c.page_size, c.share_selection, c.group_score, c.dense_layers, c.choose) == \
        ("auto", 8, False, "max", 2, "bound")
    assert (c.mass, c.min_pages, c.max_pages) == (0.998, 32, 512)
    assert c.recent is None and c.recent_window() == 256 and c.dense_share == pytest.approx(1 / 3)
    assert (TOY.budget, TOY.page_size) == (16, 4)
    assert (OP.budget, OP.share_selection, OP.recent, OP.dense_share) == (2048, True, 0, 1.0)
    assert QUEST.dense_layers == SHARDED.dense_layers == 0


def test_recent_window_and_budget_for():
    assert SparseConfig(512).recent_window() == 128
    assert SparseConfig(512, recent=0).recent_window() == 0
    assert SparseConfig(None).recent_window() == 0
    c = SparseConfig(24, dense_layers=1, dense_share=1 / 3)
    assert c.budget_for(101, layer=1) == 24                  # 24 < 101 / 3: sparse
    assert c.budget_for(101, layer=0) == 101                 # a dense layer reads every token
    assert c.budget_for(60, layer=1) == 60                   # 24 >= 60 / 3: dense in place
    assert SparseConfig(None).budget_for(77, layer=5) == 77
    assert c.dense_at(0) and not c.dense_at(1) and not c.dense_at(None)


def test_the_auto_budget():
    """budget "auto": the ceiling (max_pages' tokens) is the step's budget, dense_share does not apply, the
    recent window is min_pages' tokens, and the choice rule (config.choice) carries the mass."""
    c = SparseConfig("auto", page_size=8, mass=0.9, min_pages=8, max_pages=32, dense_layers=1)
    assert c.auto and c.step_mass() == 0.9 and SparseConfig(512).step_mass() is None
    assert c.budget_for(10_000, layer=1) == 256 and c.budget_for(300, layer=1) == 256  # 256 > 300 / 3: still sparse
    assert c.budget_for(200, layer=1) == 200 and c.budget_for(10_000, layer=0) == 10_000
    assert c.recent_window() == 64 and c.replace(recent=0).recent_window() == 0
    assert (c.choice.mass, c.choice.min_pages, c.choice.recent) == (0.9, 8, 64)
    assert SparseConfig(512).choice.mass is None


@pytest.mark.parametrize("kw, err, words", [
    ({"budget": 0}, GatherValueError, "budget = 0"), ({"budget": 2.5}, GatherTypeError, "budget"),
    ({"budget": True}, GatherTypeError, "budget"), ({"page_size": 0}, GatherValueError, "page_size = 0"),
    ({"share_selection": "yes"}, GatherTypeError, "share_selection"),
    ({"keep_selection": 1}, GatherTypeError, "keep_selection"),
    ({"group_score": "mean"}, GatherValueError, "group_score = 'mean'"),
    ({"recent": -1}, GatherValueError, "recent = -1"), ({"choose": "best"}, GatherValueError, "choose = 'best'"),
    ({"dense_share": 0}, GatherValueError, "dense_share = 0"),
    ({"dense_layers": -1}, GatherValueError, "dense_layers = -1"),
    ({"budget": "Auto"}, GatherTypeError, "budget must be an int number of tokens or None \\(dense\\) or \"auto\""),
    ({"mass": 0}, GatherValueError, "mass = 0 must be None"), ({"mass": 1.5}, GatherValueError, "mass = 1.5"),
    ({"min_pages": 0}, GatherValueError, "min_pages = 0 must be an int >= 1"),
    ({"max_pages": 8}, GatherValueError, "max_pages = 8 must be an int >= 32"),
])
def test_one_validation(kw, err, words):
    with pytest.raises(err, match=words):
        SparseConfig(**kw)
    with pytest.raises(err, match=words):
        DEFAULT.replace(**kw)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.budget = 5


def test_op_with_a_config_equals_the_keywords():
    torch.manual_seed(0)
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=16, page_size=8)
    cache.append(torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16))
    q = torch.randn(1, 4, 1, 16)
    config = SparseConfig(64, page_size=8, group_score="sum", share_selection=True)
    out, sel = sparse_decode(q, cache, 64, config=config, return_selection=True)
    want, want_sel = sparse_decode(q, cache, 64, share_selection=True, group_score="sum", recent=16,
                                   return_selection=True)
    assert torch.equal(out, want) and torch.equal(sel.pages, want_sel.pages) and sel.recent == 16
    with pytest.raises(GatherValueError, match="group_score = 'sum' was given with config="):
        sparse_decode(q, cache, 64, group_score="sum", config=config)
    with pytest.raises(GatherTypeError, match="config must be a SparseConfig"):
        sparse_decode(q, cache, 64, config={"budget": 64})
    auto = SparseConfig("auto", page_size=8, mass=0.8, min_pages=3, max_pages=12)
    out, sel = sparse_decode(q, cache, auto.budget_for(300), config=auto, return_selection=True)
    want, want_sel = sparse_decode(q, cache, 96, share_selection=False, recent=24, mass=0.8, min_pages=3,
                                   return_selection=True)
    assert torch.equal(out, want) and torch.equal(sel.pages, want_sel.pages) and sel.mass == 0.8
    with pytest.raises(GatherValueError, match="mass = 0.8 was given with config="):
        sparse_decode(q, cache, 96, mass=0.8, config=auto)


def test_config_and_geometry_import_without_torch():
    code = ("import sys; from gatherlens.ops.sparse.config import SparseConfig; "
            "import gatherlens.ops.sparse.geometry; print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


# -- one reference on the model ---------------------------------------------------------------
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    from test_models_sparse import tiny_llama

    return tiny_llama(layers=3)


def test_one_config_object_on_every_module(tiny):
    from gatherlens.models.runtime.decoding import CONFIG_ATTR, use_dense_decoding, use_sparse_decoding

    use_sparse_decoding(tiny, budget=32, page_size=4, dense_layers=1)
    seen = {id(m.__dict__[CONFIG_ATTR]) for m in tiny.modules() if CONFIG_ATTR in m.__dict__}
    assert len(seen) == 1
    config = tiny.__dict__[CONFIG_ATTR]
    assert config == SparseConfig(32, page_size=4, dense_layers=1)
    assert not any(k.startswith("gatherlens") and k not in (CONFIG_ATTR, "gatherlens_sparse_previous")
                   for k in vars(tiny.config))  # no other setting on the config
    use_dense_decoding(tiny)
    assert not any(CONFIG_ATTR in m.__dict__ for m in tiny.modules())


def test_config_keyword_equals_the_keywords(tiny):
    from gatherlens.models.runtime.decoding import CONFIG_ATTR, use_dense_decoding, use_sparse_decoding

    ids = torch.randint(1, 101, (1, 70))
    kw = dict(budget=16, page_size=4, dense_layers=1, recent=4, share_selection=True)
    runs = []
    for how in (kw, {"config": SparseConfig(**kw)}):
        use_sparse_decoding(tiny, **how)
        with torch.no_grad():
            runs.append(tiny.generate(ids, max_new_tokens=5, do_sample=False))
        use_dense_decoding(tiny)
    assert torch.equal(runs[0], runs[1])
    use_sparse_decoding(tiny, config=SparseConfig(**kw), budget=64)  # a keyword overrides the config's setting
    assert tiny.__dict__[CONFIG_ATTR] == SparseConfig(**{**kw, "budget": 64})
    with pytest.raises(GatherTypeError, match="'budgett' is not a SparseConfig setting; the settings are budget, "
                                              "page_size"):
        use_sparse_decoding(tiny, budgett=64)
    with pytest.raises(GatherTypeError, match="config must be a SparseConfig .*got int 64"):
        use_sparse_decoding(tiny, 64)
    use_dense_decoding(tiny)


def test_the_page_choice_is_one_record_owned_by_the_config():
    """SparseConfig.choice: made once at construction (recent as the window it means), equal for equal
    settings, what sparse_decode builds from its keywords too; checked like the config."""
    config = SparseConfig(512, share_selection=True, group_score="sum")
    assert config.choice == PageChoice(True, "sum", 128, "bound") and config.choice is config.choice
    assert config.replace(recent=0).choice.recent == 0 and DEFAULT.choice.recent == DEFAULT.recent_window()
    assert "choice" not in repr(config) and config == SparseConfig(512, share_selection=True, group_score="sum")
    assert PageChoice(recent=3).kwargs() == {"share_selection": True, "group_score": "max", "recent": 3,
                                             "choose": "bound", "mass": None, "min_pages": 1}
    with pytest.raises(GatherValueError, match="group_score"):
        PageChoice(group_score="mean")
    with pytest.raises(TypeError):
        SparseConfig(choice=config.choice)


def test_sharded_takes_the_config_and_refuses_a_window(tiny):
    from gatherlens.dist.model import use_sharded_decoding

    with pytest.raises(GatherValueError, match="recent = 256"):
        use_sharded_decoding(tiny, config=DEFAULT)
    with pytest.raises(GatherValueError, match="budget = 'auto': sharded decoding reads a fixed budget"):
        use_sharded_decoding(tiny, config=SHARDED.replace(budget="auto", recent=0))
