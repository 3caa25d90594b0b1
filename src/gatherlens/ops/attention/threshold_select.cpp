// Exact top-k of each row of logits, by the rule of threshold.py, for one block of rows.
//
//   select_rows_f32(s, rows, L, lens, k, base, vals, idx, w, lse)   s (rows, L) -> (rows, k) each
//
// Rule: a row keeps its k allowed (> -inf) keys of highest logit; a tie at the k-th value goes to
// the lower key index; a row with fewer than k allowed keys keeps them all; the other slots get
// index -1 and value -inf. Logits become integer keys in the same order (-0.0 first made +0.0, so
// that the two zeros tie as they compare), and per row:
//   1. a lower bound `lo` of the k-th largest key: a rank of every S-th key, set so that more than
//      k keys lie at or above it with high probability;
//   2. one pass keeps the keys >= lo with their index, in index order (AVX2: 8 at a time);
//   3. the k-th largest key `t` among those few candidates, by bisection on the key value (each
//      step counts the candidates >= the midpoint: a vectorized loop, no unpredictable branches);
//   4. in index order: every key above t, and the first (k - #above) keys equal to t.
// If `lo` was too high (fewer than k candidates), the row is redone with every allowed key.
// Optionally the softmax weights of the kept keys and the log-sum-exp, so that the caller's
// weighted sum of value rows (F.embedding_bag) is one more call.
// No Python objects: the caller runs row blocks on several threads (ctypes releases the GIL).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace {

inline int32_t order_key(float v) {            // float order -> int32 order
  v += 0.0f;                                   // -0.0 -> +0.0
  int32_t b;
  std::memcpy(&b, &v, 4);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

inline int64_t order_key(double v) {
  v += 0.0;
  int64_t b;
  std::memcpy(&b, &v, 8);
  return b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF);
}

template <typename K>
int64_t count_ge(const K* keys, int64_t n, K x) {
  K c = 0;                                     // a counter as wide as the keys: 8 lanes of int32
  for (int64_t i = 0; i < n; ++i) c += K(keys[i] >= x);  // vectorized by the compiler
  return int64_t(c);
}

template <typename K>
K kth_largest(const K* keys, int64_t n, int64_t rank) {  // 1 <= rank <= n
  K lo = keys[0], hi = keys[0];
  for (int64_t i = 1; i < n; ++i) { lo = keys[i] < lo ? keys[i] : lo; hi = keys[i] > hi ? keys[i] : hi; }
  while (lo < hi) {                            // invariant: count(>= lo) >= rank > count(> hi)
    uint64_t gap = uint64_t(hi) - uint64_t(lo);  // unsigned: no overflow
    K mid = K(uint64_t(lo) + gap / 2 + (gap & 1));  // upper midpoint
    if (count_ge(keys, n, mid) >= rank) lo = mid; else hi = mid - 1;
  }
  return lo;
}

inline float key_value(int32_t key) { int32_t b = key ^ ((key >> 31) & 0x7FFFFFFF); float v; std::memcpy(&v, &b, 4); return v; }
inline double key_value(int64_t key) { int64_t b = key ^ ((key >> 63) & 0x7FFFFFFFFFFFFFFF); double v; std::memcpy(&v, &b, 8); return v; }

#ifdef __AVX2__
struct CompressTable {                         // lane order that packs the lanes set in an 8-bit mask
  alignas(32) int32_t lanes[256][8];
  CompressTable() {
    for (int m = 0; m < 256; ++m) {
      int n = 0;
      for (int b = 0; b < 8; ++b) if (m >> b & 1) lanes[m][n++] = b;
      while (n < 8) lanes[m][n++] = 0;
    }
  }
};
const CompressTable kCompress;

int64_t candidates_avx2(const float* s, int64_t L, float low, int32_t* ck, int32_t* ci, int64_t& j) {
  const __m256 vlo = _mm256_set1_ps(low), ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i low31 = _mm256_set1_epi32(0x7FFFFFFF), step = _mm256_set1_epi32(8);
  __m256i pos = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t c = 0;
  for (; j + 8 <= L; j += 8, pos = _mm256_add_epi32(pos, step)) {  // branch-free: store 8, keep popcount
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_setzero_ps());  // -0.0 -> +0.0
    int mask = _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(v, vlo, _CMP_GE_OQ), _mm256_cmp_ps(v, ninf, _CMP_GT_OQ)));
    __m256i bits = _mm256_castps_si256(v);
    __m256i key = _mm256_xor_si256(bits, _mm256_and_si256(_mm256_srai_epi32(bits, 31), low31));
    __m256i perm = _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ck + c), _mm256_permutevar8x32_epi32(key, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ci + c), _mm256_permutevar8x32_epi32(pos, perm));
    c += __builtin_popcount(mask);
  }
  return c;
}
#endif

template <typename T, typename K>
int64_t candidates(const T* s, int64_t L, K lo, K* ck, int32_t* ci) {  // ck, ci: room for L + 8
  const T low = key_value(lo), neg_inf = -std::numeric_limits<T>::infinity();
  int64_t c = 0, j = 0;
#ifdef __AVX2__
  if constexpr (sizeof(T) == 4) c = candidates_avx2(s, L, low, ck, ci, j);
#endif
  for (; j < L; ++j) {                         // branch-free: write always, advance when kept
    ck[c] = order_key(s[j]);
    ci[c] = int32_t(j);
    c += (s[j] >= low) & (s[j] > neg_inf);
  }
  return c;
}

template <typename T, typename K>
K sample_bound(const T* s, int64_t L, int64_t k, std::vector<K>& tmp) {
  const K floor = order_key(-std::numeric_limits<T>::infinity());
  int64_t stride = k / 4 < 16 ? k / 4 : 16;
  if (stride <= 1) return floor;               // small k: every allowed key is a candidate
  int64_t m = L / stride;
  double expect = double(k) / double(stride);  // sampled keys expected at or above the k-th largest
  int64_t rank = int64_t(std::ceil(expect + 3.0 * std::sqrt(expect) + 3.0));
  if (rank >= m) return floor;
  tmp.resize(m);
  for (int64_t i = 0; i < m; ++i) tmp[i] = order_key(s[i * stride]);
  return kth_largest(tmp.data(), m, rank);
}

template <typename T, typename K>
int64_t select_row(const T* s, int64_t L, int64_t k, T* vals, int64_t* idx,
                   std::vector<K>& ck, std::vector<int32_t>& ci, std::vector<K>& tmp) {
  const K floor = order_key(-std::numeric_limits<T>::infinity());
  K lo = k < L ? sample_bound<T, K>(s, L, k, tmp) : floor;
  int64_t c = candidates(s, L, lo, ck.data(), ci.data());
  if (c < k && lo > floor) c = candidates(s, L, floor, ck.data(), ci.data());
  int64_t out = 0;
  if (c <= k) {                                // every candidate is kept
    for (; out < c; ++out) idx[out] = ci[out];
  } else {
    K t = kth_largest(ck.data(), c, k);        // the k-th largest key
    if (count_ge(ck.data(), c, t) == k) {      // no tie across the cut: keep every key >= t
      for (int64_t i = 0; i < c && out < k; ++i) { idx[out] = ci[i]; out += ck[i] >= t; }
    } else {
      int64_t need = k;
      for (int64_t i = 0; i < c; ++i) need -= ck[i] > t;  // keys equal to t still to keep
      for (int64_t i = 0; i < c && out < k; ++i) {  // branch-free: write always, advance when kept
        int64_t tie = ck[i] == t, keep = (ck[i] > t) | (tie & (need > 0));
        need -= tie & keep;
        idx[out] = ci[i];
        out += keep;
      }
    }
  }
  for (int64_t i = 0; i < out; ++i) vals[i] = s[idx[i]];
  return out;
}

inline float exp_neg(float x) {                // exp(x) for x <= 0, Cephes' expf: vectorizable
  x = x > -87.0f ? x : -87.0f;                 // below: about 1e-38, as good as 0 for a weight
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23)
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(float, (int32_t(n) + 127) << 23);  // times 2^n
}

inline double exp_neg(double x) { return std::exp(x); }

template <typename T>
void weigh_row(const T* vals, int64_t n, T* w, T* lse) {  // w = softmax(vals[:n]), lse = log-sum-exp
  if (n == 0) { *lse = -std::numeric_limits<T>::infinity(); return; }
  T m = vals[0];
#pragma omp simd reduction(max : m)
  for (int64_t i = 1; i < n; ++i) m = vals[i] > m ? vals[i] : m;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] = exp_neg(vals[i] - m);
  double l = 0.0;
#pragma omp simd reduction(+ : l)
  for (int64_t i = 0; i < n; ++i) l += double(w[i]);
  T inv = T(1.0 / l);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] *= inv;
  *lse = T(double(m) + std::log(l));
}

// Rows [0, rows) of s (row stride `stride`; row r uses keys [0, lens[r]) if lens, else all): the
// kept keys' logits and indices (+ base[r] if base; padding index base[r], else -1), and with w
// the softmax weights over them (0 where padded) and each row's log-sum-exp.
template <typename T, typename K>
void select_rows(const T* s, int64_t rows, int64_t stride, const int64_t* lens, int64_t k,
                 const int64_t* base, T* vals, int64_t* idx, T* w, T* lse) {
  std::vector<K> ck(stride + 8), tmp;
  std::vector<int32_t> ci(stride + 8);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t L = lens ? lens[r] : stride, kr = k < L ? k : L;
    T* v = vals + r * k;
    int64_t* ix = idx + r * k;
    int64_t n = kr > 0 ? select_row<T, K>(s + r * stride, L, kr, v, ix, ck, ci, tmp) : 0;
    int64_t b = base ? base[r] : 0;
    for (int64_t i = 0; i < n; ++i) ix[i] += b;
    for (int64_t i = n; i < k; ++i) { v[i] = -std::numeric_limits<T>::infinity(); ix[i] = base ? b : -1; }
    if (w) {
      weigh_row(v, n, w + r * k, lse + r);
      for (int64_t i = n; i < k; ++i) w[r * k + i] = 0;
    }
  }
}

}  // namespace

extern "C" {
void select_rows_f32(const float* s, int64_t rows, int64_t stride, const int64_t* lens, int64_t k,
                     const int64_t* base, float* vals, int64_t* idx, float* w, float* lse) {
  select_rows<float, int32_t>(s, rows, stride, lens, k, base, vals, idx, w, lse);
}
void select_rows_f64(const double* s, int64_t rows, int64_t stride, const int64_t* lens, int64_t k,
                     const int64_t* base, double* vals, int64_t* idx, double* w, double* lse) {
  select_rows<double, int64_t>(s, rows, stride, lens, k, base, vals, idx, w, lse);
}
}
