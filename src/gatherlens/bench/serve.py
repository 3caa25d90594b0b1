"""`gatherlens bench serve`: the OpenAI server under a client: prefix reuse and parallel streams, llama.cpp beside it.

    gatherlens bench serve                                            # SmolLM2-135M-Instruct Q4_1, from its blocks
    gatherlens bench serve --llama-python /work/llamacpp-venv/bin/python --rounds 5 --json serve.json

Each server is started fresh for the run, in its own process, with the same threads: `gatherlens serve
--quantized --slots 4`, and llama-cpp-python's `llama_cpp.server` on the same GGUF where --llama-python (or
$GATHERLENS_LLAMA_PYTHON) names an interpreter that has it (its server extra; a bench extra, never a
dependency). Both are driven by the same plain client (bench/serve_client.py, streamed chats at temperature 0):

- prefix reuse: a chat whose user message is a passage of ~1,500 tokens (Jane Austen, or Python's pydoc
  topics without Debian's R package) and a question. Turn 1's first-token time (the whole prompt prefilled),
  then turn 2's (the answer and a short question appended: the first turn's pages are kept). Row
  "turn 1 / turn 2": the ratio (target >= 5). Each round takes another passage, so no round reuses another's.
- parallel streams: 1, 2 and 4 chats streamed at once (different short questions, --tokens each): the
  tokens/s of all of them together, and its ratio to one stream's (target: 4 streams >= 2.5x).

Medians over --rounds. It prints each row and ratio; --json writes {"suite": "serve", "meta", "rows"}.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass

import click

from gatherlens.bench.generate_peers import gguf_of, llama_python
from gatherlens.bench.output import check_json_path, write_results
from gatherlens.bench.serve_client import chat_stream, free_port, server_process
from gatherlens.params import Int

QUESTIONS = ("What is a gather in a Transformer?", "Name three colours and one fruit.",
             "Explain what a cache is, briefly.", "Write a short sentence about the sea.")
TARGETS = {"turn 1 / turn 2": 5.0, "4 streams / 1": 2.5}   # issue 37
STREAMS = (1, 2, 4)


@dataclass
class Row:
    server: str
    case: str
    value: float        # seconds (first-token times) or tokens/s (streams)
    unit: str
    ratio: float | None = None
    target: float | None = None


def _passages(rounds: int, chars: int) -> list[str]:
    """`rounds` passages of `chars` characters (~1,500 tokens at 6,000), spread over a real text."""
    from gatherlens.eval.corpus import load_text

    text = load_text("default")
    step = max(chars, (len(text) - chars) // max(rounds, 1))
    return [text[i * step:i * step + chars] for i in range(rounds)]


def _model_id(port: int) -> str:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["id"]


def _prefix_round(port: int, model: str, passage: str) -> tuple[float, float]:
    """(turn 1's first-token seconds, turn 2's) of one chat about `passage`."""
    chat = [{"role": "user", "content": f"{passage}\n\nIn one sentence: what happens in this passage?"}]
    one = chat_stream(port, model, chat, 32)
    chat += [{"role": "assistant", "content": one.text}, {"role": "user", "content": "Who is named first?"}]
    return one.first_token, chat_stream(port, model, chat, 8).first_token


def _streams(port: int, model: str, n: int, tokens: int) -> float:
    """tokens/s of n chats streamed at once (started together)."""
    done, barrier = [], threading.Barrier(n + 1)

    def run(i):
        barrier.wait()
        done.append(chat_stream(port, model, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], tokens))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return sum(s.tokens for s in done) / (time.perf_counter() - start)


def _measure(server: str, port: int, passages: list[str], tokens: int, rounds: int) -> list[Row]:
    """Every row of one running server (see the module doc)."""
    model = _model_id(port)
    _streams(port, model, 1, 4)   # warm: the first request loads and switches what it must
    firsts = [_prefix_round(port, model, p) for p in passages]
    one, two = statistics.median(f[0] for f in firsts), statistics.median(f[1] for f in firsts)
    rows = [Row(server, "prefix: turn 1 first token", one, "s"), Row(server, "prefix: turn 2 first token", two, "s"),
            Row(server, "turn 1 / turn 2", one / two, "x", one / two, TARGETS["turn 1 / turn 2"])]
    speed = {n: statistics.median(_streams(port, model, n, tokens) for _ in range(rounds)) for n in STREAMS}
    for n in STREAMS:
        rows.append(Row(server, f"{n} streams", speed[n], "tokens/s", speed[n] / speed[1],
                        TARGETS.get(f"{n} streams / 1")))
    return rows


def _ours(model: str, slots: int) -> list[str]:
    """gatherlens serve (its torch threads: OMP_NUM_THREADS, set by server_process)."""
    return [sys.executable, "-m", "gatherlens", "serve", "--model", model, "--quantized", "--slots", str(slots)]


def _llama(python: str, gguf, threads: int) -> list[str]:
    return [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--n_ctx", "4096", "--verbose", "False"]


def _peer(python: str, gguf, threads: int, passages: list[str], tokens: int, rounds: int) -> list[Row]:
    """llama_cpp.server's rows, or none with a note when it cannot serve (a build for another CPU dies with
    SIGILL at its first request: the connection is refused then)."""
    port = free_port()
    try:
        with server_process([*_llama(python, gguf, threads), "--port", str(port)], threads, port):
            return _measure("llama.cpp", port, passages, tokens, rounds)
    except (click.ClickException, OSError) as e:
        click.echo(f"llama.cpp rows skipped: its server failed ({getattr(e, 'message', e)})", err=True)
        return []


def _print(rows: list[Row]) -> None:
    for r in rows:
        target = "" if r.target is None else f" (target {r.target})"
        value = f"x{r.ratio:.2f}" if r.unit == "x" else f"{r.value:.3f} {r.unit}" + (
            "" if r.ratio is None else f"  x{r.ratio:.2f} of 1 stream")
        click.echo(f"{r.server:11} {r.case:28} {value}{target}")


@click.command("serve")
@click.option("--model", default="smollm2", show_default=True, help="A GGUF model (a name or a .gguf path).")
@click.option("--threads", default=2, show_default=True, type=Int(1, 256), help="Threads of each server.")
@click.option("--slots", default=4, show_default=True, type=Int(1, 64), help="gatherlens serve --slots.")
@click.option("--rounds", default=3, show_default=True, type=Int(1, 100), help="Rounds (medians).")
@click.option("--tokens", default=64, show_default=True, type=Int(1, 4096), help="Tokens a stream asks for.")
@click.option("--chars", default=6000, show_default=True, type=Int(100, 10**6),
              help="Characters of the prefix-reuse passage (~1,500 tokens at 6,000).")
@click.option("--llama-python", "llama_python_path", default=None,
              help="An interpreter with llama-cpp-python[server] (default: $GATHERLENS_LLAMA_PYTHON; else skipped).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the rows here.")
@click.option("--force", is_flag=True, help="Overwrite the --json file.")
def command(model, threads, slots, rounds, tokens, chars, llama_python_path, json_path, force):
    """Prefix reuse (first-token time, turn 1 / turn 2) and 1, 2, 4 parallel streams of `gatherlens serve`,
    llama_cpp.server beside it; ratios printed."""
    from pathlib import Path

    path = check_json_path(Path(json_path), force) if json_path else None
    gguf = gguf_of(model)
    if gguf is None:
        raise click.BadParameter(f"{model!r} is not a GGUF model: the server runs it --quantized", param_hint="--model")
    python, note = llama_python(llama_python_path)
    passages = _passages(rounds, chars)
    port = free_port()
    with server_process([*_ours(model, slots), "--port", str(port)], threads, port):
        rows = _measure("gatherlens", port, passages, tokens, rounds)
    _print(rows)
    if python is None:
        click.echo(note, err=True)
    else:
        peer = _peer(python, gguf, threads, passages, tokens, rounds)
        _print(peer)
        rows += peer
    if path is not None:
        meta = {"model": model, "gguf": str(gguf), "threads": threads, "slots": slots, "rounds": rounds,
                "tokens": tokens, "chars": chars, "llama": python is not None}
        write_results(path, "serve", meta, rows, force=force)
