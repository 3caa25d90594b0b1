// Sparse decode in one operator: score every page's bound, choose the pages, attend over them in place.
//
//   torch.ops.gatherlens.paged_decode(q, page_keys, page_values, summaries, length, n, first_recent,
//                                     scale, per_head, group_sum) -> (out, lse, pages, bounds)
//   torch.ops.gatherlens.dense_decode(q, page_keys, page_values, length, scale) -> (out, lse)
//
// The same arithmetic as the torch path of ops/sparse (page_choice.select_pages + torch_decode.
// attend_pages), without the gather copy and without ~25 small torch calls per layer:
//   1. bounds[b, h, g, p] = sum_d max(q_d * max_pd, q_d * min_pd) for the G query heads of KV head h
//      (elementwise equal to relu(q) . max + (-relu(-q)) . min; only the order of the sum differs);
//   2. per selection head (a query head, or a KV group by the max / sum of its heads' bounds): page 0
//      and pages first_recent.. are always read, the best others fill n pages (rank: nan lowest, +inf
//      just below the forced pages, ties to the lower page); the chosen pages sorted ascending;
//   3. exact softmax attention of each query head over the rows of its chosen pages that hold one of
//      the `length` tokens, reading K and V where they lie in the cache (no copy).
// Inputs: q (B, Hq, D) float32 contiguous; page_keys (B, Hkv, N', P, D), page_values (B, Hkv, N', P, Dv)
// float32 with each page's block contiguous (the cache's storage or views of it); summaries
// (B, Hkv, N', 2D) float32, [max | min], last dim contiguous; the first N = ceil(length / P) <= N'
// pages hold the `length` tokens. Outputs: out (B, Hq, Dv), lse (B, Hq), pages (B, Hsel, n) int64,
// bounds (B, Hkv, G, N) float32. Built by gatherlens/ops/native.py; fake kernel in fused_decode.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace {

struct Layout {                                   // element strides of a (B, H, N, ...) view
  int64_t b, h, n;
};

Layout layout_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

inline float bound_row(const float* q, const float* mx, const float* mn, int64_t D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += std::max(q[d] * mx[d], q[d] * mn[d]);
  return s;
}

inline float dot(const float* a, const float* b, int64_t D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

inline void prefetch_page(const float* page, int64_t floats) {  // the next chosen page, while this one runs
  for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(page + i, 0, 3);
}

inline float rank_value(float v) {               // page_choice.rankable: nan lowest, +inf below forced
  if (std::isnan(v)) return -std::numeric_limits<float>::infinity();
  if (v == std::numeric_limits<float>::infinity()) return std::numeric_limits<float>::max();
  return v;
}

// pages[0:n] of one selection head from its scores (N,): forced pages, then the best others.
void choose(const float* score, int64_t N, int64_t n, int64_t first_recent, int64_t* pages,
            std::vector<int64_t>& cand) {
  if (n >= N) {
    for (int64_t p = 0; p < N; ++p) pages[p] = p;
    return;
  }
  const int64_t fr = std::max<int64_t>(1, std::min(first_recent, N - 1));
  int64_t k = 0;
  pages[k++] = 0;
  const int64_t forced = 1 + (N - fr);
  const int64_t free_slots = std::max<int64_t>(0, n - forced);
  cand.clear();
  for (int64_t p = 1; p < fr; ++p) cand.push_back(p);
  auto better = [score](int64_t a, int64_t b) {
    const float va = rank_value(score[a]), vb = rank_value(score[b]);
    return va > vb || (va == vb && a < b);
  };
  const int64_t take = std::min<int64_t>(free_slots, static_cast<int64_t>(cand.size()));
  if (take > 0 && take < static_cast<int64_t>(cand.size()))
    std::nth_element(cand.begin(), cand.begin() + take, cand.end(), better);
  for (int64_t i = 0; i < take; ++i) pages[k++] = cand[i];
  for (int64_t p = fr; p < N && k < n; ++p) pages[k++] = p;
  std::sort(pages, pages + k);
}

// out (D,), returns lse: attention of q over the valid rows of the chosen pages.
float attend(const float* q, const float* K, const float* V, Layout kl, Layout vl, const int64_t* pages,
             int64_t n, int64_t P, int64_t D, int64_t Dv, int64_t length, float scale, float* out,
             std::vector<float>& w) {
  w.resize(static_cast<size_t>(n * P));
  float m = -std::numeric_limits<float>::infinity();
  int64_t rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pages[i], valid = std::min<int64_t>(P, length - p * P);
    const float* kp = K + p * kl.n;
    if (i + 1 < n) prefetch_page(K + pages[i + 1] * kl.n, P * D);
    for (int64_t j = 0; j < valid; ++j) {
      const float l = dot(q, kp + j * D, D) * scale;
      w[rows++] = l;
      m = std::max(m, l);
    }
  }
  for (int64_t d = 0; d < Dv; ++d) out[d] = 0.f;
  if (!(m > -std::numeric_limits<float>::infinity())) {  // every logit -inf or nan: as the torch path
    for (int64_t d = 0; d < Dv; ++d) out[d] = std::numeric_limits<float>::quiet_NaN();
    return m;
  }
  double sum = 0.0;
  rows = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pages[i], valid = std::min<int64_t>(P, length - p * P);
    const float* vp = V + p * vl.n;
    if (i + 1 < n) prefetch_page(V + pages[i + 1] * vl.n, P * Dv);
    for (int64_t j = 0; j < valid; ++j) {
      const float e = std::exp(w[rows++] - m);
      sum += e;
      const float* vr = vp + j * Dv;
#pragma omp simd
      for (int64_t d = 0; d < Dv; ++d) out[d] += e * vr[d];
    }
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t d = 0; d < Dv; ++d) out[d] *= inv;
  return m + static_cast<float>(std::log(sum));
}

void check_inputs(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& s,
                  int64_t length, int64_t n) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "paged_decode: q must be (B, Hq, D) float32 contiguous");
  TORCH_CHECK(pk.dim() == 5 && pv.dim() == 5 && pv.sizes().slice(0, 4) == pk.sizes().slice(0, 4) &&
                  pk.scalar_type() == at::kFloat &&
                  pv.scalar_type() == at::kFloat, "paged_decode: page_keys / page_values must be (B, Hkv, N, P, D) float32");
  const int64_t P = pk.size(3), D = pk.size(4);
  TORCH_CHECK(pk.stride(4) == 1 && pk.stride(3) == D && pv.stride(4) == 1 && pv.stride(3) == pv.size(4),
              "paged_decode: each page's (P, D) block must be contiguous");
  TORCH_CHECK(s.dim() == 4 && s.scalar_type() == at::kFloat && s.stride(3) == 1 && s.size(3) == 2 * D &&
                  s.size(2) == pk.size(2), "paged_decode: summaries must be (B, Hkv, N, 2D) float32");
  TORCH_CHECK(q.size(0) == pk.size(0) && q.size(2) == D && q.size(1) % pk.size(1) == 0,
              "paged_decode: q (B, Hq, D) does not match the cache");
  TORCH_CHECK(length >= 1 && length <= pk.size(2) * P, "paged_decode: length ", length,
              " is outside the ", pk.size(2), " pages of ", P, " the storage holds");
  TORCH_CHECK(n >= 1, "paged_decode: n must be >= 1");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> paged_decode_cpu(
    const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& s, int64_t length,
    int64_t n, int64_t first_recent, double scale, bool per_head, bool group_sum) {
  check_inputs(q, pk, pv, s, length, n);
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t Hkv = pk.size(1), P = pk.size(3), N = (length + P - 1) / P, G = Hq / Hkv, Dv = pv.size(4);
  const int64_t Hsel = per_head ? Hq : Hkv, nn = std::min(n, N);
  at::Tensor bounds = at::empty({B, Hkv, G, N}, q.options());
  at::Tensor pages = at::empty({B, Hsel, nn}, q.options().dtype(at::kLong));
  at::Tensor out = at::empty({B, Hq, Dv}, q.options()), lse = at::empty({B, Hq}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* bp = bounds.data_ptr<float>();
  int64_t* pg = pages.data_ptr<int64_t>();
  const Layout sl = layout_of(s), kl = layout_of(pk), vl = layout_of(pv);
  constexpr int64_t kBlock = 256;                  // pages per scoring task
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  at::parallel_for(0, B * Hkv * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bh = t / blocks, blk = t % blocks, b = bh / Hkv, h = bh % Hkv;
      const float* srow = sp + b * sl.b + h * sl.h;
      for (int64_t p = blk * kBlock; p < std::min(N, (blk + 1) * kBlock); ++p)
        for (int64_t g = 0; g < G; ++g)
          bp[(bh * G + g) * N + p] = bound_row(qp + (b * Hq + h * G + g) * D, srow + p * sl.n, srow + p * sl.n + D, D);
    }
  });
  at::parallel_for(0, B * Hsel, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> score;
    std::vector<int64_t> cand;
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = bp + t * N;               // per head: (b, hq) is row b*Hq + hq of (B*Hkv*G, N)
      if (!per_head) {                             // a KV group's heads reduced: max or sum
        score.assign(bp + t * G * N, bp + t * G * N + N);
        for (int64_t g = 1; g < G; ++g) {
          const float* r = bp + (t * G + g) * N;
          for (int64_t p = 0; p < N; ++p) score[p] = group_sum ? score[p] + r[p] : std::max(score[p], r[p]);
        }
        row = score.data();
      }
      choose(row, N, nn, first_recent, pg + t * nn, cand);
    }
  });
  const float* kp = pk.data_ptr<float>();
  const float* vp = pv.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, B * Hq, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> w;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / Hq, hq = t % Hq, h = hq / G;
      const int64_t sel = per_head ? t : b * Hkv + h;
      lp[t] = attend(qp + t * D, kp + b * kl.b + h * kl.h, vp + b * vl.b + h * vl.h, kl, vl, pg + sel * nn, nn,
                     P, D, Dv, length, static_cast<float>(scale), op + t * Dv, w);
    }
  });
  return {out, lse, pages, bounds};
}


// Dense decode over every cached token, read in place: the G query heads of a KV group read each key
// and value row once, and the rows are split in chunks over the threads (a split-K, combined by
// log-sum-exp), so a few KV heads still use every thread. out (B, Hq, Dv), lse (B, Hq).
std::tuple<at::Tensor, at::Tensor> dense_decode_cpu(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv,
                                                    int64_t length, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat, "dense_decode: q must be (B, Hq, D) float32");
  TORCH_CHECK(pk.dim() == 5 && pv.dim() == 5 && pk.scalar_type() == at::kFloat && pv.scalar_type() == at::kFloat &&
                  pk.stride(4) == 1 && pk.stride(3) == pk.size(4) && pv.stride(4) == 1 && pv.stride(3) == pv.size(4) &&
                  pk.stride(2) == pk.size(3) * pk.size(4) && pv.stride(2) == pv.size(3) * pv.size(4),
              "dense_decode: page_keys / page_values must be float32 storage with contiguous pages");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = pk.size(1), P = pk.size(3), Dv = pv.size(4);
  TORCH_CHECK(pk.size(0) == B && pk.size(4) == D && Hq % Hkv == 0, "dense_decode: q does not match the cache");
  TORCH_CHECK(length >= 1 && length <= pk.size(2) * P, "dense_decode: length ", length, " is outside the storage");
  const int64_t G = Hq / Hkv;
  constexpr int64_t kRows = 512;                   // rows per task
  const int64_t chunks = (length + kRows - 1) / kRows, tasks = B * Hkv * chunks;
  std::vector<float> part_m(tasks * G), part_s(tasks * G), part_acc(tasks * G * Dv);
  const float* qp = q.data_ptr<float>();
  const float* kp = pk.data_ptr<float>();
  const float* vp = pv.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> w(kRows * G);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bh = t / chunks, c = t % chunks, b = bh / Hkv, h = bh % Hkv;
      const int64_t r0 = c * kRows, r1 = std::min(length, r0 + kRows), n = r1 - r0;
      const float* K = kp + b * pk.stride(0) + h * pk.stride(1) + r0 * D;  // rows are contiguous across pages
      const float* V = vp + b * pv.stride(0) + h * pv.stride(1) + r0 * Dv;
      const float* qg = qp + (b * Hq + h * G) * D;
      float* m = part_m.data() + t * G;
      float* sum = part_s.data() + t * G;
      float* acc = part_acc.data() + t * G * Dv;
      for (int64_t g = 0; g < G; ++g) m[g] = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j)
        for (int64_t g = 0; g < G; ++g) {
          const float l = dot(qg + g * D, K + j * D, D) * sc;
          w[j * G + g] = l;
          m[g] = std::max(m[g], l);
        }
      for (int64_t g = 0; g < G; ++g) sum[g] = 0.f;
      std::fill(acc, acc + G * Dv, 0.f);
      for (int64_t j = 0; j < n; ++j) {
        const float* vr = V + j * Dv;
        for (int64_t g = 0; g < G; ++g) {
          const float e = std::exp(w[j * G + g] - m[g]);
          sum[g] += e;
          float* a = acc + g * Dv;
#pragma omp simd
          for (int64_t d = 0; d < Dv; ++d) a[d] += e * vr[d];
        }
      }
    }
  });
  at::Tensor out = at::empty({B, Hq, Dv}, q.options()), lse = at::empty({B, Hq}, q.options());
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  for (int64_t bh = 0; bh < B * Hkv; ++bh)
    for (int64_t g = 0; g < G; ++g) {
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < chunks; ++c) M = std::max(M, part_m[(bh * chunks + c) * G + g]);
      double S = 0.0;
      float* o = op + ((bh / Hkv) * Hq + (bh % Hkv) * G + g) * Dv;
      std::fill(o, o + Dv, 0.f);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t t = bh * chunks + c;
        const float f = std::exp(part_m[t * G + g] - M);
        S += static_cast<double>(part_s[t * G + g]) * f;
        const float* a = part_acc.data() + (t * G + g) * Dv;
        for (int64_t d = 0; d < Dv; ++d) o[d] += f * a[d];
      }
      const float inv = static_cast<float>(1.0 / S);
      for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
      lp[(bh / Hkv) * Hq + (bh % Hkv) * G + g] = M + static_cast<float>(std::log(S));
    }
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("paged_decode(Tensor q, Tensor page_keys, Tensor page_values, Tensor summaries, int length, int n, "
        "int first_recent, float scale, bool per_head, bool group_sum) -> (Tensor out, Tensor lse, Tensor pages, "
        "Tensor bounds)");
  m.def("dense_decode(Tensor q, Tensor page_keys, Tensor page_values, int length, float scale) -> (Tensor out, "
        "Tensor lse)");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("paged_decode", &paged_decode_cpu);
  m.impl("dense_decode", &dense_decode_cpu);
}
