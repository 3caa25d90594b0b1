"""A loaded model: the transformers model, its tokenizer and where it came from (`LoadedModel`).

    >>> lm = load("smollm2"); lm.encode("The cat"), lm.is_causal, lm.token_strings([504])

Its own module, below both loaders (models/loading.py, models/gguf/quantized.py), so neither
imports the other to build one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatherlens.models.hf_adapter import is_causal_lm

__all__ = ["LoadedModel"]


@dataclass
class LoadedModel:
    """A loaded model: `.model` (a transformers PreTrainedModel, eval mode), `.tokenizer`, `.name`."""

    name: str
    model: Any
    tokenizer: Any
    source: Path                      # the .gguf file or the model folder it came from
    cache_dir: Path | None = None     # the converted folder, for GGUF sources
    from_cache: bool = False          # True when read from an existing converted folder
    seconds: float = 0.0              # wall time of load()
    info: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def is_causal(self) -> bool:
        """True for decoder LMs (Llama, GPT-2, ...), False for encoders such as BERT."""
        return is_causal_lm(self.model) or bool(getattr(self.config, "is_decoder", False))

    def encode(self, text: str | list[str], **kw):
        """Token ids of `text` as a (B, S) int64 tensor; keyword args go to the tokenizer."""
        kw.setdefault("return_tensors", "pt")
        return self.tokenizer(text, **kw)["input_ids"]

    def token_strings(self, ids) -> list[str]:
        """One readable string per token id (decoded alone, so ' cat' keeps its space)."""
        ids = ids.reshape(-1).tolist() if hasattr(ids, "reshape") else list(ids)
        return [self.tokenizer.decode([i]) for i in ids]

    def __repr__(self) -> str:
        cfg = self.model.config
        return (f"LoadedModel(name={self.name!r}, arch={cfg.model_type!r}, "
                f"layers={getattr(cfg, 'num_hidden_layers', '?')}, "
                f"params={sum(p.numel() for p in self.model.parameters()):,}, "
                f"from_cache={self.from_cache}, seconds={self.seconds:.2f})")
