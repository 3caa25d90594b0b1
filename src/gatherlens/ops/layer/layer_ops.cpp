// The elementwise pieces of one decoder-layer step, each one operator instead of several torch calls:
//
//   torch.ops.gatherlens.rms_norm_cast(x, w, eps, bf16) -> h
//   torch.ops.gatherlens.add_rms_norm_cast(x, y, w, eps, bf16) -> (x + y, h)
//   torch.ops.gatherlens.silu_mul_cast(gu, bf16) -> a
//   torch.ops.gatherlens.gelu_mul_cast(gu, bf16) -> a
//   torch.ops.gatherlens.rope_append(q, k, v, cos, sin, keys, values, summaries, position, key_scales,
//                                    value_scales) -> q_rot
//
// With one token a step these are tiny (a few thousand floats) and what they cost is the call:
// each torch call is a few microseconds of dispatch, ~60 of them a layer. Same arithmetic as the
// torch references in ops/layer/naive.py, in float32 (results equal them up to the order of a sum):
//   rms_norm_cast:     h = w * (x / sqrt(mean(x^2) + eps)), rounded to bfloat16 when bf16 (the int4
//                      matmul's activation dtype), else float32; rows of x (R, d) float32;
//   add_rms_norm_cast: the residual x + y (y float32 or bfloat16) in float32, and h of it;
//   silu_mul_cast:     silu(gu[:, :I]) * gu[:, I:] for gu (R, 2I) float32 or bfloat16;
//   gelu_mul_cast:     the same with gelu's tanh approximation (GeGLU: Gemma's MLP),
//                      0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * u;
//   rope_append:       transformers' rotary embedding x cos + rotate_half(x) sin of q (B, Hq*D) and
//                      k (B, Hkv*D) (float32 or bfloat16 rows, last dim contiguous), k and v written
//                      at `position` of a PagedKVCache's storage keys (B, Hkv, cap, P, D), values
//                      (B, Hkv, cap, P, Dv) and that page's [max | min] summary (B, Hkv, cap, 2D)
//                      updated (a new page's box is the key itself); returns q rotated (B, Hq, D) float32.
//                      Pages are float32, float16, bfloat16 (the rounded value stored, the box of the
//                      stored values) or int8 with key_scales (B, Hkv, cap, D) per page channel and
//                      value_scales (B, Hkv, cap, P) per token, float32, by ops/sparse/cache.py's rule
//                      (kv_pages.h: grown_scale, quantize; a key page whose channel scale grows has that
//                      channel's earlier codes re-rounded and its box recomputed).
// Built by gatherlens/ops/native.py; fake kernels in ops/layer/fused.py.
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "gatherlens/common.h"
#include "gatherlens/kv_pages.h"

namespace {

namespace gl = gatherlens;

template <typename T>
inline float load(const T* p, int64_t i) { return static_cast<float>(p[i]); }

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, " must be (R, d) with its last dim contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", x.scalar_type());
}

at::Tensor rows_out(const at::Tensor& x, int64_t R, int64_t d, bool bf16) {
  return at::empty({R, d}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
}

// h row = w * x / rms(x), written as float or bf16
void norm_row(const float* x, const float* w, int64_t d, double eps, at::Tensor& h, int64_t r) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<float>(ss / d) + eps));
  if (h.scalar_type() == at::kBFloat16) {
    auto* o = h.data_ptr<c10::BFloat16>() + r * d;
    for (int64_t i = 0; i < d; ++i) o[i] = c10::BFloat16(w[i] * (x[i] * inv));
  } else {
    float* o = h.data_ptr<float>() + r * d;
    for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (x[i] * inv);
  }
}

void check_norm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x must be (R, d) float32 contiguous");
  TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.scalar_type() == at::kFloat && w.size(0) == x.size(1),
              "w must be (d,) float32, d = ", x.size(1));
}

at::Tensor rms_norm_cast_cpu(const at::Tensor& x, const at::Tensor& w, double eps, bool bf16) {
  check_norm(x, w);
  const int64_t R = x.size(0), d = x.size(1);
  at::Tensor h = rows_out(x, R, d, bf16);
  for (int64_t r = 0; r < R; ++r) norm_row(x.data_ptr<float>() + r * d, w.data_ptr<float>(), d, eps, h, r);
  return h;
}

template <typename T>
void add_rows(const float* x, const T* y, int64_t ys, float* s, int64_t R, int64_t d) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < d; ++i) s[r * d + i] = x[r * d + i] + load(y + r * ys, i);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cast_cpu(const at::Tensor& x, const at::Tensor& y,
                                                        const at::Tensor& w, double eps, bool bf16) {
  check_norm(x, w);
  check_rows(y, "y");
  TORCH_CHECK(y.size(0) == x.size(0) && y.size(1) == x.size(1), "y must have x's shape ", x.sizes());
  const int64_t R = x.size(0), d = x.size(1);
  at::Tensor s = at::empty({R, d}, x.options());
  if (y.scalar_type() == at::kBFloat16)
    add_rows(x.data_ptr<float>(), y.data_ptr<c10::BFloat16>(), y.stride(0), s.data_ptr<float>(), R, d);
  else
    add_rows(x.data_ptr<float>(), y.data_ptr<float>(), y.stride(0), s.data_ptr<float>(), R, d);
  at::Tensor h = rows_out(x, R, d, bf16);
  for (int64_t r = 0; r < R; ++r) norm_row(s.data_ptr<float>() + r * d, w.data_ptr<float>(), d, eps, h, r);
  return {s, h};
}

struct Silu {
  static float apply(float g) { return g * gl::sigmoid(g); }
};

struct GeluTanh {  // gelu's tanh approximation, as torch's gelu(approximate="tanh"): 0.5 g (1 + tanh(z)) is
                  // g sigmoid(2 z), whose exp vectorizes (std::tanh did not: 130 us for Gemma 3 1B's 6,912)
  static float apply(float g) { return g * gl::sigmoid(1.5957691216057308f * (g + 0.044715f * g * g * g)); }
};

template <typename Act, typename T, typename O>
void glu_rows(const T* gu, int64_t gs, O* out, int64_t R, int64_t I) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const float g = load(gu + r * gs, i), u = load(gu + r * gs, I + i);
      out[r * I + i] = static_cast<O>(Act::apply(g) * u);
    }
}

template <typename Act>
at::Tensor glu_cast_cpu(const at::Tensor& gu, bool bf16) {
  check_rows(gu, "gu");
  TORCH_CHECK(gu.size(1) % 2 == 0, "gu must be (R, 2I): gate | up, got width ", gu.size(1));
  const int64_t R = gu.size(0), I = gu.size(1) / 2;
  at::Tensor out = rows_out(gu, R, I, bf16);
  const bool in_bf = gu.scalar_type() == at::kBFloat16;
  if (in_bf && bf16) glu_rows<Act>(gu.data_ptr<c10::BFloat16>(), gu.stride(0), out.data_ptr<c10::BFloat16>(), R, I);
  else if (in_bf) glu_rows<Act>(gu.data_ptr<c10::BFloat16>(), gu.stride(0), out.data_ptr<float>(), R, I);
  else if (bf16) glu_rows<Act>(gu.data_ptr<float>(), gu.stride(0), out.data_ptr<c10::BFloat16>(), R, I);
  else glu_rows<Act>(gu.data_ptr<float>(), gu.stride(0), out.data_ptr<float>(), R, I);
  return out;
}

at::Tensor silu_mul_cast_cpu(const at::Tensor& gu, bool bf16) { return glu_cast_cpu<Silu>(gu, bf16); }

at::Tensor gelu_mul_cast_cpu(const at::Tensor& gu, bool bf16) { return glu_cast_cpu<GeluTanh>(gu, bf16); }

// x (D,) rotated into o: o[i] = x[i] cos[i] - x[i + D/2] sin[i] (first half), x[i] cos[i] + x[i - D/2] sin[i]
template <typename T>
void rotate(const T* x, const float* c, const float* s, int64_t D, float* o) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) o[i] = load(x, i) * c[i] + (-load(x, i + h)) * s[i];
  for (int64_t i = h; i < D; ++i) o[i] = load(x, i) * c[i] + load(x, i - h) * s[i];
}

template <typename S, typename Bx>
struct Cache {                                    // a PagedKVCache's storage, pages of S, summaries of Bx
  S *k, *v;
  Bx* s;                                          // summaries: float32, or the 16-bit pages' own type
  float *ks, *vs;                                 // int8 scales: keys (B, Hkv, cap, D), values (B, Hkv, cap, P)
  gl::Strides kst, vst, sst;
  int64_t P, D, Dv, cap, Hkv;
};

// An int8 key page (P, W) gets x (W,) at `slot` by cache.py's rule, per channel (scales (W,)); returns true
// when a channel's scale grew (that channel's earlier codes re-rounded to it).
bool store_key_int8(const float* x, int64_t W, int8_t* page, int64_t slot, float* scales) {
  bool grew = false;
  for (int64_t i = 0; i < W; ++i) {
    const float old = slot ? scales[i] : 0.f;    // a fresh page starts from 0
    const float s = gl::grown_scale(std::fabs(x[i]), old);
    if (!(s == old) && slot) {
      grew = true;
      for (int64_t r = 0; r < slot; ++r) page[r * W + i] = gl::quantize(static_cast<float>(page[r * W + i]) * old, s);
    }
    page[slot * W + i] = gl::quantize(x[i], s);
    scales[i] = s;
  }
  return grew;
}

// An int8 value token x (W,) into `slot` of its page (P, W): its own scale max |x| / 127 (scale: the slot's).
void store_value_int8(const float* x, int64_t W, int8_t* page, int64_t slot, float* scale) {
  float amax = 0.f;
  for (int64_t i = 0; i < W; ++i) {
    const float a = std::fabs(x[i]);
    amax = (a > amax || a != a) ? a : amax;       // torch's amax: nan wins
  }
  const float s = gl::grown_scale(amax, 0.f);
  for (int64_t i = 0; i < W; ++i) page[slot * W + i] = gl::quantize(x[i], s);
  *scale = s;
}

// x (W,) float32 into `slot` of a page (P, W) of S (rounded to S); returns whether an int8 key scale grew.
// scales: an int8 key page's channel scales (W,), or a value page's token scales (P,); nullptr for floats.
template <typename S>
bool store_row(const float* x, int64_t W, S* page, int64_t slot, float* scales, bool key) {
  if constexpr (std::is_same_v<S, int8_t>) {
    if (key) return store_key_int8(x, W, page, slot, scales);
    store_value_int8(x, W, page, slot, scales + slot);
    return false;
  } else {
    for (int64_t i = 0; i < W; ++i) page[slot * W + i] = gl::narrow<S>(x[i]);
    return false;
  }
}

// The page's [max | min] box of its keys as read, slots 0..slot: from scratch for a new or re-scaled
// page, else the new key joins the box (Bx holds them exactly: float32, or the 16-bit pages' own type).
// row: room for D floats.
template <typename S, typename Bx>
void update_box(const S* page, int64_t slot, bool rescaled, const float* scales, int64_t D, Bx* box, float* row) {
  for (int64_t r = rescaled ? 0 : slot; r <= slot; ++r) {
    gl::widen_channels(page + r * D, D, scales, row);
    for (int64_t i = 0; i < D; ++i) {
      const float hi = static_cast<float>(box[i]), lo = static_cast<float>(box[D + i]);
      box[i] = gl::narrow<Bx>(r == 0 ? row[i] : std::max(hi, row[i]));
      box[D + i] = gl::narrow<Bx>(r == 0 ? row[i] : std::min(lo, row[i]));
    }
  }
}

template <typename T, typename S, typename Bx>
void write_token(const T* k, const T* v, int64_t b, int64_t h, const float* c, const float* s, const Cache<S, Bx>& m,
                 int64_t position, float* buf) {
  const int64_t page = position / m.P, slot = position % m.P, at = (b * m.Hkv + h) * m.cap + page;
  float* ksc = m.ks ? m.ks + at * m.D : nullptr;  // the page's channel scales (D,)
  float* vsc = m.vs ? m.vs + at * m.P : nullptr;  // its token scales (P,)
  S* kp = m.k + b * m.kst.b + h * m.kst.h + page * m.kst.n;
  rotate(k + h * m.D, c, s, m.D, buf);           // the rotated key in float32
  const bool rescaled = store_row(buf, m.D, kp, slot, ksc, true);
  for (int64_t i = 0; i < m.Dv; ++i) buf[i] = load(v + h * m.Dv, i);
  store_row(buf, m.Dv, m.v + b * m.vst.b + h * m.vst.h + page * m.vst.n, slot, vsc, false);
  update_box(kp, slot, rescaled, ksc, m.D, m.s + b * m.sst.b + h * m.sst.h + page * m.sst.n, buf);
}

void check_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& sums,
                int64_t position, const std::optional<at::Tensor>& ks, const std::optional<at::Tensor>& vs) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
  const auto st = keys.scalar_type();
  TORCH_CHECK(keys.dim() == 5 && keys.is_contiguous() && values.dim() == 5 && values.is_contiguous() &&
                  (st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kChar) &&
                  values.scalar_type() == st,
              "keys / values must be a cache's storage (B, Hkv, cap, P, D): float32, float16, bfloat16 or int8");
  TORCH_CHECK(values.sizes().slice(0, 4) == keys.sizes().slice(0, 4), "values ", values.sizes(),
              " must hold keys' (B, Hkv, cap, P) = ", keys.sizes().slice(0, 4));
  TORCH_CHECK((st == at::kChar) == ks.has_value() && (st == at::kChar) == vs.has_value(),
              "key_scales / value_scales must be given for int8 pages, and only for them");
  for (const auto* t : {&ks, &vs})
    TORCH_CHECK(!t->has_value() || ((*t)->is_contiguous() && (*t)->scalar_type() == at::kFloat && (*t)->dim() == 4 &&
                                    (*t)->sizes().slice(0, 3) == keys.sizes().slice(0, 3) &&
                                    (*t)->size(3) == (t == &ks ? keys.size(4) : keys.size(3))),
                "key_scales (B, Hkv, cap, D) / value_scales (B, Hkv, cap, P) must be float32 contiguous");
  const bool half = st == at::kHalf || st == at::kBFloat16;
  TORCH_CHECK(sums.dim() == 4 && sums.is_contiguous() &&
                  (sums.scalar_type() == at::kFloat || (half && sums.scalar_type() == st)) &&
                  sums.size(3) == 2 * keys.size(4) && sums.sizes().slice(0, 3) == keys.sizes().slice(0, 3),
              "summaries must be (B, Hkv, cap, 2D) float32 (or the 16-bit pages' dtype), got ", sums.sizes(),
              " for keys ", keys.sizes());
  const int64_t B = keys.size(0), Hkv = keys.size(1), D = keys.size(4);
  TORCH_CHECK(cos.dim() == 2 && sin.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.size(0) == B &&
                  cos.size(1) == D && sin.sizes() == cos.sizes(), "cos / sin must be (B, D) float32, D = ", D);
  TORCH_CHECK(D >= 2 && D % 2 == 0, "head_dim must be even (and at least 2) for the rotary embedding, got ", D);
  TORCH_CHECK(q.size(0) == B && k.size(0) == B && v.size(0) == B && k.size(1) == Hkv * D &&
                  v.size(1) == Hkv * values.size(4) && q.size(1) % D == 0, "q, k, v do not match the cache");
  TORCH_CHECK(position >= 0 && position < keys.size(2) * keys.size(3), "position ", position,
              " is outside the cache's storage of ", keys.size(2) * keys.size(3), " tokens");
}

template <typename T, typename S, typename Bx>
void rope_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const float* c, const float* s,
               const Cache<S, Bx>& m, int64_t position, float* qo, int64_t B, int64_t Hq) {
  std::vector<float> buf(std::max(m.D, m.Dv));
  for (int64_t b = 0; b < B; ++b) {
    const float* cb = c + b * m.D;
    const float* sb = s + b * m.D;
    const T* qb = q.data_ptr<T>() + b * q.stride(0);
    for (int64_t h = 0; h < Hq; ++h) rotate(qb + h * m.D, cb, sb, m.D, qo + (b * Hq + h) * m.D);
    for (int64_t h = 0; h < m.Hkv; ++h)
      write_token(k.data_ptr<T>() + b * k.stride(0), v.data_ptr<T>() + b * v.stride(0), b, h, cb, sb, m, position,
                  buf.data());
  }
}

template <typename S, typename Bx>
void rope_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
               const at::Tensor& sin, at::Tensor& keys, at::Tensor& values, at::Tensor& sums, int64_t position,
               const std::optional<at::Tensor>& ks, const std::optional<at::Tensor>& vs, at::Tensor& qo) {
  const int64_t B = keys.size(0), D = keys.size(4), Hq = q.size(1) / D;
  const Cache<S, Bx> m{keys.data_ptr<S>(), values.data_ptr<S>(), sums.data_ptr<Bx>(),
                   ks ? ks->data_ptr<float>() : nullptr, vs ? vs->data_ptr<float>() : nullptr,
                   gl::strides_of(keys), gl::strides_of(values), gl::strides_of(sums), keys.size(3), D,
                   values.size(4), keys.size(2), keys.size(1)};
  if (q.scalar_type() == at::kBFloat16)
    rope_rows<c10::BFloat16, S, Bx>(q, k, v, cos.data_ptr<float>(), sin.data_ptr<float>(), m, position,
                                qo.data_ptr<float>(), B, Hq);
  else
    rope_rows<float, S, Bx>(q, k, v, cos.data_ptr<float>(), sin.data_ptr<float>(), m, position, qo.data_ptr<float>(), B,
                        Hq);
}

at::Tensor rope_append_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                           const at::Tensor& sin, at::Tensor& keys, at::Tensor& values, at::Tensor& sums,
                           int64_t position, const std::optional<at::Tensor>& ks,
                           const std::optional<at::Tensor>& vs) {
  check_rope(q, k, v, cos, sin, keys, values, sums, position, ks, vs);
  const int64_t D = keys.size(4);
  at::Tensor qo = at::empty({keys.size(0), q.size(1) / D, D}, sums.options().dtype(at::kFloat));
  const bool own = sums.scalar_type() != at::kFloat;  // 16-bit summaries of 16-bit pages
  switch (keys.scalar_type()) {
    case at::kHalf:
      if (own) rope_into<c10::Half, c10::Half>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo);
      else rope_into<c10::Half, float>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo);
      break;
    case at::kBFloat16:
      if (own) rope_into<c10::BFloat16, c10::BFloat16>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo);
      else rope_into<c10::BFloat16, float>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo);
      break;
    case at::kChar: rope_into<int8_t, float>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo); break;
    default: rope_into<float, float>(q, k, v, cos, sin, keys, values, sums, position, ks, vs, qo);
  }
  return qo;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("rms_norm_cast(Tensor x, Tensor w, float eps, bool bf16) -> Tensor");
  m.def("add_rms_norm_cast(Tensor x, Tensor y, Tensor w, float eps, bool bf16) -> (Tensor, Tensor)");
  m.def("silu_mul_cast(Tensor gu, bool bf16) -> Tensor");
  m.def("gelu_mul_cast(Tensor gu, bool bf16) -> Tensor");
  m.def("rope_append(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor(c!) summaries, int position, Tensor(d!)? key_scales=None, Tensor(e!)? value_scales=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("rms_norm_cast", &rms_norm_cast_cpu);
  m.impl("add_rms_norm_cast", &add_rms_norm_cast_cpu);
  m.impl("silu_mul_cast", &silu_mul_cast_cpu);
  m.impl("gelu_mul_cast", &gelu_mul_cast_cpu);
  m.impl("rope_append", &rope_append_cpu);
}
