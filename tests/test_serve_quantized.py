"""`gatherlens serve --quantized`: the live page runs the model from its GGUF blocks, and its
embedding section is the quantized row gather; a model without blocks is one clear line."""
from __future__ import annotations

import socket

import pytest

pytest.importorskip("starlette")
from click.testing import CliRunner  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.errors import GatherLensError, GatherValueError  # noqa: E402
from gatherlens.serve import ServeSettings, create_app, prepared  # noqa: E402
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
    settings = ServeSettings(model="smollm2", quantized=True, port=free_port())
    try:
        with prepared(settings) as loader:
            app = create_app(settings, loader=loader)
    except GatherLensError as e:  # the model package is not installed
        pytest.skip(str(e))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        story = c.get("/api/explain", params={"text": "The cat sat on the mat"}).json()
        page = c.get("/", params={"text": "The cat sat on the mat"}).text
    assert story["quantized"] is True
    assert story["embeddings"][0]["qtype"] == "Q8_0" and story["embeddings"][0]["row_bytes"] == 612
    assert "Q8_0" in page
