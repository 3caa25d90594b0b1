"""Quality of sparse decoding (perplexity / recall / cosine / passkey) and `eval-sparse`."""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gatherlens.errors import GatherValueError

pytest.importorskip("transformers")

from gatherlens.commands.evaluate_sparse import evaluate_sparse  # noqa: E402
from gatherlens.eval.passkey import greedy_decode, passkey_prompt, passkey_trials  # noqa: E402
from gatherlens.eval.sparse_quality import SparseSetup, evaluate_sparse_quality, prefill  # noqa: E402


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


class CharTokenizer:
    """Enough of a tokenizer for the passkey prompt: one id per printable ASCII character (< 101)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [95 if c == "\n" else ord(c) - 32 for c in text]}

    def decode(self, ids):
        return "".join("\n" if i == 95 else chr(i + 32) if i < 95 else "?" for i in ids)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1)


def test_quality_full_budget_is_dense_and_small_budget_is_not(model):
    ids = torch.randint(1, 101, (1, 120))
    r = evaluate_sparse_quality(model, ids, budgets=(16, 4096), page_size=8, decode_tokens=12)
    dense, small, full = r.rows
    assert [x.setting for x in r.rows] == ["dense", "budget=16", "budget=4096"]
    assert dense.tokens == small.tokens == 12 and dense.recall is None
    assert full.ppl_ratio == pytest.approx(1.0, abs=1e-5)
    assert full.recall == pytest.approx(1.0, abs=1e-5) and full.cosine == pytest.approx(1.0, abs=1e-5)
    assert small.recall < 0.999 and small.cosine < 0.9999 and abs(small.ppl_ratio - 1) > 1e-6
    assert len(small.per_layer["recall"]) == 2
    assert model.config._attn_implementation == "sdpa"  # left dense


def test_agreement_and_pages_beside_perplexity(model):
    """top-1 agreement (teacher-forced), greedy tokens before the first divergence with dense's logit gap
    there, pages per step; recall=False measures the same without observers."""
    ids = torch.randint(1, 101, (1, 120))
    setups = [SparseSetup(4096, page_size=8, label="full"), SparseSetup(16, page_size=8, label="small"),
              SparseSetup("auto", page_size=8, mass=0.5, min_pages=2, max_pages=4, label="auto")]
    for recall in (True, False):
        r = evaluate_sparse_quality(model, ids, setups=setups, page_size=8, decode_tokens=12, greedy=6, recall=recall)
        dense, full, small, auto = r.rows
        assert dense.top1_agree is None and full.top1_agree == 1.0 and full.greedy_prefix == 6
        assert full.greedy_margin is None and full.pages_mean is None  # never diverged; dense in place
        assert 0 <= small.top1_agree <= 1 and 0 <= small.greedy_prefix <= 6
        assert small.greedy_prefix == 6 or small.greedy_margin >= 0  # dense's own token leads at its divergence
        assert small.pages_mean == 2.0 and 2.0 <= auto.pages_mean <= 4.0  # budget 16: 2 pages of 8
        assert (small.recall is not None) == recall
    assert r.meta["share_selection"] is True and r.meta["dense_layers"] == 0  # the setups' own (Quest's here)
    mixed = [SparseSetup(16, page_size=8, share_selection=False, dense_layers=2), SparseSetup(32, page_size=8)]
    meta = evaluate_sparse_quality(model, ids, setups=mixed, page_size=8, decode_tokens=4, recall=False).meta
    assert meta["share_selection"] == meta["dense_layers"] == "per row"  # not the function's own defaults
    one = evaluate_sparse_quality(model, ids, setups=mixed[:1], page_size=8, decode_tokens=4, recall=False).meta
    assert one["share_selection"] is False and one["dense_layers"] == 2


def test_quality_bad_input(model):
    with pytest.raises(GatherValueError, match="decode_tokens"):
        evaluate_sparse_quality(model, torch.randint(1, 101, (1, 10)), budgets=(8,), decode_tokens=10)
    with pytest.raises(GatherValueError, match=r"\(1, S\)"):
        evaluate_sparse_quality(model, torch.randint(1, 101, (2, 10)), budgets=(8,), decode_tokens=2)
    with pytest.raises(GatherValueError, match="budgets"):
        evaluate_sparse_quality(model, torch.randint(1, 101, (1, 10)), budgets=(0,), decode_tokens=2)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_prompt_hides_the_key_at_depth(depth):
    tok = CharTokenizer()
    ids = passkey_prompt(tok, context=2000, depth=depth, key="71432")
    text = tok.decode(ids[0].tolist())
    assert 2000 - 100 <= ids.shape[1] <= 2000
    assert text.count("71432") == 2 and text.endswith("The pass key is")
    where = text.index("71432") / len(text)
    assert abs(where - depth) < 0.1


def test_passkey_prompt_too_short():
    with pytest.raises(GatherValueError, match="too short"):
        passkey_prompt(CharTokenizer(), context=100, depth=0.5, key="12345")
    with pytest.raises(GatherValueError, match="depth"):
        passkey_prompt(CharTokenizer(), context=2000, depth=1.5, key="12345")


def test_passkey_trials_full_budget_answers_like_dense(model):
    res = passkey_trials(model, CharTokenizer(), context=600, trials=2, budgets=(16, 4096), page_size=8,
                         new_tokens=4)
    assert [(r.trial, r.setting) for r in res] == [(t, s) for t in (0, 1) for s in ("dense", "budget=16", "budget=4096")]
    for t in (0, 1):
        dense, full = res[3 * t], res[3 * t + 2]
        assert dense.answer == full.answer and dense.key == full.key
    assert res[0].depth == 0.25 and res[3].depth == 0.75


def test_greedy_decode_continues_the_prefilled_cache(model):
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    ids = torch.randint(1, 101, (1, 30))
    use_sparse_decoding(model, budget=None, page_size=8)
    cache, _ = prefill(model, ids[:, :-1], 8)
    made = greedy_decode(model, cache, ids[:, -1:], 5)
    use_dense_decoding(model)
    ref = model.generate(ids, max_new_tokens=5, do_sample=False)[0, 30:].tolist()
    assert made == ref


@pytest.mark.parametrize("args, message", [
    (["--budgets", "a,b"], "must be comma-separated"),
    (["--budgets", "0"], "0 is outside the valid range [1, inf)"),
    (["--context", "256", "--decode-tokens", "256"], "smaller than --context"),
    (["--decode-tokens", "0", "--passkey-trials", "0"], "nothing to measure"),
    (["--json", "out.txt"], "must end in .json"),
], ids=["budgets-not-ints", "budget-zero", "decode-too-long", "nothing", "json-suffix"])
def test_cli_bad_input(args, message):
    result = CliRunner().invoke(evaluate_sparse, args)
    assert result.exit_code == 2 and message in result.output


def test_cli_refuses_to_overwrite(tmp_path):
    out = tmp_path / "q.json"
    out.write_text("{}")
    result = CliRunner().invoke(evaluate_sparse, ["--json", str(out)])
    assert result.exit_code == 2 and "--force" in result.output
    assert out.read_text() == "{}"


# -- SmolLM2 (slow) --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    from gatherlens.models import load

    return load("smollm2")


@pytest.mark.slow
def test_smollm2_generate_sparse(smollm2):
    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding

    m, ids = smollm2.model, smollm2.encode("The capital of France is Paris. The capital of Italy is")
    with torch.no_grad():
        dense = m.generate(ids, max_new_tokens=6, do_sample=False)
        use_sparse_decoding(smollm2, budget=1024)
        full = m.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
        use_sparse_decoding(smollm2, budget=8, page_size=4, keep_selection=True)
        small = m.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
        use_dense_decoding(smollm2)
    assert torch.equal(full.sequences, dense)
    assert isinstance(small.cache, SparseKVCache) and small.sequences.shape == dense.shape


@pytest.mark.slow
def test_smollm2_passkey_small_context(smollm2):
    res = passkey_trials(smollm2.model, smollm2.tokenizer, context=512, trials=2, budgets=(256, 1024))
    by = {(r.trial, r.setting): r for r in res}
    for t in (0, 1):
        assert by[(t, "dense")].ok, by[(t, "dense")].answer  # the model can do the task at all
        assert by[(t, "budget=1024")].answer == by[(t, "dense")].answer  # budget >= context is dense
        assert by[(t, "budget=256")].ok, by[(t, "budget=256")].answer  # half the pages still find it


@pytest.mark.slow
def test_smollm2_cli_small(tmp_path):
    out, figs = tmp_path / "q.json", tmp_path / "figs"
    result = CliRunner().invoke(evaluate_sparse, [
        "--context", "384", "--budgets", "64,512", "--decode-tokens", "6", "--passkey-trials", "1",
        "--json", str(out), "--csv", str(tmp_path / "q.csv"), "--pictures", str(figs), "--layer", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    rows = {r["setting"]: r for r in data["rows"]}
    assert set(rows) == {"dense", "budget=64", "budget=512"}
    assert rows["budget=512"]["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert rows["budget=64"]["recall"] < 1.0 and rows["dense"]["passkey_trials"] == 1
    svgs = sorted(p.name for p in figs.glob("*.svg"))
    assert svgs == ["pages_layer3_head0_budget512.svg", "pages_layer3_head0_budget64.svg"]
    assert (figs / "pages_layer3_head0_budget64.html").read_text().lstrip().startswith("<")
