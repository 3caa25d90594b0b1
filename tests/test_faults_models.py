"""Fault injection in a user's model folder and the model switches: missing or damaged files,
numbers that overflow, a model with no positions, switches undone or refused."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import error_lines, run  # noqa: E402
from fault_helpers import root, tiny_dir  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import load  # noqa: E402


@pytest.mark.parametrize("remove,named", [("model.safetensors", "has no weights: none of model.safetensors"),
                                          ("tokenizer.json", "has no tokenizer: none of tokenizer.json")])
def test_incomplete_model_folder_names_the_missing_file(tiny_dir, tmp_path, remove, named):
    """Must hold: a model folder missing its weights or tokenizer is one error line naming it."""
    folder = tmp_path / "incomplete"
    shutil.copytree(tiny_dir, folder)
    (folder / remove).unlink()
    for extra in ("vocab.txt",) if remove == "tokenizer.json" else ():
        (folder / extra).unlink(missing_ok=True)
    result = run("explain", "hi", "--model", str(folder), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1 and named in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_missing_shard_is_named(tiny_dir, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(GatherValueError, match="missing model-00002-of-00002.safetensors"):
        load(str(folder))


def test_non_finite_report_numbers_fail_naming_where(tiny_dir, tmp_path):
    """Must hold: a model whose finite weights overflow to NaN/inf in the forward pass gives an
    error naming the first non-finite number of the report; no report is written."""
    folder = tmp_path / "huge"
    shutil.copytree(tiny_dir, folder)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors = {k: v * 1e30 if k in ("model.norm.weight", "lm_head.weight") else v for k, v in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = run("explain", "The cat sat", "--model", str(folder), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1 and "non-finite number at" in result.output, result.output
    assert not (tmp_path / "r").exists()


# -- issue 21: damaged user models, what the cache may remove, switches, page choice --------------
def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _as_bin(folder: Path, cut) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(cut((folder / "pytorch_model.bin").read_bytes()))


USER_DAMAGE = {
    "truncated-safetensors": (lambda d: _half(d / "model.safetensors"),
                              "could not be read (damaged or truncated?): model.safetensors: Error while deserializing"),
    "garbage-safetensors": (lambda d: (d / "model.safetensors").write_bytes(bytes(range(256)) * 20),
                            "could not be read (damaged or truncated?): model.safetensors: Error while deserializing"),
    "empty-safetensors": (lambda d: (d / "model.safetensors").write_bytes(b""),
                          "model.safetensors: Error while deserializing header: header too small"),
    "garbage-tokenizer": (lambda d: (d / "tokenizer.json").write_bytes(b"\0" * 64),
                          "could not be read (damaged or truncated?): its tokenizer: "),
    "a-tensor-missing": (_drop_tensor, "damaged weights: 'model.norm.weight' is missing from its weight files"),
    "truncated-bin": (lambda d: _as_bin(d, lambda b: b[: len(b) // 2]),
                      "a PyTorch weight file is truncated or damaged"),
    "garbage-bin": (lambda d: _as_bin(d, lambda b: bytes(range(256)) * 8),
                    "pytorch_model.bin is not a PyTorch weight file"),
}


@pytest.mark.parametrize("case", list(USER_DAMAGE))
def test_damaged_file_in_a_users_model_is_one_line_naming_it(tiny_dir, tmp_path, root, case):
    """Must hold: a user's model folder with a truncated, garbage or incomplete file is one
    `Error:` line naming the folder and the file (never "internal error ... Please report it");
    exit 1; no report; the user's files left byte for byte; nothing written in the cache."""
    damage, said = USER_DAMAGE[case]
    folder = tmp_path / "mine"
    shutil.copytree(tiny_dir, folder)
    damage(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run("explain", "The cat sat", "--model", str(folder), "--out", str(tmp_path / "r"))
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and last.startswith(f"Error: model {'folder ' if 'missing' in said else ''}'{folder}")
    assert said in last and "internal error" not in result.output and len(last) < 400, result.output
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (tmp_path / "r").exists() and not root.exists()


def test_damaged_file_mapping_leaves_bugs_alone(tmp_path):
    """Must hold: the one mapping of damaged-file errors names only what the libraries raise on
    a damaged file; any other error (a bug) still surfaces as itself, not as the user's file."""
    from safetensors import SafetensorError

    from gatherlens.models.files.integrity import damage, readable

    assert damage(SafetensorError("Error while deserializing header: header too large"), "model.safetensors") \
        == "model.safetensors: Error while deserializing header: header too large"
    assert damage(RuntimeError("PytorchStreamReader failed reading zip archive")).startswith("a PyTorch weight file")
    assert damage(Exception("Error while initializing WordPiece")) == "Error while initializing WordPiece"
    for bug in (RuntimeError("shape mismatch in a matmul"), TypeError("bad call"), AttributeError("x")):
        assert damage(bug) is None
        with pytest.raises(type(bug)):
            with readable(tmp_path):
                raise bug


def _config_file(model, folder: Path) -> dict:
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def _with_contexts(model):
    from gatherlens.models import topk_attention_enabled
    from gatherlens.models.runtime.decoding import sparse_decoding

    with topk_attention_enabled(model, 4), sparse_decoding(model, budget=8, page_size=4):
        pass


def test_switches_leave_the_config_as_it_was(tiny_dir, tmp_path):
    """Must hold: after each switch and its undoing (top-k, sparse decoding, both interleaved, the
    context managers) model.config is the loaded one exactly (to_dict equal, no gatherlens key)
    and save_pretrained writes the same config.json as before any switch."""
    from gatherlens.models import use_dense_attention, use_topk_attention
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    model = load(str(tiny_dir)).model
    original, saved = model.config.to_dict(), _config_file(model, tmp_path / "before")
    rounds = {"topk": lambda m: use_dense_attention(use_topk_attention(m, top_k=3)),
              "sparse": lambda m: use_dense_decoding(use_sparse_decoding(m, budget=8, page_size=4)),
              "both": lambda m: use_dense_attention(use_dense_decoding(use_sparse_decoding(use_topk_attention(m, 2)))),
              "contexts": _with_contexts}
    for name, switch in rounds.items():
        switch(model)
        assert model.config.to_dict() == original, name
        assert not [k for k in vars(model.config) if k.startswith("gatherlens")], name
        assert _config_file(model, tmp_path / name) == saved, name
        assert model.config._attn_implementation == "sdpa", name


def test_a_model_with_no_positions_is_named(tiny_dir, tmp_path):
    """Must hold: a config (or GGUF context_length) of 0 positions is one error naming it, not
    "ask for fewer than 0 new tokens"."""
    folder = tmp_path / "zero"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 0}))
    result = run("generate", "hi", "--model", str(folder), "--max-new-tokens", "2")
    assert result.exit_code == 1 and "fewer than 0" not in result.output, result.output
    assert error_lines(result) == [
        "Error: model 'zero' says it has 0 positions (max_position_embeddings, a GGUF's context_length): it "
        "cannot hold a prompt and a new token; its config is damaged or incomplete (it needs at least 2)"]


def test_switches_refuse_models_they_cannot_change(monkeypatch):
    """Must hold: `use_topk_attention` on a Mamba model (no attention layers) and `use_sparse_decoding`
    on Mamba or BERT (no causal attention) raise one GatherValueError naming the class and what is
    needed, instead of a silent no-op; the model is left as it was. BERT still takes top-k."""
    import transformers

    from gatherlens.models.attention.topk import use_dense_attention, use_topk_attention
    from gatherlens.models.runtime.decoding import use_sparse_decoding

    mamba = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, state_size=4)).eval()
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)).eval()
    before = mamba.config.to_dict()
    cases = [(lambda: use_topk_attention(mamba, 4), r"MambaForCausalLM \(mamba\) has no attention layers, so top-k "
                                                     r"attention has nothing to replace.*needs a Transformer"),
             (lambda: use_sparse_decoding(mamba), r"MambaForCausalLM \(mamba\) has no attention layers, so sparse "
                                                  r"decoding"),
             (lambda: use_sparse_decoding(bert), r"BertModel \(bert\) has bidirectional attention \(an encoder\), so "
                                                 r"sparse decoding has no next token.*decoder-only causal LM")]
    for call, message in cases:
        with pytest.raises(GatherValueError, match=message):
            call()
    assert mamba.config.to_dict() == before
    assert use_dense_attention(use_topk_attention(bert, 2)) is bert
