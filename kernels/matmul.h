// Dense matrix products as a Linear layer computes them: y = x · Wᵀ (+ bias).
#pragma once

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

struct MatmulParams {
  const float* x = nullptr;   // [m, k] fp32 activations, row-major
  const void* w = nullptr;    // [n, k] weights of type w_dtype (Hugging Face Linear layout: out × in)
  DType w_dtype = DType::kF32;
  const void* bias = nullptr; // [n] of type bias_dtype, or nullptr
  DType bias_dtype = DType::kF32;
  float* y = nullptr;         // [m, n] fp32 output (must not alias x)
  int m = 0;                  // rows of x (tokens); m == 1 is GEMV
  int n = 0;                  // output features
  int k = 0;                  // input features
  bool accumulate = false;    // y += x·Wᵀ instead of y = x·Wᵀ (residual add fused)
};

// fp32 accumulation. INVALID_ARGUMENT on null pointers or non-positive sizes.
Status Matmul(const MatmulParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
