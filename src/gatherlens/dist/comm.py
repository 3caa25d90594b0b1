"""The collectives gatherlens.dist issues, each one counted: what a rank sends is never a guess.

    >>> with count_traffic() as traffic:
    ...     out = sparse_decode_sharded(q, local_cache, budget=2048)
    >>> traffic.calls, traffic.payload_bytes     # [("all_gather", 64), ...], bytes this rank put in

`payload_bytes` is what this rank contributes to each collective. With W ranks a ring all-gather
sends (W - 1) times that over this rank's link (`wire_bytes`), which is also what it receives.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["Traffic", "count_traffic", "all_gather_stacked"]

_active: list["Traffic"] = []


@dataclass
class Traffic:
    """Collectives issued inside a `count_traffic()` block, on this rank."""

    world_size: int = 1
    calls: list[tuple[str, int]] = field(default_factory=list)  # (collective, payload bytes)

    @property
    def payload_bytes(self) -> int:
        return sum(b for _, b in self.calls)

    @property
    def wire_bytes(self) -> int:
        """Bytes a ring all-gather sends from this rank: (W - 1) x the payload."""
        return (self.world_size - 1) * self.payload_bytes


@contextlib.contextmanager
def count_traffic():
    """Record every collective gatherlens.dist issues on this rank inside the block."""
    traffic = Traffic(world_size=dist.get_world_size() if dist.is_initialized() else 1)
    _active.append(traffic)
    try:
        yield traffic
    finally:
        _active.remove(traffic)


def all_gather_stacked(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's `tensor` (same shape and dtype everywhere), stacked in rank order: (W, *shape)."""
    tensor = tensor.contiguous()
    world = dist.get_world_size(group)
    for t in _active:
        t.calls.append(("all_gather", tensor.numel() * tensor.element_size()))
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor, group=group)
    return torch.stack(parts)  # (W, *shape)
