"""The official `openai` client against a real `gatherlens serve` process on 127.0.0.1 (a free port): a tiny
GGUF chat model (tests/chat_helpers.py) and the shipped SmolLM2-135M-Instruct (Q4_1, run from its blocks).

models.list; chat, whole and streamed (at temperature 0 the joined stream equals the whole answer);
completions; the same seed giving the same text; 4 parallel streams, each equal to its solo run; the error
shapes (404, 400, 401 with --api-key). Each server starts in a fresh process (imports, the model load): slow.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

import pytest

from chat_helpers import write_chat_model
from gatherlens.bench.serve_client import free_port, server_process

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
SRC = Path(__file__).resolve().parents[1] / "src"


@contextlib.contextmanager
def serving(*args: str, timeout: float = 300):
    """A `gatherlens serve ... --port P` process (bench/serve_client.server_process: up once /v1/models answers);
    yields its base URL; stopped after."""
    port = free_port()
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "gatherlens", "serve", *args, "--port", str(port)]
    with server_process(argv, threads=int(os.environ.get("OMP_NUM_THREADS", "2")), port=port, timeout=timeout,
                        env={"PYTHONPATH": path}):
        yield f"http://127.0.0.1:{port}"


def _parallel(client, model, chats, **kw) -> list[str]:
    """Each chat streamed at once (one thread each), started together; the joined text of each."""
    got, barrier = [None] * len(chats), threading.Barrier(len(chats))

    def run(i):
        barrier.wait()
        chunks = client.chat.completions.create(model=model, messages=chats[i], stream=True, **kw)
        got[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(chats))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return got


CHATS = [[{"role": "user", "content": text}] for text in
         ("What is a gather?", "Name a colour.", "Count to three.", "Say hello in French.")]


def _check_api(client, model: str, tokens: int) -> None:
    assert [m.id for m in client.models.list().data] == [model]
    whole = client.chat.completions.create(model=model, messages=CHATS[0], max_tokens=tokens, temperature=0)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.usage.completion_tokens <= tokens and text
    chunks = list(client.chat.completions.create(model=model, messages=CHATS[0], max_tokens=tokens, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    done = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert done.object == "text_completion" and done.choices[0].text
    seeded = [client.chat.completions.create(model=model, messages=CHATS[1], max_tokens=tokens, seed=42,
                                             temperature=0.9).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    solo = [client.chat.completions.create(model=model, messages=c, max_tokens=tokens, temperature=0)
            .choices[0].message.content for c in CHATS]
    assert _parallel(client, model, CHATS, max_tokens=tokens, temperature=0) == solo


def _check_errors(url: str, client, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHATS[0])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHATS[0], temperature=5)
    assert e.value.param == "temperature"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": "hi"}, timeout=60)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_served_tiny_model_speaks_to_the_openai_client(tmp_path):
    path = write_chat_model(tmp_path / "chat.gguf")
    with serving("--model", str(path), "--quantized") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        _check_api(client, "chat.gguf", 16)
        _check_errors(url, client, "chat.gguf")


def test_an_api_key_guards_the_api_of_a_served_model(tmp_path):
    path = write_chat_model(tmp_path / "chat.gguf")
    with serving("--model", str(path), "--quantized", "--api-key", "k-123") as url:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="k-123", max_retries=0, timeout=300)
        assert ok.chat.completions.create(model="chat.gguf", messages=CHATS[0], max_tokens=4).choices[0].message


def test_smollm2_instruct_served_from_its_blocks_speaks_to_the_openai_client():
    with serving("--model", "smollm2", "--quantized") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        _check_api(client, "smollm2", 24)
        _check_errors(url, client, "smollm2")
