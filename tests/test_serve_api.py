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
# the limits these tests were written at (the defaults are the long-text ones: tests/test_serve_long.py)
SMALL = dict(max_chars=1000, max_tokens=128, max_target_bytes=16384)


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
    return ServeSettings(model=model_dir, text=TEXT, max_new_tokens=400, **SMALL)


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


def test_the_explorers_events_are_the_one_loops_steps(model_dir):
    """The stream is the one generation loop (gatherlens.models.runtime.generation) as plain data: the same
    tokens, text and pages; the text continues the prompt with its space."""
    from gatherlens.models import load
    from gatherlens.models.runtime.generation import GenerationStep, generation_steps
    from gatherlens.ops.sparse.config import TOY
    from gatherlens.serve.decode import decode_steps

    lm = load(model_dir)
    events = list(decode_steps(lm, TEXT, 6, 16, 4))
    loop = [e for e in generation_steps(lm, lm.encode(TEXT), 16, 6, pages=True, config=TOY.replace(budget=16, page_size=4))
            if isinstance(e, GenerationStep)]
    assert [k for k, _ in events] == ["start"] + ["step"] * 5 + ["done"]
    tokens = [events[0][1]["token"]] + [d["token"] for k, d in events if k == "step"]
    assert tokens == [e.token for e in loop] and "".join(tokens) == loop[-1].text
    assert [d["layers"] for k, d in events if k == "step"] == [e.page_ids() for e in loop[1:]]
    assert [d["token_id"] for k, d in events if k == "step"] == [e.token_id for e in loop[1:]]
    assert events[-1] == ("done", {"message": "6 tokens generated", "tokens": 6})


def test_the_explorer_takes_the_auto_budget_and_sends_each_heads_count(model_dir):
    """budget "auto": every step says how many pages each head of each layer read (counts), the same as its ids."""
    from gatherlens.models import load
    from gatherlens.serve.decode import decode_steps
    from gatherlens.serve.params import generate_params

    assert generate_params({"text": TEXT, "budget": "auto"}, ServeSettings()).budget == "auto"
    steps = [d for k, d in decode_steps(load(model_dir), TEXT, 5, "auto", 4) if k == "step"]
    assert steps and all(len(d["counts"]) == len(d["layers"]) == 2 for d in steps)
    for d in steps:
        for layer, counts, chose in zip(d["layers"], d["counts"], d["chose"]):
            assert [len(p) for p in layer] == counts if chose else all(c == d["pages_total"] for c in counts)


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

    import gatherlens.models
    from uvicorn.protocols.http.h11_impl import H11Protocol

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.setattr(gatherlens.models, "load", lambda name, **kw: object())  # loaded before uvicorn now
    res = CliRunner().invoke(serve, ["--host", "0.0.0.0", "--port", "9999"])
    assert res.exit_code == 0, res.output
    assert "warning: listening on 0.0.0.0" in res.output and calls == [
        {"host": "0.0.0.0", "port": 9999, "log_level": "warning", "http": calls[0]["http"]}]
    assert issubclass(calls[0]["http"], H11Protocol)        # the one that answers 414 (serve/limits.py)
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


# -- issue 21: the server's start, its limits, what a client sees ----------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _never(what: str):
    return lambda *a, **k: pytest.fail(f"{what} ran")


def _serve(monkeypatch, *args):
    """`gatherlens serve ARGS` as a user runs it, with uvicorn never started."""
    import uvicorn

    from gatherlens.cli import main

    monkeypatch.setattr(uvicorn, "run", _never("uvicorn"))
    res = CliRunner().invoke(main, ["serve", *args])
    assert "Traceback" not in res.output and "Application startup failed" not in res.output, res.output
    return res, res.output.strip().splitlines()[-1]


def test_serve_reports_a_busy_port_before_the_model_loads(monkeypatch):
    """Must hold: a port another program listens on is one `Error:` line naming it and what to do;
    exit 1; the model is never loaded, uvicorn never started."""
    import socket

    import gatherlens.models

    monkeypatch.setattr(gatherlens.models, "load", _never("the model load"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res, last = _serve(monkeypatch, "--port", str(port))
    assert res.exit_code == 1 and last == (f"Error: port {port} on 127.0.0.1 is in use (another gatherlens "
                                           f"serve?): stop it, or pick another --port")
    res, last = _serve(monkeypatch, "--host", "192.0.2.1", "--port", str(port))     # TEST-NET: not ours
    assert res.exit_code == 1 and last.startswith("Error: --host '192.0.2.1' is not an address of this machine")


def test_serve_with_a_mistyped_or_damaged_model_is_one_line(model_dir, tmp_path, monkeypatch):
    """Must hold: a mistyped --model path, a folder without weights and a truncated
    model.safetensors are each one `Error:` line naming the model (no uvicorn traceback, no
    "internal error"); exit 1; the port is free again afterwards; the user's folder untouched."""
    import shutil
    import socket

    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    empty = tmp_path / "no-weights"
    shutil.copytree(model_dir, empty)
    (empty / "model.safetensors").unlink()
    port = _free_port()
    cases = {str(tmp_path / "mistyped"): "is neither a known name",
             str(empty): "has no weights: none of model.safetensors",
             str(damaged): "could not be read (damaged or truncated?): model.safetensors: Error while deserializing"}
    for model, said in cases.items():
        res, last = _serve(monkeypatch, "--model", model, "--port", str(port))
        assert res.exit_code == 1 and last.startswith(f"Error: model") and said in last, res.output
        assert "internal error" not in res.output
    assert len(weights.read_bytes()) == 5000
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))       # let go: nothing holds the port after a failed start


@pytest.mark.parametrize("change, said", [
    ({"queue_limit": -1}, "queue_limit = -1 is outside the valid range [0, 10,000]"),
    ({"retry_after": 0}, "retry_after = 0 is outside the valid range [1, 3,600]"),
    ({"max_chars": 20000}, "max_target_bytes = 200000 is outside the valid range [241,024"),
    ({"default_new_tokens": 99}, "the default request is refused: max_new = 99 is outside the valid range [1, 64]"),
    ({"budget": 0}, "the default request is refused: budget = 0"),
    ({"text": " "}, "the default request is refused: text is empty"),
    ({"max_new_tokens": 0}, "max_new_tokens = 0 must be an int >= 1"),
    ({"port": 70000}, "port = 70000 is outside the valid range [0, 65535]"),
], ids=["queue", "retry", "target-vs-chars", "default-new", "budget", "text", "max-new", "port"])
def test_serve_settings_are_checked_before_the_port_and_the_model(change, said):
    """Must hold: a setting out of its range is one GatherValueError naming it and its range,
    raised before the port is bound or the model is loaded."""
    from gatherlens.errors import GatherValueError
    from gatherlens.serve import prepared

    with pytest.raises(GatherValueError) as caught:
        with prepared(ServeSettings(**{"port": _free_port(), **change}), load=_never("the model load")):
            pass
    assert said in str(caught.value), str(caught.value)


@pytest.fixture(scope="module")
def limited(model_dir):
    """A real uvicorn with the server's own protocol: one model request runs, one may wait.
    Loading "minilm" waits for `.slow` (a model load that takes its time, holding the model)."""
    from types import SimpleNamespace

    from gatherlens.models import load
    from gatherlens.serve import http_protocol

    slow = threading.Event()

    def loader(name):
        if name == "minilm":
            slow.wait(120)
            raise RuntimeError("the slow load failed")
        return load(name)

    s = ServeSettings(model=model_dir, text=TEXT, queue_limit=1, retry_after=7, **SMALL)
    with running_server(create_app(s, loader=loader), http=http_protocol(s)) as url:
        yield SimpleNamespace(url=url, slow=slow)
    slow.set()


def _raw(url: str, request: bytes) -> bytes:
    """Send `request` as it is and read the whole answer (a reset raises ConnectionResetError)."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    return answer


def test_a_megabyte_query_answers_414_not_a_reset(limited, client):
    """Must hold: a 1 MB query string is answered 414 with a JSON error naming the limit and the
    server's security headers, and the connection ends cleanly (no reset); the server then
    answers as usual. Behind another server (the app alone) the same limit gives the same 414."""
    answer = _raw(limited.url, b"GET /api/explain?text=" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 414 ") and b"content-security-policy: default-src 'none'" in head
    assert json.loads(body)["error"] == ("the request's address (path and query) is longer than the limit, "
                                         "16,384 bytes (text is limited to 1,000 characters)")
    assert httpx.get(f"{limited.url}/api/explain", params={"text": TEXT}, timeout=120).status_code == 200
    r = client.get("/api/explain", params={"text": "é" * 3000})        # /api/explain?text= + 3,000 x %C3%A9
    assert r.status_code == 414 and "has 18,018 bytes; the limit is 16,384 bytes" in r.json()["error"]
    r = client.get("/api/explain", params={"text": "😀" * 1000})       # the longest text still fits the limit
    assert r.status_code == 200 and r.json()["text"] == "😀" * 1000


def test_oversized_headers_answer_400_not_a_reset(limited):
    """Must hold: a request head past the server's buffer is a 400 with a JSON error, ending the
    connection cleanly; the server goes on."""
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 200) for i in range(5000))   # 1 MB of headers
    head, body = _raw(limited.url, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n").split(
        b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400 ") and "headers over 16,384 bytes" in json.loads(body)["error"]
    assert httpx.get(f"{limited.url}/api/health", timeout=60).status_code == 200


def test_a_full_queue_answers_503_with_retry_after(limited):
    """Must hold: with one request holding the model (a slow load) and one waiting
    (queue_limit=1), the next model request is answered at once with 503, Retry-After and a
    JSON error; /api/health still answers; once the first ends the waiting one is served, in
    order, and requests pass again."""
    url, failed = limited.url, []
    first = threading.Thread(target=lambda: failed.append(
        httpx.get(f"{url}/api/explain", params={"text": TEXT, "model": "minilm"}, timeout=120).status_code))
    first.start()
    deadline = time.monotonic() + 60
    while not httpx.get(f"{url}/api/health", timeout=60).json()["busy"]:   # the first holds the model
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with httpx.stream("GET", f"{url}/api/generate", params={"text": TEXT, "max_new": 3}, timeout=120) as second:
        assert second.status_code == 200                                   # admitted: it waits for the model
        r = httpx.get(f"{url}/api/explain", params={"text": TEXT}, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "7"
        assert r.json()["error"] == ("the server is busy: 2 requests are running or waiting for the model; "
                                     "try again in 7 s")
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        assert httpx.get(f"{url}/api/health", timeout=60).json()["busy"] is True
        limited.slow.set()                                                  # the first ends (its load fails)
        kinds = [k for k, _ in _events(second.iter_lines())]
        assert kinds == ["start", "step", "step", "done"]                  # the waiting one is served
    first.join(60)
    assert failed == [500]
    assert httpx.get(f"{url}/api/explain", params={"text": TEXT}, timeout=120).status_code == 200


def test_serve_starts_after_its_checks_with_plain_lines(model_dir, monkeypatch):
    """Must hold: a sound start loads the model before uvicorn runs, says so in plain lines (no
    source path such as `loading.py:375` beside them) and hands uvicorn the port it checked;
    odd options are refused by their range before anything loads (exit 2)."""
    import uvicorn

    from gatherlens.cli import main

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    port = _free_port()
    res = CliRunner().invoke(main, ["serve", "--model", model_dir, "--port", str(port)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert f"loaded {model_dir.rsplit('/', 1)[-1]} in" in res.output, res.output
    assert lines[-1] == f"serving http://127.0.0.1:{port}/" and ".py:" not in res.output
    assert [(c["host"], c["port"]) for c in calls] == [("127.0.0.1", port)]
    for args, said in ((["--max-new-tokens", "0"], "--max-new-tokens"), (["--port", "0"], "--port"),
                       (["--lang", "fr"], "--lang")):
        res, last = _serve(monkeypatch, *args)
        assert res.exit_code == 2 and said in res.output and "loading" not in res.output, res.output


# -- issue 29: one int parser, one set of position checks for /api/explain and /api/attention ------
@pytest.mark.parametrize("value, words", [
    ("²", ["run_k = '²' is not an integer; give one in [1, 4096]"]),       # '²'.isdigit() is True
    ("٣", ["run_k = '٣' is not an integer"]),                              # int('٣') == 3
    ("abc", ["run_k = 'abc' is not an integer; give one in [1, 4096]"]),
    ("0", ["run_k = 0 is outside the valid range [1, 4096]"]),
    ("1_0", ["run_k = '1_0' is not an integer"]),                          # int('1_0') == 10
], ids=["superscript", "arabic-indic", "text", "zero", "underscore"])
def test_attention_run_k_is_read_like_every_int(client, value, words):
    """Must hold: run_k goes through the API's one int rule: a 400 naming it and [1, max_k], never
    a 500 (before: '²' passed isdigit() and int() raised: a 500 and a traceback on the server)."""
    r = client.get("/api/attention", params={"text": TEXT, "run_k": value})
    assert r.status_code == 400, r.text
    for w in words:
        assert w in r.json()["error"], (w, r.json())
    assert client.get("/api/health").json()["busy"] is False


@pytest.mark.parametrize("params, words", [
    ({"layer": -3}, ["layer -3 is outside the model's layers [-2, 2): there are 2 layers"]),
    ({"layer": 2}, ["layer 2 is outside the model's layers [-2, 2)"]),
    ({"head": -5}, ["head -5 is outside the query heads [-4, 4): there are 4 heads in layer"]),
    ({"query": -12}, ["query -12 is outside the token positions [-11, 11): the text has 11 tokens"]),
    ({"query": 11}, ["query 11 is outside the token positions [-11, 11)"]),
    ({"k": "²"}, ["k = '²' is not an integer; give one in [1, 4096]"]),
], ids=["layer-negative", "layer", "head-negative", "query-negative", "query", "k"])
def test_explain_and_attention_refuse_a_position_in_the_same_words(client, params, words):
    """Must hold: /api/attention checks layer, head and query with /api/explain's functions: the
    same message, negatives shown as given (not shifted), no "querys"."""
    for path in ("/api/explain", "/api/attention"):
        r = client.get(path, params={"text": TEXT, **params})
        assert r.status_code == 400, (path, r.text)
        message = r.json()["error"]
        for w in words:
            assert w in message, (path, w, message)
        assert "querys" not in message and "[0, " not in message


def test_the_page_answers_a_bad_argument_with_an_html_page(client):
    """Must hold: GET /?k=0 is a 400 HTML page (what a browser shows) holding the one error line,
    escaped; the API keeps answering JSON."""
    r = client.get("/", params={"k": "0<b>"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html"), r.headers
    assert "k = &#x27;0&lt;b&gt;&#x27; is not an integer; give one in [1, 4096]" in r.text, r.text
    assert "<b>" not in r.text and r.headers["content-security-policy"].startswith("default-src 'none'")
    r = client.get("/", params={"k": "0"})
    assert r.status_code == 400 and "k = 0 is outside the valid range [1, 4096]" in r.text
    api = client.get("/api/explain", params={"text": TEXT, "k": "0"})
    assert api.status_code == 400 and api.json()["error"] == "k = 0 is outside the valid range [1, 4096]"
