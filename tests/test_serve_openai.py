"""The OpenAI API of `gatherlens serve` (serve/openai_api.py, serve/engine.py) under a real uvicorn in this
process, on a tiny GGUF chat model (tests/chat_helpers.py), with the official `openai` client and raw HTTP:
the answers' fields, streams that join to the whole answer, seeds, parallel streams each equal to its solo
run (decoded in batched steps), stop strings, errors in OpenAI's shape, a bounded queue, dropped clients.
The same against a `gatherlens serve` subprocess: tests/test_serve_openai_process.py."""
from __future__ import annotations

import threading
import time

import pytest

from chat_helpers import write_chat_model
from serve_helpers import running_server

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from gatherlens.models import load  # noqa: E402
from gatherlens.models.runtime.chat import chat_prompt, chat_template_of  # noqa: E402
from gatherlens.models.runtime.generation import GenerationEnd, generation_steps  # noqa: E402
from gatherlens.ops.sparse.config import DEFAULT  # noqa: E402
from gatherlens.serve import ServeSettings, create_app  # noqa: E402

MODEL = "chat.gguf"
CHAT = [{"role": "user", "content": "the cat sat on"}]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_chat_model(tmp_path_factory.mktemp("api") / MODEL)


def _app(path, **settings):
    settings = ServeSettings(model=str(path), quantized=True, **settings)
    return create_app(settings, loader=lambda name: load(name, quantized=True, progress=False))


@pytest.fixture(scope="module")
def url(path):
    with running_server(_app(path)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def lm(path):
    return load(str(path), quantized=True, progress=False)


def _greedy(lm, chat, n) -> str:
    template = chat_template_of(lm)
    events = list(generation_steps(lm, chat_prompt(lm, chat, template), DEFAULT.budget, n, stop=template.stop_ids))
    return next(e for e in events if isinstance(e, GenerationEnd)).text


def test_models_list_names_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL] and models.data[0].owned_by == "gatherlens"


def test_chat_answer_has_openai_fields_and_equals_the_loop(client, lm):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL and r.created > 0
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.logprobs is None
    assert choice.message.content == _greedy(lm, CHAT, 12)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == chat_prompt(lm, CHAT).shape[1] and r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_stream_joins_to_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert len({c.id for c in chunks}) == 1
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert joined == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == whole.choices[0].finish_reason and not any(reasons[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_and_token_prompts(client, lm):
    r = client.completions.create(model=MODEL, prompt="the cat", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.choices[0].logprobs is None
    ids = lm.encode("the cat")[0].tolist()
    again = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert again.choices[0].text == r.choices[0].text
    events = list(generation_steps(lm, lm.encode("the cat"), DEFAULT.budget, 8))
    assert r.choices[0].text == events[-1].text
    streamed = client.completions.create(model=MODEL, prompt="the cat", max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_the_same_seed_gives_the_same_text(client):
    def ask(seed):
        return client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, seed=seed,
                                              temperature=1.2, top_p=0.95).choices[0].message.content

    first = ask(11)
    assert ask(11) == first and len({ask(s) for s in (1, 2, 3)} | {first}) > 1


def test_stop_strings_cut_the_answer(client):
    whole = client.completions.create(model=MODEL, prompt="the cat", max_tokens=24, temperature=0).choices[0].text
    stop = whole[5:7]
    r = client.completions.create(model=MODEL, prompt="the cat", max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == whole[:whole.index(stop)] and r.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="the cat", max_tokens=24, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text


def test_four_parallel_streams_each_equal_their_solo_run(client, url):
    chats = [[{"role": "user", "content": text}] for text in ("the cat", "on the mat and the", "it is", "a dog is in")]
    solo = [client.chat.completions.create(model=MODEL, messages=c, max_tokens=20, temperature=0)
            .choices[0].message.content for c in chats]
    before = httpx.get(f"{url}/api/health").json()["api"]["runner"]["steps"]["batched"]
    got, barrier = [None] * 4, threading.Barrier(4)

    def stream(i):
        barrier.wait()
        chunks = client.chat.completions.create(model=MODEL, messages=chats[i], max_tokens=20, temperature=0,
                                                stream=True)
        got[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == solo
    assert httpx.get(f"{url}/api/health").json()["api"]["runner"]["steps"]["batched"] > before


@pytest.mark.parametrize("body, status, param, words", [
    ({"model": "nope", "messages": CHAT}, 404, "model", "The model `nope` does not exist"),
    ({"model": MODEL, "messages": []}, 400, "messages", "messages must be a non-empty list"),
    ({"model": MODEL, "messages": CHAT, "temperature": 3}, 400, "temperature", "temperature = 3 is outside"),
    ({"model": MODEL, "messages": CHAT, "n": 2}, 400, "n", "n = 2 is not supported"),
    ({"model": MODEL, "messages": CHAT, "max_tokens": 0}, 400, "max_tokens", "max_tokens = 0 must be an integer"),
    ({"model": MODEL, "messages": CHAT, "max_tokens": 100_000}, 400, "messages", "maximum context length is 256"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages",
     "this model reads text only"),
    ({"model": MODEL, "messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4 strings"),
    ({"messages": CHAT}, 400, "model", "model must be given"),
])
def test_bad_bodies_get_openai_errors(url, body, status, param, words):
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    error = r.json()["error"]
    assert r.status_code == status and error["param"] == param and words in error["message"], r.text
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_malformed_json_and_the_client_sees_typed_errors(url, client):
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[10**9])


def test_an_api_key_is_asked_for(path):
    with running_server(_app(path, api_key="s3cret")) as base:
        r = httpx.get(f"{base}/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{base}/v1", api_key="s3cret", max_retries=0)
        assert good.models.list().data[0].id == MODEL
        assert httpx.get(f"{base}/api/health").status_code == 200     # the explorer's routes stay open


def _slow_steps(monkeypatch, seconds=0.05):
    from gatherlens.models.runtime.slots import SlotRunner

    advance = SlotRunner.advance
    monkeypatch.setattr(SlotRunner, "advance", lambda self, slots: (time.sleep(seconds), advance(self, slots))[1])


def test_past_the_slots_and_the_queue_comes_503(path, monkeypatch):
    _slow_steps(monkeypatch)
    with running_server(_app(path, slots=1, api_queue=1, retry_after=7)) as base:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as first, \
                httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as second:
            assert first.status_code == second.status_code == 200
            r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 503 and r.headers["retry-after"] == "7"
            assert r.json()["error"]["code"] == "server_busy" and "busy" in r.json()["error"]["message"]
        health = httpx.get(f"{base}/api/health").json()["api"]
        assert health["refused"] == 1


def test_a_client_that_goes_away_frees_its_slot_at_once(path, monkeypatch):
    _slow_steps(monkeypatch)
    with running_server(_app(path, slots=1, api_queue=0)) as base:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
            next(r.iter_lines())            # generating now
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/api/health").json()["api"]["running"]:
            assert time.monotonic() < deadline, "the slot was not freed"
            time.sleep(0.05)
        health = httpx.get(f"{base}/api/health").json()["api"]
        assert health["cancelled"] == 1 and health["served"] == 0
        r = httpx.post(f"{base}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
        assert r.status_code == 200       # the one slot serves the next request


def test_the_explorer_still_works_beside_the_api(url):
    r = httpx.get(f"{url}/api/explain", params={"text": "the cat sat", "k": 2}, timeout=120)
    assert r.status_code == 200 and r.json()["tokens"]
    events = httpx.get(f"{url}/api/generate", params={"text": "the cat sat", "max_new": 4}, timeout=120).text
    assert "event: done" in events
    assert httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}).status_code == 200


def test_the_model_route_and_unknown_routes_answer_in_openai_shape(url, client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    r = httpx.get(f"{url}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/v1/embeddings", json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    assert httpx.get(f"{url}/nothing-here").status_code == 404      # the explorer's side as before


def test_an_unexpected_failure_ends_the_request_not_the_server(path, monkeypatch):
    from gatherlens.models.runtime.slots import SlotRunner

    with running_server(_app(path)) as base:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 4}
        monkeypatch.setattr(SlotRunner, "advance", lambda self, slots: 1 / 0)
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 500 and "ZeroDivisionError" in r.json()["error"]["message"]
        monkeypatch.undo()
        assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).status_code == 200
