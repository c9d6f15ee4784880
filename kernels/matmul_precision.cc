// The process-wide activation precision of matmuls over bf16 and block-quantised weights
// (kernels/matmul.h).
#include <atomic>
#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "kernels/matmul.h"
#include "kernels/simd_target.h"

namespace icecache::kernels {
namespace {

MatmulPrecision InitialPrecision() {
  const char* env = std::getenv("ICECACHE_MATMUL_PRECISION");
  if (env == nullptr || *env == '\0') return MatmulPrecision::kAuto;
  auto parsed = ParseMatmulPrecision(env);
  if (parsed.ok()) return *parsed;
  ICE_LOG(WARNING) << "ignoring ICECACHE_MATMUL_PRECISION: " << parsed.status().ToString();
  return MatmulPrecision::kAuto;
}

std::atomic<int>& Current() {
  static std::atomic<int> current{static_cast<int>(InitialPrecision())};
  return current;
}

}  // namespace

std::string_view MatmulPrecisionName(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::kAuto: return "auto";
    case MatmulPrecision::kFp32: return "fp32";
    case MatmulPrecision::kBf16: return "bf16";
    case MatmulPrecision::kInt8: return "int8";
  }
  return "unknown";
}

StatusOr<MatmulPrecision> ParseMatmulPrecision(std::string_view name) {
  for (MatmulPrecision p :
       {MatmulPrecision::kAuto, MatmulPrecision::kFp32, MatmulPrecision::kBf16, MatmulPrecision::kInt8}) {
    if (name == MatmulPrecisionName(p)) return p;
  }
  return InvalidArgumentError("matmul precision must be auto, fp32, bf16 or int8, got '" + std::string(name) + "'");
}

MatmulPrecision GetMatmulPrecision() { return static_cast<MatmulPrecision>(Current().load(std::memory_order_relaxed)); }

void SetMatmulPrecision(MatmulPrecision p) { Current().store(static_cast<int>(p), std::memory_order_relaxed); }

bool UseBf16Activations() {
  const MatmulPrecision p = GetMatmulPrecision();
  const bool bf16 = p == MatmulPrecision::kBf16 || ((p == MatmulPrecision::kAuto || p == MatmulPrecision::kInt8) &&
                                                    ActiveSimdTarget() == SimdTarget::kAvx512);
  // Called by every Linear of every step: read the flag first, write it once.
  static std::atomic<bool> logged{false};
  if (!logged.load(std::memory_order_relaxed) && !logged.exchange(true)) {
    ICE_LOG(INFO) << "CPU matmuls over bf16 weights: " << (bf16 ? "bf16" : "fp32")
                  << " activations (matmul precision " << MatmulPrecisionName(p)
                  << "; ICECACHE_MATMUL_PRECISION=fp32|bf16|int8|auto)";
  }
  return bf16;
}

QuantActivations BlockActivations() {
  const MatmulPrecision p = GetMatmulPrecision();
  const QuantActivations q = p == MatmulPrecision::kFp32   ? QuantActivations::kFp32
                             : p == MatmulPrecision::kInt8 ? QuantActivations::kInt8
                                                           : QuantActivations::kInt16;
  static std::atomic<bool> logged{false};
  if (!logged.load(std::memory_order_relaxed) && !logged.exchange(true)) {
    ICE_LOG(INFO) << "CPU decode matmuls over block-quantised weights: "
                  << (q == QuantActivations::kFp32 ? "fp32" : q == QuantActivations::kInt8 ? "int8" : "int16")
                  << " activations (matmul precision " << MatmulPrecisionName(p) << ")";
  }
  return q;
}

bool UseBf16Attention(DType kv_dtype) { return kv_dtype == DType::kBF16 && UseBf16Activations(); }

}  // namespace icecache::kernels
