"""The limits and defaults of `gatherlens serve` (importable without torch).

    >>> s = ServeSettings(model="minilm", port=9000)
    >>> s.max_chars, s.max_new_tokens
    (16000, 64)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gatherlens.ops.prefill.config import TOY as PREFILL_TOY, PrefillConfig
from gatherlens.ops.sparse.config import TOY, SparseConfig
from gatherlens.report.defaults import DEFAULT_TEXT, LIVE_MAX_TOKENS, MAX_CHARS

__all__ = ["ServeSettings", "KNOWN", "LOCAL_HOSTS"]

KNOWN = ("smollm2", "minilm")               # the models any page may switch to
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class ServeSettings:
    """What the server runs and how far a request may go."""

    model: str = "smollm2"          # the model loaded (and kept warm) at start: a name or a path
    quantized: bool = False         # run that model from its GGUF blocks (load(quantized=True))
    host: str = "127.0.0.1"
    port: int = 8765
    lang: str = "en"
    text: str = DEFAULT_TEXT        # the text the page opens with
    top_k: int = 4                  # the k the page opens with
    max_chars: int = MAX_CHARS      # longest text accepted, in characters (2,048 tokens of prose fit)
    max_tokens: int = LIVE_MAX_TOKENS  # longest text accepted, in tokens (report.defaults: the live page's)
    max_k: int = 4096
    max_new_tokens: int = 64        # most tokens one generation may produce
    default_new_tokens: int = 24
    page_size: int = TOY.page_size  # sparse decoding: tokens per page of the KV cache (the TOY preset)
    budget: int = TOY.budget        # sparse decoding: tokens each decode step reads (the TOY preset)
    sparse_prefill: bool = False    # the page opens with its sparse-prefill map on (a checkbox switches it)
    extra_hosts: list[str] = field(default_factory=list)   # Host headers accepted besides the bind host
    queue_limit: int = 8            # model requests that may wait while one runs; one more gets 503
    retry_after: int = 5            # seconds a 503 asks the client to wait (its Retry-After header)
    run_cache_bytes: int = 600 << 20  # the texts' kept runs (serve/runs.py): 233 MiB each at 2,048 tokens
    max_target_bytes: int = 200_000  # longest request target (path and query); longer gets 414. A text
                                    # of max_chars characters fits: percent-encoded, 12 bytes each at most
    # the OpenAI API (/v1/*: serve/openai_api.py, serve/engine.py)
    slots: int = 4                  # generations decoding together (llama-server's --parallel default)
    api_queue: int = 16             # API requests that may wait for a slot; one more gets 503
    api_key: str | None = None      # when set, /v1/* needs "Authorization: Bearer <key>"
    api_max_tokens: int = 4096      # most tokens one API request may generate (max_tokens' default, capped by
                                    # the room the model's positions leave)
    prefix_cache_bytes: int = 512 << 20  # kept KV caches of finished requests, for prefix reuse (LRU)
    prefill_chunk: int = 128        # prompt tokens a slot prefills per turn (between two decode steps of the
                                    # others); also the grid reuse cuts at (models/runtime/prefix.py): a 1,500-token
                                    # chat's next turn runs ~170 tokens again (its last chunk, the answer, the question)
    max_body_bytes: int = 4 << 20   # longest API request body; longer gets 413

    @property
    def models(self) -> list[str]:
        """The models a page may switch between: the one given at start, then the known ones."""
        return list(dict.fromkeys([self.model, *KNOWN]))

    @property
    def allowed_hosts(self) -> list[str]:
        """Host headers answered (a page of another site cannot reach the server by DNS tricks)."""
        hosts = [self.host, *self.extra_hosts]
        if self.host in LOCAL_HOSTS or self.host in ("0.0.0.0", "::"):
            hosts += [*LOCAL_HOSTS, "[::1]"]
        return ["*"] if self.host in ("0.0.0.0", "::") and not self.extra_hosts else hosts

    def sparse(self, budget: int | None = None, page_size: int | None = None) -> SparseConfig:
        """The explorer's SparseConfig: the TOY preset at this budget and page size (default: the server's).

            >>> ServeSettings().sparse(budget=32).budget, ServeSettings().sparse().page_size
            (32, 4)
        """
        return TOY.replace(budget=self.budget if budget is None else budget,
                           page_size=self.page_size if page_size is None else page_size)

    def prefill_config(self) -> PrefillConfig:
        """The sparse prefill of the page's prefill map: the TOY preset (blocks of 16 tokens from any length, so
        that a short text shows a choice), as `gatherlens explain --sparse-prefill` runs it."""
        return PREFILL_TOY

    def live(self, model: str, topk: bool, k: int, prefill: bool = False) -> dict:
        """The live page's settings (what its controls offer)."""
        return {"models": self.models, "model": model, "topk": topk, "k": k, "prefill": prefill,
                "max_chars": self.max_chars, "max_tokens": self.max_tokens, "max_new": self.max_new_tokens,
                "default_new": self.default_new_tokens}
