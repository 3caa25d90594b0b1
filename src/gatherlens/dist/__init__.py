"""Gathers across processes, on torch.distributed: a vocabulary split over ranks, a KV cache split by sequence.

    >>> mesh = init_device_mesh("cpu", (world_size,))
    >>> emb = parallelize_embedding(nn.Embedding(50257, 768), mesh)   # DTensor RowwiseParallel + id checks
    >>> out = sparse_decode_sharded(q, local_cache, budget=2048)      # == sparse_decode on the whole cache

Start N processes with `torchrun --nproc-per-node N -m gatherlens.dist demo`, or from Python
with `run_ranks(fn, N)` (what the tests use: a hard deadline, so a failing rank cannot hang).
The collectives are torch.distributed's own (DTensor for the embedding, all_gather for decode);
`count_traffic()` records what each rank sends.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

# public name -> module that defines it, imported on first use (PEP 562): `gatherlens --help`
# reads the light demo_config (the demo's options) without torch
_EXPORTS = {
    "ShardedPageSelection": "gatherlens.trace.sharded", "shard_rows": "gatherlens.trace.sharded",
    "Traffic": ".comm", "count_traffic": ".comm",
    "sparse_decode_sharded": ".decode",
    "check_targets": ".embedding", "parallelize_embedding": ".embedding",
    "vocab_parallel_cross_entropy": ".embedding",
    "DistTimeout": ".launch", "run_ranks": ".launch",
    "SequenceLayout": ".layout", "split_sequence": ".layout",
    "gather_selection": ".simulate", "shard_cache": ".simulate", "simulate_sharded_decode": ".simulate",
}

__all__ = [
    "parallelize_embedding", "vocab_parallel_cross_entropy", "check_targets", "shard_rows",
    "sparse_decode_sharded", "ShardedPageSelection", "gather_selection", "simulate_sharded_decode",
    "shard_cache", "SequenceLayout", "split_sequence", "count_traffic", "Traffic", "run_ranks",
    "DistTimeout",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
