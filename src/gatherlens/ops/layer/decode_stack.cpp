// One decode step of a whole stack of decoder layers, and the head, in one operator:
//
//   torch.ops.gatherlens.decode_stack(x, cos, sin, heads, norms, eps, raws, kernels, qtypes, biases, keys,
//                                     values, summaries, key_scales, value_scales, writes, lengths, pages,
//                                     firsts, scale, per_head, group_sum, activation, final_norm, final_eps,
//                                     head_raw, head_kernel, head_qtype, mass, min_pages, counts, covered)
//                                     -> logits
//
// A step of one token through L layers is ~12 operators a layer; called from Python each costs its
// dispatch plus the Python around it (~150 us a layer, 30 layers: several ms a token). This
// operator runs the same operators in the same order on the same tensors, called from C++ straight
// to their CPU kernels (no Python, no autograd layer), so its result equals the planned step's
// (models/runtime/step.planned_layer, tested bit for bit). Per layer l (x (1, d) float32), with the
// norms of NORMS = 6 slots a layer (input, pre_mlp, q, k, post_attention, post_mlp; an empty tensor:
// absent):
//
//   h = rms_norm_cast(x, input);   q|k|v = h Wq|Wk|Wv (+ their biases, where given)
//   q, k = rms_norm_cast of each head with the q and k norms (Qwen3, Gemma 3), where given
//   q = rope_append(q, k, v, cos[l], sin[l], keys[l], values[l], summaries[l], writes[l], scales)
//   out = paged_decode(q, ..., lengths[l], pages[l], firsts[l], ..., mass, min_pages) if pages[l] >= 0
//         else dense_decode(q, ...)
//   (mass > 0: the auto budget, pages[l] its ceiling; counts (L, Hsel) int64, when given, gets the pages each
//   selection head of each layer read: every page for a dense layer; covered (L,) int64, when given, gets the
//   pages a paged layer's KV groups needed, each group the union of its heads' pages, summed (-1: read
//   densely), for ops/sparse/dense_runs.py's rule)
//   y = out Wo;   y = rms_norm_cast(y, post_attention) where given (Gemma's sandwich)
//   s, h = add_rms_norm_cast(x, y, pre_mlp);   a = act(h Wg) * h Wu  (activation: 0 SiLU, 1 GELU-tanh)
//   y = a Wd;   y = rms_norm_cast(y, post_mlp) where given;   x = s + y
//
// then logits = rms_norm_cast(x, final_norm) Whead (an empty head_kernel: x itself, before the final
// norm). `heads` is Hq, the query heads (q is Hq * D wide; k and v Hkv * D and Hkv * Dv, the cache's
// KV heads and widths). A product is `kernels[i]` (an operator name:
// "q8act_linear", "q8k_linear", "floatdot_linear"; a format's record names its own: `kernel` in
// ops/quant/formats/layout.py) on raws[i] (N, row_bytes) uint8 with ggml type qtypes[i], plus biases[i]
// (N,) float32 when not empty. Each layer has SLOTS = 7 products in the order q, k, v, o, gate, up, down;
// where the model packed q|k|v (gate|up) as one weight, slot q (gate) holds it and k, v (up) are empty
// ("" kernels). The cache storage of layer l (keys, values, summaries, int8 scales: PagedKVCache.writable
// / scale_storage) is written at writes[l] and read over its first lengths[l] tokens: a global layer's
// length and length + 1, a local layer's ring slot (position % window) and min(position + 1, window),
// read densely (pages[l] = -1); the caller counts the token (advance(1), WindowRing.written). cos[l],
// sin[l]: the angles of layer l's RoPE (Gemma 3: another base for its local layers).
// Batch 1, float32 activations. Built by gatherlens/ops/native.py; fake kernel in ops/layer/stack.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace {

constexpr int64_t SLOTS = 7;  // q, k, v, o, gate, up, down
enum Slot { Q = 0, K, V, O, GATE, UP, DOWN };
constexpr int64_t NORMS = 6;  // input, pre_mlp, q, k, post_attention, post_mlp
enum Norm { INPUT = 0, PRE_MLP, QN, KN, POST_ATTN, POST_MLP };

using Opt = std::optional<at::Tensor>;
using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);
using NormFn = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool);
using AddNormFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                      double, bool);
using GluFn = at::Tensor(const at::Tensor&, bool);
using RopeFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, int64_t, const Opt&, const Opt&);
using PagedFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, double,
    bool, bool, const Opt&, const Opt&, double, int64_t);
using DenseFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                                    double, const Opt&, const Opt&);

const c10::DispatchKeySet CPU_ONLY(c10::DispatchKey::CPU);  // straight to the CPU kernel: no autograd layer

template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(("gatherlens::" + name).c_str(), "").typed<Sig>();
}

struct Ops {  // the operators a step calls, found once (their libraries are loaded before the first call)
  c10::TypedOperatorHandle<NormFn> norm = handle<NormFn>("rms_norm_cast");
  c10::TypedOperatorHandle<AddNormFn> add_norm = handle<AddNormFn>("add_rms_norm_cast");
  c10::TypedOperatorHandle<GluFn> glu[2] = {handle<GluFn>("silu_mul_cast"), handle<GluFn>("gelu_mul_cast")};
  c10::TypedOperatorHandle<RopeFn> rope = handle<RopeFn>("rope_append");
  c10::TypedOperatorHandle<PagedFn> paged = handle<PagedFn>("paged_decode");
  c10::TypedOperatorHandle<DenseFn> dense = handle<DenseFn>("dense_decode");
  std::unordered_map<std::string, c10::TypedOperatorHandle<LinearFn>> linears;

  const c10::TypedOperatorHandle<LinearFn>& linear(const std::string& name) {
    auto it = linears.find(name);
    if (it == linears.end()) it = linears.emplace(name, handle<LinearFn>(name)).first;
    return it->second;
  }
};

Ops& ops() {
  static Ops o;
  return o;
}

struct Product {  // one weight: its blocks, the operator that multiplies them, its ggml type, its bias
  const at::Tensor* raw;
  const std::string* kernel;
  int64_t qtype;
  const at::Tensor* bias;  // (N,) float32, or empty: none
};

at::Tensor product(const at::Tensor& x, const Product& p) {  // x (1, K) -> (1, N)
  at::Tensor y = ops().linear(*p.kernel).redispatch(CPU_ONLY, x, *p.raw, p.qtype);
  if (p.bias != nullptr && p.bias->numel() > 0) {  // one float32 add per element, as the planned step's
    float* out = y.data_ptr<float>();
    const float* b = p.bias->data_ptr<float>();
    for (int64_t i = 0; i < y.size(1); ++i) out[i] += b[i];
  }
  return y;
}

// The products of one group (q|k|v, gate|up; an empty kernel name ends it) as one (1, sum N) row.
at::Tensor grouped(const at::Tensor& x, const std::vector<Product>& parts) {
  std::vector<at::Tensor> outs;
  for (const Product& p : parts)
    if (!p.kernel->empty()) outs.push_back(product(x, p));
  if (outs.size() == 1) return outs[0];
  int64_t width = 0;
  for (const auto& o : outs) width += o.size(1);
  at::Tensor row = at::empty({1, width}, x.options());
  float* dst = row.data_ptr<float>();
  for (const auto& o : outs) {
    std::memcpy(dst, o.data_ptr<float>(), o.size(1) * sizeof(float));
    dst += o.size(1);
  }
  return row;
}

struct LayerArgs {  // what layer l reads: its norms, products, angles and cache storage
  const at::Tensor* n[NORMS];
  double e[NORMS];
  std::vector<Product> p;  // SLOTS products
  const at::Tensor *cos, *sin;
  at::Tensor *keys, *values, *sums;
  const Opt *ks, *vs;
  int64_t write, length, pages, first;
  int64_t* counts;  // (Hsel,) pages each selection head read, or nullptr
  int64_t* covered;  // the pages its KV groups needed (-1: dense), or nullptr
};

struct StepArgs {  // what every layer shares
  int64_t Hq, D;
  double scale;
  bool per_head, group_sum;
  int64_t activation;  // 0: SiLU, 1: GELU-tanh
  double mass;         // > 0: the auto budget (paged_decode's), pages: its ceiling
  int64_t min_pages;
};

bool given(const at::Tensor* t) { return t->numel() > 0; }

// Each selection head's pages read (the -1 padding of the auto budget not counted) into counts (Hsel,).
void count_pages(const at::Tensor& pages, int64_t* counts) {  // pages (1, Hsel, n)
  const int64_t Hsel = pages.size(1), n = pages.size(2);
  const int64_t* pg = pages.data_ptr<int64_t>();
  for (int64_t h = 0; h < Hsel; ++h) {
    int64_t k = 0;
    while (k < n && pg[h * n + k] >= 0) ++k;
    counts[h] = k;
  }
}

// The pages the Hkv KV groups needed, summed: each group the union of its selection heads' pages (pages (1, Hsel,
// n), -1 padding not counted; N pages in use). dense_runs.covered_pages is the rule's home (tested equal).
int64_t covered_pages(const at::Tensor& pages, int64_t Hkv, int64_t N) {
  const int64_t Hsel = pages.size(1), n = pages.size(2), G = Hsel / Hkv;
  const int64_t* pg = pages.data_ptr<int64_t>();
  std::vector<uint8_t> mark(static_cast<size_t>(N));
  int64_t covered = 0;
  for (int64_t h = 0; h < Hkv; ++h) {
    std::fill(mark.begin(), mark.end(), 0);
    for (int64_t i = 0; i < G * n; ++i) {
      const int64_t p = pg[h * G * n + i];
      if (p >= 0 && p < N && !mark[p]) {
        mark[p] = 1;
        ++covered;
      }
    }
  }
  return covered;
}

at::Tensor attend(const at::Tensor& q, const LayerArgs& a, const StepArgs& s) {  // q (1, Hq, D) -> (1, Hq*Dv)
  at::Tensor out;
  if (a.pages >= 0) {
    auto r = ops().paged.redispatch(CPU_ONLY, q, *a.keys, *a.values, *a.sums, a.length, a.pages, a.first, s.scale,
                                    s.per_head, s.group_sum, *a.ks, *a.vs, s.mass, s.min_pages);
    out = std::get<0>(r);
    if (a.counts) count_pages(std::get<2>(r), a.counts);
    if (a.covered) *a.covered = covered_pages(std::get<2>(r), a.keys->size(1), std::get<3>(r).size(3));
  } else {
    if (a.covered) *a.covered = -1;
    out = std::get<0>(ops().dense.redispatch(CPU_ONLY, q, *a.keys, *a.values, a.length, s.scale, *a.ks, *a.vs));
    const int64_t every = (a.length + a.keys->size(3) - 1) / a.keys->size(3);
    if (a.counts) std::fill(a.counts, a.counts + (s.per_head ? s.Hq : a.keys->size(1)), every);
  }
  return out.view({1, -1});  // (1, Hq*Dv)
}

at::Tensor head_norm(const at::Tensor& t, const at::Tensor* w, double eps, int64_t D) {  // (1, H*D) -> (1, H*D)
  at::Tensor rows = t.contiguous().view({-1, D});                                        // (H, D)
  return ops().norm.redispatch(CPU_ONLY, rows, *w, eps, false).view({1, -1});
}

at::Tensor normed(const at::Tensor& y, const LayerArgs& a, Norm n) {  // a sandwich norm where given
  return given(a.n[n]) ? ops().norm.redispatch(CPU_ONLY, y, *a.n[n], a.e[n], false) : y;
}

at::Tensor attention(const at::Tensor& h, const LayerArgs& a, const StepArgs& s) {  // h (1, d) -> (1, d)
  at::Tensor qkv = grouped(h, {a.p[Q], a.p[K], a.p[V]});                                 // (1, (Hq+2Hkv) D)
  const int64_t qw = s.Hq * s.D, kw = a.keys->size(1) * s.D;
  at::Tensor q = qkv.narrow(1, 0, qw), k = qkv.narrow(1, qw, kw), v = qkv.narrow(1, qw + kw, qkv.size(1) - qw - kw);
  if (given(a.n[QN])) {
    q = head_norm(q, a.n[QN], a.e[QN], s.D);
    k = head_norm(k, a.n[KN], a.e[KN], s.D);
  }
  at::Tensor qr = ops().rope.redispatch(CPU_ONLY, q, k, v, *a.cos, *a.sin, *a.keys, *a.values, *a.sums, a.write,
                                        *a.ks, *a.vs);                                    // (1, Hq, D)
  return normed(product(attend(qr, a, s), a.p[O]), a, POST_ATTN);                        // (1, d)
}

at::Tensor layer_step(const at::Tensor& x, const LayerArgs& a, const StepArgs& s) {  // x (1, d) -> (1, d)
  Ops& o = ops();
  at::Tensor h = o.norm.redispatch(CPU_ONLY, x, *a.n[INPUT], a.e[INPUT], false);         // (1, d)
  at::Tensor y = attention(h, a, s);                                                     // (1, d)
  auto [sum, h2] = o.add_norm.redispatch(CPU_ONLY, x, y, *a.n[PRE_MLP], a.e[PRE_MLP], false);  // (1, d) x2
  at::Tensor act = o.glu[s.activation].redispatch(CPU_ONLY, grouped(h2, {a.p[GATE], a.p[UP]}), false);  // (1, I)
  at::Tensor down = normed(product(act, a.p[DOWN]), a, POST_MLP);                        // (1, d)
  float* out = sum.data_ptr<float>();
  const float* add = down.data_ptr<float>();
  for (int64_t i = 0; i < sum.size(1); ++i) out[i] += add[i];
  return sum;
}

void check_stack(const at::Tensor& x, at::TensorList cos, at::TensorList sin, at::TensorList norms,
                 c10::ArrayRef<double> eps, at::TensorList raws, const std::vector<std::string>& kernels,
                 c10::IntArrayRef qtypes, at::TensorList biases, at::TensorList keys, at::TensorList values,
                 at::TensorList sums, const c10::List<Opt>& ks, const c10::List<Opt>& vs, c10::IntArrayRef writes,
                 c10::IntArrayRef lengths, c10::IntArrayRef pages, c10::IntArrayRef firsts, int64_t activation) {
  const auto L = static_cast<int64_t>(keys.size());
  auto n = [](auto list) { return static_cast<int64_t>(list.size()); };
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.is_contiguous() && x.scalar_type() == at::kFloat,
              "x must be (1, d) float32 contiguous (one token, batch 1)");
  TORCH_CHECK(n(norms) == NORMS * L && n(eps) == NORMS * L, "norms / eps must hold ", NORMS, " per layer (",
              NORMS * L, "), got ", norms.size(), " / ", eps.size());
  TORCH_CHECK(n(raws) == SLOTS * L && n(kernels) == SLOTS * L && n(qtypes) == SLOTS * L && n(biases) == SLOTS * L,
              "raws / kernels / qtypes / biases must hold ", SLOTS, " per layer (", SLOTS * L, ")");
  TORCH_CHECK(n(values) == L && n(sums) == L && static_cast<int64_t>(ks.size()) == L &&
                  static_cast<int64_t>(vs.size()) == L && n(writes) == L && n(lengths) == L && n(pages) == L &&
                  n(firsts) == L && n(cos) == L && n(sin) == L,
              "values, summaries, key_scales, value_scales, writes, lengths, pages, firsts, cos, sin must hold one "
              "per layer (", L, ")");
  TORCH_CHECK(activation == 0 || activation == 1, "activation must be 0 (SiLU) or 1 (GELU-tanh), got ", activation);
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(keys[l].dim() == 5 && keys[l].size(4) == keys[0].size(4),
                "decode_stack: the caches must be (1, Hkv, cap, P, D) storage of one head size (layer ", l, ": ",
                keys[l].sizes(), ")");
  for (int64_t l = 0; l < L; ++l) {
    TORCH_CHECK(keys[l].size(0) == 1, "the caches must hold batch 1 (layer ", l, ")");
    TORCH_CHECK(lengths[l] >= 1 && lengths[l] <= keys[l].size(2) * keys[l].size(3) && writes[l] >= 0 &&
                    writes[l] < lengths[l], "layer ", l, ": writes ", writes[l], " and reads ", lengths[l],
                " tokens of a storage of ", keys[l].size(2) * keys[l].size(3));
    const bool q_norm = norms[NORMS * l + QN].numel() > 0, k_norm = norms[NORMS * l + KN].numel() > 0;
    TORCH_CHECK(q_norm == k_norm, "layer ", l, ": the q and k head norms go together");
  }
  for (const auto& b : biases)
    TORCH_CHECK(b.numel() == 0 || (b.dim() == 1 && b.is_contiguous() && b.scalar_type() == at::kFloat),
                "biases must be (N,) float32 contiguous or empty");
  for (const std::string& k : kernels)
    TORCH_CHECK(k.empty() || k == "q8act_linear" || k == "q8k_linear" || k == "floatdot_linear" ||
                    k == "q8x8_linear", "decode_stack: kernel '", k, "' is not a product operator (q8act_linear, "
                "q8k_linear, floatdot_linear, q8x8_linear, or '' for a slot packed into the one before)");
}

std::vector<Product> products_of(at::TensorList raws, const std::vector<std::string>& kernels, c10::IntArrayRef qtypes,
                                 at::TensorList biases, int64_t l) {
  std::vector<Product> p;
  for (int64_t i = l * SLOTS; i < (l + 1) * SLOTS; ++i) p.push_back({&raws[i], &kernels[i], qtypes[i], &biases[i]});
  return p;
}

struct Storage {  // every layer's cache storage, as the schema gives it
  at::TensorList keys, values, sums;
  std::vector<Opt> ks, vs;
};

LayerArgs layer_args(int64_t l, at::TensorList norms, c10::ArrayRef<double> eps, std::vector<Product> p,
                     at::TensorList cos, at::TensorList sin, Storage& st, c10::IntArrayRef writes,
                     c10::IntArrayRef lengths, c10::IntArrayRef pages, c10::IntArrayRef firsts) {
  LayerArgs a;
  for (int64_t i = 0; i < NORMS; ++i) {
    a.n[i] = &norms[NORMS * l + i];
    a.e[i] = eps[NORMS * l + i];
  }
  a.p = std::move(p);
  a.cos = &cos[l];
  a.sin = &sin[l];
  // storage is written in place: const_cast is the schema's (a!) annotation, as rope_append takes it
  a.keys = const_cast<at::Tensor*>(&st.keys[l]);
  a.values = const_cast<at::Tensor*>(&st.values[l]);
  a.sums = const_cast<at::Tensor*>(&st.sums[l]);
  a.ks = &st.ks[l];
  a.vs = &st.vs[l];
  a.write = writes[l];
  a.length = lengths[l];
  a.pages = pages[l];
  a.first = firsts[l];
  a.counts = nullptr;
  a.covered = nullptr;
  return a;
}

// counts' first element (checked (L, Hsel) int64 contiguous), or nullptr when none is given.
int64_t* counts_of(const Opt& counts, int64_t L, int64_t Hsel) {
  TORCH_CHECK(!counts || (counts->dim() == 2 && counts->size(0) == L && counts->size(1) == Hsel &&
                          counts->scalar_type() == at::kLong && counts->is_contiguous()),
              "counts must be (layers, selection heads) = (", L, ", ", Hsel, ") int64 contiguous");
  return counts ? counts->data_ptr<int64_t>() : nullptr;
}

// covered's first element (checked (L,) int64 contiguous), or nullptr when none is given.
int64_t* covered_of(const Opt& covered, int64_t L) {
  TORCH_CHECK(!covered || (covered->dim() == 1 && covered->size(0) == L && covered->scalar_type() == at::kLong &&
                           covered->is_contiguous()),
              "covered must be (layers,) = (", L, ",) int64 contiguous");
  return covered ? covered->data_ptr<int64_t>() : nullptr;
}

at::Tensor decode_stack_cpu(const at::Tensor& x, at::TensorList cos, at::TensorList sin, int64_t heads,
                            at::TensorList norms, c10::ArrayRef<double> eps, at::TensorList raws,
                            const c10::List<std::string>& kernel_list, c10::IntArrayRef qtypes, at::TensorList biases,
                            at::TensorList keys, at::TensorList values, at::TensorList sums, const c10::List<Opt>& ks,
                            const c10::List<Opt>& vs, c10::IntArrayRef writes, c10::IntArrayRef lengths,
                            c10::IntArrayRef pages, c10::IntArrayRef firsts, double scale, bool per_head,
                            bool group_sum, int64_t activation, const at::Tensor& final_norm, double final_eps,
                            const at::Tensor& head_raw, const std::string& head_kernel, int64_t head_qtype,
                            double mass, int64_t min_pages, const Opt& counts, const Opt& covered) {
  const std::vector<std::string> kernels(kernel_list.begin(), kernel_list.end());
  check_stack(x, cos, sin, norms, eps, raws, kernels, qtypes, biases, keys, values, sums, ks, vs, writes, lengths,
              pages, firsts, activation);
  TORCH_CHECK(heads >= 1, "decode_stack: heads = ", heads, " must be >= 1 (the query heads)");
  TORCH_CHECK(head_kernel.empty() || head_kernel == "q8act_linear" || head_kernel == "q8k_linear" ||
                  head_kernel == "floatdot_linear" || head_kernel == "q8x8_linear",
              "decode_stack: head_kernel '", head_kernel, "' is not a product operator");
  const int64_t L = static_cast<int64_t>(keys.size()), D = keys.empty() ? 0 : keys[0].size(4);
  const StepArgs s{heads, D, scale, per_head, group_sum, activation, mass, min_pages};
  const int64_t Hsel = L ? (per_head ? heads : keys[0].size(1)) : 0;
  int64_t* cp = counts_of(counts, L, Hsel);
  int64_t* vp = covered_of(covered, L);
  Storage st{keys, values, sums, std::vector<Opt>(ks.begin(), ks.end()), std::vector<Opt>(vs.begin(), vs.end())};
  at::Tensor h = x;
  for (int64_t l = 0; l < L; ++l) {
    LayerArgs a = layer_args(l, norms, eps, products_of(raws, kernels, qtypes, biases, l), cos, sin, st, writes,
                             lengths, pages, firsts);
    a.counts = cp ? cp + l * Hsel : nullptr;
    a.covered = vp ? vp + l : nullptr;
    h = layer_step(h, a, s);
  }
  if (head_kernel.empty()) return h;                                      // (1, d): the last layer's output
  h = ops().norm.redispatch(CPU_ONLY, h, final_norm, final_eps, false);  // (1, d)
  static const at::Tensor none;
  return product(h, {&head_raw, &head_kernel, head_qtype, &none});       // (1, V)
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("decode_stack(Tensor x, Tensor[] cos, Tensor[] sin, int heads, Tensor[] norms, float[] eps, Tensor[] raws, "
        "str[] kernels, int[] qtypes, Tensor[] biases, Tensor(a!)[] keys, Tensor(b!)[] values, Tensor(c!)[] summaries, "
        "Tensor?[] key_scales, Tensor?[] value_scales, int[] writes, int[] lengths, int[] pages, int[] firsts, "
        "float scale, bool per_head, bool group_sum, int activation, Tensor final_norm, float final_eps, "
        "Tensor head_raw, str head_kernel, int head_qtype, float mass=0., int min_pages=1, "
        "Tensor(d!)? counts=None, Tensor(e!)? covered=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(gatherlens, CPU, m) { m.impl("decode_stack", &decode_stack_cpu); }
