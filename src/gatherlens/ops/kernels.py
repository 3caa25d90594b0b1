"""Every native operator of gatherlens, built ahead of first use (setup does this once).

    $ python -m gatherlens.ops.kernels            # builds into $GATHERLENS_CACHE/native, prints each
    $ python -m gatherlens.ops.kernels --install  # and copies them into the environment (setup does)
    >>> build_all()
    {'threshold_select.cpp': True, 'fused_decode.cpp': True, 'layer_ops.cpp': True, 'q8act.cpp': True,
     'floatdot.cpp': True, 'sigbus.cpp': True, 'fused_prefill.cpp': True, 'decode_stack.cpp': True}

Each kernel otherwise builds the first time a call needs it (15-30 s each on 2 cores); a kernel
that cannot build leaves its torch / numpy path in place (slower; the same results, except that a
quantized model without q8act multiplies dequantized floats, so its text may differ slightly).
Run it again at any time: a sound build is checked (its recorded xxh3-128) and kept, a damaged one
is rebuilt, and a build another process is running is waited for (at most ops.native.BUILD_WAIT_S).
"""
from __future__ import annotations

__all__ = ["build_all", "install_all"]


def build_all() -> dict[str, bool]:
    """Build and load every kernel; {source name: loaded}."""
    return {m.KERNEL.name: m.kernel_loaded() for m in _modules()}


def _modules() -> tuple:
    from gatherlens.ops.attention.select import threshold_kernel
    from gatherlens.ops.fault import sigbus
    from gatherlens.ops.layer import fused, stack
    from gatherlens.ops.prefill import fused_prefill
    from gatherlens.ops.quant.products import floatdot, q8act, q8k
    from gatherlens.ops.sparse import fused_decode

    return threshold_kernel, fused_decode, fused, q8act, q8k, floatdot, sigbus, fused_prefill, stack


def install_all() -> dict[str, str]:
    """Copy every sound build into the environment's own folder (ops.native.installed_dir()), so an
    empty or new cache ($GATHERLENS_CACHE) needs no build; {source name: what happened}."""
    from gatherlens.ops.native import install_builds

    return install_builds([m.KERNEL for m in _modules()])


if __name__ == "__main__":
    import sys

    for name, ok in build_all().items():
        print(f"{name}: {'built' if ok else 'not built (the fallback path runs)'}")
    if "--install" in sys.argv[1:]:
        for name, what in install_all().items():
            print(f"{name}: {what}")
