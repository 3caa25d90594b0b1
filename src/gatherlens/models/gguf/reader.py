"""gguf's GGUFReader, its header parsed in one pass: a 262K-token vocabulary in a fraction of a second.

    >>> reader = FastReader("gemma-3-270m.Q4_K_M.gguf", mode="c")    # models/gguf/config.open_gguf uses it
    >>> reader.fields["tokenizer.ggml.tokens"].contents()[:3]          # what GGUFReader returns, same types
    ['<pad>', '<eos>', '<bos>']
    >>> len(reader.fields["tokenizer.ggml.scores"].data)               # 262144: one index per element
    262144

gguf's own reader makes two numpy views per string of an array (its length, its bytes) and one per
number: for Gemma 3's 262,144 tokens and scores that is ~800,000 small arrays (seconds), for Qwen's
151,936 tokens and 151,387 merges the same again. Here an array of strings is one pass over the
lengths (`struct`, no arrays), its strings decoded when `contents()` asks; an array of numbers is one
numpy view of all its values. Everything else (scalars, the tensor infos, the tensors' data views,
alignment, errors) is gguf's own code, so the reader is a GGUFReader in every other respect: the fields
keep their order, names and types; `field.data` has one index per element (its len is the count);
`contents()` returns the same Python values. It parses from a plain ndarray view of its memmap (numpy's
memmap subclass costs a Python call per slice); afterwards `.data` is the memmap again.

The pass over a string array's lengths (~0.25 s for Qwen's tokens and merges) is made once per version
of a file: where each large string array ends is remembered in the cache (files/cache.py's `file_memo`:
path, size, mtime_ns), so a warm open steps over it and walks its lengths only if `contents()` asks
(a kept tokenizer never does); that walk must end where the memo said, else the header is reported
changed (and a header that does not parse with the memo's ends is parsed afresh without them).
"""
from __future__ import annotations

import struct

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

__all__ = ["FastReader"]


STRINGS_KEPT = "gguf-strings-1"  # the cache's memo of where a file's large string arrays end
KEEP_FROM = 4096  # string arrays of at least this many strings are remembered (the vocabulary, the merges)


class _Strings:
    """The strings of one array, as (start, end) byte offsets into the file; decoded on request. Made
    from a known end (`walked` None), the offsets are found on the first request."""

    def __init__(self, buffer: memoryview, walked, offs: int, count: int, end: int, little: bool):
        self.buffer, self.offs, self.count, self.end, self.little = buffer, offs, count, end, little
        self._walked = walked  # (starts, ends), or None until asked
        self.nbytes = end - offs

    def _offsets(self) -> tuple[list[int], list[int]]:
        if self._walked is None:
            self._walked = _walk(self.buffer, self.offs, self.count, self.little)
            if (self._walked[1][-1] if self.count else self.offs) != self.end:
                raise ValueError(f"the GGUF header changed: a string array at byte {self.offs} no longer ends at "
                                 f"byte {self.end} as the cache recorded")
        return self._walked

    def get(self, index_or_slice):
        starts, ends = self._offsets()
        if isinstance(index_or_slice, slice):
            buffer = self.buffer
            return [str(buffer[a:b], "utf-8") for a, b in zip(starts[index_or_slice], ends[index_or_slice])]
        return str(self.buffer[starts[index_or_slice]:ends[index_or_slice]], "utf-8")


def _walk(buffer: memoryview, offs: int, count: int, little: bool) -> tuple[list[int], list[int]]:
    """The (start, end) of `count` length-prefixed strings from `offs`: one pass over their lengths."""
    unpack = struct.Struct("<Q" if little else ">Q").unpack_from
    starts, ends = [], []
    try:
        for _ in range(count):
            (n,) = unpack(buffer, offs)
            offs += 8
            starts.append(offs)
            offs += n
            ends.append(offs)
    except struct.error:
        raise IndexError(f"the header ends inside an array of {count} strings at byte {offs}") from None
    if offs > len(buffer):
        raise IndexError(f"the header ends inside an array of {count} strings (byte {offs})")
    return starts, ends


class _Numbers:
    """The numbers of one array as one numpy view of the file."""

    def __init__(self, values: np.ndarray):
        self.values, self.nbytes = values, values.nbytes

    def get(self, index_or_slice):
        return self.values[index_or_slice].tolist()


class _ArrayField(ReaderField):
    """A ReaderField whose values are one `_Strings` or `_Numbers` (its last part)."""

    __slots__ = ()

    def contents(self, index_or_slice: int | slice = slice(None)):
        return self.parts[-1].get(index_or_slice)


class FastReader(GGUFReader):
    """GGUFReader with arrays parsed in one pass (see module doc); `.data` is the memmap after parsing."""

    def __init__(self, path, mode: str = "r"):
        from gatherlens.models.files.cache import file_memo, remember

        known = file_memo(path, STRINGS_KEPT)
        self._known, self._ends = known if isinstance(known, dict) else {}, {}
        try:
            super().__init__(path, mode=mode)
        except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
            if not self._known:
                raise
            self._known, self._ends = {}, {}  # a memo that does not hold for this header: parsed afresh
            super().__init__(path, mode=mode)
        self._gguf_view = self._gguf_map  # parsed: callers get the memmap (its .filename) back
        if self._ends and self._ends != self._known:
            remember(path, STRINGS_KEPT, self._ends)

    @property
    def data(self):
        return self._gguf_view

    @data.setter
    def data(self, value) -> None:
        self._gguf_map = value
        self._gguf_view = value.view(np.ndarray)  # (file bytes,) uint8, same memory, no memmap hooks

    def _build_fields(self, offs: int, count: int) -> int:
        """gguf's `_build_fields`, arrays of strings and of numbers taken in one pass each."""
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            parts = [kv_klen, kv_kdata, raw_kv_type]
            name = str(bytes(kv_kdata), encoding="utf-8")
            fast = self._array(offs, parts) if raw_kv_type[0] == GGUFValueType.ARRAY else None
            if fast is not None:
                field, size = _ArrayField(orig_offs, name, fast[0], range(fast[1]), fast[2]), fast[3]
            else:
                size, field_parts, field_idxs, field_types = self._get_field_parts(offs, raw_kv_type[0])
                field = ReaderField(orig_offs, name, parts + field_parts, [i + len(parts) for i in field_idxs],
                                    field_types)
            self._push_field(field, skip_sum=True)
            offs += size
        return offs

    def _array(self, offs: int, parts: list):
        """(parts, count, types, bytes) of an array of strings or numbers at `offs`, else None (nested)."""
        raw_itype = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        if len(raw_itype) < 1 or len(alen) < 1:
            raise IndexError(f"the header ends inside an array at byte {offs}")
        itype, count, start = GGUFValueType(raw_itype[0]), int(alen[0]), offs + 12
        if itype == GGUFValueType.STRING:
            values = self._strings(start, count)
        elif itype in self.gguf_scalar_to_np:
            numbers = self._get(start, self.gguf_scalar_to_np[itype], count)
            if len(numbers) < count:
                raise IndexError(f"the header ends inside an array of {count} numbers at byte {start}")
            values = _Numbers(numbers)
        else:
            return None
        types = [GGUFValueType.ARRAY] + ([itype] if count else [])
        return parts + [raw_itype, alen, values], count, types, 12 + values.nbytes

    def _strings(self, offs: int, count: int) -> _Strings:
        """`count` length-prefixed strings from `offs`: stepped over where the cache knows their end (a
        file's large arrays, as it is now), else found in one pass over their lengths."""
        buffer = memoryview(self.data)
        little = (self.byte_order == "I") == np.little_endian  # the file's order: the host's, or swapped
        end = self._known.get(str(offs)) if count >= KEEP_FROM else None
        if isinstance(end, int) and offs <= end <= len(buffer):
            self._ends[str(offs)] = end
            return _Strings(buffer, None, offs, count, end, little)
        walked = _walk(buffer, offs, count, little)
        end = walked[1][-1] if count else offs
        if count >= KEEP_FROM:
            self._ends[str(offs)] = end
        return _Strings(buffer, walked, offs, count, end, little)
