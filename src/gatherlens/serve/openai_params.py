"""The OpenAI API's request bodies -> checked values, or an `APIError` in OpenAI's shape naming the field.

    >>> body = chat_body({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "top_p": 2})
    APIError(400, "top_p = 2 is outside the valid range [0, 1]", param="top_p")

Fields follow OpenAI's API reference (chat/completions, completions): `temperature` [0, 2] and `top_p`
[0, 1] with OpenAI's defaults (1 and 1), `frequency_penalty` / `presence_penalty` [-2, 2], `seed`,
`max_tokens` / `max_completion_tokens`, `stop` (a string or up to 4), `stream` and
`stream_options.include_usage`; llama.cpp's extensions `top_k`, `min_p` and `repeat_penalty` too.
What this server cannot do is refused by name rather than ignored: `n` > 1, `logprobs`, tools,
`response_format` other than text, image parts, `echo`, `suffix`, `best_of` > 1. Other fields
(`user`, `metadata`, `store`, ...) change nothing here and are accepted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gatherlens.errors import GatherValueError, shorten

__all__ = ["APIError", "Body", "chat_body", "completion_body", "API_SAMPLING"]

ROLES = ("system", "developer", "user", "assistant", "tool")
MOST_STOPS = 4
# body field -> (SamplingConfig field, lo, hi): the numbers the chain takes (OpenAI's ranges; llama.cpp's extras)
API_SAMPLING = {
    "temperature": ("temperature", 0.0, 2.0),
    "top_p": ("top_p", 0.0, 1.0),
    "frequency_penalty": ("frequency_penalty", -2.0, 2.0),
    "presence_penalty": ("presence_penalty", -2.0, 2.0),
    "min_p": ("min_p", 0.0, 1.0),
    "repeat_penalty": ("repeat_penalty", 0.0, 10.0),
}


class APIError(Exception):
    """An error answered as OpenAI's {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Body:
    """A checked request: what to generate and how."""

    model: str
    messages: tuple | None          # chat: the conversation (content as text)
    prompt: str | tuple | None      # completions: a text, or token ids
    max_tokens: int | None
    sampling: object                # a SamplingConfig
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _bad(field: str, message: str) -> APIError:
    return APIError(400, message, param=field)


def _number(body: dict, field: str, lo: float, hi: float) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise _bad(field, f"{field} = {shorten(value)} is outside the valid range [{lo:g}, {hi:g}]")
    return float(value)


def _int(body: dict, field: str, lo: int | None, hi: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo) \
            or (hi is not None and value > hi):
        span = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise _bad(field, f"{field} = {shorten(value)} must be an integer in {span}")
    return value


def _sampling(body: dict):
    """The SamplingConfig of a body: OpenAI's defaults (temperature 1, top_p 1) and what it gives."""
    from gatherlens.ops.sampling.checks import SEED_RANGE
    from gatherlens.ops.sampling.config import OPENAI

    changes = {name: value for field, (name, lo, hi) in API_SAMPLING.items()
               if (value := _number(body, field, lo, hi)) is not None}
    top_k = _int(body, "top_k", None)
    if top_k is not None:
        changes["top_k"] = max(top_k, 0)   # llama.cpp: <= 0 is off
    if changes.get("top_p") == 0:      # no mass at all: llama.cpp keeps the one best token
        changes.update(top_p=1.0, top_k=1)
    if changes.get("repeat_penalty") == 0:
        changes["repeat_penalty"] = 1.0   # llama.cpp: 0 is off
    seed = _int(body, "seed", *SEED_RANGE)
    if seed is not None:
        changes["seed"] = seed
    try:
        return OPENAI.replace(**changes)
    except GatherValueError as e:
        raise _bad(str(e).split(" ", 1)[0], str(e)) from None


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MOST_STOPS or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"stop must be a string or a list of at most {MOST_STOPS} strings, got {shorten(stop)}")
    return tuple(s for s in stops if s)


def _refused(body: dict, fields: dict) -> None:
    """400 for a field set to something this server does not do (fields: name -> the values it accepts)."""
    for field, allowed in fields.items():
        if field in body and body[field] not in allowed:
            raise _bad(field, f"{field} = {shorten(body[field])} is not supported by this server "
                              f"(it accepts {' or '.join(map(repr, allowed))})")


def _common(body, required: str) -> dict:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "model must be given: the id of a model GET /v1/models lists")
    if required not in body:
        raise _bad(required, f"{required} is required")
    _refused(body, {"n": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "tools": (None, []),
                    "functions": (None, []), "tool_choice": (None, "none", "auto"), "echo": (None, False),
                    "suffix": (None, ""), "best_of": (None, 1)})
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict)
                                or not isinstance(options.get("include_usage", False), bool)):
        raise _bad("stream_options",
                   f"stream_options must be {{\"include_usage\": true|false}}, got {shorten(options)}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise _bad("stream", f"stream must be true or false, got {shorten(stream)}")
    most = _int(body, "max_completion_tokens", 1)
    return {"model": model, "max_tokens": most if most is not None else _int(body, "max_tokens", 1),
            "sampling": _sampling(body), "stop": _stop(body), "stream": bool(stream),
            "include_usage": bool(stream) and bool((options or {}).get("include_usage", False))}


def _content(message: dict, i: int) -> str:
    """A message's content as text: a string, or its text parts joined (llama.cpp does the same)."""
    content = message.get("content")
    if content is None and message.get("role") != "assistant":
        raise _bad("messages", f"messages[{i}] ({message.get('role')}) has no content: only an assistant's message "
                               f"(one that calls tools) may leave it out")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad("messages", f"messages[{i}].content must be a string or a list of parts, got {shorten(content)}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _bad("messages", f"messages[{i}].content[{j}] must be a text part ({{\"type\": \"text\", \"text\": "
                                   f"...}}): this model reads text only")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_body(body) -> Body:
    """A POST /v1/chat/completions body, checked."""
    common = _common(body, "messages")
    _refused(body, {"response_format": (None, {"type": "text"})})
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise _bad("messages", f"messages[{i}] must be an object with a role among {', '.join(ROLES)}, "
                                   f"got {shorten(message)}")
        role = "system" if message["role"] == "developer" else message["role"]
        extra = {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
        out.append({"role": role, "content": _content(message, i), **extra})
    return Body(messages=tuple(out), prompt=None, **common)


def completion_body(body, vocab_size: int) -> Body:
    """A POST /v1/completions body, checked: `prompt` a string, a list of one string, or token ids."""
    common = _common(body, "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        bad = next((i for i, t in enumerate(prompt) if isinstance(t, bool) or not isinstance(t, int)
                    or not 0 <= t < vocab_size), None)
        if not prompt or bad is not None:
            raise _bad("prompt", "prompt must be a string or a non-empty list of token ids in "
                                 f"[0, {vocab_size}), one prompt per request"
                                 + (f" (prompt[{bad}] = {shorten(prompt[bad])})" if bad is not None else ""))
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", f"prompt must be a non-empty string or a list of token ids, got {shorten(prompt)}")
    return Body(messages=None, prompt=prompt, **common)
