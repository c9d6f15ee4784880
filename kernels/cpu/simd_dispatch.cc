// Run-time choice of the SIMD target (kernels/simd_target.h).
#include <atomic>
#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "kernels/simd_target.h"

namespace icecache::kernels {

namespace {

bool CpuHas(SimdTarget t) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wider register state (XGETBV).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  switch (t) {
    case SimdTarget::kScalar: return true;
    case SimdTarget::kAvx2: return avx2;
    case SimdTarget::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return t == SimdTarget::kScalar;
#endif
}

SimdTarget BestSupported(SimdTarget at_most) {
  for (int t = static_cast<int>(at_most); t > 0; --t) {
    if (SimdTargetSupported(static_cast<SimdTarget>(t))) return static_cast<SimdTarget>(t);
  }
  return SimdTarget::kScalar;
}

// The target at start: the best supported, or ICECACHE_SIMD lowered to a supported one.
SimdTarget InitialTarget() {
  SimdTarget want = SimdTarget::kAvx512;
  std::string source = "best supported";
  if (const char* env = std::getenv("ICECACHE_SIMD"); env != nullptr && *env != '\0') {
    auto parsed = ParseSimdTarget(env);
    if (parsed.ok()) {
      want = *parsed;
      source = std::string("ICECACHE_SIMD=") + env;
    } else {
      ICE_LOG(WARNING) << "ignoring ICECACHE_SIMD: " << parsed.status().ToString();
    }
  }
  const SimdTarget got = BestSupported(want);
  if (got != want && source != "best supported") {
    ICE_LOG(WARNING) << source << " is not supported by this CPU; using " << SimdTargetName(got);
  }
  std::string supported;
  for (SimdTarget t : SupportedSimdTargets()) supported += (supported.empty() ? "" : ",") + std::string(SimdTargetName(t));
  ICE_LOG(INFO) << "CPU kernels: SIMD target " << SimdTargetName(got) << " (" << source
                << "; this CPU supports " << supported << ")";
  return got;
}

std::atomic<int>& Active() {
  static std::atomic<int> active{static_cast<int>(InitialTarget())};
  return active;
}

}  // namespace

std::string_view SimdTargetName(SimdTarget t) {
  switch (t) {
    case SimdTarget::kScalar: return "scalar";
    case SimdTarget::kAvx2: return "avx2";
    case SimdTarget::kAvx512: return "avx512";
  }
  return "unknown";
}

StatusOr<SimdTarget> ParseSimdTarget(std::string_view name) {
  for (SimdTarget t : {SimdTarget::kScalar, SimdTarget::kAvx2, SimdTarget::kAvx512}) {
    if (name == SimdTargetName(t)) return t;
  }
  return InvalidArgumentError("SIMD target must be avx512, avx2 or scalar, got '" + std::string(name) + "'");
}

bool SimdTargetSupported(SimdTarget t) {
  static const bool supported[3] = {CpuHas(SimdTarget::kScalar), CpuHas(SimdTarget::kAvx2),
                                    CpuHas(SimdTarget::kAvx512)};
  const int i = static_cast<int>(t);
  return i >= 0 && i < 3 && supported[i];
}

std::vector<SimdTarget> SupportedSimdTargets() {
  std::vector<SimdTarget> out;
  for (SimdTarget t : {SimdTarget::kScalar, SimdTarget::kAvx2, SimdTarget::kAvx512}) {
    if (SimdTargetSupported(t)) out.push_back(t);
  }
  return out;
}

SimdTarget ActiveSimdTarget() { return static_cast<SimdTarget>(Active().load(std::memory_order_relaxed)); }

Status SetSimdTarget(SimdTarget t) {
  if (!SimdTargetSupported(t)) {
    return FailedPreconditionError("SIMD target " + std::string(SimdTargetName(t)) +
                                   " is not supported by this CPU");
  }
  Active().store(static_cast<int>(t), std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace icecache::kernels
