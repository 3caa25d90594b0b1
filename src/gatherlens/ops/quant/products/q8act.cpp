// y = x W^T with W as its 32-weight GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and x quantized
// to 8 bits per 32 values, the dot products in integers: llama.cpp's CPU matmul (ggml_vec_dot_q4_1_q8_1,
// ggml_vec_dot_q5_0_q8_0, ggml_vec_dot_iq4_nl_q8_0 and friends).
//
//   torch.ops.gatherlens.q8act_linear(x, raw, qtype) -> y        x (M, K) float32, raw (N, row_bytes) uint8
//
// The weight is read as stored (no repacking, no float copy). Each 32-value block of a row of x
// becomes dx = max|x| / 127, qx = round(x / dx) in -127..127, and sx = dx * sum(qx) (llama.cpp's Q8_1;
// a block holding NaN or inf gets dx = NaN, so the outputs it reaches are NaN, never finite numbers).
// A weight block with scale d meets x's block in one of two ways:
//   unsigned codes q (Q4_0, Q4_1, Q5_1):  d * dx * sum_i q_i qx_i  +  m * sx
//        (m: the block's min; Q4_0 is Q4_1 with m = -8 d), 32 products as one AVX2 multiply-add of
//        unsigned codes by signed bytes (maddubs), summed in int32;
//   signed values v (Q8_0: the int8 codes; Q5_0: q - 16; IQ4_NL: book[q], the codebook of 16 int8
//        looked up with one byte shuffle):  d * dx * sum_i v_i qx_i, |v| times x with v's sign.
// Q5's fifth bit of weight j is bit j of the little-endian uint32 qh. qtype: ggml's type number of a
// format above; each format's type number, block bytes, field offsets, code offset and codebook come
// from quant_formats.h (generated from ops/quant/formats/layout.py's records). The error is x's 8-bit rounding
// (up to dx / 2 per value), as in llama.cpp; ops/quant/products/q8act_naive.py computes the same sums in float64.
// One row of x (decode) runs row_dot per weight row, weight rows split over torch's threads; x of
// GEMM_ROWS rows or more runs the blocked integer GEMM below ("x of several rows": each weight block
// decoded once per call into a panel of 8 weight rows, met by tiles of 4 rows of x in registers; with
// AVX512-VNNI or AVX-VNNI its sums go straight into int32). Every AVX2 path has its scalar twin (same
// integer sums; GATHERLENS_Q8ACT_PLAIN builds the twins on an AVX2 machine too, and
// GATHERLENS_Q8ACT_VNNI_EMULATED the VNNI loop with vpdpbusd emulated, for the tests);
// `gatherlens::q8act_simd()` says which blocked loop a build runs. Built by gatherlens/ops/native.py;
// fake kernel in q8act.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && !defined(GATHERLENS_Q8ACT_PLAIN)  // GATHERLENS_Q8ACT_PLAIN: the scalar twins on AVX2
#define Q8ACT_SIMD 1
#endif
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__) || defined(GATHERLENS_Q8ACT_VNNI_EMULATED)
#ifdef Q8ACT_SIMD
#define Q8ACT_VNNI 1  // the blocked loop sums 4 products of u8 by s8 straight into int32 (vpdpbusd)
#endif
#endif

#include "gatherlens/common.h"
#include "q8_panels.h"
#include "../formats/quant_formats.h"

namespace {

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
  gatherlens::parallel_chunks(M * nb, 256, [&](int64_t b0, int64_t b1) {  // 256 blocks a task at least
    for (int64_t b = b0; b < b1; ++b) {  // block b of all M * nb: row b / nb
      int8_t* q = a.q.data() + b * QK;
      const float d = gatherlens::round_block(x + b * QK, QK, q);  // the one rounding rule
      int sum = 0;
      for (int64_t i = 0; i < QK; ++i) sum += q[i];
      a.d[b] = d;
      a.s[b] = d * static_cast<float>(sum);
    }
  });
  return a;
}

// ---- what a format's block is: its codes, and how they meet x ----

template <class F, class = void>
struct has_book : std::false_type {};  // IQ4: a codebook book[16] of int8 values in the struct
template <class F>
struct has_book<F, std::void_t<decltype(F::book)>> : std::true_type {};

template <class F>  // Q8_0, Q5_0 (q - 16), IQ4_NL (book[q]): signed values, no min term
constexpr bool signed_values = F::bits == 8 || has_book<F>::value || (F::bits == 5 && !F::has_m);

inline uint32_t high_word(const uint8_t* qh) {  // Q5's qh: bit j is bit 4 of weight j
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return h;
}

template <class F>  // Q8_0, IQ4_NL: signed values; the others (Q5_0 too) unsigned codes 0..31 beside a min
constexpr bool signed_codes = F::bits == 8 || has_book<F>::value;

template <class F>
inline int stored_code(const uint8_t* blk, int i) {  // weight i as stored: int8, book[q], or q (no offset)
  if constexpr (F::bits == 8) {
    return reinterpret_cast<const int8_t*>(blk + F::qs_at)[i];
  } else {
    const uint8_t* qs = blk + F::qs_at;
    int q = i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);  // byte j: weight j (low nibble), j + 16 (high)
    if constexpr (F::bits == 5) q |= static_cast<int>((high_word(blk + F::qh_at) >> i) & 1u) << 4;
    if constexpr (has_book<F>::value) return F::book[q];
    else return q;
  }
}

template <class F>
inline int code(const uint8_t* blk, int i) {  // weight i's integer: an unsigned code or a signed value
  if constexpr (signed_values<F> && !signed_codes<F>) return stored_code<F>(blk, i) - static_cast<int>(F::code_offset);
  else return stored_code<F>(blk, i);
}

template <class F>
inline int dot_block(const uint8_t* blk, const int8_t* qx) {  // scalar: sum_i code_i qx_i
  int s = 0;
  for (int i = 0; i < QK; ++i) s += code<F>(blk, i) * qx[i];
  return s;
}

inline int dot_codes(const uint8_t* qs, const int8_t* qx) {  // scalar, 4-bit codes (Q4_0, Q4_1 as before)
  int s = 0;
  for (int i = 0; i < 16; ++i) s += (qs[i] & 0x0F) * qx[i] + (qs[i] >> 4) * qx[i + 16];
  return s;
}

template <class F>
inline int dot_scalar(const uint8_t* blk, const int8_t* qx) {
  if constexpr (F::bits == 4 && !has_book<F>::value) return dot_codes(blk + F::qs_at, qx);
  else return dot_block<F>(blk, qx);
}

#ifdef Q8ACT_SIMD
inline __m256i nibbles(const uint8_t* qs) {    // 16 bytes -> 32 codes: low nibbles (0..15), then high
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

inline __m256i bit_bytes(uint32_t bits) {   // byte i = 0xFF where bit i is set, else 0 (llama.cpp's
  const __m256i spread = _mm256_shuffle_epi8(  // bytes_from_bits_32)
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

inline __m256i looked_up(const int8_t* book, const uint8_t* qs) {  // IQ4: book[code] for the 32 codes
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(book));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(b, 4), m)),
                          _mm_shuffle_epi8(values, _mm_and_si128(b, m)));
}

inline __m256 dot_u8(__m256i w, const int8_t* qx) {  // w unsigned codes, 8 int32 partial sums as float
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(p);
}

inline __m256 dot_s8(__m256i w, const int8_t* qx) {  // both signed: |w| times x with w's sign
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                                      _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(p);
}

template <class F>
inline __m256i codes_avx2(const uint8_t* blk) {  // the 32 codes (unsigned) or values (signed) of a block
  if constexpr (F::bits == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + F::qs_at));
  else if constexpr (has_book<F>::value) return looked_up(F::book, blk + F::qs_at);
  else if constexpr (F::bits == 5) {
    const __m256i high = bit_bytes(high_word(blk + F::qh_at));  // 0xFF where weight i has bit 4
    if constexpr (signed_values<F>)  // q - 16: the nibble where bit 4 is set, else nibble - 16 (0xF0 | n)
      return _mm256_or_si256(nibbles(blk + F::qs_at), _mm256_andnot_si256(high, _mm256_set1_epi8(char(0xF0))));
    else return _mm256_or_si256(nibbles(blk + F::qs_at), _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
  } else return nibbles(blk + F::qs_at);
}

template <class F>
inline __m256 dot_avx2(const uint8_t* blk, const int8_t* qx) {
  if constexpr (signed_values<F>) return dot_s8(codes_avx2<F>(blk), qx);
  else return dot_u8(codes_avx2<F>(blk), qx);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

template <class F>
inline float block_min(const uint8_t* blk, float d) {  // m, or -code_offset * d (Q4_0: m = -8 d)
  if constexpr (F::has_m) return half_to_float(blk + F::m_at);
  else return -static_cast<float>(F::code_offset) * d;
}

template <class F>  // one output: sum over the row's blocks of d dx dot (+ m sx for unsigned codes)
float row_dot(const uint8_t* row, int64_t nb, const Act& a, int64_t r, int64_t K) {
  const int8_t* qx = a.q.data() + r * K;
  const float* dx = a.d.data() + r * nb;
  const float* sx = a.s.data() + r * nb;
  float mins = 0.f;
#ifdef Q8ACT_SIMD
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // two chains: the FMA's latency overlaps
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    gatherlens::stream_ahead(blk, F::bytes);
    const float d = half_to_float(blk + F::d_at);
    acc[b & 1] = _mm256_fmadd_ps(dot_avx2<F>(blk, qx + b * QK), _mm256_set1_ps(d * dx[b]), acc[b & 1]);
    if constexpr (!signed_values<F>) mins += block_min<F>(blk, d) * sx[b];
  }
  const float dots = hsum(_mm256_add_ps(acc[0], acc[1]));
#else
  float dots = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * F::bytes;
    const float d = half_to_float(blk + F::d_at);
    dots += d * dx[b] * static_cast<float>(dot_scalar<F>(blk, qx + b * QK));
    if constexpr (!signed_values<F>) mins += block_min<F>(blk, d) * sx[b];
  }
#endif
  if constexpr (signed_values<F>) return dots;
  else return dots + mins;
}

// ---- x of several rows: the blocked integer GEMM (the frame: q8_panels.h) ----
//
// A panel is PANEL weight rows decoded once per call from their blocks into int8 codes as stored
// (unsigned codes 0..31 with the block's min m, Q4_0 / Q5_0 too, m = -code_offset d; or the signed
// values of Q8_0 and IQ4_NL, m = 0), interleaved for 8 int32 lanes (8 steps of 4 codes a block),
// beside each block's PANEL scales and mins. A tile of up to TILE rows of x meets it in registers:
// x's 4 codes of a step broadcast to every lane, one maddubs gives 4 products per lane as two int16
// (u8 codes by s8 x; signed values: |v| by x with v's sign), summed in int16 over as many steps as
// their bound allows (steps_in_int16), then in int32, then per block in float: acc += d dx sum + m sx.
// With VNNI each step goes straight into int32 (vpdpbusd: the same sums). The scalar twin reads the
// same panel (same integer sums).
using gatherlens_q8::PANEL;
using gatherlens_q8::STEP;
using gatherlens_q8::TILE;
constexpr int STEPS = QK / STEP;  // a block's steps
constexpr int64_t GEMM_ROWS = 2;  // x of 2 rows blocked costs 1.1-1.3x one row's time (a 49152-row head:
                                  // 2x), row by row 2x: measured, AVX2
constexpr int64_t FEW_ROWS = 8;   // up to this many rows of x (a server's slots decoding together) meet each weight
                                  // row as the one-row path does, every x row while the weight row is in cache:
                                  // no panel decode (which costs ~0.3-0.6 ms a call on a 576-wide weight, more
                                  // than the product itself at a few rows)

struct Panel {                    // PANEL weight rows, decoded
  std::vector<int8_t> q;          // (nb, STEPS, PANEL, STEP) codes
  std::vector<float> d, m;        // (nb, PANEL) scales and mins (0 where signed, or past the weight's rows)
};

template <class F>  // block b of PANEL weight rows (`rows` of them real, the rest zero) -> (STEPS, PANEL, STEP)
inline void interleave_codes(const uint8_t* blk0, int64_t ws, int64_t rows, int8_t* dst) {
#ifdef Q8ACT_SIMD
  __m256i v[PANEL];
  for (int j = 0; j < PANEL; ++j) {
    v[j] = j < rows ? codes_avx2<F>(blk0 + j * ws) : _mm256_setzero_si256();
    if constexpr (F::bits == 5 && !F::has_m)  // Q5_0: codes_avx2 gives q - 16; the code as stored is q
      v[j] = _mm256_add_epi8(v[j], _mm256_set1_epi8(static_cast<char>(F::code_offset)));
  }
  gatherlens_q8::interleave32_avx2(v, dst);
#else
  int8_t codes[PANEL * QK] = {};
  for (int64_t j = 0; j < rows; ++j)
    for (int i = 0; i < QK; ++i) codes[j * QK + i] = static_cast<int8_t>(stored_code<F>(blk0 + j * ws, i));
  gatherlens_q8::interleave32_plain(codes, QK, dst);
#endif
}

template <class F>
void decode_panel(const uint8_t* w, int64_t ws, int64_t rows, int64_t nb, Panel& p) {
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < PANEL; ++j) {
      float d = 0.f, m = 0.f;
      if (j < rows) {
        const uint8_t* blk = w + j * ws + b * F::bytes;
        d = half_to_float(blk + F::d_at);
        if constexpr (!signed_codes<F>) m = block_min<F>(blk, d);
      }
      p.d[b * PANEL + j] = d;
      p.m[b * PANEL + j] = m;
    }
    interleave_codes<F>(w + b * F::bytes, ws, rows, p.q.data() + b * STEPS * PANEL * STEP);
  }
}

using Rows = gatherlens_q8::TileRows<float>;  // a tile's rows of x: codes, scales, dx sum(qx) per block

#ifdef Q8ACT_SIMD
#ifdef Q8ACT_VNNI
inline __m256i vnni_dot(__m256i acc, __m256i u, __m256i s) {  // acc + 4 products u8 u by s8 s a lane, exact
#if defined(GATHERLENS_Q8ACT_VNNI_EMULATED)  // tests: the VNNI loop on a CPU without it, in int16 x int16
  const __m256i lo = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(u)),
                                       _mm256_cvtepi8_epi16(_mm256_castsi256_si128(s)));  // bytes 0..15, by pairs
  const __m256i hi = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1)),
                                       _mm256_cvtepi8_epi16(_mm256_extracti128_si256(s, 1)));  // 16..31
  const __m256i quads = _mm256_hadd_epi32(lo, hi);  // lanes: quads 0 1 4 5 | 2 3 6 7
  return _mm256_add_epi32(acc, _mm256_permute4x64_epi64(quads, 0xD8));  // quads 0 .. 7 in order
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#endif

template <class F>  // steps whose int16 pair sums stay within int16: 2 * 127 * max code per step
constexpr int steps_in_int16 = signed_codes<F> ? 1 : (F::bits == 4 ? STEPS : STEPS / 2);

template <class F, int R>  // sum[r]: lane j = sum_i code(j, i) qx(r, i) over block b
inline void block_sums(const int8_t* w, const Rows& x, int64_t b, __m256i* sum) {
  using gatherlens_q8::x_step;
  for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
#ifdef Q8ACT_VNNI
  for (int s = 0; s < STEPS; ++s) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + s * PANEL * STEP));
    const __m256i u = signed_codes<F> ? _mm256_sign_epi8(v, v) : v;  // u8 |v| (or the codes)
    for (int r = 0; r < R; ++r) {
      const __m256i xs = x_step(x.q[r] + b * QK + STEP * s);
      sum[r] = vnni_dot(sum[r], u, signed_codes<F> ? _mm256_sign_epi8(xs, v) : xs);
    }
  }
#else
  constexpr int G = steps_in_int16<F>;
  for (int s0 = 0; s0 < STEPS; s0 += G) {
    __m256i pairs[R];
    for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
    for (int s = s0; s < s0 + G; ++s) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + s * PANEL * STEP));
      const __m256i u = signed_codes<F> ? _mm256_sign_epi8(v, v) : v;
      for (int r = 0; r < R; ++r) {
        const __m256i xs = x_step(x.q[r] + b * QK + STEP * s);
        pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(u, signed_codes<F> ? _mm256_sign_epi8(xs, v) : xs));
      }
    }
    for (int r = 0; r < R; ++r) sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1)));
  }
#endif
}

template <class F, int R>  // out (R, PANEL): the tile's outputs
void tile(const Panel& p, int64_t nb, const Rows& x, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i sum[R];
    block_sums<F, R>(p.q.data() + b * STEPS * PANEL * STEP, x, b, sum);
    const __m256 d = _mm256_loadu_ps(p.d.data() + b * PANEL);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(d, _mm256_set1_ps(x.d[r][b])), acc[r]);
      if constexpr (!signed_codes<F>)
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(p.m.data() + b * PANEL), _mm256_set1_ps(x.s[r][b]), acc[r]);
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
        int sum = 0;
        for (int i = 0; i < QK; ++i) sum += gatherlens_q8::panel_code(w, j, i) * x.q[r][b * QK + i];
        acc += static_cast<float>(sum) * (p.d[b * PANEL + j] * x.d[r][b]);
        if constexpr (!signed_codes<F>) acc += p.m[b * PANEL + j] * x.s[r][b];
      }
      out[r * PANEL + j] = acc;
    }
}
#endif

template <class F>  // out (M, N) = x W^T for M >= GEMM_ROWS
void blocked(const Act& a, const uint8_t* w, int64_t ws, int64_t M, int64_t N, int64_t K, float* out) {
  const int64_t nb = K / QK;
  gatherlens_q8::blocked_gemm(
      M, N, out,
      [&] { return Panel{std::vector<int8_t>(nb * QK * PANEL), std::vector<float>(nb * PANEL), std::vector<float>(nb * PANEL)}; },
      [&](int64_t n0, int64_t rows, Panel& p) { decode_panel<F>(w + n0 * ws, ws, rows, nb, p); },
      [&](int R, int64_t r0, const Panel& p, float* part) {
        const Rows x = gatherlens_q8::tile_rows(a.q.data(), a.d.data(), a.s.data(), r0, R, K, nb, nb);
        gatherlens_q8::by_rows(R, [&]<int Rc>() { tile<F, Rc>(p, nb, x, part); });
      });
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
  if (M > FEW_ROWS && M >= GEMM_ROWS) {
    blocked<F>(a, w, ws, M, N, K, out);
    return y;
  }
  gatherlens::parallel_chunks(N, 64, [&](int64_t n0, int64_t n1) {  // 64 weight rows a task at least
    for (int64_t n = n0; n < n1; ++n)  // each weight row read once, for every row of x
      for (int64_t r = 0; r < M; ++r) out[r * N + n] = row_dot<F>(w + n * ws, nb, a, r, K);
  });
  return y;
}

// ---- weights repacked in panels of 8 rows (q8x8_linear): the same blocks, the rows interleaved ----
//
// A panel block is block b of 8 consecutive weight rows (PANEL * F::bytes bytes, as raw holds them):
// their 8 fp16 scales d, then (formats with a min) their 8 fp16 mins m, then (5-bit codes) their 8
// 4-byte words of fifth bits, then the codes laid out for 8 int32 lanes, lane j for row j: 4- and 5-bit
// codes (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) in 4 chunks of 32 bytes, chunk c holding bytes 4c .. 4c+3 of
// each row's 16 (low nibbles: weights 4c .. 4c+3, high: 16+4c .. 16+4c+3; a 5-bit code's fifth bit is
// bit 4c+i, or 16+4c+i, of its row's word, spread to the chunk's bytes in registers: fifth_bits);
// Q8_0's int8 values in 8 steps of 32 bytes (step s: weights 4s .. 4s+3 of each row). ops/quant/products/x8.py
// packs raw into it (`pack_x8`: a byte shuffle, N a multiple of 8). One row of x meets a panel in
// registers: x's 4 codes of a step broadcast to every lane, one maddubs gives 4 products a lane, and
// the block's 8 sums scale by 8 d at once: about a third of row_dot's instructions a weight block.
// The sums are row_dot's (the same integers; the float sums over blocks run in another order).
template <class F>
constexpr int64_t X8_SCALES = (F::has_m ? 2 : 1) * PANEL * 2;  // bytes of the panel block's fp16 d (and m)
template <class F>
constexpr int64_t X8_CODES = X8_SCALES<F> + (F::bits == 5 ? 4 * PANEL : 0);  // where its codes start

inline uint32_t panel_word(const uint8_t* qh, int j) {  // row j's fifth bits in a panel block
  return high_word(qh + 4 * j);
}

#ifdef Q8ACT_SIMD
template <int half>  // 0x10 in byte 4j+i of chunk c's low (half 0) or high (half 1) nibbles where bit 16 half + 4c + i
inline __m256i fifth_bits(__m256i words, int c) {  // of row j's word (lane j of words) is set
#if defined(__AVX512BITALG__) && defined(__AVX512VL__)  // one bit shuffle: byte b picks bit 32 ((b / 4) % 2) +
  const __m256i row = _mm256_setr_epi8(0, 1, 2, 3, 32, 33, 34, 35, 0, 1, 2, 3, 32, 33, 34, 35,  // 16 half + 4c + b % 4
                                       0, 1, 2, 3, 32, 33, 34, 35, 0, 1, 2, 3, 32, 33, 34, 35);  // of its qword
  const __m256i pick = _mm256_add_epi8(row, _mm256_set1_epi8(static_cast<char>(16 * half + 4 * c)));
  return _mm256_maskz_mov_epi8(_mm256_bitshuffle_epi64_mask(words, pick), _mm256_set1_epi8(0x10));
#else  // each lane's 4 bits to its 4 bytes, then one compare a bit
  const __m256i low = _mm256_srl_epi32(words, _mm_cvtsi32_si128(16 * half + 4 * c));
  const __m256i spread = _mm256_shuffle_epi8(low, _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                                    0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
  const __m256i bit = _mm256_set1_epi32(0x08040201);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
#endif
}

template <class F>  // chunk c of a panel block's unsigned codes: lo (steps c) and hi (steps c + 4), fifth bits or'd in
inline void unsigned_chunk(const uint8_t* codes, __m256i words, int c, __m256i& lo, __m256i& hi) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c * PANEL * STEP));
  lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
  hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
  if constexpr (F::bits == 5) {
    lo = _mm256_or_si256(lo, fifth_bits<0>(words, c));
    hi = _mm256_or_si256(hi, fifth_bits<1>(words, c));
  }
}
#endif

template <class F>  // the panel block's codes as the Panel of the blocked GEMM holds them (STEPS, PANEL, STEP)
inline void x8_codes(const uint8_t* blk, int8_t* dst) {
  const uint8_t* codes = blk + X8_CODES<F>;
  if constexpr (F::bits == 8) {
    std::memcpy(dst, codes, QK * PANEL);
  } else {
#ifdef Q8ACT_SIMD
    __m256i words = _mm256_setzero_si256();
    if constexpr (F::bits == 5) words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + X8_SCALES<F>));
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      unsigned_chunk<F>(codes, words, c, lo, hi);
      if constexpr (has_book<F>::value) {
        const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(F::book)));
        lo = _mm256_shuffle_epi8(book, lo), hi = _mm256_shuffle_epi8(book, hi);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c * PANEL * STEP), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c + 4) * PANEL * STEP), hi);
    }
#else
    for (int c = 0; c < 4; ++c)
      for (int k = 0; k < PANEL * STEP; ++k) {  // byte k: row k / 4, weights 4c + k % 4 and 16 + 4c + k % 4
        const uint8_t byte = codes[c * PANEL * STEP + k];
        int8_t lo = static_cast<int8_t>(byte & 0x0F), hi = static_cast<int8_t>(byte >> 4);
        if constexpr (has_book<F>::value) lo = F::book[lo], hi = F::book[hi];
        if constexpr (F::bits == 5) {
          const uint32_t h = panel_word(blk + X8_SCALES<F>, k / 4);
          lo = static_cast<int8_t>(lo | (((h >> (4 * c + k % 4)) & 1u) << 4));
          hi = static_cast<int8_t>(hi | (((h >> (16 + 4 * c + k % 4)) & 1u) << 4));
        }
        dst[c * PANEL * STEP + k] = lo;
        dst[(c + 4) * PANEL * STEP + k] = hi;
      }
#endif
  }
}

template <class F>  // panel blocks of `rows` real rows (the rest of the panel is zero) -> the blocked GEMM's Panel
void decode_x8(const uint8_t* pb, int64_t rows, int64_t nb, Panel& p) {
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = pb + b * PANEL * F::bytes;
    for (int64_t j = 0; j < PANEL; ++j) {
      const float d = j < rows ? half_to_float(blk + 2 * j) : 0.f;
      float m = 0.f;
      if constexpr (F::has_m) m = j < rows ? half_to_float(blk + 2 * PANEL + 2 * j) : 0.f;
      else if constexpr (!signed_codes<F>) m = -static_cast<float>(F::code_offset) * d;
      p.d[b * PANEL + j] = d;
      p.m[b * PANEL + j] = m;
    }
    x8_codes<F>(blk, p.q.data() + b * STEPS * PANEL * STEP);
  }
}

#ifdef Q8ACT_SIMD
template <class F>  // step s of a panel block's signed values (Q8_0's int8 codes, IQ4_NL's book values), 4 a lane
inline __m256i signed_step(const uint8_t* codes, int s) {
  if constexpr (F::bits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + s * PANEL * STEP));
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (s % 4) * PANEL * STEP));
    const __m256i q = _mm256_and_si256(s < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(F::book))), q);
  }
}

template <class F, int R>  // lane j of sums[r]: sum_i code(j, i) qx_i over one panel block (int32) for R rows of
                           // x (row r at qx + r * K): each step's codes unpacked once for all of them
inline void x8_sums_rows(const uint8_t* blk, const int8_t* qx, int64_t K, __m256i* sums) {
  using gatherlens_q8::x_step;
  const uint8_t* codes = blk + X8_CODES<F>;
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
#ifdef Q8ACT_VNNI  // a second chain of sums: vpdpbusd's latency, not its throughput, bounds one chain of 8 a block
  __m256i odd[R];
  for (int r = 0; r < R; ++r) odd[r] = _mm256_setzero_si256();
#endif
  if constexpr (signed_codes<F>) {
    for (int s = 0; s < STEPS; ++s) {
      const __m256i v = signed_step<F>(codes, s);
      const __m256i av = _mm256_sign_epi8(v, v);
      for (int r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(x_step(qx + r * K + STEP * s), v);
#ifdef Q8ACT_VNNI
        if (s % 2) odd[r] = vnni_dot(odd[r], av, xs);
        else sums[r] = vnni_dot(sums[r], av, xs);
#else
        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(_mm256_maddubs_epi16(av, xs), ones));
#endif
      }
    }
  } else {  // unsigned codes 0..15 (or 0..31): without VNNI their int16 pair sums flushed every G chunks
    constexpr int G = F::bits == 4 ? 4 : 2;  // 2 * 127 * max code per maddubs, 2 per chunk: within int16
    __m256i words = _mm256_setzero_si256();
    if constexpr (F::bits == 5) words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + X8_SCALES<F>));
    [[maybe_unused]] __m256i pairs[R];
    for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      unsigned_chunk<F>(codes, words, c, lo, hi);
      for (int r = 0; r < R; ++r) {
#ifdef Q8ACT_VNNI
        sums[r] = vnni_dot(sums[r], lo, x_step(qx + r * K + STEP * c));
        odd[r] = vnni_dot(odd[r], hi, x_step(qx + r * K + STEP * (c + 4)));
#else
        pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(lo, x_step(qx + r * K + STEP * c)));
        pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(hi, x_step(qx + r * K + STEP * (c + 4))));
#endif
      }
#ifndef Q8ACT_VNNI
      if ((c + 1) % G == 0)
        for (int r = 0; r < R; ++r) {
          sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs[r], ones));
          pairs[r] = _mm256_setzero_si256();
        }
#endif
    }
  }
#ifdef Q8ACT_VNNI
  for (int r = 0; r < R; ++r) sums[r] = _mm256_add_epi32(sums[r], odd[r]);
#endif
}

template <class F>  // lane j: sum_i code(j, i) qx_i over one panel block (int32), one row of x
inline __m256i x8_sums(const uint8_t* blk, const int8_t* qx) {
  __m256i sum;
  x8_sums_rows<F, 1>(blk, qx, 0, &sum);
  return sum;
}

template <class F>  // out[0:8] = the panel's 8 rows against x's row r
void x8_row(const uint8_t* pb, int64_t nb, const Act& a, int64_t r, int64_t K, float* out) {
  const int8_t* qx = a.q.data() + r * K;
  const float* dx = a.d.data() + r * nb;
  const float* sx = a.s.data() + r * nb;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, mins = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = pb + b * PANEL * F::bytes;
    gatherlens::stream_ahead(blk, PANEL * F::bytes);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m256i sum = x8_sums<F>(blk, qx + b * QK);
    acc[b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(dx[b])), acc[b & 1]);
    if constexpr (F::has_m)
      mins = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 * PANEL))),
                             _mm256_set1_ps(sx[b]), mins);
    else if constexpr (!signed_codes<F>)
      mins = _mm256_fmadd_ps(d, _mm256_set1_ps(-static_cast<float>(F::code_offset) * sx[b]), mins);
  }
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), mins));
}

template <class F, int R>  // x8_row for rows r0 .. r0 + R - 1 of x: the panel read once; each row's sums and
void x8_rows(const uint8_t* pb, int64_t nb, const Act& a, int64_t r0, int64_t K, float* out, int64_t N) {
  const int8_t* qx = a.q.data() + r0 * K;  // float steps as x8_row's, so each row's 8 outputs equal its
  __m256 acc[R][2], mins[R];               // (bit for bit: same integers, same order)
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = mins[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = pb + b * PANEL * F::bytes;
    gatherlens::stream_ahead(blk, PANEL * F::bytes);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    __m256i sums[R];
    x8_sums_rows<F, R>(blk, qx + b * QK, K, sums);
    for (int r = 0; r < R; ++r) {
      const float dx = a.d[(r0 + r) * nb + b], sx = a.s[(r0 + r) * nb + b];
      acc[r][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc[r][b & 1]);
      if constexpr (F::has_m)
        mins[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 * PANEL))),
                                  _mm256_set1_ps(sx), mins[r]);
      else if constexpr (!signed_codes<F>)
        mins[r] = _mm256_fmadd_ps(d, _mm256_set1_ps(-static_cast<float>(F::code_offset) * sx), mins[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    _mm256_storeu_ps(out + (r0 + r) * N, _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), mins[r]));
}
#else
template <class F>  // the scalar twin: the same panel, the same integer sums
void x8_row(const uint8_t* pb, int64_t nb, const Act& a, int64_t r, int64_t K, float* out) {
  Panel p{std::vector<int8_t>(nb * QK * PANEL), std::vector<float>(nb * PANEL), std::vector<float>(nb * PANEL)};
  decode_x8<F>(pb, PANEL, nb, p);
  const Rows x = gatherlens_q8::tile_rows(a.q.data(), a.d.data(), a.s.data(), r, 1, K, nb, nb);
  tile<F, 1>(p, nb, x, out);
}

template <class F, int R>  // the scalar twin: x8_row per row
void x8_rows(const uint8_t* pb, int64_t nb, const Act& a, int64_t r0, int64_t K, float* out, int64_t N) {
  for (int r = 0; r < R; ++r) x8_row<F>(pb, nb, a, r0 + r, K, out + (r0 + r) * N);
}
#endif

template <class F>
at::Tensor linear_x8(const at::Tensor& x, const at::Tensor& packed) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0), nb = K / QK;
  TORCH_CHECK(K % QK == 0 && N % PANEL == 0, "q8x8_linear: K must be a multiple of 32 and N of 8, got ", K, ", ", N);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(1) == nb * F::bytes, "q8x8_linear: packed must be (N, ", nb * F::bytes,
              ") uint8, contiguous (ops/quant/products/x8.py's pack_x8)");
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const Act a = quantize_rows(x.data_ptr<float>(), M, K);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const int64_t panel_bytes = PANEL * nb * F::bytes;  // one panel: nb blocks of 8 rows
  float* out = y.data_ptr<float>();
  if (M > FEW_ROWS && M >= GEMM_ROWS) {
    gatherlens_q8::blocked_gemm(
        M, N, out,
        [&] { return Panel{std::vector<int8_t>(nb * QK * PANEL), std::vector<float>(nb * PANEL), std::vector<float>(nb * PANEL)}; },
        [&](int64_t n0, int64_t rows, Panel& p) { decode_x8<F>(w + (n0 / PANEL) * panel_bytes, rows, nb, p); },
        [&](int R, int64_t r0, const Panel& p, float* part) {
          const Rows xr = gatherlens_q8::tile_rows(a.q.data(), a.d.data(), a.s.data(), r0, R, K, nb, nb);
          gatherlens_q8::by_rows(R, [&]<int Rc>() { tile<F, Rc>(p, nb, xr, part); });
        });
    return y;
  }
  gatherlens::parallel_chunks(N / PANEL, 4, [&](int64_t p0, int64_t p1) {  // 4 panels (32 rows) a task at least
    for (int64_t pi = p0; pi < p1; ++pi)  // each panel read once, for every row of x (FEW_ROWS at most)
      if (M == 1) {
        x8_row<F>(w + pi * panel_bytes, nb, a, 0, K, out + pi * PANEL);
      } else {
        for (int64_t r0 = 0; r0 < M; r0 += TILE)  // up to TILE rows share each step's unpacked codes
          gatherlens_q8::by_rows(static_cast<int>(std::min<int64_t>(TILE, M - r0)), [&]<int Rc>() {
            x8_rows<F, Rc>(w + pi * panel_bytes, nb, a, r0, K, out + pi * PANEL, N);
          });
      }
  });
  return y;
}

// One panel's units as runs: units whose sources are consecutive too, moved as one copy (a panel's fields
// move 2 or 4 bytes at a time). A panel is its blocks one after another, each the same layout of the 8 rows'
// block (x8.py's _panels), so the runs of its first block serve every block, shifted: the table stays in L1.
struct PackRun {
  int32_t to, from, bytes;
};

std::vector<PackRun> pack_runs(const int64_t* order, int64_t units) {
  std::vector<PackRun> runs;
  for (int64_t i = 0; i < units; ++i) {
    if (!runs.empty() && runs.back().from + runs.back().bytes == 2 * order[i] &&
        runs.back().to + runs.back().bytes == 2 * i) {
      runs.back().bytes += 2;  // its source follows the last run's: the same copy
    } else {
      runs.push_back({static_cast<int32_t>(2 * i), static_cast<int32_t>(2 * order[i]), 2});
    }
  }
  return runs;
}

// The first block's runs where every block b repeats them (destination + b * 8 * block_bytes, source + b *
// block_bytes), else none: the whole panel's runs serve.
std::vector<PackRun> block_runs(const int64_t* order, int64_t units, int64_t blocks) {
  if (blocks < 2 || units % blocks != 0) return {};
  const int64_t per = units / blocks, shift = per / PANEL;  // units a panel block, units a row's block
  for (int64_t b = 1; b < blocks; ++b)
    for (int64_t i = 0; i < per; ++i)
      if (order[b * per + i] != order[i] + b * shift) return {};
  return pack_runs(order, per);
}

// The most blocks a panel's order repeats over (dividing a row's bytes evenly), and their runs (1 block: the whole
// panel's): any count that repeats moves the same bytes, the most keeps the table smallest.
std::pair<int64_t, std::vector<PackRun>> panel_runs(const int64_t* order, int64_t units, int64_t row_bytes) {
  for (int64_t blocks = row_bytes / 2; blocks > 1; --blocks) {
    if (row_bytes % (2 * blocks) != 0) continue;
    std::vector<PackRun> runs = block_runs(order, units, blocks);
    if (!runs.empty()) return {blocks, std::move(runs)};
  }
  return {1, pack_runs(order, units)};
}

// The runs split by size: the 4- and 2-byte ones (nearly all) moved in loops of fixed-size copies, no branch.
struct SizedRuns {
  std::vector<std::pair<int32_t, int32_t>> four, two;  // (to, from)
  std::vector<PackRun> other;
};

SizedRuns sized(const std::vector<PackRun>& runs) {
  SizedRuns out;
  for (const PackRun& r : runs) {
    if (r.bytes == 4) out.four.emplace_back(r.to, r.from);
    else if (r.bytes == 2) out.two.emplace_back(r.to, r.from);
    else out.other.push_back(r);
  }
  return out;
}

inline void move_runs(const SizedRuns& runs, const uint8_t* __restrict s, uint8_t* __restrict d) {
  for (const auto& [to, from] : runs.four) std::memcpy(d + to, s + from, 4);
  for (const auto& [to, from] : runs.two) std::memcpy(d + to, s + from, 2);
  for (const PackRun& r : runs.other) std::memcpy(d + r.to, s + r.from, static_cast<size_t>(r.bytes));
}

// pack_x8's move (ops/quant/products/x8.py; its plain twin there: pack_x8_reference): unit i (2 bytes) of each
// panel of out = unit order[i] of the same panel of raw, order (4 * row_bytes,) int64 one panel's layout
// (x8.py's _panel_order: every panel field starts at an even byte), panels split over the threads.
void x8_pack_cpu(const at::Tensor& raw, const at::Tensor& order, const at::Tensor& out) {
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous() && raw.size(0) % PANEL == 0 &&
                  raw.size(1) % 2 == 0, "x8_pack: raw must be (N, row_bytes) uint8 contiguous, N a multiple of 8 and "
              "row_bytes even, got ", raw.sizes());
  TORCH_CHECK(out.sizes() == raw.sizes() && out.scalar_type() == at::kByte && out.is_contiguous(),
              "x8_pack: out must be uint8 contiguous of raw's shape ", raw.sizes(), ", got ", out.sizes());
  const int64_t units = PANEL * raw.size(1) / 2;
  TORCH_CHECK(order.dim() == 1 && order.scalar_type() == at::kLong && order.is_contiguous() && order.size(0) == units,
              "x8_pack: order must be (", units, ",) int64 contiguous, got ", order.sizes());
  const int64_t* o = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < units; ++i)
    TORCH_CHECK(o[i] >= 0 && o[i] < units, "x8_pack: order[", i, "] = ", o[i], " is outside 0..", units - 1);
  const auto [steps, found] = panel_runs(o, units, raw.size(1));
  const SizedRuns runs = sized(found);
  const int64_t row_step = raw.size(1) / steps;  // a block's bytes in a row
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t panel = 2 * units;  // bytes a panel
  gatherlens::parallel_chunks(raw.size(0) / PANEL, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t b = 0; b < steps; ++b)  // block b of the panel: source b * row_step on, destination 8x that
        move_runs(runs, src + p * panel + b * row_step, dst + p * panel + b * PANEL * row_step);
  });
}

at::Tensor q8x8_linear_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (M, K) float32 contiguous");
#define GATHERLENS_CASE(F) \
  case gatherlens_quant::F::type: return linear_x8<gatherlens_quant::F>(x, packed);
  switch (qtype) {  // the formats whose records have panels (quant_formats.h)
    GATHERLENS_Q8X8_LINEAR_FORMATS(GATHERLENS_CASE)
    default: break;
  }
#undef GATHERLENS_CASE
  TORCH_CHECK(false, "q8x8_linear: qtype must be ", gatherlens_quant::q8x8_linear_formats, ", got ", qtype);
}

at::Tensor q8act_linear_cpu(const at::Tensor& x, const at::Tensor& raw, int64_t qtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (M, K) float32 contiguous");
#define GATHERLENS_CASE(F) \
  case gatherlens_quant::F::type: return linear<gatherlens_quant::F>(x, raw);
  switch (qtype) {  // the formats whose records name this kernel (quant_formats.h)
    GATHERLENS_Q8ACT_LINEAR_FORMATS(GATHERLENS_CASE)
    default: break;
  }
#undef GATHERLENS_CASE
  TORCH_CHECK(false, "qtype must be ", gatherlens_quant::q8act_linear_formats, ", got ", qtype);
}

int64_t q8act_simd() {  // the blocked loop this build runs: 0 the scalar twin, 1 AVX2, 2 AVX2 with VNNI
#if defined(Q8ACT_VNNI)
  return 2;
#elif defined(Q8ACT_SIMD)
  return 1;
#else
  return 0;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("q8act_linear(Tensor x, Tensor raw, int qtype) -> Tensor");
  m.def("q8x8_linear(Tensor x, Tensor packed, int qtype) -> Tensor");
  m.def("x8_pack(Tensor raw, Tensor order, Tensor(a!) out) -> ()");
  m.def("q8act_simd() -> int", &q8act_simd);
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("q8act_linear", &q8act_linear_cpu);
  m.impl("q8x8_linear", &q8x8_linear_cpu);
  m.impl("x8_pack", &x8_pack_cpu);
}
