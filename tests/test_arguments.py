"""One policy for layer/head/query indices, and headings that say what ran.

Policy: negative layer, head and query indices count from the end, everywhere (explain, the
report's collect, eval-sparse's --layer/--head), and every range in an error is stated that way:
[-n, n). A k larger than the number of keys runs dense, and the story says the k it ran with.
"""
import pytest
import torch
from click.testing import CliRunner

import fault_worker  # the tiny Llama (2 query heads, 1 layer) and MiniLM's tokenizer

from gatherlens.cli import main
from gatherlens.errors import GatherIndexError
from gatherlens.models import LoadedModel
from gatherlens.report.collect import collect

TEXT = "The cat sat on the mat"


@pytest.fixture(scope="module")
def tiny():
    model, tok = fault_worker.tiny_model(), fault_worker.tokenizer()
    return LoadedModel("tiny", model, tok, source=None)


@pytest.mark.parametrize("kw,message", [
    (dict(layer=-2), r"layer -2 is outside the model's layers \[-1, 1\)"),
    (dict(head=-3), r"head -3 is outside the query heads \[-2, 2\)"),
    (dict(query=-9), r"query -9 is outside the token positions \[-8, 8\)"),
    (dict(head=10 ** 4000), r"head '1000000000000000000000000000000000000000…' \(4,001 characters\)"),
])
def test_out_of_range_indices_state_the_range_with_negatives(tiny, kw, message):
    with pytest.raises(GatherIndexError, match=message):
        collect(tiny, TEXT, **kw)


def test_negative_indices_count_from_the_end(tiny):
    story = collect(tiny, TEXT, layer=-1, head=-1, query=-2)
    att = story.attention
    assert (att.layer, att.head, att.query) == (0, 1, len(story.ids) - 2)
    assert torch.equal(att.indices, collect(tiny, TEXT, layer=0, head=1, query=6).attention.indices)


def test_k_larger_than_the_keys_is_stated_as_run(tiny):
    story = collect(tiny, TEXT, top_k=100_000)
    S = len(story.ids)
    assert story.top_k == S and story.attention.top_k == S  # every allowed key: the dense run


def test_headings_of_the_cli_say_the_k_that_ran(tiny, tmp_path, monkeypatch):
    import gatherlens.models

    monkeypatch.setattr(gatherlens.models, "load", lambda *a, **k: tiny)
    result = CliRunner().invoke(main, ["explain", TEXT, "--top-k", "100000", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "top-8 keys of query 7" in result.output and "100000" not in result.output.replace(
        "--top-k 100000", "")
    page = (tmp_path / "r" / "index.html").read_text()
    assert "100000" not in page.replace("--top-k 100000", "") and "k = 8" in page  # but the command as typed
    assert '"top_k": 8' in (tmp_path / "r" / "story.json").read_text()
