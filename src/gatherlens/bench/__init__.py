"""Benchmarks: every speed claim is a ratio against a baseline run side by side."""
