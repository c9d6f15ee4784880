// The SIMD instruction set the CPU kernels run with, chosen at run time.
//
// The CPU kernels (kernels/cpu/, and the IceCache store's vector ops) are compiled once per
// target in one binary; every call goes to the best target this CPU supports:
//   kAvx512: AVX-512 F/BW/VL/DQ + VNNI + BF16 (with AVX2/FMA/F16C), e.g. AMD Zen 4, Intel Sapphire
//            Rapids. A CPU with AVX-512 but without VNNI or BF16 runs kAvx2.
//   kAvx2:   AVX2 + FMA + F16C (x86-64-v3 level), e.g. AMD Zen 1-3, Intel Haswell and later.
//   kScalar: no SIMD beyond the compiler's baseline (SSE2 on x86-64); also the reference.
//   kNeon:   Arm Advanced SIMD (aarch64 baseline); the only target besides kScalar in an Arm
//            build (the x86 targets are compiled only for x86-64, kNeon only for aarch64).
// The environment variable ICECACHE_SIMD=avx512|avx2|neon|scalar forces a target at start (a
// target this CPU lacks falls back to the best supported one below it, with a warning: avx512 to
// avx2, anything else to scalar). The choice is
// logged once (INFO) when a kernel first asks for it.
#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"

namespace icecache::kernels {

enum class SimdTarget : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3 };
// Every target, lowest first within each CPU family.
inline constexpr SimdTarget kAllSimdTargets[] = {SimdTarget::kScalar, SimdTarget::kAvx2, SimdTarget::kAvx512,
                                                 SimdTarget::kNeon};

std::string_view SimdTargetName(SimdTarget t);  // "scalar", "avx2", "avx512", "neon"
// SimdTargetName's inverse; INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<SimdTarget> ParseSimdTarget(std::string_view name);

// Whether this CPU (and OS: AVX state saved) can run target t (cpuid, checked once).
bool SimdTargetSupported(SimdTarget t);
// The targets this CPU supports, lowest first (always starts with kScalar).
std::vector<SimdTarget> SupportedSimdTargets();

// The target the CPU kernels use now. Thread-safe.
SimdTarget ActiveSimdTarget();
// Makes t the active target (tests and benchmarks compare targets in one process).
// FAILED_PRECONDITION if this CPU does not support t. Kernels running on other threads finish on
// the target they started with; call between kernel calls.
Status SetSimdTarget(SimdTarget t);

// AMX (Intel Advanced Matrix Extensions; Sapphire Rapids and later Xeons): on the avx512 target
// the bf16 GEMM (MatmulParams::bf16_activations, m > 16) runs on AMX tiles (`tdpbf16ps`, 16x32
// by 32x16 bf16 products per instruction) instead of `vdpbf16ps`, and prefill attention allowed
// bf16 products (PrefillAttentionParams::bf16) runs them on tiles, where the CPU has AMX-TILE and
// AMX-BF16 and Linux grants the process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, kernel
// 5.16+). Not a SIMD target of its own: the GEMM gives the same values up to summation order.
// ICECACHE_AMX=off turns it off at start (on, the default, uses it where supported). Logged once
// (INFO) when first asked.
bool AmxSupported();  // CPU and OS; asks the OS for the tile state once
bool AmxActive();     // AmxSupported() and not turned off
// Turns the AMX path on or off (tests and benchmarks compare both in one process).
// FAILED_PRECONDITION when turning it on where AmxSupported() is false.
Status SetAmxActive(bool on);

// AVX-VNNI (`vpdpbusd` on ymm registers, VEX-encoded: Intel Alder Lake and later client cores,
// the Sierra Forest E-core Xeons, AMD Zen 5): on the avx2 target the IceCache store's int8
// kernels (the DCI build's parent search ArgmaxDotI8 and the upper-level scoring ScoreRowsI8,
// kvstore/vector_ops.h) use it in place of their plain AVX2 forms (`vpmaddubsw` on the parent
// search's 6-bit keys, `vpmaddwd` on int16-widened bytes for the queries): 1 op where those take
// 2.5 or 4 per 8 rows and 4 bytes.
// Not a SIMD target of its own: the same integers, so the same trees and scores (the avx512
// target has `vpdpbusd` on zmm already). ICECACHE_AVX_VNNI=off turns it off at start (on, the
// default, uses it where supported). Logged once (INFO) when first asked.
bool AvxVnniSupported();  // CPU (cpuid leaf 7.1 EAX bit 4) and the avx2 target supported
bool AvxVnniActive();     // AvxVnniSupported() and not turned off
// Turns the AVX-VNNI int8 path on or off (tests and benchmarks compare both in one process).
// FAILED_PRECONDITION when turning it on where AvxVnniSupported() is false.
Status SetAvxVnniActive(bool on);

}  // namespace icecache::kernels
