"""`gatherlens serve`: the explain report as a live page, with the model kept warm.

    >>> from gatherlens.serve import ServeSettings, create_app
    >>> app = create_app(ServeSettings(model="smollm2"))       # a Starlette (ASGI) app
    >>> import uvicorn; uvicorn.run(app, host="127.0.0.1", port=8765)

The page is the `explain` report's page (the same template and script), with a text box, a
model switch and top-k on/off, and a panel that decodes token by token with sparse decoding.
It calls the JSON API: GET /api/explain (the story of story.json, plus `tokens`, and on request
the page's data and HTML) and GET /api/generate (server-sent events, one per decode step).

- settings.py: the limits and defaults (text length, generated tokens, page size, budget).
- params.py: query parameters -> checked values, or a 400 naming the argument and its range.
- pool.py: the loaded models, kept warm, and the one lock every model call takes; a model run
  from its file in place is checked per request and loaded again when its file changed.
- memory.py: the memory a request freed, given back to the system after it (malloc_trim).
- decode.py: decoding step by step with sparse decoding, as plain data per step.
- app.py: the routes, security headers (Content-Security-Policy, allowed hosts), error bodies.
- limits.py: the bounded queue of model requests (503 with Retry-After) and the 414 for a long target.
- startup.py: what `gatherlens serve` checks before the server starts (settings, port, model).
- runs.py, attention_api.py: the kept runs of the texts and GET /api/attention (a long text's window,
  dense / top-k / sparse for one query) answered from them.
- step_detail.py: a generation step's dense weight on the pages it read; the dense choice of every step.
- openai_api.py, openai_params.py: the OpenAI API (/v1/models, /v1/chat/completions, /v1/completions), its
  bodies checked into OpenAI's error shape; engine.py: up to `slots` generations decoding together, a bounded
  queue; stop_text.py: stop strings over streamed text.
"""
from gatherlens.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app", "http_protocol", "prepared"]


def create_app(settings: ServeSettings | None = None, **kw):
    """The ASGI app (see gatherlens.serve.app.create_app)."""
    from gatherlens.serve.app import create_app as make

    return make(settings, **kw)


def http_protocol(settings: ServeSettings) -> type:
    """uvicorn's HTTP protocol for the app (see gatherlens.serve.app.http_protocol)."""
    from gatherlens.serve.app import http_protocol as protocol

    return protocol(settings)


def prepared(settings: ServeSettings, load=None):
    """Check and load before the server starts (see gatherlens.serve.startup.prepared)."""
    from gatherlens.serve.startup import prepared as prepare

    return prepare(settings, load)
