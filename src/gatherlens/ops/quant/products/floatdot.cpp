// y = x W^T with W as the file's plain float values (F16, BF16 or F32), read as stored: the 2- or
// 4-byte values of the mapped file, converted 8 at a time in registers, never into a float copy.
//
//   torch.ops.gatherlens.floatdot_linear(x, raw, qtype) -> y     x (M, K) float32, raw (N, K * bytes) uint8
//
// F16 halves become floats with F16C (_mm256_cvtph_ps), BF16 by shifting the 16 bits into a float's
// high half, F32 loads as is; the products and sums are float32 fused multiply-adds (the only rounding:
// float32 sums in another order than a GEMM's). Made for decode (M of 1 to a few): each row of W is
// read once for up to 4 rows of x (4 accumulator chains a row of x, 32 weights a step); correct for any
// M. qtype: ggml's type number of F32, F16 or BF16; their type numbers and value sizes come from
// quant_formats.h (generated from ops/quant/formats/layout.py's records). Rows of W are split over torch's
// threads. Every AVX2 path has its scalar twin. Built by gatherlens/ops/native.py; fake kernel in
// floatdot.py.
#include <cstdint>
#include <cstring>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gatherlens/common.h"
#include "../formats/quant_formats.h"

namespace {

using gatherlens_quant::BF16;
using gatherlens_quant::F32;

template <class F>
inline float value(const uint8_t* p) {  // one stored value as a float
  if constexpr (F::type == F32::type) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    if constexpr (F::type == BF16::type) return c10::BFloat16(h, c10::BFloat16::from_bits());
    else return c10::Half(h, c10::Half::from_bits());
  }
}

#ifdef __AVX2__
template <class F>
inline __m256 values8(const uint8_t* p) {  // 8 stored values as floats
  if constexpr (F::type == F32::type) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (F::type == BF16::type) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else return _mm256_cvtph_ps(h);
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

constexpr int64_t STEP = 32;  // weights a step: 4 vectors of 8

template <class F, int R>  // out[j * N] = dot(row of W, x[j * K ...]) for R rows of x
void dots(const uint8_t* w, const float* x, int64_t K, int64_t N, float* out) {
  int64_t k = 0;
  float sums[R];
#ifdef __AVX2__
  __m256 acc[R][4];
  for (int j = 0; j < R; ++j)
    for (int u = 0; u < 4; ++u) acc[j][u] = _mm256_setzero_ps();
  for (; k + STEP <= K; k += STEP)
    for (int u = 0; u < 4; ++u) {
      const __m256 wv = values8<F>(w + (k + 8 * u) * F::bytes);
      for (int j = 0; j < R; ++j) acc[j][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * K + k + 8 * u), acc[j][u]);
    }
  for (int j = 0; j < R; ++j)
    sums[j] = hsum(_mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]), _mm256_add_ps(acc[j][2], acc[j][3])));
#else
  for (int j = 0; j < R; ++j) sums[j] = 0.f;
#endif
  for (; k < K; ++k) {  // the tail (all of it without AVX2)
    const float wk = value<F>(w + k * F::bytes);
    for (int j = 0; j < R; ++j) sums[j] += wk * x[j * K + k];
  }
  for (int j = 0; j < R; ++j) out[j * N] = sums[j];
}

template <class F>
void rows(const uint8_t* w, int64_t ws, const float* x, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1,
          float* y) {  // y[:, n0:n1]: rows of x four at a time (then two, one), each row of W read once per group
  for (int64_t r = 0; r < M;) {
    const int64_t left = M - r;
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wn = w + n * ws;
      if (left >= 4) dots<F, 4>(wn, x + r * K, K, N, y + r * N + n);
      else if (left >= 2) dots<F, 2>(wn, x + r * K, K, N, y + r * N + n);
      else dots<F, 1>(wn, x + r * K, K, N, y + r * N + n);
    }
    r += left >= 4 ? 4 : left >= 2 ? 2 : 1;
  }
}

template <class F>
at::Tensor linear(const at::Tensor& x, const at::Tensor& raw) {
  static_assert(F::weights == 1, "a plain float format: one value a block");
  const int64_t M = x.size(0), K = x.size(1), N = raw.size(0);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.stride(1) == 1 && raw.size(1) == K * F::bytes,
              "raw must be (N, ", K * F::bytes, ") uint8 values with contiguous rows");
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const uint8_t* w = raw.data_ptr<uint8_t>();
  const float* xp = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const int64_t ws = raw.stride(0);
  gatherlens::parallel_chunks(N, 16, [&](int64_t n0, int64_t n1) { rows<F>(w, ws, xp, M, K, N, n0, n1, out); });
  return y;
}

at::Tensor floatdot_linear_cpu(const at::Tensor& x, const at::Tensor& raw, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (M, K) float32 contiguous");
#define GATHERLENS_CASE(F) \
  case gatherlens_quant::F::type: return linear<gatherlens_quant::F>(x, raw);
  switch (qtype) {  // the formats whose records name this kernel (quant_formats.h)
    GATHERLENS_FLOATDOT_LINEAR_FORMATS(GATHERLENS_CASE)
    default: break;
  }
#undef GATHERLENS_CASE
  TORCH_CHECK(false, "qtype must be ", gatherlens_quant::floatdot_linear_formats, ", got ", qtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) { m.def("floatdot_linear(Tensor x, Tensor raw, int qtype) -> Tensor"); }

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) { m.impl("floatdot_linear", &floatdot_linear_cpu); }
