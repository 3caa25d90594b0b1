"""Attention inside a transformers model: top-k, the sparse attention function, its caches and switches' parts."""
