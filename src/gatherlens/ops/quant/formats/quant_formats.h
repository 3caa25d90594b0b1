// GENERATED from gatherlens/ops/quant/formats/layout.py (LAYOUTS) by `write_c_header()`: do not edit
// (tests/test_quantized_table.py checks it equals what the table writes).
// One struct per GGUF block format, as ggml-common.h lays it out: ggml's type number, the
// weights and bytes of a block, weights per scale, bits per code, the code offset, each
// field's byte offset (<field>_at) and size (<field>_size), and has_<field> for every field
// name of the table.
#pragma once

#include <cstdint>

namespace gatherlens_quant {

struct Q8_0 {
  static constexpr int64_t type = 8, weights = 32, bytes = 34;
  static constexpr int64_t group = 32, bits = 8, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qs_at = 2, qs_size = 32;  // codes
  static constexpr bool has_d = true, has_qs = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q4_0 {
  static constexpr int64_t type = 2, weights = 32, bytes = 18;
  static constexpr int64_t group = 32, bits = 4, code_offset = 8;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qs_at = 2, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q4_1 {
  static constexpr int64_t type = 3, weights = 32, bytes = 20;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t m_at = 2, m_size = 2;  // fp16
  static constexpr int64_t qs_at = 4, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_m = true;
  static constexpr bool has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q5_0 {
  static constexpr int64_t type = 6, weights = 32, bytes = 22;
  static constexpr int64_t group = 32, bits = 5, code_offset = 16;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qh_at = 2, qh_size = 4;  // high
  static constexpr int64_t qs_at = 6, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_qh = true;
  static constexpr bool has_m = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q5_1 {
  static constexpr int64_t type = 7, weights = 32, bytes = 24;
  static constexpr int64_t group = 32, bits = 5, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t m_at = 2, m_size = 2;  // fp16
  static constexpr int64_t qh_at = 4, qh_size = 4;  // high
  static constexpr int64_t qs_at = 8, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_m = true, has_qh = true;
  static constexpr bool has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q4_K {
  static constexpr int64_t type = 12, weights = 256, bytes = 144;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t dmin_at = 2, dmin_size = 2;  // fp16
  static constexpr int64_t scales_at = 4, scales_size = 12;  // scales
  static constexpr int64_t qs_at = 16, qs_size = 128;  // codes
  static constexpr bool has_d = true, has_qs = true, has_dmin = true, has_scales = true;
  static constexpr bool has_m = false, has_qh = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q6_K {
  static constexpr int64_t type = 14, weights = 256, bytes = 210;
  static constexpr int64_t group = 16, bits = 6, code_offset = 32;
  static constexpr int64_t ql_at = 0, ql_size = 128;  // codes
  static constexpr int64_t qh_at = 128, qh_size = 64;  // high
  static constexpr int64_t scales_at = 192, scales_size = 16;  // scales
  static constexpr int64_t d_at = 208, d_size = 2;  // fp16
  static constexpr bool has_d = true, has_qh = true, has_scales = true, has_ql = true;
  static constexpr bool has_qs = false, has_m = false, has_dmin = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct F32 {
  static constexpr int64_t type = 0, weights = 1, bytes = 4;
  static constexpr int64_t group = 1, bits = 32, code_offset = 0;
  static constexpr int64_t v_at = 0, v_size = 4;  // value
  static constexpr bool has_v = true;
  static constexpr bool has_d = false, has_qs = false, has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct F16 {
  static constexpr int64_t type = 1, weights = 1, bytes = 2;
  static constexpr int64_t group = 1, bits = 16, code_offset = 0;
  static constexpr int64_t v_at = 0, v_size = 2;  // value
  static constexpr bool has_v = true;
  static constexpr bool has_d = false, has_qs = false, has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct BF16 {
  static constexpr int64_t type = 30, weights = 1, bytes = 2;
  static constexpr int64_t group = 1, bits = 16, code_offset = 0;
  static constexpr int64_t v_at = 0, v_size = 2;  // value
  static constexpr bool has_v = true;
  static constexpr bool has_d = false, has_qs = false, has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q2_K {
  static constexpr int64_t type = 10, weights = 256, bytes = 84;
  static constexpr int64_t group = 16, bits = 2, code_offset = 0;
  static constexpr int64_t scales_at = 0, scales_size = 16;  // scales
  static constexpr int64_t qs_at = 16, qs_size = 64;  // codes
  static constexpr int64_t d_at = 80, d_size = 2;  // fp16
  static constexpr int64_t dmin_at = 82, dmin_size = 2;  // fp16
  static constexpr bool has_d = true, has_qs = true, has_dmin = true, has_scales = true;
  static constexpr bool has_m = false, has_qh = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct Q3_K {
  static constexpr int64_t type = 11, weights = 256, bytes = 110;
  static constexpr int64_t group = 16, bits = 3, code_offset = 4;
  static constexpr int64_t hmask_at = 0, hmask_size = 32;  // high
  static constexpr int64_t qs_at = 32, qs_size = 64;  // codes
  static constexpr int64_t scales_at = 96, scales_size = 12;  // scales
  static constexpr int64_t d_at = 108, d_size = 2;  // fp16
  static constexpr bool has_d = true, has_qs = true, has_scales = true, has_hmask = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_ql = false, has_v = false, has_scales_h = false, has_scales_l = false;
};

struct Q5_K {
  static constexpr int64_t type = 13, weights = 256, bytes = 176;
  static constexpr int64_t group = 32, bits = 5, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t dmin_at = 2, dmin_size = 2;  // fp16
  static constexpr int64_t scales_at = 4, scales_size = 12;  // scales
  static constexpr int64_t qh_at = 16, qh_size = 32;  // high
  static constexpr int64_t qs_at = 48, qs_size = 128;  // codes
  static constexpr bool has_d = true, has_qs = true, has_qh = true, has_dmin = true, has_scales = true;
  static constexpr bool has_m = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct IQ4_NL {
  static constexpr int64_t type = 20, weights = 32, bytes = 18;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qs_at = 2, qs_size = 16;  // codes
  static constexpr int8_t book[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  static constexpr bool has_d = true, has_qs = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false, has_scales_h = false, has_scales_l = false;
};

struct IQ4_XS {
  static constexpr int64_t type = 23, weights = 256, bytes = 136;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t scales_h_at = 2, scales_h_size = 2;  // scales
  static constexpr int64_t scales_l_at = 4, scales_l_size = 4;  // scales
  static constexpr int64_t qs_at = 8, qs_size = 128;  // codes
  static constexpr int8_t book[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  static constexpr bool has_d = true, has_qs = true, has_scales_h = true, has_scales_l = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false, has_v = false, has_hmask = false;
};

}  // namespace gatherlens_quant

// Per operator, the formats it takes (the records' `kernel`; `panels` for q8x8_linear), as an
// X-macro for its dispatch, and as words for its error:
//   #define CASE(F) case gatherlens_quant::F::type: return linear<gatherlens_quant::F>(x, raw);
//   switch (qtype) { GATHERLENS_Q8ACT_LINEAR_FORMATS(CASE) }
//   TORCH_CHECK(false, "qtype must be ", gatherlens_quant::q8act_linear_formats, ", got ", qtype);
#define GATHERLENS_Q8ACT_LINEAR_FORMATS(X) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(IQ4_NL)
#define GATHERLENS_Q8K_LINEAR_FORMATS(X) X(Q4_K) X(Q6_K) X(Q2_K) X(Q3_K) X(Q5_K) X(IQ4_XS)
#define GATHERLENS_FLOATDOT_LINEAR_FORMATS(X) X(F32) X(F16) X(BF16)
#define GATHERLENS_Q8X8_LINEAR_FORMATS(X) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(IQ4_NL)

namespace gatherlens_quant {

inline constexpr char q8act_linear_formats[] = "8 (Q8_0), 2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 7 (Q5_1) or 20 (IQ4_NL)";
inline constexpr char q8k_linear_formats[] = "12 (Q4_K), 14 (Q6_K), 10 (Q2_K), 11 (Q3_K), 13 (Q5_K) or 23 (IQ4_XS)";
inline constexpr char floatdot_linear_formats[] = "0 (F32), 1 (F16) or 30 (BF16)";
inline constexpr char q8x8_linear_formats[] = "8 (Q8_0), 2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 7 (Q5_1) or 20 (IQ4_NL)";

}  // namespace gatherlens_quant
