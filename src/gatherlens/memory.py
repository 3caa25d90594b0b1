"""Memory freed by a burst of large tensors, given back to the system (glibc's `malloc_trim`).

    >>> release_memory()        # after a model request (serve/pool.py), after each prefill chunk
    True                        # (models/runtime/generation.py); False: not glibc, nothing to call

Why: a long text's forward pass allocates and frees about a GiB of tensors (the logits of 2,048
positions alone are 400 MB, twice with the dense run beside top-k). glibc serves them from its
heaps (above its mmap threshold, which rises to 32 MiB after the first large free) and keeps the
freed pages: over 8 long texts of SmolLM2 (quantized) RSS grew from 627 MiB to 1.91 GiB while the
run cache held 570 MiB (float: 2.57 GiB after 5); the rest was freed memory glibc kept.
`malloc_trim(0)` returns every whole free page of every arena (glibc >= 2.8); with it RSS is the
model plus the kept runs (1.24 GiB there; float 1.56 GiB). It runs once per request, after its
answer is computed (a fraction of a millisecond when there is little to give back). A long prompt's
prefill is the same burst once per chunk (each chunk's activations a little larger than the last's,
so glibc's kept pages never fit the next): `gatherlens generate` at 8K tokens peaked ~100 MB higher
without a trim between chunks.
"""
from __future__ import annotations

import ctypes
import functools
import mmap

__all__ = ["release_memory", "release_mapping", "release_pages", "keep_private"]


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def release_memory() -> bool:
    """Give the heap's free pages back to the system; False where there is no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _mmap_of(array):
    """The `mmap.mmap` a numpy array (np.memmap, or a view of it) lies in, or None."""
    mapping = array
    while mapping is not None and not isinstance(mapping, mmap.mmap):
        mapping = getattr(mapping, "base", None)
    return mapping


def release_pages(array, address: int, nbytes: int) -> bool:
    """`release_mapping` for the bytes [address, address + nbytes) of the mapping `array` (the whole
    file's np.memmap) lies in, the whole pages inside them: a weight let go once it is packed, while
    the others stay. False where there is no such mapping, no madvise, or the range is outside it."""
    mapping = _mmap_of(array)
    if mapping is None or not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    base = array.ctypes.data - getattr(array, "offset", 0)  # the mapping's first byte
    page = mmap.PAGESIZE
    start = (address - base + page - 1) // page * page  # whole OS pages only (rounded up): a neighbour's bytes stay
    end = (address - base + nbytes) // page * page
    if start < 0 or end > len(mapping) or end <= start:
        return False
    mapping.madvise(mmap.MADV_DONTNEED, start, end - start)
    return True


def release_mapping(array) -> bool:
    """Let a file mapping's pages go from this process's resident memory (madvise MADV_DONTNEED): the
    mapping stays, and a page read again comes back from the file (the page cache). `array`: a numpy
    array over an `mmap.mmap` (np.memmap, or views of it). False where there is no such mapping or no
    madvise. A quantized model calls it once its weights are repacked (models/gguf/quantized.py): what it
    still reads in place (an embedding's rows, blocks without panels) comes back as it is read."""
    mapping = _mmap_of(array)
    if mapping is None or not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    mapping.madvise(mmap.MADV_DONTNEED)
    return True


MADV_POPULATE_WRITE = 23  # Linux >= 5.14: prefault a range writable (a private mapping's pages copied)


def keep_private(tensor) -> int:
    """Make the OS pages a tensor's bytes span in a private (copy-on-write) file mapping the process's own
    (madvise MADV_POPULATE_WRITE: each page copied by the kernel as if written, none read first). Reading
    them then never faults the file's pages in again, nor the file pages beside them: a kernel that maps
    a file's large folios on a read fault (6.18 on ext4 here: one byte read maps 2 MiB) brings a packed
    neighbour's let-go pages back with them. The bytes are the same. The tensor must be a contiguous view
    of a writable private mapping (np.memmap mode "c"). Returns the bytes made private (0 where there is
    no such madvise: nothing is done).

        >>> keep_private(torch.from_numpy(reader.data[start:end]))   # models/gguf/quantized.py
    """
    nbytes = tensor.numel() * tensor.element_size()
    if not tensor.is_contiguous() or nbytes == 0:
        return 0
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page  # the pages the bytes span, whole
    end = (tensor.data_ptr() + nbytes + page - 1) // page * page
    madvise = _madvise()
    if madvise is None:
        return 0
    return end - start if madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_POPULATE_WRITE) == 0 else 0


@functools.cache
def _madvise():
    """The C library's madvise (it takes any advice number, where Python's mmap knows only some), or None."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "madvise", None)
    except OSError:
        return None
