"""`gatherlens serve`: the explain report as a live page on this machine.

    gatherlens serve                                  # SmolLM2, http://127.0.0.1:8765
    gatherlens serve --model minilm --port 9000
    gatherlens serve --model ./my-hf-model            # a local folder (offered beside the others)
    gatherlens serve --quantized --api-key secret     # OpenAI clients: base_url http://127.0.0.1:8765/v1

Checks the settings, the port and the model before the server starts (each failure is one
`Error:` line; a busy port before the model loads), then keeps the model warm; the page updates
as you type, switches model and top-k, and generates with sparse decoding, showing which pages
each step read; with --sparse-prefill (or its checkbox) it also shows which key blocks each query
block of a sparse prefill gathered. Binds 127.0.0.1 by default: any other host exposes the model (and your
machine's CPU) to the network, which is said once on start. Ctrl-C stops it.

The same port speaks the OpenAI API (/v1/models, /v1/chat/completions, /v1/completions: serve/openai_api.py)
for the served model: up to --slots requests generate together, more wait in a bounded queue, then 503.
--api-key makes /v1/* ask for "Authorization: Bearer KEY" (the explorer's page and /api/* stay as they are).
"""
from __future__ import annotations

import os

import click

from gatherlens.commands.params import Int, check_model, quantized_option, sparse_prefill_option
from gatherlens.i18n import LANGS

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command("serve")
@click.option("--model", default="smollm2", show_default=True,
              help="smollm2, minilm, or a path to a local Hugging Face model folder or .gguf file "
                   "(the page can switch between it and the two known models).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but 127.0.0.1 / localhost exposes the model.")
@click.option("--port", type=Int(1, 65535), default=8765, show_default=True)
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Language of the page.")
@click.option("--max-new-tokens", "max_new", type=Int(1, 512), default=64,
              show_default=True, help="Most tokens one generation may produce.")
@quantized_option("The embedding section then draws the quantized row gather.")
@sparse_prefill_option("The page opens with its sparse-prefill map on: a section shows the key blocks each query "
                       "block gathered (a checkbox on the page switches it).")
@click.option("--slots", type=Int(1, 64), default=4, show_default=True,
              help="OpenAI API requests generating together (decoded in one batched step where the model allows).")
@click.option("--api-key", "api_key", default=None, envvar="GATHERLENS_API_KEY",
              help="Require 'Authorization: Bearer KEY' on the OpenAI API (/v1/*); also $GATHERLENS_API_KEY.")
def serve(model, host, port, lang, max_new, quantized, sparse_prefill=False, slots=4, api_key=None):
    """Serve the live explorer: type text, see every gather; generate with sparse decoding."""
    # Before torch loads OpenMP: idle threads sleep instead of spinning (see commands/explain.py).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from gatherlens.serve import ServeSettings, create_app, http_protocol, prepared
    from gatherlens.serve.openai_api import model_id

    if not host.strip():
        raise click.BadParameter("the host is empty; give an address of this machine, like 127.0.0.1",
                                 param_hint="--host")
    check_model(model)

    if host not in LOOPBACK:
        click.echo(f"warning: listening on {host}: anyone who can reach this address can run the "
                   f"model on your machine and read what it is given. Use --host 127.0.0.1 to keep "
                   f"it local.", err=True)
    if api_key is not None and not api_key.strip():
        raise click.BadParameter("the key is empty", param_hint="--api-key")
    settings = ServeSettings(model=model, host=host, port=port, lang=lang, max_new_tokens=max_new,
                             default_new_tokens=min(24, max_new), quantized=quantized, sparse_prefill=sparse_prefill,
                             slots=slots, api_key=api_key)
    url = f"http://{_url_host(host)}:{port}/"
    click.echo(f"loading {model} and serving {url}  (Ctrl-C stops)", err=True)
    with prepared(settings) as loader:   # settings, port and model checked here: errors are one line
        app = create_app(settings, loader=loader)
    click.echo(f"OpenAI API at {url}v1 (model {model_id(model)!r}, {slots} slots"
               f"{', API key required' if api_key else ''})", err=True)
    click.echo(f"serving {url}", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=http_protocol(settings))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
