// The two inner loops of decode attention over stored rows, for the G query heads of a KV group at once
// (each stored row read and widened once for all G heads):
//
//   #include "gatherlens/group_dots.h"
//
//   group_dots(q, G, X, stride, xs, n, W, scale, out, ldo)
//       out[g * ldo + j] = scale * (q_g . widen(X_j)), q (G, W) float32, rows X_j = X + j * stride of n
//       rows, W values each, stored as T (float, c10::Half, c10::BFloat16, int8_t times xs: kv_pages.h's
//       `widen`, exactly). The logits of attention, and page bounds ([relu(q) | -relu(-q)] against a
//       page's [max | min]).
//   group_weigh(w, ldw, G, V, stride, vs, n, Dv, acc)
//       acc[g * Dv + d] += sum_j w[g * ldw + j] * widen(V_j)[d], rows in order (the weighted values).
//
// AVX2 (W, Dv multiples of 8): tiles of 4 rows by up to 3 heads, the dot products in registers, one
// horizontal sum per 4 rows; values by 32 columns by up to 3 heads. Elsewhere the plain loops. Sums run
// in another order than a plain dot product (float rounding); NaN and inf propagate as in float.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gatherlens/kv_pages.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace gatherlens {

template <typename T>
void group_dots_plain(const float* q, int64_t G, const T* X, int64_t stride, float xs, int64_t n, int64_t W,
                      float scale, float* out, int64_t ldo, float* buf) {  // buf: W floats
  for (int64_t j = 0; j < n; ++j) {
    widen(X + j * stride, W, xs, buf);
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < W; ++d) s += q[g * W + d] * buf[d];
      out[g * ldo + j] = s * scale;
    }
  }
}

template <typename T>
void group_weigh_plain(const float* w, int64_t ldw, int64_t G, const T* V, int64_t stride, float vs, int64_t n,
                       int64_t Dv, float* acc, float* buf) {  // buf: Dv floats
  for (int64_t j = 0; j < n; ++j) {
    widen(V + j * stride, Dv, vs, buf);
    for (int64_t g = 0; g < G; ++g) {
      const float e = w[g * ldw + j];
      float* a = acc + g * Dv;
#pragma omp simd
      for (int64_t d = 0; d < Dv; ++d) a[d] += e * buf[d];
    }
  }
}

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
constexpr bool kGroupSimd = true;

inline __m256 load8(const float* p, float) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p, float) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const c10::BFloat16* p, float) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
inline __m256 load8(const int8_t* p, float s) {
  const __m256i i = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s));
}

inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {  // (sum a, sum b, sum c, sum d)
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// GH heads by 4 rows (rows past n read row 0 again; their sums are dropped).
template <int GH, typename T>
void dots_tile(const float* q, const T* X, int64_t stride, float xs, int64_t rows, int64_t W, float scale,
               float* out, int64_t ldo) {
  __m256 acc[GH][4];
  for (int g = 0; g < GH; ++g)
    for (int r = 0; r < 4; ++r) acc[g][r] = _mm256_setzero_ps();
  const T* row[4];
  for (int r = 0; r < 4; ++r) row[r] = X + (r < rows ? r : 0) * stride;
  for (int64_t s = 0; s < W; s += 8) {
    __m256 k[4];
    for (int r = 0; r < 4; ++r) k[r] = load8(row[r] + s, xs);
    for (int g = 0; g < GH; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * W + s);
      for (int r = 0; r < 4; ++r) acc[g][r] = _mm256_fmadd_ps(qv, k[r], acc[g][r]);
    }
  }
  for (int g = 0; g < GH; ++g) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), _mm_set1_ps(scale)));
    for (int64_t r = 0; r < rows; ++r) out[g * ldo + r] = sums[r];
  }
}

template <typename T>
void group_dots_simd(const float* q, int64_t G, const T* X, int64_t stride, float xs, int64_t n, int64_t W,
                     float scale, float* out, int64_t ldo) {
  for (int64_t g = 0; g < G; g += 3) {
    const int64_t gh = std::min<int64_t>(3, G - g);
    for (int64_t j = 0; j < n; j += 4) {
      const int64_t rows = std::min<int64_t>(4, n - j);
      float* o = out + g * ldo + j;
      if (gh == 3) dots_tile<3>(q + g * W, X + j * stride, stride, xs, rows, W, scale, o, ldo);
      else if (gh == 2) dots_tile<2>(q + g * W, X + j * stride, stride, xs, rows, W, scale, o, ldo);
      else dots_tile<1>(q + g * W, X + j * stride, stride, xs, rows, W, scale, o, ldo);
    }
  }
}

// GH heads' CG groups of 8 columns of acc over the n rows (GH * CG accumulators: independent FMA chains).
template <int GH, int CG, typename T>
void weigh_tile(const float* w, int64_t ldw, const T* V, int64_t stride, float vs, int64_t n, int64_t Dv,
                int64_t col, float* acc) {
  __m256 a[GH][CG];
  for (int g = 0; g < GH; ++g)
    for (int c = 0; c < CG; ++c) a[g][c] = _mm256_loadu_ps(acc + g * Dv + col + 8 * c);
  for (int64_t j = 0; j < n; ++j) {
    __m256 v[CG];
    for (int c = 0; c < CG; ++c) v[c] = load8(V + j * stride + col + 8 * c, vs);
    for (int g = 0; g < GH; ++g) {
      const __m256 e = _mm256_broadcast_ss(w + g * ldw + j);
      for (int c = 0; c < CG; ++c) a[g][c] = _mm256_fmadd_ps(e, v[c], a[g][c]);
    }
  }
  for (int g = 0; g < GH; ++g)
    for (int c = 0; c < CG; ++c) _mm256_storeu_ps(acc + g * Dv + col + 8 * c, a[g][c]);
}

template <int GH, typename T>
void weigh_heads(const float* w, int64_t ldw, const T* V, int64_t stride, float vs, int64_t n, int64_t Dv,
                 float* acc) {  // every column of GH heads: 32 columns at a time (2 heads of 4: 16), then 8
  constexpr int CG = GH <= 2 ? 4 : 2;
  int64_t c = 0;
  for (; c + 8 * CG <= Dv; c += 8 * CG) weigh_tile<GH, CG>(w, ldw, V, stride, vs, n, Dv, c, acc);
  for (; c < Dv; c += 8) weigh_tile<GH, 1>(w, ldw, V, stride, vs, n, Dv, c, acc);
}

template <typename T>
void group_weigh_simd(const float* w, int64_t ldw, int64_t G, const T* V, int64_t stride, float vs, int64_t n,
                      int64_t Dv, float* acc) {
  for (int64_t g = 0; g < G; g += 3) {
    const int64_t gh = std::min<int64_t>(3, G - g);
    const float* wg = w + g * ldw;
    float* ag = acc + g * Dv;
    if (gh == 3) weigh_heads<3>(wg, ldw, V, stride, vs, n, Dv, ag);
    else if (gh == 2) weigh_heads<2>(wg, ldw, V, stride, vs, n, Dv, ag);
    else weigh_heads<1>(wg, ldw, V, stride, vs, n, Dv, ag);
  }
}
#else
constexpr bool kGroupSimd = false;
#endif

// The two loops, on the fast path where it applies (buf: max(W, Dv) floats for the plain ones).
template <typename T>
void group_dots(const float* q, int64_t G, const T* X, int64_t stride, float xs, int64_t n, int64_t W, float scale,
                float* out, int64_t ldo, float* buf) {
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
  if (W % 8 == 0) return group_dots_simd(q, G, X, stride, xs, n, W, scale, out, ldo);
#endif
  group_dots_plain(q, G, X, stride, xs, n, W, scale, out, ldo, buf);
}

template <typename T>
void group_weigh(const float* w, int64_t ldw, int64_t G, const T* V, int64_t stride, float vs, int64_t n, int64_t Dv,
                 float* acc, float* buf) {
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
  if (Dv % 8 == 0) return group_weigh_simd(w, ldw, G, V, stride, vs, n, Dv, acc);
#endif
  group_weigh_plain(w, ldw, G, V, stride, vs, n, Dv, acc, buf);
}

}  // namespace gatherlens
