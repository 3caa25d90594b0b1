"""Every native operator of gatherlens, built ahead of first use (setup does this once).

    $ python -m gatherlens.ops.kernels          # builds into $GATHERLENS_CACHE/native, prints each
    >>> build_all()
    {'threshold_select.cpp': True, 'fused_decode.cpp': True, 'layer_ops.cpp': True, 'q8act.cpp': True,
     'sigbus.cpp': True}

Each kernel otherwise builds the first time a call needs it (15-30 s each on 2 cores); a kernel
that cannot build leaves its torch / numpy path in place (slower; the same results, except that a
quantized model without q8act multiplies dequantized floats, so its text may differ slightly).
Run it again at any time: a sound build is checked (its recorded xxh3-128) and kept, a damaged one
is rebuilt, and a build another process is running is waited for (at most ops.native.BUILD_WAIT_S).
"""
from __future__ import annotations

__all__ = ["build_all"]


def build_all() -> dict[str, bool]:
    """Build and load every kernel; {source name: loaded}."""
    from gatherlens.ops.attention.select import threshold_kernel
    from gatherlens.ops.fault import sigbus
    from gatherlens.ops.layer import fused
    from gatherlens.ops.quant import q8act
    from gatherlens.ops.sparse import fused_decode

    modules = (threshold_kernel, fused_decode, fused, q8act, sigbus)
    return {m.KERNEL.name: m.kernel_loaded() for m in modules}


if __name__ == "__main__":
    for name, ok in build_all().items():
        print(f"{name}: {'built' if ok else 'not built (the fallback path runs)'}")
