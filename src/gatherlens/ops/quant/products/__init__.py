"""Matrix products with a weight held as GGUF blocks (the formats of `ops/quant/formats`).

linear.py (`quantized_linear`, the `LINEAR_PRODUCT` backend table), linear_naive.py (its reference),
matmul.py (`ROUTES`: how each route packs and multiplies), int4.py (PyTorch's int4 kernel), tiled.py
(the prefill's dequantize-in-tiles product), x8.py (panels of 8 rows), q8act.py / q8k.py / floatdot.py
(the C++ kernels of the q8act route, q8_panels.h their shared blocked loop) beside their float64
references (q8act_naive.py, q8k_naive.py). The public names are re-exported by `gatherlens.ops.quant`.
"""
