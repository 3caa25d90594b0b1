// How a paged KV cache's stored values are read and written, for the C++ side (ops/sparse/cache.py is
// the rule's home: `read_pages`, `grown_scale`, `quantize`; the kernels follow it, tested equal):
//
//   #include "gatherlens/kv_pages.h"
//
//   widen(x, n, scale, out)   n stored values as attention reads them, in float32: float as is, float16
//                             (F16C) and bfloat16 (a shift) converted exactly, int8 codes times one
//                             scale (a value token's: one float32 product, as cache.read_pages);
//   widen_channels(x, n, scales, out)  n int8 key codes times their channels' scales (a key page's
//                             per-channel scales, KIVI's layout; scales nullptr: widen(x, n, 1, out));
//   narrow(x) -> T            a float32 value rounded to the storage type (to nearest, ties to even);
//   grown_scale(amax, old)    an int8 key page channel's scale after a write reaching amax: old when
//                             amax <= 127 old, else max(amax / 127, 2 old) (a fresh page: old = 0; a value
//                             token's scale: grown_scale(amax, 0) = amax / 127);
//   quantize(x, scale)        round(x / scale) in [-127, 127], ties to even; 0 when the scale is not > 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

namespace gatherlens {

constexpr float kInt8Max = 127.f;

inline void widen(const float* x, int64_t n, float, float* out) { std::copy(x, x + n, out); }

inline void widen(const c10::Half* x, int64_t n, float, float* out) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(x[i]);
}

inline void widen(const c10::BFloat16* x, int64_t n, float, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = c10::detail::f32_from_bits(x[i].x);
}

inline void widen(const int8_t* x, int64_t n, float scale, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) * scale;
}

inline void widen_channels(const int8_t* x, int64_t n, const float* scales, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]) * scales[i];
}

template <typename T>
inline void widen_channels(const T* x, int64_t n, const float*, float* out) { widen(x, n, 1.f, out); }

template <typename T>
inline T narrow(float x) { return static_cast<T>(x); }  // float, c10::Half, c10::BFloat16: to nearest even

inline float grown_scale(float amax, float old) {
  return amax <= kInt8Max * old ? old : std::max(amax / kInt8Max, 2.f * old);
}

inline int8_t quantize(float x, float scale) {
  if (!(scale > 0.f)) return 0;
  const float c = std::nearbyint(x / scale);
  return static_cast<int8_t>(std::min(kInt8Max, std::max(-kInt8Max, c)));
}

}  // namespace gatherlens
