// Block-sparse prefill's two heavy steps as C++ operators: the block scores, and the attention over
// the kept blocks, each reading q, k and v where they lie (no gather copy).
//
//   torch.ops.gatherlens.block_prefill(q, k, v, blocks, block_size, scale, window) -> (out, lse)
//   torch.ops.gatherlens.antidiagonal_scores(q, k, block_size, stride, scale, window, key_len) -> scores
//
// block_prefill: the arithmetic of ops/prefill/blocked.py (naive.py is its reference): the Q queries
// are the last Q of the L keys (bottom-right causal: query r sits at position L - Q + r), query block
// i holds queries [i*bs, min(Q, (i+1)*bs)), key block j keys [j*bs, min(L, (j+1)*bs)), and
// blocks[b, h, i, j] says whether selection head h's query block i reads key block j. One task per
// (batch row, selection head, query block): the queries of the selection head's query heads (all G
// heads of a KV group when the selection is shared) are copied into one (R, D) matrix, R = heads x
// rows, so one K / V block read serves all of them; the kept blocks are walked in ascending order, a
// run of consecutive *whole* blocks (every query of the block sees every key of it) as one product, a
// *partial* block (the diagonal, a window's edge) alone and masked; flash attention's online softmax
// (common.h's row_max / exp_sum / scale_by / lse_of) joins the steps. Inputs: q (B, Hq, Q, D), k
// (B, Hkv, L, D), v (B, Hkv, L, Dv) float32, last dim contiguous, any other strides; blocks (B, H, nq,
// nk) bool contiguous (H divides Hq, Hkv divides H); window: query - key < window (None: global).
// Outputs: out (B, Hq, Q, Dv), lse (B, Hq, Q) float32 (a row that sees no key: out 0, lse -inf).
// Soft-capping is not here; sinks join afterwards (variants.join_sinks).
//
// antidiagonal_scores: rules.antidiagonal_scores (XAttention), its reference, computed on the tiles
// causality (and the window) allow only: per (batch row, KV head, query block) the strided queries of
// the G heads against the strided keys of the allowed tiles in one product, each tile row's softmax
// over its allowed tiles summed per key block, each block row normalized to sum 1. k comes padded to
// whole tiles (zero rows past key_len, as the reference pads). Output (B, Hq, nq, nk) float32.
//
// The products are BLAS sgemm calls (torch's own BLAS, the one its CPU flash attention runs), each on
// one thread; the tasks go to torch's threads costliest first from one shared counter. Built by
// ops/native.py; fake kernels in ops/prefill/fused_prefill.py.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "gatherlens/common.h"

// BLAS's single-precision product (Fortran interface), exported by libtorch_cpu (MKL or OpenBLAS; a torch
// without it: the library does not load, and the torch paths run).
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

namespace gl = gatherlens;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kTileFloats = 1 << 16;          // logits one step holds (R x keys): 256 KiB, in L2

// Row-major C (R, n) = alpha * A (R, D) . B (n, D)^T, A's rows lda apart, B's ldb apart (C's n apart).
inline void logits_of(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t R, int64_t n, int64_t D,
                      float alpha, float* C) {
  const int m = static_cast<int>(n), nn = static_cast<int>(R), k = static_cast<int>(D);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(n);
  const float beta = 0.f;
  sgemm_("T", "N", &m, &nn, &k, &alpha, B, &la, A, &lb, &beta, C, &lc);  // column-major: C^T = B . A^T
}

// Row-major O (R, Dv) += P (R, n) . V (n, Dv), V's rows ldv apart (P's ldp, O's ldo).
inline void add_weighted(const float* P, int64_t ldp, const float* V, int64_t ldv, int64_t R, int64_t n, int64_t Dv,
                         float* O, int64_t ldo) {
  const int m = static_cast<int>(Dv), nn = static_cast<int>(R), k = static_cast<int>(n);
  const int la = static_cast<int>(ldv), lb = static_cast<int>(ldp), lc = static_cast<int>(ldo);
  const float one = 1.f;
  sgemm_("N", "N", &m, &nn, &k, &one, V, &la, P, &lb, &one, O, &lc);  // column-major: O^T += V^T . P^T
}

struct Problem {                                  // one block_prefill call
  int64_t B, Hq, Hkv, H, Q, L, D, Dv, bs, nq, nk, offset, window;
  float scale;
  const float *q, *k, *v;
  int64_t qs[3], ks[3], vs[3];                    // (batch, head, row) strides
  const bool* blocks;
  float *out, *lse;
};

struct Task {                                     // one (batch row, selection head, query block)
  int64_t b, head0, heads, kv, i, rows, first;    // first: the absolute position of the block's first query
  const bool* kept;                               // (nk,)
};

Task task_of(const Problem& p, int64_t t) {
  const int64_t i = t % p.nq, hs = (t / p.nq) % p.H, b = t / (p.nq * p.H), heads = p.Hq / p.H;
  const int64_t rows = std::min(p.Q, (i + 1) * p.bs) - i * p.bs;
  return {b, hs * heads, heads, hs * heads / (p.Hq / p.Hkv), i, rows, p.offset + i * p.bs,
          p.blocks + t * p.nk};
}

struct Scratch {
  std::vector<float> q, s, o, m;                  // (R, D) queries, (R, keys) logits, (R, Dv) sums, (R,) maxima
  std::vector<double> l;                          // (R,) running sums of exp(logit - max)
};

void start(const Problem& p, const Task& t, Scratch& sc) {
  const int64_t R = t.heads * t.rows;
  sc.q.resize(R * p.D);
  for (int64_t g = 0; g < t.heads; ++g)
    for (int64_t r = 0; r < t.rows; ++r) {
      const float* src = p.q + t.b * p.qs[0] + (t.head0 + g) * p.qs[1] + (t.i * p.bs + r) * p.qs[2];
      std::copy(src, src + p.D, sc.q.data() + (g * t.rows + r) * p.D);
    }
  sc.o.assign(R * p.Dv, 0.f);
  sc.m.assign(R, kNegInf);
  sc.l.assign(R, 0.0);
}

// Key block j seen whole by every query of the task (no mask): its last key <= the first query, and
// (window) the last query - its first key < window.
inline bool whole(const Problem& p, const Task& t, int64_t j) {
  const int64_t last_key = std::min(p.L, (j + 1) * p.bs) - 1, last_query = t.first + t.rows - 1;
  return last_key <= t.first && (p.window <= 0 || last_query - j * p.bs < p.window);
}

// The causal (and window) rule on the logits s (R, n) of keys k0..: what a query may not see is -inf.
void mask_partial(const Problem& p, const Task& t, int64_t k0, int64_t n, float* s) {
  for (int64_t g = 0; g < t.heads; ++g)
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t pos = t.first + r;
      float* row = s + (g * t.rows + r) * n;
      for (int64_t c = 0; c < n; ++c)
        if (k0 + c > pos || (p.window > 0 && pos - (k0 + c) >= p.window)) row[c] = kNegInf;
    }
}

// Flash attention's online softmax over one step's logits s (R, n): each row's maximum so far m, its
// sum l and its weighted values o (R, Dv) rescaled to the new maximum; s becomes exp(s - m) (0 where unseen).
void online_softmax(float* s, int64_t R, int64_t n, int64_t Dv, Scratch& sc) {
  for (int64_t r = 0; r < R; ++r) {
    float* row = s + r * n;
    const float m = std::max(sc.m[r], gl::row_max(row, n));
    if (!(m > kNegInf)) {                         // nothing seen yet: no weight
      std::fill(row, row + n, 0.f);
      continue;
    }
    const float a = gl::exp_neg(sc.m[r] - m);     // 0 for the first keys a row sees
    sc.l[r] = sc.l[r] * a + gl::exp_sum(row, n, m, row);
    if (a != 1.f) gl::scale_by(sc.o.data() + r * Dv, Dv, a);
    sc.m[r] = m;
  }
}

// Keys k0 .. k0+n-1 (whole blocks, or one partial block): logits, mask, online softmax, values.
void step(const Problem& p, const Task& t, int64_t k0, int64_t n, bool partial, Scratch& sc) {
  const int64_t R = t.heads * t.rows;
  const float* K = p.k + t.b * p.ks[0] + t.kv * p.ks[1] + k0 * p.ks[2];
  const float* V = p.v + t.b * p.vs[0] + t.kv * p.vs[1] + k0 * p.vs[2];
  sc.s.resize(R * n);
  logits_of(sc.q.data(), p.D, K, p.ks[2], R, n, p.D, p.scale, sc.s.data());
  if (partial) mask_partial(p, t, k0, n, sc.s.data());
  online_softmax(sc.s.data(), R, n, p.Dv, sc);
  add_weighted(sc.s.data(), n, V, p.vs[2], R, n, p.Dv, sc.o.data(), p.Dv);
}

// out and lse of the task's rows: o / l and m + log l (out 0, lse -inf for a row that saw nothing).
void finish(const Problem& p, const Task& t, Scratch& sc) {
  for (int64_t g = 0; g < t.heads; ++g)
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t row = g * t.rows + r, at = ((t.b * p.Hq + t.head0 + g) * p.Q + t.i * p.bs + r);
      float* dst = p.out + at * p.Dv;
      const float* o = sc.o.data() + row * p.Dv;
      const bool seen = sc.l[row] > 0.0;
      const float f = seen ? static_cast<float>(1.0 / sc.l[row]) : 0.f;
      for (int64_t d = 0; d < p.Dv; ++d) dst[d] = o[d] * f;
      p.lse[at] = seen ? gl::lse_of(sc.m[row], sc.l[row]) : kNegInf;
    }
}

// One task: its kept blocks in ascending order; consecutive whole ones in runs of at most the tile.
void run_task(const Problem& p, int64_t id, Scratch& sc) {
  const Task t = task_of(p, id);
  start(p, t, sc);
  const int64_t R = t.heads * t.rows, most = std::max<int64_t>(1, kTileFloats / (R * p.bs));  // blocks a run
  int64_t run0 = -1, run = 0;                     // the open run of whole blocks: first block, count
  auto flush = [&] {
    if (run > 0) step(p, t, run0 * p.bs, std::min(p.L, (run0 + run) * p.bs) - run0 * p.bs, false, sc);
    run = 0;
  };
  for (int64_t j = 0; j < p.nk; ++j) {
    if (!t.kept[j]) { flush(); continue; }
    if (!whole(p, t, j)) {
      flush();
      step(p, t, j * p.bs, std::min(p.L, (j + 1) * p.bs) - j * p.bs, true, sc);
      continue;
    }
    if (run == most) flush();
    if (run++ == 0) run0 = j;
  }
  flush();
  finish(p, t, sc);
}

// body(t, scratch) for every task t < tasks on torch's threads, the costliest first (cost(t)), handed out
// from one shared counter: causal rows differ in cost, and a long task left for last would leave one
// thread working alone (a static split would also stall behind a preempted thread).
template <typename Scratch, typename Cost, typename Body>
void costliest_first(int64_t tasks, const Cost& cost, const Body& body) {
  std::vector<int64_t> costs(tasks), order(tasks);
  for (int64_t t = 0; t < tasks; ++t) costs[t] = cost(t);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(tasks, at::get_num_threads()));
  std::atomic<int64_t> next{0};
  gl::for_each_task<Scratch>(workers, [&](int64_t, Scratch& sc) {  // one worker a thread
    for (int64_t n = next.fetch_add(1); n < tasks; n = next.fetch_add(1)) body(order[n], sc);
  });
}

void run_all(const Problem& p) {
  costliest_first<Scratch>(
      p.B * p.H * p.nq, [&](int64_t t) { return std::count(p.blocks + t * p.nk, p.blocks + (t + 1) * p.nk, true); },
      [&](int64_t t, Scratch& sc) { run_task(p, t, sc); });
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& blocks,
                  int64_t bs) {
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->dim() == 4 && t->scalar_type() == at::kFloat && t->stride(3) == 1 && t->device().is_cpu(),
                "block_prefill: q, k, v must be 4-d float32 CPU tensors with a contiguous last dim");
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(1), Q = q.size(2), L = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == L && k.size(3) == q.size(3),
              "block_prefill: q (B, Hq, Q, D), k (B, Hkv, L, D), v (B, Hkv, L, Dv) do not match");
  TORCH_CHECK(bs >= 1 && Q >= 1 && Q <= L, "block_prefill: needs block_size >= 1 and 1 <= Q <= L");
  TORCH_CHECK(blocks.dim() == 4 && blocks.scalar_type() == at::kBool && blocks.is_contiguous() &&
                  blocks.size(0) == B && blocks.size(2) == gl::ceil_div(Q, bs) && blocks.size(3) == gl::ceil_div(L, bs),
              "block_prefill: blocks must be (B, H, ceil(Q / bs), ceil(L / bs)) bool contiguous");
  const int64_t H = blocks.size(1);
  gl::check_heads("block_prefill", Hq, Hkv);
  TORCH_CHECK(H >= 1 && Hq % H == 0 && H % Hkv == 0, "block_prefill: the selection heads H = ", H,
              " must divide Hq = ", Hq, " and be a multiple of Hkv = ", Hkv);
  const int64_t big = std::numeric_limits<int>::max();
  TORCH_CHECK(k.stride(2) < big && v.stride(2) < big && L < big, "block_prefill: rows too far apart for BLAS");
}

std::tuple<at::Tensor, at::Tensor> block_prefill_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& blocks, int64_t bs, double scale,
                                                     std::optional<int64_t> window) {
  check_inputs(q, k, v, blocks, bs);
  const int64_t B = q.size(0), Hq = q.size(1), Q = q.size(2), L = k.size(2), Dv = v.size(3);
  at::Tensor out = at::empty({B, Hq, Q, Dv}, q.options()), lse = at::empty({B, Hq, Q}, q.options());
  const Problem p{B, Hq, k.size(1), blocks.size(1), Q, L, q.size(3), Dv, bs, blocks.size(2), blocks.size(3),
                  L - Q, window.value_or(0), static_cast<float>(scale), q.data_ptr<float>(), k.data_ptr<float>(),
                  v.data_ptr<float>(), {q.stride(0), q.stride(1), q.stride(2)},
                  {k.stride(0), k.stride(1), k.stride(2)}, {v.stride(0), v.stride(1), v.stride(2)},
                  blocks.data_ptr<bool>(), out.data_ptr<float>(), lse.data_ptr<float>()};
  run_all(p);
  return {out, lse};
}

// ---- antidiagonal_scores: rules.antidiagonal_scores (XAttention) on the causal tiles only ----

constexpr int64_t kScoreRows = 96;                // strided query rows a task aims at (one product's rows)

struct Scores {                                   // one antidiagonal_scores call
  int64_t B, Hq, Hkv, Q, L, D, bs, S, nq, nk, tq, tk, offset, window;  // tq, tk: tiles holding a query / key
  int64_t group;                                  // query blocks a task scores
  float alpha;                                    // scale / S
  const float *q, *k;                             // k: (B, Hkv, tk * S, D), rows contiguous (zero-padded)
  int64_t qs[3], ks[2];                           // q's (batch, head, row) strides, k's (batch, head)
  float* scores;                                  // (B, Hq, nq, nk), zeroed
};

// The tiles [lo, hi) tile row a may see: block_geometry's rule with blocks of S (rules.antidiagonal_scores):
// tile c's first key <= the row's last query and (window) the row's first query - c's last key < window.
inline std::pair<int64_t, int64_t> tile_span(const Scores& p, int64_t a, int64_t from) {
  const int64_t qa = p.offset + a * p.S, qb = std::min(qa + p.S - 1, p.L - 1);
  const int64_t hi = std::min(p.tk, qb / p.S + 1);
  int64_t lo = from;
  while (p.window > 0 && lo < hi && qa - std::min(lo * p.S + p.S - 1, p.L - 1) >= p.window) ++lo;
  return {lo, hi};
}

struct TileSpan {                                 // one task's query blocks [i0, i1), tile rows [a0, a1), columns [c0, c1)
  int64_t i0, i1, a0, a1, c0, c1;
};

TileSpan tiles_of(const Scores& p, int64_t task_block) {
  const int64_t per = p.bs / p.S, i0 = task_block * p.group, i1 = std::min(p.nq, i0 + p.group);
  const int64_t a0 = i0 * per, a1 = std::min(p.tq, i1 * per);
  const auto first = tile_span(p, a0, 0);
  return {i0, i1, a0, a1, std::min(first.first, first.second - 1), tile_span(p, a1 - 1, 0).second};
}

inline int64_t ceil_div_blocks(const Scores& p) { return gl::ceil_div(p.nq, p.group); }  // tasks per head

struct ScoreScratch {
  std::vector<float> q, s, acc;                   // (R, S*D) strided queries, (R, tiles) logits, block sums
};

// Row (g, a) of the strided queries: the S query rows of tile a reversed, side by side (zero past Q).
void strided_queries(const Scores& p, int64_t b, int64_t h0, int64_t G, const TileSpan& ts, float* dst) {
  const int64_t E = p.S * p.D;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t a = ts.a0; a < ts.a1; ++a)
      for (int64_t t = 0; t < p.S; ++t) {
        const int64_t r = a * p.S + p.S - 1 - t;
        float* out = dst + (g * (ts.a1 - ts.a0) + a - ts.a0) * E + t * p.D;
        const float* src = p.q + b * p.qs[0] + (h0 + g) * p.qs[1] + r * p.qs[2];
        if (r < p.Q) std::copy(src, src + p.D, out);
        else std::fill(out, out + p.D, 0.f);
      }
}

// Tile row a's logits (columns from c0) -> its softmax over the tiles it may see, summed per key block into acc (nk,).
void add_tile_row(const Scores& p, const TileSpan& ts, int64_t a, float* row, float* acc) {
  const auto [lo, hi] = tile_span(p, a, ts.c0);
  if (lo >= hi) return;                           // no tile: the row adds nothing (as the reference's nan -> 0)
  float* w = row + (lo - ts.c0);
  const float m = gl::row_max(w, hi - lo);
  if (!(m > kNegInf)) return;
  const float f = static_cast<float>(1.0 / gl::exp_sum(w, hi - lo, m, w));
  const int64_t per = p.bs / p.S;
  for (int64_t j = lo / per; j * per < hi; ++j) {
    const int64_t c0 = std::max(lo, j * per), c1 = std::min(hi, (j + 1) * per);
    float sum = 0.f;
    for (int64_t c = c0; c < c1; ++c) sum += w[c - lo];
    acc[j] += sum * f;
  }
}

// Each (head, query block) row of sums acc (nk,) normalized to sum 1 into the scores.
void write_scores(const Scores& p, int64_t b, int64_t head, int64_t i, const float* acc) {
  double total = 0.0;
  for (int64_t j = 0; j < p.nk; ++j) total += acc[j];
  float* out = p.scores + ((b * p.Hq + head) * p.nq + i) * p.nk;
  if (total > 0.0)
    for (int64_t j = 0; j < p.nk; ++j) out[j] = static_cast<float>(acc[j] / total);
}

// Task (b, KV head h, query blocks [i0, i1)): the G heads' strided queries against the tiles in one
// product, each tile row's softmax summed per key block, each (head, block) row normalized.
void score_task(const Scores& p, int64_t t, ScoreScratch& sc) {
  const int64_t tb = ceil_div_blocks(p), G = p.Hq / p.Hkv, per = p.bs / p.S;
  const int64_t h = (t / tb) % p.Hkv, b = t / (tb * p.Hkv);
  const TileSpan ts = tiles_of(p, t % tb);
  const int64_t rows = ts.a1 - ts.a0, n = ts.c1 - ts.c0, E = p.S * p.D;
  sc.q.resize(G * rows * E);
  sc.s.resize(G * rows * n);
  strided_queries(p, b, h * G, G, ts, sc.q.data());
  logits_of(sc.q.data(), E, p.k + b * p.ks[0] + h * p.ks[1] + ts.c0 * E, E, G * rows, n, E, p.alpha, sc.s.data());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = ts.i0; i < ts.i1; ++i) {
      sc.acc.assign(p.nk, 0.f);
      for (int64_t a = i * per; a < std::min(ts.a1, (i + 1) * per); ++a)
        add_tile_row(p, ts, a, sc.s.data() + (g * rows + a - ts.a0) * n, sc.acc.data());
      write_scores(p, b, h * G + g, i, sc.acc.data());
    }
}
void check_scores(const at::Tensor& q, const at::Tensor& k, int64_t bs, int64_t S, int64_t key_len) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "antidiagonal_scores: q and k must be 4-d, got ", q.sizes(), ", ",
              k.sizes());
  gl::check_heads("antidiagonal_scores", q.size(1), k.size(1));
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                  q.stride(3) == 1 && k.is_contiguous() && q.size(0) == k.size(0) && q.size(3) == k.size(3),
              "antidiagonal_scores: q (B, Hq, Q, D) float32 (last dim contiguous), k (B, Hkv, T, D) float32 contiguous");
  TORCH_CHECK(S >= 1 && bs % S == 0 && k.size(2) == gl::ceil_div(key_len, S) * S && q.size(2) <= key_len &&
                  q.size(2) >= 1 && k.size(2) * k.size(3) < std::numeric_limits<int>::max(),
              "antidiagonal_scores: needs block_size a multiple of stride, k padded to ceil(L / stride) tiles, Q <= L");
}

at::Tensor antidiagonal_scores_cpu(const at::Tensor& q, const at::Tensor& k, int64_t bs, int64_t S, double scale,
                                   std::optional<int64_t> window, int64_t key_len) {
  check_scores(q, k, bs, S, key_len);
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(1), Q = q.size(2);
  const int64_t nq = gl::ceil_div(Q, bs), nk = gl::ceil_div(key_len, bs);
  const int64_t group = std::max<int64_t>(1, kScoreRows / ((Hq / Hkv) * (bs / S)));
  at::Tensor scores = at::zeros({B, Hq, nq, nk}, q.options());
  const Scores p{B, Hq, Hkv, Q, key_len, q.size(3), bs, S, nq, nk, gl::ceil_div(Q, S), k.size(2) / S,
                 key_len - Q, window.value_or(0), group, static_cast<float>(scale / S), q.data_ptr<float>(),
                 k.data_ptr<float>(), {q.stride(0), q.stride(1), q.stride(2)}, {k.stride(0), k.stride(1)},
                 scores.data_ptr<float>()};
  const int64_t tb = ceil_div_blocks(p);
  costliest_first<ScoreScratch>(
      B * Hkv * tb, [&](int64_t t) { const TileSpan ts = tiles_of(p, t % tb); return ts.c1 - ts.c0; },
      [&](int64_t t, ScoreScratch& sc) { score_task(p, t, sc); });
  return scores;
}


}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("block_prefill(Tensor q, Tensor k, Tensor v, Tensor blocks, int block_size, float scale, "
        "int? window=None) -> (Tensor out, Tensor lse)");
  m.def("antidiagonal_scores(Tensor q, Tensor k, int block_size, int stride, float scale, int? window, "
        "int key_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("block_prefill", &block_prefill_cpu);
  m.impl("antidiagonal_scores", &antidiagonal_scores_cpu);
}
