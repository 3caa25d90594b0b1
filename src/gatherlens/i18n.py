"""Every word a reader of gatherlens sees, in English and Chinese: one table, one list of languages.

    >>> text("panel_source", "zh")
    '源张量'
    >>> text("tokens_title", "en")
    '1. Text → tokens → ids'

Pictures (captions, legends, the mistakes figure), the `explain` report and the captions that
trace/ writes into records all read this one table; `LANGS` is the one list of languages.
The report's sentences are kept short and concrete: each names what the reader sees in the
picture next to it.
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError

__all__ = ["LANGS", "STRINGS", "check_lang", "text", "op_meaning"]

LANGS = ("en", "zh")

STRINGS: dict[str, dict[str, str]] = {
    # -- pictures (gatherlens.render) ------------------------------------------------------------
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
    # -- the report of `gatherlens explain` (gatherlens.report) ----------------------------------
    "page_title": {"en": "The gathers of {model} on your text",
                   "zh": "{model} 在你的文本上做的 gather"},
    "intro": {
        "en": "A Transformer moves data around with gathers: an index says which rows to copy, "
              "and the copy is the result. This page runs {model} once on your text and draws "
              "every step of the article's story with the real model's tensors: the embedding "
              "lookup, the top-k selection in attention, the gather of value rows, and the "
              "prediction. Every figure is also saved as its own SVG file.",
        "zh": "Transformer 靠 gather 搬运数据：索引说明要复制哪些行，复制出来的就是结果。本页用 {model} "
              "在你的文本上运行一次，用真实模型的张量画出原文讲的每一步：嵌入查找、注意力中的 top-k 选择、"
              "value 行的 gather，以及下一个 token 的预测。每张图也单独保存为 SVG 文件。",
    },
    "facts": {
        "en": "{cls} · {layers} layers · {q_heads} query heads over {kv_heads} key/value heads · "
              "vocabulary V = {vocab:,} · hidden size d = {d} · top-k attention with k = {k}",
        "zh": "{cls} · {layers} 层 · {q_heads} 个查询头共用 {kv_heads} 个键/值头 · 词表大小 V = {vocab:,} · "
              "隐藏维度 d = {d} · top-k 注意力，k = {k}",
    },
    "your_text": {"en": "Your text", "zh": "你的文本"},
    "toc": {"en": "Contents", "zh": "目录"},
    # 1. tokens
    "tokens_title": {"en": "1. Text → tokens → ids", "zh": "1. 文本 → token → id"},
    "tokens_body": {
        "en": "The tokenizer cuts the text into {n} tokens and gives each one an id. An id is "
              "nothing but a row number: the next step uses it to pick a row of a table. "
              "(␣ marks a leading space, which belongs to the token.)",
        "zh": "分词器把文本切成 {n} 个 token，并给每个 token 一个 id。id 只是一个行号：下一步用它去表里取一行。"
              "（␣ 表示 token 开头的空格，它是 token 的一部分。）",
    },
    "tokens_bytes": {
        "en": "Tokens written like <0xE7> are single bytes: byte-level BPE has no token for some "
              "characters, so it splits them into their UTF-8 bytes (猫 = <0xE7><0x8C><0xAB>), "
              "and each byte is a token with its own row in the table.",
        "zh": "写成 <0xE7> 这样的 token 是单个字节：字节级 BPE 对某些字符没有现成的 token，就把它们拆成 UTF-8 字节"
              "（猫 = <0xE7><0x8C><0xAB>），每个字节都是一个 token，在表里有自己的一行。",
    },
    "col_pos": {"en": "position", "zh": "位置"},
    "col_token": {"en": "token", "zh": "token"},
    "col_id": {"en": "id", "zh": "id"},
    # 2. embedding
    "emb_title": {"en": "2. Gather #1: the embedding lookup", "zh": "2. 第一次 gather：嵌入查找"},
    "emb_body": {
        "en": "The table {sym} has one row per vocabulary entry: shape ({V:,}, {d}). Each id picks "
              "its whole row, so the {n} ids read {n} rows and nothing else ({kb} of the table's "
              "{mb}). The picture elides the table with ⋮ and … but keeps every picked row visible, "
              "labelled with its token; each output row is coloured like the row it was copied from.",
        "zh": "表 {sym} 为词表中的每个词存一行：形状为 ({V:,}, {d})。每个 id 取出整行，所以 {n} 个 id 只读 {n} 行，"
              "别的都不读（读了 {kb}，整张表有 {mb}）。图中用 ⋮ 和 … 省略了表的大部分，但每个被取的行都保留并标上"
              "它的 token；每个输出行的颜色与它复制自的那一行相同。",
    },
    "emb_extra_title": {"en": "2b. The other lookups: positions and token types",
                        "zh": "2b. 另外两次查找：位置和 token 类型"},
    "emb_extra_body": {
        "en": "{model} is a BERT-style encoder: it does two more embedding gathers. The position "
              "table is indexed by each token's position (0, 1, 2, …), the token-type table by its "
              "segment (all 0 for one sentence, so every token picks the same row). The three rows "
              "of each token are added to give the layer input.",
        "zh": "{model} 是 BERT 式的编码器：它还要做两次嵌入 gather。位置表用每个 token 的位置（0, 1, 2, …）索引，"
              "token 类型表用它所属的句段索引（只有一个句子时全是 0，所以每个 token 都取同一行）。"
              "每个 token 的三行相加，就是第一层的输入。",
    },
    "emb_rope": {
        "en": "{model} has no position table: it rotates queries and keys by their position "
              "(RoPE) instead, so the word-table lookup is its only embedding gather.",
        "zh": "{model} 没有位置表：它按位置旋转查询和键（RoPE），所以词表查找是它唯一的嵌入 gather。",
    },
    # 2, run from GGUF blocks (`explain --quantized`: the word table is a QuantizedTable)
    "emb_q_body": {
        "en": "{model} runs from its GGUF blocks: the table {name} is held as the file stores it, {qtype} of "
              "shape ({V:,}, {d}), {row_bytes} B a row instead of float32's {float_bytes} B. Each id picks "
              "its row of blocks, and only those rows are dequantized, each distinct row once: your {n} ids "
              "read {distinct} rows, {read} of blocks (as float32 rows: {float_read}). Dequantizing the "
              "whole table first would read {size} and write {float_size}. The picture writes out one "
              "block of the first id's row: its scale (and min, where the format has one) and its codes "
              "become the row's values, as the gather returned them.",
        "zh": "{model} 直接从 GGUF 块运行：表 {name} 按文件里的样子保存，格式 {qtype}，形状 ({V:,}, {d})，"
              "每行 {row_bytes} B，而 float32 每行 {float_bytes} B。每个 id 取出它那一行的块，只有这些行被反量化，"
              "每个不同的行只做一次：你的 {n} 个 id 读了 {distinct} 行，共 {read} 的块（若为 float32 行：{float_read}）。"
              "若先反量化整张表，要读 {size}、写 {float_size}。图中展开了第一个 id 那一行的一个块：它的缩放因子"
              "（格式带最小值时还有最小值）和编码变成该行的数值，即 gather 返回的值。",
    },
    # 3. heads
    "heads_title": {"en": "3. Which query heads share which key/value head",
                    "zh": "3. 哪些查询头共用哪个键/值头"},
    "heads_gqa": {
        "en": "Grouped-query attention: {q} query heads, but only {kv} key/value heads. Each group "
              "of {g} query heads reads the same K and V rows, so the keys and values (and the KV "
              "cache) are {g}× smaller. Query head h uses key/value head h // {g}. The report "
              "follows query head {head}, which reads key/value head {kvh}.",
        "zh": "分组查询注意力（GQA）：{q} 个查询头，却只有 {kv} 个键/值头。每组 {g} 个查询头读同一份 K 和 V 的行，"
              "所以键、值（以及 KV 缓存）小了 {g} 倍。查询头 h 使用键/值头 h // {g}。本报告跟踪查询头 {head}，"
              "它读键/值头 {kvh}。",
    },
    "heads_mha": {
        "en": "Multi-head attention: each of the {q} query heads has its own key/value head, so "
              "nothing is shared. The report follows head {head}.",
        "zh": "多头注意力：{q} 个查询头各有自己的键/值头，没有共享。本报告跟踪第 {head} 个头。",
    },
    "heads_q": {"en": "query heads", "zh": "查询头"},
    "heads_kv": {"en": "key/value heads", "zh": "键/值头"},
    # 4. scores
    "scores_title": {"en": "4. Gather #2: each query picks its top-{k} keys",
                     "zh": "4. 第二次 gather：每个查询挑出分数最高的 {k} 个键"},
    "scores_body": {
        "en": "Layer {layer}, query head {head}. Each row is a query (a token asking), each column a "
              "key (a token being asked). The number in a cell is the score q·k × {scale:.3g}; the "
              "colour is the weight dense attention would give that key (darker = more). {why} "
              "Top-k attention keeps only the {k} highest scores of "
              "each row (outlined in red) and ignores the rest: those keys' scores and value "
              "rows are gathered, everything else is never read.",
        "zh": "第 {layer} 层，查询头 {head}。每一行是一个查询（提问的 token），每一列是一个键（被问的 token）。"
              "格子里的数是分数 q·k × {scale:.3g}；颜色是稠密注意力会给这个键的权重（越深越大）。{why}"
              "Top-k 注意力只保留每行分数最高的 {k} 个（红框），其余的忽略：只 gather 这些键的分数和 value 行，"
              "其他的根本不读。",
    },
    "why_causal": {"en": "Grey cells are not allowed: a token cannot look at tokens after it.",
                   "zh": "灰色格子不允许看：一个 token 不能看它后面的 token。"},
    "why_masked": {"en": "Grey cells are not allowed (masked).", "zh": "灰色格子不允许看（被掩码遮住）。"},
    "why_none": {"en": "Every key is allowed: an encoder lets each token look both ways.",
                 "zh": "所有键都允许看：编码器让每个 token 前后都能看。"},
    "scores_legend": {
        "en": "red outline = kept by top-{k} · colour = dense softmax weight · grey = not allowed",
        "zh": "红框 = top-{k} 保留 · 颜色 = 稠密 softmax 权重 · 灰色 = 不允许",
    },
    "scores_axes": {"en": "queries ↓ · keys →", "zh": "查询 ↓ · 键 →"},
    "score_gather_body": {
        "en": "The same selection as a gather: topk_idx holds, for each query, the key positions "
              "it kept (best first; -1 where fewer keys were allowed). scores.gather(-1, topk_idx) "
              "copies their scores into a small (Q, k) tensor, and the softmax runs over that "
              "tensor only.",
        "zh": "同一个选择写成 gather：topk_idx 为每个查询记下它保留的键位置（从高到低；允许的键不足 k 个时填 -1）。"
              "scores.gather(-1, topk_idx) 把这些分数复制进一个小的 (Q, k) 张量，softmax 只在它上面算。",
    },
    # 5. values
    "values_title": {"en": "5. Gather #3: the value rows of one query",
                     "zh": "5. 第三次 gather：一个查询的 value 行"},
    "values_body": {
        "en": "Query {q} ({tok}) kept keys {keys}. Their rows of V (key/value head {kvh}) are "
              "gathered and summed with the softmax weights of the kept scores: "
              "out = {formula}. These {n} keys hold {mass:.1%} of the weight dense attention "
              "would spread over all {allowed} allowed keys.",
        "zh": "查询 {q}（{tok}）保留了键 {keys}。它们在 V（键/值头 {kvh}）中的行被 gather 出来，"
              "按保留分数的 softmax 权重加权求和：out = {formula}。稠密注意力会把权重分给全部 {allowed} 个允许的键，"
              "而这 {n} 个键占了其中的 {mass:.1%}。",
    },
    "sink": {
        "en": "Most of the weight ({w:.0%}) lands on the first token, {tok}, whatever it says: many "
              "heads use it as a resting place when nothing else matters (an “attention sink”). "
              "Try another --layer or --head to see heads that look at meaning.",
        "zh": "大部分权重（{w:.0%}）落在第一个 token {tok} 上，不管它是什么词：很多头在没有别的需要关注时就把注意力"
              "放在那里（所谓“注意力汇点” attention sink）。换一个 --layer 或 --head 可以看到关注词义的头。",
    },
    "col_key": {"en": "key", "zh": "键"},
    "col_score": {"en": "score", "zh": "分数"},
    "col_weight": {"en": "top-k weight", "zh": "top-k 权重"},
    "col_dense": {"en": "dense weight", "zh": "稠密权重"},
    # the explorer (the page's controls and the figures its script draws; {name} placeholders only)
    "ex_controls": {"en": "Explore every head: pick a layer, a head and a query, and move k. The "
                          "figures and tables of sections 3–5 follow.",
                    "zh": "探索每个头：选一层、一个头和一个查询，再移动 k。第 3–5 节的图和表会随之更新。"},
    "ex_layer": {"en": "layer", "zh": "层"},
    "ex_head": {"en": "head", "zh": "头"},
    "ex_query": {"en": "query", "zh": "查询"},
    "ex_k": {"en": "k", "zh": "k"},
    "ex_k_run": {"en": "k = {k} is what the model ran with: the outlines, weights and value rows "
                       "are the model's own top-{k} picks.",
                 "zh": "k = {k} 就是模型运行时用的 k：红框、权重和 value 行都是模型自己的 top-{k} 选择。"},
    "ex_k_moved": {"en": "k = {k} shows the selection k would make from this run's scores (best "
                         "first, ties to the lower key). The model ran with top-{run}: the next-token "
                         "prediction and the table of gathers are for k = {run}.",
                   "zh": "k = {k} 显示的是用本次运行的分数按这个 k 会做出的选择（从高到低，分数相同取较小的键）。"
                         "模型实际用的是 top-{run}：下一个 token 的预测和 gather 总表都是 k = {run} 的结果。"},
    "ex_k_dense": {"en": "Top-k was off: the model ran dense attention (every allowed key). k = {k} "
                         "shows the selection k would make from this run's scores.",
                   "zh": "top-k 已关闭：模型运行的是稠密注意力（所有允许的键）。k = {k} 显示的是用本次运行的分数按这个 k 会做出的选择。"},
    "ex_scores_title": {"en": "scores · layer {layer}, head {head} · top-{k}",
                        "zh": "分数 · 第 {layer} 层，头 {head} · top-{k}"},
    "ex_gather_title": {"en": "scores.gather(-1, topk_idx) · layer {layer}, head {head} · top-{k}",
                        "zh": "scores.gather(-1, topk_idx) · 第 {layer} 层，头 {head} · top-{k}"},
    "ex_value_title": {"en": "V.index_select(0, topk_idx) · layer {layer}, head {head} (KV head "
                             "{kvh}), query {q} {tok}",
                       "zh": "V.index_select(0, topk_idx) · 第 {layer} 层，头 {head}（键/值头 {kvh}），"
                             "查询 {q} {tok}"},
    "ex_heads_title": {"en": "{q} query heads → {kv} key/value heads · layer {layer}, head {head} "
                             "reads KV head {kvh}",
                       "zh": "{q} 个查询头 → {kv} 个键/值头 · 第 {layer} 层，头 {head} 读键/值头 {kvh}"},
    "ex_scores_info": {"en": "query {q} {qt} → key {j} {kt}: score {s}, dense weight {w}",
                       "zh": "查询 {q} {qt} → 键 {j} {kt}：分数 {s}，稠密权重 {w}"},
    "ex_not_allowed": {"en": "not allowed", "zh": "不允许"},
    "ex_kept": {"en": "(kept)", "zh": "（保留）"},
    "ex_more": {"en": "+{n} more", "zh": "另有 {n} 个"},
    "ex_sum": {"en": "out = Σ w·V", "zh": "out = Σ w·V"},
    "ex_weight": {"en": "w", "zh": "w"},
    "ex_noscript": {"en": "This figure is drawn by the page's script for the layer, head, query "
                          "and k you pick; without scripts, open {file} beside this page.",
                    "zh": "这张图由页面脚本按你选的层、头、查询和 k 绘制；不运行脚本时，请打开本页旁边的 {file}。"},
    # issue 20: long texts, the dense / top-k / sparse figure, the clickable generation step
    "kc_title": {"en": "dense · top-k · sparse · layer {layer}, head {head}, query {q} {tok}",
                 "zh": "稠密 · top-k · 稀疏 · 第 {layer} 层，头 {head}，查询 {q} {tok}"},
    "kc_dense_label": {"en": "dense: all {n} keys", "zh": "稠密：全部 {n} 个键"},
    "kc_topk_label": {"en": "top-k: {k} keys", "zh": "top-k：{k} 个键"},
    "kc_sparse_label": {"en": "sparse: {n} pages", "zh": "稀疏：{n} 页"},
    "kc_cells": {"en": "each cell sums the weight of {per} neighbouring keys",
                 "zh": "每格是相邻 {per} 个键的权重之和"},
    "kc_topk_line": {"en": "top-k keeps {k} keys ({keys}): {mass:.1%} of the dense weight; its output is "
                           "{err:.3g} off dense (relative L2)",
                     "zh": "top-k 保留 {k} 个键（{keys}）：占稠密权重的 {mass:.1%}；输出与稠密相差 {err:.3g}（相对 L2）"},
    "kc_sparse_line": {"en": "sparse keeps {n} pages of {P} tokens ({tokens} keys, budget {budget}): "
                             "{mass:.1%} of the dense weight; its output is {err:.3g} off dense (relative L2)",
                       "zh": "稀疏保留 {n} 页、每页 {P} 个 token（{tokens} 个键，预算 {budget}）：占稠密权重的 "
                             "{mass:.1%}；输出与稠密相差 {err:.3g}（相对 L2）"},
    "kc_fig_title": {"en": "Dense, top-k and sparse side by side", "zh": "稠密、top-k 与稀疏并排对比"},
    "kc_body": {"en": "The same query three ways. Dense attention weighs every allowed key; top-k keeps "
                      "the k best-scoring keys; sparse decoding (as Generate runs it: pages of {P} tokens, "
                      "a budget of {budget}) keeps whole pages, chosen by a bound of each page's keys. "
                      "Each strip is shaded by the dense weight it keeps; grey is what it drops. The "
                      "outputs are computed, not estimated: top-k from the kept keys, sparse by the real "
                      "sparse_decode.",
                "zh": "同一个查询的三种做法。稠密注意力给每个允许的键加权；top-k 只保留得分最高的 k 个键；"
                      "稀疏解码（与“生成”一样：每页 {P} 个 token，预算 {budget}）按每页键的上界选出整页。"
                      "每一条按它保留的稠密权重着色；灰色是它丢掉的。输出是算出来的，不是估计：top-k 用保留的键，"
                      "稀疏用真实的 sparse_decode。"},
    "kc_offline": {"en": "This figure shows the run's own choice (layer {layer}, head {head}, query {q}); "
                         "gatherlens serve redraws it for the layer, head and query you pick.",
                   "zh": "这张图显示这次运行自己选的（第 {layer} 层，头 {head}，查询 {q}）；"
                         "gatherlens serve 会按你选的层、头和查询重画。"},
    "lim_offline": {"en": "Limits: this page carries every layer's and head's scores for texts of up to "
                          "{offline} tokens, as 8-bit codes per query row (each score at most {err} off; the "
                          "keys the model kept are stored exactly): {size} of data here. Longer texts, up "
                          "to {live} tokens, open in gatherlens serve, which fetches the rows it shows.",
                    "zh": "限制：本页为不超过 {offline} 个 token 的文本保存每一层、每一个头的分数，按每个查询行存成"
                          " 8 位编码（每个分数最多偏差 {err}；模型保留的键精确保存）：这里的数据共 {size}。"
                          "更长的文本（最多 {live} 个 token）请用 gatherlens serve 打开，它按需取回要显示的行。"},
    "lim_live": {"en": "Limits: up to {live} tokens. This text has {n}: past {offline} tokens the score grid "
                       "shows {rows} query rows around the chosen query and {keys} keys, fetched from the "
                       "server, which keeps this run ({size}) so that a change of layer, head or query "
                       "runs no model; top-k keeps at most {picks:,} keys per head (k ≤ {kmax} here).",
                 "zh": "限制：最多 {live} 个 token。这段文本有 {n} 个：超过 {offline} 个 token 时，分数网格只显示所选"
                       "查询周围的 {rows} 个查询行和 {keys} 个键，从服务器取回；服务器保存这次运行（{size}），"
                       "换层、头或查询都不必再运行模型；top-k 每个头最多保留 {picks:,} 个键（这里 k ≤ {kmax}）。"},
    "ex_window": {"en": "rows {r0}–{r1} and keys {c0}–{c1} of {L}", "zh": "共 {L} 个中的第 {r0}–{r1} 行、第 {c0}–{c1} 个键"},
    "st_click": {"en": "Click a step (a row) to see which tokens it read.",
                 "zh": "点击一步（一行），看它读了哪些 token。"},
    "st_detail": {"en": "step {step} → {tok} · layer {layer}, head {head} (KV head {kvh}): {n} pages, "
                        "tokens {ranges}; they hold {mass} of this step's dense attention weight.",
                  "zh": "第 {step} 步 → {tok} · 第 {layer} 层，头 {head}（键/值头 {kvh}）：{n} 页，"
                        "token {ranges}；它们占这一步稠密注意力权重的 {mass}。"},
    "st_dense": {"en": "With dense attention on the same text so far, the model would choose {dtok} ({p}): {verdict}",
                 "zh": "在同样的已有文本上用稠密注意力，模型会选 {dtok}（{p}）：{verdict}"},
    "st_same": {"en": "the same token.", "zh": "与稀疏解码相同。"},
    "st_diff": {"en": "sparse decoding chose {tok} instead.", "zh": "稀疏解码选的却是 {tok}。"},
    "st_dense_wait": {"en": "The dense choice of every step is computed when the generation ends.",
                      "zh": "每一步的稠密选择在生成结束时计算。"},
    "st_prefill": {"en": "The prompt's step (prefill) attends densely to every token.",
                   "zh": "提示这一步（预填充）稠密地关注每个 token。"},
    # the live explorer (`gatherlens serve`)
    "live_title": {"en": "gatherlens explorer", "zh": "gatherlens 探索器"},
    "live_text": {"en": "Your text (the report follows as you type)",
                  "zh": "你的文本（输入时报告随之更新）"},
    "live_model": {"en": "model", "zh": "模型"},
    "live_topk": {"en": "top-k attention on", "zh": "开启 top-k 注意力"},
    "live_generate": {"en": "Generate with sparse decoding", "zh": "用稀疏解码生成"},
    "live_tokens": {"en": "new tokens", "zh": "新 token 数"},
    "live_stop": {"en": "Stop", "zh": "停止"},
    "ex_busy": {"en": "running the model…", "zh": "模型运行中…"},
    "ex_error": {"en": "error: {message}", "zh": "错误：{message}"},
    "ex_stopped": {"en": "generation stopped", "zh": "生成已停止"},
    "ex_steps_title": {"en": "pages × steps · layer {layer}: which pages of the KV cache each "
                             "decode step gathered (page size {P}, budget {budget} tokens)",
                       "zh": "页 × 步 · 第 {layer} 层：每个解码步 gather 了 KV 缓存的哪些页（页大小 {P}，预算 {budget} 个 token）"},
    "ex_steps_prefill": {"en": "prompt (dense prefill)", "zh": "提示（稠密预填充）"},
    "ex_pages_axis": {"en": "steps ↓ · pages →  (colour: share of the KV heads that read the page)",
                      "zh": "步 ↓ · 页 →（颜色：读了该页的键/值头所占比例）"},
    "ex_no_steps": {"en": "Press the button to decode token by token with page-selected sparse "
                          "attention and watch which pages each step reads.",
                    "zh": "按下按钮，用按页选择的稀疏注意力逐个 token 解码，看每一步读了哪些页。"},
    "live_steps_title": {"en": "Generate: sparse decoding, step by step",
                         "zh": "生成：逐步的稀疏解码"},
    "live_steps_body": {"en": "Each decode step scores every page of the KV cache from its key "
                              "summary and gathers only the best pages within the budget (page 0 "
                              "and the newest page always). Rows are steps, with the token each "
                              "step produced; columns are pages.",
                        "zh": "每个解码步用每页键的摘要给 KV 缓存的所有页打分，只在预算内 gather 最好的页"
                              "（第 0 页和最新一页总会读）。每行是一步及其生成的 token，每列是一页。"},
    # the head gallery (render/gallery.py; the rules: report/heads.py)
    "gal_title": {"en": "Every layer and head at a glance", "zh": "一眼看遍每一层、每一个头"},
    "gal_body": {
        "en": "Each small map is one head's dense attention over your text (queries down, keys "
              "across, darker = more weight; at most {grid} × {grid} blocks). Under it: what the head "
              "does, measured from those weights, and the share of the dense weight its top-{k} keeps. "
              "Click a head to open it in the sections below. (The gallery takes {size} of this page.)",
        "zh": "每张小图是一个头对你的文本的稠密注意力（查询向下、键向右，越深权重越大；最多 {grid} × {grid} 块）。"
              "图下是从这些权重量出的这个头的作用，以及 top-{k} 保留了多少稠密权重。"
              "点击一个头，下面各节就显示它。（这个总览占本页 {size}。）",
    },
    "gal_rules": {
        "en": "How a head is named, from its weights on the queries at positions 2 and later (there "
              "key 0, the previous key and the query itself are three different keys); the first rule "
              "that holds wins: copying (induction) when, on queries whose token appeared earlier, at "
              "least {copying} of the weight is on the tokens right after those earlier copies; "
              "previous token when at least {previous} is on key t − 1; first-token sink when at least "
              "{sink} is on key 0; broad when the weights' entropy is at least {broad} of its most "
              "(log of the allowed keys); else mixed.",
        "zh": "头的名字由它在第 2 个及以后位置的查询上的权重决定（这些位置上第 0 个键、前一个键和查询本身是三个不同的键），"
              "按顺序取第一条成立的规则：复制（归纳）——在其 token 之前出现过的查询上，至少 {copying} 的权重落在"
              "那些较早出现之后紧跟的 token 上；前一个词——至少 {previous} 落在键 t − 1 上；首词汇聚——至少 "
              "{sink} 落在键 0 上；广泛——权重的熵至少是其最大值（允许键数的对数）的 {broad}；否则为混合。",
    },
    "gal_fig_title": {"en": "{layers} layers × {heads} heads · what each head does · top-{k}",
                      "zh": "{layers} 层 × {heads} 头 · 每个头做什么 · top-{k}"},
    "gal_layer_axis": {"en": "layers →  ·  heads ↓", "zh": "层 →  ·  头 ↓"},
    "gal_head": {"en": "head {h}", "zh": "头 {h}"},
    "gal_kept": {"en": "Under each map: the share of the dense weight the run's top-{k} keeps (mean over "
                       "queries).",
                 "zh": "每张图下：这次运行的 top-{k} 保留的稠密权重占比（对所有查询取平均）。"},
    "gal_kept_dense": {"en": "Top-k was off: the run kept every allowed key, so every head keeps 100%.",
                       "zh": "top-k 已关闭：这次运行保留了所有允许的键，所以每个头都保留 100%。"},
    "gal_short_sink": {"en": "sink", "zh": "首词"},
    "gal_short_previous": {"en": "prev", "zh": "前词"},
    "gal_short_copying": {"en": "copy", "zh": "复制"},
    "gal_short_broad": {"en": "broad", "zh": "广泛"},
    "gal_short_mixed": {"en": "mixed", "zh": "混合"},
    "gal_tag_sink": {"en": "first-token sink", "zh": "首词汇聚"},
    "gal_tag_previous": {"en": "previous token", "zh": "前一个词"},
    "gal_tag_copying": {"en": "copying (induction)", "zh": "复制（归纳）"},
    "gal_tag_broad": {"en": "broad", "zh": "广泛"},
    "gal_tag_mixed": {"en": "mixed", "zh": "混合"},
    "gal_info": {"en": "layer {layer}, head {head}: {tag}; top-{k} keeps {kept} of the dense weight",
                 "zh": "第 {layer} 层，头 {head}：{tag}；top-{k} 保留了 {kept} 的稠密权重"},
    # 6. prediction
    "pred_title": {"en": "6. The next token: a row of the logits",
                   "zh": "6. 下一个 token：logits 的一行"},
    "pred_body": {
        "en": "After the last layer the model scores every vocabulary entry for the next token: "
              "one row of {V:,} logits for the last position ({tok}). Picking the best five is one "
              "more gather, logits.gather(-1, top5). With top-k attention (k = {k}) the model "
              "predicts {best}; with dense attention it predicts {dense}.",
        "zh": "最后一层之后，模型为下一个 token 给词表里的每一项打分：最后一个位置（{tok}）的一行，共 {V:,} 个 logits。"
              "挑出最好的五个又是一次 gather：logits.gather(-1, top5)。用 top-k 注意力（k = {k}）时模型预测 {best}；"
              "用稠密注意力时预测 {dense}。",
    },
    "pred_tied": {
        "en": " The LM head of {model} is the embedding table itself (tied weights): logit i is "
              "the dot product of the last hidden state with row i of the table from step 2.",
        "zh": " {model} 的输出层就是嵌入表本身（权重共享）：第 i 个 logit 是最后的隐藏状态与第 2 步那张表第 i 行的点积。",
    },
    "pred_none": {
        "en": "{model} is an encoder: it predicts no next token. Its output is one vector per "
              "token (for sentence embeddings, their mean), so this step is left out.",
        "zh": "{model} 是编码器：它不预测下一个 token。它的输出是每个 token 一个向量（句向量取它们的平均），"
              "所以这一步略去。",
    },
    "col_rank": {"en": "rank", "zh": "名次"},
    "col_logit": {"en": "logit", "zh": "logit"},
    "col_prob": {"en": "probability", "zh": "概率"},
    "topk_run": {"en": "top-k attention (k = {k})", "zh": "top-k 注意力（k = {k}）"},
    "dense_run": {"en": "dense attention", "zh": "稠密注意力"},
    # 7. table
    "table_title": {"en": "7. Every gather of the forward pass", "zh": "7. 前向传播中的每一次 gather"},
    "table_body": {
        "en": "gatherlens.trace() watched every torch call of the forward pass and kept the "
              "gather-like ones: {events} calls, {bytes} read in all. Calls of the same op in the "
              "same place of every layer are grouped (layers.* = all layers).",
        "zh": "gatherlens.trace() 观察了前向传播里的每一个 torch 调用，留下所有类似 gather 的操作：共 {events} 次调用，"
              "总共读取 {bytes}。同一操作在每一层同一位置的调用合并为一行（layers.* 表示所有层）。",
    },
    "table_kernel": {
        "en": "The gather and scatter calls inside attention come from the top-k kernel itself: "
              "it gathers the kept scores and key positions, chunk by chunk.",
        "zh": "注意力模块里的 gather 和 scatter 调用来自 top-k 内核本身：它分块 gather 保留下来的分数和键位置。",
    },
    "col_op": {"en": "op", "zh": "操作"},
    "col_meaning": {"en": "what it does", "zh": "作用"},
    "col_module": {"en": "module", "zh": "模块"},
    "col_count": {"en": "calls", "zh": "次数"},
    "col_shapes": {"en": "source → index → output (first call)", "zh": "源 → 索引 → 输出（第一次调用）"},
    "col_bytes": {"en": "bytes read", "zh": "读取字节"},
    "total": {"en": "total", "zh": "合计"},
    # footer
    "files_title": {"en": "Files", "zh": "文件"},
    "files_body": {"en": "Each figure of this page is also in its own SVG file beside it:",
                   "zh": "本页的每张图也单独保存在旁边的 SVG 文件中："},
    "rerun": {"en": "Made with", "zh": "生成命令"},
    # -- what each traced op means, for the report's table: meaning_<op> -------------------------
    "meaning_embedding": {"en": "a table lookup: each id picks a row (step 2)",
                          "zh": "查表：每个 id 取一行（第 2 步）"},
    "meaning_topk_attention": {
        "en": "each query picks its top-k keys, then their scores and value rows are gathered "
              "(steps 4 and 5)",
        "zh": "每个查询挑出 top-k 个键，再 gather 它们的分数和 value 行（第 4、5 步）",
    },
    "meaning_gather": {"en": "torch.gather: one element per index entry",
                       "zh": "torch.gather：索引中的每个元素取一个值"},
    "meaning_index_select": {"en": "whole slices picked by a 1-D index", "zh": "按一维索引取整片"},
    "meaning_take_along_dim": {"en": "gather with broadcasting", "zh": "带广播的 gather"},
    "meaning_take": {"en": "elements of the flattened tensor", "zh": "按展平后的位置取元素"},
    "meaning_index": {"en": "advanced indexing x[idx]", "zh": "高级索引 x[idx]"},
    "meaning_scatter": {"en": "a write by index (the mirror of gather)",
                        "zh": "按索引写入（gather 的镜像）"},
    "meaning_scatter_add": {"en": "an add by index", "zh": "按索引累加"},
    "meaning_index_put": {"en": "a write by index, e.g. into a KV cache",
                          "zh": "按索引写入，例如写进 KV 缓存"},
    "meaning_index_copy": {"en": "rows written by index, e.g. into a static KV cache",
                           "zh": "按索引写入整行，例如写进静态 KV 缓存"},
    "meaning_cross_entropy": {"en": "the loss gathers each target's log-probability",
                              "zh": "损失函数 gather 每个目标 token 的对数概率"},
    "meaning_nll_loss": {"en": "the loss gathers each target's log-probability",
                         "zh": "损失函数 gather 每个目标 token 的对数概率"},
    # -- record captions written by trace/ --------------------------------------------------------
    "caption_page_selection": {
        "en": ("Sparse decode reads {n} of {N} pages ({tokens} of {L} tokens, budget {budget}): each "
               "page is scored by an upper bound of q.k from its keys' element-wise min and max, the "
               "best pages within the budget are gathered (page 0, the attention sinks, and the last "
               "page, the newest tokens, always), and attention runs over those keys exactly."),
        "zh": ("稀疏解码只读取 {N} 页中的 {n} 页（{L} 个 token 中的 {tokens} 个，预算 {budget}）："
               "每页用其键的逐元素最小值和最大值给出 q.k 的上界打分，在预算内 gather 得分最高的页"
               "（第 0 页即注意力汇聚点、最后一页即最新的 token 总会保留），再在这些键上精确计算注意力。"),
    },
    "caption_sampling": {
        "en": ("Sampling is a gather over the vocabulary: the chain kept {n} of {V} token ids ({stages}), "
               "gathered their logits, renormalized them at temperature {temperature} and drew {token} "
               "(u = {uniform})."),
        "zh": ("采样是在词表上的一次 gather：采样链从 {V} 个 token id 中保留 {n} 个（{stages}），"
               "gather 它们的 logits，在温度 {temperature} 下重新归一化，抽中 {token}（u = {uniform}）。"),
    },
    # -- the pages x steps picture of a generation (render/page_trace.py) ------------------------
    "page_trace_title": {
        "en": "Pages read by every layer at every decode step ({steps} steps, page {P} tokens, {budget})",
        "zh": "每一层在每个解码步读取的页（{steps} 步，每页 {P} 个 token，{budget}）",
    },
    "page_trace_legend": {
        "en": ("Each panel is one layer: columns are decode steps (left to right), rows are pages of the "
               "KV cache (page 0 at the top; the cache grows downwards). Blue: the page was gathered "
               "(darker = more of the layer's selecting heads read it); grey: in the cache, not read; orange: "
               "the layer read every page without choosing (dense)."),
        "zh": ("每个小图是一层：列是解码步（从左到右），行是 KV 缓存的页（第 0 页在最上方，缓存向下增长）。"
               "蓝色：该页被 gather（颜色越深，该层读取它的选择头越多）；灰色：在缓存中但未读取；"
               "橙色：该层不做选择、读取了全部页（稠密）。"),
    },
    "page_trace_panel": {
        "en": "layer {layer}: {pages:.1f} of {total} pages per step on average",
        "zh": "第 {layer} 层：平均每步读取 {total} 页中的 {pages:.1f} 页",
    },
    "page_trace_dense": {"en": "dense", "zh": "稠密"},
    "page_trace_budget": {"en": "budget {budget} tokens", "zh": "预算 {budget} 个 token"},
    "page_trace_budget_auto": {"en": "budget auto: {pages:.1f} pages a head a step on average",
                               "zh": "自动预算：每个头每步平均读取 {pages:.1f} 页"},
    "page_trace_panel_heads": {
        "en": "layer {layer}: {pages:.1f} of {total} pages per step on average, {head:.1f} per selecting head",
        "zh": "第 {layer} 层：平均每步读取 {total} 页中的 {pages:.1f} 页，每个选择头 {head:.1f} 页",
    },
    "page_trace_no_budget": {"en": "dense decoding", "zh": "稠密解码"},
    # -- the query-block x key-block map of a sparse prefill (render/prefill_map.py) ---------------
    "prefill_map_title": {
        "en": "Key blocks each query block gathered in prefill (layer {layer}, head {head}, blocks of {block} tokens, "
              "{kept:.0%} of the causal blocks)",
        "zh": "预填充中每个查询块 gather 的键块（第 {layer} 层，第 {head} 个头，每块 {block} 个 token，"
              "保留因果块的 {kept:.0%}）",
    },
    "prefill_map_legend": {
        "en": ("Rows are query blocks (the prompt's first block at the top), columns key blocks. Blue: the block "
               "was gathered and attended; grey: causality allowed it, the {rule} rule skipped it; white: a later "
               "block (never attended). The first column (the attention sink) and the diagonal are always kept."),
        "zh": ("行是查询块（提示的第一块在最上方），列是键块。蓝色：该块被 gather 并参与注意力；灰色：因果关系允许，"
               "但 {rule} 规则跳过了它；白色：更靠后的块（从不参与）。第一列（注意力汇聚点）和对角线总会保留。"),
    },
    "prefill_map_axes": {"en": "key blocks → · query blocks ↓", "zh": "键块 → · 查询块 ↓"},
    # the explorer's prefill section (report/sections.py, drawn by explore.js; ex_*: {name} placeholders only)
    "pf_title": {"en": "5b. Sparse prefill: the key blocks each query block gathered",
                 "zh": "5b. 稀疏预填充：每个查询块 gather 的键块"},
    "pf_body": {
        "en": ("The text was also prefilled block-sparsely: its {L} tokens cut into {nq} blocks of {block}; for each "
               "block of queries the {rule} rule estimated how much attention every earlier key block gets, and the "
               "prefill gathered {choice} (plus the first block and the {local} nearest), then attended only to "
               "those. Over every layer and head it kept {kept:.0%} of the causal blocks. The map follows the layer "
               "and head chosen above."),
        "zh": ("这段文本还做了一次块稀疏预填充：{L} 个 token 切成 {nq} 块，每块 {block} 个；对每个查询块，{rule} 规则"
               "估计每个更早的键块能得到多少注意力，预填充 gather 了{choice}（外加第一块和最近的 {local} 块），"
               "然后只对这些块做注意力。所有层和头合计保留了因果块的 {kept:.0%}。下图随上方选择的层和头变化。"),
    },
    "pf_mass": {"en": "the best ones until {threshold:.0%} of that estimate was covered",
                "zh": "估计最高的键块，直到覆盖估计的 {threshold:.0%}"},
    "pf_budget": {"en": "the best {budget}", "zh": "估计最高的 {budget} 块"},
    "pf_mass_budget": {"en": "the best ones until {threshold:.0%} of that estimate was covered, at most {budget}",
                       "zh": "估计最高的键块，直到覆盖估计的 {threshold:.0%}，至多 {budget} 块"},
    "pf_every": {"en": "every causal block", "zh": "每一个因果块"},
    "pf_share": {
        "en": ("Layer {layer}, head {head} reads the map of KV head {group} (the heads of a group share one choice): "
               "{kept} of its {allowed} causal key blocks were gathered, {share:.0%}."),
        "zh": "第 {layer} 层的头 {head} 用的是键/值头 {group} 的图（同组的头共用一个选择）：{allowed} 个因果键块中 "
              "gather 了 {kept} 个，占 {share:.0%}。",
    },
    "pf_encoder": {"en": "{model} is an encoder (every token attends to every other): there is no causal prefill "
                         "to make sparse, so no block map.",
                   "zh": "{model} 是编码器（每个 token 都关注所有 token）：没有因果预填充可做稀疏，因此没有块图。"},
    "ex_prefill_title": {"en": "prefill · layer {layer}, head {head} (KV head {group}) · blocks of {block} "
                               "tokens · {share} of the causal blocks gathered",
                         "zh": "预填充 · 第 {layer} 层，头 {head}（键/值头 {group}）· 每块 {block} 个 token · "
                               "gather 了因果块的 {share}"},
    "ex_prefill_info": {"en": "query block {i} (tokens {qa}–{qb}) × key block {j} (tokens {ka}–{kb}): {state}",
                        "zh": "查询块 {i}（token {qa}–{qb}）× 键块 {j}（token {ka}–{kb}）：{state}"},
    "ex_prefill_kept": {"en": "gathered", "zh": "已 gather"},
    "ex_prefill_skipped": {"en": "allowed, skipped by the rule", "zh": "允许，但被规则跳过"},
    "ex_prefill_outside": {"en": "not allowed (a later block)", "zh": "不允许（更靠后的块）"},
    "ex_prefill_dense": {"en": "Layer {layer} prefilled densely: it has no block map.",
                         "zh": "第 {layer} 层是稠密预填充的：没有块图。"},
    "live_prefill": {"en": "sparse prefill map", "zh": "稀疏预填充图"},
    # -- record captions of gatherlens.dist (trace/sharded.py) ------------------------------------
    "caption_vocab_shard": {
        "en": ("Rank {rank} of {world} holds rows {rows} of the ({V}, d) table. It looks up only the "
               "ids it owns: ids - {lo}, every id outside its rows masked (-1 here: looked up as row 0, "
               "then zeroed). Its partial output has zero rows for the other ranks' tokens."),
        "zh": ("第 {rank} 号进程（共 {world} 个）持有 ({V}, d) 嵌入表的第 {rows} 行。它只查找自己拥有的 id："
               "ids - {lo}，不属于这些行的 id 被屏蔽（此处为 -1：按第 0 行查找后置零）。"
               "其部分输出在其他进程的 token 处为全零行。"),
    },
    "caption_vocab_sum": {
        "en": ("all_reduce(SUM) of the {world} partial lookups: each token's row is owned by exactly one "
               "rank (row label r = the owning rank), the other ranks add zeros, so the sum equals the "
               "one-process lookup bit for bit."),
        "zh": ("对 {world} 个部分查找结果做 all_reduce(SUM)：每个 token 的行恰好属于一个进程（行标签 r "
               "为所属进程），其他进程加的是零，所以求和结果与单进程查找逐位相同。"),
    },
    "caption_sharded_pages": {
        "en": ("Sharded sparse decode: {world} ranks hold {L} tokens in {N} pages (one row per rank; "
               "column c of a rank's row is its local page c). Each rank scores its own pages and sends "
               "its best {n} as (bound, page id); every rank merges the same candidates and reads the "
               "same {n} pages (coloured by the rank that holds them; page 0 and the newest page "
               "always): the pages one process reads with budget {budget}."),
        "zh": ("分片稀疏解码：{world} 个进程共持有 {L} 个 token，分为 {N} 页（每个进程一行；该行第 c 列是它的"
               "本地第 c 页）。每个进程给自己的页打分，只发送最好的 {n} 个（上界, 页号）；所有进程合并同样的"
               "候选，读取同样的 {n} 页（按持有它们的进程着色；第 0 页和最新一页总会保留），"
               "与单进程在预算 {budget} 下读取的页相同。"),
    },
    # -- the terminal summary of `explain` and the report's own figures (render/summary.py,
    #    render/report_figures.py); the columns reuse the report's col_* words ----------------
    "sum_text": {"en": "text: ", "zh": "文本："},
    "sum_tokens": {"en": "1-2. tokens → ids → rows of the embedding table",
                   "zh": "1-2. token → id → 嵌入表的行"},
    "sum_pos": {"en": "pos", "zh": "位置"},
    "sum_values": {"en": "{table}[id] (first {n} of {d})", "zh": "{table}[id]（{d} 个值中的前 {n} 个）"},
    "sum_lookup": {"en": "embedding gather ", "zh": "嵌入 gather "},
    "sum_lookup_body": {
        "en": ": table ({V:,}, {d}) [ids ({n},)] → ({n}, {d}); {distinct} distinct rows read, "
              "{read} of {size}",
        "zh": "：表 ({V:,}, {d}) [ids ({n},)] → ({n}, {d})；读了 {distinct} 个不同的行，"
              "{read}，整张表 {size}",
    },
    "sum_heads": {"en": "3. heads ", "zh": "3. 注意力头"},
    "sum_heads_gqa": {"en": "(grouped-query: {q} query heads over {kv} KV heads): ",
                      "zh": "（分组查询：{q} 个查询头共用 {kv} 个键/值头）："},
    "sum_heads_mha": {"en": "(multi-head: {q} query heads over {kv} KV heads): ",
                      "zh": "（多头：{q} 个查询头，{kv} 个键/值头）："},
    "sum_keys": {
        "en": "4-5. top-{k} keys of query {q} ({tok}) · layer {layer}, head {head} (KV head {kvh})",
        "zh": "4-5. 查询 {q}（{tok}）的 top-{k} 个键 · 第 {layer} 层，头 {head}（键/值头 {kvh}）",
    },
    "sum_keys_mass": {
        "en": "   these {n} keys hold {mass:.0%} of the dense attention weight; their value rows "
              "are gathered: V.index_select(0, {picked})",
        "zh": "   这 {n} 个键占稠密注意力权重的 {mass:.0%}；它们的 value 行被 gather 出来："
              "V.index_select(0, {picked})",
    },
    "sum_encoder": {"en": "6. {model} is an encoder: no next-token prediction.",
                    "zh": "6. {model} 是编码器：没有下一个 token 的预测。"},
    "sum_next": {"en": "6. next token after {tok}: logits[:, -1].gather(-1, top5)",
                 "zh": "6. {tok} 之后的下一个 token：logits[:, -1].gather(-1, top5)"},
    "sum_topk": {"en": "top-k (k={k})", "zh": "top-k（k={k}）"},
    "sum_dense": {"en": "dense", "zh": "稠密"},
    "sum_prob": {"en": "prob", "zh": "概率"},
    "sum_gathers": {"en": "7. every gather of the forward pass ({events} calls, {bytes} read)",
                    "zh": "7. 前向传播中的每一次 gather（{events} 次调用，读取 {bytes}）"},
    "module_top": {"en": "(top)", "zh": "（顶层）"},
    "sum_report": {"en": "report: ", "zh": "报告："},
    "sum_files": {"en": "  (+ {n} files: {names})", "zh": "  （另有 {n} 个文件：{names}）"},
    "fig_heads_title": {"en": "{q} query heads → {kv} key/value heads",
                        "zh": "{q} 个查询头 → {kv} 个键/值头"},
    "fig_cell_masked": {"en": "query {q} {qt} → key {j} {kt}: not allowed",
                        "zh": "查询 {q} {qt} → 键 {j} {kt}：不允许"},
    # -- the picture of a gather from GGUF blocks (trace/quantized.py, render/quantized_scene.py) --
    "qg_title": {
        "en": "Gather from GGUF blocks: {name} is {qtype}, ({V:,}, {d}), {row_bytes} B a row (float32: {float_bytes} B)",
        "zh": "从 GGUF 块中 gather：{name} 为 {qtype}，({V:,}, {d})，每行 {row_bytes} B（float32：{float_bytes} B）",
    },
    "qg_caption": {
        "en": ("Each id picks one row of the table, stored as {nb} blocks of {elems} weights ({block_bytes} B "
               "each; the dark part holds the block's scale, and its min where the format has one). Only the "
               "picked rows are read and "
               "dequantized to float32, each distinct row once ({distinct} rows for {n} ids); the rest of the "
               "table is never touched, as in llama.cpp's get_rows."),
        "zh": ("每个 id 取出表中的一行，这一行存为 {nb} 个块，每块 {elems} 个权重（每块 {block_bytes} B；深色部分是"
               "块的缩放因子，格式带最小值时也包括最小值）。只读取被选中的行并反量化为 float32，每个不同的行只做一次（{n} 个 id 共 "
               "{distinct} 行）；表的其余部分完全不碰，与 llama.cpp 的 get_rows 相同。"),
    },
    "qg_ids": {"en": "ids", "zh": "id"},
    "qg_rows_head": {
        "en": "rows of blocks: {nb} × {block_bytes} B = {row_bytes} B a row ({elems} weights a block)",
        "zh": "由块组成的行：{nb} × {block_bytes} B = 每行 {row_bytes} B（每块 {elems} 个权重）",
    },
    "qg_id_info": {"en": "id #{i} = {row}: reads row {row}", "zh": "第 {i} 个 id = {row}：读取第 {row} 行"},
    "qg_again": {"en": "same row as id #{j}: read once", "zh": "与第 {j} 个 id 同一行：只读一次"},
    "qg_row": {"en": "→ row {row}", "zh": "→ 第 {row} 行"},
    "qg_more_ids": {"en": "⋮ {n} more ids", "zh": "⋮ 另有 {n} 个 id"},
    "qg_byte_info": {"en": "byte {k} of the block: {value} ({field})", "zh": "块的第 {k} 个字节：{value}（{field}）"},
    "qg_block_title": {
        "en": "id #{i} → row {row}, block {block} written out: weights {start}–{end} of the row",
        "zh": "第 {i} 个 id → 第 {row} 行，展开第 {block} 块：该行的第 {start}–{end} 个权重",
    },
    "qg_codes": {
        "en": "{bits}-bit codes q (above) → values w = {formula} in float32 (below), as the gather returned them",
        "zh": "{bits} 位编码 q（上）→ 数值 w = {formula}，float32（下），即 gather 返回的值",
    },
    "qg_code_info": {"en": "weight {w}: q = {q} → w = {value}", "zh": "第 {w} 个权重：q = {q} → w = {value}"},
    "qg_nibbles": {
        "en": "Nibble order: byte j of qs holds weight j in its low 4 bits and weight j + 16 in its high 4 bits.",
        "zh": "半字节顺序：qs 的第 j 个字节，低 4 位是第 j 个权重，高 4 位是第 j + 16 个权重。",
    },
    "qg_order": {
        "en": ("Float32 arithmetic in ggml's order (the product, then the add): every value is bit-equal to "
               "gguf's own dequantize of the same row."),
        "zh": "按 ggml 的顺序做 float32 运算（先乘后加）：每个值都与 gguf 自己对同一行的反量化逐位相同。",
    },
    "qg_bytes": {
        "en": ("{n} ids, {distinct} distinct rows: {read} of blocks read (float32 rows: {float_read}); "
               "dequantizing the whole table first reads {size} and writes {float_size}."),
        "zh": ("{n} 个 id，{distinct} 个不同的行：读取 {read} 的块（float32 行：{float_read}）；"
               "先反量化整张表则要读 {size}、写 {float_size}。"),
    },
    "qg_hint": {"en": "Hover a cell for its byte, code or value.", "zh": "把鼠标悬停在格子上，查看字节、编码或数值。"},
    # -- issue 39: every layer as it really attends, the model map, new gathers, sampling, phones ----------
    "layer_full": {"en": "global", "zh": "全局"},
    "layer_sliding": {"en": "sliding", "zh": "滑动窗口"},
    "layer_chunked": {"en": "chunked", "zh": "分块"},
    "layer_window": {"en": "{kind} {window}", "zh": "{kind} {window}"},
    "scores_window_legend": {"en": "Tan: earlier keys outside this {kind} layer's window of {window} (the brown "
                                   "line is its edge).",
                             "zh": "浅棕色：这个{kind}层的 {window} 个 token 窗口之外的更早的键（棕线是窗口边缘）。"},
    "lim_offline_long": {"en": "Limits: this text has {n} tokens. Past {offline} tokens an offline page keeps, for every "
                               "layer and head, the query rows {r0}–{r1} around the drawn query (8-bit codes, each "
                               "score at most {err} off): {size} of data here. gatherlens serve fetches any other row "
                               "(up to {live} tokens); explain --query moves this window.",
                         "zh": "限制：这段文本有 {n} 个 token。超过 {offline} 个 token 时，离线页面为每一层、每一个头保存所画"
                               "查询周围的第 {r0}–{r1} 个查询行（8 位编码，每个分数最多偏差 {err}）：这里的数据共 {size}。"
                               "gatherlens serve 可以取回其他任何行（最多 {live} 个 token）；explain --query 可以移动这个窗口。"},
    "gal_kind_full": {"en": "G", "zh": "全"},
    "gal_kind_sliding": {"en": "S", "zh": "滑"},
    "gal_kind_chunked": {"en": "C", "zh": "块"},
    "gal_kinds": {"en": "Above each layer: G = global (every earlier key), S512 = sliding window of 512 keys, "
                        "C = chunked.",
                  "zh": "每层上方：全 = 全局（所有更早的键），滑512 = 512 个键的滑动窗口，块 = 分块。"},
    "gal_thumb_label": {"en": "L{layer} H{head} {tag} {kept}", "zh": "第{layer}层 头{head} {tag} {kept}"},
    "ex_steps_ring": {"en": "Layer {layer} is {kind}: it keeps its last {window} tokens in a ring and reads all of "
                            "them at every step (orange), so it chooses no pages; only global layers choose.",
                      "zh": "第 {layer} 层是{kind}：它把最近的 {window} 个 token 存在一个环里，每一步全部读取（橙色），"
                            "所以不选页；只有全局层选页。"},
    "st_ring": {"en": "step {step} → {tok} · layer {layer} ({kind}): no page choice; its ring of tokens {ranges} "
                      "is read whole, as dense attention reads it.",
                "zh": "第 {step} 步 → {tok} · 第 {layer} 层（{kind}）：不选页；它的环（第 {ranges} 个 token）被整体读取，"
                      "与稠密注意力一样。"},
    "info_no_source": {"en": "(no source)", "zh": "（没有来源）"},
    "info_weight": {"en": "; weight {w:.3f}", "zh": "；权重 {w:.3f}"},
    "note_batch_head": {"en": "batch {batch}, head {head}", "zh": "批 {batch}，头 {head}"},
    "note_value_gather": {"en": "layer {layer}, KV head {kv}, query {query} {tok}",
                          "zh": "第 {layer} 层，键/值头 {kv}，查询 {query} {tok}"},
    "note_last_row": {"en": "the row of the last position", "zh": "最后一个位置的那一行"},
    "col_of": {"en": "{run}: {col}", "zh": "{run}：{col}"},
    "ex_k_all": {"en": "This query may see only {n} keys, so top-{k} keeps them all: pick a later query, a "
                       "smaller k or a longer text to see a choice.",
                 "zh": "这个查询只能看到 {n} 个键，所以 top-{k} 全部保留：选一个更靠后的查询、更小的 k 或更长的文本，"
                       "才能看到取舍。"},
    "live_lang": {"en": "language", "zh": "语言"},
    "map_title": {"en": "Where am I: {model}, and every gather it runs (click a tag)",
                  "zh": "我在哪儿：{model} 和它运行的每一次 gather（点一个标签）"},
    "map_ids": {"en": "ids", "zh": "id"},
    "map_embed": {"en": "embedding", "zh": "嵌入"},
    "map_attention": {"en": "attention", "zh": "注意力"},
    "map_mlp": {"en": "MLP", "zh": "MLP"},
    "map_mlp_moe": {"en": "MoE MLP", "zh": "MoE MLP"},
    "map_norm": {"en": "norm", "zh": "归一化"},
    "map_head": {"en": "LM head", "zh": "输出头"},
    "map_next_token": {"en": "next token", "zh": "下一个 token"},
    "map_layers": {"en": "× {n} layers", "zh": "× {n} 层"},
    "map_layers_mixed": {"en": "× {n} layers: {local} {kind} {window}, {full} global",
                         "zh": "× {n} 层：{local} 层{kind} {window}，{full} 层全局"},
    "map_embedding": {"en": "W[ids]: a row per token", "zh": "W[ids]：每个 token 一行"},
    "map_scale": {"en": "rows × √d (Gemma)", "zh": "行 × √d（Gemma）"},
    "map_position": {"en": "position rows", "zh": "位置表的行"},
    "map_rope": {"en": "cos/sin rows by position", "zh": "按位置取 cos/sin 行"},
    "map_topk": {"en": "top-k keys per query", "zh": "每个查询取 top-k 个键"},
    "map_pages": {"en": "sparse pages (decode)", "zh": "稀疏页（解码）"},
    "map_prefill": {"en": "sparse prefill (blocks)", "zh": "稀疏预填充（块）"},
    "map_moe": {"en": "top-k experts per token", "zh": "每个 token 取 top-k 个专家"},
    "map_next": {"en": "top of the last logits row", "zh": "最后一行 logits 的前几名"},
    "map_off": {"en": "(off here)", "zh": "（本页未开）"},
    "map_own": {"en": "the model's own gather (it was trained with it)", "zh": "模型自己的 gather（训练时就有）"},
    "map_ours": {"en": "gatherlens' change: not how the model was trained (it approximates dense attention)",
                 "zh": "gatherlens 的改动：不是模型训练时的做法（它近似稠密注意力）"},
    "map_section": {"en": "The model at a glance", "zh": "模型全貌"},
    "map_body": {"en": "Every picture below is one of these gathers, from one run of {model} on your text. The "
                       "blue ones are the model's own: it was trained with them and runs them as they are. The "
                       "orange ones are gatherlens' change: top-k attention keeps only the k best keys of each "
                       "query, sparse decoding reads a budget of pages of the KV cache, sparse prefill keeps some "
                       "key blocks of the prompt. The model was trained with every key; these approximate it, and "
                       "the page shows how close they come.",
                 "zh": "下面每张图都是其中一次 gather，来自 {model} 在你的文本上的一次运行。蓝色的是模型自己的："
                       "训练时就有，照原样运行。橙色的是 gatherlens 的改动：top-k 注意力让每个查询只保留得分最高的 k 个键，"
                       "稀疏解码只读 KV 缓存中预算以内的页，稀疏预填充只保留提示的部分键块。模型训练时用的是所有键；"
                       "这些改动只是近似，本页会显示近似得有多好。"},
    "moe_section": {"en": "Mixture of experts: each token gathers its experts", "zh": "混合专家：每个 token gather 它的专家"},
    "moe_body": {"en": "{model} is a mixture of experts: in each of its {layers} MoE layers a router scores the {E} "
                       "experts for every token, and each token runs only its top {k}, their outputs summed with the "
                       "router's weights. Choosing experts is a gather whose rows are whole matrices: index = "
                       "topk(softmax(router(x))), then experts[index[t]] for token t, as W[ids] picks rows of the "
                       "embedding table. Read per expert, the same choice gathers each expert's tokens into one batch, "
                       "which is how the block runs it. Layer {layer} as this run routed it:",
                 "zh": "{model} 是混合专家模型：在它的 {layers} 个 MoE 层里，路由器为每个 token 给 {E} 个专家打分，"
                       "每个 token 只运行得分最高的 {k} 个专家，它们的输出按路由器的权重相加。选专家是一次 gather，"
                       "只是每一行是一整个矩阵：index = topk(softmax(router(x)))，然后 token t 取 experts[index[t]]，"
                       "就像 W[ids] 取嵌入表的行。按专家来读，同一个选择把每个专家的 token gather 成一批，MoE 块就是这样运行的。"
                       "下面是这次运行中第 {layer} 层的路由："},
    "moe_title": {"en": "router · layer {layer} ({layers} MoE layers): each token gathers its top-{k} of {E} experts",
                  "zh": "路由器 · 第 {layer} 层（共 {layers} 个 MoE 层）：每个 token 从 {E} 个专家中 gather 前 {k} 个"},
    "moe_axes": {"en": "tokens ↓ · experts →  (shade: router probability; red outline: picked, with its weight)",
                 "zh": "token ↓ · 专家 →（深浅：路由概率；红框：被选中，框内是权重）"},
    "moe_cell": {"en": "token {t} {tok} → expert {e}: probability {p:.3f}", "zh": "token {t} {tok} → 专家 {e}：概率 {p:.3f}"},
    "moe_cell_picked": {"en": "(picked; weight {w:.3f})", "zh": "（被选中；权重 {w:.3f}）"},
    "moe_more": {"en": "⋮ {n} more tokens", "zh": "⋮ 另有 {n} 个 token"},
    "moe_per_expert": {"en": "each expert gathers the tokens that picked it", "zh": "每个专家 gather 选中它的 token"},
    "moe_expert": {"en": "expert {e}", "zh": "专家 {e}"},
    "moe_expert_info": {"en": "expert {e}: {n} tokens, one batch through its matrices",
                        "zh": "专家 {e}：{n} 个 token，作为一批通过它的矩阵"},
    "scale_section": {"en": "Gemma: the gathered rows, scaled", "zh": "Gemma：gather 出的行再乘一个系数"},
    "scale_body": {"en": "{model} multiplies every row it gathers by √d = {scale:.6g} (held in the weights' dtype) "
                         "before the first layer; the table itself is stored unscaled. The gather is the same W[ids]; "
                         "what the layers receive is the scaled rows.",
                   "zh": "{model} 在进入第一层之前把 gather 出的每一行乘以 √d = {scale:.6g}（用权重的数据类型保存）；"
                         "表本身存的是未缩放的值。gather 还是同样的 W[ids]；各层收到的是缩放后的行。"},
    "scale_title": {"en": "embed_tokens(ids) = W[ids] × {scale} (√{d})", "zh": "embed_tokens(ids) = W[ids] × {scale}（√{d}）"},
    "scale_equal": {"en": "All {n} rows, all {d} columns: the module's output equals W[ids] × scale exactly (checked).",
                    "zh": "全部 {n} 行、全部 {d} 列：模块的输出与 W[ids] × 系数完全相等（已核对）。"},
    "scale_differs": {"en": "The module's output differs from W[ids] × scale (checked on all {n} rows of {d} columns).",
                      "zh": "模块的输出与 W[ids] × 系数不同（在全部 {n} 行、{d} 列上核对）。"},
    "rope_section": {"en": "RoPE: cos/sin rows gathered by position", "zh": "RoPE：按位置 gather cos/sin 行"},
    "rope_body": {"en": "{model} encodes positions by rotating queries and keys with the cos and sin of position × "
                        "frequency. transformers computes them from position_ids at every call; vLLM and llama.cpp keep "
                        "a table with one row per position and gather the rows of position_ids. Here that table is "
                        "built with the model's own rotary module for positions 0–{last} ({D} values a row{kind}) and "
                        "its rows gathered: {verdict} The sin table is gathered the same way.",
                  "zh": "{model} 用 位置 × 频率 的 cos 和 sin 旋转查询和键来编码位置。transformers 每次调用时从 position_ids "
                        "算出它们；vLLM 和 llama.cpp 则保存一张每个位置一行的表，按 position_ids gather 出对应的行。这里用模型"
                        "自己的旋转模块为位置 0–{last} 建出这张表（每行 {D} 个值{kind}），再 gather 出各行：{verdict}"
                        "sin 表也是同样 gather 的。"},
    "rope_equal": {"en": "the gathered rows are the ones the model computed, bit for bit.",
                   "zh": "gather 出的行与模型自己算出的逐位相同。"},
    "rope_differs": {"en": "they differ from the ones the model computed.", "zh": "它们与模型自己算出的不同。"},
    "rope_kind": {"en": "; the frequencies of its {kind} layers", "zh": "；用的是{kind}层的频率"},
    "note_rope": {"en": "one row per position", "zh": "每个位置一行"},
    "smp_title": {"en": "sampling · V = {V} logits → ÷ T = {t} → cuts → {n} candidates → the draw",
                  "zh": "采样 · V = {V} 个 logits → ÷ T = {t} → 截断 → {n} 个候选 → 抽取"},
    "smp_logit": {"en": "logit", "zh": "logit"},
    "smp_pt": {"en": "p at T={t}", "zh": "T={t} 时的 p"},
    "smp_cut": {"en": "{stage}: {n}", "zh": "{stage}：{n}"},
    "smp_p": {"en": "renorm. ({n})", "zh": "重新归一（{n}）"},
    "smp_cum": {"en": "cumulative", "zh": "累计"},
    "smp_kept": {"en": "{stage} keeps it", "zh": "{stage} 保留它"},
    "smp_dropped": {"en": "{stage} cuts it", "zh": "{stage} 把它截掉"},
    "smp_draw": {"en": "the draw: u = {u}; the first candidate whose cumulative probability passes u is {id} {tok}",
                 "zh": "抽取：u = {u}；累计概率第一个超过 u 的候选是 {id} {tok}"},
    "smp_greedy": {"en": "temperature 0 (greedy): the highest logit, {id} {tok}, with no draw",
                   "zh": "温度 0（贪心）：取最高的 logit，{id} {tok}，不抽取"},
    "smp_next": {"en": "its id gathers the next step's input: W[{id}], a row of the embedding table",
                 "zh": "它的 id gather 出下一步的输入：W[{id}]，嵌入表的一行"},
    "smp_section": {"en": "Sampling: the last gather", "zh": "采样：最后一次 gather"},
    "smp_body": {"en": "Choosing the next token is a gather over the vocabulary. The logits of the last position are "
                       "divided by the temperature; top-k keeps the k highest, top-p the fewest best whose probability "
                       "reaches p, min-p those at least min-p times as likely as the best; the kept logits are "
                       "gathered (logits.index_select(0, kept)), renormalized, and one is drawn with a seeded "
                       "uniform number. The chosen id then gathers the next row of the embedding table. This is "
                       "the sampler generate and chat run (llama.cpp's chain), drawn from its own record.",
                 "zh": "选下一个 token 是在词表上做一次 gather。最后一个位置的 logits 先除以温度；top-k 保留最高的 k 个，"
                       "top-p 保留概率累计达到 p 的最少几个，min-p 保留概率不低于最高者 min-p 倍的那些；被保留的 logits 被 gather 出来"
                       "（logits.index_select(0, kept)），重新归一，再用一个带种子的均匀随机数抽出一个。选中的 id 接着 gather 出"
                       "嵌入表的下一行。这就是 generate 和 chat 用的采样器（llama.cpp 的链），图直接来自它自己的记录。"},
    "smp_offline": {"en": "This page shows one draw with llama-server's defaults (temperature 0.8, top-k 40, top-p 0.95, "
                          "min-p 0.05, seed 0); in gatherlens serve the sliders redraw it.",
                    "zh": "本页显示用 llama-server 默认设置的一次抽取（温度 0.8，top-k 40，top-p 0.95，min-p 0.05，种子 0）；"
                          "在 gatherlens serve 中可以用滑块重画。"},
    "smp_temperature": {"en": "temperature", "zh": "温度"},
    "smp_seed": {"en": "seed", "zh": "种子"},
    "chat_title": {"en": "Chat: every token drawn, every page read", "zh": "聊天：每个 token 怎么抽出、读了哪些页"},
    "chat_body": {"en": "Your messages go through the model's own chat template; the reply is sampled with the settings "
                        "of the sampling section above and decoded with sparse pages. Click a token of the reply to "
                        "see the candidates it was drawn from and the pages it read (the layer chosen above).",
                  "zh": "你的消息经过模型自己的聊天模板；回复用上面“采样”一节的设置抽取，并用稀疏页解码。点回复中的一个 token，"
                        "就能看到它是从哪些候选中抽出的，以及它读了哪些页（按上面选的层）。"},
    "chat_send": {"en": "Send", "zh": "发送"},
    "chat_reset": {"en": "New chat", "zh": "新对话"},
    "chat_placeholder": {"en": "Say something…", "zh": "说点什么…"},
    "chat_none": {"en": "This model has no chat template, so the page offers no chat: Generate above continues text.",
                  "zh": "这个模型没有聊天模板，所以本页不提供聊天：上面的“生成”可以续写文本。"},
    "chat_tok": {"en": "token {i} {tok}: drawn from {kept} candidates{u}", "zh": "第 {i} 个 token {tok}：从 {kept} 个候选中抽出{u}"},
    "chat_u": {"en": " (u = {u})", "zh": "（u = {u}）"},
    "chat_greedy": {"en": " (greedy: no draw)", "zh": "（贪心：不抽取）"},
    "chat_pages": {"en": "layer {layer}, KV head {kvh}: pages {pages} of {total} (pages of {P} tokens)",
                   "zh": "第 {layer} 层，键/值头 {kvh}：读了第 {pages} 页，共 {total} 页（每页 {P} 个 token）"},
    "chat_prefill": {"en": "the reply's first token comes from the prompt's step: the dense prefill reads every token",
                     "zh": "回复的第一个 token 来自提示那一步：稠密预填充读取每一个 token"},
    "chat_ring": {"en": "layer {layer} ({kind}): no page choice, its ring is read whole",
                  "zh": "第 {layer} 层（{kind}）：不选页，整个环都被读取"},
    "chat_dense": {"en": "layer {layer}: read every page (dense)", "zh": "第 {layer} 层：读取每一页（稠密）"},
    "chat_kept": {"en": "kept", "zh": "保留"},
    "chat_cut": {"en": "cut", "zh": "截掉"},
    "chat_chosen": {"en": "chosen", "zh": "选中"},
    "ex_step_status": {"en": "step {step}: {tok}", "zh": "第 {step} 步：{tok}"},
    "kc_ring_label": {"en": "ring: {n} keys", "zh": "环：{n} 个键"},
    "kc_ring_line": {"en": "{kind} layer, window {window}: sparse decoding chooses no pages here; its ring holds "
                           "keys {a}–{b} ({tokens} keys) and reads them all, as dense attention does (error 0)",
                     "zh": "{kind}层，窗口 {window}：稀疏解码在这里不选页；它的环保存键 {a}–{b}（{tokens} 个键），"
                           "全部读取，与稠密注意力相同（误差 0）"},
}


def check_lang(lang: str) -> str:
    """`lang` itself when it is one of LANGS, else a clear error naming the valid ones."""
    if lang not in LANGS:
        shown = repr(lang) if len(repr(lang)) <= 40 else repr(lang)[:37] + "..."  # a pasted blob, shortened
        raise GatherValueError(f"lang must be one of {LANGS}, got lang = {shown}")
    return lang


def text(key: str, lang: str, **fmt) -> str:
    """The string `key` in `lang`, formatted with `fmt`."""
    return STRINGS[key][check_lang(lang)].format(**fmt)


def op_meaning(op: str, lang: str) -> str:
    """One short phrase saying what a traced op does ("" for an op not listed)."""
    return STRINGS.get(f"meaning_{op}", {}).get(check_lang(lang), "")
