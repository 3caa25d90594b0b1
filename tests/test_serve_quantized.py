"""`gatherlens serve --quantized`: the live page runs the model from its GGUF blocks, and its
embedding section is the quantized row gather; a model without blocks is one clear line."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("starlette")
from click.testing import CliRunner  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.serve import ServeSettings, create_app, prepared  # noqa: E402
from installed import installed  # noqa: E402
from tiny_models import make_tiny_llama  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_folder_has_no_blocks_to_run_from(tmp_path):
    folder = str(make_tiny_llama(tmp_path / "tiny"))
    with pytest.raises(GatherValueError, match="--quantized"):
        with prepared(ServeSettings(model=folder, quantized=True, port=free_port()),
                      load=lambda *a, **k: pytest.fail("the model load ran")):
            pass


def test_the_command_says_it_in_one_line(tmp_path, monkeypatch):
    import uvicorn

    from gatherlens.cli import main

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn ran"))
    folder = str(make_tiny_llama(tmp_path / "tiny"))
    res = CliRunner().invoke(main, ["serve", "--model", folder, "--quantized", "--port", str(free_port())])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "--quantized" in res.output.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_live_page_runs_from_the_blocks():
    installed("smollm2")  # skips only when the model package is missing
    settings = ServeSettings(model="smollm2", quantized=True, port=free_port())
    with prepared(settings) as loader:
        app = create_app(settings, loader=loader)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        story = c.get("/api/explain", params={"text": "The cat sat on the mat"}).json()
        page = c.get("/", params={"text": "The cat sat on the mat"}).text
    assert story["quantized"] is True
    assert story["embeddings"][0]["qtype"] == "Q8_0" and story["embeddings"][0]["row_bytes"] == 612
    assert "Q8_0" in page


@pytest.fixture(scope="module")
def quantized_lm():
    from gatherlens.models import load

    installed("smollm2")  # skips only when the model package is missing
    return load("smollm2", quantized=True)


@pytest.mark.slow
def test_the_dense_choice_is_the_steps_own_path_with_the_budget_lifted(quantized_lm):
    """The live page's "dense would have chosen" replays the steps' own path (one-row products,
    the paged cache) with every key read: no difference at step 0 (dense already) nor at a budget
    covering the cache (before: one forward pass over the whole text, which a quantized model
    rounds differently, claimed differences there)."""
    from gatherlens.serve.decode import decode_steps

    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    for budget in (4096, 16):
        events = list(decode_steps(quantized_lm, text, 16, budget, 4, detail=True))
        dense = events[-1][1]["dense"]
        assert len(dense) == 16 and dense[0]["same"]
        if budget == 4096:
            assert all(d["same"] for d in dense), [d["step"] for d in dense if not d["same"]]


@pytest.mark.slow
def test_a_changed_model_file_is_loaded_again_or_refused(tmp_path, monkeypatch):
    """`serve --quantized` checks its GGUF per request: a file changed during a request drops that
    answer (503), the next request loads the file again; a file cut short is refused with 503 and
    one line (the stream: a "failure" event) until it is whole again; its kept runs are forgotten."""
    import os
    import shutil

    import gatherlens.report.collect as collect_module
    source = installed("smollm2")
    path = tmp_path / "m.gguf"
    shutil.copyfile(source, path)
    settings = ServeSettings(model=str(path), quantized=True, port=free_port())
    with prepared(settings) as loader:
        app = create_app(settings, loader=loader)
    q = {"text": "The cat sat on the mat"}
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        first = c.get("/api/explain", params=q)
        assert first.status_code == 200 and c.get("/api/health").json()["runs"]["runs"] == 1
        real = collect_module.collect

        def touched(*a, **k):                     # the file rewritten while the request runs
            story = real(*a, **k)
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            return story

        monkeypatch.setattr(collect_module, "collect", touched)
        r = c.get("/api/explain", params=q)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "changed while in use (it was rewritten; this request's answer is dropped" in r.json()["error"]
        monkeypatch.setattr(collect_module, "collect", real)
        again = c.get("/api/explain", params=q)
        assert again.status_code == 200 and again.json() == first.json()
        health = c.get("/api/health").json()
        assert health["reloaded"] == 1 and health["runs"]["runs"] == 1   # the old run forgotten, the new kept

        os.truncate(path, 4096)                   # cut short between two requests: refused, not a crash
        r = c.get("/api/explain", params=q)
        assert r.status_code == 503 and list(r.json()) == ["error"]
        said = r.json()["error"]
        assert said.startswith(f"the model file {str(path)!r} changed while in use (its size went from")
        assert "loading it again failed" in said and "\n" not in said
        stream = c.get("/api/generate", params=q).text
        assert "event: failure" in stream and "changed while in use" in stream
        health = c.get("/api/health").json()
        assert health["unavailable"] == [str(path)] and health["runs"]["runs"] == 0

        shutil.copyfile(source, path)             # whole again: loaded again
        back = c.get("/api/explain", params=q)
        assert back.status_code == 200 and back.json() == first.json()
        health = c.get("/api/health").json()
        assert health["reloaded"] == 2 and health["unavailable"] == []


def test_each_model_request_gives_the_memory_it_freed_back(tmp_path, monkeypatch):
    """The server's RSS stays the model plus its kept runs: after every model request (explain,
    a generation's stream) the heap's free pages go back to the system (gatherlens/memory.py)."""
    import platform

    import gatherlens.serve.app as app_module
    import gatherlens.serve.pool as pool_module
    from gatherlens.memory import release_memory

    calls = []
    for module in (app_module, pool_module):
        monkeypatch.setattr(module, "release_memory", lambda: calls.append(1) or True)
    app = create_app(ServeSettings(model=str(make_tiny_llama(tmp_path / "tiny"))))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.get("/api/explain", params={"text": "The cat sat"}).status_code == 200 and len(calls) == 1
        stream = c.get("/api/generate", params={"text": "The cat sat", "max_new": 2}).text
        assert "event: done" in stream and len(calls) == 2
    assert release_memory() is (platform.libc_ver()[0] == "glibc")
