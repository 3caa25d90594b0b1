"""The CPU decode runtime: use_sparse_decoding, the decode plan (one walker), the decode-step table (the C++
stack, the planned loop, transformers' forward; one installer), the head, threads and generation."""
