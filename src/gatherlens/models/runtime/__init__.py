"""The CPU decode runtime: the decode step, the one-operator stack, the head, threads and generation."""
