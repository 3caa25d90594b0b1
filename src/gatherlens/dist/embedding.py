"""A vocabulary-parallel embedding on PyTorch's DTensor, with gatherlens' id checks in front.

    >>> mesh = init_device_mesh("cpu", (4,))
    >>> emb = parallelize_embedding(nn.Embedding(50257, 768), mesh)   # each rank keeps ~12565 rows
    >>> emb(ids)                     # == the one-process lookup, bit for bit (all_reduce of partials)
    >>> emb(torch.tensor([[50257]]))
    GatherIndexError: token id 50257 at position (0, 0) is outside the vocabulary [0, 50257) ...

PyTorch does the work: `parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))`
shards the table by rows (Shard(0): ceil(V / W) rows per rank, so 50257 splits unevenly), and
DTensor's MaskPartial makes each rank look up the ids it owns, zero the others and all_reduce.
What DTensor lacks, and this module adds (nothing else):
- an id check. DTensor masks an id outside [0, V) on every rank, so it silently becomes a zero
  vector. Here the ids, replicated on every rank, are checked on every rank before the first
  collective: each rank raises the same GatherIndexError and none waits in the all_reduce.
- `max_norm`: DTensor has no sharding rule for `embedding_renorm_` (NotImplementedError). Each
  rank renormalises the rows it owns that the ids use, as F.embedding would, then looks up.
- a target check for the vocabulary-parallel cross-entropy of `loss_parallel` (an out-of-range
  target silently gives a finite, wrong loss there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError, position_of
from gatherlens.ops.embedding import Embedding
from gatherlens.ops.embedding.checks import check_ids, check_ids_in_range
from gatherlens.trace.sharded import shard_rows

__all__ = ["parallelize_embedding", "vocab_parallel_cross_entropy", "check_targets"]


def _as_torch_embedding(embedding) -> nn.Embedding:
    """nn.Embedding as is; a gatherlens Embedding as an nn.Embedding sharing its weight Parameter."""
    if isinstance(embedding, nn.Embedding):
        return embedding
    if isinstance(embedding, Embedding):
        if embedding.bounds != "raise":
            raise GatherValueError(f"embedding.bounds = {embedding.bounds!r}: parallelize_embedding checks "
                                   f"ids with bounds='raise' only")
        out = nn.Embedding(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx,
                           embedding.max_norm, embedding.norm_type, embedding.scale_grad_by_freq,
                           embedding.sparse, _weight=embedding.weight.data, device=embedding.weight.device)
        out.weight = embedding.weight
        return out
    raise GatherTypeError(f"embedding must be a torch.nn.Embedding or gatherlens.Embedding, "
                          f"got {type(embedding).__name__}")


def _check_ids_hook(module: nn.Embedding, args):
    """Runs on every rank before RowwiseParallel's input hook, so before any collective."""
    ids = args[0]
    if isinstance(ids, DTensor):
        if any(not isinstance(p, Replicate) for p in ids.placements):
            raise GatherValueError(f"ids is a DTensor with placements {ids.placements}; a vocabulary-parallel "
                                   f"embedding needs the ids replicated on every rank")
        ids = ids.to_local()
    local = module.weight.to_local()  # (V_r, d)
    check_ids(ids, local)
    check_ids_in_range(ids, module.num_embeddings, "raise")
    if module.gatherlens_max_norm is not None:  # DTensor has no rule for embedding_renorm_
        lo, hi = module.gatherlens_rows
        mine = ids[(ids >= lo) & (ids < hi)] - lo  # (k,) local rows the lookup reads
        with torch.no_grad():
            torch.embedding_renorm_(local, mine, module.gatherlens_max_norm, module.norm_type)
    return None


def parallelize_embedding(embedding, mesh: DeviceMesh) -> nn.Embedding:
    """Shard an embedding table by vocabulary rows over a 1-D DeviceMesh; ids checked first.

    Args:
        embedding: an ``nn.Embedding`` (changed in place and returned) or a gatherlens
            ``Embedding`` (an ``nn.Embedding`` sharing its weight is built and returned).
        mesh: a 1-D ``DeviceMesh`` over the ranks that share the table.

    Returns:
        the parallelized ``nn.Embedding``: its weight a DTensor sharded Shard(0), its output the
        full (replicated) lookup. An id outside [0, V) raises GatherIndexError on every rank.

    Example::

        >>> mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        >>> emb = parallelize_embedding(nn.Embedding(50257, 64), mesh)
        >>> emb.weight.to_local().shape          # this rank's rows, e.g. (12565, 64) of 4 ranks
        >>> emb(ids)                             # ids (B, S), the same on every rank -> (B, S, 64)
    """
    if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
        raise GatherValueError(f"mesh must be a 1-D torch.distributed DeviceMesh, got {mesh!r}")
    module = _as_torch_embedding(embedding)
    if module.sparse:
        raise GatherValueError("sparse=True (sparse gradients) is not supported by DTensor's embedding")
    if isinstance(module.weight, DTensor):
        raise GatherValueError("this embedding is already parallelized (its weight is a DTensor)")
    module.gatherlens_max_norm, module.max_norm = module.max_norm, None  # renormalised by the hook
    parallelize_module(module, mesh, RowwiseParallel(input_layouts=Replicate()))
    lo, hi = shard_rows(module.num_embeddings, mesh.size())[mesh.get_local_rank()]
    if module.weight.to_local().shape[0] != hi - lo:  # the split the pictures and the renorm assume
        raise GatherValueError(f"DTensor gave this rank {module.weight.to_local().shape[0]} rows; "
                               f"gatherlens expected rows [{lo}, {hi}) (torch.chunk's split)")
    module.gatherlens_rows = (lo, hi)
    module.register_forward_pre_hook(_check_ids_hook, prepend=True)
    return module


def check_targets(target: torch.Tensor, vocab: int, ignore_index: int = -100) -> None:
    """Every target in [0, vocab) or equal to ignore_index, else GatherIndexError (no collective).

        >>> check_targets(torch.tensor([0, 4, -100]), vocab=5)          # fine
        >>> check_targets(torch.tensor([0, 5]), vocab=5)
        GatherIndexError: target 5 at position (1,) is outside the vocabulary [0, 5) (ignore_index = -100)
    """
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise GatherTypeError(f"target must be an int64 or int32 tensor of token ids, got "
                              f"{getattr(target, 'dtype', type(target).__name__)}")
    bad = ((target < 0) | (target >= vocab)) & (target != ignore_index)
    if bool(bad.any()):
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        raise GatherIndexError(f"target {int(target.reshape(-1)[flat])} at position "
                               f"{position_of(flat, tuple(target.shape))} is outside the vocabulary "
                               f"[0, {vocab}) (ignore_index = {ignore_index})")


def vocab_parallel_cross_entropy(logits: DTensor, target: torch.Tensor, ignore_index: int = -100,
                                 reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of vocabulary-sharded logits: torch's loss_parallel, with the targets checked.

    The target gather (each row's target logit) and the log-sum-exp run on the shards; only
    per-row statistics are reduced. Call it, and ``backward``, inside ``loss_parallel()`` as
    PyTorch requires.

    Args:
        logits (DTensor): sharded ``Shard(-1)`` on the vocabulary.
        target (Tensor): token ids in [0, V), or ``ignore_index``.
        ignore_index, reduction: as ``F.cross_entropy``.

    Shape:
        - logits: :math:`(*, V)`; target: :math:`(*)`

    Returns:
        the loss, as ``F.cross_entropy`` returns it under ``loss_parallel``.

    Example::

        >>> logits = lm_head(h)          # a DTensor sharded on the vocabulary (last) dim
        >>> with loss_parallel():        # torch.distributed.tensor.parallel.loss_parallel
        ...     loss = vocab_parallel_cross_entropy(logits, target)
        ...     loss.backward()
    """
    if not isinstance(logits, DTensor):
        raise GatherTypeError(f"logits must be a DTensor sharded on the vocabulary dim, got {type(logits).__name__}")
    last = logits.ndim - 1
    if not any(isinstance(p, Shard) and p.dim in (-1, last) for p in logits.placements):
        raise GatherValueError(f"logits placements {logits.placements}: the vocabulary (last) dim must be sharded")
    check_targets(target, logits.shape[-1], ignore_index)
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise GatherValueError(f"target has shape {tuple(target.shape)}; expected logits.shape[:-1] = "
                               f"{tuple(logits.shape[:-1])}")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=ignore_index, reduction=reduction)
