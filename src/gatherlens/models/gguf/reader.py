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
"""
from __future__ import annotations

import struct

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

__all__ = ["FastReader"]


class _Strings:
    """The strings of one array, as (start, end) byte offsets into the file; decoded on request."""

    def __init__(self, buffer: memoryview, starts: list[int], ends: list[int]):
        self.buffer, self.starts, self.ends = buffer, starts, ends
        self.nbytes = ends[-1] - starts[0] + 8 if starts else 0

    def get(self, index_or_slice):
        if isinstance(index_or_slice, slice):
            buffer = self.buffer
            return [str(buffer[a:b], "utf-8") for a, b in zip(self.starts[index_or_slice], self.ends[index_or_slice])]
        return str(self.buffer[self.starts[index_or_slice]:self.ends[index_or_slice]], "utf-8")


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
        super().__init__(path, mode=mode)
        self._gguf_view = self._gguf_map  # parsed: callers get the memmap (its .filename) back

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
        """The (start, end) of `count` length-prefixed strings from `offs`: one pass over their lengths."""
        buffer = memoryview(self.data)
        little = (self.byte_order == "I") == np.little_endian  # the file's order: the host's, or swapped
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
        return _Strings(buffer, starts, ends)
