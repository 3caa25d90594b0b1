"""`GET /api/heads` of `gatherlens serve` on a tiny random Llama (2 layers, 4 query heads over 2 KV
heads): the head gallery's numbers as JSON, the same checks and limits as /api/explain, and the
served page with one text box and the gallery (test client style of tests/test_serve_api.py)."""
import pytest

from gatherlens.report.collect import collect
from gatherlens.report.heads import RULES, gallery_data, head_gallery
from tiny_models import make_tiny_llama

pytest.importorskip("httpx")
pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.serve import ServeSettings, create_app  # noqa: E402

TEXT = "The cat sat on the mat because the cat was"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def client(model_dir):
    app = create_app(ServeSettings(model=model_dir, text=TEXT, max_chars=1000, max_tokens=128,
                                   max_target_bytes=16384))      # the limits these tests name
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def test_heads_are_the_gallerys_numbers(client, model_dir):
    from gatherlens.models import load

    r = client.get("/api/heads", params={"text": TEXT, "k": 3})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    body = r.json()
    story = collect(load(model_dir), TEXT, top_k=3)
    want = gallery_data(head_gallery(story))
    assert body["tokens"] == story.tokens and body["text"] == TEXT
    assert (body["layers"], body["heads"], body["top_k"], body["levels"]) == (2, 4, 3, RULES.levels)
    assert len(body["tiles"]) == 8 and body["tiles"] == want["tiles"]
    assert [(t["layer"], t["head"]) for t in body["tiles"]] == [(l, h) for l in range(2) for h in range(4)]
    S = len(story.ids)
    for t in body["tiles"]:
        assert t["tag"] in body["tags"] and 0 < t["kept"] <= 1
        assert len(t["map"]) == min(S, RULES.grid) and all(-1 <= v < RULES.levels for row in t["map"] for v in row)
    assert body["rules"] == {"copying": 0.4, "previous": 0.5, "sink": 0.5, "broad": 0.8, "grid": 16, "rows": 128}
    assert body["names"]["copying"] == "copying (induction)"


def test_heads_dense_run_keeps_everything_and_speaks_chinese(client):
    body = client.get("/api/heads", params={"text": TEXT, "topk": 0, "lang": "zh"}).json()
    assert body["dense_run"] and all(t["kept"] == pytest.approx(1, abs=1e-4) for t in body["tiles"])
    assert body["names"]["sink"] == "首词汇聚"


@pytest.mark.parametrize("params, words", [
    ({"text": "x" * 1001}, ["1,001 characters", "the limit is 1,000"]),
    ({"text": "a " * 140}, ["text has 142 tokens", "within [1, 128] tokens"]),
    ({"text": TEXT, "k": 0}, ["k = 0", "[1, 4096]"]),
    ({"text": "   "}, ["text is empty"]),
    ({"text": TEXT, "model": "gpt-9"}, ["model = 'gpt-9'"]),
    ({"text": TEXT, "lang": "fr"}, ["lang = 'fr'"]),
], ids=["too-long", "too-many-tokens", "k", "empty", "model", "lang"])
def test_bad_input_is_a_400_naming_argument_and_range(client, params, words):
    r = client.get("/api/heads", params=params)
    assert r.status_code == 400
    for w in words:
        assert w in r.json()["error"]


def test_a_long_address_is_414_before_the_model_runs(client):
    r = client.get("/api/heads", params={"text": "é" * 3000})
    assert r.status_code == 414 and "the limit is 16,384 bytes" in r.json()["error"]


def test_served_page_has_one_text_box_and_the_gallery(client):
    for lang, word in (("en", "head 3"), ("zh", "头 3")):
        page = client.get("/", params={"lang": lang}).text
        assert page.count("<textarea") == 1 and 'id="user-text"' not in page
        assert page.count('class="gl-thumb"') == 8 and word in page
