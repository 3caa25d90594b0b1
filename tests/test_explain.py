"""`gatherlens explain` on a tiny random Llama (grouped-query attention) built here: the story's
numbers match the model, the report is one offline page plus an SVG per figure, token strings
stay text, and a user's folder is never overwritten without --force. Real models: see
test_explain_models.py."""
import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch
from click.testing import CliRunner

from gatherlens.commands.explain import explain
from gatherlens.errors import GatherIndexError, GatherValueError
from gatherlens.report.build import build_report, write_report
from gatherlens.report.collect import HeadMap, collect
from gatherlens.report.records import score_grid
from gatherlens.render.report_figures import heads_svg, scores_svg
from tiny_models import make_tiny_llama

TEXT = "The cat sat on the mat because it was"
EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A random 2-layer Llama (4 query heads over 2 KV heads) with MiniLM's tokenizer, on disk."""
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    from gatherlens.models import load

    return load(str(tiny_dir))


@pytest.fixture(scope="module")
def story(tiny):
    return collect(tiny, TEXT, top_k=2, layer=1, head=3)


# -- the story's numbers are the model's -----------------------------------------------------
def test_tokens_and_embedding_gather_are_the_models(tiny, story):
    ids = tiny.encode(TEXT)                                                   # (1, S)
    assert story.ids == ids[0].tolist()
    assert story.tokens == tiny.token_strings(ids[0])
    word = story.embeddings[0]
    assert word.kind == "word" and word.module == "model.embed_tokens"
    assert word.table_shape == tuple(tiny.model.get_input_embeddings().weight.shape)
    with torch.no_grad():
        expected = tiny.model.get_input_embeddings()(ids)                     # (1, S, d)
    assert torch.equal(word.record.output, expected)
    assert len(story.embeddings) == 1 and story.rope  # Llama: positions by rotation only


def test_heads_map_groups_query_heads_onto_kv_heads(story):
    assert (story.heads.q_heads, story.heads.kv_heads) == (4, 2)
    assert story.heads.groups == [[0, 1], [2, 3]]
    assert story.attention.kv_head == 1  # head 3 reads KV head 3 // 2
    assert HeadMap(9, 3).groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_scores_and_selection_agree_and_value_gather_is_the_output(story):
    a = story.attention
    Q, L = a.scores.shape
    assert (a.layer, a.head, a.query, a.top_k) == (1, 3, len(story.ids) - 1, 2)
    assert torch.equal(a.allowed, torch.ones(Q, L, dtype=torch.bool).tril())  # causal
    for i in range(Q):
        kept = [j for j in a.indices[i].tolist() if j >= 0]
        assert len(kept) == min(2, i + 1)
        best = a.scores[i].topk(len(kept)).values                             # recomputed
        assert torch.allclose(a.scores[i, kept], best, atol=1e-5)
        assert all(bool(a.allowed[i, j]) for j in kept)
    # the gathered value rows, weighted, are exactly what the model's attention returned
    assert torch.allclose(a.output, a.model_output, atol=1e-5)
    assert torch.allclose(a.weights.sum(-1), torch.ones(Q), atol=1e-5)
    assert 0.0 < a.mass <= 1.0 + 1e-6


def test_prediction_is_the_top5_of_the_last_logits_row(tiny, story):
    from gatherlens.models import use_dense_attention

    use_dense_attention(tiny.model)
    with torch.no_grad():
        logits = tiny.model(tiny.encode(TEXT)).logits[0, -1]                # (V,)
    assert [t[0] for t in story.prediction.dense_top] == logits.topk(5).indices.tolist()
    top_ids = [t[0] for t in story.prediction.top]
    assert story.prediction.record.index[0].tolist() == top_ids
    probs = [t[3] for t in story.prediction.top]
    assert probs == sorted(probs, reverse=True)


def test_gather_table_counts_every_traced_call(story):
    assert sum(r["count"] for r in story.gathers) == story.events
    ops = {(r["op"], r["module"]) for r in story.gathers}
    assert ("embedding", "model.embed_tokens") in ops
    attn = [r for r in story.gathers if r["op"] == "topk_attention"]
    assert attn and attn[0]["count"] == 2 and attn[0]["module"] == "model.layers.*.self_attn"
    assert story.bytes_read == sum(r["bytes_read"] for r in story.gathers) > 0


@pytest.mark.parametrize("kw, message", [
    (dict(layer=2), r"layer 2 is outside the model's layers \[-2, 2\)"),
    (dict(head=4), r"head 4 is outside the query heads \[-4, 4\)"),
    (dict(query=99), r"query 99 is outside the token positions"),
], ids=["layer", "head", "query"])
def test_bad_layer_head_query_name_the_valid_range(tiny, kw, message):
    with pytest.raises(GatherIndexError, match=message):
        collect(tiny, TEXT, top_k=2, **kw)


def test_empty_text_and_bad_top_k_are_refused(tiny):
    with pytest.raises(GatherValueError, match="non-empty"):
        collect(tiny, "   ")
    with pytest.raises(GatherValueError, match="top_k 0"):
        collect(tiny, TEXT, top_k=0)


# -- the report -----------------------------------------------------------------------------
def _external_refs(html: str) -> list[str]:
    """src/href attributes or CSS url() that would make the browser fetch something."""
    refs = re.findall(r"""(?<![\w-])(?:src|href)\s*=\s*["']([^"'#][^"']*)["']""", html)
    refs += re.findall(r"url\(([^)]*)\)", html)
    return [r for r in refs if not r.startswith("data:")]


def test_report_writes_page_and_one_parseable_svg_per_figure(story, tmp_path):
    paths = write_report(story, tmp_path / "rep", lang="en")
    names = sorted(p.name for p in paths)
    assert names == sorted(["00-model-map.svg", "01-embedding.svg", "02-rope.svg", "02-heads-gallery.svg", "03-heads.svg",
                            "04-scores.svg", "05-score-gather.svg", "06-value-gather.svg", "06-compare.svg",
                            "07-next-token.svg", "08-sampling.svg", "story.json", "index.html"])
    for p in paths:
        if p.suffix == ".svg":
            root = ET.fromstring(p.read_text(encoding="utf-8"))
            assert root.tag == "{http://www.w3.org/2000/svg}svg"
    html = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert _external_refs(html) == []
    assert "<link" not in html and "@import" not in html
    for section in ("tokens", "embedding", "heads", "scores", "values", "prediction", "gathers"):
        assert f'<section id="{section}">' in html
    for p in paths:  # every figure is on the page too
        if p.suffix == ".svg":
            assert f"fig-{p.stem}" in html
    data = json.loads((tmp_path / "rep" / "story.json").read_text(encoding="utf-8"))
    assert data["ids"] == story.ids and data["heads"]["groups"] == [[0, 1], [2, 3]]
    assert data["attention"]["indices"] == story.attention.indices.tolist()


def test_report_in_chinese(story):
    html = build_report(story, lang="zh").html
    assert '<html lang="zh-CN">' in html
    assert "嵌入查找" in html and "分组查询注意力" in html


def test_token_markup_stays_text(tiny, tmp_path):
    s = collect(tiny, f"hi {EVIL} there", top_k=2)
    html = build_report(s).html
    assert EVIL not in html  # the user's text and every token string are escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    n_fragments = html.count('<div class="gatherlens">')
    # the hover scripts of record figures, the explorer's data block and its one script
    assert html.count("<script") == n_fragments + 2
    assert html.count('<script type="application/json" id="gl-data">') == 1
    data = html.split('id="gl-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and "\\u003c" in data  # the "<" token in the data block stays JSON text
    # the report's own SVG templates, fed the raw string as a token label
    a = s.attention
    labels = [EVIL] + s.shown_tokens[1:]
    for svg in (scores_svg(score_grid(a, labels)), heads_svg(s.heads, 0)):
        root = ET.fromstring(svg)
        assert not root.findall(".//{http://www.w3.org/2000/svg}script")
    assert EVIL in "".join(ET.fromstring(scores_svg(score_grid(a, labels))).itertext())


def test_non_empty_folder_is_refused_and_force_keeps_user_files(story, tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    mine = out / "notes.txt"
    mine.write_text("mine")
    with pytest.raises(GatherValueError, match=r"not empty.*--force"):
        write_report(story, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    stale = out / "02-position.svg"  # left by an earlier report of another model
    stale.write_text("<svg/>")
    write_report(story, out, force=True)
    assert mine.read_text() == "mine" and not stale.exists()
    assert (out / "index.html").is_file()
    with pytest.raises(GatherValueError, match="is a file"):
        write_report(story, mine, force=True)


# -- the command ----------------------------------------------------------------------------
def test_cli_writes_report_and_prints_summary(tiny_dir, tmp_path):
    out = tmp_path / "report"
    res = CliRunner().invoke(explain, [TEXT, "--model", str(tiny_dir), "--top-k", "2",
                                       "--layer", "-1", "--head", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = res.stdout
    for part in ("tokens → ids", "embedding gather model.embed_tokens", "grouped-query",
                 "kv0 ← q0 q1", "top-2 keys of query", "layer 1, head 1", "next token",
                 "every gather of the forward pass", "topk_attention", "index.html"):
        assert part in text, part
    assert (out / "index.html").is_file() and (out / "04-scores.svg").is_file()
    assert "gatherlens explain" in (out / "index.html").read_text(encoding="utf-8")

    again = CliRunner().invoke(explain, [TEXT, "--model", str(tiny_dir), "--out", str(out)])
    assert again.exit_code == 1 and "not empty" in again.output and "--force" in again.output

    forced = CliRunner().invoke(explain, ["short", "--model", str(tiny_dir), "--out", str(out),
                                          "--force", "--lang", "zh", "--top-k", "1"])
    assert forced.exit_code == 0, forced.output
    assert '<html lang="zh-CN">' in (out / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("args, message", [
    (["--layer", "7"], "layer 7 is outside"),
    (["--top-k", "0"], "--top-k = 0 is outside the valid range [1, inf)"),
    (["--model", "no-such-model"], "neither a known name"),
    (["--lang", "fr"], "'fr' is not one of"),
    (["--head", "-9"], "head -9 is outside the query heads [-4, 4)"),
], ids=["layer", "top-k", "model", "lang", "head"])
def test_cli_bad_options_fail_clearly(tiny_dir, tmp_path, args, message):
    argv = [TEXT, "--model", str(tiny_dir), "--out", str(tmp_path / "r")] + args
    res = CliRunner().invoke(explain, argv)
    assert res.exit_code in (1, 2)
    assert message in res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)


def test_long_text_draws_and_too_long_text_is_refused(tiny, tmp_path):
    from gatherlens.report.collect import MAX_TOKENS
    from gatherlens.report.defaults import LIVE_MAX_TOKENS

    long = " ".join(["gather picks rows"] * 20)                              # ~60 tokens
    s = collect(tiny, long, top_k=3)
    assert 40 < len(s.ids) <= MAX_TOKENS
    report = build_report(s)
    for fig in report.figures:
        ET.fromstring(fig.svg)
    with pytest.raises(GatherValueError, match=rf"keep it within \[1, {LIVE_MAX_TOKENS}\] tokens.*generate"):
        collect(tiny, " ".join(["word"] * (LIVE_MAX_TOKENS + 5)))


def test_a_text_past_the_full_grid_limit_draws_a_window_offline(tiny):
    """Past MAX_TOKENS (up to LIVE_MAX_TOKENS) the offline page keeps the 16 query rows around the drawn
    query for every layer and head, and the score grid file is that window, not a 300 x 300 grid."""
    import json

    from gatherlens.report.collect import MAX_TOKENS
    from gatherlens.report.defaults import LIVE_MAX_TOKENS

    from gatherlens.report.window import WINDOW_KEYS, WINDOW_ROWS

    s = collect(tiny, " ".join(["gather picks rows"] * 100), top_k=3, query=200)
    S = len(s.ids)
    assert MAX_TOKENS < S <= LIVE_MAX_TOKENS and s.explore is None
    report = build_report(s)
    data = json.loads(report.html.split('id="gl-data">', 1)[1].split("</script>", 1)[0])["explore"]
    assert data["rows"] == [192, 208] and data["Q"] == S and data["keys"] == [208 - WINDOW_KEYS, 208]
    assert "remote" not in data and "the query rows 192–207" in report.html
    grid = next(f for f in report.figures if f.name == "04-scores")
    root = ET.fromstring(grid.svg)
    cells = root.findall(".//{http://www.w3.org/2000/svg}g[@class='gl-score']") + \
        root.findall(".//{http://www.w3.org/2000/svg}g[@class='gl-score gl-kept']")
    assert len(cells) == WINDOW_ROWS * WINDOW_KEYS
    assert len(report.html) < 2_000_000


def test_report_files_follow_the_umask(story, tmp_path):
    import os

    old = os.umask(0o022)
    try:
        paths = write_report(story, tmp_path / "rep")
    finally:
        os.umask(old)
    assert {oct(p.stat().st_mode & 0o777) for p in paths} == {oct(0o644)}
    assert not [p for p in (tmp_path / "rep").iterdir() if p.name.endswith(".tmp")]


def test_cli_empty_text_fails_before_loading(tmp_path):
    res = CliRunner().invoke(explain, ["  ", "--model", "no-such-model", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "TEXT is empty" in res.output  # not the model error: no load


def test_cli_text_past_the_limit_fails_before_loading_and_names_generate(tmp_path):
    res = CliRunner().invoke(explain, ["word " * 4000, "--model", "no-such-model", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "20,000 characters" in res.output and "gatherlens generate" in res.output


def test_byte_tokens_are_shown_as_bytes_not_replacement_chars():
    from gatherlens.report.collect import token_texts

    class ByteBPE:  # GPT-2 style: 猫 is split into the bytes E7 8C | AB
        pieces = {0: "çĮ", 1: "«", 2: "Ġcat"}
        texts = {0: "\ufffd", 1: "\ufffd", 2: " cat"}

        def decode(self, ids):
            return self.texts[ids[0]]

        def convert_ids_to_tokens(self, i):
            return self.pieces[i]

    assert token_texts(ByteBPE(), [0, 1, 2]) == ["<0xE7><0x8C>", "<0xAB>", " cat"]
