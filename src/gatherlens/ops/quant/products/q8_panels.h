// The frame of the blocked integer GEMMs (x of several rows), shared by q8act.cpp (32-weight blocks)
// and q8k.cpp (256-weight super-blocks):
//
//   a panel    PANEL weight rows decoded once per call from their blocks into int8 codes, laid out for
//              8 int32 lanes: step s (4 codes) of panel row j in lane j, 32 bytes a step
//              (interleave32: 8 rows of 32 codes -> 8 steps), beside whatever scales the format has;
//   a tile     up to TILE rows of x meeting the panel in registers: x's 4 codes of a step broadcast to
//              every lane (x_step), one maddubs (or vpdpbusd) per row and step;
//   the loop   blocked_gemm: panels split over torch's threads (gatherlens::parallel_chunks), each
//              decoded once and met by every tile of x; each tile's outputs copied into y (M, N).
//
// The AVX2 helpers exist where the compiler targets AVX2; each kernel picks them or the plain twin.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gatherlens/common.h"

namespace gatherlens_q8 {

constexpr int PANEL = 8;  // weight rows a panel: one per int32 lane of a 256-bit register
constexpr int TILE = 4;   // rows of x a tile: TILE float and TILE int accumulators in registers
constexpr int STEP = 4;   // codes a lane takes per step (one int32 of x broadcast)
constexpr int CHUNK = 32; // codes of a row interleaved at a time: PANEL steps

// 8 rows of 32 codes (row j at codes + j * stride) -> dst (8 steps, PANEL rows, 4 codes)
inline int64_t panel_at(int j, int i) { return (i / STEP) * PANEL * STEP + j * STEP + i % STEP; }  // code i of row j

inline int panel_code(const int8_t* steps, int j, int i) { return steps[panel_at(j, i)]; }

inline void interleave32_plain(const int8_t* codes, int64_t stride, int8_t* dst) {
  for (int j = 0; j < PANEL; ++j)
    for (int i = 0; i < CHUNK; ++i) dst[panel_at(j, i)] = codes[j * stride + i];
}

#ifdef __AVX2__
inline void transpose8(__m256i* v) {  // 8 x 8 int32: lane s of v[j] -> lane j of v[s]
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h) {
      u[4 * i + 2 * h] = _mm256_unpacklo_epi64(t[4 * i + h], t[4 * i + h + 2]);
      u[4 * i + 2 * h + 1] = _mm256_unpackhi_epi64(t[4 * i + h], t[4 * i + h + 2]);
    }
  for (int s = 0; s < 4; ++s) {  // u[s]: rows 0..3 of lanes s, s + 4; u[4 + s]: rows 4..7
    v[s] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x20);
    v[s + 4] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x31);
  }
}

inline void interleave32_avx2(__m256i* rows, int8_t* dst) {  // rows[j]: row j's 32 codes (overwritten)
  static_assert(CHUNK / STEP == PANEL, "an 8 x 8 transpose of int32");
  transpose8(rows);
  for (int s = 0; s < PANEL; ++s) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + s * PANEL * STEP), rows[s]);
}

inline void interleave32_avx2(const int8_t* codes, int64_t stride, int8_t* dst) {
  __m256i v[PANEL];
  for (int j = 0; j < PANEL; ++j) v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * stride));
  interleave32_avx2(v, dst);
}

inline __m256i x_step(const int8_t* qx) {  // x's 4 codes of a step in every int32 lane
  int32_t v;
  std::memcpy(&v, qx, 4);
  return _mm256_set1_epi32(v);
}
#endif

template <class Sum>  // rows r0 .. r0 + R of quantized x, as a tile reads them
struct TileRows {
  const int8_t* q[TILE];  // codes: K a row
  const float* d[TILE];   // scales: one per block of x
  const Sum* s[TILE];     // sums: `sums` a row (q8act: dx sum(qx) per block; q8k: bsums per 16 values)
};

template <class Sum>
inline TileRows<Sum> tile_rows(const int8_t* q, const float* d, const Sum* s, int64_t r0, int R, int64_t K,
                               int64_t blocks, int64_t sums) {
  TileRows<Sum> x{};
  for (int r = 0; r < R; ++r) {
    x.q[r] = q + (r0 + r) * K;
    x.d[r] = d + (r0 + r) * blocks;
    x.s[r] = s + (r0 + r) * sums;
  }
  return x;
}

// y (M, N) = x W^T over panels: make() -> a thread's panel scratch; decode(n0, rows, panel) fills it
// from weight rows n0 .. n0 + rows (rows <= PANEL; the rest zero); run(R, r0, panel, part) writes
// part (R, PANEL) for rows r0 .. r0 + R of x (R <= TILE). Every panel meets all of x (passes of x
// sized to stay in L2 measured no faster at SmolLM2's M <= 1024, K <= 1536: x is at most 1.5 MB).
template <class Make, class Decode, class Run>
void blocked_gemm(int64_t M, int64_t N, float* out, const Make& make, const Decode& decode, const Run& run) {
  gatherlens::parallel_chunks(gatherlens::ceil_div(N, PANEL), 1, [&](int64_t p0, int64_t p1) {
    auto panel = make();
    float part[TILE * PANEL];
    for (int64_t pi = p0; pi < p1; ++pi) {
      const int64_t n0 = pi * PANEL, rows = std::min<int64_t>(PANEL, N - n0);
      decode(n0, rows, panel);
      for (int64_t r0 = 0; r0 < M; r0 += TILE) {
        const int R = static_cast<int>(std::min<int64_t>(TILE, M - r0));
        run(R, r0, panel, part);
        for (int r = 0; r < R; ++r) std::memcpy(out + (r0 + r) * N + n0, part + r * PANEL, rows * sizeof(float));
      }
    }
  });
}

template <class Tile>  // tile.template operator()<R>() for R = 1 .. TILE, picked at run time
inline void by_rows(int R, const Tile& tile) {
  static_assert(TILE == 4, "by_rows dispatches 1 .. 4 rows");
  switch (R) {
    case 4: return tile.template operator()<4>();
    case 3: return tile.template operator()<3>();
    case 2: return tile.template operator()<2>();
    default: return tile.template operator()<1>();
  }
}

}  // namespace gatherlens_q8
