// Element types of weights and KV pages, and scalar conversions. Activations are always fp32.
//
// Plain types (f32, f16, bf16) serve weights and KV pages alike. The block-quantised types are
// for weights only (a Linear layer's w, an embedding table) and only on the CPU; their layouts
// are ggml's, so a GGUF file's tensors serve straight from its mapping. A row of k values is
// k / 32 consecutive blocks (k must be a multiple of 32), each of 32 values:
//   q8_0  34 bytes: f16 d, int8 q[32];                                  x_i = d * q_i
//   q4_0  18 bytes: f16 d, u8 qs[16] (value i < 16 in the low nibble of qs[i], value 16 + i in
//         its high nibble);                                             x_i = d * (n_i - 8)
//   q4_1  20 bytes: f16 d, f16 m, u8 qs[16] (nibbles as q4_0);          x_i = d * n_i + m
// (fp32 arithmetic in the order written; Matmul's products over them: kernels/matmul.h.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/status.h"

namespace icecache::kernels {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ4_0 = 4, kQ4_1 = 5 };

// Values per block of the block-quantised types.
inline constexpr int kQuantBlockValues = 32;

inline bool IsBlockQuantized(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1; }
// Bytes per element of a plain type; 0 for a block-quantised one (use DTypeBytes).
inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: break;
  }
  return 0;
}
// Bytes of one block of a block-quantised type (34, 18, 20); 0 for a plain one.
inline size_t QuantBlockBytes(DType t) {
  return t == DType::kQ8_0 ? 34 : t == DType::kQ4_0 ? 18 : t == DType::kQ4_1 ? 20 : 0;
}
// Bytes of n consecutive values of type t. REQUIRES: n a multiple of kQuantBlockValues for a
// block-quantised type.
inline size_t DTypeBytes(DType t, size_t n) {
  return IsBlockQuantized(t) ? n / kQuantBlockValues * QuantBlockBytes(t) : n * DTypeSize(t);
}
std::string_view DTypeName(DType t);  // "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"
// The inverse of DTypeName for the plain types (the names a KV cache or a tensor's element type
// takes); INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<DType> ParseDType(std::string_view name);
// DTypeName's inverse over every type (weights may be block-quantised).
StatusOr<DType> ParseWeightDType(std::string_view name);

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);  // round to nearest even, overflow to inf

// Converts n elements of `src` (of type t) to fp32; a block-quantised type's blocks by the
// definitions above (REQUIRES: n a multiple of kQuantBlockValues).
void ConvertToF32(DType t, const void* src, float* dst, size_t n);
// Converts n fp32 values to type t: a plain type rounds to nearest even; a block-quantised one
// quantises each block of 32 as llama.cpp's reference quantisers do (dtype.cc; REQUIRES: n a
// multiple of kQuantBlockValues).
void ConvertFromF32(DType t, const float* src, void* dst, size_t n);

}  // namespace icecache::kernels
