"""Device check: the CUDA paths against the CPU ones (run on a machine with a GPU).

    PYTHONPATH=src python scripts/gpu_check.py

topk_attention on CUDA (torch.topk selection) against the CPU path (numpy selection) and SDPA,
with gradients; sparse_decode's Triton backend against its torch backend; embedding_lookup's
checked errors on CUDA. Prints one line per check and exits non-zero on any mismatch.
"""
import sys

import torch
import torch.nn.functional as F

from gatherlens import GatherIndexError, PagedKVCache, embedding_lookup, sparse_decode, topk_attention

assert torch.cuda.is_available(), "needs CUDA"
failures = 0


def check(name, ok, detail=""):
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")


torch.manual_seed(0)
for (B, Hq, Hkv, Q, L, D, k, causal) in [(2, 8, 2, 37, 37, 64, 5, True), (1, 9, 3, 256, 256, 64, 32, True),
                                          (1, 32, 8, 1, 4096, 128, 256, False), (2, 4, 4, 33, 70, 16, 100, False)]:
    q = torch.randn(B, Hq, Q, D, dtype=torch.float64)
    kk = torch.randn(B, Hkv, L, D, dtype=torch.float64)
    v = torch.randn(B, Hkv, L, D, dtype=torch.float64)
    cpu, sel_cpu = topk_attention(q, kk, v, k, is_causal=causal, enable_gqa=True, return_selection=True)
    qc, kc, vc = (t.cuda().requires_grad_() for t in (q, kk, v))
    gpu, sel_gpu = topk_attention(qc, kc, vc, k, is_causal=causal, enable_gqa=True, return_selection=True)
    check(f"topk B{B} H{Hq}/{Hkv} Q{Q} L{L} k{k} causal={causal}: out",
          torch.allclose(gpu.detach().cpu(), cpu, atol=1e-10), f"max {((gpu.detach().cpu() - cpu).abs().max()):.2e}")
    check("  same indices", torch.equal(sel_gpu.indices.cpu(), sel_cpu.indices))
    gpu.sum().backward()
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, kk, v))
    topk_attention(qr, kr, vr, k, is_causal=causal, enable_gqa=True).sum().backward()
    check("  grads", all(torch.allclose(a.grad.cpu(), b.grad, atol=1e-8) for a, b in ((qc, qr), (kc, kr), (vc, vr))))
    full = topk_attention(qc.detach().float(), kc.detach().float(), vc.detach().float(), L,
                          is_causal=causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(qc.detach().float(), kc.detach().float(), vc.detach().float(),
                                         is_causal=causal, enable_gqa=True)
    check("  k >= L equals SDPA (f32)", torch.allclose(full, ref, atol=1e-5), f"max {(full - ref).abs().max():.2e}")

for dtype in (torch.float32, torch.bfloat16):
    cache = PagedKVCache(2, 8, 128, page_size=16, dtype=dtype, device="cuda")
    cache.append(torch.randn(2, 8, 5000, 128, device="cuda", dtype=dtype),
                 torch.randn(2, 8, 5000, 128, device="cuda", dtype=dtype))
    qd = torch.randn(2, 32, 1, 128, device="cuda", dtype=dtype)
    a = sparse_decode(qd, cache, budget=1024, backend="torch")
    b = sparse_decode(qd, cache, budget=1024, backend="triton")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    check(f"sparse_decode triton vs torch {dtype}", torch.allclose(a.float(), b.float(), atol=tol),
          f"max {(a.float() - b.float()).abs().max():.2e}")

W = torch.randn(100, 8, device="cuda")
try:
    embedding_lookup(torch.tensor([[1, 2], [3, 100]], device="cuda"), W)
    check("embedding bad id on CUDA raises", False)
except GatherIndexError as e:
    check("embedding bad id on CUDA raises", "position (1, 1)" in str(e), str(e))
print(f"{failures} failed")
sys.exit(1 if failures else 0)
