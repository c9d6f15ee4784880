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
        break;                                                                            \
    }                                                                                     \
    return ::icecache::kernels::cpu::scalar::fn(__VA_ARGS__);                             \
  } while (0)
