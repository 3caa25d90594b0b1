"""Caption text in English and Chinese (图解 for the article's readers).

    >>> text("panel_source", "zh")
    '源张量'
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError

LANGS = ("en", "zh")

STRINGS: dict[str, dict[str, str]] = {
    "panel_source": {"en": "source", "zh": "源张量"},
    "panel_index": {"en": "index", "zh": "索引"},
    "panel_output": {"en": "output", "zh": "输出"},
    "op_gather": {
        "en": "torch.gather copies one element per index entry: along dim {dim} it takes the "
              "position written in the index; every other coordinate stays where it is. The "
              "output has the index's shape.",
        "zh": "torch.gather 为索引中的每个元素复制一个值：在第 {dim} 维上取索引写明的位置，"
              "其余维度的坐标保持不变。输出的形状与索引相同。",
    },
    "op_index_select": {
        "en": "torch.index_select copies whole slices along dim {dim}, in the order the 1-D "
              "index lists them (repeats allowed).",
        "zh": "torch.index_select 沿第 {dim} 维按一维索引给出的顺序复制整片数据（可以重复）。",
    },
    "op_indexing": {
        "en": "Advanced indexing: integer tensors pick positions, slices keep ranges; each output "
              "element is copied from exactly one source element.",
        "zh": "高级索引：整数张量挑选位置，切片保留区间；每个输出元素恰好复制自一个源元素。",
    },
    "op_take_along_dim": {
        "en": "torch.take_along_dim is gather with broadcasting: along dim {dim} it takes the "
              "indexed position, the other dims broadcast.",
        "zh": "torch.take_along_dim 是带广播的 gather：在第 {dim} 维上取索引位置，其余维度按广播规则对齐。",
    },
    "op_take_along_dim_flat": {
        "en": "torch.take_along_dim without dim reads the source as flattened and copies the "
              "element at each flat position.",
        "zh": "不指定 dim 时，torch.take_along_dim 把源张量展平，按每个扁平位置复制元素。",
    },
    "op_embedding": {
        "en": "Embedding lookup: each token id picks a whole row of the (V, d) table; the output "
              "has shape (*ids.shape, d).",
        "zh": "嵌入查找：每个 token id 取出 (V, d) 嵌入矩阵中的一整行；输出形状为 (*ids.shape, d)。",
    },
    "op_topk_attention": {
        "en": "Top-k attention: per query, the {k} keys with the highest scores are picked (best "
              "first; -1 = no key allowed); their scores are gathered and the softmax runs over "
              "these keys only.",
        "zh": "Top-k 注意力：对每个查询，取分数最高的 {k} 个键（从高到低；-1 表示无可用键），"
              "gather 出它们的分数，softmax 只在这些键上计算。",
    },
    "legend": {
        "en": "Colour = position along the gathered dim (the index value). Each output cell shows "
              "the index that picked it (top) and the value copied (bottom). Grey source cells "
              "were not picked.",
        "zh": "颜色 = 被 gather 维度上的位置（即索引值）。每个输出格子上方写着选中它的索引，下方是复制来的值。"
              "灰色的源格子没有被选中。",
    },
    "legend_nodim": {
        "en": "Colour = the source element. Each output cell shows the source coordinate it was "
              "copied from (top) and the value (bottom). Grey source cells were not picked.",
        "zh": "颜色 = 源元素。每个输出格子上方写着它复制自的源坐标，下方是数值。灰色的源格子没有被选中。",
    },
    "more_slices": {"en": "… {n} more", "zh": "… 另有 {n} 片"},
    "hover": {
        "en": "Hover an output cell to see the index cell that chose it and the source cell it "
              "copied.",
        "zh": "把鼠标移到输出格子上，可以看到选中它的索引格子和它复制自的源格子。",
    },
    "mistakes_title": {
        "en": "The article's gather mistakes, drawn beside the fix",
        "zh": "原文中的 gather 错误，与正确写法并排对照",
    },
    "mistake_ndim_title": {
        "en": "✗ 1. torch.gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, d)) raises",
        "zh": "✗ 1. torch.gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, d)) 报错",
    },
    "mistake_ndim_body": {
        "en": "RuntimeError: Index tensor must have the same number of dimensions as input "
              "tensor. The index is 3-D {idx} but the table W is 2-D {src}. gather returns one "
              "element per index entry, shaped like the index, so it cannot turn a 2-D table "
              "into a 3-D (B, S, d) result.",
        "zh": "RuntimeError: Index tensor must have the same number of dimensions as input "
              "tensor。索引是三维的 {idx}，而嵌入矩阵 W 是二维的 {src}。gather 为索引中的每个元素"
              "取一个值，输出与索引同形，所以它无法把二维矩阵直接变成三维的 (B, S, d) 结果。",
    },
    "mistake_silent_title": {
        "en": "✗ 2. W.gather(0, ids) runs (seq_len <= d) and is silently wrong: one scalar "
              "per token",
        "zh": "✗ 2. W.gather(0, ids) 能运行（seq_len <= d）却悄悄出错：每个 token 只得到一个标量",
    },
    "mistake_silent_body": {
        "en": "out[b, s] = W[ids[b, s], s]: token s gets column s of its row, not the row. "
              "gatherlens.diagnose_gather warns about this call.",
        "zh": "out[b, s] = W[ids[b, s], s]：第 s 个 token 只拿到它那一行的第 s 列，而不是整行。"
              "gatherlens.diagnose_gather 会对这种调用发出警告。",
    },
    "mistake_fix_title": {
        "en": "✓ The fix: W[ids] (= W.gather(0, ids.reshape(-1, 1).expand(-1, d)).view(B, S, d))",
        "zh": "✓ 正确写法：W[ids]（等价于 W.gather(0, ids.reshape(-1, 1).expand(-1, d)).view(B, S, d)）",
    },
    "mistake_fix_body": {
        "en": "Each token id picks its whole row: the output is (B, S, d).",
        "zh": "每个 token id 取出整行：输出形状为 (B, S, d)。",
    },
}


def lookup(strings: dict[str, dict[str, str]], key: str, lang: str, **fmt) -> str:
    """strings[key][lang] formatted with `fmt`; a clear error for a language we don't write."""
    if lang not in LANGS:
        raise GatherValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return strings[key][lang].format(**fmt)


def text(key: str, lang: str, **fmt) -> str:
    """The picture string `key` in `lang`, formatted with `fmt`."""
    return lookup(STRINGS, key, lang, **fmt)
