"""How sparse decoding chooses pages: ONE frozen, validated configuration and its named presets.

    >>> config = SparseConfig()                        # the measured best setting (DEFAULT)
    >>> config.budget, config.mass, config.min_pages, config.max_pages, config.page_size, config.dense_layers
    ('auto', 0.998, 32, 512, 8, 2)
    >>> config.recent_window()                         # min_pages' tokens: the floor is page 0 and this window
    256
    >>> config.budget_for(100_000, layer=5), config.budget_for(1_000, layer=5), config.budget_for(100_000, layer=0)
    (4096, 1000, 100000)
    >>> fixed = SparseConfig(1024)                     # a fixed budget: 1024 tokens a step
    >>> fixed.recent_window(), round(fixed.dense_share, 3), fixed.budget_for(2_000, layer=5)
    (256, 0.333, 2000)
    >>> TOY.budget, TOY.page_size                      # the explorer's small preset
    (16, 4)

Every place that decodes sparsely takes or builds one of these and passes it on: the op
(`sparse_decode(..., config=)`), the Hugging Face adapter (`use_sparse_decoding`: one reference
per module, `module.gatherlens_sparse`), dist, serve and the command line. A new setting goes
here: a field, its check in `_check`, and (if it is not the default's) a preset below.

DEFAULT is the best setting of `gatherlens eval-sparse`'s comparison table (docs/bench/notes.md):
pages of 8 tokens, the first two layers dense (as Quest), a recent window of a quarter of the
budget, every query head choosing its own pages, pages in the keys' own dtype; a budget of a third
of the cache or more decodes densely (`gatherlens bench generate`). Imports no torch (the command line reads it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gatherlens.errors import GatherTypeError, GatherValueError

__all__ = ["SparseConfig", "PageChoice", "SETTINGS", "DEFAULT", "OP", "QUEST", "SHARDED", "TOY", "DIST_DEMO", "PRESETS",
           "GROUP_SCORES", "CHOOSERS", "KV_DTYPES", "AUTO", "check_budget", "check_choice", "check_page_size",
           "check_kv_dtype", "check_mass"]

GROUP_SCORES = ("max", "sum")   # how a KV group's page bounds combine (shared choice)
CHOOSERS = ("bound", "oracle")  # what ranks the pages: Quest's bound, or the true attention mass
# how the paged cache stores keys and values (PagedKVCache(kv_dtype=)): None keeps the keys' own dtype;
# "int8" is one float scale per page, head and K / V (ops/sparse/cache.py states the rounding rule)
KV_DTYPES = ("float32", "float16", "bfloat16", "int8")
AUTO = "auto"  # budget="auto": each step and selection head reads pages until their estimated mass reaches `mass`


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_budget(budget, *, dense_ok: bool = False, auto_ok: bool = False) -> int | str | None:
    """`budget` itself if it is an int >= 1 (tokens; or None when `dense_ok`, "auto" when `auto_ok`), else a clear error.

        >>> check_budget(512), check_budget(None, dense_ok=True), check_budget("auto", auto_ok=True)
        (512, None, 'auto')
    """
    if (budget is None and dense_ok) or (budget == AUTO and auto_ok):
        return budget
    if not _is_int(budget):
        also = (" or None (dense)" if dense_ok else "") + (' or "auto"' if auto_ok else "")
        raise GatherTypeError(f"budget must be an int number of tokens{also}, got {type(budget).__name__} {budget!r}")
    if budget <= 0:
        raise GatherValueError(f"budget = {budget} tokens must be >= 1")
    return budget


def check_choice(recent, choose, group_score: str = "max") -> None:
    """recent an int >= 0 (tokens always read), choose one of CHOOSERS, group_score one of GROUP_SCORES."""
    if not _is_int(recent) or recent < 0:
        raise GatherValueError(f"recent = {recent!r} must be an int >= 0 (newest tokens always read)")
    if choose not in CHOOSERS:
        raise GatherValueError(f"choose = {choose!r} must be one of {CHOOSERS}")
    if group_score not in GROUP_SCORES:
        raise GatherValueError(f"group_score = {group_score!r} must be one of {GROUP_SCORES}")


def check_mass(mass, min_pages) -> None:
    """mass None (a fixed budget) or a number in (0, 1]; min_pages an int >= 1 (the auto budget's floor)."""
    if mass is not None and (isinstance(mass, bool) or not isinstance(mass, (int, float)) or not 0 < mass <= 1):
        raise GatherValueError(f"mass = {mass!r} must be None (a fixed budget) or a number in (0, 1] "
                               f"(the share of the estimated attention mass a step reads)")
    _check_count("min_pages", min_pages, 1, "pages the auto budget reads at least")


def _check_count(name: str, value, low: int, what: str) -> None:
    if not _is_int(value) or value < low:
        raise GatherValueError(f"{name} = {value!r} must be an int >= {low} ({what})")


def check_kv_dtype(kv_dtype) -> str | None:
    """`kv_dtype` itself if it is None (the keys' own dtype) or one of KV_DTYPES, else a clear error.

        >>> check_kv_dtype("float16"), check_kv_dtype(None)
        ('float16', None)
    """
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise GatherValueError(f"kv_dtype = {kv_dtype!r} must be None (the keys' own dtype) or one of {KV_DTYPES}")
    return kv_dtype


@dataclass(frozen=True)
class PageChoice:
    """The page-choice rule of one decode step, as every row of sparse decode reads it (owned by a
    SparseConfig: `config.choice`, made once; `sparse_decode`'s keywords build one without a config).

        >>> SparseConfig(512).choice
        PageChoice(share_selection=False, group_score='max', recent=128, choose='bound', mass=None, min_pages=1)
        >>> PageChoice(share_selection=True, recent=0).kwargs()   # select_pages' keywords
        {'share_selection': True, 'group_score': 'max', 'recent': 0, 'choose': 'bound', 'mass': None, 'min_pages': 1}

    share_selection: one choice per KV group (True) or per query head. group_score: "max" or "sum" of a
    group's page bounds. recent: the newest tokens always read (the window itself, not None). choose:
    "bound" (Quest) or "oracle" (true attention mass). mass, min_pages: the auto budget (issue 38,
    SparseConfig.step_mass()): each selection head reads pages until their estimated attention mass
    reaches `mass`, at least `min_pages`, at most the step's budget (page_choice.mass_counts); mass None:
    a fixed budget.
    """

    share_selection: bool = True
    group_score: str = "max"
    recent: int = 0
    choose: str = "bound"
    mass: float | None = None
    min_pages: int = 1

    def __post_init__(self):
        if not isinstance(self.share_selection, bool):
            raise GatherTypeError(f"share_selection must be a bool, got {self.share_selection!r}")
        check_choice(self.recent, self.choose, self.group_score)
        check_mass(self.mass, self.min_pages)

    def kwargs(self) -> dict:
        """The rule as keywords (select_pages, PageSelection)."""
        return {"share_selection": self.share_selection, "group_score": self.group_score, "recent": self.recent,
                "choose": self.choose, "mass": self.mass, "min_pages": self.min_pages}


def check_page_size(page_size) -> int:
    """`page_size` itself if it is an int >= 1 (tokens per page), else a clear error."""
    _check_count("page_size", page_size, 1, "tokens per page")
    return page_size


@dataclass(frozen=True)
class SparseConfig:
    """How decode steps choose pages (validated on construction; `dataclasses.replace` re-validates).

    budget: "auto" (the default): each step and selection head reads page 0, the recent window and then
        pages in bound order until their estimated share of the attention mass reaches `mass`, at
        least `min_pages` and at most `max_pages` pages (page_choice.mass_counts, the one rule); an
        int: that many tokens per selection head (pages are whole; page 0 and the newest page
        always); None decodes densely over the paged cache.
    mass: the auto budget's share p of the estimated attention mass (softmax of the scaled page bounds
        weighted by each page's token count: Twilight's top-p over Quest's bound).
    min_pages, max_pages: the auto budget's floor and ceiling in pages per selection head.
    page_size: tokens per page of the KV cache.
    share_selection: True: the query heads of a KV group read the same pages (GQA: what saves
        memory traffic); False: every query head chooses its own.
    group_score: "max" or "sum" of a KV group's page bounds (with share_selection).
    keep_selection: the HF adapter keeps each layer's last PageSelection (`last_page_selections`).
    recent: the newest `recent` tokens are always read, within the budget; None: a quarter of the
        budget (for the auto budget min_pages' tokens: its floor is page 0 and that window; `recent_window`).
    choose: "bound" (Quest's page bound) or "oracle" (true attention mass; reads every key: for evaluation).
    dense_share: a budget of at least this share of the cache decodes densely, in place (scoring
        and gathering would cost more than they save); 1.0: only a budget that covers the cache.
    dense_layers: the first this many decoder layers decode densely (Quest keeps two).
    dense_cover, dense_steps: a layer whose sparse step needed at least dense_cover of its pages (its KV
        groups' pages, each group the union of its heads' choices) reads every page for its next
        dense_steps steps, then chooses again (`dense_run`; ops/sparse/dense_runs.py): where attention
        is flat, scoring and choosing nearly every page costs more than reading them all, and dense is
        exact. dense_cover None: never.
    kv_dtype: how the paged cache stores keys and values: "float16" by default (half of float32's
        bytes; F16C reads it at full speed), None (the keys' own dtype: float32 for a float32 model),
        or one of KV_DTYPES ("float16", "bfloat16": half the bytes; "int8": about
        a third, with one scale per page). Page summaries stay exact for the stored values.
        Measured on Austen (`gatherlens eval-sparse --kv-dtype`): float16 and bfloat16 within 0.5%
        perplexity of float32 pages, int8 about 1% at budget 512.
    choice: the page-choice rule these settings make (`PageChoice`: share_selection, group_score,
        recent_window(), choose), made once at construction; what every decode step reads.
    """

    budget: int | str | None = AUTO
    page_size: int = 8
    share_selection: bool = False
    group_score: str = "max"
    keep_selection: bool = False
    recent: int | None = None
    choose: str = "bound"
    dense_share: float = 1 / 3
    dense_layers: int = 2
    dense_cover: float | None = 0.75
    dense_steps: int = 16
    kv_dtype: str | None = "float16"
    mass: float = 0.998
    min_pages: int = 32
    max_pages: int = 512
    choice: PageChoice = dataclasses.field(init=False, repr=False, compare=False)  # made from the above, once

    def __post_init__(self):
        _check(self)
        object.__setattr__(self, "choice", PageChoice(self.share_selection, self.group_score, self.recent_window(),
                                                      self.choose, self.step_mass(),
                                                      self.min_pages if self.auto else 1))  # fixed: no floor

    @property
    def auto(self) -> bool:
        """True for the auto budget (pages by estimated attention mass)."""
        return self.budget == AUTO

    def recent_window(self) -> int:
        """The recent window a step reads: `recent`, or for None a quarter of the budget (for the auto
        budget min_pages' tokens; 0 when dense).

            >>> SparseConfig(512).recent_window(), SparseConfig(512, recent=0).recent_window()
            (128, 0)
        """
        if self.recent is not None:
            return self.recent
        if self.auto:
            return self.min_pages * self.page_size
        return self.budget // 4 if self.budget is not None else 0

    def step_mass(self) -> float | None:
        """The mass share a step reads to (the auto budget), None for a fixed budget or dense."""
        return self.mass if self.auto else None

    def dense_at(self, layer: int | None) -> bool:
        """True when decoder layer `layer` decodes densely (budget None, or one of the first dense_layers)."""
        return self.budget is None or (_is_int(layer) and layer < self.dense_layers)

    def dense_run(self, covered: int, total: int) -> int:
        """Steps a layer reads densely after a sparse step that needed `covered` of `total` pages (KV groups
        times pages): dense_steps when covered >= dense_cover * total, else 0.

            >>> SparseConfig().dense_run(900, 1000), SparseConfig().dense_run(500, 1000)
            (16, 0)
        """
        return self.dense_steps if self.dense_cover is not None and covered >= self.dense_cover * total else 0

    def budget_for(self, length: int, layer: int | None = None) -> int:
        """The budget a step over `length` cached tokens of `layer` runs with: `length` (dense) or the
        budget in tokens (for the auto budget its ceiling, max_pages' tokens: dense_share does not apply,
        the pages a step reads being far fewer than the ceiling).

            >>> SparseConfig(24).budget_for(101), SparseConfig(24, dense_share=0.2).budget_for(101)
            (24, 101)
            >>> SparseConfig(max_pages=64).budget_for(100_000), SparseConfig(max_pages=64).budget_for(400)
            (512, 400)
        """
        if self.dense_at(layer):
            return length
        if self.auto:
            return min(length, self.max_pages * self.page_size)
        return length if self.budget >= self.dense_share * length else self.budget

    def replace(self, **changes) -> "SparseConfig":
        """A copy with `changes` (checked like any other; a name that is not a setting is refused by name)."""
        unknown = sorted(set(changes) - set(SETTINGS))
        if unknown:
            raise GatherTypeError(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not "
                                  f"a SparseConfig setting; the settings are {', '.join(SETTINGS)}")
        return dataclasses.replace(self, **changes)


def _check(c: SparseConfig) -> None:
    """The one validation of every sparse setting; messages name the argument, value and range."""
    check_budget(c.budget, dense_ok=True, auto_ok=True)
    check_page_size(c.page_size)
    check_mass(c.mass, c.min_pages)
    _check_count("max_pages", c.max_pages, c.min_pages, "the auto budget's ceiling, at least min_pages")
    for name in ("share_selection", "keep_selection"):
        if not isinstance(getattr(c, name), bool):
            raise GatherTypeError(f"{name} must be a bool, got {getattr(c, name)!r}")
    check_choice(0 if c.recent is None else c.recent, c.choose, c.group_score)
    share = c.dense_share
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not share > 0:
        raise GatherValueError(f"dense_share = {share!r} must be a number > 0 (share of the cache)")
    _check_count("dense_layers", c.dense_layers, 0, "leading layers kept dense")
    cover = c.dense_cover
    if cover is not None and (isinstance(cover, bool) or not isinstance(cover, (int, float)) or not 0 < cover <= 1):
        raise GatherValueError(f"dense_cover = {cover!r} must be None (never) or a number in (0, 1] (the share of "
                               f"a layer's pages a sparse step needed that makes its next steps dense)")
    _check_count("dense_steps", c.dense_steps, 1, "steps a layer then reads densely")
    check_kv_dtype(c.kv_dtype)


SETTINGS = tuple(f.name for f in dataclasses.fields(SparseConfig) if f.init)  # what a caller may set

DEFAULT = SparseConfig()
# sparse_decode's own keyword defaults (one call, no model): one choice per KV group, no window,
# dense only when the budget covers the cache (no dense runs: every step chooses, as the explorer shows and
# Quest's row measures), pages in the keys' own dtype; also the paged caches'
# default page size. The presets below (Quest's plain setting, the explorer's, dist's) follow it.
OP = SparseConfig(budget=2048, page_size=16, share_selection=True, recent=0, dense_share=1.0, dense_layers=0,
                  kv_dtype=None, dense_cover=None)
# Quest's plain setting: the baseline row of `gatherlens eval-sparse`.
QUEST = OP.replace(budget=1024)
# use_sharded_decoding's defaults: the plain setting (sparse_decode_sharded has no recent window).
SHARDED = QUEST
# the explorer (`gatherlens serve`): a small budget and pages so that a short text shows a choice,
# every layer choosing at every budget below the cache (with budget "auto", from 2 pages up).
TOY = QUEST.replace(budget=16, page_size=4, min_pages=2)
# the dist demo (`gatherlens dist demo`): the sharded setting on a cache of a few hundred tokens.
DIST_DEMO = SHARDED.replace(budget=512)
PRESETS = {"default": DEFAULT, "op": OP, "quest": QUEST, "sharded": SHARDED, "toy": TOY, "dist_demo": DIST_DEMO}
