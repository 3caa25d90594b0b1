"""One backend table per operator: which implementation runs a call, and why the others do not.

    >>> op = Operator("q8act_matmul", [
    ...     Impl("native", fits=lambda x, w: None if q8act_loaded() else "its C++ operator did not build",
    ...          run=lambda x, w: torch.ops.gatherlens.q8act_linear(...), ready=q8act_ready),
    ...     Impl("dequant", fits=lambda x, w: None, run=dequant_matmul)])   # the fallback takes anything
    >>> y = op(x, w)                          # the first implementation that fits runs
    >>> y = op(x, w, backend="dequant")       # or the one asked for (an error naming why it cannot)
    >>> op.why(x, w)                          # [("native", None), ("dequant", None)]: None = it can run
    >>> op.ready("native")                    # None, or why it cannot run on this machine at all
    >>> ran()                                 # {"q8act_matmul": {"native": 120}}: what ran, per operator

In the style of torchao's dispatch tables and vLLM's backend `validate_configuration`: each row is
(a name, `fits(*args) -> None or the reason it cannot run these arguments`, `run(*args)`, and
optionally `ready() -> None or why it cannot run here at all` (did not build, does not import), and
`asked(*args)`, the fits rule when a caller names the row (default: `fits`; Triton's CPU interpreter
runs only when asked for). Capabilities fail closed, as vLLM's backends declare theirs: in an operator
built with `facts=` (its arguments -> the AttentionVariant and the main input's dtype), each row declares
`variant=` (the variant fields it applies; `EVERY_VARIANT` for a row that hands the variant to a table
that checks it) and optionally `dtypes=`, and a call whose variant sets a field a row does not list is
refused by that row before its `fits` (a field added to AttentionVariant reaches no kernel that lacks
it). Rows are tried in order (fastest first); the last row of an operator takes everything its
declaration allows (the plain path), so "auto" finds one for every supported call. `select` both decides and records (calls per
row, and the last reason each skipped row gave), so `gatherlens bench generate --profile` and
`explain` can say which implementation ran and why the others did not (`ran()`, `describe()`). This
module is the only place that decides where a native operator runs; callers build one `Operator`
and call it. `select` costs a few fits calls and one dict increment (a decode step selects ~100
times a token): no dict building, no exceptions unless the asked-for row cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gatherlens.errors import GatherValueError

__all__ = ["Impl", "Operator", "OPERATORS", "ran", "reset_ran", "describe", "AUTO", "EVERY_VARIANT"]

AUTO = "auto"
OPERATORS: dict[str, "Operator"] = {}  # every operator with a backend table, by name
# a row that hands the variant on to an operator which checks it itself (transformers' own layers call the
# attention function, whose table refuses what its rows lack): it declares every field
EVERY_VARIANT = "every field (handed on to an operator that checks it)"


@dataclass(frozen=True)
class Impl:
    """One row of a backend table: `fits(*args)` -> None (it can run) or why not; `run(*args)`;
    `ready()` -> None or why it cannot run on this machine; `asked(*args)`: fits when named.

    What it supports, declared (fail closed: the operator refuses anything else before `fits`):
    variant: the AttentionVariant fields it applies (a frozenset; a call whose variant sets any other
        field is refused), or EVERY_VARIANT; None only in an operator that takes no variant.
    dtypes: the dtypes of the operator's main input it runs; None: any.
    """

    name: str
    fits: Callable[..., str | None]
    run: Callable
    ready: Callable[[], str | None] | None = None
    asked: Callable[..., str | None] | None = None
    variant: frozenset | str | None = None
    dtypes: tuple | None = None

    def refusal(self, facts: tuple) -> str | None:
        """None when the row declares what these facts need, else why not. facts: (the variant (an object
        with `used`, the frozenset of its fields in use) or that frozenset itself, the main input's dtype or
        None), as the operator's `facts(*args)` reads them."""
        variant, dtype = facts
        used = variant if isinstance(variant, frozenset) else variant.used
        if used and self.variant is not EVERY_VARIANT and not used <= self.variant:
            have = ", ".join(sorted(self.variant)) or "none"
            extra = ", ".join(_setting(variant, name) for name in sorted(used - self.variant))
            return f"the attention variant sets {extra}, which this row does not apply (it applies: {have})"
        if self.dtypes is not None and dtype is not None and dtype not in self.dtypes:
            return f"the input is {dtype} (this row runs {', '.join(map(str, self.dtypes))})"
        return None


def _setting(variant, name: str) -> str:
    """"softcap = 2.0", "sinks (a (8,) tensor)", or the name alone (a frozenset of names)."""
    if isinstance(variant, frozenset):
        return name
    value = getattr(variant, name)
    shape = getattr(value, "shape", None)
    return f"{name} (a {tuple(shape)} tensor)" if shape is not None else f"{name} = {value!r}"


class Operator:
    """An operator's backend table: `op(*args, backend="auto")` runs the first row that fits.

    facts(*args) -> (the variant, the main input's dtype): what each row's declaration
    (`Impl.variant`, `Impl.dtypes`) is checked against before its `fits`; with it, every row must
    declare its variant fields (fail closed). None: an operator whose rows declare nothing.
    """

    def __init__(self, name: str, impls: list[Impl], facts: Callable[..., tuple] | None = None):
        if not impls:
            raise ValueError(f"operator {name!r} needs at least one implementation")
        undeclared = [impl.name for impl in impls if facts is not None and impl.variant is None]
        if undeclared:
            raise ValueError(f"operator {name!r} takes a variant: rows {undeclared} must declare the fields they apply")
        self.name, self.impls, self.facts = name, tuple(impls), facts
        self.by_name = {impl.name: impl for impl in self.impls}
        self.counts: dict[str, int] = dict.fromkeys(self.by_name, 0)
        self.skipped: dict[str, str] = {}  # row -> the last reason "auto" passed it over
        self.inside: dict[tuple[str, str], int] = {}  # (row, the fused operator's row) -> calls made inside it
        OPERATORS[name] = self

    def _why_not(self, impl: Impl, facts, args) -> str | None:
        """The row's declaration against the facts, then its fits rule."""
        reason = impl.refusal(facts) if facts is not None else None
        return reason if reason is not None else impl.fits(*args)

    @property
    def backends(self) -> tuple[str, ...]:
        """The names a caller may ask for, besides "auto"."""
        return tuple(self.by_name)

    def select(self, *args, backend: str = AUTO) -> Impl:
        """The row that runs these arguments: the one asked for (an error naming why it cannot), or the
        first that fits under "auto". Records the choice (see `ran`)."""
        facts = self.facts(*args) if self.facts is not None else None
        if backend == AUTO:
            for impl in self.impls:
                reason = self._why_not(impl, facts, args)
                if reason is None:
                    self.counts[impl.name] += 1
                    return impl
                self.skipped[impl.name] = reason
            raise GatherValueError(f"no implementation of {self.name} takes these arguments: "
                                   + "; ".join(f"{n}: {r}" for n, r in self.why(*args)))
        impl = self.by_name.get(backend)
        if impl is None:
            raise GatherValueError(f"backend = {backend!r} is not one of {self.name}'s: "
                                   f"{', '.join(repr(b) for b in (AUTO, *self.backends))}")
        reason = impl.refusal(facts) if facts is not None else None
        reason = reason if reason is not None else (impl.asked or impl.fits)(*args)
        if reason is not None:
            can = [repr(n) for n, r in self.why(*args) if r is None] + [repr(AUTO)]
            raise GatherValueError(f"backend = {backend!r} cannot run this {self.name} call: {reason}; "
                                   f"use backend={' or '.join(can)}")
        self.counts[impl.name] += 1
        return impl

    def __call__(self, *args, backend: str = AUTO):
        if backend == AUTO:  # select's loop inlined: this is the hot path (one call less)
            facts = self.facts(*args) if self.facts is not None else None
            for impl in self.impls:
                reason = impl.fits(*args) if facts is None else self._why_not(impl, facts, args)
                if reason is None:
                    self.counts[impl.name] += 1
                    return impl.run(*args)
                self.skipped[impl.name] = reason
        return self.select(*args, backend=backend).run(*args)

    def why(self, *args) -> list[tuple[str, str | None]]:
        """[(name, None or the reason it cannot run these arguments)] for every row, in order."""
        facts = self.facts(*args) if self.facts is not None else None
        return [(impl.name, self._why_not(impl, facts, args)) for impl in self.impls]

    def record(self, name: str, calls: int, inside: str) -> None:
        """Count `calls` of row `name` made inside a fused operator (`inside`, "operator.row": the C++ decode
        stack calls this row's kernels itself), so that `describe` names them too."""
        self.counts[name] += calls
        self.inside[name, inside] = self.inside.get((name, inside), 0) + calls

    def ready(self, name: str) -> str | None:
        """None when row `name` can run on this machine (built, imported), else why it cannot."""
        impl = self.by_name[name]
        return None if impl.ready is None else impl.ready()


def ran() -> dict[str, dict[str, int]]:
    """operator -> {implementation: calls} since the last `reset_ran()`, operators that ran only."""
    return {name: {k: n for k, n in op.counts.items() if n} for name, op in OPERATORS.items()
            if any(op.counts.values())}


def reset_ran() -> None:
    for op in OPERATORS.values():
        op.counts.update(dict.fromkeys(op.counts, 0))
        op.skipped.clear()
        op.inside.clear()


def describe() -> str:
    """One line per operator that ran: `name: impl x calls (n inside op.row), ... (skipped row: why; ...)`,
    for --profile and explain; a skipped row's reason is the last one it gave (a row that also ran was
    passed over for some calls: the line says why too)."""
    lines = []
    for name, counts in sorted(ran().items()):
        op = OPERATORS[name]
        line = f"{name}: " + ", ".join(f"{impl} x{n}{_inside(op, impl)}" for impl, n in counts.items())
        skipped = [f"{row}: {why}" for row, why in op.skipped.items()]
        lines.append(line + (f" (skipped {'; '.join(skipped)})" if skipped else ""))
    return "\n".join(lines)


def _inside(op: Operator, impl: str) -> str:
    """" (n inside decode_step.stack)" for the calls of row `impl` a fused operator made, else ""."""
    parts = [f"{n} inside {where}" for (row, where), n in op.inside.items() if row == impl]
    return f" ({', '.join(parts)})" if parts else ""
