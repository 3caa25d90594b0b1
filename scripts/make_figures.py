"""Regenerate every figure of docs/guide.md, docs/guide.zh.md and the README with one command.

    .venv/bin/python scripts/make_figures.py            # writes docs/figures/*.svg
    .venv/bin/python scripts/make_figures.py --png      # also a PNG beside each SVG

Every figure is drawn by gatherlens from a record of a real call; nothing is drawn by hand.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from gatherlens.ops.attention import topk_attention
from gatherlens.render import mistakes_svg, svg_to_png
from gatherlens.trace import (
    record_attention_selection,
    record_embedding,
    record_gather,
    record_index_select,
)
from gatherlens.trace.mistakes import toy_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # three figures are golden-test fixtures
from golden_cases import EXAMPLES  # noqa: E402 - tests/golden_cases.py

OUT = ROOT / "docs" / "figures"
TOKENS = ["I", "like", "tea"]
IDS = torch.tensor([[5, 2, 7]])  # (B, S) = (1, 3)


def embedding(lang):
    return record_embedding(IDS, toy_table(), labels=TOKENS, lang=lang)


def formulation_gather(lang):
    W = toy_table()  # (V, d)
    d = W.shape[1]
    index = IDS.reshape(-1, 1).expand(-1, d)  # (B*S, d): every column of a row holds the same id
    return record_gather(W, 0, index, name="W", index_name="ids.reshape(-1, 1).expand(-1, d)",
                         call="W.gather(0, ids.reshape(-1, 1).expand(-1, d))"
                              "  # then .view(B, S, d)",
                         lang=lang)


def formulation_index_select(lang):
    return record_index_select(toy_table(), 0, IDS.reshape(-1), name="W",
                               index_name="ids.reshape(-1)",
                               call="torch.index_select(W, 0, ids.reshape(-1))"
                                    "  # then .view(B, S, d)",
                               lang=lang)


def silent_mistake(lang):
    rec = record_gather(toy_table(), 0, IDS, name="W", index_name="ids",
                        call="W.gather(0, ids)  # wrong: one scalar per token", lang=lang)
    return rec


def topk_selection():
    """A real top-k attention call on a fixed toy input (6 tokens, 1 head, k = 3)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 1, 6, 4, generator=g) for _ in range(3))  # (B, H, L, D)
    v = torch.arange(6).view(1, 1, 6, 1) + torch.arange(4).view(1, 1, 1, 4) / 10  # (B, H, L, D)
    _, sel = topk_attention(q, k, v, 3, is_causal=True, return_selection=True)
    return sel, v


def topk_scores(lang):
    sel, _ = topk_selection()
    return record_attention_selection(sel, labels=["The", "cat", "sat", "on", "the", "mat"],
                                      lang=lang)


def topk_values(lang):
    sel, v = topk_selection()
    q = 5
    keys = sel.indices[0, 0, q]  # (k,) best first
    keys = keys[keys >= 0]
    rec = record_index_select(v[0, 0], 0, keys, name="V", index_name=f"topk_idx[{q}]",
                              call=f"V.index_select(0, topk_idx[{q}])  # value rows of query {q}",
                              lang=lang)
    toks = ["The", "cat", "sat", "on", "the", "mat"]
    rec.source_row_labels = toks
    rec.output_row_labels = [toks[i] for i in keys.tolist()]
    rec.source_axes, rec.index_axes, rec.output_axes = ("L", "D"), ("k",), ("k", "D")
    return rec


WORLD = 3  # the sharded pictures: a vocabulary and a KV cache split over 3 ranks


def dist_vocab_shard(rank):
    """Rank `rank`'s masked partial lookup when W (8, 5) is split by rows over 3 ranks."""
    from gatherlens.trace.sharded import record_vocab_shard, shard_rows

    lo, hi = shard_rows(toy_table().shape[0], WORLD)[rank]
    return lambda lang: record_vocab_shard(IDS, toy_table()[lo:hi], lo, toy_table().shape[0], rank=rank,
                                           world=WORLD, labels=TOKENS, lang=lang)


def dist_vocab_sum(lang):
    from gatherlens.trace.sharded import record_vocab_sum

    return record_vocab_sum(IDS, toy_table(), WORLD, labels=TOKENS, lang=lang)


def dist_pages(lang):
    """Sparse decode over 37 tokens split [16, 12, 9] over 3 ranks (pages of 4), budget 17: 5 pages."""
    from gatherlens.dist import shard_cache, simulate_sharded_decode

    g = torch.Generator().manual_seed(3)
    k, v = (torch.randn(1, 1, 37, 4, generator=g) for _ in range(2))  # (B, Hkv, L, D)
    q = torch.randn(1, 1, 1, 4, generator=g)  # (B, Hq, 1, D)
    _, _, sel = simulate_sharded_decode(q, shard_cache(k, v, [16, 12, 9], page_size=4), budget=17)
    return sel


FIGURES = {
    "embedding": embedding,
    "gather_dim0": EXAMPLES["gather_dim0"],
    "gather_dim1": EXAMPLES["gather_dim1"],
    "formulation_gather": formulation_gather,
    "formulation_index_select": formulation_index_select,
    "silent_mistake": silent_mistake,
    "embedding_large": EXAMPLES["embedding_large"],
    "topk_scores": topk_scores,
    "topk_values": topk_values,
    **{f"dist_vocab_rank{r}": dist_vocab_shard(r) for r in range(WORLD)},
    "dist_vocab_sum": dist_vocab_sum,
    "dist_pages": dist_pages,
}


@functools.lru_cache(maxsize=1)
def smollm2_table():
    """SmolLM2's tied embedding table as shipped (Q8_0 blocks, read in place) and its vocabulary."""
    from gguf import GGUFReader

    from gatherlens.models.files.registry import resolve
    from gatherlens.ops.quant import QuantizedTable

    reader = GGUFReader(resolve("smollm2").path, mode="c")
    field = reader.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(field.parts[i]).decode("utf-8").replace("Ġ", " ") for i in field.data]
    return QuantizedTable.from_reader(reader, "token_embd.weight"), vocab


@functools.lru_cache(maxsize=1)
def smollm2_table_q4_1():
    """The same table re-quantized to Q4_1 by gguf's own quantizer (the format of the other 210 tensors)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from gatherlens.ops.quant import QuantizedTable

    table, _ = smollm2_table()
    blocks = quantize(table.dequantize().numpy(), GGMLQuantizationType.Q4_1)  # (V, 360) uint8
    return QuantizedTable.from_blocks(blocks, "Q4_1", name="token_embd.weight (requantized)")


QUANTIZED_TEXT = ["I", " like", " the", " cat", " and", " the", " dog"]  # " the" twice: its row read once


def quantized_gather(table_of):
    """The gather of a sentence's ids from SmolLM2's table; " cat"'s first block written out."""
    from gatherlens.trace.quantized import record_quantized_embedding

    def make(lang):
        table, vocab = table_of(), smollm2_table()[1]
        ids = torch.tensor([[vocab.index(t) for t in QUANTIZED_TEXT]])  # (1, 7): the tokenizer's own ids
        return record_quantized_embedding(ids, table, labels=QUANTIZED_TEXT, position=3, block=0, lang=lang)
    return make


# real model weights: drawn by main() (and checked by tests/test_quantized_picture.py), not FIGURES
QUANTIZED = {
    "quantized_gather": quantized_gather(lambda: smollm2_table()[0]),
    "quantized_gather_q4_1": quantized_gather(smollm2_table_q4_1),
}


@functools.lru_cache(maxsize=1)
def austen_prompt():
    """SmolLM2 (float32, one thread) and the first 2,048 tokens of Pride and Prejudice: the prompt of the
    page trace and of the prefill map."""
    from gatherlens.eval.corpus import load_text
    from gatherlens.models import load

    torch.set_num_threads(1)
    lm = load("smollm2")
    return lm, lm.encode(load_text("default"), truncation=False)[:, :2048]  # (1, 2048)


def page_trace():
    """Which pages SmolLM2 read while continuing 2,048 tokens of Pride and Prejudice (budget 256, 32
    decode steps, the default settings). Greedy float32 on one thread: the same pages on every run of
    one machine (another CPU may round a logit differently)."""
    from gatherlens.models.runtime.streaming import stream_generate

    lm, ids = austen_prompt()
    return stream_generate(lm, ids, 256, 33, pages=True).trace


PREFILL_LAYER, PREFILL_HEAD = 15, 0  # the middle layer (explain's default), KV head 0


def prefill_map():
    """The key blocks each query block of SmolLM2's layer 15 (KV head 0) gathered in one sparse prefill of the
    same 2,048 tokens with the default setting (antidiagonal scores, stride 8, mass 0.95, blocks of 64: 32 x 32
    blocks). One forward of the prompt (about 20 s on one thread); the same blocks on every run of one machine."""
    from gatherlens.models.attention.prefill import prefill_selections

    lm, ids = austen_prompt()
    return prefill_selections(lm.model, ids)[PREFILL_LAYER]


def main(png: bool = False) -> int:
    from gatherlens.render.page_trace import page_trace_svg
    from gatherlens.render.prefill_map import prefill_map_svg

    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    trace, blocks = page_trace(), prefill_map()
    for lang in ("en", "zh"):
        for name, make in FIGURES.items():
            written.append((OUT / f"{name}.{lang}.svg", make(lang).to_svg(lang=lang)))
        written.append((OUT / f"mistakes.{lang}.svg", mistakes_svg(lang)))
        written.append((OUT / f"page_trace.{lang}.svg", page_trace_svg(trace, lang=lang)))
        written.append((OUT / f"prefill_map.{lang}.svg",
                        prefill_map_svg(blocks, PREFILL_HEAD, layer=PREFILL_LAYER, lang=lang)))
        written += [(OUT / f"{name}.{lang}.svg", make(lang).to_svg(lang=lang)) for name, make in QUANTIZED.items()]
    written.append((OUT / "readme_embedding.svg", embedding("en").to_svg()))
    for path, svg in written:
        path.write_text(svg, encoding="utf-8")
        if png:
            svg_to_png(svg, path.with_suffix(".png"))
    print(f"wrote {len(written)} figures to {OUT}" + (" (+ PNG)" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(png="--png" in sys.argv[1:]))
