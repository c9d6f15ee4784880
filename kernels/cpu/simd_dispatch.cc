// Run-time choice of the SIMD target (kernels/simd_target.h).
#include <atomic>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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
    case SimdTarget::kNeon: return false;
  }
  return false;
#elif defined(__aarch64__)
  // Advanced SIMD is mandatory on aarch64 (and the neon kernels are compiled only there).
  return t == SimdTarget::kScalar || t == SimdTarget::kNeon;
#else
  return t == SimdTarget::kScalar;
#endif
}

// want if supported, else the next lower level of its family (x86: avx512, avx2, scalar).
SimdTarget BestSupported(SimdTarget want) {
  if (SimdTargetSupported(want)) return want;
  if (want == SimdTarget::kAvx512 && SimdTargetSupported(SimdTarget::kAvx2)) return SimdTarget::kAvx2;
  return SimdTarget::kScalar;
}

// The target at start: the best supported, or ICECACHE_SIMD lowered to a supported one.
SimdTarget InitialTarget() {
#if defined(__aarch64__)
  SimdTarget want = SimdTarget::kNeon;
#else
  SimdTarget want = SimdTarget::kAvx512;
#endif
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
  for (SimdTarget t : SupportedSimdTargets()) {
    if (!supported.empty()) supported += ',';
    supported += SimdTargetName(t);
  }
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
    case SimdTarget::kNeon: return "neon";
  }
  return "unknown";
}

StatusOr<SimdTarget> ParseSimdTarget(std::string_view name) {
  for (SimdTarget t : kAllSimdTargets) {
    if (name == SimdTargetName(t)) return t;
  }
  return InvalidArgumentError("SIMD target must be avx512, avx2, neon or scalar, got '" + std::string(name) + "'");
}

bool SimdTargetSupported(SimdTarget t) {
  static const bool supported[4] = {CpuHas(SimdTarget::kScalar), CpuHas(SimdTarget::kAvx2),
                                    CpuHas(SimdTarget::kAvx512), CpuHas(SimdTarget::kNeon)};
  const int i = static_cast<int>(t);
  return i >= 0 && i < 4 && supported[i];
}

std::vector<SimdTarget> SupportedSimdTargets() {
  std::vector<SimdTarget> out;
  for (SimdTarget t : kAllSimdTargets) {
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

namespace {

bool DetectAmx() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
  if (!amx_bf16 || !amx_tile || !SimdTargetSupported(SimdTarget::kAvx512)) return false;
  // Linux keeps the 8 KiB tile data state off until a process asks for it (XFD); the grant is
  // process-wide. ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 (asm/prctl.h).
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    ICE_LOG(INFO) << "CPU has AMX-BF16 but the OS refused the tile state (kernel < 5.16?); bf16 GEMMs use vdpbf16ps, prefill attention fp32";
    return false;
  }
  return true;
#else
  return false;
#endif
}

// Whether the switch named by env (values on | off, unset = on) asks for its path.
bool EnvSwitchOn(const char* env) {
  const char* v = std::getenv(env);
  const std::string s = v == nullptr ? "" : v;
  if (!s.empty() && s != "on" && s != "off") {
    ICE_LOG(WARNING) << "ignoring " << env << "='" << s << "' (on or off)";
  }
  return s != "off";
}

std::atomic<bool>& AmxOn() {
  static std::atomic<bool> on{[] {
    const bool want = EnvSwitchOn("ICECACHE_AMX");
    const bool on = want && AmxSupported();
    ICE_LOG(INFO) << "CPU bf16 GEMMs and prefill attention: AMX tiles " << (on ? "on" : "off")
                  << (AmxSupported() ? (want ? "" : " (ICECACHE_AMX=off)") : " (not supported here)");
    return on;
  }()};
  return on;
}

bool DetectAvxVnni() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return ((a >> 4) & 1u) != 0 && SimdTargetSupported(SimdTarget::kAvx2);
#else
  return false;
#endif
}

std::atomic<bool>& AvxVnniOn() {
  static std::atomic<bool> on{[] {
    const bool want = EnvSwitchOn("ICECACHE_AVX_VNNI");
    const bool on = want && AvxVnniSupported();
    ICE_LOG(INFO) << "CPU int8 kernels on the avx2 target: AVX-VNNI " << (on ? "on" : "off")
                  << (AvxVnniSupported() ? (want ? "" : " (ICECACHE_AVX_VNNI=off)") : " (not supported here)");
    return on;
  }()};
  return on;
}

}  // namespace

bool AmxSupported() {
  static const bool supported = DetectAmx();
  return supported;
}

bool AmxActive() { return AmxOn().load(std::memory_order_relaxed); }

Status SetAmxActive(bool on) {
  if (on && !AmxSupported()) {
    return FailedPreconditionError("AMX (AMX-TILE + AMX-BF16 with the OS's tile state) is not supported here");
  }
  AmxOn().store(on, std::memory_order_relaxed);
  return Status::Ok();
}

bool AvxVnniSupported() {
  static const bool supported = DetectAvxVnni();
  return supported;
}

bool AvxVnniActive() { return AvxVnniOn().load(std::memory_order_relaxed); }

Status SetAvxVnniActive(bool on) {
  if (on && !AvxVnniSupported()) {
    return FailedPreconditionError("AVX-VNNI (with the avx2 target) is not supported by this CPU");
  }
  AvxVnniOn().store(on, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace icecache::kernels
