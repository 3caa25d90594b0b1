// GENERATED from gatherlens/ops/quant/layout.py (LAYOUTS) by `write_c_header()`: do not edit
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
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false;
};

struct Q4_0 {
  static constexpr int64_t type = 2, weights = 32, bytes = 18;
  static constexpr int64_t group = 32, bits = 4, code_offset = 8;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qs_at = 2, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true;
  static constexpr bool has_m = false, has_qh = false, has_dmin = false, has_scales = false, has_ql = false;
};

struct Q4_1 {
  static constexpr int64_t type = 3, weights = 32, bytes = 20;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t m_at = 2, m_size = 2;  // fp16
  static constexpr int64_t qs_at = 4, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_m = true;
  static constexpr bool has_qh = false, has_dmin = false, has_scales = false, has_ql = false;
};

struct Q5_0 {
  static constexpr int64_t type = 6, weights = 32, bytes = 22;
  static constexpr int64_t group = 32, bits = 5, code_offset = 16;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t qh_at = 2, qh_size = 4;  // high
  static constexpr int64_t qs_at = 6, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_qh = true;
  static constexpr bool has_m = false, has_dmin = false, has_scales = false, has_ql = false;
};

struct Q5_1 {
  static constexpr int64_t type = 7, weights = 32, bytes = 24;
  static constexpr int64_t group = 32, bits = 5, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t m_at = 2, m_size = 2;  // fp16
  static constexpr int64_t qh_at = 4, qh_size = 4;  // high
  static constexpr int64_t qs_at = 8, qs_size = 16;  // codes
  static constexpr bool has_d = true, has_qs = true, has_m = true, has_qh = true;
  static constexpr bool has_dmin = false, has_scales = false, has_ql = false;
};

struct Q4_K {
  static constexpr int64_t type = 12, weights = 256, bytes = 144;
  static constexpr int64_t group = 32, bits = 4, code_offset = 0;
  static constexpr int64_t d_at = 0, d_size = 2;  // fp16
  static constexpr int64_t dmin_at = 2, dmin_size = 2;  // fp16
  static constexpr int64_t scales_at = 4, scales_size = 12;  // scales
  static constexpr int64_t qs_at = 16, qs_size = 128;  // codes
  static constexpr bool has_d = true, has_qs = true, has_dmin = true, has_scales = true;
  static constexpr bool has_m = false, has_qh = false, has_ql = false;
};

struct Q6_K {
  static constexpr int64_t type = 14, weights = 256, bytes = 210;
  static constexpr int64_t group = 16, bits = 6, code_offset = 32;
  static constexpr int64_t ql_at = 0, ql_size = 128;  // codes
  static constexpr int64_t qh_at = 128, qh_size = 64;  // high
  static constexpr int64_t scales_at = 192, scales_size = 16;  // scales
  static constexpr int64_t d_at = 208, d_size = 2;  // fp16
  static constexpr bool has_d = true, has_qh = true, has_scales = true, has_ql = true;
  static constexpr bool has_qs = false, has_m = false, has_dmin = false;
};

}  // namespace gatherlens_quant
