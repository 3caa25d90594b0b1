"""Stop strings over streamed text: what may be sent now, and whether a stop string was met.

    >>> stops = StopText(["\\nUser:", "###"])
    >>> stops.push("Hello\\nUs")          # ('Hello', False): "\\nUs" may begin a stop string, held back
    >>> stops.push("er: hi")              # ('', True): a stop string; nothing after it is sent
    >>> stops.text                        # 'Hello': the answer, without the stop string (as OpenAI's)

A stop string may span several tokens, so a streamed piece is held back while its end could still grow
into one; at the end `flush()` gives what was held. The text sent is always a prefix of the text without
the stop string, so a client that joins the stream gets the same answer as one that waits for it.
"""
from __future__ import annotations

__all__ = ["StopText"]


class StopText:
    def __init__(self, stops: list[str] | tuple[str, ...] = ()):
        self.stops = [s for s in stops if s]
        self.text = ""       # everything accepted (and, once a stop string is met, cut before it)
        self.sent = 0        # characters of `text` already given out
        self.stopped = False

    def _held(self) -> int:
        """How many characters at the end of `text` could be the start of a stop string."""
        most = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self.text)), most, -1):
                if self.text.endswith(stop[:n]):
                    most = n
                    break
        return most

    def push(self, piece: str) -> tuple[str, bool]:
        """Add a piece of generated text; (what may be sent now, whether a stop string was met)."""
        if self.stopped:
            return "", True
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        self.text += piece
        hits = [at for at in (self.text.find(s, start) for s in self.stops) if at >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, True
        ready = len(self.text) - self._held()
        out, self.sent = self.text[self.sent:ready], max(self.sent, ready)
        return out, False

    def flush(self) -> str:
        """What is still held back (the generation ended without a stop string)."""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out
