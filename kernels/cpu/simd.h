// Internal: the per-target part of the CPU kernels. Every per-target source (compiled once per
// SIMD target, see kernels/CMakeLists.txt and kernels/simd_target.h) includes this header LAST:
// it includes the standard and intrinsic headers the kernels use, then switches code generation
// to the target (#pragma GCC target; everything defined below it, in this header and in the
// including source, is compiled for that target) and opens the target's namespace macros:
//   ICE_SIMD_NS      scalar | avx2 | avx512 | neon, the namespace (under icecache::kernels::cpu) of
//                    everything the source defines, so no inline function or template of one
//                    target can be merged by the linker with another target's;
//   ICE_SIMD_AVX2    1 on the avx2 and avx512 targets (AVX2 + FMA + F16C usable);
//   ICE_SIMD_AVX512  1 on the avx512 target (AVX-512 F/BW/VL/DQ/VNNI/BF16 usable);
//   ICE_SIMD_NEON    1 on the neon target (aarch64 Advanced SIMD; built only for Arm).
// Standard headers must not be included after this one: their inline functions would be compiled
// for the target under their usual (shared) names. (GCC does not define __AVX2__ and friends
// after #pragma GCC target in C++, hence our own macros.)
// Helpers: loads of f32/f16/bf16 converting to 16 (AVX-512), 8 (AVX2) or 4 (NEON) fp32 lanes on
// the fly; the softmax exp polynomial on each target's vectors;
// Dot/Axpy/ToF32 with the widest vectors the target has, scalar loops on the scalar target.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kernels/op_table.h"

#if !defined(ICECACHE_SIMD_TARGET)
#error "kernels/cpu/simd.h is for per-target sources (ICECACHE_SIMD_TARGET set by CMake)"
#endif
#if ICECACHE_SIMD_TARGET == 3 && defined(__aarch64__)
// Arm: Advanced SIMD (NEON) is part of the aarch64 baseline, no target switch needed.
#define ICE_SIMD_NS neon
#define ICE_SIMD_AVX2 0
#define ICE_SIMD_AVX512 0
#define ICE_SIMD_NEON 1
#elif ICECACHE_SIMD_TARGET == 2 && defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512cd,avx512vnni,avx512bf16")
#define ICE_SIMD_NS avx512
#define ICE_SIMD_AVX2 1
#define ICE_SIMD_AVX512 1
#elif ICECACHE_SIMD_TARGET == 1 && defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#define ICE_SIMD_NS avx2
#define ICE_SIMD_AVX2 1
#define ICE_SIMD_AVX512 0
#else
// The scalar target; also what the avx2/avx512 sources compile to on a CPU family without them
// (SimdTargetSupported then reports them unsupported and they are never called).
#if ICECACHE_SIMD_TARGET == 2
#define ICE_SIMD_NS avx512
#elif ICECACHE_SIMD_TARGET == 1
#define ICE_SIMD_NS avx2
#else
#define ICE_SIMD_NS scalar
#endif
#define ICE_SIMD_AVX2 0
#define ICE_SIMD_AVX512 0
#endif
#if !defined(ICE_SIMD_NEON)
#define ICE_SIMD_NEON 0
#endif

#define ICE_DECL_NS ICE_SIMD_NS
#include "kernels/cpu/target_decls.inc"
#undef ICE_DECL_NS

namespace icecache::kernels::cpu::ICE_SIMD_NS {

// Element i of a typed array as fp32.
template <DType T>
inline float LoadScalar(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == DType::kBF16) {
    return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
  } else {
    return F16ToF32(static_cast<const uint16_t*>(base)[i]);
  }
}

#if ICE_SIMD_AVX512
// exp(x) for x <= 0 (softmax arguments), Cephes expf polynomial with Cody-Waite reduction:
// about 1 ulp; inputs below -87 flush towards 0.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// 16 consecutive elements starting at element i, as fp32.
template <DType T>
inline __m512 Load16(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (T == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// Elements i .. i+count-1 (count < 16), zeros in the other lanes.
template <DType T>
inline __m512 Load16Tail(const void* base, size_t i, int count) {
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i);
    if constexpr (T == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// {sum of a's lanes, b's, c's, d's}. Each input's lanes are added in the same tree whatever the
// other inputs are, so a sum never depends on which accumulators it was reduced with.
inline __m128 ReduceAdd4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // Per 128-bit lane: partial sums of a, b, c, d.
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Lane i of the result is the sum of v[i]'s lanes (16 horizontal sums at the cost of ~4).
inline __m512 ReduceAdd16(const __m512 v[16]) {
  __m512 q[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(v[4 * j], v[4 * j + 1]),
                                    _mm512_unpackhi_ps(v[4 * j], v[4 * j + 1]));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(v[4 * j + 2], v[4 * j + 3]),
                                    _mm512_unpackhi_ps(v[4 * j + 2], v[4 * j + 3]));
    q[j] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  }
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], 0x88), _mm512_shuffle_f32x4(q[0], q[1], 0xDD));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], 0x88), _mm512_shuffle_f32x4(q[2], q[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}
#endif

#if ICE_SIMD_AVX2
// exp(x) for x <= 0, ExpNonPositive's polynomial on 8 lanes (2^n built in the exponent field:
// n >= -126 after the clamp, a normal float).
inline __m256 ExpNonPositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// 8 consecutive elements starting at element i, as fp32.
template <DType T>
inline __m256 Load8(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (T == DType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// Elements i .. i+count-1 (count < 8), zeros in the other lanes.
template <DType T>
inline __m256 Load8Tail(const void* base, size_t i, int count) {
  constexpr size_t kElem = T == DType::kF32 ? 4 : 2;
  alignas(32) unsigned char buf[32] = {};
  std::memcpy(buf, static_cast<const char*>(base) + i * kElem, static_cast<size_t>(count) * kElem);
  return Load8<T>(buf, 0);
}

// Lanes 0 .. count-1 of v to dst (count < 8).
inline void Store8Tail(float* dst, __m256 v, int count) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  std::memcpy(dst, buf, static_cast<size_t>(count) * sizeof(float));
}

// The sum of v's lanes (one fixed tree: ((0+4)+(2+6)) + ((1+5)+(3+7))).
inline float HSum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// {sum of a's lanes, b's, c's, d's}: four horizontal sums for the price of ~1.5. As ReduceAdd4,
// each input's lanes are added in the same tree whatever the other inputs are.
inline __m128 ReduceAdd4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b);  // per 128-bit half: a01 a23 b01 b23
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per half: a0123 b0123 c0123 d0123
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline float HMax8(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

#if ICE_SIMD_NEON
// exp(x) for x <= 0, ExpNonPositive's polynomial on 4 lanes (vrndnq rounds to nearest even as
// the x86 forms do; 2^n built in the exponent field: n >= -126 after the clamp, a normal float).
inline float32x4_t ExpNonPositive4(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

// Elements i .. i+count-1 of an fp32 array (count < 4), zeros in the other lanes.
inline float32x4_t Load4TailF32(const float* base, size_t i, int count) {
  float buf[4] = {0.f, 0.f, 0.f, 0.f};
  std::memcpy(buf, base + i, static_cast<size_t>(count) * sizeof(float));
  return vld1q_f32(buf);
}

// Lanes 0 .. count-1 of v to dst (count < 4).
inline void Store4Tail(float* dst, float32x4_t v, int count) {
  float buf[4];
  vst1q_f32(buf, v);
  std::memcpy(dst, buf, static_cast<size_t>(count) * sizeof(float));
}

// 4 consecutive elements starting at element i, as fp32.
template <DType T>
inline float32x4_t Load4(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return vld1q_f32(static_cast<const float*>(base) + i);
  } else {
    const uint16x4_t h = vld1_u16(static_cast<const uint16_t*>(base) + i);
    if constexpr (T == DType::kBF16) {
      return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    } else {
      return vcvt_f32_f16(vreinterpret_f16_u16(h));
    }
  }
}
#endif

// fp32 dot product of x [n] with a typed row [n].
template <DType T>
inline float Dot(const float* x, const void* row, int n) {
#if ICE_SIMD_AVX512
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Load16<T>(row, i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), Load16<T>(row, i + 16), a1);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Load16<T>(row, i), a0);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), Load16Tail<T>(row, i, n - i), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#elif ICE_SIMD_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), Load8<T>(row, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), Load8<T>(row, i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), Load8<T>(row, i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), Load8<T>(row, i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), Load8<T>(row, i), a0);
  if (i < n) a1 = _mm256_fmadd_ps(Load8Tail<DType::kF32>(x, i, n - i), Load8Tail<T>(row, i, n - i), a1);
  return HSum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#elif ICE_SIMD_NEON
  float32x4_t a0 = vdupq_n_f32(0.f), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = vfmaq_f32(a0, vld1q_f32(x + i), Load4<T>(row, i));
    a1 = vfmaq_f32(a1, vld1q_f32(x + i + 4), Load4<T>(row, i + 4));
    a2 = vfmaq_f32(a2, vld1q_f32(x + i + 8), Load4<T>(row, i + 8));
    a3 = vfmaq_f32(a3, vld1q_f32(x + i + 12), Load4<T>(row, i + 12));
  }
  for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(x + i), Load4<T>(row, i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
  for (; i < n; ++i) s += x[i] * LoadScalar<T>(row, i);
  return s;
#else
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += x[i] * LoadScalar<T>(row, i);
  return s;
#endif
}

// y[0..n) += a * row[0..n) (row typed).
template <DType T>
inline void Axpy(float a, const void* row, float* y, int n) {
#if ICE_SIMD_AVX512
  const __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, Load16<T>(row, i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, mask,
                          _mm512_fmadd_ps(va, Load16Tail<T>(row, i, n - i),
                                          _mm512_maskz_loadu_ps(mask, y + i)));
  }
#elif ICE_SIMD_AVX2
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, Load8<T>(row, i), _mm256_loadu_ps(y + i)));
  }
  if (i < n) Store8Tail(y + i, _mm256_fmadd_ps(va, Load8Tail<T>(row, i, n - i), Load8Tail<DType::kF32>(y, i, n - i)), n - i);
#elif ICE_SIMD_NEON
  const float32x4_t va = vdupq_n_f32(a);
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, Load4<T>(row, i)));
  for (; i < n; ++i) y[i] += a * LoadScalar<T>(row, i);
#else
  for (int i = 0; i < n; ++i) y[i] += a * LoadScalar<T>(row, i);
#endif
}

// Converts n typed elements to fp32.
template <DType T>
inline void ToF32(const void* src, float* dst, int n) {
#if ICE_SIMD_AVX512
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, Load16<T>(src, i));
  if (i < n) {
    _mm512_mask_storeu_ps(dst + i, static_cast<__mmask16>((1u << (n - i)) - 1u),
                          Load16Tail<T>(src, i, n - i));
  }
#elif ICE_SIMD_AVX2
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, Load8<T>(src, i));
  if (i < n) Store8Tail(dst + i, Load8Tail<T>(src, i, n - i), n - i);
#elif ICE_SIMD_NEON
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, Load4<T>(src, i));
  for (; i < n; ++i) dst[i] = LoadScalar<T>(src, i);
#else
  for (int i = 0; i < n; ++i) dst[i] = LoadScalar<T>(src, i);
#endif
}

// Calls f.template operator()<T>() with T the compile-time form of the run-time dtype.
template <typename F>
inline auto DispatchDType(DType t, F&& f) {
  switch (t) {
    case DType::kF16: return f.template operator()<DType::kF16>();
    case DType::kBF16: return f.template operator()<DType::kBF16>();
    case DType::kF32: break;
    default: break;  // block-quantised types never reach a plain-type kernel (kernels/ops.cc)
  }
  return f.template operator()<DType::kF32>();
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
