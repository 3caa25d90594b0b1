"""Gathers across processes, on torch.distributed: a vocabulary split over ranks, a KV cache split by sequence.

    >>> mesh = init_device_mesh("cpu", (world_size,))
    >>> emb = parallelize_embedding(nn.Embedding(50257, 768), mesh)   # DTensor RowwiseParallel + id checks
    >>> out = sparse_decode_sharded(q, local_cache, budget=2048)      # == sparse_decode on the whole cache

Start N processes with `torchrun --nproc-per-node N -m gatherlens.dist demo`, or from Python
with `run_ranks(fn, N)` (what the tests use: a hard deadline, so a failing rank cannot hang).
The collectives are torch.distributed's own (DTensor for the embedding, all_gather for decode);
`count_traffic()` records what each rank sends.
"""
from gatherlens.trace.sharded import ShardedPageSelection, shard_rows

from .comm import Traffic, count_traffic
from .decode import sparse_decode_sharded
from .embedding import check_targets, parallelize_embedding, vocab_parallel_cross_entropy
from .launch import DistTimeout, run_ranks
from .layout import SequenceLayout, split_sequence
from .simulate import gather_selection, shard_cache, simulate_sharded_decode

__all__ = [
    "parallelize_embedding", "vocab_parallel_cross_entropy", "check_targets", "shard_rows",
    "sparse_decode_sharded", "ShardedPageSelection", "gather_selection", "simulate_sharded_decode",
    "shard_cache", "SequenceLayout", "split_sequence", "count_traffic", "Traffic", "run_ranks",
    "DistTimeout",
]
