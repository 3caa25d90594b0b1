"""Golden-test fixtures: small fixed records whose SVGs tests/golden/ keeps byte for byte.

    >>> for name, make in EXAMPLES.items():
    ...     make(lang="zh").to_svg()

Every example is deterministic (fixed values, no random numbers) so its SVG is too. Used by
tests/test_render_svg.py, scripts/regen_golden.py and (three of them) scripts/make_figures.py.
"""
from __future__ import annotations

import torch


def _grid(rows: int, cols: int) -> torch.Tensor:
    """(rows, cols) with x[r, c] = r + c / 10: each value says where it sits."""
    return torch.arange(rows).unsqueeze(1) + torch.arange(cols).unsqueeze(0) / 10  # (R, C)


def gather_dim0(lang: str = "en"):
    from gatherlens.trace import record_gather

    idx = torch.tensor([[2, 0, 3, 1], [1, 1, 0, 2]])  # (2, 4)
    return record_gather(_grid(4, 4), 0, idx, lang=lang)


def gather_dim1(lang: str = "en"):
    from gatherlens.trace import record_gather

    idx = torch.tensor([[3, 0], [1, 1], [0, 2]])  # (3, 2)
    return record_gather(_grid(3, 4), 1, idx, lang=lang)


def index_select_rows(lang: str = "en"):
    from gatherlens.trace import record_index_select

    return record_index_select(_grid(5, 3), 0, torch.tensor([4, 0, 4]), lang=lang)


def take_along_sort(lang: str = "en"):
    from gatherlens.trace import record_take_along_dim

    x = torch.tensor([[3.0, 1.0, 2.0], [0.5, 2.5, 1.5]])  # (2, 3)
    return record_take_along_dim(x, x.argsort(dim=1), dim=1, name="x",
                                 index_name="x.argsort(1)", lang=lang)


def indexing_pairs(lang: str = "en"):
    from gatherlens.trace import record_indexing

    return record_indexing(_grid(4, 5), (torch.tensor([3, 0, 3]), slice(1, 4)), lang=lang)


def embedding_tokens(lang: str = "en"):
    from gatherlens.trace import record_embedding

    ids = torch.tensor([[5, 2, 7], [2, 9, 0]])  # (B, S) = (2, 3)
    labels = [["I", "like", "tea"], ["like", "<script>alert(1)</script>", "<pad>"]]
    return record_embedding(ids, _grid(10, 4), labels=labels, lang=lang)


def embedding_large(lang: str = "en"):
    """A GPT-2-sized vocabulary, elided: the picked rows stay visible."""
    from gatherlens.trace import record_embedding

    W = torch.arange(50257).unsqueeze(1) + torch.arange(16).unsqueeze(0) / 100  # (V, d)
    ids = torch.tensor([[464, 3797, 3332, 319, 262, 2603, 13]])  # "The cat sat on the mat."
    toks = ["The", " cat", " sat", " on", " the", " mat", "."]
    return record_embedding(ids, W, labels=toks, lang=lang)


def toy_selection():
    """A top-k selection made by hand with torch.topk on fixed causal scores (no randomness)."""
    from gatherlens.ops.attention import AttentionSelection

    Q = L = 6
    k = 3
    scores = torch.tensor([[0.9, 0.1, 0.4, 0.8, 0.3, 0.6]]).expand(Q, L).clone()  # (Q, L)
    scores += torch.arange(Q).unsqueeze(1) * 0.01  # distinct rows
    allowed = torch.ones(Q, L, dtype=torch.bool).tril()  # causal: key j <= query i
    masked = scores.masked_fill(~allowed, float("-inf"))  # (Q, L)
    vals, idx = masked.topk(k, dim=-1)  # (Q, k): ties -> lower index in torch.topk on CPU
    idx = idx.where(vals > float("-inf"), -1)  # (Q, k), -1 = no key
    weights = torch.softmax(vals, dim=-1).nan_to_num(0.0)  # (Q, k)
    lse = torch.logsumexp(vals, dim=-1)  # (Q,)
    return AttentionSelection(indices=idx[None, None], weights=weights[None, None],
                              scores=vals[None, None], lse=lse[None, None], key_len=L, top_k=k,
                              is_causal=True)


def topk_scores(lang: str = "en"):
    from gatherlens.trace import record_attention_selection

    toks = ["The", "cat", "sat", "on", "the", "mat"]
    return record_attention_selection(toy_selection(), labels=toks, lang=lang)


EXAMPLES = {
    "gather_dim0": gather_dim0,
    "gather_dim1": gather_dim1,
    "index_select_rows": index_select_rows,
    "take_along_sort": take_along_sort,
    "indexing_pairs": indexing_pairs,
    "embedding_tokens": embedding_tokens,
    "embedding_large": embedding_large,
    "topk_scores": topk_scores,
}


# (example, lang) pairs whose SVG is kept byte-for-byte in tests/golden/ (scripts/regen_golden.py)
GOLDEN = [(name, "en") for name in EXAMPLES] + [
    ("embedding_tokens", "zh"), ("topk_scores", "zh"), ("mistakes", "en"), ("mistakes", "zh"),
]


def example_svg(name: str, lang: str = "en") -> str:
    """The SVG of an example by name ("mistakes" is the article's-mistakes figure)."""
    if name == "mistakes":
        from gatherlens.render import mistakes_svg

        return mistakes_svg(lang)
    return EXAMPLES[name](lang=lang).to_svg(lang=lang)
