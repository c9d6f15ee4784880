// y = x · Wᵀ (+ bias) on the GPU.
//  * m <= kGemvMaxRows: a warp per output feature streams its weight row once (bf16/f16/f32,
//    converted in registers) and produces all m outputs. Decode is this case; it is bandwidth-bound.
//  * larger m: cuBLAS SGEMM (fp32 compute, TF32 off). bf16/f16 weights are converted to fp32 in
//    chunks of rows in a workspace first, so activations keep full fp32 precision.
#include <cublas_v2.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;
constexpr size_t kConvertChunkElems = size_t{32} << 20;  // 128 MiB of fp32 per chunk

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return InternalError(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusString(s));
}

// One handle per thread, deliberately never destroyed: destroying it during process teardown can
// race the CUDA runtime's own shutdown.
struct CublasHandle {
  cublasHandle_t h = nullptr;
};

StatusOr<cublasHandle_t> Handle() {
  thread_local CublasHandle handle;
  if (handle.h == nullptr) {
    ICE_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle.h), "cublasCreate"));
    ICE_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(handle.h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  }
  ICE_RETURN_IF_ERROR(CublasStatus(cublasSetStream(handle.h, Stream()), "cublasSetStream"));
  return handle.h;
}

template <DType T>
__device__ __forceinline__ float BiasValue(const void* bias, int j) {
  return bias == nullptr ? 0.f : LoadElem<T>(bias, j);
}

// Unpacks 16 bytes of weights into fp32 (8 bf16/f16 values or 4 f32 values).
template <DType W>
__device__ __forceinline__ void Unpack16B(const uint4& raw, float* out) {
  if constexpr (W == DType::kF32) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint16_t lo = static_cast<uint16_t>(words[t] & 0xffffu);
      const uint16_t hi = static_cast<uint16_t>(words[t] >> 16);
      if constexpr (W == DType::kBF16) {
        out[2 * t] = __uint_as_float(static_cast<uint32_t>(lo) << 16);
        out[2 * t + 1] = __uint_as_float(static_cast<uint32_t>(hi) << 16);
      } else {
        out[2 * t] = __half2float(__ushort_as_half(lo));
        out[2 * t + 1] = __half2float(__ushort_as_half(hi));
      }
    }
  }
}

// A warp per output feature j; all m (<= M) rows of x share each weight load. With `vec`, every
// lane reads 16-byte chunks of the weight row (rows and x must then be 16-byte aligned).
template <DType W, DType B, int M>
__global__ void GemvKernel(const float* __restrict__ x, const void* __restrict__ w,
                           const void* __restrict__ bias, float* __restrict__ y, int m, int n,
                           int k, bool accumulate, bool vec) {
  constexpr int kPer = W == DType::kF32 ? 4 : 8;  // weights per 16-byte load
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (j >= n) return;
  const size_t row = static_cast<size_t>(j) * k;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.f;
  if (vec) {
    const char* wrow = static_cast<const char*>(w) + row * (W == DType::kF32 ? 4 : 2);
    for (int i = lane * kPer; i < k; i += 32 * kPer) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(wrow + static_cast<size_t>(i) * (W == DType::kF32 ? 4 : 2)));
      float wv[kPer];
      Unpack16B<W>(raw, wv);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (r < m) {
          const float4* xr = reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * k + i);
#pragma unroll
          for (int t = 0; t < kPer / 4; ++t) {
            const float4 xv = xr[t];
            acc[r] += xv.x * wv[4 * t] + xv.y * wv[4 * t + 1] + xv.z * wv[4 * t + 2] + xv.w * wv[4 * t + 3];
          }
        }
      }
    }
  } else {
    for (int i = lane; i < k; i += 32) {
      const float wv = LoadElem<W>(w, row + i);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (r < m) acc[r] += x[static_cast<size_t>(r) * k + i] * wv;
      }
    }
  }
  const float b = BiasValue<B>(bias, j);
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= m) break;
    const float s = WarpSum(acc[r]);
    if (lane == 0) {
      float& out = y[static_cast<size_t>(r) * n + j];
      out = accumulate ? out + s + b : s + b;
    }
  }
}

template <DType T>
__global__ void ToF32Kernel(const void* src, float* dst, size_t count) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = LoadElem<T>(src, i);
  }
}

template <DType B>
__global__ void AddBiasKernel(float* y, const void* bias, int m, int n) {
  const size_t total = static_cast<size_t>(m) * n;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] += LoadElem<B>(bias, i % n);
  }
}

Status Gemv(const MatmulParams& p) {
  return DispatchDType(p.w_dtype, [&]<DType W>() {
    return DispatchDType(p.bias_dtype, [&]<DType B>() {
      const size_t row_bytes = static_cast<size_t>(p.k) * DTypeSize(W);
      const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
      GemvKernel<W, B, kGemvMaxRows><<<CeilDiv(p.n, kGemvWarps), kGemvWarps * 32, 0, Stream()>>>(
          p.x, p.w, p.bias, p.y, p.m, p.n, p.k, p.accumulate, vec);
      return LaunchStatus("GemvKernel");
    });
  });
}

Status Gemm(const MatmulParams& p) {
  ICE_ASSIGN_OR_RETURN(cublasHandle_t h, Handle());
  const float one = 1.f;
  const float beta = p.accumulate ? 1.f : 0.f;
  // Row-major y[m,n] = x[m,k] · W[n,k]ᵀ is column-major yᵀ[n,m] = W'ᵀ · x' with W' = [k,n], x' = [k,m].
  auto sgemm = [&](const float* wf, int j0, int nc) {
    return CublasStatus(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, nc, p.m, p.k, &one, wf, p.k, p.x,
                                    p.k, &beta, p.y + j0, p.n),
                        "cublasSgemm");
  };
  if (p.w_dtype == DType::kF32) {
    ICE_RETURN_IF_ERROR(sgemm(static_cast<const float*>(p.w), 0, p.n));
  } else {
    const int rows_per_chunk =
        static_cast<int>(std::max<size_t>(1, std::min<size_t>(p.n, kConvertChunkElems / p.k)));
    void* ws = nullptr;
    ICE_RETURN_IF_ERROR(Workspace(static_cast<size_t>(rows_per_chunk) * p.k * sizeof(float), &ws));
    float* wf = static_cast<float*>(ws);
    for (int j0 = 0; j0 < p.n; j0 += rows_per_chunk) {
      const int nc = std::min(rows_per_chunk, p.n - j0);
      const size_t count = static_cast<size_t>(nc) * p.k;
      const size_t offset = static_cast<size_t>(j0) * p.k * DTypeSize(p.w_dtype);
      ICE_RETURN_IF_ERROR(DispatchDType(p.w_dtype, [&]<DType W>() {
        ToF32Kernel<W><<<std::min(CeilDiv(count, 256), 65535 * 4), 256, 0, Stream()>>>(
            static_cast<const char*>(p.w) + offset, wf, count);
        return LaunchStatus("ToF32Kernel");
      }));
      ICE_RETURN_IF_ERROR(sgemm(wf, j0, nc));
    }
  }
  if (p.bias != nullptr) {
    const size_t total = static_cast<size_t>(p.m) * p.n;
    ICE_RETURN_IF_ERROR(DispatchDType(p.bias_dtype, [&]<DType B>() {
      AddBiasKernel<B><<<std::min(CeilDiv(total, 256), 65535 * 4), 256, 0, Stream()>>>(p.y, p.bias, p.m, p.n);
      return LaunchStatus("AddBiasKernel");
    }));
  }
  return Status::Ok();
}

}  // namespace

Status Matmul(const MatmulParams& p) { return p.m <= kGemvMaxRows ? Gemv(p) : Gemm(p); }

Status MatmulGroup(const MatmulParams* products, int count) {
  for (int i = 0; i < count; ++i) ICE_RETURN_IF_ERROR(cuda::Matmul(products[i]));
  return Status::Ok();
}

}  // namespace icecache::kernels::cuda
