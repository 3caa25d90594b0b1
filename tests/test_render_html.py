"""HTML: one self-contained page, no network, labels escaped, a notebook fragment."""
import re
from html.parser import HTMLParser

import torch

from gatherlens.render.mistakes import mistakes_html
from gatherlens.trace import record_embedding, record_gather

EVIL = "<script>alert(1)</script>"


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)


def _parse(html):
    p = Tags()
    p.feed(html)
    return p


def test_page_is_self_contained():
    html = record_embedding(torch.tensor([[3, 1]]), torch.randn(5, 4), labels=["a", "b"]).to_html()
    p = _parse(html)
    assert p.tags.count("script") == 1 and "link" not in p.tags and "img" not in p.tags
    for name, value in p.attrs:
        assert name not in ("src", "href"), (name, value)
    urls = re.findall(r"https?://[^\s\"'<>]+", html)
    assert set(urls) <= {"http://www.w3.org/2000/svg"}
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert html.startswith("<!DOCTYPE html>")


def test_script_label_is_text_in_html():
    html = record_embedding(torch.tensor([0, 1]), torch.randn(2, 2), labels=[EVIL, "ok"]).to_html()
    assert _parse(html).tags.count("script") == 1  # ours only
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") == 1


def test_notebook_fragment():
    rec = record_gather(torch.arange(6.0).view(2, 3), 1, torch.tensor([[2], [0]]))
    frag = rec._repr_html_()
    assert frag.startswith("<style>") and 'class="gatherlens"' in frag and "<script>" in frag
    assert "<html" not in frag
    assert "currentScript" in frag  # scoped to its own picture: several can share a notebook


def test_zh_page_and_mistakes_page():
    rec = record_gather(torch.arange(6.0).view(2, 3), 1, torch.tensor([[2], [0]]), lang="zh")
    html = rec.to_html()
    assert '<html lang="zh-CN">' in html and "鼠标" in html
    page = mistakes_html("zh")
    assert "RuntimeError" in page and "W.gather(0, ids)" in page and page.count("<script") == 1
