// CPU attention. Decode: per (sequence, kv head) one task; each K/V row is converted to fp32 once
// and used by every query head of the GQA group. Scores are kept for the whole selected set, so the
// softmax is exact (two passes over the pages: K, then V).
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace icecache::kernels::cpu {

namespace {

template <DType T>
void DecodeOneList(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores,
                   std::vector<float>& row) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  int slots = 0;
  for (int i = begin; i < end; ++i) slots += p.page_valid[i];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * group;
  float* out = p.out + head0 * d;
  if (slots == 0) {
    for (size_t i = 0; i < static_cast<size_t>(group) * d; ++i) out[i] = 0.f;
    if (p.lse != nullptr) {
      for (int h = 0; h < group; ++h) p.lse[head0 + h] = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  scores.resize(static_cast<size_t>(group) * slots);
  row.resize(d);
  const float* q = p.q + head0 * d;
  const char* pages = static_cast<const char*>(p.pages);
  const size_t elem = DTypeSize(T);
  const size_t page_elems = static_cast<size_t>(2) * p.page_size * d;
  int idx = 0;
  for (int i = begin; i < end; ++i) {
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * page_elems * elem;
    for (int s = 0; s < p.page_valid[i]; ++s, ++idx) {
      ToF32<T>(kbase + static_cast<size_t>(s) * d * elem, row.data(), d);
      for (int h = 0; h < group; ++h) {
        scores[static_cast<size_t>(h) * slots + idx] =
            Dot<DType::kF32>(q + static_cast<size_t>(h) * d, row.data(), d) * p.scale;
      }
    }
  }
  for (int h = 0; h < group; ++h) {
    float* sc = scores.data() + static_cast<size_t>(h) * slots;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < slots; ++j) mx = std::max(mx, sc[j]);
    float sum = 0.f;
    for (int j = 0; j < slots; ++j) {
      sc[j] = std::exp(sc[j] - mx);
      sum += sc[j];
    }
    const float inv = 1.f / sum;
    for (int j = 0; j < slots; ++j) sc[j] *= inv;
    if (p.lse != nullptr) p.lse[head0 + h] = mx + std::log(sum);
    float* o = out + static_cast<size_t>(h) * d;
    for (int e = 0; e < d; ++e) o[e] = 0.f;
  }
  idx = 0;
  for (int i = begin; i < end; ++i) {
    const char* vbase =
        pages + (static_cast<size_t>(p.page_ids[i]) * page_elems + static_cast<size_t>(p.page_size) * d) * elem;
    for (int s = 0; s < p.page_valid[i]; ++s, ++idx) {
      ToF32<T>(vbase + static_cast<size_t>(s) * d * elem, row.data(), d);
      for (int h = 0; h < group; ++h) {
        Axpy<DType::kF32>(scores[static_cast<size_t>(h) * slots + idx], row.data(),
                          out + static_cast<size_t>(h) * d, d);
      }
    }
  }
}

#if defined(__AVX512F__)
// Fast path for head_dim % 16 == 0 and a GQA group of G heads: K and V rows are converted in
// registers and used by all G heads; V is applied page by page with the outputs in L1; the next
// page's K block is prefetched while the current one is scored.
template <DType T, int G>
void DecodeOneListVec(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores) {
  const int d = p.head_dim, chunks = d / 16;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  int slots = 0;
  for (int i = begin; i < end; ++i) slots += p.page_valid[i];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * G;
  float* out = p.out + head0 * d;
  for (int i = 0; i < G * d; ++i) out[i] = 0.f;
  if (slots == 0) {
    if (p.lse != nullptr) {
      for (int h = 0; h < G; ++h) p.lse[head0 + h] = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  scores.resize(static_cast<size_t>(G) * slots);
  const float* q = p.q + head0 * d;
  const char* pages = static_cast<const char*>(p.pages);
  const size_t elem = DTypeSize(T);
  const size_t page_bytes = static_cast<size_t>(2) * p.page_size * d * elem;
  const size_t block_bytes = static_cast<size_t>(p.page_size) * d * elem;
  auto prefetch = [&](const char* base, int valid) {
    const size_t bytes = static_cast<size_t>(valid) * d * elem;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(base + o, _MM_HINT_T0);
  };
  int idx = 0;
  for (int i = begin; i < end; ++i) {
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * page_bytes;
    if (i + 1 < end) prefetch(pages + static_cast<size_t>(p.page_ids[i + 1]) * page_bytes, p.page_valid[i + 1]);
    for (int s = 0; s < p.page_valid[i]; ++s, ++idx) {
      const char* krow = kbase + static_cast<size_t>(s) * d * elem;
      __m512 acc[G];
      for (int h = 0; h < G; ++h) acc[h] = _mm512_setzero_ps();
      for (int c = 0; c < chunks; ++c) {
        const __m512 kv = Load16<T>(krow, c * 16);
        for (int h = 0; h < G; ++h) acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * d + c * 16), kv, acc[h]);
      }
      for (int h = 0; h < G; ++h) scores[static_cast<size_t>(h) * slots + idx] = _mm512_reduce_add_ps(acc[h]) * p.scale;
    }
  }
  float inv[G];
  for (int h = 0; h < G; ++h) {
    float* sc = scores.data() + static_cast<size_t>(h) * slots;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < slots; ++j) mx = std::max(mx, sc[j]);
    float sum = 0.f;
    for (int j = 0; j < slots; ++j) {
      sc[j] = std::exp(sc[j] - mx);
      sum += sc[j];
    }
    inv[h] = 1.f / sum;
    if (p.lse != nullptr) p.lse[head0 + h] = mx + std::log(sum);
  }
  idx = 0;
  for (int i = begin; i < end; ++i) {
    const char* vbase = pages + static_cast<size_t>(p.page_ids[i]) * page_bytes + block_bytes;
    if (i + 1 < end) {
      prefetch(pages + static_cast<size_t>(p.page_ids[i + 1]) * page_bytes + block_bytes, p.page_valid[i + 1]);
    }
    const int n = p.page_valid[i];
    for (int c = 0; c < chunks; ++c) {
      __m512 o[G];
      for (int h = 0; h < G; ++h) o[h] = _mm512_loadu_ps(out + h * d + c * 16);
      for (int s = 0; s < n; ++s) {
        const __m512 vv = Load16<T>(vbase + static_cast<size_t>(s) * d * elem, c * 16);
        for (int h = 0; h < G; ++h) {
          o[h] = _mm512_fmadd_ps(_mm512_set1_ps(scores[static_cast<size_t>(h) * slots + idx + s]), vv, o[h]);
        }
      }
      for (int h = 0; h < G; ++h) _mm512_storeu_ps(out + h * d + c * 16, o[h]);
    }
    idx += n;
  }
  for (int h = 0; h < G; ++h) {
    for (int e = 0; e < d; ++e) out[h * d + e] *= inv[h];
  }
}
#endif

// The decode routine for this dtype and layout.
template <DType T>
void DecodeList(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores,
                std::vector<float>& row) {
#if defined(__AVX512F__)
  if (p.head_dim % 16 == 0) {
    switch (p.num_q_heads / p.num_kv_heads) {
      case 1: return DecodeOneListVec<T, 1>(p, b, g, scores);
      case 2: return DecodeOneListVec<T, 2>(p, b, g, scores);
      case 4: return DecodeOneListVec<T, 4>(p, b, g, scores);
      case 8: return DecodeOneListVec<T, 8>(p, b, g, scores);
      default: break;
    }
  }
#endif
  DecodeOneList<T>(p, b, g, scores, row);
}

}  // namespace

Status PagedDecodeAttention(const PagedDecodeAttentionParams& p) {
  const int lists = p.batch * p.num_kv_heads;
  DispatchDType(p.kv_dtype, [&]<DType T>() {
#pragma omp parallel num_threads(CpuThreads())
    {
      std::vector<float> scores, row;
#pragma omp for schedule(dynamic, 1)
      for (int l = 0; l < lists; ++l) DecodeList<T>(p, l / p.num_kv_heads, l % p.num_kv_heads, scores, row);
    }
  });
  return Status::Ok();
}

Status PrefillAttention(const PrefillAttentionParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int offset = p.kv_len - p.q_len;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
#pragma omp parallel num_threads(CpuThreads())
  {
    std::vector<float> sc(p.kv_len);
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int i = 0; i < p.q_len; ++i) {
      for (int h = 0; h < p.num_q_heads; ++h) {
        const int kvh = h / group;
        const float* q = p.q + (static_cast<size_t>(i) * p.num_q_heads + h) * d;
        float* o = p.out + (static_cast<size_t>(i) * p.num_q_heads + h) * d;
        const int n = i + offset + 1;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < n; ++j) {
          sc[j] = Dot<DType::kF32>(q, p.k + j * kv_stride + static_cast<size_t>(kvh) * d, d) * p.scale;
          mx = std::max(mx, sc[j]);
        }
        float sum = 0.f;
        for (int j = 0; j < n; ++j) {
          sc[j] = std::exp(sc[j] - mx);
          sum += sc[j];
        }
        const float inv = 1.f / sum;
        for (int e = 0; e < d; ++e) o[e] = 0.f;
        for (int j = 0; j < n; ++j) {
          Axpy<DType::kF32>(sc[j] * inv, p.v + j * kv_stride + static_cast<size_t>(kvh) * d, o, d);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu
