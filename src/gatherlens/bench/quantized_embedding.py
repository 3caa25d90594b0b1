"""`gatherlens bench quantized-embedding`: rows gathered from GGUF blocks against the float ways.

    gatherlens bench quantized-embedding                  # SmolLM2's tied Q8_0 table, 1, 16, 512 ids
    gatherlens bench quantized-embedding --gguf m.gguf --tensor token_embd.weight --tokens 1,64 --json q.json

For each number of ids N (random, seeded) and thread count, timed round-robin, median of --repeats:
- "blocks": `gatherlens.embedding_lookup(ids, QuantizedTable)`: the picked rows' blocks, read once per
  distinct row and dequantized (what llama.cpp's get_rows does).
- "dequantize-all": `F.embedding(ids, table.dequantize())`: torchao's way (its quantized embeddings
  dequantize the whole table on every call, then gather).
- "gguf rows": `gguf.quants.dequantize(blocks[ids])`: gguf's own numpy row dequantize.
- "F.embedding f32": F.embedding on the float32 table kept in memory (4 bytes a weight, resident).
`xf32` is time / F.embedding f32's, `xblocks` time / blocks'; `bytes` the table bytes the op reads
(blocks: distinct rows x row bytes; dequantize-all: every block; f32: distinct rows x 4d).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
import torch
import torch.nn.functional as F

from gatherlens.bench.output import check_json_path, json_option, write_results
from gatherlens.bench import timing
from gatherlens.ops.embedding import embedding_lookup
from gatherlens.ops.quant import QuantizedTable
from gatherlens.params import Int, cpu_count, positive_ints

TOKENS = (1, 16, 512)
TENSOR = "token_embd.weight"  # SmolLM2's tied embedding / output table (Q8_0)


@dataclass
class Row:
    tensor: str
    qtype: str
    vocab: int
    dim: int
    tokens: int
    threads: int
    op: str
    median_s: float
    ratio_f32: float     # time / F.embedding on the float32 table
    ratio_blocks: float  # time / the blocks gather
    bytes_read: int      # table bytes the op reads


def _medians(fns: dict, repeats: int) -> dict:
    """Median seconds per op, the ops sampled round-robin so noise hits all alike."""
    return timing.medians(timing.round_robin(fns, repeats, sample=timing.sample_seconds))


def _ops(table: QuantizedTable, dense: torch.Tensor, ids: torch.Tensor) -> dict:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    blocks, picked, qtype = table.raw.numpy(), ids.numpy(), GGMLQuantizationType[table.qtype]
    return {
        "blocks": lambda: embedding_lookup(ids, table),
        "dequantize-all": lambda: F.embedding(ids, table.dequantize()),
        "gguf rows": lambda: dequantize(blocks[picked], qtype),
        "F.embedding f32": lambda: F.embedding(ids, dense),
    }


def _bytes(table: QuantizedTable, ids: torch.Tensor) -> dict:
    distinct = torch.unique(ids).numel()
    return {"blocks": table.bytes_read(ids), "dequantize-all": table.nbytes,
            "gguf rows": ids.numel() * table.row_bytes, "F.embedding f32": distinct * table.shape[1] * 4}


def run(table: QuantizedTable, tokens, threads, repeats: int, progress=None) -> list[Row]:
    """Every (N, threads) case: the four ops' medians and ratios."""
    dense = table.dequantize()  # (V, d) float32: the float table F.embedding reads
    vocab, dim = table.shape
    rows = []
    for n in tokens:
        ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n))  # (N,)
        for t in threads:
            torch.set_num_threads(t)
            medians, nbytes = _medians(_ops(table, dense, ids), repeats), _bytes(table, ids)
            rows += [Row(table.name, table.qtype, vocab, dim, n, t, op, s, s / medians["F.embedding f32"],
                         s / medians["blocks"], nbytes[op]) for op, s in medians.items()]
            if progress:
                progress(n, t)
    return rows


def _ints(text: str, option: str, hi: int | None = None) -> tuple[int, ...]:
    """The option's positive ints (the one rule, gatherlens.params)."""
    return tuple(positive_ints(text, option, option.removeprefix("--"), hi=hi))


@click.command("quantized-embedding")
@click.option("--gguf", "gguf_path", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="a .gguf file (default: the shipped SmolLM2-135M-Instruct.Q4_1.gguf)")
@click.option("--tensor", default=TENSOR, show_default=True, help="the 2-D quantized tensor to gather from")
@click.option("--tokens", default=",".join(map(str, TOKENS)), show_default=True, help="comma-separated id counts")
@click.option("--threads", default="2", show_default=True, help="comma-separated torch thread counts")
@click.option("--repeats", type=Int(1), default=5, show_default=True, help="samples per op; the median is reported")
@json_option("bench-quantized-embedding.json")
@click.option("--force", is_flag=True, help="overwrite an existing --json file")
def command(gguf_path, tensor, tokens, threads, repeats, json_path, force):
    """Time a row gather from GGUF blocks against dequantize-all + F.embedding and F.embedding on floats."""
    from rich.console import Console

    check_json_path(json_path, force)
    tokens, threads = _ints(tokens, "--tokens", 1 << 31), _ints(threads, "--threads", cpu_count())
    if repeats < 1:
        raise click.BadParameter("must be >= 1", param_hint="--repeats")
    if gguf_path is None:
        from gatherlens.models.files.registry import resolve

        gguf_path = resolve("smollm2").path
    table = QuantizedTable.from_gguf(gguf_path, tensor)
    console = Console()
    if not console.is_terminal:
        console = Console(width=132)
    meta = {"torch": torch.__version__, "gguf": gguf_path.name, "tensor": tensor, "row_bytes": table.row_bytes,
            "float_row_bytes": 4 * table.shape[1], "repeats": repeats}
    before = torch.get_num_threads()
    try:
        rows = run(table, tokens, threads, repeats, progress=lambda n, t: console.log(f"done N={n} threads={t}"))
    finally:
        torch.set_num_threads(before)
    console.print(_table(rows, table))
    write_results(json_path, "quantized-embedding", meta, rows, force=force)
    console.print(f"wrote {json_path}")


def _table(rows: list[Row], table: QuantizedTable):
    from rich.table import Table

    out = Table(title=f"row gather from {table.qtype} blocks ({table.name}, {tuple(table.shape)}, "
                      f"{table.row_bytes} B a row vs {4 * table.shape[1]} B in float32): median time")
    for col in ("N", "thr", "op", "median", "xf32", "xblocks", "bytes"):
        out.add_column(col, justify="left" if col == "op" else "right")
    for r in rows:
        out.add_row(str(r.tokens), str(r.threads), r.op, f"{r.median_s * 1e6:.1f} us", f"{r.ratio_f32:.2f}",
                    f"{r.ratio_blocks:.2f}", f"{r.bytes_read:,}", style="bold" if r.op == "blocks" else None)
    return out
