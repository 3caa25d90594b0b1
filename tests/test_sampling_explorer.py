"""Issue 39 item 2 without a browser, on a tiny random hybrid Gemma 3 with a plain chat template: the sampling
picture is the sampler's own record (the same token as ops/sampling with the same seed), GET /api/sample moves
with its settings and refuses bad ones, GET /api/chat streams each token with the candidates it was drawn from
(the chosen one is the token) and the pages it read; a model without a chat template gets no chat."""
import json

import pytest
import torch

from gatherlens.ops.sampling import sample
from gatherlens.report.collect import collect
from tiny_models import make_tiny_hybrid, make_tiny_llama

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.serve import ServeSettings, create_app  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hybrid(tmp_path_factory.mktemp("m") / "tiny-hybrid"))


@pytest.fixture(scope="module")
def client(model_dir):
    with TestClient(create_app(ServeSettings(model=model_dir, text=TEXT)), base_url="http://127.0.0.1") as c:
        yield c


def test_the_picture_is_the_samplers_own_draw(model_dir):
    from gatherlens.models import load
    from gatherlens.render.sampling import sampling_svg
    from gatherlens.report.sampling import OFFLINE, sample_view, shown_ids

    lm = load(model_dir)
    story = collect(lm, TEXT, top_k=3)
    rec, words = sample_view(story.tensors, OFFLINE, lm.tokenizer)
    token = sample(story.tensors.logits, OFFLINE, list(story.ids), torch.Generator().manual_seed(0))
    assert rec.token == token and [c.stage for c in rec.cuts] == ["top_k", "top_p", "min_p"]
    assert torch.equal(rec.logits.float(), story.tensors.logits)            # the run's own last logits row
    for lang in ("en", "zh"):
        svg = sampling_svg(rec, words, lang, shown_ids(rec))
        assert f"{rec.token} " in svg and ("top-k: 40" in svg or "top-k：40" in svg)
    from gatherlens.report.build import build_report

    assert "08-sampling" in [f.name for f in build_report(story).figures]


def test_sample_api_follows_its_settings_and_refuses_bad_ones(client):
    base = {"text": TEXT, "k": 3}
    one = client.get("/api/sample", params={**base, "top_k": 1}).json()
    assert one["kept"] == 1 and one["cuts"]["top_k"] == 1 and one["candidates"][0]["chosen"]   # top-1: the argmax
    a = client.get("/api/sample", params={**base, "seed": 5}).json()
    assert a == client.get("/api/sample", params={**base, "seed": 5}).json() and a["cached"]    # same seed, same draw
    greedy = client.get("/api/sample", params={**base, "temperature": 0}).json()
    assert greedy["uniform"] is None and greedy["token"] == one["token"]
    for bad, word in (({"temperature": "hot"}, "temperature = 'hot' is not a number"),
                      ({"top_p": "1.5"}, "top_p = 1.5 is outside the valid range [0, 1]"),
                      ({"top_k": "-1"}, "top_k = -1 is outside")):
        r = client.get("/api/sample", params={**base, **bad})
        assert r.status_code == 400 and word in r.json()["error"], r.text


def _events(text: str) -> list[tuple[str, dict]]:
    out, kind = [], None
    for line in text.splitlines():
        if line.startswith("event:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and kind:
            out.append((kind, json.loads(line.split(":", 1)[1])))
    return out


def test_chat_streams_each_token_with_its_candidates_and_pages(client):
    messages = json.dumps([{"role": "user", "content": "hello there"}])
    r = client.get("/api/chat", params={"messages": messages, "max_new": 4, "temperature": 0.8, "seed": 3})
    events = _events(r.text)
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("step") == 3, kinds
    for kind, data in events[:-1]:
        chosen = [c for c in data["candidates"] if c["chosen"]]
        assert chosen and chosen[0]["id"] == data["token_id"] and data["kept"] >= 1 and 0 <= data["uniform"] < 1
    assert events[0][1]["kinds"][0] == {"kind": "sliding", "window": 8} and events[1][1]["layers"][1]   # global: pages
    done = events[-1][1]
    assert done["tokens"] == 4 and done["text"] == "".join(d["token"] for _, d in events[:-1])
    bad = client.get("/api/chat", params={"messages": "[{'role': 1}]"})
    assert bad.status_code == 400 and "messages is not JSON" in bad.json()["error"]


def test_a_model_without_a_chat_template_gets_no_chat(tmp_path):
    with TestClient(create_app(ServeSettings(model=str(make_tiny_llama(tmp_path / "llama")), text=TEXT)),
                    base_url="http://127.0.0.1") as c:
        page = c.get("/").text
        assert 'id="gl-chat"' not in page and "no chat template" in page
        r = c.get("/api/chat", params={"messages": json.dumps([{"role": "user", "content": "hi"}])})
        assert "failure" in r.text and "no chat template" in r.text
