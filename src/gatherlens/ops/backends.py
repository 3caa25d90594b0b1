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
runs only when asked for). Rows are tried in order (fastest first); the last row of an operator takes
everything (the plain path), so "auto" always finds one. `select` both decides and records (calls per
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

__all__ = ["Impl", "Operator", "OPERATORS", "ran", "reset_ran", "describe", "AUTO"]

AUTO = "auto"
OPERATORS: dict[str, "Operator"] = {}  # every operator with a backend table, by name


@dataclass(frozen=True)
class Impl:
    """One row of a backend table: `fits(*args)` -> None (it can run) or why not; `run(*args)`;
    `ready()` -> None or why it cannot run on this machine; `asked(*args)`: fits when named."""

    name: str
    fits: Callable[..., str | None]
    run: Callable
    ready: Callable[[], str | None] | None = None
    asked: Callable[..., str | None] | None = None


class Operator:
    """An operator's backend table: `op(*args, backend="auto")` runs the first row that fits."""

    def __init__(self, name: str, impls: list[Impl]):
        if not impls:
            raise ValueError(f"operator {name!r} needs at least one implementation")
        self.name, self.impls = name, tuple(impls)
        self.by_name = {impl.name: impl for impl in self.impls}
        self.counts: dict[str, int] = dict.fromkeys(self.by_name, 0)
        self.skipped: dict[str, str] = {}  # row -> the last reason "auto" passed it over
        OPERATORS[name] = self

    @property
    def backends(self) -> tuple[str, ...]:
        """The names a caller may ask for, besides "auto"."""
        return tuple(self.by_name)

    def select(self, *args, backend: str = AUTO) -> Impl:
        """The row that runs these arguments: the one asked for (an error naming why it cannot), or the
        first that fits under "auto". Records the choice (see `ran`)."""
        if backend == AUTO:
            for impl in self.impls:
                reason = impl.fits(*args)
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
        reason = (impl.asked or impl.fits)(*args)
        if reason is not None:
            can = [repr(n) for n, r in self.why(*args) if r is None] + [repr(AUTO)]
            raise GatherValueError(f"backend = {backend!r} cannot run this {self.name} call: {reason}; "
                                   f"use backend={' or '.join(can)}")
        self.counts[impl.name] += 1
        return impl

    def __call__(self, *args, backend: str = AUTO):
        if backend == AUTO:  # select's loop inlined: this is the hot path (one call less)
            for impl in self.impls:
                reason = impl.fits(*args)
                if reason is None:
                    self.counts[impl.name] += 1
                    return impl.run(*args)
                self.skipped[impl.name] = reason
        return self.select(*args, backend=backend).run(*args)

    def why(self, *args) -> list[tuple[str, str | None]]:
        """[(name, None or the reason it cannot run these arguments)] for every row, in order."""
        return [(impl.name, impl.fits(*args)) for impl in self.impls]

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


def describe() -> str:
    """One line per operator that ran: `name: impl x calls, ... (skipped: row: why; ...)`, for
    --profile and explain; a skipped row's reason is the last one it gave."""
    lines = []
    for name, counts in sorted(ran().items()):
        op = OPERATORS[name]
        line = f"{name}: " + ", ".join(f"{impl} x{n}" for impl, n in counts.items())
        skipped = [f"{row}: {why}" for row, why in op.skipped.items() if row not in counts]
        lines.append(line + (f" (skipped {'; '.join(skipped)})" if skipped else ""))
    return "\n".join(lines)
