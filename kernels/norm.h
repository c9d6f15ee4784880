// RMSNorm: y = x / sqrt(mean(x²) + eps) * weight, per row.
#pragma once

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

struct RmsNormParams {
  const float* x = nullptr;     // [rows, dim]
  const void* weight = nullptr; // [dim] of type weight_dtype
  DType weight_dtype = DType::kF32;
  float* y = nullptr;           // [rows, dim]; may equal x (in place)
  int rows = 0;                 // e.g. tokens, or tokens × heads for per-head q/k norm
  int dim = 0;
  float eps = 1e-6f;
};

Status RmsNorm(const RmsNormParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
