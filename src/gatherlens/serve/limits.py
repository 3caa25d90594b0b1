"""How much the server takes at once: a bounded queue of model requests (503 past it) and a
longest request target (414 past it), as ASGI middleware and as uvicorn's HTTP protocol.

    >>> app = RequestLimits(app, ServeSettings(queue_limit=8), headers, paths=("/api/explain",))
    >>> uvicorn.run(app, http=protocol_class(ServeSettings(), headers))   # 414 before h11 gives up

The model runs one request at a time (serve/pool.py); `queue_limit` more may wait for it, in
order. One more is answered at once: 503 with Retry-After, {"error": "..."}, and the server
goes on with the others. A request target (path and query) over `max_target_bytes` is 414.
uvicorn's h11 would drop such a request line (past its 16 KiB buffer) with a 400 and close the
connection while the client still sends, which the client sees as a reset: `protocol_class`
answers 414 itself, stops writing, and reads what the client still sends until it closes.
"""
from __future__ import annotations

import json
from http import HTTPStatus

from gatherlens.errors import GatherValueError
from gatherlens.serve.settings import ServeSettings

__all__ = ["RequestLimits", "protocol_class", "target_problem", "check_limits", "refusal"]

BYTES_PER_CHAR = 12          # a 4-byte UTF-8 character, percent-encoded (%F0%9F%98%80)
HEAD_ROOM = 16 << 10         # bytes of headers allowed beside the request line
DRAIN_BYTES = 64 << 20       # most bytes read and dropped after a refusal before closing
DRAIN_SECONDS = 10.0         # longest wait for the client to close after a refusal


def check_limits(s: ServeSettings) -> None:
    """A GatherValueError naming the first limit out of its range.

    >>> check_limits(ServeSettings(queue_limit=-1))
    GatherValueError: queue_limit = -1 is outside the valid range [0, 10000] ...
    """
    need = BYTES_PER_CHAR * s.max_chars + 1024
    for name, lo, hi, why in (("queue_limit", 0, 10_000, "model requests waiting while one runs"),
                              ("slots", 1, 64, "API generations decoding together"),
                              ("api_queue", 0, 10_000, "API requests waiting for a slot"),
                              ("api_max_tokens", 1, 1 << 20, "tokens one API request may generate"),
                              ("prefix_cache_bytes", 0, 1 << 40, "bytes of kept KV caches (0: none kept)"),
                              ("max_body_bytes", 1024, 1 << 30, "bytes of an API request body"),
                              ("prefill_chunk", 1, 8192, "prompt tokens a slot prefills per turn"),
                              ("retry_after", 1, 3600, "seconds in a 503's Retry-After"),
                              ("max_target_bytes", need, 1 << 24,
                               f"bytes of a request target: a text of max_chars = {s.max_chars:,} "
                               f"characters needs {need:,}")):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise GatherValueError(f"{name} = {value!r} is outside the valid range [{lo:,}, {hi:,}] ({why})")


def target_problem(size: int | None, s: ServeSettings) -> str | None:
    """Why a request target of `size` bytes (None: over the limit, size unknown yet) is refused
    (414), or None when it is fine.

    >>> target_problem(1_048_600, ServeSettings())
    "the request's address (path and query) has 1,048,600 bytes; the limit is 16,384 bytes (...)"
    """
    if size is not None and size <= s.max_target_bytes:
        return None
    has = f"has {size:,} bytes; the limit is" if size is not None else "is longer than the limit,"
    return (f"the request's address (path and query) {has} {s.max_target_bytes:,} bytes "
            f"(text is limited to {s.max_chars:,} characters)")


def refusal(status: int, message: str, headers: dict) -> bytes:
    """A whole HTTP/1.1 answer {"error": message} that closes the connection."""
    body = json.dumps({"error": message}).encode()
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close",
             *(f"{k.lower()}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class RequestLimits:
    """ASGI middleware: 414 past max_target_bytes; 503 (Retry-After) once 1 + queue_limit
    requests to `paths` (the ones that use the model) are in the server."""

    def __init__(self, app, settings: ServeSettings, headers: dict, paths: tuple[str, ...]):
        self.app, self.settings, self.headers, self.paths = app, settings, headers, paths
        self.active = 0          # model requests in the server: one running, the others waiting

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        query = scope.get("query_string") or b""
        size = len(scope.get("raw_path") or scope["path"].encode()) + (len(query) + 1 if query else 0)
        said = target_problem(size, self.settings)
        if said is not None:
            return await self._answer(scope, receive, send, 414, said)
        if scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        most = 1 + self.settings.queue_limit
        if self.active >= most:
            wait = self.settings.retry_after
            return await self._answer(scope, receive, send, 503,
                                      f"the server is busy: {most} requests are running or waiting for the "
                                      f"model; try again in {wait} s", {"Retry-After": str(wait)})
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1

    async def _answer(self, scope, receive, send, status: int, message: str, extra: dict | None = None):
        from starlette.responses import JSONResponse

        response = JSONResponse({"error": message}, status_code=status, headers={**self.headers, **(extra or {})})
        await response(scope, receive, send)


def protocol_class(settings: ServeSettings, headers: dict) -> type:
    """uvicorn's h11 protocol, answering an over-long request line with 414 (and a malformed or
    oversized request head with 400) without resetting the connection."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    line_limit = settings.max_target_bytes + 32   # "GET ", " HTTP/1.1\r\n"

    class LimitedH11(H11Protocol):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=line_limit + HEAD_ROOM)
            self.dropped = None  # bytes read and dropped since a refusal (None: no refusal)

        def data_received(self, data: bytes) -> None:
            if self.dropped is not None:
                return self._drop(data)
            if self.conn.their_state is h11.IDLE:   # the start of a request: is its first line too long?
                head = (self.conn.trailing_data[0] + data)[:line_limit + 2]   # at most the limit is buffered
                end = head.find(b"\n")
                if end > line_limit or (end < 0 and len(head) > line_limit):
                    return self.refuse(414, target_problem(None, settings))
            super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            self.refuse(400, f"{msg} (a malformed request, or headers over {HEAD_ROOM:,} bytes)")

        def refuse(self, status: int, message: str) -> None:
            self.transport.write(refusal(status, message, headers))
            if self.transport.can_write_eof():
                self.transport.write_eof()    # the answer is whole; the client may stop sending
            self.dropped = 0
            self.loop.call_later(DRAIN_SECONDS, self.transport.close)

        def _drop(self, data: bytes) -> None:
            self.dropped += len(data)
            if self.dropped > DRAIN_BYTES:
                self.transport.close()

        def eof_received(self):
            if self.dropped is not None:
                self.transport.close()
            return super().eof_received()

    return LimitedH11
