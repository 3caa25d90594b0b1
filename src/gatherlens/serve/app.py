"""The Starlette app of `gatherlens serve`: the page, the JSON API, the generation stream.

    GET /                 the live page (the explain report's page, with a text box)
    GET /api/explain      ?text=&model=&k=&topk=&layer=&head=&query=&lang=  -> the story (JSON)
                          (&explore=1 adds the page's data, &html=1 the page itself, &prefill=1 a sparse
                          prefill's block maps: the page's prefill section; default: serve --sparse-prefill)
    GET /api/generate     ?text=&model=&max_new=&page_size=&budget=  -> server-sent events
    GET /api/heads        ?text=&model=&k=&topk=&lang=  -> every layer and head: tag, kept share, map
    GET /api/attention    ?text=&model=&k=&topk=&layer=&head=&query=&lang=  -> one head's rows around
                          the query and the dense / top-k / sparse figure, from the kept run (serve/runs.py)
    GET /api/sample       ?text=&model=&k=&topk=&temperature=&top_k=&top_p=&min_p=&seed=&lang=  -> one draw of the
                          sampler from the text's last logits row and its picture (serve/sample_api.py)
    GET /api/chat         ?messages=<JSON>&model=&max_new=&budget=&page_size=&temperature=&top_k=&top_p=&min_p=&seed=
                          -> server-sent events: each token with its candidates and the pages it read
    GET /api/health       the loaded models and whether one is running
    GET /v1/models, POST /v1/chat/completions, POST /v1/completions
                          the OpenAI API (serve/openai_api.py): answers and errors in OpenAI's shapes, up to
                          settings.slots generations decoding together (serve/engine.py), --api-key

Every answer carries a Content-Security-Policy (the page may run only its own scripts and talk
only to this server) and refuses other Host headers. A bad argument is a 400 with
{"error": "..."} naming it and its valid range (the page, GET /, answers a small HTML page with
the same line); a model whose file changed and cannot be loaded again (serve/pool.py) is a 503
with Retry-After; an unexpected failure is a 500 with one line, and the next request is served as usual.
"""
from __future__ import annotations

import contextlib
import html
import json
import time
import traceback

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gatherlens.errors import GatherLensError
from gatherlens.models.files.watch import ModelFileChanged
from gatherlens.serve.attention_api import attention_body, run_k_param
from gatherlens.serve.heads import heads_body
from gatherlens.serve.engine import Engine
from gatherlens.serve.limits import RequestLimits, protocol_class
from gatherlens.serve.openai_api import chat_completions, completions, error_response, model, models
from gatherlens.serve.openai_params import APIError
from gatherlens.serve.params import chat_messages, explain_params, generate_params, sampling_params
from gatherlens.memory import release_memory
from gatherlens.serve.pool import ModelPool
from gatherlens.serve.runs import RunCache, run_key
from gatherlens.serve.settings import ServeSettings

__all__ = ["create_app", "API_POLICY", "MODEL_PATHS", "http_protocol"]

API_POLICY = "default-src 'none'; frame-ancestors 'none'"
MODEL_PATHS = ("/", "/api/explain", "/api/generate", "/api/heads", "/api/attention", "/api/sample", "/api/chat")   # the routes that wait for the model (limits.py)
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=_headers(API_POLICY))


def _headers(policy: str) -> dict:
    return {**HEADERS, "Content-Security-Policy": policy}


def _explain(lm, p, settings: ServeSettings, runs: RunCache | None = None) -> dict:
    """The story of one request (runs in a worker thread, with the model's lock held); its run is
    kept in `runs` for the page's later GET /api/attention."""
    from gatherlens.report.build import build_report, page_data, story_data
    from gatherlens.report.collect import collect

    story = collect(lm, p.text, top_k=p.k if p.topk else None, layer=p.layer, head=p.head,
                    query=p.query, max_tokens=settings.max_tokens,
                    prefill=settings.prefill_config() if p.prefill else None)
    if runs is not None:
        runs.put(run_key(p), story.tensors, story.shown_tokens)
    body = story_data(story)
    live = {**settings.live(p.model, p.topk, p.k, p.prefill), "chat": _has_chat(lm)}
    if p.explore:
        body["page"] = page_data(story, p.lang, live)
    if p.html:
        report = build_report(story, lang=p.lang, live=live)
        body["html"], body["csp"] = report.html, report.csp
    return body


def _has_chat(lm) -> bool:
    """True when the model has a chat template (the live page then offers its chat)."""
    from gatherlens.errors import GatherValueError
    from gatherlens.models.runtime.chat import chat_template_of

    try:
        chat_template_of(lm)
    except GatherValueError:
        return False
    return bool(getattr(lm, "is_causal", False))


async def explain(request: Request) -> Response:
    """GET /api/explain: the same story as story.json, with `tokens`."""
    pool: ModelPool = request.app.state.pool
    p = explain_params(request.query_params, pool.settings)
    async with pool.using(p.model) as lm:
        body = await pool.run(_explain, lm, p, pool.settings, request.app.state.runs)
    return JSONResponse(body, headers=_headers(API_POLICY))


async def heads(request: Request) -> Response:
    """GET /api/heads: the head gallery's numbers (serve/heads.py), checked like /api/explain."""
    pool: ModelPool = request.app.state.pool
    p = explain_params(request.query_params, pool.settings)
    async with pool.using(p.model) as lm:
        body = await pool.run(heads_body, lm, p, pool.settings)
    return JSONResponse(body, headers=_headers(API_POLICY))


async def attention(request: Request) -> Response:
    """GET /api/attention: one head's window and the dense / top-k / sparse figure (attention_api.py)."""
    pool: ModelPool = request.app.state.pool
    p = explain_params(request.query_params, pool.settings)
    run_k = run_k_param(request.query_params, p, pool.settings)
    async with pool.using(p.model) as lm:
        body = await pool.run(attention_body, lm, p, pool.settings, request.app.state.runs, run_k)
    return JSONResponse(body, headers=_headers(API_POLICY))


async def page(request: Request) -> Response:
    """GET /: the live page for the text in the query (or the default one)."""
    pool: ModelPool = request.app.state.pool
    p = explain_params({**request.query_params, "html": "1"}, pool.settings)
    async with pool.using(p.model) as lm:
        body = await pool.run(_explain, lm, p, pool.settings, request.app.state.runs)
    return HTMLResponse(body["html"], headers=_headers(body["csp"]))


async def _stream(request: Request, pool: ModelPool, model: str, make_steps):
    """Server-sent events of one generation (`make_steps(lm)`: its events); the model is freed when the client
    goes away. A bad request or a model file that changed (models/files/watch.py) ends it with a "failure" event."""
    try:
        async with pool.using(model) as lm:
            steps = make_steps(lm)
            try:
                while True:
                    if await request.is_disconnected():
                        pool.cancelled += 1
                        return
                    item = await anyio.to_thread.run_sync(next, steps, None)
                    if item is None:
                        pool.served += 1
                        return
                    yield {"event": item[0], "data": json.dumps(item[1], ensure_ascii=False)}
            except anyio.get_cancelled_exc_class():
                pool.cancelled += 1
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(steps.close)   # back to dense decoding
                    await anyio.to_thread.run_sync(release_memory)  # what it freed, back (gatherlens/memory.py)
    except GatherLensError as e:
        yield {"event": "failure", "data": json.dumps({"error": str(e)})}


async def generate(request: Request) -> Response:
    """GET /api/generate: one event per decode step (start, step..., done; failure on error)."""
    from gatherlens.serve.decode import decode_steps

    pool: ModelPool = request.app.state.pool
    p = generate_params(request.query_params, pool.settings)
    steps = lambda lm: decode_steps(lm, p.text, p.max_new, p.budget, p.page_size, pool.settings.max_tokens,  # noqa: E731
                                    detail=True)
    return EventSourceResponse(_stream(request, pool, p.model, steps), ping=10, headers=_headers(API_POLICY))


async def chat(request: Request) -> Response:
    """GET /api/chat: the live page's chat through the model's chat template, sampled (serve/decode.chat_steps):
    start (the first token), step..., done; failure on error."""
    from gatherlens.serve.decode import chat_steps

    pool: ModelPool = request.app.state.pool
    q = request.query_params
    p, config, messages = generate_params({**q, "text": "-"}, pool.settings), sampling_params(q), chat_messages(q)
    steps = lambda lm: chat_steps(lm, messages, config, p.max_new, p.budget, p.page_size,  # noqa: E731
                                  pool.settings.max_tokens)
    return EventSourceResponse(_stream(request, pool, p.model, steps), ping=10, headers=_headers(API_POLICY))


async def sample(request: Request) -> Response:
    """GET /api/sample: one draw of the sampler from the text's last logits row, and its picture (sample_api.py)."""
    from gatherlens.serve.sample_api import sample_body

    pool: ModelPool = request.app.state.pool
    p, config = explain_params(request.query_params, pool.settings), sampling_params(request.query_params)
    async with pool.using(p.model) as lm:
        body = await pool.run(sample_body, lm, p, pool.settings, request.app.state.runs, config)
    return JSONResponse(body, headers=_headers(API_POLICY))


async def health(request: Request) -> Response:
    state = request.app.state
    return JSONResponse({**state.pool.status(), "runs": state.runs.status(),
                         "api": {**state.engine.status(), "runner": state.engine.runner_status()}},
                        headers=_headers(API_POLICY))


def _answer(request: Request, message: str, status: int) -> Response:
    """An error as the asker reads it: the page (GET /) as a small HTML page, the API as JSON (the OpenAI
    API, /v1/*, in OpenAI's shape)."""
    if request.url.path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return error_response(APIError(status, message, kind=kind))
    if request.url.path != "/":
        return _error(message, status)
    title = {400: "bad request", 503: "model unavailable"}.get(status, "internal error")
    body = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>gatherlens: {title}</title>'
            f'</head>\n<body><h1>gatherlens: {title} ({status})</h1>\n<p>{html.escape(message)}</p>\n'
            f'<p><a href="/">back to the default page</a></p></body></html>\n')
    return HTMLResponse(body, status_code=status, headers=_headers(API_POLICY))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own answers (404 no such route, 405 a method it does not take): the OpenAI API's in its
    error shape, the rest as Starlette gives them."""
    if request.url.path.startswith("/v1/"):
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       code="unknown_url" if exc.status_code == 404 else None))
    return Response(exc.detail, status_code=exc.status_code, headers=exc.headers)


async def _bad_input(request: Request, exc: GatherLensError) -> Response:
    return _answer(request, str(exc), 400)


async def _model_changed(request: Request, exc: GatherLensError) -> Response:
    """The model's file changed under it (serve/pool.py): 503, try again once the file is whole."""
    answer = _answer(request, str(exc), 503)
    answer.headers["Retry-After"] = str(request.app.state.pool.settings.retry_after)
    return answer


async def _failure(request: Request, exc: Exception) -> Response:
    """An unexpected error: one line to the client, the traceback on the server's stderr."""
    traceback.print_exception(type(exc), exc, exc.__traceback__)
    return _answer(request, f"internal error ({type(exc).__name__}); the server keeps running", 500)


def http_protocol(settings: ServeSettings) -> type:
    """uvicorn's HTTP protocol for this app: 414 and 400 answered with the app's headers (limits.py)."""
    return protocol_class(settings, _headers(API_POLICY))


def create_app(settings: ServeSettings | None = None, loader=None, warm: bool = True) -> Starlette:
    """The app. loader(name) -> LoadedModel (default gatherlens.models.load); warm: load the
    starting model before the first request."""
    settings = settings or ServeSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state.runs = runs = RunCache(settings.run_cache_bytes)
        app.state.pool = pool = ModelPool(settings, loader=loader, on_drop=runs.forget)
        app.state.engine, app.state.templates, app.state.started = Engine(pool, settings), {}, int(time.time())
        if warm:
            async with pool.using(settings.model):
                pass
        async with anyio.create_task_group() as group:   # the API's engine runs while the app does
            group.start_soon(app.state.engine.run)
            yield
            group.cancel_scope.cancel()

    return Starlette(
        routes=[Route("/", page), Route("/api/explain", explain), Route("/api/generate", generate),
                Route("/api/heads", heads), Route("/api/attention", attention), Route("/api/health", health),
                Route("/api/sample", sample), Route("/api/chat", chat),
                Route("/v1/models", models), Route("/v1/models/{model:path}", model),
                Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"])],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts),
                    Middleware(RequestLimits, settings=settings, headers=_headers(API_POLICY), paths=MODEL_PATHS)],
        exception_handlers={ModelFileChanged: _model_changed, GatherLensError: _bad_input, Exception: _failure,
                            HTTPException: _http_error},
        lifespan=lifespan,
    )
