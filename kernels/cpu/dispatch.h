// Internal: the per-target CPU kernels (kernels/cpu/target_decls.inc, one set per SIMD target)
// and ICE_SIMD_DISPATCH, which calls the set of the active target (kernels/simd_target.h).
// Used by the two dispatchers only: kernels/cpu/cpu_dispatch.cc (ops) and kvstore/vector_ops.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/op_table.h"
#include "kernels/simd_target.h"

#define ICE_DECL_NS scalar
#include "kernels/cpu/target_decls.inc"
#undef ICE_DECL_NS
#if defined(__aarch64__)
// An Arm build compiles the scalar and neon targets (kernels/CMakeLists.txt).
#define ICE_DECL_NS neon
#include "kernels/cpu/target_decls.inc"
#undef ICE_DECL_NS

#define ICE_SIMD_DISPATCH(fn, ...)                                                        \
  do {                                                                                    \
    if (::icecache::kernels::ActiveSimdTarget() == ::icecache::kernels::SimdTarget::kNeon) \
      return ::icecache::kernels::cpu::neon::fn(__VA_ARGS__);                             \
    return ::icecache::kernels::cpu::scalar::fn(__VA_ARGS__);                             \
  } while (0)
#else
#define ICE_DECL_NS avx2
#include "kernels/cpu/target_decls.inc"
#undef ICE_DECL_NS
#define ICE_DECL_NS avx512
#include "kernels/cpu/target_decls.inc"
#undef ICE_DECL_NS

// return <target>::fn(args...) for the active SIMD target.
#define ICE_SIMD_DISPATCH(fn, ...)                                                        \
  do {                                                                                    \
    switch (::icecache::kernels::ActiveSimdTarget()) {                                    \
      case ::icecache::kernels::SimdTarget::kAvx512:                                      \
        return ::icecache::kernels::cpu::avx512::fn(__VA_ARGS__);                         \
      case ::icecache::kernels::SimdTarget::kAvx2:                                        \
        return ::icecache::kernels::cpu::avx2::fn(__VA_ARGS__);                           \
      case ::icecache::kernels::SimdTarget::kScalar:                                      \
      case ::icecache::kernels::SimdTarget::kNeon:                                        \
        break;                                                                            \
    }                                                                                     \
    return ::icecache::kernels::cpu::scalar::fn(__VA_ARGS__);                             \
  } while (0)
#endif
