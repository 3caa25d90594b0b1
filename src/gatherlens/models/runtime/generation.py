"""The one generation loop: greedy decoding as a generator of events, sparse or dense.

    >>> for event in generation_steps(lm, ids, budget=512, max_new_tokens=32, pages=True):
    ...     if isinstance(event, GenerationStep):
    ...         print(event.index, repr(event.token), event.length, event.page_ids()[:1])
    ...     elif isinstance(event, GenerationEnd):
    ...         print(event.reason, repr(event.text))
    0 ' mat' 9 []                     # index 0: the prompt's forward pass (prefill, dense)
    1 ' and' 10 [[0, 2, 3]]           # a decode step: layer 0's page ids per selection head
    ...
    length ' mat and the dog ...'

First a `GenerationStart` (the prompt's length, the budget, the page size, the layers), then
one `GenerationStep` per new token (its id, the text it added, the text so far, the tokens it
attended, which pages each sparse layer read, its time), then one `GenerationEnd`. The
consumer runs at its own pace: `gatherlens generate` prints and draws (through
streaming.stream_generate), the explorer's server sends each event to the page and stops
between two steps when its client goes away. Closing the generator (or an exception, Ctrl-C
included) puts the model back to dense decoding. Greedy (argmax), like
`generate(do_sample=False)`, unless given a `SamplingConfig` (ops/sampling: llama.cpp's chain, a
seeded draw); it stops after max_new_tokens or after a stop token (the model's end-of-sequence
token, or the ids given: a chat template's end of turn). budget=None decodes densely (SDPA over
a DynamicCache); otherwise `use_sparse_decoding(model, budget=budget, **sparse)` over a SparseKVCache. The text comes from the
one incremental detokenizer (detokenize.py).

The tokens themselves come from `greedy_tokens(model, cache, ids)`, the loop's core: forward,
argmax, feed it back, one token per `next()`. A caller that has its own prefilled cache and needs
only token ids (the passkey test: `eval.passkey.greedy_decode`) takes them from there.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch

from gatherlens.errors import GatherValueError
from gatherlens.memory import release_memory
from gatherlens.models.attention.sparse import meter_pages, observe_sparse, sparse_settings
from gatherlens.models.files.watch import check_unchanged
from gatherlens.models.runtime.detokenize import CONTEXT_TOKENS, Detokenizer
from gatherlens.models.runtime.native import is_native, native_cache, native_config, use_native_decoding, \
    use_native_dense
from gatherlens.models.runtime.threads import ThreadControl
from gatherlens.ops.sampling import Sampler, SamplingConfig, greedy
from gatherlens.ops.sparse.config import DEFAULT

if TYPE_CHECKING:
    from gatherlens.models.runtime.decoding import SparseKVCache

__all__ = ["GenerationStart", "GenerationStep", "GenerationEnd", "LayerPages", "generation_steps", "greedy_tokens",
           "next_tokens", "chooser", "require_causal", "stop_ids", "last_logits", "PREFILL_CHUNK"]

# prompt tokens per forward pass of the prefill: a long prompt runs in chunks into the cache, so its
# activations (the MLP's (chunk, intermediate) float32 rows, attention's) are a chunk's, not the
# prompt's (~250 MB at 8K tokens for SmolLM2 in one pass); llama.cpp's n_batch is 512. At 8K tokens
# (SmolLM2 quantized) chunks of 512 peaked at 821 MB RSS against 892 MB with 1,024, at the same speed
# (14-15 s for a 4K prompt either way). Chunks of 256 (stop 48) peaked lower (Gemma 3 270M at 4K: 692 MB
# against 717) but took more of a prompt through the 8-bit-activation GEMM (a format's gemm_rows): SmolLM2's
# teacher-forced agreement with its float model fell from 0.984 to 0.945, so 512 stays
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class GenerationStart:
    """The first event, before the prompt runs: what the generation is set up with."""

    prompt_tokens: int
    budget: int | None      # None: dense
    page_size: int          # tokens per page of the paged cache (dense: the size pictures draw)
    layers: int
    reused: int = 0         # prompt tokens already in a kept cache (prefix reuse): not prefilled again


@dataclass(frozen=True)
class LayerPages:
    """The pages one layer read at one decode step (what a PageTraceRecorder reads of a call)."""

    layer: int
    selection: object  # PageSelection


@dataclass(frozen=True)
class GenerationStep:
    """One new token.

    index:      0 for the token the prompt's forward pass chose (prefill, dense), then 1, 2, ...
                for the decode steps.
    token_id:   the token chosen (greedy).
    token:      the text it added ("" while a UTF-8 character is still incomplete, or for a
                special token).
    text:       the continuation so far (the concatenation of every `token`).
    length:     tokens the step attended: the prompt for index 0, prompt + index for a decode step.
    pages:      what every sparse layer read, in layer order (decode steps with pages=True; a
                layer that is missing decoded densely without choosing).
    seconds:    the step's time (its forward pass, the choice and the text).
    page_counts: (layers, selection heads) int64: pages each selection head of each global layer read
                (sparse decode steps; a layer that read every page without choosing holds that count;
                None for the prefill and dense decoding). With the auto budget they differ per head.
    chose:      per layer of page_counts, True where the layer chose its pages (False: it read every page).
    """

    index: int
    token_id: int
    token: str
    text: str
    length: int
    pages: tuple[LayerPages, ...] = ()
    seconds: float = 0.0
    page_counts: torch.Tensor | None = None
    chose: tuple[bool, ...] = ()

    def page_ids(self) -> list[list[list[int]]]:
        """[layer][selection head] -> the page ids read (ascending), batch 0; [] for a dense layer."""
        read = {p.layer: [[i for i in row if i >= 0] for row in p.selection.pages[0].tolist()] for p in self.pages}
        return [read.get(i, []) for i in range(max(read, default=-1) + 1)]


@dataclass(frozen=True)
class GenerationEnd:
    """The last event: what was generated and why it stopped ("length" or "eos")."""

    new_ids: tuple[int, ...]
    text: str
    prompt_tokens: int
    reason: str
    prefill_seconds: float
    decode_seconds: float


def require_causal(lm) -> None:
    """A clear error for a model that cannot generate (an encoder such as MiniLM)."""
    if not lm.is_causal:
        raise GatherValueError(f"{lm.name} is an encoder ({type(lm.model).__name__}): it does not "
                               f"generate; switch to a causal LM such as smollm2")


def stop_ids(lm) -> set[int]:
    """The end-of-sequence ids generation stops at: the model's generation config's, else the tokenizer's."""
    eos = getattr(getattr(lm.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(lm.tokenizer, "eos_token_id", None)
    return set() if eos is None else {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _start(model, budget: int | str | None, sparse: dict, tokens: int, cache=None) -> tuple[object, int]:
    """Switch the model (sparse or dense decoding); the cache the loop fills (room for `tokens`; `cache`
    when given: a SparseKVCache of these settings already holding a prefix of the prompt) and its page
    size. The native runtime's model (models/runtime/native.py) decodes over its own cache; a
    transformers model over transformers' DynamicCache (dense) or a SparseKVCache."""
    if is_native(model):
        if cache is not None:
            raise GatherValueError("a kept cache (prefix reuse) runs in transformers' modules; the native runtime "
                                   "makes its own cache: load with runtime='transformers'")
        config = native_config(budget, **sparse)
        use_native_decoding(model, config)
        return native_cache(model, tokens, config), config.page_size
    from transformers import DynamicCache

    from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding

    if budget is None:
        if cache is not None:
            raise GatherValueError("a kept cache (prefix reuse) needs sparse decoding's paged cache: give a budget")
        use_dense_decoding(model)
        return DynamicCache(config=model.config), sparse.get("page_size", DEFAULT.page_size)
    use_sparse_decoding(model, budget=budget, **sparse)
    settings = sparse_settings(model)  # what the model now decodes with: pages made so at the prefill
    if cache is not None:
        if not isinstance(cache, SparseKVCache) or cache.page_size != settings.page_size:
            raise GatherValueError(f"the kept cache must be a SparseKVCache of page size {settings.page_size}, got "
                                   f"{type(cache).__name__} of page size {getattr(cache, 'page_size', None)}")
    else:
        cache = SparseKVCache(config=model.config, page_size=settings.page_size, kv_dtype=settings.kv_dtype)
    cache.reserve(tokens)  # room for every token at the prefill: no decode step regrows it
    return cache, settings.page_size


def _stop(model) -> None:
    """Back to dense decoding (transformers' model), or no decode step (the native runtime's)."""
    if is_native(model):
        use_native_dense(model)
        return
    from gatherlens.models.runtime.decoding import use_dense_decoding

    use_dense_decoding(model)


def chooser(sampling: SamplingConfig | None, prompt: list[int],
            on_sample: Callable | None = None) -> Callable[[torch.Tensor], int] | None:
    """How the next token is chosen from the logits (V,): None (argmax, greedy) for no config or plain
    greedy; else a `Sampler` (ops/sampling: penalties, cuts, a seeded draw) that keeps the history.
    on_sample(SampleRecord) sees every choice (the explorer's chat draws the candidates of each token);
    with it, greedy runs through a Sampler too (the same argmax, recorded)."""
    if on_sample is None and (sampling is None or (sampling.greedy and not sampling.penalized)):
        return None
    sampler = Sampler(sampling or SamplingConfig(), prompt=prompt)
    if on_sample is None:
        return sampler

    def choose(logits: torch.Tensor) -> int:
        token, rec = sampler(logits, record=True)
        on_sample(rec)
        return token
    return choose


@torch.no_grad()
def next_tokens(model, cache, ids: torch.Tensor, choose: Callable[[torch.Tensor], int] | None = None) -> Iterator[int]:
    """The token after ids (1, Q) in `cache`, then after each token it gave, one per `next()`; endless.

        >>> list(itertools.islice(next_tokens(model, prefilled_cache, last_prompt_id), 5))   # ids (1, 1)

    choose(logits (V,)) -> id picks each token (None: argmax, greedy; a Sampler samples). Each `next()`
    runs one forward pass into the cache (the caller stops by asking no more); the model decodes as it
    is switched (use_sparse_decoding / use_dense_decoding). On the CPU torch's thread count follows the
    cores other programs leave free (models/runtime/threads.py; off after --threads).
    """
    threads = ThreadControl.start(on=ids.device.type == "cpu")
    try:
        while True:
            threads.before_step()
            logits = last_logits(model, cache, ids, between=threads.follow)  # (V,)
            token = greedy(logits) if choose is None else int(choose(logits))
            threads.after_step()
            yield token
            ids = torch.tensor([[token]], device=ids.device)  # (1, 1)
    finally:
        threads.finish()


def greedy_tokens(model, cache, ids: torch.Tensor) -> Iterator[int]:
    """`next_tokens` choosing by argmax: the greedy continuation of ids (1, Q) in `cache`."""
    return next_tokens(model, cache, ids)


def last_logits(model, cache, ids: torch.Tensor, chunk: int | None = None, between=None) -> torch.Tensor:
    """The forward pass of ids (1, Q) into `cache`, a prompt longer than `chunk` (PREFILL_CHUNK) in
    chunks of it (each attends the cache and itself, causally); the last position's logits (V,).
    between(): called after each chunk but the last (the thread controller's look at the machine)."""
    chunk = chunk or PREFILL_CHUNK
    while ids.shape[1] > chunk:
        model(input_ids=ids[:, :chunk], cache=cache, use_cache=True, logits_to_keep=1)
        release_memory()  # the chunk's activations back to the system, not kept for the next (memory.py)
        ids = ids[:, chunk:]  # (1, Q - chunk)
        if between is not None:
            between()
    return model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]  # (V,)


def _next(tokens: Iterator[int], picked: list | None, model, counted: dict | None = None) -> int:
    """The loop's next token (one forward pass); what sparse layers read meanwhile lands in picked, the
    pages each of their selection heads read in counted (layer -> (counts, chose)).
    A model run from its file in place checks the file before and after (models/files/watch.py)."""
    def keep(call):
        picked.append(LayerPages(call.layer if call.layer is not None else len(picked), call.selection))

    def count(layer, counts, chose):
        counted[layer] = (counts, chose)

    check_unchanged(model)
    with contextlib.ExitStack() as watching:
        if picked is not None:
            watching.enter_context(observe_sparse(keep))
        if counted is not None:
            watching.enter_context(meter_pages(count))
        token = next(tokens)
    check_unchanged(model)  # a file changed during the forward pass: its token is not given out
    return token


def _step_counts(counted: dict | None) -> tuple[torch.Tensor | None, tuple[bool, ...]]:
    """(layers, Hsel) int64 and per layer whether it chose, from one step's meter readings (layers in order)."""
    if not counted:
        return None, ()
    layers = sorted(counted)
    return torch.stack([counted[i][0] for i in layers]), tuple(bool(counted[i][1]) for i in layers)


@torch.inference_mode()  # its own cache: no autograd or version counters on any op (~7% of a step at 512)
def generation_steps(lm, ids: torch.Tensor, budget: int | None = DEFAULT.budget, max_new_tokens: int = 64, *,
                     pages: bool = False, sampling: SamplingConfig | None = None, stop: Iterable[int] | None = None,
                     cache: SparseKVCache | None = None, on_sample: Callable | None = None, **sparse
                     ) -> Iterator[GenerationStart | GenerationStep | GenerationEnd]:
    """GenerationStart, a GenerationStep per new token after ids (1, S), GenerationEnd (see the module doc).

    budget: tokens each decode step reads (None: dense). pages: record which pages every sparse
    layer read at every decode step (GenerationStep.pages). sampling: how each token is chosen (None:
    greedy; ops/sampling's SamplingConfig). stop: the ids that end the generation (None: the model's
    EOS, `stop_ids`; a chat passes its template's `stop_ids`). cache: a SparseKVCache (made with these
    settings) that already holds the first `cache.get_seq_length()` tokens of ids (prefix reuse,
    models/runtime/prefix.py): only the rest is prefilled, and the cache is left holding the prompt
    and every new token but the last. on_sample(SampleRecord): sees each token's choice (chooser). sparse: more
    use_sparse_decoding settings (page_size, ...). The loop runs in torch.inference_mode (only while the
    generator runs: a consumer's code between two events does not), as the bench's `generate` does.
    """
    require_causal(lm)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise GatherValueError(f"max_new_tokens = {max_new_tokens!r} must be an int >= 1")
    model, S = lm.model, ids.shape[1]
    stop = stop_ids(lm) if stop is None else {int(t) for t in stop}
    detok = Detokenizer(lm.tokenizer, context=ids[0, -CONTEXT_TOKENS:].tolist())
    new: list[int] = []
    times = [0.0, 0.0]  # prefill, decode
    try:
        cache, page_size = _start(model, budget, sparse, S + max_new_tokens, cache)
        kept = cache.get_seq_length()
        if not 0 <= kept < S:
            raise GatherValueError(f"the kept cache holds {kept} tokens; a prompt of {S} needs fewer (at least one "
                                   f"token left to run)")
        tokens = next_tokens(model, cache, ids[:, kept:], chooser(sampling, ids[0].tolist(), on_sample))  # the rest
        yield GenerationStart(S, budget, page_size, model.config.num_hidden_layers, kept)
        while len(new) < max_new_tokens and not (new and new[-1] in stop):
            t0, picked = time.perf_counter(), ([] if pages and new else None)  # the prefill reads every page
            counted = {} if new and budget is not None else None
            new.append(_next(tokens, picked, model, counted))
            piece, seconds = detok.push(new[-1]), time.perf_counter() - t0
            times[0 if len(new) == 1 else 1] += seconds
            yield GenerationStep(len(new) - 1, new[-1], piece, detok.text, S + len(new) - 1,
                                 tuple(sorted(picked or (), key=lambda p: p.layer)), seconds, *_step_counts(counted))
        yield GenerationEnd(tuple(new), detok.text, S, "eos" if new[-1] in stop else "length", *times)
    finally:
        _stop(model)
