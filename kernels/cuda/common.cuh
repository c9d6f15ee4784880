// Internal helpers of the CUDA kernels: error conversion to Status, typed element loads, a
// reusable device workspace, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_ops.h"

namespace icecache::kernels::cuda {

inline Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return InternalError(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")");
}

#define ICE_CUDA_RETURN_IF_ERROR(expr) ICE_RETURN_IF_ERROR(::icecache::kernels::cuda::CudaStatus((expr), #expr))

// After a kernel launch: reports launch-configuration errors (asynchronous faults surface later).
inline Status LaunchStatus(const char* kernel) { return CudaStatus(cudaGetLastError(), kernel); }

inline cudaStream_t Stream() { return cudaStreamPerThread; }

// Element i of a typed array as fp32.
template <DType T>
__device__ __forceinline__ float LoadElem(const void* base, size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == DType::kBF16) {
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16);
  } else {
    return __half2float(static_cast<const __half*>(base)[i]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A per-thread device scratch area that grows on demand and is reused across calls.
// The returned pointer is valid until the next call on the same thread.
Status Workspace(size_t bytes, void** out);

// Calls f.template operator()<T>() with T the compile-time form of the run-time dtype.
template <typename F>
inline Status DispatchDType(DType t, F&& f) {
  switch (t) {
    case DType::kF16: return f.template operator()<DType::kF16>();
    case DType::kBF16: return f.template operator()<DType::kBF16>();
    case DType::kF32: break;
    default: break;  // block-quantised types are refused before a CUDA op runs (kernels/ops.cc)
  }
  return f.template operator()<DType::kF32>();
}

inline int CeilDiv(long a, long b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace icecache::kernels::cuda
