"""`Embedding`: a drop-in for torch.nn.Embedding that checks its ids and uses the fast lookup.

    >>> emb = Embedding(50257, 768, padding_idx=0)
    >>> emb(torch.tensor([[50256, 3]])).shape
    torch.Size([1, 2, 768])
    >>> emb(torch.tensor([[50257]]))
    Traceback (most recent call last):
    gatherlens.errors.GatherIndexError: token id 50257 at position (0, 0) is outside the vocabulary [0, 50257)

Same constructor, parameter name (`weight`), initialisation (N(0, 1), padding row zero),
`from_pretrained` and state_dict as torch.nn.Embedding, so checkpoints load both ways. With
max_norm, scale_grad_by_freq or sparse set, the ids are still checked and F.embedding does the rest.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gatherlens.errors import GatherValueError
from gatherlens.ops.tensors import check_allocation
from gatherlens.ops.embedding import checks
from gatherlens.ops.embedding.lookup import embedding_lookup
from gatherlens.ops.embedding.methods import DEFAULT_METHOD

__all__ = ["Embedding"]


class Embedding(nn.Module):
    r"""A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``, with checked ids.

    A drop-in for :class:`torch.nn.Embedding` (same constructor, ``weight``, initialisation,
    ``from_pretrained`` and state_dict): ids outside the vocabulary raise a
    :class:`~gatherlens.GatherIndexError` naming the id, its position and the valid range,
    and the lookup is :func:`embedding_lookup`'s.

    Args:
        num_embeddings (int): size of the vocabulary ``V``.
        embedding_dim (int): size of each embedding vector ``d``.
        padding_idx (int, optional): that row is initialised to zero and gets no gradient.
        max_norm, norm_type, scale_grad_by_freq, sparse: as in :class:`torch.nn.Embedding`
            (then the ids are still checked and :func:`torch.nn.functional.embedding` looks up).
        bounds (str, keyword-only): ids outside ``[0, V)``: ``"raise"`` (default), ``"clamp"``,
            ``"zero"`` or ``"off"``.
        method (str, keyword-only): the formulation, one of ``METHODS`` (default ``"fast"``).

    Attributes:
        weight (Tensor): the learnable table of shape ``(num_embeddings, embedding_dim)``,
            initialised from :math:`\mathcal{N}(0, 1)`.

    Shape:
        - Input: :math:`(*)`, int32 or int64 ids of any shape
        - Output: :math:`(*, d)`

    Examples::

        >>> emb = Embedding(10, 3, padding_idx=0)
        >>> emb(torch.tensor([[1, 2, 0]])).shape
        torch.Size([1, 3, 3])
        >>> emb(torch.tensor([[10]]))
        Traceback (most recent call last):
        gatherlens.errors.GatherIndexError: token id 10 at position (0, 0) is outside the vocabulary [0, 10)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: torch.Tensor | None = None, _freeze: bool = False,
                 device=None, dtype=None, *, bounds: str = "raise", method: str = DEFAULT_METHOD):
        super().__init__()
        for name, size in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise GatherValueError(f"{name} must be an int >= 0, got {size!r}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = checks.check_padding_idx(padding_idx, num_embeddings)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if bounds not in checks.BOUNDS:
            raise GatherValueError(f"bounds must be one of {checks.BOUNDS}, got {bounds!r}")
        self.bounds, self.method = bounds, method
        if _weight is None:
            check_allocation("Embedding weight", (num_embeddings, embedding_dim), dtype or torch.get_default_dtype(),
                             device)
            self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype),
                                       requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise GatherValueError(f"_weight has shape {tuple(_weight.shape)}, expected "
                                       f"({num_embeddings}, {embedding_dim})")
            self.weight = nn.Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (*S) -> (*S, d)
        if self.max_norm is None and not self.scale_grad_by_freq and not self.sparse:
            return embedding_lookup(ids, self.weight, method=self.method, padding_idx=self.padding_idx,
                                    bounds=self.bounds)
        checks.check_ids(ids, self.weight)
        ids, zeroed = checks.check_ids_in_range(ids, self.num_embeddings, self.bounds)
        out = F.embedding(ids, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                          self.scale_grad_by_freq, self.sparse)  # (*S, d)
        return out if zeroed is None else out.masked_fill(zeroed.unsqueeze(-1), 0)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.sparse:
            s += ", sparse=True"
        if self.bounds != "raise":
            s += f", bounds={self.bounds!r}"
        return s

    @classmethod
    def from_pretrained(cls, embeddings: torch.Tensor, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, sparse: bool = False, **kwargs) -> "Embedding":
        """As torch.nn.Embedding.from_pretrained: wrap a (V, d) tensor, frozen by default."""
        checks.check_table(embeddings, "embeddings")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze, **kwargs)

    @classmethod
    def from_torch(cls, module: nn.Embedding, **kwargs) -> "Embedding":
        """The same table and settings as an existing torch.nn.Embedding (sharing its weight)."""
        new = cls(module.num_embeddings, module.embedding_dim, module.padding_idx, module.max_norm,
                  module.norm_type, module.scale_grad_by_freq, module.sparse, _weight=module.weight.data, **kwargs)
        new.weight = module.weight
        return new
