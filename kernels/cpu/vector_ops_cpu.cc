// The IceCache store's vector kernels (contracts: kvstore/vector_ops.h, which dispatches to the
// active SIMD target's copy of this file): scoring of f32/f16/bf16 rows, the batched arg-max of
// the DCI-tree parent search (fp32, bf16 pairs, exact int8), the int8 row blocks of a query's
// upper levels, row conversions and streaming stores.
#include <atomic>
#include <climits>

#include "kernels/cpu/simd.h"  // last: switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {
namespace {

// kI8ExtraQuads of kvstore/vector_ops.h: the words of the MIPS extra coordinate.
constexpr int kI8ExtraQuads = 1;
// kI8MaxQuads of kvstore/vector_ops.h.
constexpr int kI8MaxQuadsKernel = 256;

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
      out[r] = _mm512_reduce_add_ps(a0);
      out[r + 1] = _mm512_reduce_add_ps(a1);
      out[r + 2] = _mm512_reduce_add_ps(a2);
      out[r + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; r < count; ++r) {
      __m512 a0 = _mm512_setzero_ps();
      const size_t b = static_cast<size_t>(r) * dim;
      for (int i = 0; i < dim; i += 16) a0 = _mm512_fmadd_ps(Load16<T>(rows, b + i), _mm512_loadu_ps(q + i), a0);
      out[r] = _mm512_reduce_add_ps(a0);
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
      out[r] = HSum8(a0);
      out[r + 1] = HSum8(a1);
      out[r + 2] = HSum8(a2);
      out[r + 3] = HSum8(a3);
    }
  }
#endif
  for (; r < count; ++r) out[r] = DotRow<T>(rows, static_cast<size_t>(r) * dim, q, dim);
}

#if ICE_SIMD_AVX512
// NQ queries against two rows at a time: each 16-element chunk of a row is loaded and converted
// once for all NQ queries (2 * NQ accumulators), instead of once per query.
template <DType T, int NQ>
void ScoreRowsFused(const void* rows, int count, int dim, const float* qs, float* out) {
  int r = 0;
  for (; r + 2 <= count; r += 2) {
    __m512 a[2][NQ];
    for (int j = 0; j < NQ; ++j) a[0][j] = a[1][j] = _mm512_setzero_ps();
    const size_t b = static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; i += 16) {
      const __m512 r0 = Load16<T>(rows, b + i), r1 = Load16<T>(rows, b + dim + i);
      for (int j = 0; j < NQ; ++j) {
        const __m512 qv = _mm512_loadu_ps(qs + static_cast<size_t>(j) * dim + i);
        a[0][j] = _mm512_fmadd_ps(r0, qv, a[0][j]);
        a[1][j] = _mm512_fmadd_ps(r1, qv, a[1][j]);
      }
    }
    for (int j = 0; j < NQ; ++j) {
      out[static_cast<size_t>(j) * count + r] = _mm512_reduce_add_ps(a[0][j]);
      out[static_cast<size_t>(j) * count + r + 1] = _mm512_reduce_add_ps(a[1][j]);
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
    for (int j = 0; j < NQ; ++j) out[static_cast<size_t>(j) * count + r] = _mm512_reduce_add_ps(a[j]);
  }
}
#endif

template <DType T>
void ScoreRowsMultiT(const void* rows, int count, int dim, const float* qs, int nq, float* out) {
#if ICE_SIMD_AVX512
  if (dim % 16 == 0) {
    // The GQA group sizes of the supported models (a KV head's query heads share its tree).
    switch (nq) {
      case 2: return ScoreRowsFused<T, 2>(rows, count, dim, qs, out);
      case 4: return ScoreRowsFused<T, 4>(rows, count, dim, qs, out);
      case 8: return ScoreRowsFused<T, 8>(rows, count, dim, qs, out);
      default: break;
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

namespace {

float MaxAbs(const float* v, int n) {
  float mx = 0.f;
  int j = 0;
#if ICE_SIMD_AVX512
  __m512 m = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(v + j)));
  mx = _mm512_reduce_max_ps(m);
#elif ICE_SIMD_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(abs_mask, _mm256_loadu_ps(v + j)));
  mx = HMax8(m);
#endif
  for (; j < n; ++j) mx = std::max(mx, std::fabs(v[j]));
  return mx;
}

#if ICE_SIMD_AVX2
// The 8 int32 lanes of v (each in [-128, 127]) as 8 bytes at q (saturating packs: never clip).
inline void StoreI8x8(int8_t* q, __m256i v) {
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(w, w));
}
#endif

// q[j] = round(v[j] * inv) (nearest, ties to even), |v[j] * inv| <= 127 up to rounding.
void RoundToI8(const float* v, int n, float inv, int8_t* q) {
  int j = 0;
#if ICE_SIMD_AVX512
  // cvtps rounds in the current mode as nearbyint does; the saturating narrow never clips.
  const __m512 vi = _mm512_set1_ps(inv);
  for (; j + 16 <= n; j += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + j), vi))));
#elif ICE_SIMD_AVX2
  const __m256 vi = _mm256_set1_ps(inv);
  for (; j + 8 <= n; j += 8) StoreI8x8(q + j, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + j), vi)));
#endif
  for (; j < n; ++j) q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(v[j] * inv), -127.f, 127.f));
}

#if ICE_SIMD_AVX2
// The AVX2 int8 dot (no vpdpbusd; vpmaddubsw saturates at int16, 2 * 255 * 127 > 32767): a row
// word's u8 bytes split into even (0, 2) and odd (1, 3) bytes as int16 pairs (w & 0x00ff00ff,
// (w >> 8) & 0x00ff00ff), a key word's s8 bytes likewise, sign-extended; vpmaddwd then gives
// exact int32 sums of two products.
// kl[j] = s8 bytes (0, 2) of w[j] as int16 pairs, kh[j] = bytes (1, 3), for j < quads.
inline void SplitS8Words(const uint32_t* w, int quads, int32_t* kl, int32_t* kh) {
  auto pair = [](uint32_t lo, uint32_t hi) {
    return static_cast<int32_t>(static_cast<uint16_t>(static_cast<int8_t>(lo)) |
                                static_cast<uint32_t>(static_cast<uint16_t>(static_cast<int8_t>(hi))) << 16);
  };
  for (int j = 0; j < quads; ++j) {
    kl[j] = pair(w[j], w[j] >> 16);
    kh[j] = pair(w[j] >> 8, w[j] >> 24);
  }
}

// acc + per lane the 4-byte dot of the row word (split as even / odd) with the key word (kl, kh).
inline __m256i AddDotPairs(__m256i acc, __m256i even, __m256i odd, __m256i kl, __m256i kh) {
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(even, kl), _mm256_madd_epi16(odd, kh)));
}
#endif

// Four bytes of one word (byte b = value b).
uint32_t Word(int b0, int b1, int b2, int b3) {
  return static_cast<uint32_t>(b0 & 0xff) | static_cast<uint32_t>(b1 & 0xff) << 8 |
         static_cast<uint32_t>(b2 & 0xff) << 16 | static_cast<uint32_t>(b3 & 0xff) << 24;
}

// q[0..3] as a row word: each value + 128 (u8).
uint32_t OffsetWord(const int8_t* q) { return Word(q[0] + 128, q[1] + 128, q[2] + 128, q[3] + 128); }

// The four products of a key / query word (s8 bytes) with a row word (u8 bytes, value + 128),
// summed: what one vpdpbusd lane adds, with the row offset removed.
int32_t DotS8U8(uint32_t s8, uint32_t u8) {
  int32_t d = 0;
  for (int k = 0; k < 4; ++k) d += static_cast<int8_t>(s8 >> (8 * k)) * (static_cast<int32_t>((u8 >> (8 * k)) & 0xff) - 128);
  return d;
}

}  // namespace

float QuantizeRowsI8(const float* rows, int nr, int dim, const float* extra, int ld, uint32_t* rows_t) {
  const int dq = (dim + 3) / 4;
  float mx = 0.f;
  for (int r = 0; r < nr; ++r) mx = std::max({mx, MaxAbs(rows + static_cast<size_t>(r) * dim, dim), extra[r] / 4.f});
  const float s = mx / 127.f, inv = mx > 0.f ? 127.f / mx : 0.f;
  std::vector<int8_t> q(static_cast<size_t>(dq) * 4, 0);
  for (int r = 0; r < nr; ++r) {
    RoundToI8(rows + static_cast<size_t>(r) * dim, dim, inv, q.data());
    for (int j = 0; j < dq; ++j) rows_t[static_cast<size_t>(j) * ld + r] = OffsetWord(&q[4 * j]);
    // The augmented coordinate: e <= 508 as four bytes of at most 127 (with the key's t in all
    // four bytes of its extra quad, the quad's dot is t * e).
    const int e = static_cast<int>(std::clamp(std::nearbyint(extra[r] * inv), 0.f, 508.f));
    int8_t b[4];
    for (int k = 0; k < 4; ++k) b[k] = static_cast<int8_t>(std::min(127, std::max(0, e - 127 * k)));
    for (int k = 0; k < kI8ExtraQuads; ++k) rows_t[static_cast<size_t>(dq + k) * ld + r] = OffsetWord(b);
  }
  return s;
}

int32_t QuantizeKeyI8(const float* key, int dim, float extra, uint32_t* dst, float* scale) {
  const int dq = (dim + 3) / 4;
  const float mx = std::max(MaxAbs(key, dim), extra);
  const float inv = mx > 0.f ? 127.f / mx : 0.f;
  if (scale != nullptr) *scale = mx / 127.f;
  // The words' bytes, in order (little-endian: byte b of word j is value 4j + b); pad bytes 0.
  std::memset(dst, 0, static_cast<size_t>(dq) * 4);
  int8_t* b = reinterpret_cast<int8_t*>(dst);
  int32_t sum = 0;
  int j = 0;
#if ICE_SIMD_AVX512
  // RoundToI8's conversion with the byte sum taken on the way (one pass instead of two).
  const __m512 vi = _mm512_set1_ps(inv);
  __m512i acc = _mm512_setzero_si512();
  for (; j + 16 <= dim; j += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(key + j), vi));
    acc = _mm512_add_epi32(acc, v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + j), _mm512_cvtsepi32_epi8(v));
  }
  sum = _mm512_reduce_add_epi32(acc);
#elif ICE_SIMD_AVX2
  const __m256 vi = _mm256_set1_ps(inv);
  __m256i acc = _mm256_setzero_si256();
  for (; j + 8 <= dim; j += 8) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(key + j), vi));
    acc = _mm256_add_epi32(acc, v);
    StoreI8x8(b + j, v);
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  for (int t = 0; t < 8; ++t) sum += lanes[t];
#endif
  RoundToI8(key + j, dim - j, inv, b + j);
  for (; j < dim; ++j) sum += b[j];
  const int t = static_cast<int>(std::clamp(std::nearbyint(extra * inv), 0.f, 127.f));
  dst[dq] = Word(t, t, t, t);
  return sum + 4 * t;
}

namespace {

// ArgmaxDotI8 of key i alone, in scalar code: the same integers (u8 row bytes minus 128 times s8
// key bytes), ties to the lowest row.
int32_t ArgmaxDotI8One(const uint32_t* x, int i, const uint32_t* rows_t, int ld, int nr, int quads) {
  const uint32_t* xi = x + static_cast<size_t>(i) * quads;
  int32_t bs = INT32_MIN, arg = 0;
  for (int r = 0; r < nr; ++r) {
    int32_t dot = 0;
    for (int j = 0; j < quads; ++j) dot += DotS8U8(xi[j], rows_t[static_cast<size_t>(j) * ld + r]);
    if (dot > bs) { bs = dot; arg = r; }
  }
  return arg;
}

}  // namespace

void ArgmaxDotI8(const uint32_t* x, const int32_t* x_sum, int nx, const uint32_t* rows_t, int ld, int nr, int quads,
                 int32_t* best) {
  int i = 0;
#if ICE_SIMD_AVX512
  // kT keys against 32 rows per pass: one vpdpbusd (four u8 row bytes x s8 key bytes per lane)
  // per quad, the key's word broadcast; accumulators start at -128 * the key's byte sum, which
  // removes the rows' +128 offset. A row's running best per lane is kept as one int32,
  // dot * 128 + (127 - block), so a max picks the larger dot and, on ties, the earlier block;
  // rows are scanned in chunks of 128 blocks and the chunks' winners compared by dot.
  constexpr int kT = 5;
  const int nb = (nr + 31) / 32;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; i < nx; i += kT) {
    const uint32_t* xs[kT];
    __m512i init[kT];
    int32_t best_dot[kT], best_row[kT];
    for (int t = 0; t < kT; ++t) {
      const int src = std::min(i + t, nx - 1);
      xs[t] = x + static_cast<size_t>(src) * quads;
      init[t] = _mm512_set1_epi32(-128 * x_sum[src]);
      best_dot[t] = INT32_MIN;
      best_row[t] = 0;
    }
    for (int c0 = 0; c0 < nb; c0 += 128) {
      const int c1 = std::min(nb, c0 + 128);
      __m512i bk[kT][2];
      for (int t = 0; t < kT; ++t) bk[t][0] = bk[t][1] = _mm512_set1_epi32(INT32_MIN);
      for (int b = c0; b < c1; ++b) {
        __m512i acc[kT][2];
        for (int t = 0; t < kT; ++t) acc[t][0] = acc[t][1] = init[t];
        const uint32_t* r = rows_t + static_cast<size_t>(b) * 32;
        for (int j = 0; j < quads; ++j, r += ld) {
          const __m512i r0 = _mm512_loadu_si512(r), r1 = _mm512_loadu_si512(r + 16);
          for (int t = 0; t < kT; ++t) {
            const __m512i u = _mm512_set1_epi32(static_cast<int>(xs[t][j]));
            acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], r0, u);
            acc[t][1] = _mm512_dpbusd_epi32(acc[t][1], r1, u);
          }
        }
        // Lanes past nr (the last block's padding) never count.
        const __m512i rem = _mm512_set1_epi32(nr - b * 32);
        const __mmask16 v0 = _mm512_cmplt_epi32_mask(lane, rem);
        const __mmask16 v1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16)), rem);
        const __m512i c = _mm512_set1_epi32(127 - (b - c0));
        for (int t = 0; t < kT; ++t) {
          bk[t][0] = _mm512_mask_max_epi32(bk[t][0], v0, bk[t][0], _mm512_add_epi32(_mm512_slli_epi32(acc[t][0], 7), c));
          bk[t][1] = _mm512_mask_max_epi32(bk[t][1], v1, bk[t][1], _mm512_add_epi32(_mm512_slli_epi32(acc[t][1], 7), c));
        }
      }
      for (int t = 0; t < kT; ++t) {
        // The best key; among lanes holding it, the lowest (same block, same dot).
        const int32_t m = _mm512_reduce_max_epi32(_mm512_max_epi32(bk[t][0], bk[t][1]));
        const __m512i mv = _mm512_set1_epi32(m);
        const uint32_t eq = _mm512_cmpeq_epi32_mask(bk[t][0], mv) | static_cast<uint32_t>(_mm512_cmpeq_epi32_mask(bk[t][1], mv)) << 16;
        const int32_t dot = m >> 7;  // arithmetic: the low 7 bits hold 127 - block
        if (dot > best_dot[t]) {
          best_dot[t] = dot;
          best_row[t] = (c0 + 127 - (m & 127)) * 32 + __builtin_ctz(eq);
        }
      }
    }
    for (int t = 0; t < kT && i + t < nx; ++t) best[i + t] = best_row[t];
  }
#elif ICE_SIMD_AVX2
  // Exact int32 dots by AddDotPairs (each key's words split once). kT keys against 16 rows per
  // pass; the running best per lane and the chunk scheme are those of the AVX-512 kernel, with
  // strips of 16 rows in place of blocks of 32.
  constexpr int kT = 4;
  const int ns = (nr + 15) / 16;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i even = _mm256_set1_epi32(0x00ff00ff);
  const __m256i int_min = _mm256_set1_epi32(INT32_MIN);
  alignas(32) int32_t kl[kT][kI8MaxQuadsKernel], kh[kT][kI8MaxQuadsKernel];
  for (; i < nx; i += kT) {
    __m256i init[kT];
    int32_t best_dot[kT], best_row[kT];
    for (int t = 0; t < kT; ++t) {
      const int src = std::min(i + t, nx - 1);
      const uint32_t* xs = x + static_cast<size_t>(src) * quads;
      SplitS8Words(xs, quads, kl[t], kh[t]);
      init[t] = _mm256_set1_epi32(-128 * x_sum[src]);
      best_dot[t] = INT32_MIN;
      best_row[t] = 0;
    }
    for (int c0 = 0; c0 < ns; c0 += 128) {
      const int c1 = std::min(ns, c0 + 128);
      __m256i bk[kT][2];
      for (int t = 0; t < kT; ++t) bk[t][0] = bk[t][1] = int_min;
      for (int b = c0; b < c1; ++b) {
        __m256i acc[kT][2];
        for (int t = 0; t < kT; ++t) acc[t][0] = acc[t][1] = init[t];
        const uint32_t* r = rows_t + static_cast<size_t>(b) * 16;
        for (int j = 0; j < quads; ++j, r += ld) {
          const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
          const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 8));
          const __m256i e0 = _mm256_and_si256(r0, even), o0 = _mm256_and_si256(_mm256_srli_epi32(r0, 8), even);
          const __m256i e1 = _mm256_and_si256(r1, even), o1 = _mm256_and_si256(_mm256_srli_epi32(r1, 8), even);
          for (int t = 0; t < kT; ++t) {
            const __m256i ul = _mm256_set1_epi32(kl[t][j]), uh = _mm256_set1_epi32(kh[t][j]);
            acc[t][0] = AddDotPairs(acc[t][0], e0, o0, ul, uh);
            acc[t][1] = AddDotPairs(acc[t][1], e1, o1, ul, uh);
          }
        }
        // Lanes past nr never count.
        const __m256i rem = _mm256_set1_epi32(nr - b * 16);
        const __m256i v0 = _mm256_cmpgt_epi32(rem, lane);
        const __m256i v1 = _mm256_cmpgt_epi32(rem, _mm256_add_epi32(lane, _mm256_set1_epi32(8)));
        const __m256i c = _mm256_set1_epi32(127 - (b - c0));
        for (int t = 0; t < kT; ++t) {
          const __m256i s0 = _mm256_add_epi32(_mm256_slli_epi32(acc[t][0], 7), c);
          const __m256i s1 = _mm256_add_epi32(_mm256_slli_epi32(acc[t][1], 7), c);
          bk[t][0] = _mm256_max_epi32(bk[t][0], _mm256_blendv_epi8(int_min, s0, v0));
          bk[t][1] = _mm256_max_epi32(bk[t][1], _mm256_blendv_epi8(int_min, s1, v1));
        }
      }
      for (int t = 0; t < kT; ++t) {
        // The best key; among lanes holding it, the lowest (same strip, same dot).
        __m256i mv = _mm256_max_epi32(bk[t][0], bk[t][1]);
        mv = _mm256_max_epi32(mv, _mm256_permute2x128_si256(mv, mv, 1));
        mv = _mm256_max_epi32(mv, _mm256_shuffle_epi32(mv, 0x4e));
        mv = _mm256_max_epi32(mv, _mm256_shuffle_epi32(mv, 0xb1));
        const int32_t m = _mm256_cvtsi256_si32(mv);
        const uint32_t eq = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(bk[t][0], mv)))) |
                            static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(bk[t][1], mv)))) << 8;
        const int32_t dot = m >> 7;  // arithmetic: the low 7 bits hold 127 - strip
        if (dot > best_dot[t]) {
          best_dot[t] = dot;
          best_row[t] = (c0 + 127 - (m & 127)) * 16 + __builtin_ctz(eq);
        }
      }
    }
    for (int t = 0; t < kT && i + t < nx; ++t) best[i + t] = best_row[t];
  }
#endif
  for (; i < nx; ++i) best[i] = ArgmaxDotI8One(x, i, rows_t, ld, nr, quads);
}

float QuantizeRowI8(const float* v, int dim, uint32_t* words, size_t stride) {
  const int quads = (dim + 3) / 4;
  const float mx = MaxAbs(v, dim);
  const float inv = mx > 0.f ? 127.f / mx : 0.f;
  std::vector<int8_t> q(static_cast<size_t>(quads) * 4, 0);
  RoundToI8(v, dim, inv, q.data());
  for (int j = 0; j < quads; ++j) words[j * stride] = OffsetWord(&q[4 * j]);
  return mx;
}

void ScoreRowsI8(const uint32_t* words, const float* scale, int quads, int nr, const uint32_t* qw, int qstride,
                 const int32_t* q_sum, const float* q_scale, int nq, float* out) {
  for (int h0 = 0; h0 < nq; h0 += 4) {
    const int nh = std::min(4, nq - h0);
#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
    // The queries' words split once for all blocks (AddDotPairs).
    int32_t kl[4][kI8MaxQuadsKernel], kh[4][kI8MaxQuadsKernel];
    for (int h = 0; h < nh; ++h) SplitS8Words(qw + static_cast<size_t>(h0 + h) * qstride, quads, kl[h], kh[h]);
#endif
    for (int b = 0; b * 32 < nr; ++b) {
      const uint32_t* blk = words + static_cast<size_t>(b) * quads * 32;
      const int r0 = b * 32, cnt = std::min(32, nr - r0);
#if ICE_SIMD_AVX512
      // As ArgmaxDotI8: s8 query words broadcast against u8 row bytes, the accumulators started
      // at -128 * the query's byte sum.
      __m512i acc[4][2];
      for (int h = 0; h < nh; ++h) acc[h][0] = acc[h][1] = _mm512_set1_epi32(-128 * q_sum[h0 + h]);
      for (int j = 0; j < quads; ++j) {
        const __m512i a = _mm512_loadu_si512(blk + j * 32), c = _mm512_loadu_si512(blk + j * 32 + 16);
        for (int h = 0; h < nh; ++h) {
          const __m512i u = _mm512_set1_epi32(static_cast<int>(qw[static_cast<size_t>(h0 + h) * qstride + j]));
          acc[h][0] = _mm512_dpbusd_epi32(acc[h][0], a, u);
          acc[h][1] = _mm512_dpbusd_epi32(acc[h][1], c, u);
        }
      }
      const __mmask16 m0 = cnt >= 16 ? 0xffff : static_cast<__mmask16>((1u << cnt) - 1);
      const __mmask16 m1 = cnt <= 16 ? 0 : cnt >= 32 ? 0xffff : static_cast<__mmask16>((1u << (cnt - 16)) - 1);
      const __m512 s0 = _mm512_maskz_loadu_ps(m0, scale + r0), s1 = _mm512_maskz_loadu_ps(m1, scale + r0 + 16);
      for (int h = 0; h < nh; ++h) {
        const __m512 qs = _mm512_set1_ps(q_scale[h0 + h]);
        float* o = out + static_cast<size_t>(h0 + h) * nr + r0;
        _mm512_mask_storeu_ps(o, m0, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][0]), _mm512_mul_ps(qs, s0)));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[h][1]), _mm512_mul_ps(qs, s1)));
      }
#elif ICE_SIMD_AVX2
      // As ArgmaxDotI8's AVX2 kernel (AddDotPairs), 16 rows of the block per pass.
      const __m256i even = _mm256_set1_epi32(0x00ff00ff);
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (int half = 0; half * 16 < cnt; ++half) {
        __m256i acc[4][2];
        for (int h = 0; h < nh; ++h) acc[h][0] = acc[h][1] = _mm256_set1_epi32(-128 * q_sum[h0 + h]);
        for (int j = 0; j < quads; ++j) {
          const uint32_t* rw = blk + j * 32 + half * 16;
          const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rw));
          const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rw + 8));
          const __m256i ae = _mm256_and_si256(a, even), ao = _mm256_and_si256(_mm256_srli_epi32(a, 8), even);
          const __m256i ce = _mm256_and_si256(c, even), co = _mm256_and_si256(_mm256_srli_epi32(c, 8), even);
          for (int h = 0; h < nh; ++h) {
            const __m256i ul = _mm256_set1_epi32(kl[h][j]), uh = _mm256_set1_epi32(kh[h][j]);
            acc[h][0] = AddDotPairs(acc[h][0], ae, ao, ul, uh);
            acc[h][1] = AddDotPairs(acc[h][1], ce, co, ul, uh);
          }
        }
        const int base = r0 + half * 16, n16 = std::min(16, cnt - half * 16);
        const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n16), lane);
        const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n16 - 8), lane);
        const __m256 s0 = _mm256_maskload_ps(scale + base, m0), s1 = _mm256_maskload_ps(scale + base + 8, m1);
        for (int h = 0; h < nh; ++h) {
          const __m256 qs = _mm256_set1_ps(q_scale[h0 + h]);
          float* o = out + static_cast<size_t>(h0 + h) * nr + base;
          _mm256_maskstore_ps(o, m0, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][0]), _mm256_mul_ps(qs, s0)));
          _mm256_maskstore_ps(o + 8, m1, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][1]), _mm256_mul_ps(qs, s1)));
        }
      }
#else
      for (int h = 0; h < nh; ++h) {
        const uint32_t* q = qw + static_cast<size_t>(h0 + h) * qstride;
        for (int r = 0; r < cnt; ++r) {
          int32_t dot = 0;
          for (int j = 0; j < quads; ++j) dot += DotS8U8(q[j], blk[j * 32 + r]);
          out[static_cast<size_t>(h0 + h) * nr + r0 + r] = static_cast<float>(dot) * (q_scale[h0 + h] * scale[r0 + r]);
        }
      }
#endif
    }
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
  // DotRow's arithmetic twice over one read of a: the same values as DotF32(a, a) and DotF32(b, a).
  int i = 0;
  float s = 0.f, x = 0.f;
#if ICE_SIMD_AVX2
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
  s = HSum8(_mm256_add_ps(s0, s1));
  x = HSum8(_mm256_add_ps(x0, x1));
#endif
  for (; i < n; ++i) {
    s += a[i] * a[i];
    x += b[i] * a[i];
  }
  *aa = s;
  *ab = x;
}

void ScoreRows(DType dtype, const void* rows, int count, int dim, const float* q, float* out) {
  switch (dtype) {
    case DType::kF32: return ScoreRowsT<DType::kF32>(rows, count, dim, q, out);
    case DType::kBF16: return ScoreRowsT<DType::kBF16>(rows, count, dim, q, out);
    case DType::kF16: return ScoreRowsT<DType::kF16>(rows, count, dim, q, out);
  }
}

void ScoreRowsMulti(DType dtype, const void* rows, int count, int dim, const float* qs, int nq,
                    float* out) {
  switch (dtype) {
    case DType::kF32: return ScoreRowsMultiT<DType::kF32>(rows, count, dim, qs, nq, out);
    case DType::kBF16: return ScoreRowsMultiT<DType::kBF16>(rows, count, dim, qs, nq, out);
    case DType::kF16: return ScoreRowsMultiT<DType::kF16>(rows, count, dim, qs, nq, out);
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
#endif
      for (; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16:
      for (int i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = F32ToF16(src[i]);
      return;
  }
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
