// Sparse decode in one operator: score every page's bound, choose the pages, attend over them in place.
//
//   torch.ops.gatherlens.paged_decode(q, page_keys, page_values, summaries, length, n, first_recent,
//                                     scale, per_head, group_sum, key_scales, value_scales, mass,
//                                     min_pages) -> (out, lse, pages, bounds)
//   torch.ops.gatherlens.dense_decode(q, page_keys, page_values, length, scale, key_scales, value_scales)
//                                     -> (out, lse)
//
// The same arithmetic as the torch path of ops/sparse (page_choice.select_pages + torch_decode.
// attend_pages), without the gather copy and without ~25 small torch calls per layer:
//   1. bounds[b, h, g, p] = relu(q) . max_p + (-relu(-q)) . min_p for the G query heads of KV head h
//      (page_choice.page_bounds term by term; only the order of the sum differs);
//   2. per selection head (a query head, or a KV group by the max / sum of its heads' bounds): page 0
//      and pages first_recent.. are always read, the best others fill n pages (rank: nan lowest, +inf
//      just below the forced pages, ties to the lower page); the chosen pages sorted ascending; with
//      mass > 0 (the auto budget: page_choice.choose_by_mass) each head reads pages in that order until
//      their estimated mass reaches `mass` (at least min_pages, at most n), its pages then -1 up to n;
//   3. exact softmax attention of each query head over the rows of its chosen pages that hold one of
//      the `length` tokens, reading K and V where they lie in the cache (no copy); a KV group's heads
//      together (each row read once for them): its shared pages, or, with per-head choices, the union of
//      its heads' pages (group_union: each head's logits masked to its own, or, in groups of more than 4,
//      each page's sums only for the heads that chose it).
// Inputs: q (B, Hq, D) float32 contiguous; page_keys (B, Hkv, N', P, D), page_values (B, Hkv, N', P, Dv)
// float32, float16, bfloat16 or int8 (one dtype; a template on it), each page's block contiguous (the
// cache's storage or views of it), each page read as float32 as the cache reads it (kv_pages.h's
// widen: int8 key codes times key_scales (B, Hkv, N', D) per page channel, folded into the query, and
// value codes times value_scales (B, Hkv, N', P) per token, folded into the weights; int8 only); summaries
// (B, Hkv, N', 2D) float32, [max | min], last dim contiguous; the first N = ceil(length / P) <= N'
// pages hold the `length` tokens. Outputs: out (B, Hq, Dv), lse (B, Hq), pages (B, Hsel, n) int64,
// bounds (B, Hkv, G, N) float32. Built by gatherlens/ops/native.py; fake kernel in fused_decode.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "gatherlens/common.h"
#include "gatherlens/group_dots.h"
#include "gatherlens/kv_pages.h"

namespace {

namespace gl = gatherlens;
using gl::Strides;

inline void split_query(const float* q, int64_t D, float* qq) {  // page_choice.split_query
  for (int64_t d = 0; d < D; ++d) {
    qq[d] = q[d] > 0.f ? q[d] : 0.f;
    qq[D + d] = q[d] < 0.f ? q[d] : 0.f;
  }
}

template <typename T>
inline void prefetch_page(const T* page, int64_t values) {  // a page asked for ahead of its use
  gl::prefetch_lines(page, values * static_cast<int64_t>(sizeof(T)));
}


// ---- the page choice: page_choice.choose_pages's rule (tests/test_page_choice_rule.py holds them equal) ----

inline float rank_value(float v) {  // page_choice.rankable: nan lowest, -inf above it, +inf below forced
  if (std::isnan(v)) return -std::numeric_limits<float>::infinity();
  if (std::isinf(v)) return v > 0 ? std::numeric_limits<float>::max() : std::numeric_limits<float>::lowest();
  return v;
}

// The order-preserving bits of a rank (+0 and -0 one value): larger ranks, larger bits.
inline uint32_t ordered_bits(float rank) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, rank);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

inline float canonical_rank(float v) {  // rank_value, with -0 as +0 (one rank)
  const float r = rank_value(v);
  return r == 0.f ? 0.f : r;
}

struct RankScratch {                              // one choosing thread's buffers
  std::vector<uint32_t> key, id, key2, id2;       // candidates' complemented rank bits and pages, sorted in place
  std::vector<uint8_t> mark;                      // (N,) the chosen pages, read out ascending
};

// count[b] = how many of keys[0:m] have digit b (8 bits from `shift`), counted in four histograms summed at the
// end, so that a run of one digit does not wait on its own increments (~3x faster on 1,000 keys).
inline void digit_counts(const uint32_t* keys, int64_t m, int shift, uint32_t* count) {
  uint32_t part[4][256] = {};
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    for (int u = 0; u < 4; ++u) ++part[u][(keys[i + u] >> shift) & 255u];
  for (; i < m; ++i) ++part[0][(keys[i] >> shift) & 255u];
  for (int b = 0; b < 256; ++b) count[b] = part[0][b] + part[1][b] + part[2][b] + part[3][b];
}

// r.key / r.id = the candidate pages 1 .. fr-1, ascending, with their complemented rank bits (smaller: better).
void candidates(const float* score, int64_t fr, RankScratch& r) {
  r.key.resize(static_cast<size_t>(fr - 1));
  r.id.resize(static_cast<size_t>(fr - 1));
  for (int64_t p = 1; p < fr; ++p) {
    r.key[p - 1] = ~ordered_bits(canonical_rank(score[p]));
    r.id[p - 1] = static_cast<uint32_t>(p);
  }
}

// r.id (in rank order: best first, equal ranks the lower page first, select/ties.py): a stable LSD radix sort of
// r.key (4 passes of 8 bits, a pass skipped where every key has one digit) over the pages taken ascending: a few
// microseconds for 512 pages, where a comparison sort or heap of them takes 25-40 (mispredicted branches).
void sort_by_rank(RankScratch& r) {
  const int64_t m = static_cast<int64_t>(r.key.size());
  r.key2.resize(m);
  r.id2.resize(m);
  for (int shift = 0; shift < 32 && m > 1; shift += 8) {
    uint32_t count[257];
    digit_counts(r.key.data(), m, shift, count + 1);
    count[0] = 0;
    if (count[((r.key[0] >> shift) & 255u) + 1] == static_cast<uint32_t>(m)) continue;  // one digit: order kept
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t at = count[(r.key[i] >> shift) & 255u]++;
      r.key2[at] = r.key[i];
      r.id2[at] = r.id[i];
    }
    std::swap(r.key, r.key2);
    std::swap(r.id, r.id2);
  }
}

// pages[0:k] ascending: page 0, the first `taken` of r.id, then pages fr.. while fewer than n. Returns k.
int64_t emit(int64_t N, int64_t n, int64_t fr, int64_t taken, RankScratch& r, int64_t* pages) {
  r.mark.assign(static_cast<size_t>(N), 0);
  r.mark[0] = 1;
  int64_t k = 1;
  for (int64_t i = 0; i < taken; ++i, ++k) r.mark[r.id[i]] = 1;
  for (int64_t p = fr; p < N && k < n; ++p, ++k) r.mark[p] = 1;
  int64_t j = 0;
  for (int64_t p = 0; p < N; ++p)
    if (r.mark[p]) pages[j++] = p;
  return j;
}

// The take-th smallest of keys (1 <= take <= keys.size()): a most-significant-digit radix select, 8 bits a
// pass, each pass over the keys that share the digits found so far (copied to `left`, then filtered in place).
uint32_t kth_smallest(const std::vector<uint32_t>& keys, int64_t take, std::vector<uint32_t>& left) {
  const uint32_t* in = keys.data();
  int64_t m = static_cast<int64_t>(keys.size()), need = take;
  uint32_t prefix = 0;
  for (int shift = 24;; shift -= 8) {
    uint32_t count[256];
    digit_counts(in, m, shift, count);
    uint32_t d = 0;
    for (; need > count[d]; ++d) need -= count[d];
    prefix |= d << shift;
    if (shift == 0 || count[d] == m) {  // the last digit, or every key left shares this one: go on without a copy
      if (shift == 0) return prefix;
      continue;
    }
    left.resize(static_cast<size_t>(count[d]));
    int64_t j = 0;
    for (int64_t k = 0; k < m; ++k)  // in place when in is left itself: j never passes k
      if (((in[k] >> shift) & 255u) == d) left[j++] = in[k];
    in = left.data();
    m = j;
  }
}

// r's candidates (ascending pages) cut to their best `keep` (0 <= keep), still ascending: the keys below the
// keep-th smallest (kth_smallest) and, of those equal to it, the lower pages first (the rule's ties). No order
// among them: a fixed budget's choice of 9 heads of 1,007 pages in 47 us on one thread, against 103 us sorted.
void keep_best(int64_t keep, RankScratch& r) {
  const int64_t m = static_cast<int64_t>(r.key.size());
  if (keep >= m) return;
  if (keep <= 0) {
    r.key.clear();
    r.id.clear();
    return;
  }
  const uint32_t edge = kth_smallest(r.key, keep, r.key2);  // the keep-th best key
  int64_t ties = keep - std::count_if(r.key.begin(), r.key.end(), [edge](uint32_t k) { return k < edge; });
  int64_t j = 0;
  for (int64_t i = 0; i < m; ++i) {
    const uint32_t k = r.key[i];
    if (k < edge || (k == edge && ties-- > 0)) {
      r.key[j] = k;
      r.id[j++] = r.id[i];
    }
  }
  r.key.resize(j);
  r.id.resize(j);
}

// pages[0:n] of one selection head from its scores (N,): forced pages, then the best others (a set: no sort).
void choose(const float* score, int64_t N, int64_t n, int64_t first_recent, int64_t* pages, RankScratch& r) {
  if (n >= N) {
    for (int64_t p = 0; p < N; ++p) pages[p] = p;
    return;
  }
  const int64_t fr = std::max<int64_t>(1, std::min(first_recent, N - 1));
  const int64_t forced = 1 + (N - fr);
  const int64_t take = std::min<int64_t>(std::max<int64_t>(0, n - forced), fr - 1);
  candidates(score, fr, r);
  keep_best(take, r);
  emit(N, n, fr, take, r, pages);
}

// ---- the auto budget: page_choice.mass_counts / choose_by_mass (tests/test_page_choice_rule.py) ----

struct MassRule {                                 // mass > 0: the auto budget's share, floor, logit scale
  float mass, scale;
  int64_t min_pages, P, length;
};

// w (N,) = page_choice.estimated_mass of one head's scores: tokens * exp(scale * (rank - top rank)), in float32
// (rank_value: nan weighs 0); false when every score is nan (no weight anywhere).
bool estimated_mass(const float* score, int64_t N, const MassRule& r, std::vector<float>& w) {
  w.resize(static_cast<size_t>(N));
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < N; ++p) top = std::max(top, rank_value(score[p]));
  if (!(top > -std::numeric_limits<float>::infinity())) return false;
  for (int64_t p = 0; p < N; ++p)
    w[p] = gl::exp_neg((rank_value(score[p]) - top) * r.scale) * static_cast<float>(gl::page_rows(p, r.P, r.length));
  return true;
}

// pages[0:n] of one head under the auto budget: page 0 and pages fr.. (forced), then the others in rank
// order until the weights summed in that order (float64) reach mass x their sum; at least max(min_pages,
// forced), at most n pages; ascending, the rest -1. Returns the count.
int64_t choose_mass(const float* score, int64_t N, int64_t n, int64_t first_recent, const MassRule& rule,
                    int64_t* pages, RankScratch& r, std::vector<float>& w) {
  const int64_t fr = std::max<int64_t>(1, std::min(first_recent, N - 1));
  const int64_t forced = std::min(n, 1 + (N - fr)), floor = std::min(n, std::max(rule.min_pages, forced));
  candidates(score, fr, r);
  const int64_t m = static_cast<int64_t>(r.key.size());
  keep_best(n - forced, r);  // no more than these can be read: only they need an order
  sort_by_rank(r);
  const bool weighed = estimated_mass(score, N, rule, w);
  double total = 0.0, acc = weighed ? w[0] : 0.0;
  for (int64_t p = 0; weighed && p < N; ++p) total += w[p];
  for (int64_t p = fr; weighed && p < N; ++p) acc += w[p];
  const double target = static_cast<double>(rule.mass) * total;
  const int64_t others = std::min<int64_t>(n - forced, m);
  int64_t taken = 0;
  for (; taken < others && ((weighed && acc < target) || forced + taken < floor); ++taken)
    acc += weighed ? w[r.id[taken]] : 0.0;
  const int64_t k = emit(N, n, fr, taken, r, pages);
  std::fill(pages + k, pages + n, -1);
  return k;
}

// ---- attention over the chosen pages ----

struct Dims {                                     // of one KV head's pages
  int64_t P, D, Dv, length;
};

template <typename T>
struct HeadKV {                                   // one KV head's stored pages and (int8) their scales
  const T *K, *V;
  Strides kl, vl;
  const float *ks, *vs;                           // keys' channel scales (N', D), values' token scales (N', P); or nullptr
};

struct Partial {                                  // split-K partials of the G heads of a group
  float *m, *sum, *acc;                           // (G,), (G,), (G, Dv)
};

struct GroupScratch {
  std::vector<float> w, buf, q, sub;              // logits (G, rows); one row widened (the plain loops); scaled q;
                                                  // a page's choosing heads' queries and logits (page_logits)
};

// The G queries as they meet an int8 key page's codes: q (G, D) times the page's channel scales (D,), so
// q . (code * scale) is one dot of codes (kv_pages.h's widen_channels, the product regrouped); q itself
// for float pages (scales nullptr).
inline const float* scaled_queries(const float* q, int64_t G, int64_t D, const float* scales, std::vector<float>& out) {
  if (!scales) return q;
  out.resize(static_cast<size_t>(G * D));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = q[g * D + d] * scales[d];
  return out.data();
}

// The G heads qg (G, D) over the valid rows of pages ids[0:np] of one KV head, read in place (group_dots.h:
// each row widened once for the G heads): per head the max logit, the sum of exp(l - max) and the
// exp-weighted value rows. Every logit -inf or nan: m is not > -inf (the caller's case).
// Rows of the pages ids[0:np] whose head g lacks in heads[i] (bit g) set to `value` in w (G, cap); heads
// nullptr: every head reads every page (nothing set).
void unread_rows(float* w, int64_t cap, int64_t G, const uint64_t* heads, const int64_t* ids, int64_t np,
                 const Dims& d, float value) {
  if (!heads) return;
  for (int64_t i = 0, rows = 0; i < np; rows += gl::page_rows(ids[i], d.P, d.length), ++i)
    for (int64_t g = 0; g < G; ++g)
      if (!((heads[i] >> g) & 1u)) std::fill_n(w + g * cap + rows, gl::page_rows(ids[i], d.P, d.length), value);
}

// The heads of a page's bits among G (at most 64): their count, their indices ascending in at[].
inline int64_t heads_of(uint64_t bits, int64_t G, int64_t* at) {
  int64_t k = 0;
  for (int64_t g = 0; g < G; ++g)
    if ((bits >> g) & 1u) at[k++] = g;
  return k;
}

// The logits of page id's `valid` rows into w (G, cap) at column `rows`: every head's, or (heads: a union read
// once for its group) only those of the heads that chose it, their queries gathered (each head's dot is the
// same sum either way: group_dots computes each head alone).
template <typename T>
void page_logits(const float* q, int64_t G, const HeadKV<T>& kv, int64_t id, int64_t valid, const Dims& d, float sc,
                 int64_t rows, int64_t cap, const uint64_t* bits, GroupScratch& s) {
  const T* K = kv.K + id * kv.kl.n;
  int64_t at[64];
  const int64_t k = bits ? heads_of(*bits, G, at) : G;
  if (k == G) return gl::group_dots(q, G, K, d.D, 1.f, valid, d.D, sc, s.w.data() + rows, cap, s.buf.data());
  s.sub.resize(static_cast<size_t>(k * (d.D + d.P)));
  float *qs = s.sub.data(), *out = qs + k * d.D;
  for (int64_t j = 0; j < k; ++j) std::copy_n(q + at[j] * d.D, d.D, qs + j * d.D);
  gl::group_dots(qs, k, K, d.D, 1.f, valid, d.D, sc, out, d.P, s.buf.data());
  for (int64_t j = 0; j < k; ++j) std::copy_n(out + j * d.P, valid, s.w.data() + at[j] * cap + rows);
}

// The weighted values of page id's rows into acc (G, Dv): every head at once, or (heads) each head that chose
// it alone where they are fewer than about half (a row widened per head then costs less than G heads' sums;
// the others' weights are 0 there, and each head's sums run in the same order either way).
template <typename T>
void page_values(const float* w, int64_t G, const HeadKV<T>& kv, int64_t id, int64_t valid, const Dims& d,
                 int64_t cap, const uint64_t* bits, float* acc, GroupScratch& s) {
  const T* V = kv.V + id * kv.vl.n;
  int64_t at[64];
  const int64_t k = bits ? heads_of(*bits, G, at) : G;
  if (2 * k >= G + 1) return gl::group_weigh(w, cap, G, V, d.Dv, 1.f, valid, d.Dv, acc, s.buf.data());
  for (int64_t j = 0; j < k; ++j)
    gl::group_weigh(w + at[j] * cap, cap, 1, V, d.Dv, 1.f, valid, d.Dv, acc + at[j] * d.Dv, s.buf.data());
}

template <typename T>
void group_partial(const float* qg, int64_t G, const HeadKV<T>& kv, const int64_t* ids, int64_t np, const Dims& d,
                   float sc, Partial part, GroupScratch& s, const uint64_t* heads = nullptr, bool by_head = false) {
  const int64_t cap = np * d.P;
  s.w.resize(static_cast<size_t>(G * cap));
  s.buf.resize(static_cast<size_t>(std::max(d.D, d.Dv)));
  int64_t rows = 0;
  for (int64_t i = 0; i < np; ++i) {
    const int64_t id = ids[i], valid = gl::page_rows(id, d.P, d.length);
    if (i + 1 < np) prefetch_page(kv.K + ids[i + 1] * kv.kl.n, d.P * d.D);
    prefetch_page(kv.V + id * kv.vl.n, d.P * d.Dv);  // its values too, ready for the weighted sum (~2% a 4K step)
    const float* q = scaled_queries(qg, G, d.D, kv.ks ? kv.ks + id * d.D : nullptr, s.q);
    page_logits(q, G, kv, id, valid, d, sc, rows, cap, by_head ? heads + i : nullptr, s);
    rows += valid;
  }
  unread_rows(s.w.data(), cap, G, heads, ids, np, d, -std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < G; ++g) {
    float* w = s.w.data() + g * cap;
    part.m[g] = gl::row_max(w, rows);
    part.sum[g] = part.m[g] > -std::numeric_limits<float>::infinity()
                      ? static_cast<float>(gl::exp_sum(w, rows, part.m[g], w)) : 0.f;
  }
  unread_rows(s.w.data(), cap, G, heads, ids, np, d, 0.f);  // weigh nothing there, even where m is -inf
  std::fill(part.acc, part.acc + G * d.Dv, 0.f);
  rows = 0;
  for (int64_t i = 0; i < np; ++i) {
    const int64_t id = ids[i], valid = gl::page_rows(id, d.P, d.length);
    if (i + 1 < np) prefetch_page(kv.V + ids[i + 1] * kv.vl.n, d.P * d.Dv);
    if (kv.vs)  // int8 values: each weight times its token's scale, then the codes weighed
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < valid; ++j) s.w[g * cap + rows + j] *= kv.vs[id * d.P + j];
    page_values(s.w.data() + rows, G, kv, id, valid, d, cap, by_head ? heads + i : nullptr, part.acc, s);
    rows += valid;
  }
}

// out (Dv,) per head of a selection head's partials (parts of them, `step` heads apart), lse returned;
// every logit -inf or nan: out nan and lse that max (as the torch path).
inline float finish(const float* m, const float* sum, const float* acc, int64_t parts, int64_t step, int64_t Dv,
                    float* out) {
  float M = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < parts; ++c) M = m[c * step] > M ? m[c * step] : M;
  if (!(M > -std::numeric_limits<float>::infinity())) {
    for (int64_t d = 0; d < Dv; ++d) out[d] = std::numeric_limits<float>::quiet_NaN();
    return parts == 1 ? m[0] : M;
  }
  return gl::merge_partials(m, sum, acc, parts, step, Dv, out);
}

// ---- paged_decode: check, score, choose, attend ----

using Scales = std::optional<at::Tensor>;

bool stored_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kChar;
}

// int8 pages need their scales float32 contiguous: keys (B, Hkv, N', D) per page channel, values (B, Hkv, N', P)
// per token; float pages none.
void check_scales(const char* op, const at::Tensor& pk, const Scales& ks, const Scales& vs) {
  const bool int8 = pk.scalar_type() == at::kChar;
  TORCH_CHECK(int8 == ks.has_value() && int8 == vs.has_value(), op,
              ": key_scales / value_scales must be given for int8 pages, and only for them");
  if (!int8) return;
  for (const at::Tensor* t : {&*ks, &*vs})
    TORCH_CHECK(t->dim() == 4 && t->is_contiguous() && t->scalar_type() == at::kFloat && t->size(0) == pk.size(0) &&
                    t->size(1) == pk.size(1) && t->size(2) == pk.size(2) &&
                    t->size(3) == (t == &*ks ? pk.size(4) : pk.size(3)),
                op, ": scales must be float32 contiguous, keys (B, Hkv, N, D) and values (B, Hkv, N, P)");
}

void check_inputs(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& s,
                  int64_t length, int64_t n, const Scales& ks, const Scales& vs) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat,
              "paged_decode: q must be (B, Hq, D) float32 contiguous");
  TORCH_CHECK(pk.dim() == 5 && pv.dim() == 5 && pv.sizes().slice(0, 4) == pk.sizes().slice(0, 4) &&
                  stored_type(pk.scalar_type()) && pv.scalar_type() == pk.scalar_type(),
              "paged_decode: page_keys / page_values must be (B, Hkv, N, P, D) float32, float16, bfloat16 or int8");
  check_scales("paged_decode", pk, ks, vs);
  const int64_t P = pk.size(3), D = pk.size(4);
  gl::check_heads("paged_decode", q.size(1), pk.size(1));
  TORCH_CHECK(P >= 1 && D >= 1 && pv.size(4) >= 1, "paged_decode: pages of at least one token of one value, "
              "got page_keys ", pk.sizes(), ", page_values ", pv.sizes());
  TORCH_CHECK(pk.stride(4) == 1 && pk.stride(3) == D && pv.stride(4) == 1 && pv.stride(3) == pv.size(4),
              "paged_decode: each page's (P, D) block must be contiguous");
  const bool half = pk.scalar_type() == at::kHalf || pk.scalar_type() == at::kBFloat16;
  TORCH_CHECK(s.dim() == 4 && (s.scalar_type() == at::kFloat || (half && s.scalar_type() == pk.scalar_type())) &&
                  s.stride(3) == 1 && s.size(3) == 2 * D && s.sizes().slice(0, 3) == pk.sizes().slice(0, 3),
              "paged_decode: summaries must be (B, Hkv, N, 2D) float32 (or the 16-bit pages' dtype), got ", s.sizes(),
              " for page_keys ", pk.sizes());
  TORCH_CHECK(q.size(0) == pk.size(0) && q.size(2) == D && q.size(1) % pk.size(1) == 0,
              "paged_decode: q (B, Hq, D) does not match the cache");
  TORCH_CHECK(length >= 1 && length <= pk.size(2) * P, "paged_decode: length ", length,
              " is outside the ", pk.size(2), " pages of ", P, " the storage holds");
  TORCH_CHECK(n >= 1, "paged_decode: n must be >= 1");
}

// Tasks a split-K aims at, fixed (what 16 threads would want): the partial sums, and so the result, are the
// same whatever the thread count (the thread controller changes it mid-run; --threads 1 and 2 agree).
constexpr int64_t kSplitTasks = 32;

struct Shape {                                    // of one paged_decode call
  int64_t B, Hq, Hkv, G, D, Dv, P, N, length;
};

struct ScoreScratch {
  std::vector<float> qq, box;                     // the split queries; one page's [max | min] as float32
};

// bounds (B, Hkv, G, N): every query head's bound of every page in use; summaries of T (float32, or the
// 16-bit pages' own dtype: widened exactly).
template <typename T>
void score_pages(const Shape& s, const float* qp, const T* sp, Strides sl, float* bp) {
  constexpr int64_t kBlock = 256;                  // pages per scoring task
  const int64_t blocks = gl::ceil_div(s.N, kBlock);
  gl::for_each_task<ScoreScratch>(s.B * s.Hkv * blocks, [&](int64_t t, ScoreScratch& sc) {
    const int64_t bh = t / blocks, blk = t % blocks, b = bh / s.Hkv, h = bh % s.Hkv;
    const T* srow = sp + b * sl.b + h * sl.h;
    sc.qq.resize(s.G * 2 * s.D);
    sc.box.resize(2 * s.D);
    for (int64_t g = 0; g < s.G; ++g) split_query(qp + (b * s.Hq + h * s.G + g) * s.D, s.D, sc.qq.data() + g * 2 * s.D);
    const int64_t p0 = blk * kBlock, p1 = std::min(s.N, p0 + kBlock);  // bound = qq . [max | min], 2D terms
    gl::group_dots(sc.qq.data(), s.G, srow + p0 * sl.n, sl.n, 1.f, p1 - p0, 2 * s.D, 1.f, bp + bh * s.G * s.N + p0,
                   s.N, sc.box.data());
  });
}

inline float max_nan(float a, float b) { return a >= b || a != a ? a : b; }  // torch.amax: nan wins

const float* group_scores(const float* rows, int64_t G, int64_t N, bool sum, std::vector<float>& score) {
  score.assign(rows, rows + N);                    // a KV group's heads reduced: max or sum (select_pages)
  for (int64_t g = 1; g < G; ++g) {
    const float* r = rows + g * N;
    for (int64_t p = 0; p < N; ++p) score[p] = sum ? score[p] + r[p] : max_nan(score[p], r[p]);
  }
  return score.data();
}

struct ChoiceScratch {
  std::vector<float> score, w;
  RankScratch rank;
};

// pages (B, Hsel, nn) from the bounds: per query head, or per KV group (max / sum of its heads); with
// rule.mass > 0 (the auto budget) each head's own count of them, then -1.
void choose_all(const Shape& s, const float* bp, int64_t nn, int64_t first_recent, bool per_head, bool group_sum,
                const MassRule& rule, int64_t* pg) {
  gl::for_each_task<ChoiceScratch>(s.B * (per_head ? s.Hq : s.Hkv), [&](int64_t t, ChoiceScratch& c) {
    const float* row = per_head ? bp + t * s.N               // (b, hq) is row b*Hq + hq of (B*Hkv*G, N)
                                : group_scores(bp + t * s.G * s.N, s.G, s.N, group_sum, c.score);
    if (rule.mass > 0.f && nn < s.N)
      choose_mass(row, s.N, nn, first_recent, rule, pg + t * nn, c.rank, c.w);
    else
      choose(row, s.N, nn, first_recent, pg + t * nn, c.rank);
  });
}

inline int64_t pages_of(const int64_t* pg, int64_t nn) {  // a head's pages: those before the first -1
  int64_t k = 0;
  while (k < nn && pg[k] >= 0) ++k;
  return k;
}

template <typename T>
HeadKV<T> head_kv(const at::Tensor& pk, const at::Tensor& pv, const Scales& ks, const Scales& vs, int64_t b,
                  int64_t h) {
  const Strides kl = gl::strides_of(pk), vl = gl::strides_of(pv);
  const int64_t row = (b * pk.size(1) + h) * pk.size(2);  // (b, h)'s first page in (B, Hkv, N')
  return {pk.data_ptr<T>() + b * kl.b + h * kl.h, pv.data_ptr<T>() + b * vl.b + h * vl.h, kl, vl,
          ks ? ks->data_ptr<float>() + row * pk.size(4) : nullptr, vs ? vs->data_ptr<float>() + row * pk.size(3) : nullptr};
}

// Selection head `sel`'s query heads (G of them shared, else one) over part c of its nn pages (parts as even as
// whole pages allow): their partials in part[] at task t.
template <typename T>
void attend_part(const Shape& s, const float* qp, const at::Tensor& pk, const at::Tensor& pv, const Scales& ks,
                 const Scales& vs, const int64_t* pg, const uint64_t* heads, bool by_head, int64_t nn, bool per_head,
                 float scale,
                 int64_t sel, int64_t c, int64_t parts, std::vector<float>* part, int64_t t, GroupScratch& sc) {
  const int64_t Hsel = per_head ? s.Hq : s.Hkv, b = sel / Hsel, hs = sel % Hsel, G = per_head ? 1 : s.G;
  const int64_t h = per_head ? hs / s.G : hs, first = per_head ? hs : hs * s.G;  // KV head, first query head
  const int64_t np = pages_of(pg + sel * nn, nn), a = c * np / parts, e = (c + 1) * np / parts;
  const Partial out{part[0].data() + t * G, part[1].data() + t * G, part[2].data() + t * G * s.Dv};
  group_partial(qp + (b * s.Hq + first) * s.D, G, head_kv<T>(pk, pv, ks, vs, b, h), pg + sel * nn + a, e - a,
                Dims{s.P, s.D, s.Dv, s.length}, scale, out, sc, heads ? heads + sel * nn + a : nullptr, by_head);
}

// out (B, Hq, Dv), lse (B, Hq): each query head over its selection head's pages, a KV group's heads together
// (each page read once for them), split in parts when there are fewer selection heads than twice the threads.
// ---- per-head choices read once per KV group: the union of the group's pages, each page's heads ----

struct GroupUnion {                               // (B * Hkv, nn) rows: ascending pages then -1, and per page
  std::vector<int64_t> pages;                     // the bits of the group's query heads that chose it
  std::vector<uint64_t> heads;
  int64_t nn = 0;                                 // the widest union
  bool by_head = false;                           // each page's sums only for the heads that chose it
};

// Each KV group's query heads' own pages (per-head rows of pg, (b, hq) = row (b * Hkv + h) * G + g) merged, the
// union read once for the G heads. Groups of more than kBySums heads (Qwen2.5's 6 and 7) always read their union,
// each page's logits and values summed only for the heads that chose it (page_logits, page_values): each head
// reading its own pages read a page up to G times. Smaller groups read their union with every head's sums
// (the others masked) where that costs less than each head reading its own: a row read and widened costs about
// two dots, so |union| (2 + G) against sum(pages) (2 + 1); measured on SmolLM2's groups of 3 at 8K, this beat
// the per-head sums (17.2 / 18.2 against 21.0 / 20.5 ms a step), and on Qwen2.5 0.5B's groups of 7 the per-head
// sums beat it (50.2 / 55.0 against 55.3 / 71.7 ms). Empty (nn 0) when neither, or G is 1 or above 64.
constexpr int64_t kBySums = 4;

GroupUnion group_union(const Shape& s, const int64_t* pg, int64_t nn) {
  GroupUnion u;
  if (s.G < 2 || s.G > 64) return u;
  const int64_t groups = s.B * s.Hkv;
  std::vector<uint64_t> marks(static_cast<size_t>(groups * s.N), 0);
  int64_t own = 0, merged = 0, widest = 0;
  for (int64_t grp = 0; grp < groups; ++grp) {
    uint64_t* m = marks.data() + grp * s.N;
    for (int64_t g = 0; g < s.G; ++g) {
      const int64_t* row = pg + (grp * s.G + g) * nn;
      const int64_t k = pages_of(row, nn);
      own += k;
      for (int64_t i = 0; i < k; ++i) m[row[i]] |= uint64_t{1} << g;
    }
    const int64_t count = s.N - std::count(m, m + s.N, uint64_t{0});
    merged += count;
    widest = std::max(widest, count);
  }
  u.by_head = s.G > kBySums;
  if (!u.by_head && merged * (2 + s.G) > own * 3) return u;
  u.nn = widest;
  u.pages.assign(static_cast<size_t>(groups * widest), -1);
  u.heads.assign(static_cast<size_t>(groups * widest), 0);
  for (int64_t grp = 0; grp < groups; ++grp)
    for (int64_t p = 0, k = 0; p < s.N; ++p)
      if (const uint64_t bits = marks[grp * s.N + p]) {
        u.pages[grp * widest + k] = p;
        u.heads[grp * widest + k++] = bits;
      }
  return u;
}

template <typename T>
void attend_all(const Shape& s, const float* qp, const at::Tensor& pk, const at::Tensor& pv, const Scales& ks,
                const Scales& vs, const int64_t* pg, int64_t nn, bool per_head, float scale, float* op, float* lp,
                const uint64_t* heads = nullptr, bool by_head = false) {
  if (per_head) {                                  // a group's heads over their union, where group_union says so
    const GroupUnion u = group_union(s, pg, nn);
    if (u.nn > 0)
      return attend_all<T>(s, qp, pk, pv, ks, vs, u.pages.data(), u.nn, false, scale, op, lp, u.heads.data(), u.by_head);
  }
  const int64_t sels = s.B * (per_head ? s.Hq : s.Hkv), G = per_head ? 1 : s.G;
  // parts from the sizes alone (as if 16 threads), never the thread count: the same sums whatever runs them
  const int64_t parts = std::max<int64_t>(1, std::min(nn / 8, gl::ceil_div(kSplitTasks, sels)));
  std::vector<float> part[3] = {std::vector<float>(sels * parts * G), std::vector<float>(sels * parts * G),
                                std::vector<float>(sels * parts * G * s.Dv)};  // max, sum, weighted values
  gl::for_each_task<GroupScratch>(sels * parts, [&](int64_t t, GroupScratch& sc) {
    attend_part<T>(s, qp, pk, pv, ks, vs, pg, heads, by_head, nn, per_head, scale, t / parts, t % parts, parts, part,
                   t, sc);
  });
  for (int64_t sel = 0; sel < sels; ++sel)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = per_head ? sel : (sel / s.Hkv) * s.Hq + (sel % s.Hkv) * s.G + g;
      const int64_t at = sel * parts * G + g;
      lp[head] = finish(part[0].data() + at, part[1].data() + at, part[2].data() + at * s.Dv, parts, G, s.Dv,
                        op + head * s.Dv);
    }
}

// Calls f(T{}) with the pages' stored type: float, c10::Half, c10::BFloat16, int8_t.
template <typename F>
void on_stored_type(at::ScalarType t, const F& f) {
  switch (t) {
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kChar: return f(int8_t{});
    default: return f(float{});
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> paged_decode_cpu(
    const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const at::Tensor& s, int64_t length,
    int64_t n, int64_t first_recent, double scale, bool per_head, bool group_sum, const Scales& ks,
    const Scales& vs, double mass, int64_t min_pages) {
  check_inputs(q, pk, pv, s, length, n, ks, vs);
  const int64_t Hq = q.size(1), Hkv = pk.size(1), P = pk.size(3);
  const Shape sh{q.size(0), Hq, Hkv, Hq / Hkv, q.size(2), pv.size(4), P, gl::page_count(length, P), length};
  const int64_t Hsel = per_head ? Hq : Hkv, nn = std::min(n, sh.N);
  at::Tensor bounds = at::empty({sh.B, Hkv, sh.G, sh.N}, q.options());
  at::Tensor pages = at::empty({sh.B, Hsel, nn}, q.options().dtype(at::kLong));
  at::Tensor out = at::empty({sh.B, Hq, sh.Dv}, q.options()), lse = at::empty({sh.B, Hq}, q.options());
  on_stored_type(s.scalar_type(), [&](auto t) {
    using S = decltype(t);
    score_pages<S>(sh, q.data_ptr<float>(), s.data_ptr<S>(), gl::strides_of(s), bounds.data_ptr<float>());
  });
  TORCH_CHECK(mass <= 1.0 && min_pages >= 1, "paged_decode: mass ", mass, " must be <= 1 (<= 0: n pages) and min_pages ",
              min_pages, " >= 1");
  const MassRule rule{static_cast<float>(mass), static_cast<float>(scale), min_pages, P, length};
  choose_all(sh, bounds.data_ptr<float>(), nn, first_recent, per_head, group_sum, rule, pages.data_ptr<int64_t>());
  on_stored_type(pk.scalar_type(), [&](auto t) {
    attend_all<decltype(t)>(sh, q.data_ptr<float>(), pk, pv, ks, vs, pages.data_ptr<int64_t>(), nn, per_head,
                            static_cast<float>(scale), out.data_ptr<float>(), lse.data_ptr<float>());
  });
  return {out, lse, pages, bounds};
}

// ---- dense_decode: every cached token, split-K over the threads ----

void check_dense(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, int64_t length, const Scales& ks,
                 const Scales& vs) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && q.scalar_type() == at::kFloat, "dense_decode: q must be (B, Hq, D) float32");
  TORCH_CHECK(pk.dim() == 5 && pv.dim() == 5 && stored_type(pk.scalar_type()) && pv.scalar_type() == pk.scalar_type() &&
                  pk.stride(4) == 1 && pk.stride(3) == pk.size(4) && pv.stride(4) == 1 && pv.stride(3) == pv.size(4) &&
                  pk.stride(2) == pk.size(3) * pk.size(4) && pv.stride(2) == pv.size(3) * pv.size(4),
              "dense_decode: page_keys / page_values must be float32, float16, bfloat16 or int8 storage with contiguous "
              "pages");
  check_scales("dense_decode", pk, ks, vs);
  TORCH_CHECK(pv.sizes().slice(0, 4) == pk.sizes().slice(0, 4) && pk.size(4) >= 1 && pv.size(4) >= 1,
              "dense_decode: page_values ", pv.sizes(), " must hold page_keys' ", pk.sizes().slice(0, 4),
              " pages, each row at least one wide");
  gl::check_heads("dense_decode", q.size(1), pk.size(1));
  TORCH_CHECK(pk.size(0) == q.size(0) && pk.size(4) == q.size(2), "dense_decode: q ", q.sizes(),
              " does not match the cache ", pk.sizes());
  TORCH_CHECK(length >= 1 && length <= pk.size(2) * pk.size(3), "dense_decode: length ", length, " is outside the storage");
}

// Dense decode over every cached token, read in place: each task is one KV head's chunk of pages, its G
// query heads together (each key and value row read once for them); the chunks' partials combine by
// log-sum-exp (a split-K), so a few KV heads still use every thread.
template <typename T>
void dense_tasks(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv, const Scales& ks, const Scales& vs,
                 int64_t length, float scale, int64_t chunks, int64_t per_chunk, std::vector<float>* part) {
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = pk.size(1), Dv = pv.size(4), G = Hq / Hkv, P = pk.size(3);
  const int64_t N = gl::page_count(length, P);
  const float* qp = q.data_ptr<float>();
  gl::for_each_task<GroupScratch>(q.size(0) * Hkv * chunks, [&](int64_t t, GroupScratch& sc) {
    const int64_t bh = t / chunks, c = t % chunks, b = bh / Hkv, h = bh % Hkv;
    const int64_t p0 = c * per_chunk, p1 = std::min(N, p0 + per_chunk);
    std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(0, p1 - p0)));
    for (int64_t p = p0; p < p1; ++p) ids[p - p0] = p;
    const Partial out{part[0].data() + t * G, part[1].data() + t * G, part[2].data() + t * G * Dv};
    group_partial(qp + (b * Hq + h * G) * D, G, head_kv<T>(pk, pv, ks, vs, b, h), ids.data(), p1 - p0,
                  Dims{P, D, Dv, length}, scale, out, sc);
  });
}

std::tuple<at::Tensor, at::Tensor> dense_decode_cpu(const at::Tensor& q, const at::Tensor& pk, const at::Tensor& pv,
                                                    int64_t length, double scale, const Scales& ks, const Scales& vs) {
  check_dense(q, pk, pv, length, ks, vs);
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = pk.size(1), Dv = pv.size(4), G = Hq / Hkv;
  constexpr int64_t kRows = 512, kMinRows = 64;     // rows per task (whole pages): at most, and at least when
  const int64_t P = pk.size(3), N = gl::page_count(length, P);  // splitting more keeps every thread busy
  const int64_t tasks_wanted = 2 * kSplitTasks, heads = B * Hkv;  // the sizes alone, not the thread count
  const int64_t rows = std::clamp(gl::ceil_div(length, gl::ceil_div(tasks_wanted, heads)), kMinRows, kRows);
  const int64_t per_chunk = std::max<int64_t>(1, std::min(N, rows / P));
  const int64_t chunks = gl::ceil_div(N, per_chunk), tasks = B * Hkv * chunks;
  std::vector<float> part[3] = {std::vector<float>(tasks * G), std::vector<float>(tasks * G),
                                std::vector<float>(tasks * G * Dv)};  // max, sum, weighted values
  on_stored_type(pk.scalar_type(), [&](auto t) {
    dense_tasks<decltype(t)>(q, pk, pv, ks, vs, length, static_cast<float>(scale), chunks, per_chunk, part);
  });
  at::Tensor out = at::empty({B, Hq, Dv}, q.options()), lse = at::empty({B, Hq}, q.options());
  float* op = out.data_ptr<float>();
  float* lp = lse.data_ptr<float>();
  for (int64_t bh = 0; bh < B * Hkv; ++bh)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = (bh / Hkv) * Hq + (bh % Hkv) * G + g, first = bh * chunks * G + g;
      lp[head] = finish(part[0].data() + first, part[1].data() + first, part[2].data() + first * Dv, chunks, G, Dv,
                        op + head * Dv);
    }
  return {out, lse};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("paged_decode(Tensor q, Tensor page_keys, Tensor page_values, Tensor summaries, int length, int n, "
        "int first_recent, float scale, bool per_head, bool group_sum, Tensor? key_scales=None, "
        "Tensor? value_scales=None, float mass=0., int min_pages=1) -> (Tensor out, Tensor lse, Tensor pages, "
        "Tensor bounds)");
  m.def("dense_decode(Tensor q, Tensor page_keys, Tensor page_values, int length, float scale, "
        "Tensor? key_scales=None, Tensor? value_scales=None) -> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("paged_decode", &paged_decode_cpu);
  m.impl("dense_decode", &dense_decode_cpu);
}
