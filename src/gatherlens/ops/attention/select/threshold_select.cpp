// Exact top-k of each row of logits, by the rule of select/ties.py, as two PyTorch operators.
//
//   torch.ops.gatherlens.topk_rows(x, lens, base, k, weights, row_start, row_stop) -> vals, idx, w, lse
//   torch.ops.gatherlens.topk_weights_into(x, lens, k) -> lse          (x overwritten by the weights)
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
// weighted sum of value rows (F.embedding_bag) is one more call. topk_weights_into instead
// overwrites each row of x with its softmax weights (0 outside the selection), for one matmul by V
// when k is a large part of the row.
// Built by gatherlens/ops/native.py (torch.utils.cpp_extension); the schemas are defined below
// (TORCH_LIBRARY_FRAGMENT), the fake kernels in select/threshold_kernel.py. The dispatcher releases
// the GIL, so the caller runs row blocks on several threads (select/workers.py).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "gatherlens/common.h"

namespace {

namespace gl = gatherlens;

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

inline __m256i pack_lanes(int mask, __m256i v) {  // the lanes set in mask, moved to the front
  return _mm256_permutevar8x32_epi32(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[mask])));
}

inline void store8(int32_t* dst, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v); }
#endif

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

inline float key_value(int32_t key) {          // the inverse of order_key
  int32_t b = key ^ ((key >> 31) & 0x7FFFFFFF);
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

inline double key_value(int64_t key) {
  int64_t b = key ^ ((key >> 63) & 0x7FFFFFFFFFFFFFFF);
  double v;
  std::memcpy(&v, &b, 8);
  return v;
}

template <typename K>
int64_t count_ge(const K* keys, int64_t n, K x) {
  K c = 0;                                     // a counter as wide as the keys: 8 lanes of int32
  for (int64_t i = 0; i < n; ++i) c += K(keys[i] >= x);  // vectorized by the compiler
  return int64_t(c);
}

template <typename K>
K min_at_least(const K* keys, int64_t n, K x) {  // the smallest key >= x (one exists)
  K m = std::numeric_limits<K>::max();
  for (int64_t i = 0; i < n; ++i) m = keys[i] >= x && keys[i] < m ? keys[i] : m;  // vectorized
  return m;
}

template <typename K>
int64_t keep_between(const K* keys, int64_t n, K lo, K hi, K* out) {  // keys in [lo, hi), in order;
  int64_t c = 0, i = 0;                                               // out: room for n + 8
#ifdef __AVX2__
  if constexpr (sizeof(K) == 4) {
    const __m256i below = _mm256_set1_epi32(lo - 1), top = _mm256_set1_epi32(hi);
    for (; i + 8 <= n; i += 8) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
      __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(v, below), _mm256_cmpgt_epi32(top, v));
      int mask = _mm256_movemask_ps(_mm256_castsi256_ps(in));
      store8(out + c, pack_lanes(mask, v));
      c += __builtin_popcount(mask);
    }
  }
#endif
  for (; i < n; ++i) { out[c] = keys[i]; c += (keys[i] >= lo) & (keys[i] < hi); }
  return c;
}

template <typename K>
K kth_largest(const K* keys, int64_t n, int64_t rank, std::vector<K>& work) {  // 1 <= rank <= n
  using U = std::make_unsigned_t<K>;           // key differences without overflow
  K lk = keys[0], hk = keys[0];
  for (int64_t i = 1; i < n; ++i) { lk = keys[i] < lk ? keys[i] : lk; hk = keys[i] > hk ? keys[i] : hk; }
  if (hk == std::numeric_limits<K>::max()) return hk;  // a NaN logit: no order to keep
  hk += 1;                                     // invariant: count(>= lk) = lc >= rank > hc = count(>= hk)
  int64_t lc = n, hc = 0;
  for (int step = 0; U(hk) - U(lk) > 1; ++step) {
    if (lc == rank) return min_at_least(keys, n, lk);
    if ((lc - hc) * 4 < n) {                   // few keys left in [lk, hk): work on those alone
      work.resize(n + 8);
      n = keep_between(keys, n, lk, hk, work.data());
      keys = work.data();
      rank -= hc, lc -= hc, hc = 0;
    }
    U gap = U(hk) - U(lk), off = gap / 2;      // halve, or on even steps interpolate the counts
    if (step % 2 == 0) {                       // linearly in the logit's value
      double vl = key_value(lk), vh = key_value(hk), frac = double(lc - rank) / double(lc - hc);
      K km = order_key(decltype(key_value(lk))(vl + (vh - vl) * frac));
      off = km > lk ? U(km) - U(lk) : 1;
    }
    off = off < 1 ? 1 : (off > gap - 1 ? gap - 1 : off);
    K mid = K(U(lk) + off);
    int64_t c = count_ge(keys, n, mid);
    if (c >= rank) { lk = mid; lc = c; } else { hk = mid; hc = c; }
  }
  return lk;
}


#ifdef __AVX2__

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
    store8(ck + c, pack_lanes(mask, key));
    store8(ci + c, pack_lanes(mask, pos));
    c += __builtin_popcount(mask);
  }
  return c;
}
#endif

template <typename T>
struct Keys {                                  // where a row lies: key j is s[j * ks], or the sum
  const T* s;                                  // over n rows ss apart (added in row order); select_rows reads it once into a line
  int64_t ks, n, ss;
  T at(int64_t j) const {
    T v = s[j * ks];
    for (int64_t g = 1; g < n; ++g) v += s[j * ks + g * ss];
    return v;
  }
};

template <typename T, typename K>
int64_t candidates(const T* s, int64_t L, K lo, K* ck, int32_t* ci) {  // s contiguous; room for L + 8
  const T low = key_value(lo), neg_inf = -std::numeric_limits<T>::infinity();
  int64_t c = 0, j = 0;
#ifdef __AVX2__
  if constexpr (sizeof(T) == 4) c = candidates_avx2(s, L, low, ck, ci, j);
#endif
  for (; j < L; ++j) {                         // branch-free: write always, advance when kept
    T v = s[j];
    ck[c] = order_key(v);
    ci[c] = int32_t(j);
    c += (v >= low) & (v > neg_inf);
  }
  return c;
}

template <typename T, typename K>
K sample_bound(const T* s, int64_t L, int64_t k, std::vector<K>& tmp, std::vector<K>& work) {
  const K floor = order_key(-std::numeric_limits<T>::infinity());
  int64_t stride = k / 4 < 16 ? k / 4 : 16;
  if (stride <= 1) return floor;               // small k: every allowed key is a candidate
  int64_t m = L / stride;
  double expect = double(k) / double(stride);  // sampled keys expected at or above the k-th largest
  int64_t rank = int64_t(std::ceil(expect + 3.0 * std::sqrt(expect) + 3.0));
  if (rank >= m) return floor;
  tmp.resize(m);
  for (int64_t i = 0; i < m; ++i) tmp[i] = order_key(s[i * stride]);
  return kth_largest(tmp.data(), m, rank, work);
}

struct Cut {                                   // which keys a row keeps: the allowed ones above t,
  int64_t c;                                   // and those equal to t at indices <= last;
  int64_t t;                                   // c candidates (the allowed keys >= a bound <= t,
  int64_t last;                                // in index order, in ck/ci) hold them all
};

template <typename T, typename K>
Cut find_cut(const T* s, int64_t L, int64_t k, std::vector<K>& ck, std::vector<int32_t>& ci,
             std::vector<K>& tmp, std::vector<K>& work) {
  const K floor = order_key(-std::numeric_limits<T>::infinity());
  K lo = k < L ? sample_bound<T, K>(s, L, k, tmp, work) : floor;
  int64_t c = candidates(s, L, lo, ck.data(), ci.data());
  if (c < k && lo > floor) c = candidates(s, L, lo = floor, ck.data(), ci.data());
  if (c <= k) return {c, int64_t(lo), L};      // every candidate
  K t = kth_largest(ck.data(), c, k, work);    // the k-th largest key
  int64_t need = k;
  for (int64_t i = 0; i < c; ++i) need -= ck[i] > t;  // keys equal to t to keep, lowest index first
  int64_t last = -1;
  for (int64_t i = 0; i < c && need > 0; ++i)
    if (ck[i] == t) { last = ci[i]; --need; }
  return {c, int64_t(t), last};
}

template <typename T, typename K>
int64_t select_row(const T* s, int64_t L, int64_t k, T* vals, int64_t* idx,
                   std::vector<K>& ck, std::vector<int32_t>& ci, std::vector<K>& tmp, std::vector<K>& work) {
  Cut cut = find_cut<T, K>(s, L, k, ck, ci, tmp, work);
  const K t = K(cut.t);
  const int64_t last = cut.last;
  int32_t* kept = ci.data();                   // packed in place: the write never passes the read
  int64_t out = 0, i = 0;
#ifdef __AVX2__
  if constexpr (sizeof(K) == 4) {
    const __m256i vt = _mm256_set1_epi32(t), vlast = _mm256_set1_epi32(int32_t(last));
    for (; i + 8 <= cut.c; i += 8) {
      __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ck.data() + i));
      __m256i at = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ci.data() + i));
      __m256i keep = _mm256_or_si256(_mm256_cmpgt_epi32(key, vt), _mm256_andnot_si256(
          _mm256_cmpgt_epi32(at, vlast), _mm256_cmpeq_epi32(key, vt)));
      int mask = _mm256_movemask_ps(_mm256_castsi256_ps(keep));
      store8(kept + out, pack_lanes(mask, at));
      out += __builtin_popcount(mask);
    }
  }
#endif
  for (; i < cut.c; ++i) {                     // branch-free: write always, advance when kept
    kept[out] = ci[i];
    out += (ck[i] > t) | ((ck[i] == t) & (ci[i] <= last));
  }
  for (i = 0; i < out; ++i) { idx[i] = kept[i]; vals[i] = s[kept[i]]; }
  return out;
}

// Rows r0 .. r0 + rows - 1 of s: row r starts at (r / grp) * gs + (r % grp) * rs and holds key j at
// + j * ks (a (R, W) matrix: grp 1, gs W, ks 1; decode logits (B*Hkv, L, G): grp G, gs L*G, rs 1,
// ks G), and uses keys [0, lens[r]) if lens, else [0, W); with n > 1 a row's logit is the sum of
// n such rows ss apart (share_selection ranks by the sum of a KV group's heads). Out (rows, k)
// from row r0 on: the kept
// keys' logits and indices (+ base[r] if base; padding index base[r], else -1), and with w the
// softmax weights over them (0 where padded) and each row's log-sum-exp.
struct Layout { int64_t r0, grp, gs, rs, ks, W, n, ss; };

template <typename T, typename K>
void select_rows(const T* s, Layout at, int64_t rows, const int64_t* lens, int64_t k,
                 const int64_t* base, T* vals, int64_t* idx, T* w, T* lse) {
  std::vector<K> ck(at.W + 8), tmp, work;
  std::vector<int32_t> ci(at.W + 8);
  std::vector<T> line;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t r = at.r0 + i, L = lens ? lens[i] : at.W, kr = k < L ? k : L;
    Keys<T> keys{s + (r / at.grp) * at.gs + (r % at.grp) * at.rs, at.ks, at.n, at.ss};
    const T* row = keys.s;
    if (keys.ks != 1 || keys.n != 1) {         // strided or summed: one pass into a contiguous line
      line.resize(L + 8);
      for (int64_t j = 0; j < L; ++j) line[j] = keys.at(j);
      row = line.data();
    }
    T* v = vals + i * k;
    int64_t* ix = idx + i * k;
    int64_t n = kr > 0 ? select_row<T, K>(row, L, kr, v, ix, ck, ci, tmp, work) : 0;
    int64_t b = base ? base[i] : 0;
    for (int64_t j = 0; j < n; ++j) ix[j] += b;
    for (int64_t j = n; j < k; ++j) { v[j] = -std::numeric_limits<T>::infinity(); ix[j] = base ? b : -1; }
    if (w) {
      gl::softmax_row(v, n, w + i * k, lse + i);
      for (int64_t j = n; j < k; ++j) w[i * k + j] = 0;
    }
  }
}

template <typename T, typename K>
void dense_row(T* s, int64_t L, int64_t stride, int64_t k, T* lse,
               std::vector<K>& ck, std::vector<int32_t>& ci, std::vector<K>& tmp, std::vector<K>& work) {
  Cut cut = L > 0 && k > 0 ? find_cut<T, K>(s, L, k, ck, ci, tmp, work) : Cut{0, 0, 0};
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (cut.c == 0) {                            // no allowed key: zero weights
    for (int64_t j = 0; j < stride; ++j) s[j] = 0;
    *lse = neg_inf;
    return;
  }
  K top = ck[0];
  for (int64_t i = 1; i < cut.c; ++i) top = ck[i] > top ? ck[i] : top;
  const T m = key_value(top), tv = key_value(K(cut.t));
  const int64_t last = cut.last;
  double l = 0.0;
#pragma omp simd reduction(+ : l)
  for (int64_t j = 0; j < L; ++j) {            // the weight of every kept key, 0 elsewhere
    T v = s[j];
    bool keep = ((v > tv) | ((v == tv) & (j <= last))) & (v > neg_inf);
    T e = keep ? gl::exp_neg(v - m) : T(0);
    s[j] = e;
    l += double(e);
  }
  gl::scale_by(s, L, T(1.0 / l));
  for (int64_t j = L; j < stride; ++j) s[j] = 0;
  *lse = gl::lse_of(m, l);
}

template <typename T, typename K>
void dense_rows(T* s, int64_t rows, int64_t stride, const int64_t* lens, int64_t k, T* lse) {
  std::vector<K> ck(stride + 8), tmp, work;
  std::vector<int32_t> ci(stride + 8);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t L = lens ? lens[r] : stride;
    dense_row<T, K>(s + r * stride, L, stride, k < L ? k : L, lse + r, ck, ci, tmp, work);
  }
}


// ---- the operators: checks, outputs, then the kernels above (float32 / float64) ----

const int64_t* per_row(const std::optional<at::Tensor>& t, int64_t rows, const char* op, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->numel() == rows && t->is_contiguous(),
              op, ": ", name, " must be a contiguous int64 tensor of ", rows, " elements (one per row), got ",
              t->scalar_type(), " of shape ", t->sizes());
  return t->const_data_ptr<int64_t>();
}

void check_lens(const int64_t* lens, int64_t r0, int64_t r1, int64_t W, const char* op) {
  for (int64_t r = r0; lens && r < r1; ++r)
    TORCH_CHECK(lens[r] >= 0 && lens[r] <= W, op, ": lens[", r, "] = ", lens[r], " is outside [0, ", W, "]");
}

void check_logits(const at::Tensor& x, int64_t dim, int64_t k, const char* op) {
  TORCH_CHECK(x.dim() == dim, op, ": x must be ", dim, "-D, got shape ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              op, ": x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(k >= 0, op, ": k = ", k, " must be >= 0");
}

// x (N, n, grp, W), any strides: row r (of R = N * grp) is the sum over dim 1 of x[r / grp, :, r % grp]
// (added in order; n = 1: the row itself), keys [0, lens[r]). Rows [row_start, row_stop) ->
// vals, idx (rows, min(k, W)) (idx + base[r] with base), and with weights w (rows, min(k, W)) and
// lse (rows,), else both empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> topk_rows_cpu(
    const at::Tensor& x, const std::optional<at::Tensor>& lens, const std::optional<at::Tensor>& base,
    int64_t k, bool weights, int64_t row_start, int64_t row_stop) {
  const char* op = "gatherlens::topk_rows";
  check_logits(x, 4, k, op);
  const int64_t grp = x.size(2), W = x.size(3), R = x.size(0) * grp;
  TORCH_CHECK(0 <= row_start && row_start <= row_stop && row_stop <= R,
              op, ": rows [", row_start, ", ", row_stop, ") are outside [0, ", R, "]");
  const int64_t* lp = per_row(lens, R, op, "lens");
  const int64_t* bp = per_row(base, R, op, "base");
  check_lens(lp, row_start, row_stop, W, op);
  const int64_t rows = row_stop - row_start, width = k < W ? k : W;
  at::Tensor vals = at::empty({rows, width}, x.options());
  at::Tensor idx = at::empty({rows, width}, x.options().dtype(at::kLong));
  at::Tensor w = at::empty({weights ? rows : 0, width}, x.options());
  at::Tensor lse = at::empty({weights ? rows : 0}, x.options());
  Layout lay{row_start, grp, x.stride(0), x.stride(2), x.stride(3), W, x.size(1), x.stride(1)};
  const int64_t* l0 = lp ? lp + row_start : nullptr;
  const int64_t* b0 = bp ? bp + row_start : nullptr;
  if (rows == 0) return {vals, idx, w, lse};
  if (x.scalar_type() == at::kFloat)
    select_rows<float, int32_t>(x.const_data_ptr<float>(), lay, rows, l0, width, b0, vals.data_ptr<float>(),
                                idx.data_ptr<int64_t>(), weights ? w.data_ptr<float>() : nullptr,
                                weights ? lse.data_ptr<float>() : nullptr);
  else
    select_rows<double, int64_t>(x.const_data_ptr<double>(), lay, rows, l0, width, b0, vals.data_ptr<double>(),
                                 idx.data_ptr<int64_t>(), weights ? w.data_ptr<double>() : nullptr,
                                 weights ? lse.data_ptr<double>() : nullptr);
  return {vals, idx, w, lse};
}

// x (rows, W) contiguous, in place: each row becomes the softmax over its kept keys (0 elsewhere and
// past lens[r]) -> lse (rows,).
at::Tensor topk_weights_into_cpu(const at::Tensor& x, const std::optional<at::Tensor>& lens, int64_t k) {
  const char* op = "gatherlens::topk_weights_into";
  check_logits(x, 2, k, op);
  TORCH_CHECK(x.is_contiguous(), op, ": x must be contiguous (it is overwritten row by row)");
  const int64_t rows = x.size(0), W = x.size(1);
  const int64_t* lp = per_row(lens, rows, op, "lens");
  check_lens(lp, 0, rows, W, op);
  at::Tensor lse = at::empty({rows}, x.options());
  if (x.scalar_type() == at::kFloat)
    dense_rows<float, int32_t>(x.data_ptr<float>(), rows, W, lp, k < W ? k : W, lse.data_ptr<float>());
  else
    dense_rows<double, int64_t>(x.data_ptr<double>(), rows, W, lp, k < W ? k : W, lse.data_ptr<double>());
  return lse;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("topk_rows(Tensor x, Tensor? lens, Tensor? base, int k, bool weights, int row_start, int row_stop)"
        " -> (Tensor vals, Tensor idx, Tensor w, Tensor lse)");
  m.def("topk_weights_into(Tensor(a!) x, Tensor? lens, int k) -> Tensor lse");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("topk_rows", &topk_rows_cpu);
  m.impl("topk_weights_into", &topk_weights_into_cpu);
}
