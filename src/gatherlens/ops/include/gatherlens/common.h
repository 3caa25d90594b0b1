// The rules every C++ operator under gatherlens/ops shares, stated once (each .cpp includes this):
//
//   #include "gatherlens/common.h"        // ops/native.py passes ops/include as an include path
//
//   page geometry  ceil_div, page_count, page_rows: ops/sparse/geometry.py's ceil_div, page_count and
//                  page_range, for the C++ side (a cache of `length` tokens in pages of P holds
//                  page_count(length, P) pages; page p holds page_rows(p, P, length) of them);
//   block layout   Strides / strides_of: the element strides of a (B, H, N, ...) view (a cache's
//                  pages: batch, head, page);
//   exp            exp_neg: the one exp of every kernel (x <= 0: the shifted logits of a softmax,
//                  -|x| in a sigmoid); Cephes' expf, so loops of it vectorize; nan stays nan;
//   softmax        row_max, exp_sum, scale_by, lse_of, softmax_row (weights and log-sum-exp of a
//                  row), sigmoid, and merge_partials: split-K partials (max, sum, weighted values)
//                  combined by their log-sum-exp;
//   thread split   parallel_chunks / for_each_task: independent tasks over torch's threads, handed out
//                  from a shared counter (or, GATHERLENS_SCHEDULE=static, at::parallel_for's even
//                  split); a thread makes its scratch once; results never depend on the thread count;
//   prefetching    prefetch_lines: a range's cache lines asked for (attention's next chosen page);
//                  stream_ahead: a one-row product's loop over a weight it reads once from memory asks
//                  for the bytes STREAM_AHEAD past the block it is at;
//   input checks   check_heads: query and KV head counts every attention operator checks before it
//                  divides by them (each operator checks its own inputs: a bad shape is a RuntimeError
//                  naming the operator, never an out-of-bounds read or write, a SIGFPE or a SIGSEGV).
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace gatherlens {

// ---- input checks ----

// Hq query heads over Hkv KV heads: both at least 1, Hq a multiple of Hkv (each KV head serves Hq / Hkv).
inline void check_heads(const char* op, int64_t Hq, int64_t Hkv) {
  TORCH_CHECK(Hkv >= 1 && Hq >= 1 && Hq % Hkv == 0, op, ": needs at least one query head and one KV head, the "
              "query heads a multiple of the KV heads; got ", Hq, " query heads over ", Hkv, " KV heads");
}

// ---- streaming a weight from memory ----

// A decode step's products read each weight once, in order, from memory (a model is larger than the
// caches). The hardware prefetcher alone left them latency-bound: gemma3-1b's Q5_0 gate|up (6,912 x
// 1,152, 11 MB, 2 threads, read cold) 16 GB/s; asking 4-16 KiB ahead 26-27 GB/s (2 KiB 23, 512 B 18),
// a sum over 1 GiB in torch 30 (Intel Xeon, AVX-512). A prefetch never faults, so past a buffer's end
// is harmless.
constexpr int64_t STREAM_AHEAD = 8192;

inline void prefetch_lines(const void* at, int64_t bytes) {  // the cache lines of [at, at + bytes), asked for
  const char* p = static_cast<const char*>(at);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

inline void stream_ahead(const uint8_t* at, int64_t bytes) {  // the cache lines of [at, at + bytes) + STREAM_AHEAD
  prefetch_lines(at + STREAM_AHEAD, bytes);
}

// ---- page geometry (ops/sparse/geometry.py) ----

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0

inline int64_t page_count(int64_t length, int64_t P) { return ceil_div(length, P); }

inline int64_t page_rows(int64_t p, int64_t P, int64_t length) {  // tokens page p holds: 1..P
  const int64_t left = length - p * P;
  return left < P ? left : P;
}

// ---- block layout ----

struct Strides {                                  // element strides of a (B, H, N, ...) view
  int64_t b, h, n;
};

inline Strides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// ---- the one exp ----

inline float exp_neg(float x) {                   // exp(x) for x <= 0, Cephes' expf: vectorizable
  const float c = x > -87.0f ? x : -87.0f;        // below -87 (exp ~1e-38) the result is 0; nan too here
  const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
  const float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);  // times 2^n
  return x > -87.0f ? e : (x == x ? 0.0f : x);    // nan stays nan (as std::exp)
}

inline double exp_neg(double x) { return std::exp(x); }

// ---- softmax and log-sum-exp ----

template <typename T>
inline T row_max(const T* v, int64_t n) {         // max of v[:n]; nan never wins; -inf when n == 0
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

template <typename T>
inline double exp_sum(const T* v, int64_t n, T m, T* w) {  // w = exp(v - m) (w may be v), sum(w)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] = exp_neg(v[i] - m);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(w[i]);
  return s;
}

template <typename T>
inline void scale_by(T* w, int64_t n, T f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] *= f;
}

template <typename T>
inline T lse_of(T m, double sum) { return T(double(m) + std::log(sum)); }  // log(sum exp(l)), l - m summed

template <typename T>
inline void softmax_row(const T* v, int64_t n, T* w, T* lse) {  // w = softmax(v[:n]), lse = log-sum-exp
  if (n == 0) { *lse = -std::numeric_limits<T>::infinity(); return; }
  const T m = row_max(v, n);
  const double s = exp_sum(v, n, m, w);
  scale_by(w, n, T(1.0 / s));
  *lse = lse_of(m, s);
}

// x rounded to 8 bits per block of n values (llama.cpp's Q8_0 / Q8_1: n = 32; Q8_K: n = 256): the
// one rule, d = max|v| / 127 and q = round(v / d), ties to even. A block holding NaN or inf gets a
// NaN d (std::max would drop a NaN), so every output it adds to is NaN, as in float. Returns d.
// Its float64 twin: ops/quant/q8act_naive.quantize_activations.
inline float round_block(const float* v, int64_t n, int8_t* q) {
  float amax = 0.f, probe = 0.f;                  // probe: 0 unless some v is inf or NaN (v * 0 is NaN then)
#pragma omp simd reduction(max : amax) reduction(+ : probe)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    amax = a > amax ? a : amax;
    probe += v[i] * 0.f;
  }
  const float d = probe == 0.f ? amax / 127.f : std::nanf(""), id = d > 0.f ? 1.f / d : 0.f;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(v[i] * id));
  return d;
}

inline float sigmoid(float x) {                   // 1 / (1 + exp(-x)) from exp_neg(-|x|)
  const float e = exp_neg(-std::fabs(x)), r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

// Split-K: part c of `parts` (c = 0..parts-1, `step` floats apart, its values step * Dv apart) holds
// the max m of its logits, s = sum exp(l - m) and acc = sum exp(l - m) v (Dv,). out (Dv,) =
// the softmax-weighted sum over all of them; returns the log-sum-exp.
inline float merge_partials(const float* m, const float* s, const float* acc, int64_t parts, int64_t step,
                            int64_t Dv, float* out) {
  float M = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < parts; ++c) M = m[c * step] > M ? m[c * step] : M;
  double S = 0.0;
  for (int64_t d = 0; d < Dv; ++d) out[d] = 0.f;
  for (int64_t c = 0; c < parts; ++c) {
    const float f = exp_neg(m[c * step] - M);
    S += static_cast<double>(s[c * step]) * f;
    const float* a = acc + c * step * Dv;
#pragma omp simd
    for (int64_t d = 0; d < Dv; ++d) out[d] += f * a[d];
  }
  scale_by(out, Dv, static_cast<float>(1.0 / S));
  return lse_of(M, S);
}

// ---- the thread split ----
//
// How tasks meet torch's threads: "dynamic" (the default) hands chunks out from one shared counter,
// about 4 a thread, so a thread the OS preempted (another program on its core) takes fewer of them;
// "static" is at::parallel_for's even split, one range a thread. GATHERLENS_SCHEDULE=static|dynamic,
// read once per process (scripts/busy_core.py compares them). Either way no result depends on which
// thread ran a task, nor on how many threads there are: every split of a sum is fixed by the sizes.

inline bool dynamic_schedule() {
  static const bool dynamic = [] {
    const char* s = std::getenv("GATHERLENS_SCHEDULE");
    return s == nullptr || std::strcmp(s, "static") != 0;
  }();
  return dynamic;
}

template <typename Body>
inline void parallel_chunks(int64_t total, int64_t grain, const Body& body) {  // body(i0, i1) on a thread
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (!dynamic_schedule() || threads <= 1 || total <= grain) {
    at::parallel_for(0, total, grain, body);
    return;
  }
  const int64_t chunk = std::max(grain, ceil_div(total, 4 * threads)), chunks = ceil_div(total, chunk);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, chunks), 1, [&](int64_t, int64_t) {  // one worker a thread
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) body(c * chunk, std::min(total, (c + 1) * chunk));
  });
}

struct NoScratch {};

template <typename Scratch, typename Body>
inline void for_each_task(int64_t tasks, const Body& body) {  // body(t, scratch), one task a grain
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (dynamic_schedule() && threads > 1 && tasks > 1) {
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min(threads, tasks), 1, [&](int64_t, int64_t) {  // a worker a thread, its scratch
      Scratch scratch{};
      for (int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) body(t, scratch);
    });
    return;
  }
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    Scratch scratch{};
    for (int64_t t = t0; t < t1; ++t) body(t, scratch);
  });
}

}  // namespace gatherlens
