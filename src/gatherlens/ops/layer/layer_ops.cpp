// The elementwise pieces of one decoder-layer step, each one operator instead of several torch calls:
//
//   torch.ops.gatherlens.rms_norm_cast(x, w, eps, bf16) -> h
//   torch.ops.gatherlens.add_rms_norm_cast(x, y, w, eps, bf16) -> (x + y, h)
//   torch.ops.gatherlens.silu_mul_cast(gu, bf16) -> a
//   torch.ops.gatherlens.rope_append(q, k, v, cos, sin, keys, values, summaries, position) -> q_rot
//
// With one token a step these are tiny (a few thousand floats) and what they cost is the call:
// each torch call is a few microseconds of dispatch, ~60 of them a layer. Same arithmetic as the
// torch references in ops/layer/naive.py, in float32 (results equal them up to the order of a sum):
//   rms_norm_cast:     h = w * (x / sqrt(mean(x^2) + eps)), rounded to bfloat16 when bf16 (the int4
//                      matmul's activation dtype), else float32; rows of x (R, d) float32;
//   add_rms_norm_cast: the residual x + y (y float32 or bfloat16) in float32, and h of it;
//   silu_mul_cast:     silu(gu[:, :I]) * gu[:, I:] for gu (R, 2I) float32 or bfloat16;
//   rope_append:       transformers' rotary embedding x cos + rotate_half(x) sin of q (B, Hq*D) and
//                      k (B, Hkv*D) (float32 or bfloat16 rows, last dim contiguous), k and v written
//                      at `position` of a PagedKVCache's storage keys (B, Hkv, cap, P, D), values
//                      (B, Hkv, cap, P, Dv) and that page's [max | min] summary (B, Hkv, cap, 2D)
//                      updated (a new page's box is the key itself); returns q rotated (B, Hq, D) float32.
// Built by gatherlens/ops/native.py; fake kernels in ops/layer/fused.py.
#include <cmath>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "gatherlens/common.h"

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

template <typename T, typename O>
void silu_rows(const T* gu, int64_t gs, O* out, int64_t R, int64_t I) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const float g = load(gu + r * gs, i), u = load(gu + r * gs, I + i);
      out[r * I + i] = static_cast<O>((g * gl::sigmoid(g)) * u);
    }
}

at::Tensor silu_mul_cast_cpu(const at::Tensor& gu, bool bf16) {
  check_rows(gu, "gu");
  TORCH_CHECK(gu.size(1) % 2 == 0, "gu must be (R, 2I): gate | up, got width ", gu.size(1));
  const int64_t R = gu.size(0), I = gu.size(1) / 2;
  at::Tensor out = rows_out(gu, R, I, bf16);
  const bool in_bf = gu.scalar_type() == at::kBFloat16;
  if (in_bf && bf16) silu_rows(gu.data_ptr<c10::BFloat16>(), gu.stride(0), out.data_ptr<c10::BFloat16>(), R, I);
  else if (in_bf) silu_rows(gu.data_ptr<c10::BFloat16>(), gu.stride(0), out.data_ptr<float>(), R, I);
  else if (bf16) silu_rows(gu.data_ptr<float>(), gu.stride(0), out.data_ptr<c10::BFloat16>(), R, I);
  else silu_rows(gu.data_ptr<float>(), gu.stride(0), out.data_ptr<float>(), R, I);
  return out;
}

// x (D,) rotated into o: o[i] = x[i] cos[i] - x[i + D/2] sin[i] (first half), x[i] cos[i] + x[i - D/2] sin[i]
template <typename T>
void rotate(const T* x, const float* c, const float* s, int64_t D, float* o) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) o[i] = load(x, i) * c[i] + (-load(x, i + h)) * s[i];
  for (int64_t i = h; i < D; ++i) o[i] = load(x, i) * c[i] + load(x, i - h) * s[i];
}

struct Cache {
  float *k, *v, *s;
  gl::Strides ks, vs, ss;
  int64_t P, D, Dv;
};

template <typename T>
void write_token(const T* k, const T* v, int64_t b, int64_t h, const float* c, const float* s, const Cache& m,
                 int64_t position) {
  const int64_t page = position / m.P, slot = position % m.P;
  float* kd = m.k + b * m.ks.b + h * m.ks.h + page * m.ks.n + slot * m.D;
  rotate(k + h * m.D, c, s, m.D, kd);
  float* vd = m.v + b * m.vs.b + h * m.vs.h + page * m.vs.n + slot * m.Dv;
  for (int64_t i = 0; i < m.Dv; ++i) vd[i] = load(v + h * m.Dv, i);
  float* box = m.s + b * m.ss.b + h * m.ss.h + page * m.ss.n;  // [max | min]
  for (int64_t i = 0; i < m.D; ++i) {
    box[i] = slot == 0 ? kd[i] : std::max(box[i], kd[i]);
    box[m.D + i] = slot == 0 ? kd[i] : std::min(box[m.D + i], kd[i]);
  }
}

void check_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                const at::Tensor& sin, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& sums,
                int64_t position) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
  TORCH_CHECK(keys.dim() == 5 && keys.is_contiguous() && values.dim() == 5 && values.is_contiguous() &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "keys / values must be a float32 cache's storage (B, Hkv, cap, P, D)");
  TORCH_CHECK(sums.dim() == 4 && sums.is_contiguous() && sums.scalar_type() == at::kFloat &&
                  sums.size(3) == 2 * keys.size(4), "summaries must be (B, Hkv, cap, 2D) float32");
  const int64_t B = keys.size(0), Hkv = keys.size(1), D = keys.size(4);
  TORCH_CHECK(cos.dim() == 2 && sin.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.size(0) == B &&
                  cos.size(1) == D && sin.sizes() == cos.sizes(), "cos / sin must be (B, D) float32, D = ", D);
  TORCH_CHECK(D % 2 == 0, "head_dim must be even for the rotary embedding, got ", D);
  TORCH_CHECK(q.size(0) == B && k.size(0) == B && v.size(0) == B && k.size(1) == Hkv * D &&
                  v.size(1) == Hkv * values.size(4) && q.size(1) % D == 0, "q, k, v do not match the cache");
  TORCH_CHECK(position >= 0 && position < keys.size(2) * keys.size(3), "position ", position,
              " is outside the cache's storage of ", keys.size(2) * keys.size(3), " tokens");
}

template <typename T>
void rope_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const float* c, const float* s,
               const Cache& m, int64_t position, float* qo, int64_t B, int64_t Hq, int64_t Hkv) {
  for (int64_t b = 0; b < B; ++b) {
    const float* cb = c + b * m.D;
    const float* sb = s + b * m.D;
    const T* qb = q.data_ptr<T>() + b * q.stride(0);
    for (int64_t h = 0; h < Hq; ++h) rotate(qb + h * m.D, cb, sb, m.D, qo + (b * Hq + h) * m.D);
    for (int64_t h = 0; h < Hkv; ++h)
      write_token(k.data_ptr<T>() + b * k.stride(0), v.data_ptr<T>() + b * v.stride(0), b, h, cb, sb, m, position);
  }
}

at::Tensor rope_append_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                           const at::Tensor& sin, at::Tensor& keys, at::Tensor& values, at::Tensor& sums,
                           int64_t position) {
  check_rope(q, k, v, cos, sin, keys, values, sums, position);
  const int64_t B = keys.size(0), Hkv = keys.size(1), D = keys.size(4), Hq = q.size(1) / D;
  Cache m{keys.data_ptr<float>(), values.data_ptr<float>(), sums.data_ptr<float>(), gl::strides_of(keys),
          gl::strides_of(values), gl::strides_of(sums), keys.size(3), D, values.size(4)};
  at::Tensor qo = at::empty({B, Hq, D}, keys.options());
  if (q.scalar_type() == at::kBFloat16)
    rope_rows<c10::BFloat16>(q, k, v, cos.data_ptr<float>(), sin.data_ptr<float>(), m, position,
                             qo.data_ptr<float>(), B, Hq, Hkv);
  else
    rope_rows<float>(q, k, v, cos.data_ptr<float>(), sin.data_ptr<float>(), m, position, qo.data_ptr<float>(), B,
                     Hq, Hkv);
  return qo;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("rms_norm_cast(Tensor x, Tensor w, float eps, bool bf16) -> Tensor");
  m.def("add_rms_norm_cast(Tensor x, Tensor y, Tensor w, float eps, bool bf16) -> (Tensor, Tensor)");
  m.def("silu_mul_cast(Tensor gu, bool bf16) -> Tensor");
  m.def("rope_append(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor(c!) summaries, int position) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) {
  m.impl("rms_norm_cast", &rms_norm_cast_cpu);
  m.impl("add_rms_norm_cast", &add_rms_norm_cast_cpu);
  m.impl("silu_mul_cast", &silu_mul_cast_cpu);
  m.impl("rope_append", &rope_append_cpu);
}
