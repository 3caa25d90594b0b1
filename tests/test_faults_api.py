"""Every API parameter swept with bad values (issue 40): the explorer's /api/* query parameters and the
OpenAI API's /v1/* body fields, each given empty, zero, negative, huge, non-ASCII digits, the wrong type,
NaN. Each must be a 4xx in the API's own error shape ({"error": "..."} for /api/*, {"error": {"message",
"type"}} for /v1/*), never a 500 or a hang, and the server answers /api/health after every one.
"""
from __future__ import annotations

import pytest

from chat_helpers import write_chat_model

pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from gatherlens.models import load  # noqa: E402
from gatherlens.serve import ServeSettings, create_app  # noqa: E402

MODEL = "chat.gguf"
NOT_INTS = ["", "²", "٣", "1_0", "+4", "1.5", "abc", "9" * 40, "-9" + "9" * 40]
# route -> {parameter: its bad values} (an empty value means "the default" for optional ints: not listed there)
QUERY = {
    "/api/explain": {"k": ["0", "-1", *NOT_INTS[1:]], "layer": NOT_INTS[1:], "head": NOT_INTS[1:],
                     "query": NOT_INTS[1:], "lang": ["xx", "EN "], "model": ["no-such-model"], "topk": ["maybe"]},
    "/api/heads": {"layer": ["99", *NOT_INTS[1:]], "k": ["0", *NOT_INTS[1:]]},
    "/api/attention": {"layer": ["99", *NOT_INTS[1:]], "head": ["99", *NOT_INTS[1:]], "run_k": ["0", *NOT_INTS[1:]]},
    "/api/generate": {"max_new": ["0", "-1", "100000", *NOT_INTS[1:]], "budget": ["0", "5000", *NOT_INTS[1:]],
                      "page_size": ["0", "65", *NOT_INTS[1:]], "text": ["", " "]},
}
CHAT = [{"role": "user", "content": "the cat sat on"}]
# /v1/chat/completions field -> bad values (JSON values; NaN is written as the literal NaN)
BODY = {
    "max_tokens": [0, -1, "8", 2.5, 10**30], "max_completion_tokens": [0, -5, "x"],
    "temperature": [-1, 3, "hot", float("nan"), float("inf")], "top_p": [1.5, -0.1, "x"],
    "top_k": ["x", 1.5], "min_p": [-0.1, 1.5], "seed": ["x", 1.5, 2**70], "stop": [123, [1, 2], ["a"] * 5],
    "frequency_penalty": [-3, 3, "x"], "presence_penalty": [-3, 3], "n": [0, 2, -1], "stream": ["yes", 1],
    "messages": ["hi", [], [{"role": "wizard", "content": "x"}], [{"content": "x"}], [{"role": "user"}]],
    "model": ["no-such-model", 7, ""],
}
# (null max_tokens, top_p 0 and top_k -1 are OpenAI's and llama.cpp's "default" / "greedy" / "off": accepted)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = write_chat_model(tmp_path_factory.mktemp("api-sweep") / MODEL)
    app = create_app(ServeSettings(model=str(path), quantized=True),
                     loader=lambda name: load(name, quantized=True, progress=False))
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _query_cases():
    for route, params in QUERY.items():
        for name, values in params.items():
            for value in values:
                yield pytest.param(route, name, value, id=f"{route}|{name}|{value[:12] or 'empty'}")


@pytest.mark.parametrize("route,name,value", list(_query_cases()))
def test_a_bad_query_parameter_is_a_400_naming_it(client, route, name, value):
    """Must hold: 400 with {"error": "..."} naming the parameter (or its value), never a 500."""
    base = {"text": "the cat sat on"} if route != "/api/generate" or name != "text" else {}
    r = client.get(route, params={**base, name: value})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    said = r.json()["error"]
    assert isinstance(said, str) and said and "internal error" not in said, said
    assert name in said or value.strip() in said or "text" in said, said
    assert client.get("/api/health").status_code == 200


def _body_cases():
    for field, values in BODY.items():
        for value in values:
            yield pytest.param(field, value, id=f"{field}|{str(value)[:12]}")


@pytest.mark.parametrize("field,value", list(_body_cases()))
def test_a_bad_body_field_is_a_4xx_in_openais_shape(client, field, value):
    """Must hold: a 4xx (400, or 404 for an unknown model) with {"error": {"message", "type"}}, never a 500."""
    import json

    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, field: value}
    r = client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (field, value, r.status_code, r.text[:300])
    error = r.json()["error"]
    assert isinstance(error, dict) and error["message"] and error["type"], error
    assert "internal error" not in error["message"], error
    assert client.get("/api/health").status_code == 200


@pytest.mark.parametrize("content,kind", [(b"", "application/json"), (b"{not json", "application/json"),
                                          (b"[1, 2]", "application/json"), (b'"text"', "application/json"),
                                          (b"\xff\xfe\x00", "application/json"), (b"model=x", "text/plain")],
                         ids=["empty", "broken", "a-list", "a-string", "not-utf8", "not-json"])
def test_a_body_that_is_not_a_json_object_is_a_400(client, content, kind):
    r = client.post("/v1/chat/completions", content=content, headers={"content-type": kind})
    assert 400 <= r.status_code < 500 and r.json()["error"]["message"], (r.status_code, r.text[:300])
    assert client.get("/api/health").status_code == 200
