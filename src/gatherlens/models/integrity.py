"""No numbers from damaged weights: finiteness of a model's weights and of a result's numbers.

    >>> nonfinite_weights(model)              # None, or where the first bad weight is
    "tensor 'model.layers.3.mlp.up_proj.weight' holds 12 non-finite values (first at (7, 40): nan)"
    >>> require_finite({"rows": [{"perplexity": float("nan")}]}, "the eval results")
    GatherValueError: the eval results hold a non-finite number at rows[0].perplexity (nan) ...

Checking weights costs one sum per tensor (a non-finite element makes the sum non-finite);
only a tensor whose sum is not finite is looked at element by element.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from gatherlens.errors import GatherValueError

__all__ = ["nonfinite_weights", "first_nonfinite", "require_finite"]


def nonfinite_weights(model: torch.nn.Module) -> str | None:
    """Where the first parameter holding NaN or inf is, in words; None when all are finite.

    >>> nonfinite_weights(torch.nn.Linear(2, 2))      # None
    """
    seen = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point() or p.data_ptr() in seen or p.numel() == 0:
                continue
            seen.add(p.data_ptr())
            if torch.isfinite(p.sum()):  # (,) the common case: one pass over the tensor
                continue
            bad = ~torch.isfinite(p)                                   # same shape as p
            count = int(bad.sum())
            if count == 0:  # the sum overflowed, the elements are fine
                continue
            first = tuple(int(i) for i in bad.nonzero()[0])
            return (f"tensor {name!r} holds {count:,} non-finite value{'s' if count > 1 else ''} "
                    f"(first at {first}: {float(p[first])})")
    return None


def first_nonfinite(data: Any, path: str = "") -> tuple[str, float] | None:
    """(path, value) of the first NaN/inf float in nested dicts, lists and tensors, else None.

    >>> first_nonfinite({"a": [1.0, float("inf")]})
    ('a[1]', inf)
    """
    if isinstance(data, float):
        return None if math.isfinite(data) else (path or "(value)", data)
    if isinstance(data, torch.Tensor):
        if not data.is_floating_point() or bool(torch.isfinite(data).all()):
            return None
        idx = tuple(int(i) for i in (~torch.isfinite(data)).nonzero()[0])
        return f"{path}{list(idx)}", float(data[idx])
    if isinstance(data, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in data.items())
    elif isinstance(data, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    for sub, value in items:
        found = first_nonfinite(value, sub)
        if found is not None:
            return found
    return None


def require_finite(data: Any, what: str) -> None:
    """Raise GatherValueError naming where `data` holds NaN or inf (`what` names the result).

    >>> require_finite({"loss": float("inf")}, "the results")
    GatherValueError: the results hold a non-finite number at loss (inf); nothing was written ...
    """
    found = first_nonfinite(data)
    if found is not None:
        where, value = found
        raise GatherValueError(
            f"{what} hold a non-finite number at {where} ({value}); nothing was written. The model's "
            f"weights or this input give NaN/inf: check the model files (gatherlens cache list)")
