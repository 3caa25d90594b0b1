"""Files a model comes from: the names it knows, the converted-model cache, integrity, locks, the file watch."""
