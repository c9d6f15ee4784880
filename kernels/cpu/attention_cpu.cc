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
// exp(x) for x <= 0 (softmax arguments), Cephes expf polynomial with Cody-Waite reduction:
// about 1 ulp; inputs below -87 flush towards 0.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// Fast path for head_dim % 16 == 0 and a GQA group of G heads. One pass over the pages with an
// online softmax (running max and sum per head), so each page's K and V (contiguous) are read
// once, back to back; K and V rows are converted in registers and shared by the G heads; pages
// two ahead are prefetched.
template <DType T, int G>
void DecodeOneListVec(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores) {
  const int d = p.head_dim, chunks = d / 16, P = p.page_size;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * G;
  float* out = p.out + head0 * d;
  for (int i = 0; i < G * d; ++i) out[i] = 0.f;
  const int padded = (P + 15) / 16 * 16;
  scores.resize(static_cast<size_t>(G) * padded);
  const float* q = p.q + head0 * d;
  const char* pages = static_cast<const char*>(p.pages);
  const size_t elem = DTypeSize(T);
  const size_t page_bytes = static_cast<size_t>(2) * P * d * elem;
  const size_t block_bytes = static_cast<size_t>(P) * d * elem;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m[G], l[G];
  for (int h = 0; h < G; ++h) {
    m[h] = kNegInf;
    l[h] = 0.f;
  }
  auto prefetch_page = [&](int i) {
    const char* base = pages + static_cast<size_t>(p.page_ids[i]) * page_bytes;
    const size_t bytes = static_cast<size_t>(p.page_valid[i]) * d * elem;
    for (size_t o = 0; o < bytes; o += 64) {
      _mm_prefetch(base + o, _MM_HINT_T0);
      _mm_prefetch(base + block_bytes + o, _MM_HINT_T0);
    }
  };
  if (begin < end) prefetch_page(begin);
  if (begin + 1 < end) prefetch_page(begin + 1);
  for (int i = begin; i < end; ++i) {
    if (i + 2 < end) prefetch_page(i + 2);
    const int n = p.page_valid[i];
    if (n == 0) continue;
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * page_bytes;
    const char* vbase = kbase + block_bytes;
    for (int s = 0; s < n; ++s) {
      const char* krow = kbase + static_cast<size_t>(s) * d * elem;
      __m512 acc[G];
      for (int h = 0; h < G; ++h) acc[h] = _mm512_setzero_ps();
      for (int c = 0; c < chunks; ++c) {
        const __m512 kv = Load16<T>(krow, c * 16);
        for (int h = 0; h < G; ++h) acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q + h * d + c * 16), kv, acc[h]);
      }
      for (int h = 0; h < G; ++h) scores[h * padded + s] = _mm512_reduce_add_ps(acc[h]) * p.scale;
    }
    for (int h = 0; h < G; ++h) {
      float* sc = scores.data() + h * padded;
      float pm = kNegInf;
      for (int s = 0; s < n; ++s) pm = std::max(pm, sc[s]);
      const float m_new = std::max(m[h], pm);
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int s0 = 0; s0 < n; s0 += 16) {
        const __mmask16 mask = n - s0 >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - s0)) - 1u);
        const __m512 e = _mm512_maskz_mov_ps(mask, ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(sc + s0), mv)));
        _mm512_storeu_ps(sc + s0, e);
        sum = _mm512_add_ps(sum, e);
      }
      if (m_new > m[h]) {
        const float alpha = m[h] == kNegInf ? 0.f : std::exp(m[h] - m_new);
        if (alpha != 1.f) {
          l[h] *= alpha;
          for (int e = 0; e < d; ++e) out[h * d + e] *= alpha;
        }
        m[h] = m_new;
      }
      l[h] += _mm512_reduce_add_ps(sum);
    }
    for (int c = 0; c < chunks; ++c) {
      __m512 o[G];
      for (int h = 0; h < G; ++h) o[h] = _mm512_loadu_ps(out + h * d + c * 16);
      for (int s = 0; s < n; ++s) {
        const __m512 vv = Load16<T>(vbase + static_cast<size_t>(s) * d * elem, c * 16);
        for (int h = 0; h < G; ++h) o[h] = _mm512_fmadd_ps(_mm512_set1_ps(scores[h * padded + s]), vv, o[h]);
      }
      for (int h = 0; h < G; ++h) _mm512_storeu_ps(out + h * d + c * 16, o[h]);
    }
  }
  for (int h = 0; h < G; ++h) {
    if (l[h] > 0.f) {
      const float inv = 1.f / l[h];
      for (int e = 0; e < d; ++e) out[h * d + e] *= inv;
    }
    if (p.lse != nullptr) p.lse[head0 + h] = l[h] > 0.f ? m[h] + std::log(l[h]) : kNegInf;
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
