"""The records render draws the `explain` report from: built in report/ from a story of a tiny
random Llama (4 query heads over 2 KV heads), they carry the story's numbers; the summary and the
report's own figures are drawn from them alone and speak the chosen language."""
import dataclasses
import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from rich.console import Console

from gatherlens.errors import GatherValueError
from gatherlens.render.report_figures import heads_svg, scores_svg
from gatherlens.render.summary import print_summary
from gatherlens.report.collect import collect
from gatherlens.report.records import explain_summary, score_grid
from gatherlens.trace.story_records import (Candidate, ExplainSummary, GatherLine, HeadMap, KeyRow,
                                            LookupLine, NextToken, TokenRow, TopKeys)
from tiny_models import make_tiny_llama

TEXT = "The cat sat on the mat because it was"
PATHS = [Path("rep/01-embedding.svg"), Path("rep/story.json"), Path("rep/index.html")]
HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    from gatherlens.models import load

    tiny = load(str(make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")))
    return collect(tiny, TEXT, top_k=2, layer=1, head=3)


def _printed(summary, lang: str) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    print_summary(summary, PATHS, console, lang)
    return console.export_text()


def test_summary_record_carries_the_storys_numbers(story):
    s, att = explain_summary(story), story.attention
    word = story.embeddings[0]
    assert [r.id for r in s.tokens] == story.ids and [r.token for r in s.tokens] == story.shown_tokens
    first = word.record.output.reshape(-1, word.table_shape[1])[:, :4]                  # (S, 4)
    assert torch.equal(torch.tensor([r.values for r in s.tokens]), first)
    assert (s.table, s.width) == ("W_tok", word.table_shape[1])
    assert s.lookups[0].table_shape == word.table_shape and list(s.lookups[0].ids) == word.ids
    qrow = att.query - (len(story.ids) - att.scores.shape[0])
    kept = [j for j in att.indices[qrow].tolist() if j >= 0]
    assert [r.key for r in s.keys.rows] == kept and s.keys.mass == att.mass
    assert [r.score for r in s.keys.rows] == [float(att.scores[qrow, j]) for j in kept]
    assert [c.id for c in s.next_token.dense] == [t[0] for t in story.prediction.dense_top]
    assert sum(g.count for g in s.gathers) == s.events == story.events
    assert s.heads is story.heads


def test_summary_speaks_the_chosen_language(story):
    s = explain_summary(story)
    en, zh = _printed(s, "en"), _printed(s, "zh")
    assert not HAN.search(en.replace(story.text, ""))
    for part in ("1-2. token → id → 嵌入表的行", "嵌入 gather model.embed_tokens", "分组查询",
                 "kv0 ← q0 q1", "的 top-2 个键", "第 1 层，头 3", "之后的下一个 token",
                 "前向传播中的每一次 gather", "查表", "合计", "报告：rep/index.html"):
        assert part in zh, part
    with pytest.raises(GatherValueError, match="lang must be one of"):
        print_summary(s, PATHS, Console(file=io.StringIO()), "fr")


def test_summary_is_drawn_from_a_record_alone():
    """A record written by hand (no story, no model) prints every section; an encoder's has no
    prediction."""
    keys = TopKeys(layer=0, head=1, kv_head=0, query=2, query_token="␣sat", top_k=1,
                   rows=(KeyRow(key=0, token="The", score=1.5, weight=1.0, dense=0.75),), mass=0.75)
    s = ExplainSummary(
        model_name="toy", model_class="ToyLM", text="The cat sat", table="W_tok", width=8,
        tokens=(TokenRow("The", 5, (0.5, -0.25)), TokenRow("␣cat", 7, (1.0, 0.0)),
                TokenRow("␣sat", 9, (0.0, 2.0))),
        lookups=(LookupLine("emb", (10, 8), (5, 7, 9), 8 * 4),), heads=HeadMap(2, 2), keys=keys,
        next_token=NextToken(after="␣sat", top_k=1, top=(Candidate(3, "on", 0.5),),
                             dense=(Candidate(4, "in", 0.25),)),
        gathers=(GatherLine("embedding", "", 1, 96),), events=1, bytes_read=96)
    out = _printed(s, "en")
    for part in ("toy (ToyLM)", "W_tok[id] (first 2 of 8)", "+0.500 -0.250", "table (10, 8)",
                 "3 distinct rows read", "multi-head: 2 query heads over 2 KV heads",
                 "kv0 ← q0 | kv1 ← q1", "top-1 keys of query 2 (␣sat)", "1.500", "75%", "on (3)",
                 "50.0%", "in (4)", "(top)", "(+ 2 files: 01-embedding.svg, story.json)"):
        assert part in out, part
    encoder = _printed(dataclasses.replace(s, next_token=None), "en")
    assert "toy is an encoder" in encoder and "on (3)" not in encoder


def test_report_figures_speak_the_chosen_language(story):
    grid = score_grid(story.attention, story.shown_tokens)
    Q = grid.scores.shape[0]
    for lang, title, heads in (("en", "scores · layer 1, head 3 · top-2", "4 query heads → 2"),
                               ("zh", "分数 · 第 1 层，头 3 · top-2", "4 个查询头 → 2 个键/值头")):
        svg, hsvg = scores_svg(grid, lang), heads_svg(story.heads, 3, lang)
        words = "".join(ET.fromstring(svg).itertext())
        assert title in words and heads in "".join(ET.fromstring(hsvg).itertext())
        assert bool(HAN.search(words.replace("␣", ""))) == (lang == "zh")
    assert svg.count("（保留）") == sum(min(2, i + 1) for i in range(Q))        # kept cells, in zh
    assert grid.labels == tuple(story.shown_tokens) and torch.equal(grid.scores, story.attention.scores)
