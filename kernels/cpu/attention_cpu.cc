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

}  // namespace

Status PagedDecodeAttention(const PagedDecodeAttentionParams& p) {
  const int lists = p.batch * p.num_kv_heads;
  DispatchDType(p.kv_dtype, [&]<DType T>() {
#pragma omp parallel num_threads(CpuThreads())
    {
      std::vector<float> scores, row;
#pragma omp for schedule(dynamic, 1)
      for (int l = 0; l < lists; ++l) DecodeOneList<T>(p, l / p.num_kv_heads, l % p.num_kv_heads, scores, row);
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
