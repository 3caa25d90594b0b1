"""What `gatherlens serve` checks before the server starts, so that every failure is one line.

    >>> with prepared(ServeSettings(model="./my-model", port=8765)) as loader:   # settings, port, model
    ...     app = create_app(settings, loader=loader)
    >>> uvicorn.run(app, host=settings.host, port=settings.port)

In order, each before the slower next one: the settings (every limit in range, and the default
request passes the requests' own checks), the address (bound as uvicorn binds it: a busy port is an
error within a second; not listened on, so a client is refused, not reset, while the model
loads), the model's name or path
(its files are there), then the model itself (loaded, or its damaged file named). The address
is let go just before uvicorn binds it.
"""
from __future__ import annotations

import contextlib
import errno
import socket
from typing import Callable, Iterator

from gatherlens.errors import GatherLensError, GatherValueError
from gatherlens.serve.limits import check_limits
from gatherlens.serve.params import explain_params, generate_params
from gatherlens.serve.settings import ServeSettings

__all__ = ["check_settings", "claim_address", "prepared"]


def check_settings(s: ServeSettings) -> None:
    """A GatherValueError naming the first setting out of its range.

    >>> check_settings(ServeSettings(default_new_tokens=80, max_new_tokens=64))
    GatherValueError: serve settings: the default request is refused: max_new = 80 is outside ...
    """
    for name in ("max_chars", "max_tokens", "max_k", "max_new_tokens"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GatherValueError(f"serve settings: {name} = {value!r} must be an int >= 1")
    if isinstance(s.port, bool) or not isinstance(s.port, int) or not 0 <= s.port <= 65535:
        raise GatherValueError(f"serve settings: port = {s.port!r} is outside the valid range [0, 65535]")
    check_limits(s)
    try:  # the defaults a request falls back on obey the request's own rules (one home: params.py)
        explain_params({"k": str(s.top_k)}, s)
        generate_params({"max_new": str(s.default_new_tokens), "page_size": str(s.page_size),
                         "budget": str(s.budget)}, s)
    except GatherLensError as e:
        raise GatherValueError(f"serve settings: the default request is refused: {e}") from None


def claim_address(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) as uvicorn binds it (SO_REUSEADDR); or a GatherValueError.

    >>> claim_address("127.0.0.1", 8765)      # while another server runs there
    GatherValueError: port 8765 on 127.0.0.1 is in use (another gatherlens serve?): stop it, or pick another --port
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise GatherValueError(_address_problem(err, host, port)) from None
    return sock


def _address_problem(err: OSError, host: str, port: int) -> str:
    why = err.strerror or str(err)
    if err.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use (another gatherlens serve?): stop it, or pick another --port"
    if err.errno == errno.EACCES:
        return f"port {port} on {host} needs more rights ({why}): ports below 1024 are for root; pick --port 8765"
    return f"--host {host!r} is not an address of this machine ({why}); use 127.0.0.1, or one of its own addresses"


@contextlib.contextmanager
def prepared(settings: ServeSettings, load: Callable | None = None) -> Iterator[Callable]:
    """Check everything, claim the address and load the model; yield the server's loader
    (the loaded model for settings.model, the first time; then `load`, --quantized for that model
    alone: a model dropped because its file changed loads again from the file). The address is let
    go on exit.
    """
    check_settings(settings)
    sock = claim_address(settings.host, settings.port)   # before gatherlens.models imports torch
    try:
        if load is None:
            from gatherlens.models import load
        from gatherlens.models import resolve
        from gatherlens.models.files.registry import check_quantizable

        source = resolve(settings.model)  # a mistyped path or an incomplete folder: before anything slow
        if settings.quantized:
            check_quantizable(source, "--quantized")  # a folder has no blocks to run from: one line
        extra = {"quantized": True} if settings.quantized else {}
        first = [load(settings.model, progress=True, **extra)]
        yield lambda name: (first.pop() if first else load(name, **extra)) if name == settings.model else load(name)
    finally:
        sock.close()
