// y = x W^T with W as its GGUF super-blocks of 256 weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) and
// x quantized to Q8_K, the dot products in integers: llama.cpp's CPU matmul (ggml_vec_dot_q4_K_q8_K
// and friends in ggml-cpu/arch/x86/quants.c).
//
//   torch.ops.gatherlens.q8k_linear(x, raw, qtype) -> y        x (M, K) float32, raw (N, row_bytes) uint8
//
// The weight is read as stored (no repacking, no float copy). Each 256-value block of a row of x
// becomes Q8_K: dx = max|x| / 127, qx = round(x / dx) in -127..127 and bsums, the sums of qx over
// each 16 values (a block holding NaN or inf gets dx = NaN, so the outputs it reaches are NaN). A
// weight super-block with scale d (and dmin) and integer sub-block scales sc (and mins mn) adds
//   d dx sum_s sc_s sum_{i in s} q_i qx_i  -  dmin dx sum_s mn_s sum_{i in s} qx_i
// to its output, every sum over s and i in int32; codes stored with an offset (Q3_K: q - 4, Q6_K:
// q - 32) are multiplied unsigned and the offset taken back through bsums; IQ4_XS's codes are its
// codebook's int8 values. qtype: ggml's type number; each format's type number, block bytes, field
// offsets and codebook come from quant_formats.h (generated from ops/quant/formats/layout.py's records).
// The error is x's rounding (up to dx / 2 per value), as in llama.cpp; ops/quant/products/q8k_naive.py
// computes the same sums in float64. AVX2 where the CPU has it (defining GATHERLENS_Q8K_PLAIN
// builds the plain loops beside it instead); with AVX-512BW, Q4_K and Q6_K's one-row loop runs 64
// products a maddubs and keeps its sums over blocks in float lanes (Q8K_ROW512: 1.1-1.3x the AVX2
// loop's speed in a decode step). One row of x (decode) runs row_dot per weight row, weight
// rows split over torch's threads; x of GEMM_ROWS rows or more runs the blocked integer GEMM below
// (each super-block decoded once per call into a panel of 8 weight rows, met by tiles of 4 rows of x
// in registers; the frame in q8_panels.h, shared with q8act.cpp); `gatherlens::q8k_simd()` says which
// loops a build runs. Built by gatherlens/ops/native.py; fake kernel in q8k.py.
#include <algorithm>
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
#if defined(__AVX2__) && !defined(GATHERLENS_Q8K_PLAIN)
#define Q8K_SIMD 1
#include <immintrin.h>
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512F__)
#define Q8K_ROW512 1  // Q4_K and Q6_K's one-row loop in 512-bit registers, its sums over blocks in float lanes
#endif
#endif

#include "gatherlens/common.h"
#include "q8_panels.h"
#include "../formats/quant_formats.h"

namespace {

using gatherlens_quant::IQ4_XS;
using gatherlens_quant::Q2_K;
using gatherlens_quant::Q3_K;
using gatherlens_quant::Q4_K;
using gatherlens_quant::Q5_K;
using gatherlens_quant::Q6_K;

constexpr int64_t QK_K = 256;  // x's blocks (llama.cpp's Q8_K): one per weight super-block
constexpr int64_t SUMS = 16;   // bsums per block: one per 16 values

struct Act {                    // x as Q8_K: per row, K/256 blocks of 256 int8, a scale, 16 sums
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bsums;
  std::vector<int8_t> paired;   // Q8K_ROW512 with Q4_K: q with each block's 32-value runs in the order
};                              // 0 2 1 3 4 6 5 7 (a 64-byte load of Q4_K codes: runs 2c, 2c + 2 low; 2c + 1, 2c + 3 high)

struct Dot {                    // one super-block against one block of x, in integers
  int32_t q;                    // sum_s sc_s * sum_i q_i qx_i (offsets taken back)
  int32_t m;                    // sum_s mn_s * sum_i qx_i (formats with dmin; else 0)
};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

void quantize_block(const float* v, int8_t* q, int16_t* bsums, float* d_out) {
  const float d = gatherlens::round_block(v, QK_K, q);  // the one rounding rule (common.h)
  for (int64_t s = 0; s < SUMS; ++s) {
    int sum = 0;
    for (int64_t i = 0; i < 16; ++i) sum += q[s * 16 + i];
    bsums[s] = static_cast<int16_t>(sum);
  }
  *d_out = d;
}

Act quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t nb = K / QK_K;
  Act a{std::vector<int8_t>(M * K), std::vector<float>(M * nb), std::vector<int16_t>(M * nb * SUMS)};
  gatherlens::parallel_chunks(M * nb, 32, [&](int64_t b0, int64_t b1) {  // 32 blocks a task at least
    for (int64_t b = b0; b < b1; ++b)  // block b of all M * nb
      quantize_block(x + b * QK_K, a.q.data() + b * QK_K, a.bsums.data() + b * SUMS, a.d.data() + b);
  });
  return a;
}

// ---- sub-block scales, as ggml unpacks them ----

inline void k4_scale_min(const uint8_t* s, int j, int& sc, int& mn) {  // Q4_K / Q5_K: get_scale_min_k4
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void q3_k_scales(const uint8_t* s, int16_t sc[16]) {  // 16 6-bit scales, less 32
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4, high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc[j] = static_cast<int16_t>((low | (high << 4)) - 32);
  }
}

inline int iq4_xs_scale(const uint8_t* blk, int ib) {  // sub-block ib's 6-bit scale, less 32
  uint16_t h;
  std::memcpy(&h, blk + IQ4_XS::scales_h_at, 2);
  const int low = (blk[IQ4_XS::scales_l_at + ib / 2] >> (4 * (ib % 2))) & 0x0F;
  return (low | (((h >> (2 * ib)) & 3) << 4)) - 32;
}

inline int32_t k4_mins(const uint8_t* s, const int16_t* bs) {  // sum over 8 sub-blocks of 32: mn (bsum pair)
  int32_t m = 0;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    k4_scale_min(s, j, sc, mn);
    m += mn * (bs[2 * j] + bs[2 * j + 1]);
  }
  return m;
}

// ---- the plain loops (the fallback; GATHERLENS_Q8K_PLAIN builds them on an AVX2 machine too) ----

[[maybe_unused]] Dot q2_k_plain(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const uint8_t *qs = blk + Q2_K::qs_at, *sc = blk + Q2_K::scales_at;
  Dot r{0, 0};
  for (int s = 0; s < 16; ++s) r.m += (sc[s] >> 4) * bs[s];
  for (int s = 0; s < 16; ++s) {  // sub-block s = 8n + 2j + h: bits 2j of qs[32n + 16h + l]
    const int n = s / 8, j = (s % 8) / 2, h = s % 2;
    int dot = 0;
    for (int l = 0; l < 16; ++l) dot += ((qs[32 * n + 16 * h + l] >> (2 * j)) & 3) * qx[16 * s + l];
    r.q += (sc[s] & 0x0F) * dot;
  }
  return r;
}

[[maybe_unused]] Dot q3_k_plain(const uint8_t* blk, const int8_t* qx, const int16_t*) {
  const uint8_t *qs = blk + Q3_K::qs_at, *hm = blk + Q3_K::hmask_at;
  int16_t sc[16];
  q3_k_scales(blk + Q3_K::scales_at, sc);
  Dot r{0, 0};
  for (int s = 0; s < 16; ++s) {  // as Q2_K, plus bit 4n + j of hmask[16h + l]: a clear bit takes 4 off
    const int n = s / 8, j = (s % 8) / 2, h = s % 2, bit = 1 << (4 * n + j);
    int dot = 0;
    for (int l = 0; l < 16; ++l) {
      const int low = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3;
      dot += (low - ((hm[16 * h + l] & bit) ? 0 : 4)) * qx[16 * s + l];
    }
    r.q += sc[s] * dot;
  }
  return r;
}

template <class F>  // Q4_K, Q5_K: 8 sub-blocks of 32; chunk c of qs holds 2c (low nibbles) and 2c + 1
[[maybe_unused]] Dot k4_plain(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const uint8_t *qs = blk + F::qs_at, *scales = blk + F::scales_at;
  Dot r{0, k4_mins(scales, bs)};
  for (int s = 0; s < 8; ++s) {
    int sc, mn, dot = 0;
    k4_scale_min(scales, s, sc, mn);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
      if constexpr (F::has_qh) q |= ((blk[F::qh_at + l] >> s) & 1) << 4;  // Q5_K: bit s of qh[l]
      dot += q * qx[32 * s + l];
    }
    r.q += sc * dot;
  }
  return r;
}

[[maybe_unused]] Dot q6_k_plain(const uint8_t* blk, const int8_t* qx, const int16_t*) {
  const uint8_t *ql = blk + Q6_K::ql_at, *qh = blk + Q6_K::qh_at;
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + Q6_K::scales_at);
  Dot r{0, 0};
  for (int s = 0; s < 16; ++s) {  // weight 128h + 32k + l: nibble k / 2 of ql[64h + 32(k % 2) + l], bits 2k of qh[32h + l]
    int dot = 0;
    for (int e = 16 * s; e < 16 * s + 16; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const int low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F, high = (qh[32 * h + l] >> (2 * k)) & 3;
      dot += ((low | (high << 4)) - 32) * qx[e];
    }
    r.q += sc[s] * dot;
  }
  return r;
}

[[maybe_unused]] Dot iq4_xs_plain(const uint8_t* blk, const int8_t* qx, const int16_t*) {
  const uint8_t* qs = blk + IQ4_XS::qs_at;
  Dot r{0, 0};
  for (int ib = 0; ib < 8; ++ib) {  // sub-block ib: 16 bytes, low nibbles then high ones, through the book
    int dot = 0;
    for (int j = 0; j < 16; ++j)
      dot += IQ4_XS::book[qs[16 * ib + j] & 0x0F] * qx[32 * ib + j] + IQ4_XS::book[qs[16 * ib + j] >> 4] * qx[32 * ib + 16 + j];
    r.q += iq4_xs_scale(blk, ib) * dot;
  }
  return r;
}

// ---- AVX2: 32 products at a time (maddubs: unsigned codes by signed bytes), scaled by madd ----

#ifdef Q8K_SIMD
inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline __m256i bits_at(__m256i v, int shift, int mask) {  // (v >> shift) & mask in every byte (shift < 8)
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(static_cast<char>(mask)));
}

inline int32_t hsum_i32_128(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline int32_t hsum_i32(__m256i v) {
  return hsum_i32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// The 16-weight sub-block formats (Q2_K, Q3_K, Q6_K): 16 int16 scales in a register; 32 weights (two
// sub-blocks) are scaled by one byte shuffle of them (ggml's get_scale_shuffle_q3k).
struct Scales16 {
  __m256i half[2];  // sub-blocks 8n .. 8n + 7 in both lanes of half[n]
  __m256i all;      // the 16 scales in order
};

inline Scales16 scales16(__m256i all) {
  const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
  return Scales16{{_mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi)}, all};
}

inline __m256i pair_of(const Scales16& sc, int n, int j) {  // sub-block 8n + 2j (low lane), + 1 (high lane)
  const char a = static_cast<char>(4 * j), b = static_cast<char>(4 * j + 2);
  const __m256i pick = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1,
                                        b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1);
  return _mm256_shuffle_epi8(sc.half[n], pick);
}

inline __m256i scaled16(__m256i q, const int8_t* qx, const Scales16& sc, int n, int j) {  // sub-blocks 8n + 2j, + 1
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(qx + 128 * n + 32 * j)), pair_of(sc, n, j));
}

inline int32_t scaled_sums(__m256i sc16, const int16_t* bs) {  // sum_s sc_s bsum_s over the 16 sub-blocks
  return hsum_i32(_mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs))));
}

Dot q2_k_simd(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + Q2_K::scales_at)), m4 = _mm_set1_epi8(0x0F);
  const Scales16 sc = scales16(_mm256_cvtepu8_epi16(_mm_and_si128(packed, m4)));  // low nibbles: scales
  const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));  // high: mins
  __m256i acc = _mm256_setzero_si256();
  for (int n = 0; n < 2; ++n) {
    const __m256i bits = load32(blk + Q2_K::qs_at + 32 * n);
    for (int j = 0; j < 4; ++j) acc = _mm256_add_epi32(acc, scaled16(bits_at(bits, 2 * j, 3), qx, sc, n, j));
  }
  return Dot{hsum_i32(acc), scaled_sums(mins, bs)};
}

inline __m256i q3_k_scales16(const uint8_t* s) {  // q3_k_scales, four bytes at a time (ggml's kmask1/2)
  uint32_t a[3];
  std::memcpy(a, s, 12);
  const uint32_t m2 = 0x0F0F0F0F, m1 = 0x03030303;
  const __m128i sc = _mm_set_epi32(static_cast<int>(((a[1] >> 4) & m2) | (((a[2] >> 6) & m1) << 4)),
                                   static_cast<int>(((a[0] >> 4) & m2) | (((a[2] >> 4) & m1) << 4)),
                                   static_cast<int>((a[1] & m2) | (((a[2] >> 2) & m1) << 4)),
                                   static_cast<int>((a[0] & m2) | ((a[2] & m1) << 4)));
  return _mm256_cvtepi8_epi16(_mm_sub_epi8(sc, _mm_set1_epi8(32)));  // 16 int16 in -32..31
}

Dot q3_k_simd(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const Scales16 sc = scales16(q3_k_scales16(blk + Q3_K::scales_at));
  const __m256i hbits = load32(blk + Q3_K::hmask_at);
  __m256i acc = _mm256_setzero_si256();
  for (int n = 0; n < 2; ++n) {
    const __m256i bits = load32(blk + Q3_K::qs_at + 32 * n);
    for (int j = 0; j < 4; ++j) {  // codes 0..7 (low 2 bits, high bit 4n + j); 4 taken back by bsums
      const __m256i q = _mm256_or_si256(bits_at(bits, 2 * j, 3), _mm256_slli_epi16(bits_at(hbits, 4 * n + j, 1), 2));
      acc = _mm256_add_epi32(acc, scaled16(q, qx, sc, n, j));
    }
  }
  return Dot{hsum_i32(acc) - 4 * scaled_sums(sc.all, bs), 0};
}

inline __m256i k4_scales_mins(const uint8_t* s) {  // get_scale_min_k4 four bytes at a time: 8 scales, 8 mins
  uint32_t a[3];
  std::memcpy(a, s, 12);
  const uint32_t m6 = 0x3F3F3F3F, m4 = 0x0F0F0F0F, m2 = 0x03030303;
  const __m128i b = _mm_set_epi32(static_cast<int>(((a[2] >> 4) & m4) | (((a[1] >> 6) & m2) << 4)), static_cast<int>(a[1] & m6),
                                  static_cast<int>((a[2] & m4) | (((a[0] >> 6) & m2) << 4)), static_cast<int>(a[0] & m6));
  return _mm256_cvtepu8_epi16(b);  // int16: scales 0..7 (low lane), mins 0..7 (high lane)
}

template <class F>
Dot k4_simd(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const __m256i sm = k4_scales_mins(blk + F::scales_at);
  const __m128i sc = _mm256_castsi256_si128(sm);
  const __m256i scales = _mm256_set_m128i(sc, sc);
  __m256i acc = _mm256_setzero_si256(), hbits = _mm256_setzero_si256();
  if constexpr (F::has_qh) hbits = load32(blk + F::qh_at);
  for (int c = 0; c < 4; ++c) {  // chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    const __m256i bits = load32(blk + F::qs_at + 32 * c);
    for (int h = 0; h < 2; ++h) {
      const int s = 2 * c + h;
      const char e = static_cast<char>(2 * s);  // int16 scale s in every lane
      const __m256i pick = _mm256_setr_epi8(e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1,
                                            e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1, e, e + 1);
      __m256i q = bits_at(bits, 4 * h, 0x0F);
      if constexpr (F::has_qh) q = _mm256_or_si256(q, _mm256_slli_epi16(bits_at(hbits, s, 1), 4));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(qx + 32 * s)),
                                                    _mm256_shuffle_epi8(scales, pick)));
    }
  }
  const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs));  // 16 bsums -> 8 of 32 values
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pairs);
  return Dot{hsum_i32(acc), hsum_i32_128(mins)};
}

Dot q6_k_simd(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  const Scales16 sc = scales16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + Q6_K::scales_at))));
  __m256i acc = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i ql[2] = {load32(blk + Q6_K::ql_at + 64 * h), load32(blk + Q6_K::ql_at + 64 * h + 32)};
    const __m256i qh = load32(blk + Q6_K::qh_at + 32 * h);
    for (int k = 0; k < 4; ++k) {  // quarter k: nibble k / 2 of ql[k % 2], bits 2k of qh; codes 0..63
      const __m256i q = _mm256_or_si256(bits_at(ql[k % 2], 4 * (k / 2), 0x0F), _mm256_slli_epi16(bits_at(qh, 2 * k, 3), 4));
      acc = _mm256_add_epi32(acc, scaled16(q, qx, sc, h, k));
    }
  }
  return Dot{hsum_i32(acc) - 32 * scaled_sums(sc.all, bs), 0};
}

Dot iq4_xs_simd(const uint8_t* blk, const int8_t* qx, const int16_t*) {
  const __m128i book = _mm_loadu_si128(reinterpret_cast<const __m128i*>(IQ4_XS::book)), m4 = _mm_set1_epi8(0x0F);
  __m256i acc = _mm256_setzero_si256();
  for (int ib = 0; ib < 8; ++ib) {  // sub-block ib: its 16 bytes' low nibbles, then high, through the book
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + IQ4_XS::qs_at + 16 * ib));
    const __m256i v = _mm256_set_m128i(_mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(b, 4), m4)),
                                       _mm_shuffle_epi8(book, _mm_and_si128(b, m4)));
    const __m256i x = load32(qx + 32 * ib);  // signed by signed: |v| times x with v's sign
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(static_cast<short>(iq4_xs_scale(blk, ib)))));
  }
  return Dot{hsum_i32(acc), 0};
}
#endif

#ifdef Q8K_ROW512
// ---- AVX-512BW, one row of x: 64 products a maddubs, each block's int32 sums scaled into float lanes ----
//
// The sums over a row's blocks stay in 16 float lanes (d dx times the block's 16 int32 sums; the mins
// and code offsets in 4 or 8 more) and meet once at the end: no horizontal sum a block. The integer
// sums of a block are the AVX2 loop's; the float sums run in another order (float32 rounding).
inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

inline __m512i scales_for(__m256i sc16, __m512i pick) {  // 32 int16 lanes: sc16[pick[i]]
  return _mm512_permutexvar_epi16(pick, _mm512_castsi256_si512(sc16));
}

inline __m512i runs_of_16(int first) {  // int16 index first + i / 8 in lane i: 16-weight sub-blocks, 4 a register
  const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                        15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_add_epi16(_mm512_srli_epi16(lane, 3), _mm512_set1_epi16(static_cast<short>(first)));
}

inline __m512i lanes_of(int a, int b) {  // int16 index a in lanes 0..15, b in 16..31
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(a)), _mm256_set1_epi16(static_cast<short>(b)), 1);
}

struct Row512 {
  __m512 acc = _mm512_setzero_ps();   // sum over blocks of d dx (int32 sums)
  __m256 less = _mm256_setzero_ps();  // sum over blocks of dmin dx (mins) or 32 d dx (Q6_K's offset sums)
  float total() const {
    const __m128 l = _mm_add_ps(_mm256_castps256_ps128(less), _mm256_extractf128_ps(less, 1));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(_mm_hadd_ps(_mm_hadd_ps(l, l), _mm_hadd_ps(l, l)));
  }
};

inline void k4_block512(const uint8_t* blk, const int8_t* qp, const int16_t* bs, float dx, Row512& r) {
  const __m256i sm = k4_scales_mins(blk + Q4_K::scales_at);  // scales 0..7, mins 0..7 (int16)
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i sum = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {  // qs bytes 64h .. 64h + 63: runs 4h, 4h + 2 (low nibbles), 4h + 1, 4h + 3 (high)
    const __m512i q = load64(blk + Q4_K::qs_at + 64 * h);
    const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(lo, load64(qp + 128 * h)),
                                                  scales_for(sm, lanes_of(4 * h, 4 * h + 2))));
    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(hi, load64(qp + 128 * h + 64)),
                                                  scales_for(sm, lanes_of(4 * h + 1, 4 * h + 3))));
  }
  const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs));  // 16 bsums -> 8 of 32 values
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pairs);  // 4 int32
  const float d = half_at(blk + Q4_K::d_at) * dx, dmin = half_at(blk + Q4_K::dmin_at) * dx;
  r.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d), r.acc);
  r.less = _mm256_fmadd_ps(_mm256_zextps128_ps256(_mm_cvtepi32_ps(mins)), _mm256_set1_ps(dmin), r.less);
}

inline void q6_k_block512(const uint8_t* blk, const int8_t* qx, const int16_t* bs, float dx, Row512& r) {
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + Q6_K::scales_at)));
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i up = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);    // k = 0, 1: bits 2k to 4..5
  const __m512i down = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);  // k = 2, 3
  __m512i sum = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {  // weights 128h + 32k + l: nibble k / 2 of ql[64h + 32(k % 2) + l], bits 2k of qh[32h + l]
    const __m512i q = load64(blk + Q6_K::ql_at + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + Q6_K::qh_at + 32 * h)));
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, up), m30));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(qh, down), m30));  // codes 0..63
    const __m512i sl = scales_for(sc16, runs_of_16(8 * h)), sh = scales_for(sc16, runs_of_16(8 * h + 4));
    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(lo, load64(qx + 128 * h)), sl));  // sub-blocks 8h + i / 8
    sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(hi, load64(qx + 128 * h + 64)), sh));
  }
  const __m256i offs = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)));  // 8 int32
  const float d = half_at(blk + Q6_K::d_at) * dx;
  r.acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d), r.acc);
  r.less = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offs), _mm256_set1_ps(static_cast<float>(Q6_K::code_offset) * d), r.less);
}

template <class F>
constexpr bool row512 = F::type == Q4_K::type || F::type == Q6_K::type;

void pair_runs(Act& a) {  // a.paired: each block's runs of 32 in the order 0 2 1 3 4 6 5 7
  a.paired.resize(a.q.size());
  for (size_t b = 0; b < a.q.size() / QK_K; ++b)
    for (int t = 0; t < 8; ++t) {
      const int run = (t / 4) * 4 + (t % 4 == 1 ? 2 : t % 4 == 2 ? 1 : t % 4);
      std::memcpy(a.paired.data() + b * QK_K + 32 * t, a.q.data() + b * QK_K + 32 * run, 32);
    }
}
#endif

// ---- one format's super-block dot, and the matmul over rows ----

#ifdef Q8K_SIMD
#define Q8K_PICK(name) name##_simd
#else
#define Q8K_PICK(name) name##_plain
#endif

template <class F>
Dot block_dot(const uint8_t* blk, const int8_t* qx, const int16_t* bs) {
  if constexpr (F::type == Q2_K::type) return Q8K_PICK(q2_k)(blk, qx, bs);
  else if constexpr (F::type == Q3_K::type) return Q8K_PICK(q3_k)(blk, qx, bs);
  else if constexpr (F::type == Q6_K::type) return Q8K_PICK(q6_k)(blk, qx, bs);
  else if constexpr (F::type == IQ4_XS::type) return Q8K_PICK(iq4_xs)(blk, qx, bs);
  else return Q8K_PICK(k4)<F>(blk, qx, bs);
}

template <class F>
float row_dot(const uint8_t* row, int64_t nb, const Act& a, int64_t r) {
  const int8_t* qx = a.q.data() + r * nb * QK_K;
  const float* dx = a.d.data() + r * nb;
  const int16_t* bs = a.bsums.data() + r * nb * SUMS;
#ifdef Q8K_ROW512
  if constexpr (row512<F>) {
    Row512 acc;
    for (int64_t b = 0; b < nb; ++b) {
      gatherlens::stream_ahead(row + b * F::bytes, F::bytes);
      if constexpr (F::type == Q4_K::type) k4_block512(row + b * F::bytes, a.paired.data() + (r * nb + b) * QK_K, bs + b * SUMS, dx[b], acc);
      else q6_k_block512(row + b * F::bytes, qx + b * QK_K, bs + b * SUMS, dx[b], acc);
    }
    return acc.total();
  }
#endif
  float acc = 0.f, mins = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    gatherlens::stream_ahead(blk, F::bytes);
    const Dot s = block_dot<F>(blk, qx + b * QK_K, bs + b * SUMS);
    acc += half_at(blk + F::d_at) * dx[b] * static_cast<float>(s.q);
    if constexpr (F::has_dmin) mins += half_at(blk + F::dmin_at) * dx[b] * static_cast<float>(s.m);
  }
  return acc - mins;
}

// ---- x of several rows: the blocked integer GEMM (the frame: q8_panels.h) ----
//
// A panel is PANEL weight rows' super-blocks decoded once per call (unpack): their 256 codes as
// unsigned integers (Q2_K 0..3, Q3_K 0..7, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63; the code offsets of
// Q3_K and Q6_K taken back as mins: mn = offset * sc, dmin = d) or IQ4_XS's signed book values,
// interleaved for 8 int32 lanes (64 steps of 4 codes); per sub-block s (F::group weights) each row's
// integer scale as an int16 pair (sc_s, sc_s); per pair t of x's 16-value sums the mins as an int16
// pair (16-weight sub-blocks: mn_2t, mn_2t+1; 32-weight: mn_t twice); d and dmin per row. A tile of
// up to TILE rows of x: within a sub-block the maddubs products summed in int16 over as many steps as
// their bound allows (steps_in_int16), times sc_s by one madd into int32; per super-block
//   acc += dx (d sum_s sc_s dot_s - dmin sum_t (mn_2t bsum_2t + mn_2t+1 bsum_2t+1)).
// The scalar twin reads the same panel (same integer sums).
using gatherlens_q8::PANEL;
using gatherlens_q8::STEP;
using gatherlens_q8::TILE;
constexpr int STEPS = QK_K / STEP;  // a super-block's steps
constexpr int PAIRS = SUMS / 2;     // pairs of x's 16-value sums a super-block
constexpr int64_t GEMM_ROWS = 2;    // x with at least this many rows takes the blocked loop (as q8act.cpp)
constexpr int64_t FEW_ROWS = 8;     // up to this many rows of x run row_dot, each weight row read once for all of
                                    // them (as q8act.cpp: a panel decode costs more than a few rows' products)

template <class F>
constexpr int subs = static_cast<int>(QK_K / F::group);  // sub-blocks: 16 of 16 weights, or 8 of 32

struct Unpacked {                   // one super-block of one row, as the blocked loop multiplies it
  int8_t q[QK_K] = {};              // codes (unsigned) or values (IQ4_XS)
  int16_t sc[SUMS] = {}, mn[SUMS] = {};  // per sub-block: scale, and the weight of its x sums
  float d = 0.f, dmin = 0.f;
};

void unpack(const uint8_t* blk, Unpacked& u, Q2_K) {
  const uint8_t *qs = blk + Q2_K::qs_at, *sc = blk + Q2_K::scales_at;
  for (int n = 0; n < 2; ++n)  // weight 128n + 32j + i: bits 2j of qs[32n + i]
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 32; ++i) u.q[128 * n + 32 * j + i] = static_cast<int8_t>((qs[32 * n + i] >> (2 * j)) & 3);
  for (int s = 0; s < 16; ++s) u.sc[s] = sc[s] & 0x0F, u.mn[s] = sc[s] >> 4;
  u.d = half_at(blk + Q2_K::d_at), u.dmin = half_at(blk + Q2_K::dmin_at);
}

void unpack(const uint8_t* blk, Unpacked& u, Q3_K) {
  const uint8_t *qs = blk + Q3_K::qs_at, *hm = blk + Q3_K::hmask_at;
  for (int n = 0; n < 2; ++n)  // as Q2_K, plus bit 4n + j of hmask[i] as bit 2: codes 0..7, less 4 below
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 32; ++i)
        u.q[128 * n + 32 * j + i] = static_cast<int8_t>(((qs[32 * n + i] >> (2 * j)) & 3) | (((hm[i] >> (4 * n + j)) & 1) << 2));
  q3_k_scales(blk + Q3_K::scales_at, u.sc);
  for (int s = 0; s < 16; ++s) u.mn[s] = static_cast<int16_t>(Q3_K::code_offset * u.sc[s]);
  u.d = u.dmin = half_at(blk + Q3_K::d_at);
}

template <class F>  // Q4_K, Q5_K: sub-block s = nibble s % 2 of qs[32 (s / 2) + l] (and bit s of qh[l])
void unpack_k4(const uint8_t* blk, Unpacked& u) {
  const uint8_t* qs = blk + F::qs_at;
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
      if constexpr (F::has_qh) q |= ((blk[F::qh_at + l] >> s) & 1) << 4;
      u.q[32 * s + l] = static_cast<int8_t>(q);
    }
    int sc, mn;
    k4_scale_min(blk + F::scales_at, s, sc, mn);
    u.sc[s] = static_cast<int16_t>(sc), u.mn[s] = static_cast<int16_t>(mn);
  }
  u.d = half_at(blk + F::d_at), u.dmin = half_at(blk + F::dmin_at);
}

void unpack(const uint8_t* blk, Unpacked& u, Q4_K) { unpack_k4<Q4_K>(blk, u); }
void unpack(const uint8_t* blk, Unpacked& u, Q5_K) { unpack_k4<Q5_K>(blk, u); }

void unpack(const uint8_t* blk, Unpacked& u, Q6_K) {
  const uint8_t *ql = blk + Q6_K::ql_at, *qh = blk + Q6_K::qh_at;
  for (int h = 0; h < 2; ++h)  // weight 128h + 32k + l: nibble k / 2 of ql[64h + 32(k % 2) + l], bits 2k of qh[32h + l]
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F, high = (qh[32 * h + l] >> (2 * k)) & 3;
        u.q[128 * h + 32 * k + l] = static_cast<int8_t>(low | (high << 4));  // 0..63, less 32 below
      }
  for (int s = 0; s < 16; ++s) {
    u.sc[s] = reinterpret_cast<const int8_t*>(blk + Q6_K::scales_at)[s];
    u.mn[s] = static_cast<int16_t>(Q6_K::code_offset * u.sc[s]);
  }
  u.d = u.dmin = half_at(blk + Q6_K::d_at);
}

void unpack(const uint8_t* blk, Unpacked& u, IQ4_XS) {
  const uint8_t* qs = blk + IQ4_XS::qs_at;
  for (int ib = 0; ib < 8; ++ib) {  // sub-block ib: its 16 bytes' low nibbles, then high, through the book
#ifdef Q8K_SIMD
    const __m128i book = _mm_loadu_si128(reinterpret_cast<const __m128i*>(IQ4_XS::book)), m4 = _mm_set1_epi8(0x0F);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * ib));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(u.q + 32 * ib), _mm_shuffle_epi8(book, _mm_and_si128(b, m4)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(u.q + 32 * ib + 16),
                     _mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
#else
    for (int j = 0; j < 16; ++j) {
      u.q[32 * ib + j] = IQ4_XS::book[qs[16 * ib + j] & 0x0F];
      u.q[32 * ib + 16 + j] = IQ4_XS::book[qs[16 * ib + j] >> 4];
    }
#endif
    u.sc[ib] = static_cast<int16_t>(iq4_xs_scale(blk, ib));
  }
  u.d = half_at(blk + IQ4_XS::d_at);
}

struct Panel {                        // PANEL weight rows, decoded
  std::vector<int8_t> q;              // (nb, STEPS, PANEL, STEP) codes
  std::vector<int16_t> sc, mn;        // (nb, SUMS, PANEL, 2) scale pairs; (nb, PAIRS, PANEL, 2) min pairs
  std::vector<float> d, dmin;         // (nb, PANEL)
};

template <class F>
void decode_panel(const uint8_t* w, int64_t ws, int64_t rows, int64_t nb, Panel& p) {
  Unpacked u[PANEL];
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < PANEL; ++j)
      if (j < rows) unpack(w + j * ws + b * F::bytes, u[j], F{});
      else u[j] = Unpacked{};
    for (int c = 0; c < QK_K / gatherlens_q8::CHUNK; ++c)  // 32 codes of the 8 rows at a time: 8 steps
#ifdef Q8K_SIMD
      gatherlens_q8::interleave32_avx2(u[0].q + c * gatherlens_q8::CHUNK, sizeof(Unpacked),
                                       p.q.data() + (b * STEPS + c * PANEL) * PANEL * STEP);
#else
      gatherlens_q8::interleave32_plain(u[0].q + c * gatherlens_q8::CHUNK, sizeof(Unpacked),
                                        p.q.data() + (b * STEPS + c * PANEL) * PANEL * STEP);
#endif
    for (int j = 0; j < PANEL; ++j) {
      for (int s = 0; s < SUMS; ++s) p.sc[((b * SUMS + s) * PANEL + j) * 2] = p.sc[((b * SUMS + s) * PANEL + j) * 2 + 1] = u[j].sc[s];
      for (int t = 0; t < PAIRS; ++t)  // the min weights of x's sums 2t and 2t + 1
        for (int h = 0; h < 2; ++h) p.mn[((b * PAIRS + t) * PANEL + j) * 2 + h] = u[j].mn[subs<F> == SUMS ? 2 * t + h : t];
      p.d[b * PANEL + j] = u[j].d, p.dmin[b * PANEL + j] = u[j].dmin;
    }
  }
}

using Rows = gatherlens_q8::TileRows<int16_t>;  // a tile's rows of x as Q8_K: codes, scales, 16-value sums

template <class F>  // a 16-value pair of x's sums against the weights' min pair, all 8 lanes: int32
constexpr bool has_mins = F::has_dmin || F::code_offset != 0;

#ifdef Q8K_SIMD
template <class F>  // steps of a sub-block whose int16 pair sums stay within int16: 2 * 127 * max code each
constexpr int steps_in_int16 = F::type == IQ4_XS::type ? 1
                               : std::min<int>(F::group / STEP, 32767 / (2 * 127 * ((1 << F::bits) - 1)));

template <class F, int R>  // sum[r]: lane j = sum_s sc_s sum_{i in s} code(j, i) qx(r, i) over super-block b
inline void panel_sums(const Panel& p, int64_t b, const Rows& x, __m256i* sum) {
  using gatherlens_q8::x_step;
  constexpr bool is_signed = F::type == IQ4_XS::type;
  constexpr int per_sub = static_cast<int>(F::group) / STEP, G = steps_in_int16<F>;
  const int8_t* w = p.q.data() + b * STEPS * PANEL * STEP;
  for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
  for (int s = 0; s < subs<F>; ++s) {
    const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.sc.data() + (b * SUMS + s) * PANEL * 2));
    for (int s0 = s * per_sub; s0 < (s + 1) * per_sub; s0 += G) {
      __m256i pairs[R];
      for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
      for (int t = s0; t < s0 + G; ++t) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * PANEL * STEP));
        const __m256i u = is_signed ? _mm256_sign_epi8(v, v) : v;  // u8 |v| (or the codes)
        for (int r = 0; r < R; ++r) {
          const __m256i xs = x_step(x.q[r] + b * QK_K + STEP * t);
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(u, is_signed ? _mm256_sign_epi8(xs, v) : xs));
        }
      }
      for (int r = 0; r < R; ++r) sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs[r], sc));
    }
  }
}

template <class F, int R>  // out (R, PANEL): the tile's outputs
void tile(const Panel& p, int64_t nb, const Rows& x, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i sum[R];
    panel_sums<F, R>(p, b, x, sum);
    const __m256 d = _mm256_loadu_ps(p.d.data() + b * PANEL), dmin = _mm256_loadu_ps(p.dmin.data() + b * PANEL);
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(x.d[r][b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(d, dx), acc[r]);
      if constexpr (has_mins<F>) {
        __m256i m = _mm256_setzero_si256();
        for (int t = 0; t < PAIRS; ++t)
          m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                         p.mn.data() + (b * PAIRS + t) * PANEL * 2)),
                                                     gatherlens_q8::x_step(reinterpret_cast<const int8_t*>(x.s[r] + b * SUMS + 2 * t))));
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * PANEL, acc[r]);
}
#else
template <class F, int R>  // the scalar twin: the same panel, the same integer sums
void tile(const Panel& p, int64_t nb, const Rows& x, float* out) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < PANEL; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const int8_t* w = p.q.data() + b * STEPS * PANEL * STEP;
        int32_t sum = 0, m = 0;
        for (int s = 0; s < subs<F>; ++s) {
          int32_t dot = 0;
          for (int i = s * static_cast<int>(F::group); i < (s + 1) * static_cast<int>(F::group); ++i)
            dot += gatherlens_q8::panel_code(w, j, i) * x.q[r][b * QK_K + i];
          sum += p.sc[((b * SUMS + s) * PANEL + j) * 2] * dot;
        }
        for (int t = 0; t < PAIRS; ++t)
          for (int h = 0; h < 2; ++h) m += p.mn[((b * PAIRS + t) * PANEL + j) * 2 + h] * x.s[r][b * SUMS + 2 * t + h];
        acc += static_cast<float>(sum) * (p.d[b * PANEL + j] * x.d[r][b]);
        acc -= static_cast<float>(m) * (p.dmin[b * PANEL + j] * x.d[r][b]);
      }
      out[r * PANEL + j] = acc;
    }
}
#endif

template <class F>  // out (M, N) = x W^T for M >= GEMM_ROWS
void blocked(const Act& a, const uint8_t* w, int64_t ws, int64_t M, int64_t N, int64_t K, float* out) {
  const int64_t nb = K / QK_K;
  gatherlens_q8::blocked_gemm(
      M, N, out,
      [&] {
        return Panel{std::vector<int8_t>(nb * QK_K * PANEL), std::vector<int16_t>(nb * SUMS * PANEL * 2),
                     std::vector<int16_t>(nb * PAIRS * PANEL * 2), std::vector<float>(nb * PANEL),
                     std::vector<float>(nb * PANEL)};
      },
      [&](int64_t n0, int64_t rows, Panel& p) { decode_panel<F>(w + n0 * ws, ws, rows, nb, p); },
      [&](int R, int64_t r0, const Panel& p, float* part) {
        const Rows x = gatherlens_q8::tile_rows(a.q.data(), a.d.data(), a.bsums.data(), r0, R, K, nb, nb * SUMS);
        gatherlens_q8::by_rows(R, [&]<int Rc>() { tile<F, Rc>(p, nb, x, part); });
      });
}

template <class F>
at::Tensor linear(const at::Tensor& x, const at::Tensor& raw) {
  static_assert(F::weights == QK_K, "one super-block per 256 weights, as x's blocks");
  const int64_t M = x.size(0), K = x.size(1), N = raw.size(0), nb = K / QK_K;
  TORCH_CHECK(K % QK_K == 0, "K must be a multiple of ", QK_K, " (the super-block), got ", K);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.stride(1) == 1 && raw.size(1) == nb * F::bytes,
              "raw must be (N, ", nb * F::bytes, ") uint8 blocks with contiguous rows");
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  Act a = quantize_rows(x.data_ptr<float>(), M, K);
  const uint8_t* w = raw.data_ptr<uint8_t>();
  const int64_t ws = raw.stride(0);
  float* out = y.data_ptr<float>();
  if (M > FEW_ROWS && M >= GEMM_ROWS) {
    blocked<F>(a, w, ws, M, N, K, out);
    return y;
  }
#ifdef Q8K_ROW512
  if constexpr (F::type == Q4_K::type) pair_runs(a);
#endif
  gatherlens::parallel_chunks(N, 32, [&](int64_t n0, int64_t n1) {  // 32 weight rows a task at least
    for (int64_t n = n0; n < n1; ++n)  // each weight row read once, for every row of x
      for (int64_t r = 0; r < M; ++r) out[r * N + n] = row_dot<F>(w + n * ws, nb, a, r);
  });
  return y;
}

at::Tensor q8k_linear_cpu(const at::Tensor& x, const at::Tensor& raw, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (M, K) float32 contiguous");
#define GATHERLENS_CASE(F) \
  case gatherlens_quant::F::type: return linear<gatherlens_quant::F>(x, raw);
  switch (qtype) {  // the formats whose records name this kernel (quant_formats.h)
    GATHERLENS_Q8K_LINEAR_FORMATS(GATHERLENS_CASE)
    default: break;
  }
#undef GATHERLENS_CASE
  TORCH_CHECK(false, "qtype must be ", gatherlens_quant::q8k_linear_formats, ", got ", qtype);
}

int64_t q8k_simd() {  // the loops this build runs: 0 the scalar twins, 1 AVX2, 2 AVX2 with Q4_K and Q6_K's
#if defined(Q8K_ROW512)  // one-row loop in AVX-512BW
  return 2;
#elif defined(Q8K_SIMD)
  return 1;
#else
  return 0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("q8k_linear(Tensor x, Tensor raw, int qtype) -> Tensor");
  m.def("q8k_simd() -> int", &q8k_simd);
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) { m.impl("q8k_linear", &q8k_linear_cpu); }
