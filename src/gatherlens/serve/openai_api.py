"""OpenAI-compatible endpoints on `gatherlens serve`: GET /v1/models, POST /v1/chat/completions, POST /v1/completions.

    >>> from openai import OpenAI                 # GET /v1/models/{model} too
    >>> client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="unused")
    >>> client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}]).choices[0]
    >>> for chunk in client.chat.completions.create(model="smollm2", messages=..., stream=True): ...

Answers follow OpenAI's API reference field by field: `id`, `object` ("chat.completion",
"chat.completion.chunk", "text_completion"), `created`, `model`, `system_fingerprint`, `choices`
(`index`, `message` / `delta` / `text`, `logprobs` null, `finish_reason` "stop" or "length") and `usage`;
`stream: true` sends server-sent events, one `data: {chunk}` each, ending with `data: [DONE]`
(`stream_options.include_usage` adds a last chunk with `usage`). A chat goes through the model's own
chat template (models/runtime/chat.py) and stops at its end of turn; `stop` strings end it too (cut
out of the text, as OpenAI does). Errors are OpenAI's {"error": {"message", "type", "param", "code"}}:
400 a bad body (openai_params.py), 401 without the `--api-key` (Bearer), 404 an unknown model, 413 a body
over the limit, 503 with Retry-After when every slot runs and the queue is full (serve/engine.py). A
client that goes away (a closed stream, a dropped connection) frees its slot at once.
"""
from __future__ import annotations

import hmac
import json
import time
import uuid
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gatherlens.errors import GatherLensError
from gatherlens.serve.engine import Busy
from gatherlens.serve.openai_params import APIError, Body, chat_body, completion_body
from gatherlens.serve.stop_text import StopText

__all__ = ["models", "model", "chat_completions", "completions", "error_response", "model_id", "FINGERPRINT"]

FINGERPRINT = "fp_gatherlens"


def model_id(model: str) -> str:
    """The id /v1/models lists for `--model`: a known name as is, a path by its file or folder name."""
    return Path(model).name if ("/" in model or model.endswith(".gguf")) else model


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _authorize(request: Request) -> None:
    key = request.app.state.pool.settings.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given[:7].lower() == "bearer " else ""
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise APIError(401, "Incorrect API key provided: give it as the header 'Authorization: Bearer <key>' "
                            "(the key gatherlens serve was started with, --api-key)", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


def _check_model(request: Request, name: str) -> None:
    settings = request.app.state.pool.settings
    if name not in (settings.model, model_id(settings.model)):
        raise APIError(404, f"The model `{name}` does not exist: this server serves `{model_id(settings.model)}` "
                            f"(GET /v1/models)", param="model", code="model_not_found")


async def _json(request: Request) -> dict:
    """The body as JSON, read up to the settings' limit (413 past it, 400 when it is not JSON)."""
    limit, data = request.app.state.pool.settings.max_body_bytes, bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise APIError(413, f"the request body is over {limit:,} bytes")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})") from None


async def models(request: Request) -> Response:
    """GET /v1/models: the one served model."""
    try:
        _authorize(request)
    except APIError as e:
        return error_response(e)
    settings = request.app.state.pool.settings
    return JSONResponse({"object": "list", "data": [{"id": model_id(settings.model), "object": "model",
                                                     "created": request.app.state.started, "owned_by": "gatherlens"}]})


async def model(request: Request) -> Response:
    """GET /v1/models/{model}: the served model, or 404."""
    try:
        _authorize(request)
        _check_model(request, request.path_params["model"])
    except APIError as e:
        return error_response(e)
    settings = request.app.state.pool.settings
    return JSONResponse({"id": model_id(settings.model), "object": "model", "created": request.app.state.started,
                         "owned_by": "gatherlens"})


async def _served_model(request: Request):
    """The served LoadedModel (loaded under the pool's lock if it is not loaded now)."""
    pool = request.app.state.pool
    lm = pool.models.get(pool.settings.model)
    if lm is None:
        async with pool.using(pool.settings.model) as lm:
            pass
    return lm


def _prompt_ids(lm, body: Body, templates: dict) -> tuple[list[int], frozenset | None]:
    """The prompt's ids and the stop ids (a chat: its template's; a completion: the model's EOS)."""
    if body.messages is None:
        ids = list(body.prompt) if isinstance(body.prompt, tuple) else lm.encode(body.prompt)[0].tolist()
        return ids, None
    from gatherlens.models.runtime.chat import chat_prompt, chat_template_of

    template = templates.get(id(lm))
    if template is None:
        template = templates[id(lm)] = chat_template_of(lm)
    return chat_prompt(lm, list(body.messages), template)[0].tolist(), template.stop_ids


def _ask(lm, body: Body, ids: list[int], stop, settings):
    """The engine's Ask: max_tokens checked against the model's positions (OpenAI's 400 wording)."""
    from gatherlens.models.runtime.slots import Ask

    context = getattr(lm.config, "max_position_embeddings", None) or (len(ids) + settings.api_max_tokens)
    room = context - len(ids)
    most = body.max_tokens if body.max_tokens is not None else min(settings.api_max_tokens, room)
    if most > room or room < 1:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                            f"{len(ids) + most} tokens ({len(ids)} in the messages, {most} in the completion). "
                            f"Please reduce the length of the messages or completion.",
                       param="messages" if body.messages is not None else "prompt", code="context_length_exceeded")
    return Ask(tuple(ids), most, body.sampling, stop)


async def _start(request: Request, kind: str):
    """Check the request and hand it to the engine: (body, job, prompt token count)."""
    _authorize(request)
    raw, app = await _json(request), request.app.state
    if isinstance(raw, dict) and isinstance(raw.get("model"), str):
        _check_model(request, raw["model"])   # 404 before the body's other fields are read
    lm = await _served_model(request)
    body = chat_body(raw) if kind == "chat" else completion_body(raw, lm.config.vocab_size)
    _check_model(request, body.model)
    try:
        ids, stop = await anyio.to_thread.run_sync(_prompt_ids, lm, body, app.templates)
    except GatherLensError as e:
        raise APIError(400, str(e), param="messages" if kind == "chat" else "prompt") from None
    ask = _ask(lm, body, ids, stop, app.pool.settings)
    try:
        job = app.engine.submit(ask)
    except Busy as e:
        raise APIError(503, str(e), kind="server_error", code="server_busy",
                       headers={"Retry-After": str(app.pool.settings.retry_after)}) from None
    return body, job, len(ids)


def _failure(error: Exception) -> APIError:
    """The API error of a job the engine ended: 503 for a model file that changed, 400 for a request the model
    refuses, 500 (one line; the traceback on the server's stderr) for anything else."""
    from gatherlens.models.files.watch import ModelFileChanged

    if isinstance(error, ModelFileChanged):
        return APIError(503, str(error), kind="server_error", code="model_unavailable")
    if isinstance(error, GatherLensError):
        return APIError(400, str(error))
    return APIError(500, f"internal error ({type(error).__name__}); the server keeps running", kind="server_error")


class _Answer:
    """What one request generated so far: text (stop strings cut out), tokens, why it ended."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.tokens, self.reason = StopText(stops), 0, None

    def take(self, event) -> str:
        """The text an engine event adds (what may be sent now); sets `reason` when it ends."""
        kind, data = event
        if kind == "token":
            self.tokens += 1
            piece, stopped = self.stops.push(data[1])
            if stopped:
                self.reason = "stop"
            return piece
        if kind == "error":
            raise _failure(data)
        self.reason = "stop" if data == "stop" else "length"
        return self.stops.flush()


def _usage(prompt: int, answer: _Answer) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": answer.tokens, "total_tokens": prompt + answer.tokens}


def _head(kind: str, chunk: bool = False) -> dict:
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    obj = {"chat": "chat.completion", "text": "text_completion"}[kind] + (".chunk" if chunk and kind == "chat" else "")
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": obj, "created": int(time.time())}


def _choice(kind: str, text: str | None, reason: str | None, delta: dict | None = None) -> dict:
    if kind == "text":
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    if delta is not None:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "logprobs": None,
            "finish_reason": reason}


async def _whole(request: Request, kind: str, body: Body, job, prompt: int) -> Response:
    """A non-streamed answer; the job is cancelled when its client goes away before it is done."""
    answer, text = _Answer(body.stop), []

    async def watch(scope):
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel()
        scope.cancel()

    failure = None
    async with anyio.create_task_group() as group:
        group.start_soon(watch, group.cancel_scope)
        try:
            async with job.events() as events:
                async for event in events:
                    text.append(answer.take(event))
                    if answer.reason is not None:
                        break
        except APIError as e:   # the job ended in an error: answered below, outside the task group
            failure = e
        group.cancel_scope.cancel()
    job.cancel()   # a stop string ended it early: the slot goes now
    if failure is not None:
        raise failure
    if answer.reason is None:
        return Response(status_code=499)   # the client is gone; nobody reads this
    head = {**_head(kind), "model": body.model, "system_fingerprint": FINGERPRINT}
    return JSONResponse({**head, "choices": [_choice(kind, "".join(text), answer.reason)],
                         "usage": _usage(prompt, answer)})


def _sse(data) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _chunks(kind: str, body: Body, job, prompt: int):
    """The stream's events: chunks of the answer as it grows, the last with finish_reason, [DONE]."""
    answer = _Answer(body.stop)
    head = {**_head(kind, chunk=True), "model": body.model, "system_fingerprint": FINGERPRINT}
    delta = (lambda text: {"content": text}) if kind == "chat" else (lambda text: None)
    try:
        if kind == "chat":
            yield _sse({**head, "choices": [_choice(kind, None, None, {"role": "assistant", "content": ""})]})
        async with job.events() as events:
            async for event in events:
                try:
                    piece = answer.take(event)
                except APIError as e:
                    yield _sse(e.body())
                    break
                if piece:
                    yield _sse({**head, "choices": [_choice(kind, piece, None, delta(piece))]})
                if answer.reason is not None:
                    yield _sse({**head, "choices": [_choice(kind, "", answer.reason, {} if kind == "chat" else None)]})
                    break
        if body.include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(prompt, answer)})
        yield _sse("[DONE]")
    finally:
        job.cancel()   # the client went away (the stream was closed), or a stop string ended it: free the slot


class _JobStream(StreamingResponse):
    """The stream of one job: its client going away (a disconnect, even while nothing is sent, or a failed
    write) cancels the job at once and closes the chunks' generator."""

    def __init__(self, chunks, job):
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        async def watch(group):
            while (await receive())["type"] != "http.disconnect":
                pass
            self.job.cancel()
            group.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch, group)
                try:
                    await self.stream_response(send)
                except OSError:   # the client is gone (uvicorn's ClientDisconnected)
                    pass
                group.cancel_scope.cancel()
        finally:
            self.job.cancel()
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


async def _complete(request: Request, kind: str) -> Response:
    try:
        body, job, prompt = await _start(request, kind)
    except APIError as e:
        return error_response(e)
    if body.stream:
        return _JobStream(_chunks(kind, body, job, prompt), job)
    try:
        return await _whole(request, kind, body, job, prompt)
    except APIError as e:
        return error_response(e)


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions."""
    return await _complete(request, "chat")


async def completions(request: Request) -> Response:
    """POST /v1/completions."""
    return await _complete(request, "text")
