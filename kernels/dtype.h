// Element types of weights and KV pages, and scalar conversions. Activations are always fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/status.h"

namespace icecache::kernels {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view DTypeName(DType t);  // "f32", "f16", "bf16"
// DTypeName's inverse; INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<DType> ParseDType(std::string_view name);

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

// Converts n elements of `src` (of type t) to fp32.
void ConvertToF32(DType t, const void* src, float* dst, size_t n);
// Converts n fp32 values to type t.
void ConvertFromF32(DType t, const float* src, void* dst, size_t n);

}  // namespace icecache::kernels
