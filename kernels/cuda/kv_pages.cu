// StoreKv / GatherKv (one block per (row, head), a thread per element), MergeToken (one warp per
// (sequence, query head)), MergeStates (one warp per row) and the repetition penalty.
#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

template <DType T>
__device__ __forceinline__ void StoreElem(void* base, size_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(base)[i] = x;
  } else if constexpr (T == DType::kBF16) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(base)[i] = __float2half_rn(x);
  }
}

// Element offsets of a slot's K and V rows from the pool base.
__device__ __forceinline__ void SlotRows(int64_t slot_id, int page_size, int head_dim, size_t* k, size_t* v) {
  const int64_t page = slot_id / page_size;
  const int64_t slot = slot_id % page_size;
  *k = static_cast<size_t>(page) * 2 * page_size * head_dim + static_cast<size_t>(slot) * head_dim;
  *v = *k + static_cast<size_t>(page_size) * head_dim;
}

template <DType T>
__global__ void StoreKvKernel(StoreKvParams p) {
  const size_t i = blockIdx.x;
  const int64_t slot_id = p.slot_ids[i];
  if (slot_id < 0) return;
  size_t k0, v0;
  SlotRows(slot_id, p.page_size, p.head_dim, &k0, &v0);
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    StoreElem<T>(p.pages, k0 + d, p.k[i * p.head_dim + d]);
    StoreElem<T>(p.pages, v0 + d, p.v[i * p.head_dim + d]);
  }
}

template <DType T>
__global__ void GatherKvKernel(GatherKvParams p) {
  const size_t i = blockIdx.x;
  size_t k0, v0;
  SlotRows(p.slot_ids[i], p.page_size, p.head_dim, &k0, &v0);
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    p.k[i * p.head_dim + d] = LoadElem<T>(p.pages, k0 + d);
    p.v[i * p.head_dim + d] = LoadElem<T>(p.pages, v0 + d);
  }
}

__global__ void MergeTokenKernel(MergeTokenParams p) {
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  if (warp >= p.batch * p.num_q_heads) return;
  const int b = warp / p.num_q_heads, h = warp % p.num_q_heads;
  const int g = h / (p.num_q_heads / p.num_kv_heads);
  const int hd = p.head_dim;
  const float* q = p.q + static_cast<size_t>(warp) * hd;
  const float* kn = p.k_new + (static_cast<size_t>(b) * p.num_kv_heads + g) * hd;
  const float* vn = p.v_new + (static_cast<size_t>(b) * p.num_kv_heads + g) * hd;
  float* o = p.out + static_cast<size_t>(warp) * hd;
  const float lse = p.lse[warp];
  if (!isfinite(lse)) {
    for (int d = lane; d < hd; d += 32) o[d] = vn[d];
    return;
  }
  float dot = 0.f;
  for (int d = lane; d < hd; d += 32) dot += q[d] * kn[d];
  dot = WarpSum(dot);
  const float s = dot * p.scale;
  const float m = fmaxf(lse, s);
  const float w_old = expf(lse - m), w_new = expf(s - m);
  const float inv = 1.f / (w_old + w_new);
  for (int d = lane; d < hd; d += 32) o[d] = (o[d] * w_old + vn[d] * w_new) * inv;
}

// One warp per row.
__global__ void MergeStatesKernel(MergeStatesParams p) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.rows) return;
  const float l2 = p.lse2[row];
  if (!isfinite(l2)) return;
  const int hd = p.head_dim;
  float* o = p.out + static_cast<size_t>(row) * hd;
  const float* o2 = p.out2 + static_cast<size_t>(row) * hd;
  const float l1 = p.lse[row];
  if (!isfinite(l1)) {
    for (int d = lane; d < hd; d += 32) o[d] = o2[d];
    if (lane == 0) p.lse[row] = l2;
    return;
  }
  const float m = fmaxf(l1, l2);
  const float a = expf(l1 - m), b = expf(l2 - m);
  const float inv = 1.f / (a + b);
  for (int d = lane; d < hd; d += 32) o[d] = (o[d] * a + o2[d] * b) * inv;
  if (lane == 0) p.lse[row] = m + logf(a + b);
}

__global__ void RepetitionPenaltyKernel(RepetitionPenaltyParams p) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.count; i += gridDim.x * blockDim.x) {
    float& l = p.logits[p.ids[i]];
    l = l > 0.f ? l / p.penalty : l * p.penalty;
  }
}

int RowThreads(int head_dim) { return head_dim >= 128 ? 128 : (head_dim >= 64 ? 64 : 32); }

}  // namespace

Status StoreKv(const StoreKvParams& p) {
  const unsigned blocks = static_cast<unsigned>(static_cast<size_t>(p.rows) * p.num_heads);
  return DispatchDType(p.kv_dtype, [&]<DType T>() {
    StoreKvKernel<T><<<blocks, RowThreads(p.head_dim), 0, Stream()>>>(p);
    return LaunchStatus("StoreKvKernel");
  });
}

Status GatherKv(const GatherKvParams& p) {
  const unsigned blocks = static_cast<unsigned>(static_cast<size_t>(p.rows) * p.num_heads);
  return DispatchDType(p.kv_dtype, [&]<DType T>() {
    GatherKvKernel<T><<<blocks, RowThreads(p.head_dim), 0, Stream()>>>(p);
    return LaunchStatus("GatherKvKernel");
  });
}

Status MergeToken(const MergeTokenParams& p) {
  constexpr int kThreads = 128;
  const long warps = static_cast<long>(p.batch) * p.num_q_heads;
  MergeTokenKernel<<<CeilDiv(warps * 32, kThreads), kThreads, 0, Stream()>>>(p);
  return LaunchStatus("MergeTokenKernel");
}

Status MergeStates(const MergeStatesParams& p) {
  constexpr int kThreads = 128;
  const long warps = p.rows;
  MergeStatesKernel<<<CeilDiv(warps * 32, kThreads), kThreads, 0, Stream()>>>(p);
  return LaunchStatus("MergeStatesKernel");
}

Status RepetitionPenalty(const RepetitionPenaltyParams& p) {
  RepetitionPenaltyKernel<<<CeilDiv(p.count, 256), 256, 0, Stream()>>>(p);
  return LaunchStatus("RepetitionPenaltyKernel");
}

}  // namespace icecache::kernels::cuda
