// Attention on the GPU.
//  * Paged decode: grid (sequence × kv head, split). Each block walks its share of the selected
//    pages in chunks of kChunk slot positions, loads the K chunk into shared memory once for all
//    query heads of the GQA group, keeps an online softmax (running max m, sum l, unnormalised
//    output) per head, and writes a partial result; a merge kernel combines the splits exactly.
//  * Prefill: FlashAttention-style tiles of kBr queries × kBc keys with online softmax, causal.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

constexpr int kChunk = 32;
constexpr int kDecodeThreads = 128;
constexpr int kMaxSplits = 64;
constexpr float kNegInf = -INFINITY;

struct ChunkPos {
  int page;  // index into page_ids, or -1
  int slot;
};

// Where slot position s of chunk c of the page range [p0, p1) lies.
__device__ __forceinline__ ChunkPos PositionOf(int c, int s, int p0, int p1, int page_size) {
  ChunkPos pos{-1, 0};
  if (page_size <= kChunk) {
    const int per = kChunk / page_size;
    if (s >= per * page_size) return pos;
    const int pi = p0 + c * per + s / page_size;
    if (pi < p1) pos = {pi, s % page_size};
  } else {
    const int per_page = (page_size + kChunk - 1) / kChunk;
    const int pi = p0 + c / per_page;
    const int slot = (c % per_page) * kChunk + s;
    if (pi < p1 && slot < page_size) pos = {pi, slot};
  }
  return pos;
}

__device__ __forceinline__ int ChunksOf(int pages, int page_size) {
  if (page_size <= kChunk) {
    const int per = kChunk / page_size;
    return (pages + per - 1) / per;
  }
  return pages * ((page_size + kChunk - 1) / kChunk);
}

template <DType T>
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeSplitKernel(const float* __restrict__ q, const void* __restrict__ pages,
                      const int32_t* __restrict__ indptr, const int32_t* __restrict__ ids,
                      const int32_t* __restrict__ valid, int num_q_heads, int num_kv_heads,
                      int head_dim, int page_size, float scale, int splits,
                      float* __restrict__ part_o, float* __restrict__ part_ml) {
  const int list = blockIdx.x, split = blockIdx.y;
  const int group = num_q_heads / num_kv_heads;
  const int d = head_dim, ld = head_dim + 1;
  const int b = list / num_kv_heads, g = list % num_kv_heads;
  const int begin = indptr[list], end = indptr[list + 1];
  const int per_split = (end - begin + splits - 1) / splits;
  const int p0 = min(end, begin + split * per_split), p1 = min(end, p0 + per_split);

  extern __shared__ float smem[];
  float* q_s = smem;                        // [group, d]
  float* kv_s = q_s + group * d;            // [kChunk, d + 1]
  float* p_s = kv_s + kChunk * ld;          // [group, kChunk]
  float* acc_s = p_s + group * kChunk;      // [group, d]
  float* m_s = acc_s + group * d;           // [group]
  float* l_s = m_s + group;                 // [group]
  float* alpha_s = l_s + group;             // [group]
  int* slot_ok = reinterpret_cast<int*>(alpha_s + group);  // [kChunk]

  const float* qg = q + (static_cast<size_t>(b) * num_q_heads + static_cast<size_t>(g) * group) * d;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
    q_s[i] = qg[i];
    acc_s[i] = 0.f;
  }
  for (int h = threadIdx.x; h < group; h += blockDim.x) {
    m_s[h] = kNegInf;
    l_s[h] = 0.f;
  }
  const size_t page_elems = static_cast<size_t>(2) * page_size * d;
  const int chunks = ChunksOf(p1 - p0, page_size);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  __syncthreads();

  for (int c = 0; c < chunks; ++c) {
    if (threadIdx.x < kChunk) {
      const ChunkPos pos = PositionOf(c, threadIdx.x, p0, p1, page_size);
      slot_ok[threadIdx.x] = pos.page >= 0 && pos.slot < valid[pos.page];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * d; i += blockDim.x) {
      const int s = i / d, e = i - s * d;
      float v = 0.f;
      if (slot_ok[s]) {
        const ChunkPos pos = PositionOf(c, s, p0, p1, page_size);
        v = LoadElem<T>(pages, ids[pos.page] * page_elems + static_cast<size_t>(pos.slot) * d + e);
      }
      kv_s[s * ld + e] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * kChunk; i += blockDim.x) {
      const int h = i / kChunk, s = i - h * kChunk;
      float dot = 0.f;
      const float* qh = q_s + h * d;
      const float* ks = kv_s + s * ld;
      for (int e = 0; e < d; ++e) dot += qh[e] * ks[e];
      p_s[i] = slot_ok[s] ? dot * scale : kNegInf;
    }
    __syncthreads();
    for (int h = warp; h < group; h += warps) {
      const float v = p_s[h * kChunk + lane];
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, WarpMax(v));
      const float pv = (v == kNegInf) ? 0.f : expf(v - m_new);
      const float alpha = (m_old == kNegInf) ? 0.f : expf(m_old - m_new);
      const float sum = WarpSum(pv);
      p_s[h * kChunk + lane] = pv;
      if (lane == 0) {
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
        alpha_s[h] = alpha;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * d; i += blockDim.x) {
      const int s = i / d, e = i - s * d;
      float v = 0.f;
      if (slot_ok[s]) {
        const ChunkPos pos = PositionOf(c, s, p0, p1, page_size);
        v = LoadElem<T>(pages, ids[pos.page] * page_elems + static_cast<size_t>(page_size + pos.slot) * d + e);
      }
      kv_s[s * ld + e] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
      const int h = i / d, e = i - h * d;
      float a = acc_s[i] * alpha_s[h];
      const float* ph = p_s + h * kChunk;
      for (int s = 0; s < kChunk; ++s) a += ph[s] * kv_s[s * ld + e];
      acc_s[i] = a;
    }
    __syncthreads();
  }
  const size_t part = static_cast<size_t>(list) * splits + split;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) part_o[part * group * d + i] = acc_s[i];
  for (int h = threadIdx.x; h < group; h += blockDim.x) {
    part_ml[(part * group + h) * 2] = m_s[h];
    part_ml[(part * group + h) * 2 + 1] = l_s[h];
  }
}

// One block per (list, head of the group): out = Σ_s o_s e^{m_s - M} / Σ_s l_s e^{m_s - M}.
__global__ void DecodeMergeKernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                  int splits, int group, int d, float* __restrict__ out,
                                  float* __restrict__ lse) {
  const int list = blockIdx.x / group, h = blockIdx.x % group;
  float M = kNegInf;
  for (int s = 0; s < splits; ++s) {
    M = fmaxf(M, part_ml[((static_cast<size_t>(list) * splits + s) * group + h) * 2]);
  }
  float L = 0.f;
  for (int s = 0; s < splits; ++s) {
    const size_t k = ((static_cast<size_t>(list) * splits + s) * group + h) * 2;
    if (part_ml[k] != kNegInf) L += part_ml[k + 1] * expf(part_ml[k] - M);
  }
  float* o = out + (static_cast<size_t>(list) * group + h) * d;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    float acc = 0.f;
    if (M != kNegInf) {
      for (int s = 0; s < splits; ++s) {
        const size_t part = static_cast<size_t>(list) * splits + s;
        const float m = part_ml[(part * group + h) * 2];
        if (m != kNegInf) acc += part_o[(part * group + h) * d + e] * expf(m - M);
      }
      acc /= L;
    }
    o[e] = acc;
  }
  if (lse != nullptr && threadIdx.x == 0) {
    lse[static_cast<size_t>(list) * group + h] = (M == kNegInf) ? kNegInf : M + logf(L);
  }
}

// Device attributes the launches size themselves by, cached per device once a query succeeds. A
// failed query is returned (and its error cleared, so the next launch check does not report it)
// and asked again on the next call: nothing is cached from it.
constexpr int kCachedDevices = 64;  // devices beyond this are queried every call

StatusOr<int> CachedDeviceAttribute(cudaDeviceAttr attr, std::atomic<int>* cache, const char* what) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, "cudaGetDevice");
  }
  const bool cached = dev >= 0 && dev < kCachedDevices;
  if (cached) {
    if (const int v = cache[dev].load(std::memory_order_relaxed); v > 0) return v;
  }
  int n = 0;
  err = cudaDeviceGetAttribute(&n, attr, dev);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, what);
  }
  if (n <= 0) {
    return InternalError(std::string(what) + " returned " + std::to_string(n) + " on device " + std::to_string(dev));
  }
  if (cached) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

StatusOr<int> SmCount() {
  static std::atomic<int> cache[kCachedDevices];
  return CachedDeviceAttribute(cudaDevAttrMultiProcessorCount, cache,
                               "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
}

StatusOr<int> MaxSharedBytes() {
  static std::atomic<int> cache[kCachedDevices];
  return CachedDeviceAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, cache,
                               "cudaDeviceGetAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)");
}

template <typename Kernel>
Status PrepareShared(Kernel kernel, size_t bytes, const char* what) {
  ICE_ASSIGN_OR_RETURN(const int max_bytes, MaxSharedBytes());
  if (bytes > static_cast<size_t>(max_bytes)) {
    return InvalidArgumentError(std::string(what) + ": head_dim/GQA group too large for shared memory (" +
                                std::to_string(bytes) + " bytes needed)");
  }
  return CudaStatus(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    "cudaFuncSetAttribute");
}

// --- prefill -----------------------------------------------------------------------------------

constexpr int kBr = 32;
constexpr int kBc = 32;
constexpr int kPrefillThreads = 128;

__global__ void __launch_bounds__(kPrefillThreads)
    PrefillKernel(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ out, int q_len, int kv_len,
                  int num_q_heads, int num_kv_heads, int d, float scale) {
  const int i0 = blockIdx.x * kBr, h = blockIdx.y;
  const int kvh = h / (num_q_heads / num_kv_heads);
  const int offset = kv_len - q_len;
  const int ld = d + 1;
  extern __shared__ float smem[];
  float* q_s = smem;                 // [kBr, d]
  float* k_s = q_s + kBr * d;        // [kBc, d + 1]
  float* v_s = k_s + kBc * ld;       // [kBc, d]
  float* s_s = v_s + kBc * d;        // [kBr, kBc]
  float* o_s = s_s + kBr * kBc;      // [kBr, d]
  float* m_s = o_s + kBr * d;        // [kBr]
  float* l_s = m_s + kBr;            // [kBr]
  float* a_s = l_s + kBr;            // [kBr]
  const size_t q_stride = static_cast<size_t>(num_q_heads) * d;
  const size_t kv_stride = static_cast<size_t>(num_kv_heads) * d;
  for (int i = threadIdx.x; i < kBr * d; i += blockDim.x) {
    const int r = i / d, e = i - r * d;
    q_s[i] = (i0 + r < q_len) ? q[(i0 + r) * q_stride + static_cast<size_t>(h) * d + e] : 0.f;
    o_s[i] = 0.f;
  }
  for (int r = threadIdx.x; r < kBr; r += blockDim.x) {
    m_s[r] = kNegInf;
    l_s[r] = 0.f;
  }
  const int last_key = min(kv_len - 1, min(i0 + kBr - 1, q_len - 1) + offset);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  __syncthreads();
  for (int j0 = 0; j0 <= last_key; j0 += kBc) {
    for (int i = threadIdx.x; i < kBc * d; i += blockDim.x) {
      const int c = i / d, e = i - c * d;
      const bool in = j0 + c < kv_len;
      const size_t src = (j0 + c) * kv_stride + static_cast<size_t>(kvh) * d + e;
      k_s[c * ld + e] = in ? k[src] : 0.f;
      v_s[i] = in ? v[src] : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kBr * kBc; i += blockDim.x) {
      const int r = i / kBc, c = i - r * kBc;
      const int qi = i0 + r, j = j0 + c;
      float s = kNegInf;
      if (qi < q_len && j < kv_len && j <= qi + offset) {
        float dot = 0.f;
        const float* qr = q_s + r * d;
        const float* kc = k_s + c * ld;
        for (int e = 0; e < d; ++e) dot += qr[e] * kc[e];
        s = dot * scale;
      }
      s_s[i] = s;
    }
    __syncthreads();
    for (int r = warp; r < kBr; r += warps) {
      const float x = s_s[r * kBc + lane];
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, WarpMax(x));
      const float p = (x == kNegInf) ? 0.f : expf(x - m_new);
      const float alpha = (m_old == kNegInf) ? 0.f : expf(m_old - m_new);
      const float sum = WarpSum(p);
      s_s[r * kBc + lane] = p;
      if (lane == 0) {
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
        a_s[r] = alpha;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kBr * d; i += blockDim.x) {
      const int r = i / d, e = i - r * d;
      float a = o_s[i] * a_s[r];
      const float* pr = s_s + r * kBc;
      for (int c = 0; c < kBc; ++c) a += pr[c] * v_s[c * d + e];
      o_s[i] = a;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < kBr * d; i += blockDim.x) {
    const int r = i / d, e = i - r * d;
    if (i0 + r < q_len) {
      out[(i0 + r) * q_stride + static_cast<size_t>(h) * d + e] = l_s[r] > 0.f ? o_s[i] / l_s[r] : 0.f;
    }
  }
}

}  // namespace

Status PagedDecodeAttention(const PagedDecodeAttentionParams& p) {
  const int lists = p.batch * p.num_kv_heads;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  // Enough blocks to fill the GPU about twice; a split with no pages just reports m = -inf.
  ICE_ASSIGN_OR_RETURN(const int sm_count, SmCount());
  const int splits = std::clamp(CeilDiv(2L * sm_count, lists), 1, kMaxSplits);
  void* ws = nullptr;
  const size_t parts = static_cast<size_t>(lists) * splits * group;
  ICE_RETURN_IF_ERROR(Workspace(parts * (d + 2) * sizeof(float), &ws));
  float* part_o = static_cast<float*>(ws);
  float* part_ml = part_o + parts * d;
  const size_t smem = (2 * group * d + kChunk * (d + 1) + group * kChunk + 3 * group) * sizeof(float) +
                      kChunk * sizeof(int);
  ICE_RETURN_IF_ERROR(DispatchDType(p.kv_dtype, [&]<DType T>() {
    ICE_RETURN_IF_ERROR(PrepareShared(DecodeSplitKernel<T>, smem, "PagedDecodeAttention"));
    DecodeSplitKernel<T><<<dim3(lists, splits), kDecodeThreads, smem, Stream()>>>(
        p.q, p.pages, p.page_indptr, p.page_ids, p.page_valid, p.num_q_heads, p.num_kv_heads, d,
        p.page_size, p.scale, splits, part_o, part_ml);
    return LaunchStatus("DecodeSplitKernel");
  }));
  DecodeMergeKernel<<<lists * group, 128, 0, Stream()>>>(part_o, part_ml, splits, group, d, p.out, p.lse);
  return LaunchStatus("DecodeMergeKernel");
}

Status PrefillAttention(const PrefillAttentionParams& p) {
  const int d = p.head_dim;
  const size_t smem = (kBr * d + kBc * (d + 1) + kBc * d + kBr * kBc + kBr * d + 3 * kBr) * sizeof(float);
  ICE_RETURN_IF_ERROR(PrepareShared(PrefillKernel, smem, "PrefillAttention"));
  PrefillKernel<<<dim3(CeilDiv(p.q_len, kBr), p.num_q_heads), kPrefillThreads, smem, Stream()>>>(
      p.q, p.k, p.v, p.out, p.q_len, p.kv_len, p.num_q_heads, p.num_kv_heads, d, p.scale);
  return LaunchStatus("PrefillKernel");
}

}  // namespace icecache::kernels::cuda
