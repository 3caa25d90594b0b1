"""Large CPU outputs on transparent huge pages, without touching the process-wide allocator.

    >>> buf = empty_hugepage((32768, 768), torch.float32)   # (N, d), 2 MiB pages on first touch

Why: a fresh large tensor from torch's CPU allocator is a fresh `mmap` of 4 KiB pages, and the first
write to each page faults. With THP in `madvise` mode that makes a large `F.embedding` much slower
than the same gather into an existing buffer. A private anonymous mapping with
`madvise(MADV_HUGEPAGE)` faults 2 MiB at a time, so the gather into it beats torch's fresh buffer
(figures: docs/benchmarks.md, `gatherlens bench embedding`). A plain private mapping (4 KiB pages) is zero-filled by the kernel, lazily:
a dense (V, d) gradient built on it costs page faults only for the rows a backward touches.

PyTorch can do the same for every allocation with the environment variable THP_MEM_ALLOC_ENABLE=1;
that is process-wide, so gatherlens leaves it to the user and only uses huge pages for its own outputs.
"""
from __future__ import annotations

import math
import mmap
import sys

import torch

__all__ = ["HUGEPAGE_THRESHOLD", "HUGEPAGE_MAX", "LAZY_THRESHOLD", "hugepages_available", "empty_hugepage", "zeros_lazy"]

# Below this many bytes torch's allocator usually hands back warm memory (glibc reuses freed heap
# chunks up to its dynamic mmap threshold, at most 32 MiB), so a fresh mapping would only add faults.
HUGEPAGE_THRESHOLD = 32 << 20  # 32 MiB: glibc's largest dynamic mmap threshold
# Above this, asking for that many 2 MiB pages at once made the kernel compact memory, and huge
# pages lost to torch's own 4 KiB pages (docs/benchmarks.md).
HUGEPAGE_MAX = 384 << 20  # 384 MiB
LAZY_THRESHOLD = 4 << 20  # a lazily zeroed gradient pays off once zero-filling takes milliseconds


def hugepages_available() -> bool:
    """True on Linux where Python's mmap can ask for transparent huge pages."""
    return sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


_AVAILABLE = hugepages_available()


def empty_hugepage(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised (in fact zero) CPU tensor on a private mapping advised for huge pages.

    >>> empty_hugepage((4, 3), torch.bfloat16).shape
    torch.Size([4, 3])

    Falls back to `torch.empty` where huge pages cannot be asked for or the tensor is small.
    The tensor keeps the mapping alive; the mapping is unmapped when the last view of it dies.
    """
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if not _AVAILABLE or not HUGEPAGE_THRESHOLD <= nbytes <= HUGEPAGE_MAX:
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # kernel without THP: the mapping still works with 4 KiB pages
        pass
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # (nbytes,)
    return flat.view(dtype).view(shape)


def zeros_lazy(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero CPU tensor whose 4 KiB pages the kernel zero-fills only where they are first written.

    >>> grad = zeros_lazy((128256, 4096), torch.float32)   # 2 GiB that cost nothing until written

    For a (V, d) gradient of which a backward writes few rows: only the 4 KiB pages those rows
    touch are ever zeroed, instead of all of V x d (docs/benchmarks.md). Huge pages are the wrong
    choice here: each touched 2 MiB page is zeroed whole. Untouched pages read as the shared
    zero page.
    """
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if not _AVAILABLE or nbytes < LAZY_THRESHOLD:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # (nbytes,), reads as zeros
    return flat.view(dtype).view(shape)
