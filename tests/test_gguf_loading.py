"""A GGUF read by gatherlens itself: config, tokenizer and float32 weights equal transformers' GGUF loader.

models/gguf/config.py, models/gguf/tokenizer.py and models/gguf/weights.py replace `from_pretrained(..., gguf_file=)`
on the load paths (loading._convert_gguf, quantized._config_and_tokenizer); transformers stays the
reference here: on the shipped SmolLM2 GGUF and on tiny files written with gguf.GGUFWriter.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json

import numpy as np
import pytest
import torch

from gatherlens.eval.corpus import austen_available, load_text
from gatherlens.models.files import cache as mcache
from gatherlens.models import load, resolve
from gatherlens.models.gguf.config import gguf_config, metadata_value, open_gguf
from gatherlens.models.gguf.tokenizer import gguf_tokenizer
from gatherlens.models.gguf.weights import float_model, hf_name, unpermute_rows
from gatherlens.paths import cache_root

SMOL = resolve("smollm2").path
ODD_TEXT = ("Ünïcödé — “quotes”, 日本語 and 😀 emoji;  two  spaces,\ttabs\t\tand\n\n\nblank lines   \n"
            "digits 1234567 3.14159 -42 1e-9, punctuation !!! ??? ... ;:,' \"\" (x) [y] {z} <a> #1 @me $5 %")
MESSAGES = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And in Ünïcödé?"}]


def _gguf_kw(path):
    return {"gguf_file": path.name, "local_files_only": True}


@pytest.fixture(scope="module")
def reader():
    return open_gguf(SMOL, mode="c")


@pytest.fixture(scope="module")
def reference_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOL.parent, **_gguf_kw(SMOL))


def _config_diff(ours, theirs) -> dict:
    a, b = ours.to_dict(), theirs.to_dict()
    skip = {"_name_or_path", "transformers_version"}
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k)}


# -- the config -------------------------------------------------------------------------------------
@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_config_equals_transformers_gguf_config(reader):
    from transformers import AutoConfig, LlamaConfig

    ours = gguf_config(reader)
    assert type(ours) is LlamaConfig
    assert _config_diff(ours, AutoConfig.from_pretrained(SMOL.parent, **_gguf_kw(SMOL))) == {}
    assert (ours.num_attention_heads, ours.num_key_value_heads, ours.head_dim, ours.vocab_size) == (9, 3, 64, 49152)
    assert ours.tie_word_embeddings and ours.rope_parameters == {"rope_theta": 100000.0, "rope_type": "default"}


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_open_gguf_reads_what_gguf_reader_reads(reader):
    from gguf import GGUFReader

    plain = GGUFReader(SMOL, mode="r")
    assert list(plain.fields) == list(reader.fields) and reader.data_offset == plain.data_offset
    assert [t.name for t in plain.tensors] == [t.name for t in reader.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(plain.tensors[:5], reader.tensors[:5]))
    assert metadata_value(reader, "tokenizer.ggml.tokens")[:3] == plain.fields["tokenizer.ggml.tokens"].contents()[:3]
    assert str(reader.data.filename) == str(SMOL)          # the memmap again after parsing


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_truncated_header_is_a_value_error(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(SMOL, "rb") as f:
        data = f.read(3_000_000)
    for n in (10, 1000, 1_000_000, 3_000_000):
        cut.write_bytes(data[:n])
        with pytest.raises(ValueError):
            open_gguf(cut)


# -- the tokenizer ----------------------------------------------------------------------------------
def _prose() -> str:
    text = load_text("austen")[:30_000] if austen_available() else load_text("pydoc")[:30_000]
    return text + "\n" + load_text("pydoc")[:10_000] + ODD_TEXT


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_tokenizer_is_the_same_tokenizer(reader, reference_tokenizer):
    ours, ref = gguf_tokenizer(reader), reference_tokenizer
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    assert ours.special_tokens_map == ref.special_tokens_map and ours.all_special_ids == ref.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (1, 2, 2, 0)
    assert ours.chat_template == ref.chat_template and ours.add_bos_token == ref.add_bos_token


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_tokenizer_encodes_and_decodes_prose_identically(reader, reference_tokenizer):
    ours, ref = gguf_tokenizer(reader), reference_tokenizer
    text = _prose()
    ids = ours(text)["input_ids"]
    assert len(text) > 20_000 and ids == ref(text)["input_ids"]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    for piece in (ODD_TEXT, " leading space", "<|im_start|>user\nhi<|im_end|>", "", "   "):
        assert ours(piece)["input_ids"] == ref(piece)["input_ids"], piece
        assert ours.decode(ours(piece)["input_ids"]) == ref.decode(ref(piece)["input_ids"]), piece


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_tokenizer_chat_template_matches(reader, reference_tokenizer):
    ours, ref = gguf_tokenizer(reader), reference_tokenizer
    for prompt in (False, True):
        text = ours.apply_chat_template(MESSAGES, add_generation_prompt=prompt, tokenize=False)
        assert text == ref.apply_chat_template(MESSAGES, add_generation_prompt=prompt, tokenize=False)
        assert ours(text)["input_ids"] == ref(text)["input_ids"]
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_the_built_tokenizer_is_kept_per_file_and_a_write_builds_it_again(tmp_path, monkeypatch):
    """A warm load reads the built tokenizer back from the cache (kept_backend), the same tokenizer as the
    build (its JSON, its settings); the file written again (its mtime moved) builds it anew."""
    import shutil

    import gatherlens.models.gguf.tokenizer as tok

    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "smol.gguf"
    shutil.copyfile(SMOL, path)
    built = tok.kept_backend(open_gguf(path), path)
    builds = []
    real = tok.gguf_backend
    monkeypatch.setattr(tok, "gguf_backend", lambda r: builds.append(1) or real(r))
    kept = tok.kept_backend(open_gguf(path), path)
    assert builds == [] and kept[1] == built[1]
    assert json.loads(kept[0].to_str()) == json.loads(built[0].to_str())
    assert kept[0].encode(ODD_TEXT).ids == built[0].encode(ODD_TEXT).ids
    kept_file = mcache.file_memo(path, tok.TOKENIZER_KEPT)["kept"]
    with open(kept_file, "ab") as f:
        f.write(b" ")  # the kept copy altered: it no longer matches its hash
    tok.kept_backend(open_gguf(path), path)
    assert builds == [1]
    later = os.stat(path).st_mtime_ns + 1_000_000
    os.utime(path, ns=(later, later))
    rebuilt = tok.kept_backend(open_gguf(path), path)
    assert builds == [1, 1] and mcache.file_memo(path, tok.TOKENIZER_KEPT)["kept"] != kept_file  # its own copy
    assert rebuilt[0].encode(ODD_TEXT).ids == built[0].encode(ODD_TEXT).ids
    assert tok.kept_backend(open_gguf(path), None) is not None and builds == [1, 1, 1]  # no path: built, not kept


def test_tokenizer_with_a_split_regex_bos_eos_and_a_user_token(reader, tmp_path):
    """A llama-3 style file: `tokenizer.ggml.pre` "llama-bpe" (its own split regex), BOS and EOS
    added, one USER_DEFINED token: the same tokenizer as transformers' converter builds."""
    import gguf
    from transformers import AutoTokenizer

    types = metadata_value(reader, "tokenizer.ggml.token_type")
    types[20] = 4                                                        # USER_DEFINED
    path = tmp_path / "bpe.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(metadata_value(reader, "tokenizer.ggml.tokens"))
    writer.add_token_merges(metadata_value(reader, "tokenizer.ggml.merges"))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_tensor("unused", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = gguf_tokenizer(open_gguf(path))
    ref = AutoTokenizer.from_pretrained(tmp_path, **_gguf_kw(path))
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    text = ODD_TEXT + ours.convert_ids_to_tokens(20) + " 1234567 x"
    ids = ours(text)["input_ids"]
    assert ids == ref(text)["input_ids"] and ids[0] == 1 and ids[-1] == 2 and 20 in ids
    assert ours.decode(ids) == ref.decode(ids)


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_saved_tokenizer_files_match(reader, reference_tokenizer, tmp_path):
    gguf_tokenizer(reader).save_pretrained(tmp_path / "ours")
    reference_tokenizer.save_pretrained(tmp_path / "ref")
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    ours, ref = (json.loads((tmp_path / d / "tokenizer_config.json").read_text()) for d in ("ours", "ref"))
    loader_only = {"is_local", "local_files_only"}           # how transformers was called, not the tokenizer
    assert ours == {k: v for k, v in ref.items() if k not in loader_only}


# -- the float32 weights ----------------------------------------------------------------------------
def _assert_same_model(ours, ref):
    mine, theirs = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert sorted(mine) == sorted(theirs)
    unequal = [k for k in theirs if mine[k].dtype != theirs[k].dtype or not torch.equal(mine[k], theirs[k])]
    assert unequal == [], unequal[:5]
    buffers, their_buffers = dict(ours.named_buffers()), dict(ref.named_buffers())
    assert sorted(buffers) == sorted(their_buffers)
    assert all(torch.equal(buffers[k], their_buffers[k]) for k in buffers)
    assert _config_diff(ours.config, ref.config) == {}
    assert ours.generation_config.to_dict() == ref.generation_config.to_dict()
    assert not ours.training and all(p.requires_grad for p in mine.values())


def _reference_model(path):
    """What loading.py's conversion was before: transformers' GGUF loader, its GGUF marker dropped."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **_gguf_kw(path))
    model.hf_quantizer.remove_quantization_config(model)
    return model.eval()


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_float_model_is_bit_equal_to_transformers_gguf_loader(reader):
    ours = float_model(reader, gguf_config(reader))
    ref = _reference_model(SMOL)
    _assert_same_model(ours, ref)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight        # tied, as the file has no output.weight
    ids = torch.tensor([[504, 2644, 2643, 335, 260, 1171]])               # (1, 6)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ref(ids).logits)            # (1, 6, 49152)


def test_hf_names_and_row_order():
    assert hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("output.weight") == "lm_head.weight" and hf_name("rope_freqs.weight") is None
    rows = torch.arange(8).view(8, 1)                                    # (2 heads * 4, 1)
    assert unpermute_rows(rows, 2).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def _tiny_gguf(path, *, arch="llama", tied=False, rope_scaling=False, tokenizer_model="gpt2"):
    """A 2-layer Llama GGUF (4 query heads over 2 KV heads) with Q8_0, Q4_1, F16 and F32 tensors."""
    import gguf
    from gguf import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {"block_count": 2, "context_length": 128, "embedding_length": 64, "feed_forward_length": 96,
                       "attention.head_count": 4, "attention.head_count_kv": 2,
                       "rope.dimension_count": 16}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if rope_scaling:
        writer.add_string(f"{arch}.rope.scaling.type", "linear")
        writer.add_float32(f"{arch}.rope.scaling.factor", 4.0)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list([f"t{i}" for i in range(96)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def tensor(name, shape, kind):
        values = rng.standard_normal(shape).astype(np.float32) * 0.1
        if kind in (T.Q8_0, T.Q4_1):
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, values.astype(np.float16 if kind == T.F16 else np.float32))

    tensor("token_embd.weight", (96, 64), T.Q8_0)
    for i in range(2):
        for kind, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                            ("attn_output", (64, 64)), ("ffn_gate", (96, 64)), ("ffn_up", (96, 64))):
            tensor(f"blk.{i}.{kind}.weight", shape, T.Q4_1)
        tensor(f"blk.{i}.ffn_down.weight", (64, 96), T.F16)
        tensor(f"blk.{i}.attn_norm.weight", (64,), T.F32)
        tensor(f"blk.{i}.ffn_norm.weight", (64,), T.F32)
    tensor("output_norm.weight", (64,), T.F32)
    if not tied:
        tensor("output.weight", (96, 64), T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tiny_untied_gguf_with_every_kind_of_tensor_matches_transformers(tmp_path):
    from transformers import AutoConfig

    path = _tiny_gguf(tmp_path / "tiny.gguf")
    reader = open_gguf(path, mode="c")
    config = gguf_config(reader)
    assert not config.tie_word_embeddings and config.vocab_size == 96
    assert _config_diff(config, AutoConfig.from_pretrained(tmp_path, **_gguf_kw(path))) == {}
    ours = float_model(reader, config)
    ref = _reference_model(path)
    _assert_same_model(ours, ref)
    assert ours.lm_head.weight is not ours.model.embed_tokens.weight


def test_rope_scaling_and_unknown_files(tmp_path):
    config = gguf_config(open_gguf(_tiny_gguf(tmp_path / "scaled.gguf", rope_scaling=True)))
    assert config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}
    other = open_gguf(_tiny_gguf(tmp_path / "other.gguf", arch="gpt2"))
    assert gguf_config(other) is None                                     # transformers reads it instead
    sentencepiece = open_gguf(_tiny_gguf(tmp_path / "spm.gguf", tokenizer_model="llama"))
    assert gguf_tokenizer(sentencepiece) is None


def test_open_gguf_keeps_the_last_file_only_while_its_header_is_unchanged(tmp_path):
    path = _tiny_gguf(tmp_path / "kept.gguf")
    first = open_gguf(path, mode="c")
    assert open_gguf(path, mode="c") is first                            # one parse for config, then blocks
    stat = path.stat()
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len(b"llama.block_count") + 4  # the uint32 after its type
    data[at] = 3
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))             # an edit in place, mtime kept
    again = open_gguf(path, mode="c")
    assert again is not first and metadata_value(again, "llama.block_count") == 3


# -- the load paths ---------------------------------------------------------------------------------
@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_quantized_load_ignores_a_stale_cached_config(tmp_path, monkeypatch):
    """Case G: a cached config.json edited in place (heads 9 -> 8, mtime kept) once made
    `generate --quantized` print garbage; the quantized path now reads the GGUF itself."""
    built = cache_root() / "native"                                      # the kernels already built, not rebuilt
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    if built.is_dir():
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "native").symlink_to(built, target_is_directory=True)
    folder = mcache.entry_dir("smollm2", mcache.file_sha256(SMOL))
    folder.mkdir(parents=True)
    config = gguf_config(open_gguf(SMOL))
    config.num_attention_heads = 8
    config.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    lm = load("smollm2", quantized=True)
    assert lm.config.num_attention_heads == 9 and lm.info["config_from"] == "gguf"
    out = lm.model.generate(lm.encode("The capital of France is"), max_new_tokens=4, do_sample=False)  # (1, S+4)
    assert "Paris" in lm.tokenizer.decode(out[0, -4:])


@pytest.mark.slow  # the real model's file (and transformers' own GGUF reader)
def test_float_load_converts_without_transformers_gguf_loader(tmp_path, monkeypatch):
    import transformers

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.AutoConfig):
        monkeypatch.setattr(auto, "from_pretrained", lambda *a, **k: pytest.fail("transformers' loader was called"))
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    lm = load("smollm2", use_cache_dir=False)
    assert lm.config.num_attention_heads == 9 and lm.model.dtype == torch.float32
    assert lm.encode("The cat").tolist() == [[504, 2644]]
