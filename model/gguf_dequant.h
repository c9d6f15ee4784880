// GGML tensor element types as stored in GGUF files, and their dequantisation to fp32.
//
// Block formats (ggml's published layouts; all little-endian, fp16 scales):
//   F32, F16, BF16  plain elements.
//   Q8_0  32 values: f16 d, int8 q[32];                       x = d * q
//   Q4_0  32 values: f16 d, u8 qs[16] (low nibbles = values 0..15, high = 16..31); x = d * (nibble - 8)
//   Q4_1  32 values: f16 d, f16 m, u8 qs[16] (as Q4_0);      x = d * nibble + m
//   Q5_0  32 values: f16 d, u32 qh (bit l = the fifth bit of value l), u8 qs[16] (as Q4_0);
//         x = d * (q - 16)
//   Q5_1  32 values: f16 d, f16 m, u32 qh, u8 qs[16] (as Q5_0); x = d * q + m
//   Q4_K  256 values in 8 sub-blocks of 32: f16 d, f16 dmin, u8 scales[12] (6-bit scale and min per
//         sub-block), u8 qs[128] (each 32-byte run holds two sub-blocks: low then high nibbles);
//         x = d * scale * nibble - dmin * min
//   Q5_K  as Q4_K plus u8 qh[32] before qs: bit (2c) / (2c + 1) of qh[l] is the fifth bit of
//         value l of sub-block 2c / 2c + 1
//   Q6_K  256 values in 16 sub-blocks of 16: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits),
//         int8 scales[16], f16 d;  x = d * scale * (q - 32)
// Dequantisation is exact in fp32 arithmetic: the result equals the format's definition evaluated
// with fp32 multiplies and adds in the order written above. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace icecache::model {

// ggml_type numbers of the types icecache loads (other numbers are recognised by name only).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// True for the types listed in GgmlType.
bool GgmlTypeSupported(uint32_t type);
// "Q4_K", "F32", ...; "type N" for numbers ggml does not define.
std::string GgmlTypeName(uint32_t type);
// Values per block (1 for plain types, 32 or 256) and bytes per block. REQUIRES: supported type.
int64_t GgmlBlockValues(GgmlType type);
int64_t GgmlBlockBytes(GgmlType type);
// Bytes of `n` consecutive values; INVALID_ARGUMENT when n is negative or not a multiple of the
// block size, OUT_OF_RANGE when the size overflows 63 bits.
StatusOr<uint64_t> GgmlBytes(GgmlType type, int64_t n);

// Writes the n values stored in src (GgmlBytes(type, n) bytes) to dst[0, n) as fp32.
// REQUIRES: supported type, n a multiple of GgmlBlockValues(type).
void DequantizeGgml(GgmlType type, const uint8_t* src, int64_t n, float* dst);

// Rewrites n Q4_K values (src: GgmlBytes(kQ4_K, n) bytes) as n / 32 Q4_1 blocks (dst: 20 bytes
// each, kernels/dtype.h): sub-block j of a Q4_K block becomes one Q4_1 block with
// d = f16(d * scale_j), m = f16(-dmin * min_j) and the same nibbles, so a value differs from its
// Q4_K value only by those two fp16 roundings (relative 2^-11 of the scale and of the min, or
// 2^-25 absolute below fp16's normal range; the bf16 dequantisation rounds every value by up to
// 2^-9 relative). False, dst unspecified, when a scale or min exceeds fp16's range (then
// dequantise instead). REQUIRES: n a multiple of 256.
bool Q4KToQ4_1(const uint8_t* src, int64_t n, uint8_t* dst);

// Rewrites n Q5_0, Q5_1, Q5_K or Q6_K values (src: GgmlBytes(type, n) bytes) as n / 32 Q8_0
// blocks (dst: 34 bytes each, kernels/dtype.h), for the CPU's quantised GEMV. Q5_0 exactly (its d,
// and q - 16 as the int8 values). The others: each 32 values' fp32 dequantisation rounded to int8
// steps of d = the smallest fp16 >= max |value| / 127, so a value moves by at most d / 2 (about
// 1/254 of its block's largest magnitude, 2^-25 more below fp16's normal range; Q6_K's own step is
// 1/32 of its 16-value sub-block's largest, the 5-bit types' 1/31 of their range; the bf16
// dequantisation moves each value by up to 2^-9 of itself). False, dst unspecified, when a
// block's scale exceeds fp16's range or a value is not finite (then dequantise instead).
// REQUIRES: one of those types, n a multiple of GgmlBlockValues(type).
bool AsQ8_0Blocks(GgmlType type, const uint8_t* src, int64_t n, uint8_t* dst);

}  // namespace icecache::model
