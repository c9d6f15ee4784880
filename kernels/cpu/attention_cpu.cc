// CPU attention. Paged decode: per (sequence, kv head) one task; each K/V vector is converted to
// fp32 once and used by every query head of the GQA group. AVX-512 fast path (head_dim % 16 == 0,
// GQA 1/2/4/8): one pass with an online softmax, see DecodeOneListVec; AVX2 fast path
// (head_dim % 8 == 0, GQA 1-8), the same scheme on 8 lanes: DecodeOneListAvx2 (on the
// avx512 target too, for the shapes the 16-lane kernel does not take); NEON fast
// path (head_dim % 4 == 0, GQA 1/2/3/4/8), the AVX2 scheme with each 8-lane score block as two
// 4-lane vectors: DecodeOneListNeon. Otherwise: scores kept for the whole selected set, exact
// softmax (two passes over the pages: K, then V; NEON dots, Axpy and exps on neon).

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/simd.h"  // last: switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {

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
    int j = 0;
#if ICE_SIMD_NEON
    // The exps four at a time (ExpNonPositive4: sc[j] - mx <= 0), summed per lane.
    const float32x4_t mv = vdupq_n_f32(mx);
    float32x4_t acc = vdupq_n_f32(0.f);
    for (; j + 4 <= slots; j += 4) {
      const float32x4_t e = ExpNonPositive4(vsubq_f32(vld1q_f32(sc + j), mv));
      vst1q_f32(sc + j, e);
      acc = vaddq_f32(acc, e);
    }
    sum = vaddvq_f32(acc);
#endif
    for (; j < slots; ++j) {
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

#if ICE_SIMD_AVX512

constexpr int kPrefetchPages = 4;

// Lane i of the result is lane i ^ s of v (s a power of two).
inline __m512 SwapLanes(__m512 v, int s) {
  const __m512i idx = _mm512_xor_si512(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(s));
  return _mm512_permutexvar_ps(idx, v);
}

// Scores of a page are kept token-major, 16 per vector: lane t * G + h is head h of token t.
// Reduces the lanes of each head (lane % G) to their max or sum, the result in every such lane.
template <int G, bool kMax>
inline __m512 FoldTokens(__m512 v) {
  for (int s = 8; s >= G; s /= 2) {
    const __m512 w = SwapLanes(v, s);
    v = kMax ? _mm512_max_ps(v, w) : _mm512_add_ps(v, w);
  }
  return v;
}

// V columns [c0 * 16, (c0 + CC) * 16) of a page: out[h] = out[h] * alpha[h] + sum_t e[t, h] v[t]
// for the G heads; the G x CC outputs stay in registers while the page's V rows stream by.
template <DType T, int G, int CC>
void AccumulateV(const char* vbase, size_t row_bytes, int n, int c0, const float* e,
                 const float* alpha, int d, float* out) {
  __m512 o[G][CC];
  for (int h = 0; h < G; ++h) {
    const __m512 a = _mm512_set1_ps(alpha[h]);
    for (int c = 0; c < CC; ++c) o[h][c] = _mm512_mul_ps(_mm512_loadu_ps(out + h * d + (c0 + c) * 16), a);
  }
  for (int t = 0; t < n; ++t) {
    __m512 v[CC];
    if constexpr (T == DType::kBF16 && CC % 2 == 0) {
      // Pairs of chunks widened as in the score loop: out holds those columns permuted alike.
      const __m512i zero = _mm512_setzero_si512();
      for (int c = 0; c < CC; c += 2) {
        const __m512i raw = _mm512_loadu_si512(vbase + t * row_bytes + (c0 + c) * 32);
        v[c] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
        v[c + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
      }
    } else {
      for (int c = 0; c < CC; ++c) v[c] = Load16<T>(vbase + t * row_bytes, (c0 + c) * 16);
    }
    for (int h = 0; h < G; ++h) {
      const __m512 pe = _mm512_set1_ps(e[t * G + h]);
      for (int c = 0; c < CC; ++c) o[h][c] = _mm512_fmadd_ps(pe, v[c], o[h][c]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int c = 0; c < CC; ++c) _mm512_storeu_ps(out + h * d + (c0 + c) * 16, o[h][c]);
}

// Passes of CP chunks, then CP / 2, then pairs, then the last chunk of an odd count: every pass
// but that last one starts at an even chunk, so bf16 pairs never straddle a 32-column block.
template <DType T, int G, int CP>
void AccumulateVColumns(const char* vbase, size_t row_bytes, int n, int chunks, const float* e,
                        const float* alpha, int d, float* out) {
  static_assert(CP % 2 == 0);
  int c0 = 0;
  for (; c0 + CP <= chunks; c0 += CP) AccumulateV<T, G, CP>(vbase, row_bytes, n, c0, e, alpha, d, out);
  if constexpr (CP >= 4) {
    if (c0 + CP / 2 <= chunks) {
      AccumulateV<T, G, CP / 2>(vbase, row_bytes, n, c0, e, alpha, d, out);
      c0 += CP / 2;
    }
  }
  for (; c0 + 2 <= chunks; c0 += 2) AccumulateV<T, G, 2>(vbase, row_bytes, n, c0, e, alpha, d, out);
  if (c0 < chunks) AccumulateV<T, G, 1>(vbase, row_bytes, n, c0, e, alpha, d, out);
}

// Position j of 32-column block [b32, b32 + 32) of a bf16-permuted row (see the score loop) holds
// column b32 + UnpackedColumn(j - b32).
inline int UnpackedColumn(int j) { return (j % 16) / 4 * 8 + j / 16 * 4 + j % 4; }

// Fast path for head_dim % 16 == 0 and a GQA group of G heads. One pass over the pages with an
// online softmax (running max and sum per head), so each page's K and V (contiguous) are read
// once, back to back. Per page:
//  * scores: TB = 16 / G tokens at a time, G x TB fp32 accumulators (each K vector converted once
//    for the G heads, each q vector used for TB tokens), then one joint reduction of the 16
//    accumulators into one token-major score vector;
//  * softmax statistics vectorised over those score vectors;
//  * V: G heads x CP column chunks of the output in registers while the page's V rows stream by.
template <DType T, int G>
void DecodeOneListVec(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores,
                      std::vector<float>& qperm) {
  constexpr int TB = 16 / G;
  constexpr int CP = G >= 2 ? 16 / G : 8;
  const int d = p.head_dim, chunks = d / 16, P = p.page_size;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * G;
  float* out = p.out + head0 * d;
  for (int i = 0; i < G * d; ++i) out[i] = 0.f;
  const int max_blocks = (P + TB - 1) / TB;
  scores.resize(static_cast<size_t>(max_blocks) * 16);
  float* sc = scores.data();
  const float* q = p.q + head0 * d;
  // bf16: q with each 32-column block in the order the unpacked K vectors come in.
  const float* qp = q;
  if constexpr (T == DType::kBF16) {
    qperm.resize(static_cast<size_t>(G) * d);
    for (int h = 0; h < G; ++h) {
      for (int b32 = 0; b32 + 32 <= d; b32 += 32) {
        for (int j = 0; j < 32; ++j) qperm[h * d + b32 + j] = q[h * d + b32 + UnpackedColumn(j)];
      }
      for (int j = d / 32 * 32; j < d; ++j) qperm[h * d + j] = q[h * d + j];
    }
    qp = qperm.data();
  }
  const char* pages = static_cast<const char*>(p.pages);
  const size_t elem = DTypeSize(T);
  const size_t row_bytes = static_cast<size_t>(d) * elem;
  const size_t block_bytes = static_cast<size_t>(P) * row_bytes;
  const size_t page_bytes = 2 * block_bytes;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const __m512 scale = _mm512_set1_ps(p.scale);
  // Running max and sum, lane t * G + h holding head h's (so every lane's head is lane % G).
  __m512 m = neg_inf, l = _mm512_setzero_ps();
  // Software prefetch into L2 (prefetcht1; t0 was slower), kPrefetchPages pages ahead, spread
  // over the score blocks of the current page rather than issued as one burst per page: with
  // scattered pages, the hardware streamer alone reaches only ~half the sequential bandwidth.
  // always_inline: GCC 12 deems a function that only prefetches pure and deletes its calls (the
  // previous kernel's prefetch never reached the binary).
  auto prefetch_lines = [&](int page, size_t lo, size_t hi) __attribute__((always_inline)) {
    const char* base = pages + static_cast<size_t>(p.page_ids[page]) * page_bytes;
    for (size_t o = lo; o < hi; o += 64) {
      _mm_prefetch(base + o, _MM_HINT_T1);
      _mm_prefetch(base + block_bytes + o, _MM_HINT_T1);
    }
  };
  for (int j = begin; j < std::min(end, begin + kPrefetchPages); ++j) {
    prefetch_lines(j, 0, static_cast<size_t>(p.page_valid[j]) * row_bytes);
  }
  for (int i = begin; i < end; ++i) {
    const int n = p.page_valid[i];
    if (n == 0) continue;
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * page_bytes;
    const char* vbase = kbase + block_bytes;
    const int blocks = (n + TB - 1) / TB;
    const int ahead = i + kPrefetchPages;
    const size_t ahead_bytes = ahead < end ? static_cast<size_t>(p.page_valid[ahead]) * row_bytes : 0;
    __m512 page_max = neg_inf;
    for (int blk = 0; blk < blocks; ++blk) {
      if (ahead < end) {
        // This block's share of the page kPrefetchPages ahead, in whole cache lines.
        prefetch_lines(ahead, ahead_bytes * blk / blocks / 64 * 64,
                       blk + 1 == blocks ? ahead_bytes : ahead_bytes * (blk + 1) / blocks / 64 * 64);
      }
      const char* krow[TB];
      // Rows past the valid ones repeat the last valid row (finite data); their lanes are masked.
      for (int t = 0; t < TB; ++t) krow[t] = kbase + std::min(blk * TB + t, n - 1) * row_bytes;
      __m512 acc[16];
      for (int a = 0; a < 16; ++a) acc[a] = _mm512_setzero_ps();
      int c = 0;
      if constexpr (T == DType::kBF16) {
        // 32 bf16 of a K row per load, widened by interleaving with zeros: elements 0-3 of each
        // 128-bit lane (low vector), then 4-7 (high vector), matched by the permuted q.
        const __m512i zero = _mm512_setzero_si512();
        for (; c + 2 <= chunks; c += 2) {
          for (int half = 0; half < 2; ++half) {
            __m512 qv[G];
            for (int h = 0; h < G; ++h) {
              qv[h] = _mm512_loadu_ps(qp + h * d + c * 16 + half * 16);
              __asm__("" : "+v"(qv[h]));
            }
            for (int t = 0; t < TB; ++t) {
              const __m512i raw = _mm512_loadu_si512(krow[t] + c * 32);
              const __m512 kv = _mm512_castsi512_ps(half == 0 ? _mm512_unpacklo_epi16(zero, raw)
                                                              : _mm512_unpackhi_epi16(zero, raw));
              for (int h = 0; h < G; ++h) acc[t * G + h] = _mm512_fmadd_ps(qv[h], kv, acc[t * G + h]);
            }
          }
        }
      }
      for (; c < chunks; ++c) {
        __m512 qv[G];
        for (int h = 0; h < G; ++h) {
          qv[h] = _mm512_loadu_ps(q + h * d + c * 16);
          __asm__("" : "+v"(qv[h]));  // else GCC reloads q in each of the TB FMAs using it
        }
        for (int t = 0; t < TB; ++t) {
          const __m512 kv = Load16<T>(krow[t], c * 16);
          for (int h = 0; h < G; ++h) acc[t * G + h] = _mm512_fmadd_ps(qv[h], kv, acc[t * G + h]);
        }
      }
      const int valid_lanes = std::min(TB, n - blk * TB) * G;
      const __mmask16 mask = valid_lanes >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid_lanes) - 1u);
      const __m512 s = _mm512_mask_mov_ps(neg_inf, mask, _mm512_mul_ps(ReduceAdd16(acc), scale));
      _mm512_storeu_ps(sc + blk * 16, s);
      page_max = _mm512_max_ps(page_max, s);
    }
    const __m512 m_new = _mm512_max_ps(m, FoldTokens<G, true>(page_max));
    // exp(-inf - m_new) would be exp(-87) rather than 0: the first page sets alpha to 0 exactly.
    const __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, neg_inf, _CMP_NEQ_OQ),
                                             ExpNonPositive(_mm512_sub_ps(m, m_new)));
    __m512 sum = _mm512_setzero_ps();
    for (int blk = 0; blk < blocks; ++blk) {
      const __m512 s = _mm512_loadu_ps(sc + blk * 16);
      const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, neg_inf, _CMP_NEQ_OQ),
                                           ExpNonPositive(_mm512_sub_ps(s, m_new)));
      _mm512_storeu_ps(sc + blk * 16, e);
      sum = _mm512_add_ps(sum, e);
    }
    l = _mm512_fmadd_ps(l, alpha, FoldTokens<G, false>(sum));
    m = m_new;
    alignas(64) float alpha_s[16];
    _mm512_store_ps(alpha_s, alpha);
    AccumulateVColumns<T, G, CP>(vbase, row_bytes, n, chunks, sc, alpha_s, d, out);
  }
  alignas(64) float m_s[16], l_s[16];
  _mm512_store_ps(m_s, m);
  _mm512_store_ps(l_s, l);
  for (int h = 0; h < G; ++h) {
    if constexpr (T == DType::kBF16) {
      for (int b32 = 0; b32 + 32 <= d; b32 += 32) {
        float block[32];
        std::copy_n(out + h * d + b32, 32, block);
        for (int j = 0; j < 32; ++j) out[h * d + b32 + UnpackedColumn(j)] = block[j];
      }
    }
    if (l_s[h] > 0.f) {
      const float inv = 1.f / l_s[h];
      for (int e = 0; e < d; ++e) out[h * d + e] *= inv;
    }
    if (p.lse != nullptr) p.lse[head0 + h] = l_s[h] > 0.f ? m_s[h] + std::log(l_s[h]) : kNegInf;
  }
}
#endif

#if ICE_SIMD_AVX2  // also in the avx512 target: the shapes DecodeOneListVec does not take
constexpr int kPrefetchPagesAvx2 = 4;

// Lane j of the result is the sum of a[j]'s lanes (8 horizontal sums at the cost of ~2).
inline __m256 ReduceAdd8(const __m256 a[8]) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// The AVX2 fast path (head_dim % 8 == 0, GQA group G <= 8): DecodeOneListVec's scheme on 8 lanes.
// One pass over the pages with an online softmax; per page:
//  * scores: TB = 8 / G tokens at a time (lane t * G + h: token t, head h; G = 3 leaves two lanes
//    unused), each K vector converted once for the G heads, one joint reduction per block;
//  * the page's max, exps and sums per head (exps vectorised, the per-head folds scalar);
//  * V: G heads x CC column chunks of the output in registers while the page's V rows stream by.
template <DType T, int G>
void DecodeOneListAvx2(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores) {
  constexpr int TB = 8 / G;
  constexpr int CC = G >= 8 ? 1 : 8 / G;
  const int d = p.head_dim, chunks = d / 8, P = p.page_size;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * G;
  float* out = p.out + head0 * d;
  for (int i = 0; i < G * d; ++i) out[i] = 0.f;
  const int max_blocks = (P + TB - 1) / TB;
  scores.resize(static_cast<size_t>(max_blocks) * 8);
  float* sc = scores.data();
  const float* q = p.q + head0 * d;
  const char* pages = static_cast<const char*>(p.pages);
  const size_t row_bytes = static_cast<size_t>(d) * DTypeSize(T);
  const size_t block_bytes = static_cast<size_t>(P) * row_bytes;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256 scale = _mm256_set1_ps(p.scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  float m[G], l[G];
  for (int h = 0; h < G; ++h) {
    m[h] = kNegInf;
    l[h] = 0.f;
  }
  auto prefetch_page = [&](int page) __attribute__((always_inline)) {
    const char* base = pages + static_cast<size_t>(p.page_ids[page]) * 2 * block_bytes;
    const size_t bytes = static_cast<size_t>(p.page_valid[page]) * row_bytes;
    for (size_t o = 0; o < bytes; o += 64) {
      _mm_prefetch(base + o, _MM_HINT_T1);
      _mm_prefetch(base + block_bytes + o, _MM_HINT_T1);
    }
  };
  for (int j = begin; j < std::min(end, begin + kPrefetchPagesAvx2); ++j) prefetch_page(j);
  for (int i = begin; i < end; ++i) {
    if (i + kPrefetchPagesAvx2 < end) prefetch_page(i + kPrefetchPagesAvx2);
    const int n = p.page_valid[i];
    if (n == 0) continue;
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * 2 * block_bytes;
    const char* vbase = kbase + block_bytes;
    const int blocks = (n + TB - 1) / TB;
    __m256 page_max = neg_inf;
    for (int blk = 0; blk < blocks; ++blk) {
      const char* krow[TB];
      // Rows past the valid ones repeat the last valid row (finite data); their lanes are masked.
      for (int t = 0; t < TB; ++t) krow[t] = kbase + std::min(blk * TB + t, n - 1) * row_bytes;
      __m256 acc[8];
      for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
      for (int c = 0; c < chunks; ++c) {
        for (int t = 0; t < TB; ++t) {
          const __m256 kv = Load8<T>(krow[t], c * 8);
          for (int h = 0; h < G; ++h) acc[t * G + h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + c * 8), kv, acc[t * G + h]);
        }
      }
      const int valid_lanes = std::min(TB, n - blk * TB) * G;
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(valid_lanes), lane));
      const __m256 s = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(ReduceAdd8(acc), scale), keep);
      _mm256_storeu_ps(sc + blk * 8, s);
      page_max = _mm256_max_ps(page_max, s);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, page_max);
    float m_new[G], alpha[G];
    for (int h = 0; h < G; ++h) {
      m_new[h] = m[h];
      for (int t = 0; t < TB; ++t) m_new[h] = std::max(m_new[h], lanes[t * G + h]);
      // exp(-inf - m_new) must be 0 exactly: the first page sets alpha to 0.
      alpha[h] = m[h] == kNegInf ? 0.f : std::exp(m[h] - m_new[h]);
    }
    alignas(32) float mrow[8];
    for (int j = 0; j < 8; ++j) mrow[j] = j < TB * G ? m_new[j % G] : 0.f;
    const __m256 mv = _mm256_load_ps(mrow);
    __m256 sum = _mm256_setzero_ps();
    for (int blk = 0; blk < blocks; ++blk) {
      const __m256 s = _mm256_loadu_ps(sc + blk * 8);
      const __m256 live = _mm256_cmp_ps(s, neg_inf, _CMP_NEQ_OQ);
      const __m256 e = _mm256_and_ps(live, ExpNonPositive8(_mm256_sub_ps(s, mv)));
      _mm256_storeu_ps(sc + blk * 8, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_store_ps(lanes, sum);
    for (int h = 0; h < G; ++h) {
      float sh = 0.f;
      for (int t = 0; t < TB; ++t) sh += lanes[t * G + h];
      l[h] = l[h] * alpha[h] + sh;
      m[h] = m_new[h];
    }
    // V columns in groups of CC chunks of 8.
    for (int c0 = 0; c0 < chunks; c0 += CC) {
      const int cc = std::min(CC, chunks - c0);
      __m256 o[G][CC];
      for (int h = 0; h < G; ++h) {
        const __m256 a = _mm256_set1_ps(alpha[h]);
        for (int c = 0; c < CC; ++c) {
          if (c < cc) o[h][c] = _mm256_mul_ps(_mm256_loadu_ps(out + h * d + (c0 + c) * 8), a);
        }
      }
      for (int t = 0; t < n; ++t) {
        const char* vrow = vbase + t * row_bytes;
        const float* e = sc + (t / TB) * 8 + (t % TB) * G;
        __m256 v[CC];
        for (int c = 0; c < CC; ++c) {
          if (c < cc) v[c] = Load8<T>(vrow, (c0 + c) * 8);
        }
        for (int h = 0; h < G; ++h) {
          const __m256 pe = _mm256_broadcast_ss(e + h);
          for (int c = 0; c < CC; ++c) {
            if (c < cc) o[h][c] = _mm256_fmadd_ps(pe, v[c], o[h][c]);
          }
        }
      }
      for (int h = 0; h < G; ++h)
        for (int c = 0; c < CC; ++c) {
          if (c < cc) _mm256_storeu_ps(out + h * d + (c0 + c) * 8, o[h][c]);
        }
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

#if ICE_SIMD_NEON
// {sum of a[0]'s lanes, a[1]'s, a[2]'s, a[3]'s} (pairwise adds, the same tree for each input).
inline float32x4_t ReduceAdd4x4(const float32x4_t a[4]) {
  return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}

// The NEON fast path (head_dim % 4 == 0, GQA group G <= 8): DecodeOneListAvx2's scheme and score
// layout, an 8-lane score block held as two float32x4_t (lanes 0-3, 4-7) so that G = 8 fits and
// the per-head folds add the same lanes in the same order. One pass over the pages with an online
// softmax; per page:
//  * scores: TB = 8 / G tokens at a time (lane t * G + h: token t, head h; G = 3 leaves two lanes
//    unused), each K vector converted once for the G heads, 4 columns per step, one joint
//    reduction of the 8 accumulators per block;
//  * the page's max, exps (ExpNonPositive4) and sums per head (the per-head folds scalar);
//  * V: G heads x CC column chunks of 4 in registers (at most 16 accumulators and 8 V vectors of
//    NEON's 32 registers) while the page's V rows stream by.
// No software prefetch (the AVX2 form's is tuned on x86; nothing measured on Arm).
template <DType T, int G>
void DecodeOneListNeon(const PagedDecodeAttentionParams& p, int b, int g, std::vector<float>& scores) {
  constexpr int TB = 8 / G;
  constexpr int CC = std::min(8, 16 / G);
  const int d = p.head_dim, chunks = d / 4, P = p.page_size;
  const int list = b * p.num_kv_heads + g;
  const int begin = p.page_indptr[list], end = p.page_indptr[list + 1];
  const size_t head0 = static_cast<size_t>(b) * p.num_q_heads + static_cast<size_t>(g) * G;
  float* out = p.out + head0 * d;
  for (int i = 0; i < G * d; ++i) out[i] = 0.f;
  const int max_blocks = (P + TB - 1) / TB;
  scores.resize(static_cast<size_t>(max_blocks) * 8);
  float* sc = scores.data();
  const float* q = p.q + head0 * d;
  const char* pages = static_cast<const char*>(p.pages);
  const size_t row_bytes = static_cast<size_t>(d) * DTypeSize(T);
  const size_t block_bytes = static_cast<size_t>(P) * row_bytes;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float32x4_t neg_inf = vdupq_n_f32(kNegInf);
  const float32x4_t zero = vdupq_n_f32(0.f);
  const int32x4_t lane_lo = {0, 1, 2, 3}, lane_hi = {4, 5, 6, 7};
  float m[G], l[G];
  for (int h = 0; h < G; ++h) {
    m[h] = kNegInf;
    l[h] = 0.f;
  }
  for (int i = begin; i < end; ++i) {
    const int n = p.page_valid[i];
    if (n == 0) continue;
    const char* kbase = pages + static_cast<size_t>(p.page_ids[i]) * 2 * block_bytes;
    const char* vbase = kbase + block_bytes;
    const int blocks = (n + TB - 1) / TB;
    float32x4_t max_lo = neg_inf, max_hi = neg_inf;
    for (int blk = 0; blk < blocks; ++blk) {
      const char* krow[TB];
      // Rows past the valid ones repeat the last valid row (finite data); their lanes are masked.
      for (int t = 0; t < TB; ++t) krow[t] = kbase + std::min(blk * TB + t, n - 1) * row_bytes;
      float32x4_t acc[8];
      for (int a = 0; a < 8; ++a) acc[a] = zero;
      for (int c = 0; c < chunks; ++c) {
        for (int t = 0; t < TB; ++t) {
          const float32x4_t kv = Load4<T>(krow[t], c * 4);
          for (int h = 0; h < G; ++h) acc[t * G + h] = vfmaq_f32(acc[t * G + h], vld1q_f32(q + h * d + c * 4), kv);
        }
      }
      const int32x4_t valid_lanes = vdupq_n_s32(std::min(TB, n - blk * TB) * G);
      const float32x4_t s_lo =
          vbslq_f32(vcltq_s32(lane_lo, valid_lanes), vmulq_n_f32(ReduceAdd4x4(acc), p.scale), neg_inf);
      const float32x4_t s_hi =
          vbslq_f32(vcltq_s32(lane_hi, valid_lanes), vmulq_n_f32(ReduceAdd4x4(acc + 4), p.scale), neg_inf);
      vst1q_f32(sc + blk * 8, s_lo);
      vst1q_f32(sc + blk * 8 + 4, s_hi);
      max_lo = vmaxq_f32(max_lo, s_lo);
      max_hi = vmaxq_f32(max_hi, s_hi);
    }
    float lanes[8];
    vst1q_f32(lanes, max_lo);
    vst1q_f32(lanes + 4, max_hi);
    float m_new[G], alpha[G];
    for (int h = 0; h < G; ++h) {
      m_new[h] = m[h];
      for (int t = 0; t < TB; ++t) m_new[h] = std::max(m_new[h], lanes[t * G + h]);
      // exp(-inf - m_new) must be 0 exactly: the first page sets alpha to 0.
      alpha[h] = m[h] == kNegInf ? 0.f : std::exp(m[h] - m_new[h]);
    }
    float mrow[8];
    for (int j = 0; j < 8; ++j) mrow[j] = j < TB * G ? m_new[j % G] : 0.f;
    const float32x4_t mv_lo = vld1q_f32(mrow), mv_hi = vld1q_f32(mrow + 4);
    float32x4_t sum_lo = zero, sum_hi = zero;
    for (int blk = 0; blk < blocks; ++blk) {
      // Masked lanes (-inf) get 0, not ExpNonPositive4's clamped exp(-87). s > -inf is false for
      // NaN too, as the AVX2 form's ordered not-equal compare.
      const float32x4_t s_lo = vld1q_f32(sc + blk * 8), s_hi = vld1q_f32(sc + blk * 8 + 4);
      const float32x4_t e_lo = vbslq_f32(vcgtq_f32(s_lo, neg_inf), ExpNonPositive4(vsubq_f32(s_lo, mv_lo)), zero);
      const float32x4_t e_hi = vbslq_f32(vcgtq_f32(s_hi, neg_inf), ExpNonPositive4(vsubq_f32(s_hi, mv_hi)), zero);
      vst1q_f32(sc + blk * 8, e_lo);
      vst1q_f32(sc + blk * 8 + 4, e_hi);
      sum_lo = vaddq_f32(sum_lo, e_lo);
      sum_hi = vaddq_f32(sum_hi, e_hi);
    }
    vst1q_f32(lanes, sum_lo);
    vst1q_f32(lanes + 4, sum_hi);
    for (int h = 0; h < G; ++h) {
      float sh = 0.f;
      for (int t = 0; t < TB; ++t) sh += lanes[t * G + h];
      l[h] = l[h] * alpha[h] + sh;
      m[h] = m_new[h];
    }
    // V columns in groups of CC chunks of 4.
    for (int c0 = 0; c0 < chunks; c0 += CC) {
      const int cc = std::min(CC, chunks - c0);
      float32x4_t o[G][CC];
      for (int h = 0; h < G; ++h) {
        for (int c = 0; c < CC; ++c) {
          if (c < cc) o[h][c] = vmulq_n_f32(vld1q_f32(out + h * d + (c0 + c) * 4), alpha[h]);
        }
      }
      for (int t = 0; t < n; ++t) {
        const char* vrow = vbase + t * row_bytes;
        const float* e = sc + (t / TB) * 8 + (t % TB) * G;
        float32x4_t v[CC];
        for (int c = 0; c < CC; ++c) {
          if (c < cc) v[c] = Load4<T>(vrow, (c0 + c) * 4);
        }
        for (int h = 0; h < G; ++h) {
          for (int c = 0; c < CC; ++c) {
            if (c < cc) o[h][c] = vfmaq_n_f32(o[h][c], v[c], e[h]);
          }
        }
      }
      for (int h = 0; h < G; ++h)
        for (int c = 0; c < CC; ++c) {
          if (c < cc) vst1q_f32(out + h * d + (c0 + c) * 4, o[h][c]);
        }
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
#if ICE_SIMD_AVX512
  if (p.head_dim % 16 == 0) {
    switch (p.num_q_heads / p.num_kv_heads) {
      case 1: return DecodeOneListVec<T, 1>(p, b, g, scores, row);
      case 2: return DecodeOneListVec<T, 2>(p, b, g, scores, row);
      case 4: return DecodeOneListVec<T, 4>(p, b, g, scores, row);
      case 8: return DecodeOneListVec<T, 8>(p, b, g, scores, row);
      default: break;
    }
  }
#endif
#if ICE_SIMD_AVX2
  // On the avx512 target too, for what the 16-lane kernel does not take (GQA 3, as SmolLM2's 9
  // query over 3 kv heads, and 5-7, Qwen2.5's; head_dim a multiple of 8, not 16), rather than the
  // two-pass form:
  // SmolLM2-shaped decode at 8k ran at 17 tok/s on avx512 and 27 on avx2 of the same binary.
  if (p.head_dim % 8 == 0) {
    switch (p.num_q_heads / p.num_kv_heads) {
      case 1: return DecodeOneListAvx2<T, 1>(p, b, g, scores);
      case 2: return DecodeOneListAvx2<T, 2>(p, b, g, scores);
      case 3: return DecodeOneListAvx2<T, 3>(p, b, g, scores);
      case 4: return DecodeOneListAvx2<T, 4>(p, b, g, scores);
      case 5: return DecodeOneListAvx2<T, 5>(p, b, g, scores);  // Qwen2.5-14B/32B: 40 / 8
      case 6: return DecodeOneListAvx2<T, 6>(p, b, g, scores);  // Qwen2.5-1.5B: 12 / 2
      case 7: return DecodeOneListAvx2<T, 7>(p, b, g, scores);  // Qwen2.5-7B: 28 / 4, 0.5B: 14 / 2
      case 8: return DecodeOneListAvx2<T, 8>(p, b, g, scores);
      default: break;
    }
  }
#elif ICE_SIMD_NEON
  if (p.head_dim % 4 == 0) {
    switch (p.num_q_heads / p.num_kv_heads) {
      case 1: return DecodeOneListNeon<T, 1>(p, b, g, scores);
      case 2: return DecodeOneListNeon<T, 2>(p, b, g, scores);
      case 3: return DecodeOneListNeon<T, 3>(p, b, g, scores);
      case 4: return DecodeOneListNeon<T, 4>(p, b, g, scores);
      case 8: return DecodeOneListNeon<T, 8>(p, b, g, scores);
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

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
