"""Pure tensor functions: no I/O, no drawing. Each op has a readable reference (`naive.py`)
beside its fast paths, with the same signature, tested against it."""
