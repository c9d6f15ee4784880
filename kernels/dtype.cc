#include "kernels/dtype.h"

#include <algorithm>
#include <cmath>

namespace icecache::kernels {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
  }
  return "unknown";
}

StatusOr<DType> ParseWeightDType(std::string_view name) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    if (name == DTypeName(t)) return t;
  }
  return InvalidArgumentError("weight type must be bf16, f16, f32, q8_0, q4_0 or q4_1, got '" + std::string(name) + "'");
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    if (name == DTypeName(t)) return t;
  }
  return InvalidArgumentError("element type must be bf16, f16 or f32, got '" + std::string(name) + "'");
}

namespace {
uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// The usual round-to-nearest quantisers of the block types (as ggml's reference ones compute):
// q8_0 d = max|x| / 127, q = round(x / d); q4_0 d = -x_max / 8 (x_max the value of largest
// magnitude), n = min(15, trunc(x / d + 8.5)); q4_1 d = (max - min) / 15, m = min,
// n = min(15, trunc((x - m) / d + 0.5)).
void QuantizeBlocks(DType t, const float* src, uint8_t* b, size_t n) {
  const size_t bb = QuantBlockBytes(t);
  for (size_t k = 0; k < n / kQuantBlockValues; ++k, b += bb, src += kQuantBlockValues) {
    if (t == DType::kQ8_0) {
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      StoreU16(b, F32ToF16(d));
      for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[i] * id)));
      continue;
    }
    uint8_t nib[32];
    if (t == DType::kQ4_0) {
      float amax = 0.f, mx = 0.f;
      for (int i = 0; i < 32; ++i) {
        if (std::fabs(src[i]) > amax) {
          amax = std::fabs(src[i]);
          mx = src[i];
        }
      }
      const float d = mx / -8.f, id = d != 0.f ? 1.f / d : 0.f;
      StoreU16(b, F32ToF16(d));
      for (int i = 0; i < 32; ++i) nib[i] = static_cast<uint8_t>(std::min(15, static_cast<int>(src[i] * id + 8.5f)));
    } else {
      float lo = src[0], hi = src[0];
      for (int i = 1; i < 32; ++i) {
        lo = std::min(lo, src[i]);
        hi = std::max(hi, src[i]);
      }
      const float d = (hi - lo) / 15.f, id = d != 0.f ? 1.f / d : 0.f;
      StoreU16(b, F32ToF16(d));
      StoreU16(b + 2, F32ToF16(lo));
      for (int i = 0; i < 32; ++i) {
        nib[i] = static_cast<uint8_t>(std::min(15, static_cast<int>((src[i] - lo) * id + 0.5f)));
      }
    }
    uint8_t* qs = b + (t == DType::kQ4_0 ? 2 : 4);
    for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>(nib[i] | (nib[i + 16] << 4));
  }
}
}  // namespace

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal half: normalise into a float exponent.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in half: value = abs_float / 2^-24, rounded to nearest even.
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14 + (113 - exp) - 1 ... bits to drop to reach 2^-24 units
    const uint32_t kept = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

void ConvertToF32(DType t, const void* src, float* dst, size_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const size_t bb = QuantBlockBytes(t);
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0:
      for (size_t k = 0; k < n / kQuantBlockValues; ++k, b += bb, dst += kQuantBlockValues) {
        const float d = F16ToF32(LoadU16(b));
        for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
      }
      return;
    case DType::kQ4_0:
    case DType::kQ4_1:
      for (size_t k = 0; k < n / kQuantBlockValues; ++k, b += bb, dst += kQuantBlockValues) {
        const float d = F16ToF32(LoadU16(b));
        const uint8_t* qs = b + (t == DType::kQ4_0 ? 2 : 4);
        if (t == DType::kQ4_0) {
          for (int i = 0; i < 16; ++i) {
            dst[i] = d * static_cast<float>((qs[i] & 0x0F) - 8);
            dst[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
          }
        } else {
          const float m = F16ToF32(LoadU16(b + 2));
          for (int i = 0; i < 16; ++i) {
            dst[i] = d * static_cast<float>(qs[i] & 0x0F) + m;
            dst[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
          }
        }
      }
      return;
  }
}

void ConvertFromF32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
      QuantizeBlocks(t, src, static_cast<uint8_t*>(dst), n);
      return;
  }
}

}  // namespace icecache::kernels
