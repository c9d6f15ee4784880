// Argmax per row, the sorted top logits of one row (CUB radix sort, stable, descending), the
// frequency / presence penalty and the log-sum-exp of one row.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

constexpr int kArgmaxThreads = 256;

// (value, index) order: larger value first, NaN never wins, ties → lower index.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  if (isnan(v)) return false;
  if (bi < 0 || isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxKernel(const float* logits, int32_t* out, int vocab) {
  const float* x = logits + static_cast<size_t>(blockIdx.x) * vocab;
  float bv = 0.f;
  int bi = -1;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (Better(x[i], i, bv, bi)) {
      bv = x[i];
      bi = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = bv;
    si[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      if (si[w] >= 0 && Better(sv[w], si[w], bv, bi)) {
        bv = sv[w];
        bi = si[w];
      }
    }
    out[blockIdx.x] = bi < 0 ? 0 : bi;
  }
}

__global__ void PrepareSortKernel(const float* logits, float* keys, int32_t* ids, int vocab) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
    const float v = logits[i];
    keys[i] = isnan(v) ? -INFINITY : v;
    ids[i] = i;
  }
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

__global__ void CountPenaltyKernel(CountPenaltyParams p) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.count; i += gridDim.x * blockDim.x) {
    p.logits[p.ids[i]] -= p.frequency * static_cast<float>(p.counts[i]) + p.presence;
  }
}

// Merges two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void MergeLse(float& m, float& s, float om, float os) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om;
    s = os;
    return;
  }
  const float nm = fmaxf(m, om);
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

constexpr int kLseThreads = 1024;

// One block: every thread keeps an online (max, sum) over its strided elements, then a warp and
// a block reduction merge them. A +inf logit makes the result +inf.
__global__ void LogSumExpKernel(const float* logits, int vocab, float* out) {
  float m = -INFINITY, s = 0.f;
  bool pos_inf = false;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = logits[i];
    if (isnan(v) || v == -INFINITY) continue;
    if (isinf(v)) {
      pos_inf = true;
      continue;
    }
    MergeLse(m, s, v, 1.f);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    MergeLse(m, s, om, os);
  }
  pos_inf = __any_sync(0xffffffffu, pos_inf);
  __shared__ float sm[kLseThreads / 32], ss[kLseThreads / 32];
  __shared__ int sinf[kLseThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    sm[threadIdx.x >> 5] = m;
    ss[threadIdx.x >> 5] = s;
    sinf[threadIdx.x >> 5] = pos_inf ? 1 : 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    bool any_inf = sinf[0] != 0;
    for (int w = 1; w < kLseThreads / 32; ++w) {
      MergeLse(m, s, sm[w], ss[w]);
      any_inf = any_inf || sinf[w] != 0;
    }
    *out = any_inf ? INFINITY : (m == -INFINITY ? -INFINITY : m + logf(s));
  }
}

}  // namespace

Status Argmax(const ArgmaxParams& p) {
  ArgmaxKernel<<<p.rows, kArgmaxThreads, 0, Stream()>>>(p.logits, p.out, p.vocab);
  return LaunchStatus("ArgmaxKernel");
}

Status TopLogits(const float* logits, int vocab, int count, float* sorted_logits,
                 int32_t* sorted_ids) {
  size_t temp_bytes = 0;
  ICE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, temp_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), vocab, 0, 32, Stream()));
  const size_t keys_bytes = Align256(sizeof(float) * vocab);
  const size_t ids_bytes = Align256(sizeof(int32_t) * vocab);
  void* ws = nullptr;
  ICE_RETURN_IF_ERROR(Workspace(2 * keys_bytes + 2 * ids_bytes + temp_bytes, &ws));
  char* base = static_cast<char*>(ws);
  float* keys_in = reinterpret_cast<float*>(base);
  float* keys_out = reinterpret_cast<float*>(base + keys_bytes);
  int32_t* ids_in = reinterpret_cast<int32_t*>(base + 2 * keys_bytes);
  int32_t* ids_out = reinterpret_cast<int32_t*>(base + 2 * keys_bytes + ids_bytes);
  void* temp = base + 2 * keys_bytes + 2 * ids_bytes;
  PrepareSortKernel<<<CeilDiv(vocab, 256), 256, 0, Stream()>>>(logits, keys_in, ids_in, vocab);
  ICE_RETURN_IF_ERROR(LaunchStatus("PrepareSortKernel"));
  ICE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      temp, temp_bytes, keys_in, keys_out, ids_in, ids_out, vocab, 0, 32, Stream()));
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sorted_logits, keys_out, sizeof(float) * count,
                                           cudaMemcpyDeviceToHost, Stream()));
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sorted_ids, ids_out, sizeof(int32_t) * count,
                                           cudaMemcpyDeviceToHost, Stream()));
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

Status CountPenalty(const CountPenaltyParams& p) {
  CountPenaltyKernel<<<CeilDiv(p.count, 256), 256, 0, Stream()>>>(p);
  return LaunchStatus("CountPenaltyKernel");
}

Status LogSumExp(const float* logits, int vocab, float* host_out) {
  void* ws = nullptr;
  ICE_RETURN_IF_ERROR(Workspace(sizeof(float), &ws));
  float* d_out = static_cast<float*>(ws);
  LogSumExpKernel<<<1, kLseThreads, 0, Stream()>>>(logits, vocab, d_out);
  ICE_RETURN_IF_ERROR(LaunchStatus("LogSumExpKernel"));
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out, d_out, sizeof(float), cudaMemcpyDeviceToHost, Stream()));
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

}  // namespace icecache::kernels::cuda
