// The IceCache store's vector kernels (contracts: kvstore/vector_ops.h, which dispatches to the
// active SIMD target's copy of this file): scoring of f32/f16/bf16 rows, the batched arg-max of
// the DCI-tree parent search (fp32, bf16 pairs), row conversions and streaming stores. The int8
// kernels (exact int8 parent search, the int8 row blocks of a query's upper levels) are in
// int8_ops_cpu.cc.
#include <atomic>
#include <climits>

#include "kernels/cpu/simd.h"  // last: switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {
namespace {

#if ICE_SIMD_AVX512
// 16 floats to bf16, the rounding of F32ToBf16 (nearest even; NaN stays NaN, quieted).
inline __m256i Bf16x16(const float* src) {
  const __m512i u = _mm512_loadu_si512(src);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
#endif

#if ICE_SIMD_AVX2
// 8 floats to bf16, the rounding of F32ToBf16 (as Bf16x16).
inline __m128i Bf16x8(const float* src) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  // |u| and 0x7f800000 are non-negative as int32, so the signed compare orders them.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  // Every lane is in [0, 0xffff]: the unsigned-saturating pack keeps it.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
#endif

#if ICE_SIMD_NEON
// 4 floats to bf16, the rounding of F32ToBf16 (as Bf16x16).
inline uint16x4_t Bf16x4(const float* src) {
  const uint32x4_t u = vld1q_u32(reinterpret_cast<const uint32_t*>(src));
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  const uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
  const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
  return vmovn_u32(vbslq_u32(nan, vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40)), r));
}
#endif

template <DType T>
float DotRow(const void* rows, size_t off, const float* q, int dim) {
  int i = 0;
  float s = 0.f;
#if ICE_SIMD_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= dim; i += 16) {
    acc0 = _mm256_fmadd_ps(Load8<T>(rows, off + i), _mm256_loadu_ps(q + i), acc0);
    acc1 = _mm256_fmadd_ps(Load8<T>(rows, off + i + 8), _mm256_loadu_ps(q + i + 8), acc1);
  }
  for (; i + 8 <= dim; i += 8) acc0 = _mm256_fmadd_ps(Load8<T>(rows, off + i), _mm256_loadu_ps(q + i), acc0);
  s = HSum8(_mm256_add_ps(acc0, acc1));
#elif ICE_SIMD_NEON
  constexpr size_t kElem = T == DType::kF32 ? 4 : 2;
  return Dot<T>(q, static_cast<const char*>(rows) + off * kElem, dim);
#endif
  for (; i < dim; ++i) s += LoadScalar<T>(rows, off + i) * q[i];
  return s;
}

#if ICE_SIMD_AVX2
// One row's q . row for dim % 8 == 0 as the four-row loops below sum it: one accumulator, then
// ReduceAdd4x8's tree. The rows past a multiple of four take it too, so a row's score does not
// depend on where it sits in a call or how many rows the call has (DotRow's two accumulators
// would give other last bits).
template <DType T>
float DotRowChain8(const void* rows, size_t off, const float* q, int dim) {
  __m256 a = _mm256_setzero_ps();
  for (int i = 0; i < dim; i += 8) a = _mm256_fmadd_ps(Load8<T>(rows, off + i), _mm256_loadu_ps(q + i), a);
  return _mm_cvtss_f32(ReduceAdd4x8(a, a, a, a));
}
#endif

template <DType T>
void ScoreRowsT(const void* rows, int count, int dim, const float* q, float* out) {
  int r = 0;
#if ICE_SIMD_AVX512
  if (dim % 16 == 0) {
    for (; r + 4 <= count; r += 4) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 16) {
        const __m512 qv = _mm512_loadu_ps(q + i);
        a0 = _mm512_fmadd_ps(Load16<T>(rows, b + i), qv, a0);
        a1 = _mm512_fmadd_ps(Load16<T>(rows, b + dim + i), qv, a1);
        a2 = _mm512_fmadd_ps(Load16<T>(rows, b + 2 * dim + i), qv, a2);
        a3 = _mm512_fmadd_ps(Load16<T>(rows, b + 3 * dim + i), qv, a3);
      }
      _mm_storeu_ps(out + r, ReduceAdd4(a0, a1, a2, a3));  // one tree per row, whatever its neighbours
    }
    for (; r < count; ++r) {
      __m512 a0 = _mm512_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 16) a0 = _mm512_fmadd_ps(Load16<T>(rows, b + i), _mm512_loadu_ps(q + i), a0);
      out[r] = _mm_cvtss_f32(ReduceAdd4(a0, a0, a0, a0));
    }
    return;
  }
#endif
#if ICE_SIMD_AVX2
  if (dim % 8 == 0) {
    // Four rows at a time: the query chunk is loaded once per four rows.
    for (; r + 4 <= count; r += 4) {
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(Load8<T>(rows, b + i), qv, a0);
        a1 = _mm256_fmadd_ps(Load8<T>(rows, b + dim + i), qv, a1);
        a2 = _mm256_fmadd_ps(Load8<T>(rows, b + 2 * dim + i), qv, a2);
        a3 = _mm256_fmadd_ps(Load8<T>(rows, b + 3 * dim + i), qv, a3);
      }
      _mm_storeu_ps(out + r, ReduceAdd4x8(a0, a1, a2, a3));  // one tree per row, whatever its neighbours
    }
    for (; r < count; ++r) out[r] = DotRowChain8<T>(rows, static_cast<size_t>(r) * dim, q, dim);
    return;
  }
#endif
  for (; r < count; ++r) out[r] = DotRow<T>(rows, static_cast<size_t>(r) * dim, q, dim);
}

#if ICE_SIMD_AVX2
// The multi-query kernels' sums of rows r, r+1 for heads j (lanes 0, 1) and j+1 (lanes 2, 3) into
// out [nq, count].
inline void StorePairSums(__m128 sums, float* out, int count, int r, int j) {
  alignas(16) float s[4];
  _mm_store_ps(s, sums);
  for (int h = 0; h < 2; ++h) {
    out[static_cast<size_t>(j + h) * count + r] = s[2 * h];
    out[static_cast<size_t>(j + h) * count + r + 1] = s[2 * h + 1];
  }
}
#endif

#if ICE_SIMD_AVX512
// NQ queries against four rows at a time (two with NQ 8: 16 accumulators): each 16-element chunk
// of a row is loaded and converted once for all NQ queries, and four sums are reduced at a time
// (ReduceAdd4: each row's lanes in ScoreRowsT's tree, so per query the same floats as ScoreRows).
template <DType T, int NQ>
void ScoreRowsFused(const void* rows, int count, int dim, const float* qs, float* out) {
  constexpr int kR = NQ <= 4 ? 4 : 2;
  int r = 0;
  for (; r + kR <= count; r += kR) {
    __m512 a[kR][NQ];
    for (int k = 0; k < kR; ++k)
      for (int j = 0; j < NQ; ++j) a[k][j] = _mm512_setzero_ps();
    const size_t b = static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; i += 16) {
      __m512 x[kR];
      for (int k = 0; k < kR; ++k) x[k] = Load16<T>(rows, b + static_cast<size_t>(k) * dim + i);
      for (int j = 0; j < NQ; ++j) {
        const __m512 qv = _mm512_loadu_ps(qs + static_cast<size_t>(j) * dim + i);
        for (int k = 0; k < kR; ++k) a[k][j] = _mm512_fmadd_ps(x[k], qv, a[k][j]);
      }
    }
    if constexpr (kR == 4) {
      for (int j = 0; j < NQ; ++j)
        _mm_storeu_ps(out + static_cast<size_t>(j) * count + r, ReduceAdd4(a[0][j], a[1][j], a[2][j], a[3][j]));
    } else {
      for (int j = 0; j < NQ; j += 2) StorePairSums(ReduceAdd4(a[0][j], a[1][j], a[0][j + 1], a[1][j + 1]), out, count, r, j);
    }
  }
  for (; r < count; ++r) {
    __m512 a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = _mm512_setzero_ps();
    const size_t b = static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; i += 16) {
      const __m512 r0 = Load16<T>(rows, b + i);
      for (int j = 0; j < NQ; ++j) a[j] = _mm512_fmadd_ps(r0, _mm512_loadu_ps(qs + static_cast<size_t>(j) * dim + i), a[j]);
    }
    for (int j = 0; j < NQ; ++j) out[static_cast<size_t>(j) * count + r] = _mm_cvtss_f32(ReduceAdd4(a[j], a[j], a[j], a[j]));
  }
}
#endif

#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
// The avx2 ScoreRowsFused (dim % 8 == 0): NQ queries against four rows at a time (NQ <= 3), two
// (NQ 4) or one (NQ 8: sixteen registers), each 8-element chunk of a row loaded and converted once
// for all NQ queries.
// Every row gets ScoreRowsT's sum (one accumulator per row, ReduceAdd4x8's tree; DotRowChain8 past
// the last four): per query the values of ScoreRowsT, in one pass over the rows instead of NQ.
template <DType T, int NQ>
void ScoreRowsFused(const void* rows, int count, int dim, const float* qs, float* out) {
  const int blocked = count / 4 * 4;
  int r = 0;
  if constexpr (NQ <= 3) {
    // Four rows at a time, as ScoreRowsT takes them (4 * NQ <= 12 accumulators, the NQ query
    // chunks and one row chunk in the other registers): one ReduceAdd4x8 gives a head's four sums,
    // stored as one vector.
    for (; r < blocked; r += 4) {
      __m256 a[4][NQ];
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < NQ; ++j) a[k][j] = _mm256_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 8) {
        __m256 qv[NQ];
        for (int j = 0; j < NQ; ++j) qv[j] = _mm256_loadu_ps(qs + static_cast<size_t>(j) * dim + i);
        for (int k = 0; k < 4; ++k) {
          const __m256 x = Load8<T>(rows, b + static_cast<size_t>(k) * dim + i);
          for (int j = 0; j < NQ; ++j) a[k][j] = _mm256_fmadd_ps(x, qv[j], a[k][j]);
        }
      }
      for (int j = 0; j < NQ; ++j)
        _mm_storeu_ps(out + static_cast<size_t>(j) * count + r, ReduceAdd4x8(a[0][j], a[1][j], a[2][j], a[3][j]));
    }
  } else {
    static_assert(NQ == 4 || NQ == 8, "avx2 ScoreRowsFused: groups of 2, 3, 4 or 8 heads");
    constexpr int kR = NQ == 8 ? 1 : 2;
    for (; r < blocked; r += kR) {
      __m256 a[kR][NQ];
      for (int k = 0; k < kR; ++k)
        for (int j = 0; j < NQ; ++j) a[k][j] = _mm256_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 8) {
        __m256 x[kR];
        for (int k = 0; k < kR; ++k) x[k] = Load8<T>(rows, b + static_cast<size_t>(k) * dim + i);
        for (int j = 0; j < NQ; ++j) {
          const __m256 qv = _mm256_loadu_ps(qs + static_cast<size_t>(j) * dim + i);
          for (int k = 0; k < kR; ++k) a[k][j] = _mm256_fmadd_ps(x[k], qv, a[k][j]);
        }
      }
      if constexpr (kR == 2) {  // NQ 4: two heads' two rows a reduction
        for (int j = 0; j < NQ; j += 2) StorePairSums(ReduceAdd4x8(a[0][j], a[1][j], a[0][j + 1], a[1][j + 1]), out, count, r, j);
      } else {  // one row, NQ 8: four heads a reduction
        for (int j = 0; j < NQ; j += 4) {
          alignas(16) float s[4];
          _mm_store_ps(s, ReduceAdd4x8(a[0][j], a[0][j + 1], a[0][j + 2], a[0][j + 3]));
          for (int t = 0; t < 4; ++t) out[static_cast<size_t>(j + t) * count + r] = s[t];
        }
      }
    }
  }
  for (; r < count; ++r)
    for (int j = 0; j < NQ; ++j)
      out[static_cast<size_t>(j) * count + r] = DotRowChain8<T>(rows, static_cast<size_t>(r) * dim, qs + static_cast<size_t>(j) * dim, dim);
}
#endif

template <DType T>
void ScoreRowsMultiT(const void* rows, int count, int dim, const float* qs, int nq, float* out) {
#if ICE_SIMD_AVX2
  if (dim % (ICE_SIMD_AVX512 ? 16 : 8) == 0) {
    // The GQA group sizes of the supported models (a KV head's query heads share its tree;
    // SmolLM2's 9 query heads over 3 KV heads: 3).
    switch (nq) {
      case 1: break;
      case 2: return ScoreRowsFused<T, 2>(rows, count, dim, qs, out);
      case 3: return ScoreRowsFused<T, 3>(rows, count, dim, qs, out);
      case 4: return ScoreRowsFused<T, 4>(rows, count, dim, qs, out);
      case 8: return ScoreRowsFused<T, 8>(rows, count, dim, qs, out);
      default:
        // Other group sizes (Qwen2.5's 5, 6 and 7 among them) in passes of three heads, the last
        // of two or four: each head's floats are still ScoreRows'.
        for (int j = 0; j < nq;) {
          const int left = nq - j, take = left == 2 || left == 4 ? left : 3;
          ScoreRowsMultiT<T>(rows, count, dim, qs + static_cast<size_t>(j) * dim, take, out + static_cast<size_t>(j) * count);
          j += take;
        }
        return;
    }
  }
#endif
  for (int j = 0; j < nq; ++j) ScoreRowsT<T>(rows, count, dim, qs + static_cast<size_t>(j) * dim, out + static_cast<size_t>(j) * count);
}

#if ICE_SIMD_AVX512
// The AVX-512 kernels of ArgmaxAugDot (fp32) and ArgmaxAugDotBf16: kArgmaxQueries queries against
// 32 rows per pass, the running arg-max kept per lane in vectors (no horizontal sums until the
// end). block(src, rb, a) sets a[t][0..1] to the plain dot products of query src[t] with rows
// rb..rb+31; the augmented extras are added here. A ragged tail repeats the last query.
constexpr int kArgmaxQueries = 8;
using ArgmaxAcc = __m512[kArgmaxQueries][2];

// Only the 32-row blocks that hold rows are scanned (columns nr..ld are insertion headroom).
template <typename Block>
void ArgmaxAugBlocks(int nx, const float* x_extra, int nr, const float* row_extra, Block&& block, int32_t* best) {
  const int scan = (nr + 31) / 32 * 32;
  constexpr int kT = kArgmaxQueries;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int i = 0; i < nx; i += kT) {
    int src[kT];
    float xe[kT];
    for (int t = 0; t < kT; ++t) {
      src[t] = std::min(i + t, nx - 1);
      xe[t] = x_extra[src[t]];
    }
    __m512 bv[kT][2];
    __m512i bi[kT][2];
    for (int t = 0; t < kT; ++t) {
      bv[t][0] = bv[t][1] = _mm512_set1_ps(-INFINITY);
      bi[t][0] = bi[t][1] = _mm512_setzero_si512();
    }
    for (int rb = 0; rb < scan; rb += 32) {
      ArgmaxAcc a;
      block(src, rb, a);
      const __m512 e0 = _mm512_loadu_ps(row_extra + rb), e1 = _mm512_loadu_ps(row_extra + rb + 16);
      const __m512i i0 = _mm512_add_epi32(lane, _mm512_set1_epi32(rb)), i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(16));
      for (int t = 0; t < kT; ++t) {
        const __m512 u = _mm512_set1_ps(xe[t]);
        // -inf extras times a zero x_extra give NaN; an ordered compare never selects them.
        const __m512 s0 = _mm512_fmadd_ps(u, e0, a[t][0]), s1 = _mm512_fmadd_ps(u, e1, a[t][1]);
        const __mmask16 m0 = _mm512_cmp_ps_mask(s0, bv[t][0], _CMP_GT_OQ);
        const __mmask16 m1 = _mm512_cmp_ps_mask(s1, bv[t][1], _CMP_GT_OQ);
        bv[t][0] = _mm512_mask_mov_ps(bv[t][0], m0, s0);
        bv[t][1] = _mm512_mask_mov_ps(bv[t][1], m1, s1);
        bi[t][0] = _mm512_mask_mov_epi32(bi[t][0], m0, i0);
        bi[t][1] = _mm512_mask_mov_epi32(bi[t][1], m1, i1);
      }
    }
    // Per query: the best of its 32 lanes, ties to the lowest row (vector reductions; a lane that
    // never beat -inf keeps row 0, as the scalar rule does).
    for (int t = 0; t < kT && i + t < nx; ++t) {
      const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(bv[t][0], bv[t][1])));
      const __mmask16 e0 = _mm512_cmp_ps_mask(bv[t][0], mv, _CMP_EQ_OQ), e1 = _mm512_cmp_ps_mask(bv[t][1], mv, _CMP_EQ_OQ);
      const __m512i big = _mm512_set1_epi32(INT32_MAX);
      best[i + t] = _mm512_reduce_min_epi32(_mm512_min_epi32(_mm512_mask_mov_epi32(big, e0, bi[t][0]), _mm512_mask_mov_epi32(big, e1, bi[t][1])));
    }
  }
}
#endif

}  // namespace

#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
// The AVX2 kernels of ArgmaxAugDot and ArgmaxAugDotBf16: two queries against 32 rows per pass.
// block(i0, i1, rb, a) adds to a[t][0..3] (zeroed) the plain dot products of query i0 (t = 0)
// and i1 (t = 1) with rows rb..rb+31; the augmented extras are added here. As in the AVX-512
// driver the running arg-max is kept per lane (best score and its row), reduced at the end:
// the best score, then the lowest row holding it. An odd tail repeats the last query.
template <typename Block>
void ArgmaxAugPairs(int nx, const float* x_extra, int nr, const float* row_extra, Block&& block, int32_t* best) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < nx; i += 2) {
    const int src[2] = {i, std::min(i + 1, nx - 1)};
    __m256 bv[2][4];
    __m256i bi[2][4];
    for (int t = 0; t < 2; ++t)
      for (int c = 0; c < 4; ++c) {
        bv[t][c] = _mm256_set1_ps(-INFINITY);
        bi[t][c] = _mm256_setzero_si256();
      }
    for (int rb = 0; rb < nr; rb += 32) {  // blocks past nr are headroom
      __m256 a[2][4];
      for (int t = 0; t < 2; ++t)
        for (int c = 0; c < 4; ++c) a[t][c] = _mm256_setzero_ps();
      block(src[0], src[1], rb, a);
      for (int c = 0; c < 4; ++c) {
        const __m256 e = _mm256_loadu_ps(row_extra + rb + 8 * c);
        const __m256i idx = _mm256_add_epi32(lane, _mm256_set1_epi32(rb + 8 * c));
        for (int t = 0; t < 2; ++t) {
          // -inf extras times a zero x_extra give NaN; an ordered compare never selects them.
          const __m256 sc = _mm256_fmadd_ps(_mm256_set1_ps(x_extra[src[t]]), e, a[t][c]);
          const __m256 gt = _mm256_cmp_ps(sc, bv[t][c], _CMP_GT_OQ);
          bv[t][c] = _mm256_blendv_ps(bv[t][c], sc, gt);
          bi[t][c] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi[t][c]), _mm256_castsi256_ps(idx), gt));
        }
      }
    }
    for (int t = 0; t < 2 && i + t < nx; ++t) {
      alignas(32) float v[32];
      alignas(32) int32_t r[32];
      for (int c = 0; c < 4; ++c) {
        _mm256_store_ps(v + 8 * c, bv[t][c]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(r + 8 * c), bi[t][c]);
      }
      // A lane that never beat -inf keeps row 0, as the scalar rule does.
      float mv = v[0];
      for (int k = 1; k < 32; ++k) mv = std::max(mv, v[k]);
      int32_t arg = INT32_MAX;
      for (int k = 0; k < 32; ++k) {
        if (v[k] == mv) arg = std::min(arg, r[k]);
      }
      best[i + t] = arg == INT32_MAX ? 0 : arg;
    }
  }
}
#endif

#if ICE_SIMD_NEON
// The NEON kernels of ArgmaxAugDot and ArgmaxAugDotBf16: kArgmaxQueriesNeon queries against 16
// rows (four q registers) per pass, 16 accumulators. block(src, rb, a) adds to a[t][0..3] (zeroed)
// the plain dot products of query src[t] with rows rb..rb+15; the augmented extras are added
// here. The running arg-max is kept per lane (best score and its row, strictly greater wins, so a
// lane keeps its earliest row), reduced at the end: the best score, then the lowest row holding
// it. A ragged tail repeats the last query.
constexpr int kArgmaxQueriesNeon = 4;
using ArgmaxAccNeon = float32x4_t[kArgmaxQueriesNeon][4];

template <typename Block>
void ArgmaxAugStrips(int nx, const float* x_extra, int nr, const float* row_extra, Block&& block, int32_t* best) {
  constexpr int kT = kArgmaxQueriesNeon;
  const int32x4_t lane = {0, 1, 2, 3};
  for (int i = 0; i < nx; i += kT) {
    int src[kT];
    for (int t = 0; t < kT; ++t) src[t] = std::min(i + t, nx - 1);
    float32x4_t bv[kT][4];
    int32x4_t bi[kT][4];
    for (int t = 0; t < kT; ++t)
      for (int c = 0; c < 4; ++c) {
        bv[t][c] = vdupq_n_f32(-INFINITY);
        bi[t][c] = vdupq_n_s32(0);
      }
    // 16-row strips inside the 32-row blocks that hold rows (past nr: headroom, -inf extras).
    for (int rb = 0; rb < nr; rb += 16) {
      ArgmaxAccNeon a;
      for (int t = 0; t < kT; ++t)
        for (int c = 0; c < 4; ++c) a[t][c] = vdupq_n_f32(0.f);
      block(src, rb, a);
      for (int c = 0; c < 4; ++c) {
        const float32x4_t e = vld1q_f32(row_extra + rb + 4 * c);
        const int32x4_t idx = vaddq_s32(lane, vdupq_n_s32(rb + 4 * c));
        for (int t = 0; t < kT; ++t) {
          // -inf extras times a zero x_extra give NaN; an ordered compare never selects them.
          const float32x4_t sc = vfmaq_f32(a[t][c], vdupq_n_f32(x_extra[src[t]]), e);
          const uint32x4_t gt = vcgtq_f32(sc, bv[t][c]);
          bv[t][c] = vbslq_f32(gt, sc, bv[t][c]);
          bi[t][c] = vbslq_s32(gt, idx, bi[t][c]);
        }
      }
    }
    for (int t = 0; t < kT && i + t < nx; ++t) {
      const float mv = vmaxvq_f32(vmaxq_f32(vmaxq_f32(bv[t][0], bv[t][1]), vmaxq_f32(bv[t][2], bv[t][3])));
      int32x4_t m = vdupq_n_s32(INT32_MAX);
      for (int c = 0; c < 4; ++c) m = vminq_s32(m, vbslq_s32(vceqq_f32(bv[t][c], vdupq_n_f32(mv)), bi[t][c], m));
      // A lane that never beat -inf keeps row 0, as the scalar rule does.
      const int32_t arg = vminvq_s32(m);
      best[i + t] = arg == INT32_MAX ? 0 : arg;
    }
  }
}

// a[c] += lane L of u times r[c] for the four row vectors of a strip.
template <int L>
inline void FmaLane4(float32x4_t (&a)[4], const float32x4_t (&r)[4], float32x4_t u) {
  for (int c = 0; c < 4; ++c) a[c] = vfmaq_laneq_f32(a[c], r[c], u, L);
}
#endif

void ArgmaxAugDot(const float* x, size_t x_stride, const float* x_extra, int nx, const float* rows_t, int ld,
                  const float* row_extra, int nr, int dim, int32_t* best) {
  int i = 0;
#if ICE_SIMD_AVX512
  // Eight queries against 32 rows per pass: 2 loads + 8 broadcasts feed 16 FMAs.
  ArgmaxAugBlocks(nx, x_extra, nr, row_extra, [&](const int* src, int rb, ArgmaxAcc& a) {
    const float* xs[kArgmaxQueries];
    for (int t = 0; t < kArgmaxQueries; ++t) {
      xs[t] = x + static_cast<size_t>(src[t]) * x_stride;
      a[t][0] = a[t][1] = _mm512_setzero_ps();
    }
    const float* r = rows_t + rb;
    for (int j = 0; j < dim; ++j, r += ld) {
      const __m512 r0 = _mm512_loadu_ps(r), r1 = _mm512_loadu_ps(r + 16);
      for (int t = 0; t < kArgmaxQueries; ++t) {
        const __m512 u = _mm512_set1_ps(xs[t][j]);
        a[t][0] = _mm512_fmadd_ps(u, r0, a[t][0]);
        a[t][1] = _mm512_fmadd_ps(u, r1, a[t][1]);
      }
    }
  }, best);
  i = nx;
#elif ICE_SIMD_AVX2
  // Two queries against 32 rows per pass: 4 loads + 2 broadcasts feed 8 FMAs.
  ArgmaxAugPairs(nx, x_extra, nr, row_extra, [&](int i0, int i1, int rb, __m256 (&a)[2][4]) {
    const float* x0 = x + static_cast<size_t>(i0) * x_stride;
    const float* x1 = x + static_cast<size_t>(i1) * x_stride;
    const float* r = rows_t + rb;
    for (int j = 0; j < dim; ++j, r += ld) {
      const __m256 u = _mm256_set1_ps(x0[j]), v = _mm256_set1_ps(x1[j]);
      for (int c = 0; c < 4; ++c) {
        const __m256 rc = _mm256_loadu_ps(r + 8 * c);
        a[0][c] = _mm256_fmadd_ps(u, rc, a[0][c]);
        a[1][c] = _mm256_fmadd_ps(v, rc, a[1][c]);
      }
    }
  }, best);
  i = nx;
#elif ICE_SIMD_NEON
  // Four queries against 16 rows per pass: four dimensions of each query in one register, used
  // lane by lane (vfmaq_laneq), so 4 row loads feed 16 FMAs.
  ArgmaxAugStrips(nx, x_extra, nr, row_extra, [&](const int* src, int rb, ArgmaxAccNeon& a) {
    const float* xs[kArgmaxQueriesNeon];
    for (int t = 0; t < kArgmaxQueriesNeon; ++t) xs[t] = x + static_cast<size_t>(src[t]) * x_stride;
    auto rows_at = [&](int j, float32x4_t (&r)[4]) {
      const float* p = rows_t + static_cast<size_t>(j) * ld + rb;
      for (int c = 0; c < 4; ++c) r[c] = vld1q_f32(p + 4 * c);
    };
    int j = 0;
    for (; j + 4 <= dim; j += 4) {
      float32x4_t u[kArgmaxQueriesNeon], r[4];
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) u[t] = vld1q_f32(xs[t] + j);
      rows_at(j, r);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) FmaLane4<0>(a[t], r, u[t]);
      rows_at(j + 1, r);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) FmaLane4<1>(a[t], r, u[t]);
      rows_at(j + 2, r);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) FmaLane4<2>(a[t], r, u[t]);
      rows_at(j + 3, r);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) FmaLane4<3>(a[t], r, u[t]);
    }
    for (; j < dim; ++j) {
      float32x4_t r[4];
      rows_at(j, r);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) FmaLane4<0>(a[t], r, vdupq_n_f32(xs[t][j]));
    }
  }, best);
  i = nx;
#endif
  for (; i < nx; ++i) {
    const float* xi = x + static_cast<size_t>(i) * x_stride;
    float bs = -INFINITY;
    int32_t arg = 0;
    for (int r = 0; r < nr; ++r) {
      float s = x_extra[i] * row_extra[r];
      for (int j = 0; j < dim; ++j) s += xi[j] * rows_t[static_cast<size_t>(j) * ld + r];
      if (s > bs) { bs = s; arg = r; }
    }
    best[i] = arg;
  }
}

void ArgmaxAugDotBf16(const uint32_t* x, const float* x_extra, int nx, const uint32_t* rows_t, int ld,
                      const float* row_extra, int nr, int pairs, int32_t* best) {
  int i = 0;
#if ICE_SIMD_AVX512
  // As the fp32 kernel, one dpbf16 (two products per lane) per pair of dimensions.
  ArgmaxAugBlocks(nx, x_extra, nr, row_extra, [&](const int* src, int rb, ArgmaxAcc& a) {
    const uint32_t* xs[kArgmaxQueries];
    for (int t = 0; t < kArgmaxQueries; ++t) {
      xs[t] = x + static_cast<size_t>(src[t]) * pairs;
      a[t][0] = a[t][1] = _mm512_setzero_ps();
    }
    const uint32_t* r = rows_t + rb;
    for (int j = 0; j < pairs; ++j, r += ld) {
      const __m512bh r0 = (__m512bh)_mm512_loadu_si512(r), r1 = (__m512bh)_mm512_loadu_si512(r + 16);
      for (int t = 0; t < kArgmaxQueries; ++t) {
        const __m512bh u = (__m512bh)_mm512_set1_epi32(static_cast<int>(xs[t][j]));
        a[t][0] = _mm512_dpbf16_ps(a[t][0], u, r0);
        a[t][1] = _mm512_dpbf16_ps(a[t][1], u, r1);
      }
    }
  }, best);
  i = nx;
#elif ICE_SIMD_AVX2
  // The pairs widened to fp32 (low half << 16, high half & 0xffff0000: exact), two FMAs per pair.
  ArgmaxAugPairs(nx, x_extra, nr, row_extra, [&](int i0, int i1, int rb, __m256 (&a)[2][4]) {
    const uint32_t* x0 = x + static_cast<size_t>(i0) * pairs;
    const uint32_t* x1 = x + static_cast<size_t>(i1) * pairs;
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const uint32_t* r = rows_t + rb;
    for (int j = 0; j < pairs; ++j, r += ld) {
      const __m256 u_lo = _mm256_set1_ps(Bf16ToF32(static_cast<uint16_t>(x0[j])));
      const __m256 u_hi = _mm256_set1_ps(Bf16ToF32(static_cast<uint16_t>(x0[j] >> 16)));
      const __m256 v_lo = _mm256_set1_ps(Bf16ToF32(static_cast<uint16_t>(x1[j])));
      const __m256 v_hi = _mm256_set1_ps(Bf16ToF32(static_cast<uint16_t>(x1[j] >> 16)));
      for (int c = 0; c < 4; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 8 * c));
        const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(w, hi_mask));
        a[0][c] = _mm256_fmadd_ps(u_hi, hi, _mm256_fmadd_ps(u_lo, lo, a[0][c]));
        a[1][c] = _mm256_fmadd_ps(v_hi, hi, _mm256_fmadd_ps(v_lo, lo, a[1][c]));
      }
    }
  }, best);
  i = nx;
#elif ICE_SIMD_NEON
  // As the AVX2 form, the pairs widened to fp32 (exact), two FMAs per pair; four pairs of each
  // query widened at once and used lane by lane.
  ArgmaxAugStrips(nx, x_extra, nr, row_extra, [&](const int* src, int rb, ArgmaxAccNeon& a) {
    const uint32_t* xs[kArgmaxQueriesNeon];
    for (int t = 0; t < kArgmaxQueriesNeon; ++t) xs[t] = x + static_cast<size_t>(src[t]) * pairs;
    const uint32x4_t hi_mask = vdupq_n_u32(0xffff0000u);
    auto rows_at = [&](int j, float32x4_t (&lo)[4], float32x4_t (&hi)[4]) {
      const uint32_t* p = rows_t + static_cast<size_t>(j) * ld + rb;
      for (int c = 0; c < 4; ++c) {
        const uint32x4_t w = vld1q_u32(p + 4 * c);
        lo[c] = vreinterpretq_f32_u32(vshlq_n_u32(w, 16));
        hi[c] = vreinterpretq_f32_u32(vandq_u32(w, hi_mask));
      }
    };
    auto pair_step = [&]<int L>(int j, const float32x4_t (&ulo)[kArgmaxQueriesNeon], const float32x4_t (&uhi)[kArgmaxQueriesNeon]) {
      float32x4_t lo[4], hi[4];
      rows_at(j, lo, hi);
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) {
        FmaLane4<L>(a[t], lo, ulo[t]);
        FmaLane4<L>(a[t], hi, uhi[t]);
      }
    };
    int j = 0;
    for (; j + 4 <= pairs; j += 4) {
      float32x4_t ulo[kArgmaxQueriesNeon], uhi[kArgmaxQueriesNeon];
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) {
        const uint32x4_t w = vld1q_u32(xs[t] + j);
        ulo[t] = vreinterpretq_f32_u32(vshlq_n_u32(w, 16));
        uhi[t] = vreinterpretq_f32_u32(vandq_u32(w, hi_mask));
      }
      pair_step.template operator()<0>(j, ulo, uhi);
      pair_step.template operator()<1>(j + 1, ulo, uhi);
      pair_step.template operator()<2>(j + 2, ulo, uhi);
      pair_step.template operator()<3>(j + 3, ulo, uhi);
    }
    for (; j < pairs; ++j) {
      float32x4_t ulo[kArgmaxQueriesNeon], uhi[kArgmaxQueriesNeon];
      for (int t = 0; t < kArgmaxQueriesNeon; ++t) {
        ulo[t] = vdupq_n_f32(Bf16ToF32(static_cast<uint16_t>(xs[t][j])));
        uhi[t] = vdupq_n_f32(Bf16ToF32(static_cast<uint16_t>(xs[t][j] >> 16)));
      }
      pair_step.template operator()<0>(j, ulo, uhi);
    }
  }, best);
  i = nx;
#endif
  for (; i < nx; ++i) {
    const uint32_t* xi = x + static_cast<size_t>(i) * pairs;
    float bs = -INFINITY;
    int32_t arg = 0;
    for (int r = 0; r < nr; ++r) {
      float s = 0.f;
      for (int j = 0; j < pairs; ++j) {
        const uint32_t a = xi[j], b = rows_t[static_cast<size_t>(j) * ld + r];
        s += Bf16ToF32(static_cast<uint16_t>(a)) * Bf16ToF32(static_cast<uint16_t>(b)) +
             Bf16ToF32(static_cast<uint16_t>(a >> 16)) * Bf16ToF32(static_cast<uint16_t>(b >> 16));
      }
      s += x_extra[i] * row_extra[r];
      if (s > bs) { bs = s; arg = r; }
    }
    best[i] = arg;
  }
}

void StreamRowFromF32(DType dtype, const float* src, void* dst, int n) {
#if ICE_SIMD_AVX512
  const size_t bytes = static_cast<size_t>(n) * (dtype == DType::kF32 ? 4 : 2);
  if (n > 0 && dtype != DType::kF16 && reinterpret_cast<uintptr_t>(dst) % 64 == 0 && bytes % 64 == 0) {
    if (dtype == DType::kF32) {
      for (int i = 0; i < n; i += 16) _mm512_stream_ps(static_cast<float*>(dst) + i, _mm512_loadu_ps(src + i));
      return;
    }
    // bf16: RowFromF32's rounding, 32 values (one cache line) per store.
    for (int i = 0; i < n; i += 32) {
      const __m512i line = _mm512_inserti64x4(_mm512_castsi256_si512(Bf16x16(src + i)), Bf16x16(src + i + 16), 1);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<uint16_t*>(dst) + i), line);
    }
    return;
  }
#elif ICE_SIMD_AVX2
  const size_t bytes = static_cast<size_t>(n) * (dtype == DType::kF32 ? 4 : 2);
  if (n > 0 && dtype != DType::kF16 && reinterpret_cast<uintptr_t>(dst) % 32 == 0 && bytes % 32 == 0) {
    if (dtype == DType::kF32) {
      for (int i = 0; i < n; i += 8) _mm256_stream_ps(static_cast<float*>(dst) + i, _mm256_loadu_ps(src + i));
      return;
    }
    for (int i = 0; i < n; i += 16) {
      const __m256i two = _mm256_inserti128_si256(_mm256_castsi128_si256(Bf16x8(src + i)), Bf16x8(src + i + 8), 1);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + i), two);
    }
    return;
  }
#endif
  RowFromF32(dtype, src, dst, n);
}

void StoreFence() {
#if ICE_SIMD_AVX2
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

float DotF32(const float* a, const float* b, int n) { return DotRow<DType::kF32>(a, 0, b, n); }

void SelfAndCrossDotF32(const float* a, const float* b, int n, float* aa, float* ab) {
#if ICE_SIMD_AVX2
  // DotRow's arithmetic twice over one read of a: the same values as DotF32(a, a) and DotF32(b, a).
  int i = 0;
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), x0 = _mm256_setzero_ps(), x1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
    s0 = _mm256_fmadd_ps(a0, a0, s0);
    s1 = _mm256_fmadd_ps(a1, a1, s1);
    x0 = _mm256_fmadd_ps(_mm256_loadu_ps(b + i), a0, x0);
    x1 = _mm256_fmadd_ps(_mm256_loadu_ps(b + i + 8), a1, x1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a0 = _mm256_loadu_ps(a + i);
    s0 = _mm256_fmadd_ps(a0, a0, s0);
    x0 = _mm256_fmadd_ps(_mm256_loadu_ps(b + i), a0, x0);
  }
  float s = HSum8(_mm256_add_ps(s0, s1));
  float x = HSum8(_mm256_add_ps(x0, x1));
  for (; i < n; ++i) {
    s += a[i] * a[i];
    x += b[i] * a[i];
  }
  *aa = s;
  *ab = x;
#else
  // DotF32 itself, twice (the second read of a comes from L1): a second copy of its loop need not
  // round alike where the compiler contracts s += x * y into FMAs (aarch64: the scalar and neon
  // targets' one-pass loops differed from DotF32 by an ulp or two).
  *aa = DotF32(a, a, n);
  *ab = DotF32(b, a, n);
#endif
}

void ScoreRows(DType dtype, const void* rows, int count, int dim, const float* q, float* out) {
  switch (dtype) {
    case DType::kF32: return ScoreRowsT<DType::kF32>(rows, count, dim, q, out);
    case DType::kBF16: return ScoreRowsT<DType::kBF16>(rows, count, dim, q, out);
    case DType::kF16: return ScoreRowsT<DType::kF16>(rows, count, dim, q, out);
    default: return;  // plain types only (the KV store never holds another)
  }
}

void ScoreRowsMulti(DType dtype, const void* rows, int count, int dim, const float* qs, int nq,
                    float* out) {
  switch (dtype) {
    case DType::kF32: return ScoreRowsMultiT<DType::kF32>(rows, count, dim, qs, nq, out);
    case DType::kBF16: return ScoreRowsMultiT<DType::kBF16>(rows, count, dim, qs, nq, out);
    case DType::kF16: return ScoreRowsMultiT<DType::kF16>(rows, count, dim, qs, nq, out);
    default: return;  // plain types only (the KV store never holds another)
  }
}

float ExpShiftSum(float* x, int n, float m) {
  int i = 0;
  float s = 0.f;
#if ICE_SIMD_AVX512
  const __m512 vm = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
    // The polynomial clamps at -87 (about 1.6e-38); below that the exact 0 the contract gives.
    const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(-87.f), _CMP_GE_OQ), ExpNonPositive(a));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  s = _mm512_reduce_add_ps(acc);
#elif ICE_SIMD_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(a, _mm256_set1_ps(-87.f), _CMP_GE_OQ), ExpNonPositive8(a));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  s = HSum8(acc);
#elif ICE_SIMD_NEON
  const float32x4_t vm = vdupq_n_f32(m);
  float32x4_t acc = vdupq_n_f32(0.f);
  for (; i + 4 <= n; i += 4) {
    const float32x4_t a = vsubq_f32(vld1q_f32(x + i), vm);
    const float32x4_t e = vreinterpretq_f32_u32(
        vandq_u32(vcgeq_f32(a, vdupq_n_f32(-87.f)), vreinterpretq_u32_f32(ExpNonPositive4(a))));
    vst1q_f32(x + i, e);
    acc = vaddq_f32(acc, e);
  }
  s = vaddvq_f32(acc);
#endif
  for (; i < n; ++i) {
    x[i] = x[i] - m >= -87.f ? std::exp(x[i] - m) : 0.f;
    s += x[i];
  }
  return s;
}

namespace {
#if ICE_SIMD_AVX2 || ICE_SIMD_NEON
// The target's fp32 vector, for the register tiles of AddWeightedRows: kW lanes, up to kTile
// accumulators (half the register file, the rest for the row's chunk and the broadcast weight).
struct Lanes {
#if ICE_SIMD_AVX512
  using V = __m512;
  static constexpr int kW = 16, kTile = 16;
  template <DType T>
  static V Load(const void* base, size_t i) { return Load16<T>(base, i); }
  static V LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Fma(float a, V x, V acc) { return _mm512_fmadd_ps(_mm512_set1_ps(a), x, acc); }
#elif ICE_SIMD_AVX2
  using V = __m256;
  static constexpr int kW = 8, kTile = 8;
  template <DType T>
  static V Load(const void* base, size_t i) { return Load8<T>(base, i); }
  static V LoadF(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Fma(float a, V x, V acc) { return _mm256_fmadd_ps(_mm256_set1_ps(a), x, acc); }
#else
  using V = float32x4_t;
  static constexpr int kW = 4, kTile = 16;
  template <DType T>
  static V Load(const void* base, size_t i) { return Load4<T>(base, i); }
  static V LoadF(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, V v) { vst1q_f32(p, v); }
  static V Fma(float a, V x, V acc) { return vfmaq_f32(acc, vdupq_n_f32(a), x); }
#endif
};

// Columns [c0, c0 + K * kW) of out's rows j < NQ (heads h0 ..) held in registers over all rows:
// each row's chunk is loaded and converted once for the NQ heads, and out is read and written
// once. Per (head, column) the same fmas in the same row order as one Axpy per nonzero weight
// (a row whose NQ weights are all 0 is skipped; a 0 beside a nonzero weight adds 0 * row).
template <DType T, int NQ, int K>
void AddWeightedTile(const void* rows, int count, int dim, const float* w, float* out, int c0) {
  constexpr int kW = Lanes::kW;
  typename Lanes::V acc[NQ][K];
  for (int j = 0; j < NQ; ++j)
    for (int k = 0; k < K; ++k) acc[j][k] = Lanes::LoadF(out + static_cast<size_t>(j) * dim + c0 + k * kW);
  for (int r = 0; r < count; ++r) {
    float a[NQ];
    bool any = false;
    for (int j = 0; j < NQ; ++j) {
      a[j] = w[static_cast<size_t>(j) * count + r];
      any |= a[j] != 0.f;
    }
    if (!any) continue;
    const size_t b = static_cast<size_t>(r) * dim + c0;
    typename Lanes::V x[K];
    for (int k = 0; k < K; ++k) x[k] = Lanes::template Load<T>(rows, b + k * kW);
    for (int j = 0; j < NQ; ++j)
      for (int k = 0; k < K; ++k) acc[j][k] = Lanes::Fma(a[j], x[k], acc[j][k]);
  }
  for (int j = 0; j < NQ; ++j)
    for (int k = 0; k < K; ++k) Lanes::Store(out + static_cast<size_t>(j) * dim + c0 + k * kW, acc[j][k]);
}

// Columns [c, dim) of heads [0, NQ) (dim % kW == 0): tiles of K vectors while they fit, then of
// K / 2, ... (a row is read once per tile: the widest tiles first).
template <DType T, int NQ, int K>
void AddWeightedCols(const void* rows, int count, int dim, const float* w, float* out, int c) {
  constexpr int kW = Lanes::kW;
  for (; c + K * kW <= dim; c += K * kW) AddWeightedTile<T, NQ, K>(rows, count, dim, w, out, c);
  if constexpr (K > 1) {
    if (c < dim) AddWeightedCols<T, NQ, K / 2>(rows, count, dim, w, out, c);
  }
}

template <DType T, int NQ>
void AddWeightedHeads(const void* rows, int count, int dim, const float* w, float* out) {
  // NQ 3 takes tiles of kTile / 4, then halves (not 5: tiles in powers of two fit the usual head_dims).
  // At most half the tile for one head: K row vectors and K accumulators must fit the registers.
  constexpr int K = std::min(Lanes::kTile / (NQ == 3 ? 4 : NQ), Lanes::kTile / 2);
  AddWeightedCols<T, NQ, K>(rows, count, dim, w, out, 0);
}
#endif

template <DType T>
void AddWeightedRowsT(const void* rows, int count, int dim, const float* w, int nq, float* out) {
#if ICE_SIMD_AVX2 || ICE_SIMD_NEON
  if (dim % Lanes::kW == 0) {
    // Heads four at a time (w and out advance by whole heads).
    for (int j = 0; j < nq; j += 4) {
      const float* wj = w + static_cast<size_t>(j) * count;
      float* oj = out + static_cast<size_t>(j) * dim;
      switch (std::min(4, nq - j)) {
        case 1: AddWeightedHeads<T, 1>(rows, count, dim, wj, oj); break;
        case 2: AddWeightedHeads<T, 2>(rows, count, dim, wj, oj); break;
        case 3: AddWeightedHeads<T, 3>(rows, count, dim, wj, oj); break;
        default: AddWeightedHeads<T, 4>(rows, count, dim, wj, oj); break;
      }
    }
    return;
  }
#endif
  for (int r = 0; r < count; ++r) {
    const void* row = static_cast<const char*>(rows) + static_cast<size_t>(r) * dim * DTypeSize(T);
    for (int j = 0; j < nq; ++j) {
      const float a = w[static_cast<size_t>(j) * count + r];
      if (a != 0.f) Axpy<T>(a, row, out + static_cast<size_t>(j) * dim, dim);
    }
  }
}
}  // namespace

void AddWeightedRows(DType dtype, const void* rows, int count, int dim, const float* w, int nq, float* out) {
  switch (dtype) {
    case DType::kF32: return AddWeightedRowsT<DType::kF32>(rows, count, dim, w, nq, out);
    case DType::kBF16: return AddWeightedRowsT<DType::kBF16>(rows, count, dim, w, nq, out);
    case DType::kF16: return AddWeightedRowsT<DType::kF16>(rows, count, dim, w, nq, out);
    default: return;  // plain types only (the KV store never holds another)
  }
}

void RowToF32(DType dtype, const void* src, float* dst, int n) {
  if (n <= 0) return;  // src/dst may be null (empty vectors)
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DType::kBF16:
      ToF32<DType::kBF16>(src, dst, n);  // exact: a shift
      return;
    case DType::kF16:
      for (int i = 0; i < n; ++i) dst[i] = F16ToF32(static_cast<const uint16_t*>(src)[i]);
      return;
    default: return;  // plain types only (the KV store never holds another)
  }
}

void RowFromF32(DType dtype, const float* src, void* dst, int n) {
  if (n <= 0) return;  // src/dst may be null (empty vectors)
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DType::kBF16: {
      int i = 0;
      uint16_t* d = static_cast<uint16_t*>(dst);
#if ICE_SIMD_AVX512
      for (; i + 16 <= n; i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), Bf16x16(src + i));
#elif ICE_SIMD_AVX2
      for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), Bf16x8(src + i));
#elif ICE_SIMD_NEON
      for (; i + 4 <= n; i += 4) vst1_u16(d + i, Bf16x4(src + i));
#endif
      for (; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16:
      for (int i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = F32ToF16(src[i]);
      return;
    default: return;  // plain types only (the KV store never holds another)
  }
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
