#include "model/gguf_dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/dtype.h"

namespace icecache::model {
namespace {

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float F16(const uint8_t* p) { return kernels::F16ToF32(U16(p)); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes:
// bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of
// scale (low nibble) and min (high nibble) of sub-blocks 4-7, whose top 2 bits sit in the top
// bits of bytes 0-3 (scales) and 4-7 (mins).
void ScaleMin(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = F16(b), dmin = F16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int s1, m1, s2, m2;
    ScaleMin(scales, 2 * c, &s1, &m1);
    ScaleMin(scales, 2 * c + 1, &s2, &m2);
    const float d1 = d * static_cast<float>(s1), mm1 = dmin * static_cast<float>(m1);
    const float d2 = d * static_cast<float>(s2), mm2 = dmin * static_cast<float>(m2);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d1 * static_cast<float>(q[l] & 0x0F) - mm1;
      y[64 * c + 32 + l] = d2 * static_cast<float>(q[l] >> 4) - mm2;
    }
  }
}

void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = F16(b), dmin = F16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    int s1, m1, s2, m2;
    ScaleMin(scales, 2 * c, &s1, &m1);
    ScaleMin(scales, 2 * c + 1, &s2, &m2);
    const float d1 = d * static_cast<float>(s1), mm1 = dmin * static_cast<float>(m1);
    const float d2 = d * static_cast<float>(s2), mm2 = dmin * static_cast<float>(m2);
    const uint8_t* q = qs + 32 * c;
    const int bit1 = 1 << (2 * c), bit2 = 2 << (2 * c);
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0F) + ((qh[l] & bit1) ? 16 : 0);
      const int hi = (q[l] >> 4) + ((qh[l] & bit2) ? 16 : 0);
      y[64 * c + l] = d1 * static_cast<float>(lo) - mm1;
      y[64 * c + 32 + l] = d2 * static_cast<float>(hi) - mm2;
    }
  }
}

// The 5-bit value l (0..31) of a Q5_0 / Q5_1 block whose qh starts at p (qs follows it): nibble
// l % 16 of qs (low nibbles for l < 16) and bit l of the little-endian qh.
int Q5Value(const uint8_t* p, int l) {
  const uint8_t* qs = p + 4;
  const int nib = l < 16 ? qs[l] & 0x0F : qs[l - 16] >> 4;
  return nib | ((p[l / 8] >> (l % 8)) & 1) << 4;
}

// Q5_0 (offset 16, no m) and Q5_1.
template <bool kMin>
void DequantQ5(const uint8_t* b, float* y) {
  const float d = F16(b);
  const uint8_t* p = b + (kMin ? 4 : 2);
  for (int l = 0; l < 32; ++l) {
    const int q = Q5Value(p, l);
    y[l] = kMin ? d * static_cast<float>(q) + F16(b + 2) : d * static_cast<float>(q - 16);
  }
}

void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16(b + 208);
  // Two halves of 128 values; in each, ql holds 64 bytes (two runs of 32, low then high nibbles)
  // and qh 32 bytes whose four 2-bit fields belong to the four runs of 32 values.
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    const int8_t* s = sc + 8 * h;
    float* out = y + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((l4[l] & 0x0F) | (((h2[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((l4[l + 32] & 0x0F) | (((h2[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(s[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(s[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(s[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(s[is + 6]) * static_cast<float>(q4);
    }
  }
}

}  // namespace

bool GgmlTypeSupported(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
  }
  return false;
}

std::string GgmlTypeName(uint32_t type) {
  static const char* const kNames[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
                                       "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                       "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                       "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  if (type < sizeof(kNames) / sizeof(kNames[0])) return kNames[type];
  return "type " + std::to_string(type);
}

int64_t GgmlBlockValues(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16: return 1;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: return 32;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return 256;
  }
  return 0;
}

int64_t GgmlBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 4;
    case GgmlType::kF16: return 2;
    case GgmlType::kBF16: return 2;
    case GgmlType::kQ8_0: return 34;
    case GgmlType::kQ4_0: return 18;
    case GgmlType::kQ4_1: return 20;
    case GgmlType::kQ5_0: return 22;
    case GgmlType::kQ5_1: return 24;
    case GgmlType::kQ4_K: return 144;
    case GgmlType::kQ5_K: return 176;
    case GgmlType::kQ6_K: return 210;
  }
  return 0;
}

bool Q4KToQ4_1(const uint8_t* src, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n / 256; ++i) {
    const uint8_t* b = src + i * 144;
    const float d = F16(b), dmin = F16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      ScaleMin(scales, j, &sc, &mn);
      const float dj = d * static_cast<float>(sc), mj = -(dmin * static_cast<float>(mn));
      // fp16's range (below 2^-14 its subnormals round to multiples of 2^-24: absolute error
      // <= 2^-25 of the scale, 16 times that at most for a value).
      if (!(std::fabs(dj) <= 65504.f) || !(std::fabs(mj) <= 65504.f)) return false;
      uint8_t* out = dst + (i * 8 + j) * 20;
      const uint16_t hd = kernels::F32ToF16(dj), hm = kernels::F32ToF16(mj);
      out[0] = static_cast<uint8_t>(hd);
      out[1] = static_cast<uint8_t>(hd >> 8);
      out[2] = static_cast<uint8_t>(hm);
      out[3] = static_cast<uint8_t>(hm >> 8);
      // Sub-block j's 32 nibbles: the low (j even) or high (j odd) halves of run j / 2's 32 bytes;
      // Q4_1 keeps value l < 16 in the low nibble of byte l, value 16 + l in its high nibble.
      const uint8_t* run = qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int l = 0; l < 16; ++l) {
        const int lo = (run[l] >> shift) & 0x0F, hi = (run[l + 16] >> shift) & 0x0F;
        out[4 + l] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return true;
}

bool AsQ8_0Blocks(GgmlType type, const uint8_t* src, int64_t n, uint8_t* dst) {
  const int64_t bytes = GgmlBlockBytes(type), bv = GgmlBlockValues(type);
  if (type == GgmlType::kQ5_0) {
    // Exact: the same d, and the 5-bit values minus 16 (-16 .. 15) as int8.
    for (int64_t i = 0; i < n / 32; ++i) {
      const uint8_t* b = src + i * bytes;
      uint8_t* out = dst + i * 34;
      out[0] = b[0];
      out[1] = b[1];
      for (int l = 0; l < 32; ++l) out[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(Q5Value(b + 2, l) - 16));
    }
    return true;
  }
  float v[256];
  for (int64_t i = 0; i < n / bv; ++i) {
    DequantizeGgml(type, src + i * bytes, bv, v);
    for (int j = 0; j < bv / 32; ++j) {
      const float* x = v + 32 * j;
      float amax = 0.f;
      for (int l = 0; l < 32; ++l) {
        const float a = std::fabs(x[l]);
        if (!(a <= std::numeric_limits<float>::max())) return false;  // infinite or not a number
        amax = std::max(amax, a);
      }
      const float want = amax / 127.f;
      if (!(want <= 65504.f)) return false;  // past fp16's range
      // The fp16 scale at least amax / 127, so no value needs clamping: the next fp16 up when
      // rounding went down (positive halves step by one in their bit pattern).
      uint16_t h = kernels::F32ToF16(want);
      if (kernels::F16ToF32(h) < want) ++h;
      const float d = kernels::F16ToF32(h);
      uint8_t* out = dst + (i * (bv / 32) + j) * 34;
      out[0] = static_cast<uint8_t>(h);
      out[1] = static_cast<uint8_t>(h >> 8);
      for (int l = 0; l < 32; ++l) {
        const float q = d > 0.f ? std::nearbyint(x[l] / d) : 0.f;
        out[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.f, 127.f)));
      }
    }
  }
  return true;
}

StatusOr<uint64_t> GgmlBytes(GgmlType type, int64_t n) {
  const int64_t bv = GgmlBlockValues(type);
  if (n < 0 || bv == 0 || n % bv != 0) {
    return InvalidArgumentError(std::to_string(n) + " values are not a whole number of " +
                                GgmlTypeName(static_cast<uint32_t>(type)) + " blocks of " + std::to_string(bv));
  }
  const uint64_t blocks = static_cast<uint64_t>(n / bv);
  const uint64_t bb = static_cast<uint64_t>(GgmlBlockBytes(type));
  if (blocks > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / bb) {
    return OutOfRangeError(std::to_string(n) + " " + GgmlTypeName(static_cast<uint32_t>(type)) +
                           " values overflow 63 bits of bytes");
  }
  return blocks * bb;
}

void DequantizeGgml(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::kF16: kernels::ConvertToF32(kernels::DType::kF16, src, dst, static_cast<size_t>(n)); return;
    case GgmlType::kBF16: kernels::ConvertToF32(kernels::DType::kBF16, src, dst, static_cast<size_t>(n)); return;
    // The kernels' own block types (ggml's layouts, kernels/dtype.h): one definition of each.
    case GgmlType::kQ8_0: kernels::ConvertToF32(kernels::DType::kQ8_0, src, dst, static_cast<size_t>(n)); return;
    case GgmlType::kQ4_0: kernels::ConvertToF32(kernels::DType::kQ4_0, src, dst, static_cast<size_t>(n)); return;
    case GgmlType::kQ4_1: kernels::ConvertToF32(kernels::DType::kQ4_1, src, dst, static_cast<size_t>(n)); return;
    default: break;
  }
  const int64_t bv = GgmlBlockValues(type), bb = GgmlBlockBytes(type);
  for (int64_t i = 0; i < n / bv; ++i) {
    const uint8_t* b = src + i * bb;
    float* y = dst + i * bv;
    switch (type) {
      case GgmlType::kQ5_0: DequantQ5<false>(b, y); break;
      case GgmlType::kQ5_1: DequantQ5<true>(b, y); break;
      case GgmlType::kQ4_K: DequantQ4_K(b, y); break;
      case GgmlType::kQ5_K: DequantQ5_K(b, y); break;
      case GgmlType::kQ6_K: DequantQ6_K(b, y); break;
      default: break;
    }
  }
}

}  // namespace icecache::model
