"""`gatherlens serve`'s app under a real uvicorn, on a free port of 127.0.0.1, in a thread."""
from __future__ import annotations

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def running_server(app, timeout: float = 120.0, **config):
    """Yield the base URL ("http://127.0.0.1:PORT") while uvicorn serves `app`; stop it after.
    `config` goes to uvicorn.Config (http=... for the server's own protocol)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
