// RMSNorm, RoPE, SwiGLU, Add, Embedding on the GPU.
#include <string>

#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

constexpr int kNormThreads = 256;

// One block per row: sum of squares by block reduction, then scale.
template <DType T>
__global__ void RmsNormKernel(const float* x, const void* weight, float* y, int dim, float eps) {
  const size_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  __shared__ float partial[kNormThreads / 32];
  ss = WarpSum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kNormThreads / 32 ? partial[threadIdx.x] : 0.f;
    v = WarpSum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = 1.f / sqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * LoadElem<T>(weight, i);
}

// One thread per (token, head, pair i < rotary_dim/2).
__global__ void RopeKernel(float* x, const int* positions, const float* inv_freq, int tokens,
                           int heads, int head_dim, int half) {
  const long idx = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long total = static_cast<long>(tokens) * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const long th = idx / half;
  const int t = static_cast<int>(th / heads);
  float* v = x + th * head_dim;
  const float a = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(a, &s, &c);
  const float x1 = v[i], x2 = v[i + half];
  v[i] = x1 * c - x2 * s;
  v[i + half] = x2 * c + x1 * s;
}

__global__ void SwiGluKernel(const float* gate, const float* up, float* out, long n) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

__global__ void AddKernel(float* y, const float* x, long n) {
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

// One block per token. An out-of-range id leaves its row untouched and records itself in *bad
// (the first offending position wins via atomicMin).
template <DType T>
__global__ void EmbeddingKernel(const int32_t* ids, const void* table, float* out, int vocab,
                                int dim, int* bad) {
  const int t = blockIdx.x;
  const int id = ids[t];
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0) atomicMin(bad, t);
    return;
  }
  const size_t base = static_cast<size_t>(id) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[static_cast<size_t>(t) * dim + i] = LoadElem<T>(table, base + i);
}

int GridFor(long n, int threads) {
  long blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks > 65535L * 8 ? 65535L * 8 : blocks);
}

}  // namespace

Status RmsNorm(const RmsNormParams& p) {
  return DispatchDType(p.weight_dtype, [&]<DType T>() {
    RmsNormKernel<T><<<p.rows, kNormThreads, 0, Stream()>>>(p.x, p.weight, p.y, p.dim, p.eps);
    return LaunchStatus("RmsNormKernel");
  });
}

Status ApplyRope(const RopeParams& p) {
  const long total = static_cast<long>(p.tokens) * p.heads * (p.rotary_dim / 2);
  RopeKernel<<<CeilDiv(total, 256), 256, 0, Stream()>>>(p.x, p.positions, p.inv_freq, p.tokens,
                                                        p.heads, p.head_dim, p.rotary_dim / 2);
  return LaunchStatus("RopeKernel");
}

Status SwiGlu(const SwiGluParams& p) {
  SwiGluKernel<<<GridFor(p.n, 256), 256, 0, Stream()>>>(p.gate, p.up, p.out, p.n);
  return LaunchStatus("SwiGluKernel");
}

Status Add(const AddParams& p) {
  AddKernel<<<GridFor(p.n, 256), 256, 0, Stream()>>>(p.y, p.x, p.n);
  return LaunchStatus("AddKernel");
}

Status Embedding(const EmbeddingParams& p) {
  void* ws = nullptr;
  ICE_RETURN_IF_ERROR(Workspace(sizeof(int), &ws));
  int* bad = static_cast<int*>(ws);
  const int none = 0x7fffffff;
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad, &none, sizeof(int), cudaMemcpyHostToDevice, Stream()));
  ICE_RETURN_IF_ERROR(DispatchDType(p.table_dtype, [&]<DType T>() {
    EmbeddingKernel<T><<<p.n, 128, 0, Stream()>>>(p.ids, p.table, p.out, p.vocab, p.dim, bad);
    return LaunchStatus("EmbeddingKernel");
  }));
  int first_bad = none;
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&first_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, Stream()));
  ICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(Stream()));
  if (first_bad != none) {
    int id = 0;
    ICE_CUDA_RETURN_IF_ERROR(cudaMemcpy(&id, p.ids + first_bad, sizeof(int), cudaMemcpyDeviceToHost));
    return OutOfRangeError("Embedding: token id " + std::to_string(id) + " at position " +
                           std::to_string(first_bad) + " is outside [0, " + std::to_string(p.vocab) + ")");
  }
  return Status::Ok();
}

}  // namespace icecache::kernels::cuda
