// y = x W^T with W as its GGUF blocks (Q4_0, Q4_1, Q8_0) and x quantized to 8 bits per 32 values,
// the dot products in integers: llama.cpp's CPU matmul (ggml_vec_dot_q4_1_q8_1 and friends).
//
//   torch.ops.gatherlens.q8act_linear(x, raw, qtype) -> y        x (M, K) float32, raw (N, row_bytes) uint8
//
// The weight is read as stored (no repacking, no float copy). Each 32-value block of a row of x
// becomes dx = max|x| / 127, qx = round(x / dx) in -127..127, and sx = dx * sum(qx) (llama.cpp's Q8_1;
// a block holding NaN or inf gets dx = NaN, so the outputs it reaches are NaN, never finite numbers);
// a weight block with scale d (and min m for Q4_1; Q4_0 is Q4_1 with m = -8 d) adds
//   d * dx * sum_i q_i qx_i  +  m * sx
// to the output: 32 products as one AVX2 multiply-add of unsigned codes by signed bytes, summed in
// int32. qtype: ggml's type number of Q4_0, Q4_1 or Q8_0; each format's type number, block bytes,
// field offsets and code offset come from quant_formats.h (generated from ops/quant/layout.py's
// records). The error is x's 8-bit rounding (up to dx / 2 per value), as in llama.cpp;
// ops/quant/q8act_naive.py computes the same sums in float64.
// Rows are split over torch's threads. Built by gatherlens/ops/native.py; fake kernel in q8act.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gatherlens/common.h"
#include "quant_formats.h"

namespace {

using gatherlens_quant::Q4_0;
using gatherlens_quant::Q4_1;
using gatherlens_quant::Q8_0;

constexpr int64_t QK = 32;  // x's blocks (llama.cpp's Q8_1): one per weight block of these formats

struct Act {                       // x quantized: per row, K/32 blocks of 32 int8, a scale and a sum
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
#endif
}

Act quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t nb = K / QK;
  Act a{std::vector<int8_t>(M * K), std::vector<float>(M * nb), std::vector<float>(M * nb)};
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + r * K + b * QK;
      float amax = 0.f;
      bool finite = true;  // std::max drops a NaN: a block holding NaN or inf gets a NaN scale instead,
      for (int64_t i = 0; i < QK; ++i) {  // so every output it adds to is NaN, as in float
        amax = std::max(amax, std::fabs(v[i]));
        finite = finite && std::isfinite(v[i]);
      }
      const float d = finite ? amax / 127.f : std::nanf(""), id = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      int8_t* q = a.q.data() + r * K + b * QK;
      for (int64_t i = 0; i < QK; ++i) {
        q[i] = static_cast<int8_t>(std::nearbyint(v[i] * id));
        sum += q[i];
      }
      a.d[r * nb + b] = d;
      a.s[r * nb + b] = d * static_cast<float>(sum);
    }
  return a;
}

// sum_i w_i q_i for one block: codes (unsigned 4-bit or signed 8-bit) against 32 int8 of x
#ifdef __AVX2__
inline __m256i nibbles(const uint8_t* qs) {    // 16 bytes -> 32 codes: low nibbles (0..15), then high
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

inline __m256 dot_u8(__m256i w, const int8_t* qx) {  // w unsigned codes, 8 int32 partial sums as float
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(p);
}

inline __m256 dot_s8(const int8_t* qw, const int8_t* qx) {  // both signed: |w| times x with w's sign
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qw));
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                                      _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(p);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

inline int dot_codes(const uint8_t* qs, const int8_t* qx) {  // scalar: 4-bit codes
  int s = 0;
  for (int i = 0; i < 16; ++i) s += (qs[i] & 0x0F) * qx[i] + (qs[i] >> 4) * qx[i + 16];
  return s;
}

template <class F>
inline float block_min(const uint8_t* blk, float d) {  // m, or -code_offset * d (Q4_0: m = -8 d)
  if constexpr (F::has_m) return half_to_float(blk + F::m_at);
  else return -static_cast<float>(F::code_offset) * d;
}

template <class F>  // Q4_0, Q4_1: 4-bit codes, w = q d + m
float row_q4(const uint8_t* row, int64_t nb, const Act& a, int64_t r, int64_t K) {
  const int8_t* qx = a.q.data() + r * K;
  const float* dx = a.d.data() + r * nb;
  const float* sx = a.s.data() + r * nb;
  float mins = 0.f;
#ifdef __AVX2__
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // two chains: the FMA's latency overlaps
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    const float d = half_to_float(blk + F::d_at), m = block_min<F>(blk, d);
    acc[b & 1] = _mm256_fmadd_ps(dot_u8(nibbles(blk + F::qs_at), qx + b * QK), _mm256_set1_ps(d * dx[b]),
                                 acc[b & 1]);
    mins += m * sx[b];
  }
  return hsum(_mm256_add_ps(acc[0], acc[1])) + mins;
#else
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    const float d = half_to_float(blk + F::d_at), m = block_min<F>(blk, d);
    acc += d * dx[b] * static_cast<float>(dot_codes(blk + F::qs_at, qx + b * QK));
    mins += m * sx[b];
  }
  return acc + mins;
#endif
}

template <class F>  // Q8_0: signed 8-bit codes, w = q d
float row_q8(const uint8_t* row, int64_t nb, const Act& a, int64_t r, int64_t K) {
  const int8_t* qx = a.q.data() + r * K;
  const float* dx = a.d.data() + r * nb;
#ifdef __AVX2__
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    acc[b & 1] = _mm256_fmadd_ps(dot_s8(reinterpret_cast<const int8_t*>(blk + F::qs_at), qx + b * QK),
                                 _mm256_set1_ps(half_to_float(blk + F::d_at) * dx[b]), acc[b & 1]);
  }
  return hsum(_mm256_add_ps(acc[0], acc[1]));
#else
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    const int8_t* qw = reinterpret_cast<const int8_t*>(blk + F::qs_at);
    int s = 0;
    for (int i = 0; i < QK; ++i) s += qw[i] * qx[b * QK + i];
    acc += half_to_float(blk + F::d_at) * dx[b] * static_cast<float>(s);
  }
  return acc;
#endif
}

template <class F>
at::Tensor linear(const at::Tensor& x, const at::Tensor& raw) {
  static_assert(F::weights == QK && F::group == QK, "one scale per 32 weights, as x's blocks");
  const int64_t M = x.size(0), K = x.size(1), N = raw.size(0), nb = K / QK;
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32, got ", K);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.stride(1) == 1 && raw.size(1) == nb * F::bytes,
              "raw must be (N, ", nb * F::bytes, ") uint8 blocks with contiguous rows");
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const Act a = quantize_rows(x.data_ptr<float>(), M, K);
  const uint8_t* w = raw.data_ptr<uint8_t>();
  const int64_t ws = raw.stride(0);
  float* out = y.data_ptr<float>();
  gatherlens::parallel_chunks(N, 64, [&](int64_t n0, int64_t n1) {  // 64 weight rows a task at least
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = n0; n < n1; ++n) {
        if constexpr (F::bits == 8) out[r * N + n] = row_q8<F>(w + n * ws, nb, a, r, K);
        else out[r * N + n] = row_q4<F>(w + n * ws, nb, a, r, K);
      }
  });
  return y;
}

at::Tensor q8act_linear_cpu(const at::Tensor& x, const at::Tensor& raw, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (M, K) float32 contiguous");
  switch (qtype) {
    case Q4_0::type: return linear<Q4_0>(x, raw);
    case Q4_1::type: return linear<Q4_1>(x, raw);
    case Q8_0::type: return linear<Q8_0>(x, raw);
    default: break;
  }
  TORCH_CHECK(false, "qtype must be ", Q4_0::type, " (Q4_0), ", Q4_1::type, " (Q4_1) or ", Q8_0::type,
              " (Q8_0), got ", qtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) { m.def("q8act_linear(Tensor x, Tensor raw, int qtype) -> Tensor"); }

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) { m.impl("q8act_linear", &q8act_linear_cpu); }
