"""The registered C++ operators called directly (`torch.ops.gatherlens.*`) with inconsistent shapes
(issue 40): each operator checks its own inputs (TORCH_CHECK), so a bad call is one RuntimeError
naming the operator, never an out-of-bounds read or write, a SIGFPE or a SIGSEGV.

The public functions never pass such shapes; a user calling an operator can. The calls run in a
child process (a crash fails the test, naming the case, instead of killing pytest). Every schema of
the gatherlens library is covered: the test fails when an operator is registered without a case.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import needs_compiler  # noqa: E402

# The child: builds the cases (name -> a call that must raise RuntimeError naming `op`), runs them one by
# one, printing "start NAME" before each call (a crash leaves it the last line), then one JSON line.
CALLS = r'''
import json, sys
import torch
from gatherlens.ops.kernels import build_all
loaded = build_all()
ops = torch.ops.gatherlens
f32, i8, u8 = torch.float32, torch.int8, torch.uint8
def z(*shape, dtype=f32):
    return torch.zeros(*shape, dtype=dtype)

def paged(q=None, pk=None, pv=None, s=None, length=16, n=2, first=3, ks=None, vs=None):
    q = z(1, 4, 8) if q is None else q                     # (B, Hq, D)
    pk = z(1, 2, 4, 4, 8) if pk is None else pk            # (B, Hkv, N, P, D)
    pv = z(1, 2, 4, 4, 8) if pv is None else pv
    s = z(1, 2, 4, 16) if s is None else s                 # (B, Hkv, N, 2D)
    return lambda: ops.paged_decode(q, pk, pv, s, length, n, first, 0.35, False, False, ks, vs)

def dense(q=None, pk=None, pv=None, length=16):
    q = z(1, 4, 8) if q is None else q
    pk = z(1, 2, 4, 4, 8) if pk is None else pk
    pv = z(1, 2, 4, 4, 8) if pv is None else pv
    return lambda: ops.dense_decode(q, pk, pv, length, 0.35, None, None)

def rope(q=None, k=None, v=None, cs=None, keys=None, values=None, sums=None, position=5, D=8):
    q = z(1, 4 * D) if q is None else q                    # (B, Hq * D)
    k = z(1, 2 * D) if k is None else k
    v = z(1, 2 * D) if v is None else v
    cs = z(1, D) if cs is None else cs
    keys = z(1, 2, 4, 4, D) if keys is None else keys      # (B, Hkv, cap, P, D)
    values = z(1, 2, 4, 4, D) if values is None else values
    sums = z(1, 2, 4, 2 * D) if sums is None else sums
    return lambda: ops.rope_append(q, k, v, cs, cs, keys, values, sums, position, None, None)

def prefill(q=None, k=None, v=None, blocks=None, bs=4):
    q = z(1, 4, 8, 8) if q is None else q                  # (B, Hq, Q, D)
    k = z(1, 2, 8, 8) if k is None else k                  # (B, Hkv, L, D)
    v = z(1, 2, 8, 8) if v is None else v
    blocks = torch.ones(1, 4, 2, 2, dtype=torch.bool) if blocks is None else blocks
    return lambda: ops.block_prefill(q, k, v, blocks, bs, 0.35, None)

def scores(q=None, k=None, bs=8, stride=4, key_len=8):
    q = z(1, 4, 8, 8) if q is None else q
    k = z(1, 2, 8, 8) if k is None else k
    return lambda: ops.antidiagonal_scores(q, k, bs, stride, 0.35, None, key_len)

def stack(heads=4, kernel="q8act_linear", head_kernel=""):
    keys, values, sums = z(1, 2, 4, 4, 8), z(1, 2, 4, 4, 8), z(1, 2, 4, 16)
    raws = [z(8, 34, dtype=u8)] * 7
    return lambda: ops.decode_stack(z(1, 32), z(1, 8), z(1, 8), heads, [torch.ones(32)] * 2, [1e-5, 1e-5], raws,
                                    [kernel] * 7, [8] * 7, [keys], [values], [sums], [None], [None], 3, [-1], [1],
                                    0.35, False, False, torch.ones(32), 1e-5, z(8, 34, dtype=u8), head_kernel, 8)

CASES = {
    "paged_decode": {
        "0 KV heads": paged(pk=z(1, 0, 4, 4, 8), pv=z(1, 0, 4, 4, 8), s=z(1, 0, 4, 16)),
        "0 query heads": paged(q=z(1, 0, 8)),
        "summaries of fewer KV heads": paged(s=z(1, 1, 4, 16)),
        "summaries of fewer pages": paged(s=z(1, 2, 2, 16)),
        "summaries of another batch": paged(q=z(2, 4, 8), pk=z(2, 2, 4, 4, 8), pv=z(2, 2, 4, 4, 8)),
        "values of fewer pages": paged(pv=z(1, 2, 2, 4, 8)),
        "pages of 0 tokens": paged(pk=z(1, 2, 4, 0, 8), pv=z(1, 2, 4, 0, 8)),
        "q wider than the keys": paged(q=z(1, 4, 16)),
        "length past the storage": paged(length=17),
        "int8 pages without scales": paged(pk=z(1, 2, 4, 4, 8, dtype=i8), pv=z(1, 2, 4, 4, 8, dtype=i8)),
    },
    "dense_decode": {
        "0 KV heads": dense(pk=z(1, 0, 4, 4, 8), pv=z(1, 0, 4, 4, 8)),
        "0 query heads": dense(q=z(1, 0, 8)),
        "values of fewer pages": dense(pv=z(1, 2, 2, 4, 8)),
        "values of fewer KV heads": dense(pv=z(1, 1, 4, 4, 8)),
        "length past the storage": dense(length=100),
    },
    "rope_append": {
        "values of fewer pages": rope(values=z(1, 2, 1, 4, 8)),
        "values of fewer KV heads": rope(values=z(1, 1, 4, 4, 8), v=z(1, 8)),
        "summaries of fewer pages": rope(sums=z(1, 2, 1, 16)),
        "head_dim 0": rope(D=0),
        "position past the storage": rope(position=16),
        "k of another width": rope(k=z(1, 8)),
    },
    "block_prefill": {
        "0 KV heads": prefill(k=z(1, 0, 8, 8), v=z(1, 0, 8, 8)),
        "blocks of another shape": prefill(blocks=torch.ones(1, 4, 3, 2, dtype=torch.bool)),
        "values of another length": prefill(v=z(1, 2, 4, 8)),
    },
    "antidiagonal_scores": {
        "0 KV heads": scores(k=z(1, 0, 8, 8)),
        "stride 0": scores(stride=0),
        "keys not padded to whole tiles": scores(k=z(1, 2, 6, 8), key_len=6, bs=8),
    },
    "decode_stack": {
        "0 heads": stack(heads=0),
        "a kernel that is not a product": stack(kernel="rms_norm_cast"),
        "a head kernel that is not a product": stack(head_kernel="decode_stack"),
    },
    "rms_norm_cast": {"w of another width": lambda: ops.rms_norm_cast(z(2, 8), z(4), 1e-5, False)},
    "add_rms_norm_cast": {"y of another shape": lambda: ops.add_rms_norm_cast(z(2, 8), z(2, 4), z(8), 1e-5, False)},
    "silu_mul_cast": {"an odd width": lambda: ops.silu_mul_cast(z(2, 7), False)},
    "gelu_mul_cast": {"an odd width": lambda: ops.gelu_mul_cast(z(2, 7), False)},
    "q8act_linear": {"rows of another width": lambda: ops.q8act_linear(z(1, 64), z(4, 34, dtype=u8), 8),
                     "an unknown type": lambda: ops.q8act_linear(z(1, 64), z(4, 68, dtype=u8), 99)},
    "q8x8_linear": {"rows not whole panels": lambda: ops.q8x8_linear(z(1, 32), z(4, 34, dtype=u8), 8)},
    "x8_pack": {"rows not whole panels": lambda: ops.x8_pack(z(4, 34, dtype=u8), z(136, dtype=torch.long), z(4, 34, dtype=u8)),
                "an order outside the panel": lambda: ops.x8_pack(z(8, 34, dtype=u8), torch.full((136,), 136),
                                                                  z(8, 34, dtype=u8)),
                "an out of another shape": lambda: ops.x8_pack(z(8, 34, dtype=u8), z(136, dtype=torch.long),
                                                               z(8, 36, dtype=u8))},
    "q8k_linear": {"K not whole super-blocks": lambda: ops.q8k_linear(z(1, 64), z(4, 34, dtype=u8), 12)},
    "floatdot_linear": {"rows of another width": lambda: ops.floatdot_linear(z(1, 8), z(4, 8, dtype=u8), 0)},
    "topk_rows": {"lens past the width": lambda: ops.topk_rows(z(1, 1, 2, 4), torch.tensor([5, 1]), None, 2, False,
                                                               0, 2),
                  "rows outside": lambda: ops.topk_rows(z(1, 1, 2, 4), None, None, 2, False, 0, 3)},
    "topk_weights_into": {"lens of another count": lambda: ops.topk_weights_into(z(2, 4), torch.tensor([1]), 2)},
    "guard_mapping": {"a zero length": lambda: ops.guard_mapping(4096, 0, "x")},
}
refused = {}
for op, cases in CASES.items():
    for name, call in cases.items():
        print(f"start {op}: {name}", flush=True)
        try:
            call()
            refused[f"{op}: {name}"] = None
        except RuntimeError as err:
            refused[f"{op}: {name}"] = str(err).splitlines()[0][:300]
schemas = sorted({s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("gatherlens::")})
print(json.dumps({"loaded": loaded, "refused": refused, "schemas": schemas}))
'''
NO_BAD_SHAPE = {"q8act_simd", "q8k_simd", "unguard_mapping"}   # take no tensor or shape (unguard: any int is safe)


@pytest.fixture(scope="module")
def refused():
    out = subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        started = [line for line in out.stdout.splitlines() if line.startswith("start ")]
        name = signal.Signals(-out.returncode).name if out.returncode < 0 else f"exit {out.returncode}"
        pytest.fail(f"{started[-1][6:] if started else 'loading the kernels'} crashed the process ({name}): "
                    f"{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_compiler
@pytest.mark.slow
def test_every_operator_refuses_inconsistent_shapes_with_one_error(refused):
    """Must hold: every bad call above raises RuntimeError naming what is wrong, in a process that
    lives on (before issue 40: paged_decode read out of bounds (SIGSEGV or garbage), rope_append wrote
    out of bounds, dense_decode and paged_decode with 0 KV heads died by SIGFPE)."""
    assert all(refused["loaded"].values()), refused["loaded"]
    passed = [case for case, said in refused["refused"].items() if said is None]
    assert passed == [], f"accepted without an error: {passed}"
    for case, said in refused["refused"].items():
        assert "Traceback" not in said and said.strip(), (case, said)


@needs_compiler
@pytest.mark.slow
def test_every_registered_operator_has_bad_shape_cases(refused):
    """Must hold: no torch.ops.gatherlens schema is left without a case (a new operator adds its own)."""
    covered = {case.split(":")[0] for case in refused["refused"]}
    missing = set(refused["schemas"]) - covered - NO_BAD_SHAPE
    assert not missing, f"operators without bad-shape cases: {sorted(missing)}"


@needs_compiler
@pytest.mark.parametrize("length,budget", [(300, 64), (300, None), (4096, 512), (4096, None)],
                         ids=["300-sparse", "300-dense", "4K-sparse", "4K-dense"])
def test_decode_results_do_not_depend_on_the_thread_count(length, budget):
    """Must hold: the native paged and dense decode give bit-equal results on 1, 2, 3 and 4 threads (and
    with either task schedule), so the thread controller, which changes the count mid-run, and
    `--threads 1` / `--threads 2` give the same text. (Before issue 40 the split-K parts followed the
    thread count: a different sum order, last bits differing, and near-ties flipped the next token.)"""
    import torch

    from gatherlens.ops.sparse import PagedKVCache, sparse_decode
    from gatherlens.ops.sparse.fused_decode import kernel_loaded

    if not kernel_loaded():
        pytest.fail("the fused decode kernel did not build")
    torch.manual_seed(0)
    cache = PagedKVCache(batch=1, kv_heads=3, head_dim=64, page_size=8)
    cache.append(torch.randn(1, 3, length, 64), torch.randn(1, 3, length, 64))
    q = torch.randn(1, 9, 1, 64)                                    # (B, Hq, 1, D)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            outs.append(sparse_decode(q, cache, budget or 10**6, backend="native"))   # (B, Hq, 1, D)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], other) for other in outs[1:])


THREADS_STEPS = r'''
import sys, torch
from gatherlens.models import load
from gatherlens.models.runtime.decoding import SparseKVCache, use_sparse_decoding
torch.set_num_threads(int(sys.argv[1]))
lm = load("smollm2", quantized=True)
use_sparse_decoding(lm.model, budget=64)
ids = lm.encode("It is a truth universally acknowledged, that a single man in possession of a good fortune, " * 8)
cache = SparseKVCache(config=lm.model.config, page_size=8)
logits = []
with torch.no_grad():
    out = lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    for _ in range(6):
        logits.append(out.logits[:, -1])
        out = lm.model(input_ids=out.logits[:, -1].argmax(-1, keepdim=True), cache=cache, use_cache=True)
torch.save(torch.cat(logits), sys.argv[2])
'''


@needs_compiler
@pytest.mark.slow
def test_a_quantized_model_decodes_the_same_on_one_and_two_threads(tmp_path):
    """Must hold: SmolLM2 run from its blocks gives bit-equal logits at the prefill and each decode step
    on 1 and on 2 threads (every reduction of the step is split by sizes, never by the thread count)."""
    import torch

    from fault_helpers import smollm2_path

    smollm2_path()
    for threads in (1, 2):
        out = subprocess.run([sys.executable, "-c", THREADS_STEPS, str(threads), str(tmp_path / f"{threads}.pt")],
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
    assert torch.equal(torch.load(tmp_path / "1.pt"), torch.load(tmp_path / "2.pt"))
