"""`gatherlens serve`'s JSON API on a tiny random Llama: the story of story.json with tokens, 400s
that name the argument and its range, a failing request that leaves the server well, eight
requests at once each answered with its own story, and a generation whose client goes away
freeing the model. Server-sent events and concurrency run on a real uvicorn (serve_helpers)."""
import json
import threading
import time

import pytest
from click.testing import CliRunner

from gatherlens.report.build import story_data
from serve_helpers import running_server
from tiny_models import make_tiny_llama

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.serve import ServeSettings, create_app  # noqa: E402

TEXT = "The cat sat on the mat because it was"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny"))


def _loader(broken: str = "minilm"):
    """load(), except that `broken` raises an unexpected error (a failure inside one request)."""
    from gatherlens.models import load

    def loader(name):
        if name == broken:
            raise RuntimeError("disk on fire")
        return load(name)

    return loader


@pytest.fixture(scope="module")
def settings(model_dir):
    return ServeSettings(model=model_dir, text=TEXT, max_new_tokens=400)


@pytest.fixture(scope="module")
def client(settings):
    app = create_app(settings, loader=_loader())
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def server(settings):
    with running_server(create_app(settings, loader=_loader())) as url:
        yield url


def test_explain_returns_the_story_with_tokens(client):
    r = client.get("/api/explain", params={"text": TEXT, "k": 3, "layer": 1, "head": 2, "query": 4})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["tokens"][0] == "[CLS]" and body["text"] == TEXT and body["top_k"] == 3
    att = body["attention"]
    assert (att["layer"], att["head"], att["query"]) == (1, 2, 4)
    assert all(len(row) == 3 for row in att["indices"][2:])
    assert "html" not in body and "page" not in body
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    assert r.headers["x-content-type-options"] == "nosniff"


def test_explain_keys_are_story_json_keys(client, model_dir):
    from gatherlens.models import load
    from gatherlens.report.collect import collect

    expected = story_data(collect(load(model_dir), TEXT, top_k=2))
    body = client.get("/api/explain", params={"text": TEXT, "k": 2}).json()
    assert sorted(body) == sorted(expected)
    assert body["ids"] == expected["ids"] and body["attention"]["indices"] == expected["attention"]["indices"]


def test_explain_with_page_data_and_html(client):
    body = client.get("/api/explain", params={"text": "A dog ran.", "html": 1, "explore": 1, "topk": 0,
                                              "k": 2}).json()
    assert body["page"]["explore"]["dense_run"] and body["page"]["sel"]["k"] == 2
    assert 'name="text"' in body["html"] and "connect-src 'self'" in body["csp"]
    assert "A dog ran." in body["html"]


@pytest.mark.parametrize("params, status, words", [
    ({"text": "x" * 1001}, 400, ["1,001 characters", "the limit is 1,000"]),
    ({"text": "a " * 140}, 400, ["text has 142 tokens", "within [1, 128] tokens"]),
    ({"text": TEXT, "layer": 999}, 400, ["layer 999", "there are 2 layers"]),
    ({"text": TEXT, "head": 9}, 400, ["head 9", "there are 4 heads"]),
    ({"text": TEXT, "k": 0}, 400, ["k = 0", "[1, 4096]"]),
    ({"text": TEXT, "k": "many"}, 400, ["k = 'many' is not an integer"]),
    ({"text": TEXT, "query": 50}, 400, ["query 50", "has 11 tokens"]),
    ({"text": "   "}, 400, ["text is empty"]),
    ({"text": TEXT, "model": "gpt-9"}, 400, ["model = 'gpt-9'", "smollm2"]),
    ({"text": TEXT, "lang": "fr"}, 400, ["lang = 'fr'", "'en', 'zh'"]),
], ids=["too-long", "too-many-tokens", "layer", "head", "k", "k-text", "query", "empty", "model", "lang"])
def test_bad_input_is_a_400_naming_argument_and_range(client, params, status, words):
    r = client.get("/api/explain", params=params)
    assert r.status_code == status
    message = r.json()["error"]
    for w in words:
        assert w in message, (w, message)


def test_a_failing_request_leaves_the_server_well(client):
    r = client.get("/api/explain", params={"text": TEXT, "model": "minilm"})  # its loader raises
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]
    assert client.get("/api/explain", params={"text": TEXT}).status_code == 200
    assert client.get("/api/health").json()["busy"] is False


def test_other_hosts_are_refused(client):
    r = client.get("/api/explain", params={"text": TEXT}, headers={"host": "evil.example"})
    assert r.status_code == 400


def test_page_is_the_report_with_its_policy(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = r.headers["content-security-policy"]
    assert "connect-src 'self'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
    assert policy in r.text  # the same policy in the page's meta tag
    for name in ("text", "model", "topk", "layer", "head", "query", "k", "max_new"):
        assert f'name="{name}"' in r.text


def test_eight_concurrent_requests_each_get_their_own_answer(server):
    texts = [f"Number {i} is {'odd' if i % 2 else 'even'} today" for i in range(8)]
    answers = [None] * 8

    def ask(i):
        answers[i] = httpx.get(f"{server}/api/explain", params={"text": texts[i], "k": 1 + i % 3},
                               timeout=120).json()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, body in enumerate(answers):
        assert body["text"] == texts[i] and body["top_k"] == 1 + i % 3
        assert str(i) in body["tokens"]


def _events(lines):
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event:
            yield event, json.loads(line.split(":", 1)[1])


def test_generation_streams_steps_with_their_pages(server):
    with httpx.stream("GET", f"{server}/api/generate", params={"text": TEXT, "max_new": 12},
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(_events(r.iter_lines()))
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("step") == 11
    start, steps = events[0][1], [d for k, d in events if k == "step"]
    assert start["page_size"] == 4 and start["budget"] == 16 and start["layers"] == 2
    for s in steps:
        assert s["length"] == start["prompt_tokens"] + s["step"]
        assert len(s["layers"]) == 2 and len(s["layers"][0]) == 2          # 2 layers x 2 KV heads
        for pages in s["layers"][0]:
            assert pages[0] == 0 and pages[-1] == s["pages_total"] - 1      # page 0 and the newest
            assert len(pages) <= 4                                            # budget 16 / page 4


def test_disconnect_mid_generation_frees_the_model(server):
    before = httpx.get(f"{server}/api/health").json()
    with httpx.stream("GET", f"{server}/api/generate", params={"text": TEXT, "max_new": 400},
                      timeout=120) as r:
        seen = 0
        for kind, _ in _events(r.iter_lines()):
            seen += kind == "step"
            if seen == 2:
                break                                      # the client goes away mid-generation
    deadline = time.monotonic() + 60
    while True:
        health = httpx.get(f"{server}/api/health").json()
        if health["cancelled"] > before["cancelled"] and not health["busy"]:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.1)
    assert health["served"] == before["served"]             # the generation did not run to its end
    r = httpx.get(f"{server}/api/explain", params={"text": TEXT}, timeout=120)
    assert r.status_code == 200                              # the model is free and dense again


def test_encoder_cannot_generate():
    from gatherlens.errors import GatherValueError
    from gatherlens.serve.decode import decode_steps

    class Encoder:  # what decode_steps reads of a LoadedModel before running anything
        name, is_causal, model, tokenizer = "enc", False, None, None

    with pytest.raises(GatherValueError, match="enc is an encoder .* does not generate"):
        next(decode_steps(Encoder(), "x", 2, 16, 4))


def test_serve_command_warns_when_not_local(monkeypatch):
    import uvicorn

    from gatherlens.commands.serve import serve

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    res = CliRunner().invoke(serve, ["--host", "0.0.0.0", "--port", "9999"])
    assert res.exit_code == 0, res.output
    assert "warning: listening on 0.0.0.0" in res.output and calls == [
        {"host": "0.0.0.0", "port": 9999, "log_level": "warning"}]
    calls.clear()
    res = CliRunner().invoke(serve, [])
    assert "warning" not in res.output and calls[0]["host"] == "127.0.0.1" and calls[0]["port"] == 8765


@pytest.mark.slow
def test_switching_to_minilm_explains_with_its_three_tables(model_dir):
    """The page's model switch: MiniLM (bidirectional BERT) from a server started on another model."""
    app = create_app(ServeSettings(model=model_dir), warm=False)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.get("/api/explain", params={"text": "A cat sat.", "model": "minilm", "layer": 5, "head": 11,
                                          "query": 0, "explore": 1})
    if r.status_code == 400 and "not installed" in r.text:
        pytest.skip(r.json()["error"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "minilm" and body["tokens"][0] == "[CLS]" and body["prediction"] is None
    assert [e["kind"] for e in body["embeddings"]] == ["word", "position", "token_type"]
    x = body["page"]["explore"]
    assert (x["layers"], x["heads"], x["kv_heads"], x["causal"]) == (6, 12, 12, False)
    assert body["attention"]["layer"] == 5 and body["attention"]["head"] == 11
