"""No numbers from damaged weights or files: finiteness of weights and results, and the one
mapping of the libraries' errors on a damaged model file.

    >>> nonfinite_weights(model)              # None, or where the first bad weight is
    "tensor 'model.layers.3.mlp.up_proj.weight' holds 12 non-finite values (first at (7, 40): nan)"
    >>> require_finite({"rows": [{"perplexity": float("nan")}]}, "the eval results")
    GatherValueError: the eval results hold a non-finite number at rows[0].perplexity (nan) ...
    >>> with readable(Path("my-model")):      # a truncated model.safetensors inside
    ...     AutoModel.from_pretrained("my-model")
    GatherValueError: model 'my-model' could not be read (damaged or truncated?): model.safetensors: ...

Checking weights costs one sum per tensor (a non-finite element makes the sum non-finite);
only a tensor whose sum is not finite is looked at element by element.
"""
from __future__ import annotations

import contextlib
import math
import pickle
import struct
from pathlib import Path
from typing import Any, Iterator

import torch

from gatherlens.errors import GatherValueError

__all__ = ["nonfinite_weights", "first_nonfinite", "require_finite", "readable", "damage", "as_os_error"]


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


# errors the readers raise on a file that is damaged, truncated or foreign (struct: a truncated GGUF)
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, struct.error)
# RuntimeErrors of torch and transformers that mean a damaged or foreign file, by what they say
_RUNTIME_DAMAGE = {
    "PytorchStreamReader": "a PyTorch weight file is truncated or damaged (its zip archive is unreadable)",
    "ignore_mismatched_sizes": "its weights do not have the shapes config.json gives (from another model?)",
}


def as_os_error(err: BaseException, path) -> OSError | None:
    """The OSError behind a library's write error, naming `path` where the system named no file:
    safetensors' `SafetensorError: ... IoError(Os { code: 28, ... })` (a full disk, 28; a file past
    `ulimit -f`, 27) becomes OSError(28, 'No space left on device', path); None for anything else.

        >>> as_os_error(OSError(28, "No space left on device"), "m/model.safetensors").filename
        'm/model.safetensors'
    """
    import errno
    import os
    import re

    if isinstance(err, OSError):
        code = err.errno
    else:
        found = re.search(r"(?:Os \{ code: |os error )(\d+)", str(err))
        if found is None:
            return None
        code = int(found[1])
    if code is None or code not in errno.errorcode:
        return None
    named = getattr(err, "filename", None) or str(path)
    return OSError(code, os.strerror(code), named)


def damage(err: BaseException, weights: str = "a weight file") -> str | None:
    """What a library's error says about a damaged model file, in one line; None when `err` is
    not such an error (a bug, which must not be reported as the user's damaged file).

    >>> damage(SafetensorError("Error while deserializing header: header too large"), "model.safetensors")
    'model.safetensors: Error while deserializing header: header too large'
    """
    from safetensors import SafetensorError

    if isinstance(err, SafetensorError):
        return f"{weights}: {err}"
    if isinstance(err, pickle.UnpicklingError):
        cause = err.__cause__ or err.__context__ or err
        return f"{weights} is not a PyTorch weight file ({str(cause).strip().splitlines()[0]})"
    if isinstance(err, RuntimeError):
        return next((said for key, said in _RUNTIME_DAMAGE.items() if key in str(err)), None)
    if isinstance(err, KeyError):
        return f"{err} is missing"
    if isinstance(err, _READ_ERRORS) or type(err) is Exception:  # tokenizers raise a bare Exception
        return (str(err).strip().splitlines() or [type(err).__name__])[0]
    return None


@contextlib.contextmanager
def readable(path: Path, weights: str = "a weight file", part: str = "") -> Iterator[None]:
    """The libraries' errors on a damaged or foreign file -> one GatherValueError naming `path`.

    weights: the name of its weight file(s), for an error that comes from reading them.
    part: what is being read ("its tokenizer"), said before the library's words.
    """
    try:
        yield
    except GatherValueError:
        raise
    except Exception as err:  # noqa: BLE001 - mapped only when `damage` recognises it
        said = damage(err, weights)
        if said is None:
            raise
        said = f"{part}: {said}" if part else said
        error = GatherValueError(f"model {str(path)!r} could not be read (damaged or truncated?): {said}")
        error.damage = said   # the words alone, for a caller that names the model itself
        raise error from None
