"""What `gatherlens bench serve` drives: an OpenAI-compatible server in its own process, and a plain client.

    >>> with server_process(["gatherlens", "serve", "--model", "smollm2", "--quantized"], threads=2) as url:
    ...     stream = chat_stream(url, "smollm2", messages, max_tokens=32)   # one streamed chat, timed
    ...     stream.first_token, stream.seconds, stream.tokens, stream.text

The client is the standard library's http.client (no test-only dependency), reading the server-sent
events of `stream: true` line by line: the time to the first content chunk (what a person waits for)
and to `data: [DONE]`. The same client talks to `gatherlens serve` and to llama-cpp-python's
`llama_cpp.server`, each started with OMP_NUM_THREADS (and its own thread option) set to `threads`.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass

import click

__all__ = ["Stream", "chat_stream", "server_process", "free_port"]


@dataclass
class Stream:
    """One streamed answer: seconds to its first content chunk and to its end, its chunks and text."""

    first_token: float
    seconds: float
    tokens: int          # content chunks (one per generated token on both servers)
    text: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(port: int) -> bool:
    """True once GET /v1/models answers (401: a server that asks for a key is up too)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/models")
        return conn.getresponse().status in (200, 401)
    except OSError:
        return False


@contextlib.contextmanager
def server_process(argv: list[str], threads: int, port: int, timeout: float = 600, env: dict | None = None):
    """Run a server (`argv`, listening on 127.0.0.1:port; `env`: more environment) until /v1/models answers;
    yields the port; stopped (SIGTERM, then SIGKILL after 30 s) after."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env or {}))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while not _up(port):
            if proc.poll() is not None:
                raise click.ClickException(f"{argv[0]} {' '.join(argv[1:4])} ... stopped: "
                                           f"{(proc.stderr.read() or '').strip()[-500:]}")
            if time.monotonic() > deadline:
                raise click.ClickException(f"the server {' '.join(argv[:4])} did not answer in {timeout:.0f} s")
            time.sleep(0.25)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _events(response):
    """The `data:` payloads of a server-sent event stream, up to [DONE]."""
    while True:
        line = response.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            yield json.loads(data)


def chat_stream(port: int, model: str, messages: list[dict], max_tokens: int, **options) -> Stream:
    """POST /v1/chat/completions with stream: true (temperature 0 unless given); timed from the request."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            **options}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    start = time.perf_counter()   # (a server that died answers ConnectionRefusedError, an OSError)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise click.ClickException(f"the server answered {response.status}: {response.read()[:300]!r}")
    first, pieces = None, []
    for chunk in _events(response):
        piece = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
        if piece:
            first = first if first is not None else time.perf_counter() - start
            pieces.append(piece)
    conn.close()
    seconds = time.perf_counter() - start
    return Stream(first if first is not None else seconds, seconds, len(pieces), "".join(pieces))
