"""The dist demo's settings and command-line options, defined once (DemoConfig's fields).

    >>> [o.flag for o in demo_options()]
    ['--vocab', '--context', '--budget', '--page-size', '--out', '--device', '--force']
    >>> DemoConfig(vocab=1000, context=300).argv()       # what the torchrun command line carries
    ['--vocab', '1000', '--context', '300', '--budget', '512', '--page-size', '16', '--device', 'cpu']
    >>> DemoConfig.from_options({"vocab": 1000, "nproc": 2}).vocab   # parsed options (others ignored)
    1000

`gatherlens dist demo` (click, commands/dist.py) and `torchrun ... -m gatherlens.dist demo`
(argparse, dist/__main__.py) both build their options from `demo_options()`: a field with an
"option" entry in its metadata is an option (its help, its lowest value, its choices); the
others are fixed sizes of the demo. Imports no torch: `gatherlens --help` reads this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from gatherlens.ops.sparse.config import DIST_DEMO

__all__ = ["DemoConfig", "DemoOption", "demo_options"]


def _option(help: str, low: int | None = None, choices: tuple[str, ...] | None = None) -> dict:
    return {"option": {"help": help, "low": low, "choices": choices}}


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs: the table, the KV cache, the budget, where its pictures go."""

    vocab: int = field(default=50257, metadata=_option("embedding rows", low=1))
    dim: int = 16
    context: int = field(default=4133, metadata=_option("tokens in the KV cache", low=1))  # 4133: a partial last page
    budget: int = field(default=DIST_DEMO.budget, metadata=_option("tokens a decode step reads", low=1))
    page_size: int = field(default=DIST_DEMO.page_size, metadata=_option("tokens per page of the KV cache", low=1))
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    out: Path | None = field(default=None, metadata=_option("write the pictures (SVG) of this run into this "
                                                            "folder (rank 0)"))
    device: str = field(default="cpu", metadata=_option("cpu: gloo; cuda: nccl, one GPU per rank",
                                                        choices=("cpu", "cuda")))
    force: bool = field(default=False, metadata=_option("replace pictures already in --out"))

    @classmethod
    def from_options(cls, values) -> "DemoConfig":
        """The config of parsed options (a mapping of option names to values; others are ignored)."""
        return cls(**{o.name: values[o.name] for o in demo_options() if o.name in values})

    def argv(self) -> list[str]:
        """These settings as the demo's command-line options (the defaults included, flags when set)."""
        out: list[str] = []
        for o in demo_options():
            value = getattr(self, o.name)
            if o.kind is bool:
                out += [o.flag] if value else []
            elif value is not None:
                out += [o.flag, str(value)]
        return out


@dataclass(frozen=True)
class DemoOption:
    """One command-line option of the demo, read from a DemoConfig field."""

    name: str                            # the field ("page_size")
    flag: str                            # "--page-size"
    kind: type                           # int, str, Path or bool (a flag)
    default: object
    help: str
    low: int | None = None               # ints: the smallest value allowed
    choices: tuple[str, ...] | None = None


def demo_options() -> list[DemoOption]:
    """The options, in DemoConfig's field order."""
    found = []
    for f in fields(DemoConfig):
        spec = f.metadata.get("option")
        if spec is None:
            continue
        kind = Path if f.default is None else type(f.default)
        found.append(DemoOption(f.name, "--" + f.name.replace("_", "-"), kind, f.default, **spec))
    return found
