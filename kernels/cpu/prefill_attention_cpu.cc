// CPU causal prefill attention (cpu::PrefillAttention, cpu_ops.h), tiled (FlashAttention-style).
//
// Work is split into tasks of (kv head, block of query positions); a task's rows are its
// positions times the GQA group's query heads, so every K/V block it reads serves all of them.
// The keys of every kv head are transposed in blocks of kKeyBlock once per call; per key block a
// task computes S = Q·Kᵀ (register tiles of kStripRows rows × 16 keys), the causal mask on the
// diagonal block only, online softmax (running max and sum per row, vectorised exp), then O += P·V
// (tiles of kStripRows rows × 16 dims). The driver
// (PrefillTask) is shared by the avx512, avx2 and neon targets; the register tiles, the softmax
// step and row scaling have one form per target. On the scalar target (or for head_dim not a
// multiple of 16) a row-by-row version runs instead.


#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/prefill_attention_cpu.h"
#include "kernels/cpu/simd.h"  // switches code generation to the target
#include "kernels/cpu/amx.h"

// The targets with the tiled form (register tiles, softmax step and row scaling below).
#define ICE_PREFILL_TILED (ICE_SIMD_AVX2 || ICE_SIMD_NEON)

namespace icecache::kernels::cpu::ICE_SIMD_NS {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The per-call K (and V) copies live in a per-thread buffer reused across calls (a prefill makes
// one call per layer; a fresh buffer would be zeroed and fault its pages in every time), grown to
// at least n elements; ReleaseLargeScratch frees it after a call that needed more than 64 MiB.
template <typename T>
T* GrowScratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
template <typename T>
void ReleaseLargeScratch(std::vector<T>& buf) {
  if (buf.size() * sizeof(T) > (size_t{64} << 20)) std::vector<T>().swap(buf);
}

// Reference-shaped fallback: one query row at a time, exact two-pass softmax.
void PrefillRowsScalar(const PrefillAttentionParams& p, int kvh, int i0, int i1, std::vector<float>& sc) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int offset = p.kv_len - p.q_len;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
  sc.resize(p.kv_len);
  for (int i = i0; i < i1; ++i) {
    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
      const float* q = p.q + (static_cast<size_t>(i) * p.num_q_heads + h) * d;
      float* o = p.out + (static_cast<size_t>(i) * p.num_q_heads + h) * d;
      const int n = i + offset + 1;
      float mx = kNegInf;
      for (int j = 0; j < n; ++j) {
        sc[j] = Dot<DType::kF32>(q, p.k + j * kv_stride + static_cast<size_t>(kvh) * d, d) * p.scale;
        mx = std::max(mx, sc[j]);
      }
      float sum = 0.f;
      for (int j = 0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
      const float inv = 1.f / sum;
      for (int e = 0; e < d; ++e) o[e] = 0.f;
      for (int j = 0; j < n; ++j) Axpy<DType::kF32>(sc[j] * inv, p.v + j * kv_stride + static_cast<size_t>(kvh) * d, o, d);
    }
  }
}

#if ICE_PREFILL_TILED
constexpr int kKeyBlock = 64;  // keys per block: 4 zmm (8 ymm) of scores per row

// Working memory of one task, reused across tasks of a thread.
struct Tile {
  std::vector<float> q;    // [rows, d], scaled
  std::vector<float> o;    // [rows, d], unnormalised
  std::vector<float> s;    // [rows, kKeyBlock], scores then probabilities
  std::vector<float> m, l; // [rows] running max and sum
  std::vector<int> limit;  // [rows] last visible key position
};
#endif

#if ICE_SIMD_AVX512
// S[r0..r0+R) = Q[r0..] · Kt for R <= 4 rows.
template <int R>
inline void ScoreRows(const float* q, int d, const float* kt, float* s) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int e = 0; e < d; ++e) {
    const float* kr = kt + static_cast<size_t>(e) * kKeyBlock;
    const __m512 k0 = _mm512_loadu_ps(kr), k1 = _mm512_loadu_ps(kr + 16), k2 = _mm512_loadu_ps(kr + 32),
                 k3 = _mm512_loadu_ps(kr + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 qe = _mm512_set1_ps(q[static_cast<size_t>(r) * d + e]);
      acc[r][0] = _mm512_fmadd_ps(qe, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qe, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qe, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qe, k3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + static_cast<size_t>(r) * kKeyBlock + c * 16, acc[r][c]);
}

// O[r0..r0+R)[c0..c0+64) += P[r0..] · V[block][c0..c0+64) for R <= 4 rows, nk keys.
template <int R>
inline void AccumulateRows(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_loadu_ps(o + static_cast<size_t>(r) * d + c0 + c * 16);
  for (int j = 0; j < nk; ++j) {
    const float* vr = v + j * v_stride + c0;
    const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16), v2 = _mm512_loadu_ps(vr + 32),
                 v3 = _mm512_loadu_ps(vr + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 pj = _mm512_set1_ps(s[static_cast<size_t>(r) * kKeyBlock + j]);
      acc[r][0] = _mm512_fmadd_ps(pj, v0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(pj, v1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(pj, v2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(pj, v3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + static_cast<size_t>(r) * d + c0 + c * 16, acc[r][c]);
}

// Like AccumulateRows for a 16-wide column chunk (head_dim not a multiple of 64).
template <int R>
inline void AccumulateRows16(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_loadu_ps(o + static_cast<size_t>(r) * d + c0);
  for (int j = 0; j < nk; ++j) {
    const __m512 vj = _mm512_loadu_ps(v + j * v_stride + c0);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(s[static_cast<size_t>(r) * kKeyBlock + j]), vj, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(o + static_cast<size_t>(r) * d + c0, acc[r]);
}

// dst[0..d) = src[0..d) * a (d % 16 == 0).
inline void ScaleRow(float* dst, const float* src, float a, int d) {
  const __m512 av = _mm512_set1_ps(a);
  for (int e = 0; e < d; e += 16) _mm512_storeu_ps(dst + e, _mm512_mul_ps(_mm512_loadu_ps(src + e), av));
}

// One row's online-softmax step over a key block: s [kKeyBlock] scores become probabilities
// (keys at and past `visible` get 0), the running max m and sum l are updated and the row's
// unnormalised output o [d] rescaled.
inline void SoftmaxRow(float* s, int visible, float& m, float& l, float* o, int d) {
  const __mmask64 keep = visible >= 64 ? ~0ull : ((1ull << visible) - 1);
  __m512 sv[4];
  __m512 mx = _mm512_set1_ps(kNegInf);
  for (int c = 0; c < 4; ++c) {
    const __mmask16 mk = static_cast<__mmask16>(keep >> (16 * c));
    sv[c] = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), mk, _mm512_loadu_ps(s + 16 * c));
    mx = _mm512_max_ps(mx, sv[c]);
  }
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  if (m_new == kNegInf) {  // nothing visible yet in this row
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + 16 * c, _mm512_setzero_ps());
    return;
  }
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < 4; ++c) {
    const __mmask16 mk = static_cast<__mmask16>(keep >> (16 * c));
    const __m512 e = _mm512_maskz_mov_ps(mk, ExpNonPositive(_mm512_sub_ps(sv[c], mv)));
    _mm512_storeu_ps(s + 16 * c, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float alpha = m == kNegInf ? 0.f : std::exp(m - m_new);
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = m_new;
  if (alpha != 1.f) ScaleRow(o, o, alpha, d);
}
#elif ICE_SIMD_AVX2
// The AVX2 forms of the helpers above: 16 ymm registers (not 32 zmm) hold a 6-row x 16-column
// tile (12 accumulators, 2 operand vectors, the broadcast), so the 64-key / 64-column tiles are
// done as four 16-wide strips (the strip's other operand is re-read from L1).

// S[r0..r0+R) = Q[r0..] · Kt for R <= 6 rows.
template <int R>
inline void ScoreRows(const float* q, int d, const float* kt, float* s) {
  for (int c0 = 0; c0 < kKeyBlock; c0 += 16) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int e = 0; e < d; ++e) {
      const float* kr = kt + static_cast<size_t>(e) * kKeyBlock + c0;
      const __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 qe = _mm256_broadcast_ss(q + static_cast<size_t>(r) * d + e);
        acc[r][0] = _mm256_fmadd_ps(qe, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qe, k1, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(s + static_cast<size_t>(r) * kKeyBlock + c0, acc[r][0]);
      _mm256_storeu_ps(s + static_cast<size_t>(r) * kKeyBlock + c0 + 8, acc[r][1]);
    }
  }
}

// O[r0..r0+R)[c0..c0+16) += P[r0..] · V[block][c0..c0+16) for R <= 6 rows, nk keys.
template <int R>
inline void AccumulateRows16(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm256_loadu_ps(o + static_cast<size_t>(r) * d + c0);
    acc[r][1] = _mm256_loadu_ps(o + static_cast<size_t>(r) * d + c0 + 8);
  }
  for (int j = 0; j < nk; ++j) {
    const __m256 v0 = _mm256_loadu_ps(v + j * v_stride + c0), v1 = _mm256_loadu_ps(v + j * v_stride + c0 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 pj = _mm256_broadcast_ss(s + static_cast<size_t>(r) * kKeyBlock + j);
      acc[r][0] = _mm256_fmadd_ps(pj, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(pj, v1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(o + static_cast<size_t>(r) * d + c0, acc[r][0]);
    _mm256_storeu_ps(o + static_cast<size_t>(r) * d + c0 + 8, acc[r][1]);
  }
}

template <int R>
inline void AccumulateRows(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  for (int c = c0; c < c0 + 64; c += 16) AccumulateRows16<R>(s, v, v_stride, nk, o, d, c);
}

inline void ScaleRow(float* dst, const float* src, float a, int d) {
  const __m256 av = _mm256_set1_ps(a);
  for (int e = 0; e < d; e += 8) _mm256_storeu_ps(dst + e, _mm256_mul_ps(_mm256_loadu_ps(src + e), av));
}

inline void SoftmaxRow(float* s, int visible, float& m, float& l, float* o, int d) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  __m256 keep[8], sv[8];
  __m256 mx = neg_inf;
  for (int c = 0; c < 8; ++c) {
    keep[c] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(visible - 8 * c), lane));
    sv[c] = _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(s + 8 * c), keep[c]);
    mx = _mm256_max_ps(mx, sv[c]);
  }
  const float m_new = std::max(m, HMax8(mx));
  if (m_new == kNegInf) {
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(s + 8 * c, _mm256_setzero_ps());
    return;
  }
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int c = 0; c < 8; ++c) {
    const __m256 e = _mm256_and_ps(keep[c], ExpNonPositive8(_mm256_sub_ps(sv[c], mv)));
    _mm256_storeu_ps(s + 8 * c, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float alpha = m == kNegInf ? 0.f : std::exp(m - m_new);
  l = l * alpha + HSum8(sum);
  m = m_new;
  if (alpha != 1.f) ScaleRow(o, o, alpha, d);
}
#elif ICE_SIMD_NEON
// The NEON forms: 32 q registers hold a 4-row x 16-column tile (16 accumulators, 4 operand
// vectors, the broadcasts), so the 64-key / 64-column tiles are four 16-wide strips as on AVX2.

// S[r0..r0+R) = Q[r0..] · Kt for R <= 4 rows.
template <int R>
inline void ScoreRows(const float* q, int d, const float* kt, float* s) {
  for (int c0 = 0; c0 < kKeyBlock; c0 += 16) {
    float32x4_t acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = vdupq_n_f32(0.f);
    for (int e = 0; e < d; ++e) {
      const float* kr = kt + static_cast<size_t>(e) * kKeyBlock + c0;
      float32x4_t kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = vld1q_f32(kr + 4 * c);
      for (int r = 0; r < R; ++r) {
        const float32x4_t qe = vld1q_dup_f32(q + static_cast<size_t>(r) * d + e);
        for (int c = 0; c < 4; ++c) acc[r][c] = vfmaq_f32(acc[r][c], qe, kv[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) vst1q_f32(s + static_cast<size_t>(r) * kKeyBlock + c0 + 4 * c, acc[r][c]);
  }
}

// O[r0..r0+R)[c0..c0+16) += P[r0..] · V[block][c0..c0+16) for R <= 4 rows, nk keys.
template <int R>
inline void AccumulateRows16(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = vld1q_f32(o + static_cast<size_t>(r) * d + c0 + 4 * c);
  for (int j = 0; j < nk; ++j) {
    float32x4_t vv[4];
    for (int c = 0; c < 4; ++c) vv[c] = vld1q_f32(v + j * v_stride + c0 + 4 * c);
    for (int r = 0; r < R; ++r) {
      const float32x4_t pj = vld1q_dup_f32(s + static_cast<size_t>(r) * kKeyBlock + j);
      for (int c = 0; c < 4; ++c) acc[r][c] = vfmaq_f32(acc[r][c], pj, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) vst1q_f32(o + static_cast<size_t>(r) * d + c0 + 4 * c, acc[r][c]);
}

template <int R>
inline void AccumulateRows(const float* s, const float* v, size_t v_stride, int nk, float* o, int d, int c0) {
  for (int c = c0; c < c0 + 64; c += 16) AccumulateRows16<R>(s, v, v_stride, nk, o, d, c);
}

inline void ScaleRow(float* dst, const float* src, float a, int d) {
  const float32x4_t av = vdupq_n_f32(a);
  for (int e = 0; e < d; e += 4) vst1q_f32(dst + e, vmulq_f32(vld1q_f32(src + e), av));
}

inline void SoftmaxRow(float* s, int visible, float& m, float& l, float* o, int d) {
  const int32x4_t lane = {0, 1, 2, 3};
  const float32x4_t neg_inf = vdupq_n_f32(kNegInf);
  constexpr int kVecs = kKeyBlock / 4;
  uint32x4_t keep[kVecs];
  float32x4_t sv[kVecs];
  float32x4_t mx = neg_inf;
  for (int c = 0; c < kVecs; ++c) {
    keep[c] = vcgtq_s32(vdupq_n_s32(visible - 4 * c), lane);
    sv[c] = vbslq_f32(keep[c], vld1q_f32(s + 4 * c), neg_inf);
    mx = vmaxq_f32(mx, sv[c]);
  }
  const float m_new = std::max(m, vmaxvq_f32(mx));
  if (m_new == kNegInf) {
    for (int c = 0; c < kVecs; ++c) vst1q_f32(s + 4 * c, vdupq_n_f32(0.f));
    return;
  }
  const float32x4_t mv = vdupq_n_f32(m_new);
  float32x4_t sum = vdupq_n_f32(0.f);
  for (int c = 0; c < kVecs; ++c) {
    const float32x4_t e = vreinterpretq_f32_u32(
        vandq_u32(keep[c], vreinterpretq_u32_f32(ExpNonPositive4(vsubq_f32(sv[c], mv)))));
    vst1q_f32(s + 4 * c, e);
    sum = vaddq_f32(sum, e);
  }
  const float alpha = m == kNegInf ? 0.f : std::exp(m - m_new);
  l = l * alpha + vaddvq_f32(sum);
  m = m_new;
  if (alpha != 1.f) ScaleRow(o, o, alpha, d);
}
#endif

#if ICE_PREFILL_TILED
// Rows per register tile: 6 on the avx2 target (6 x 16 columns = 12 ymm accumulators, enough
// independent FMA chains to cover the FMA latency; 4 rows left only 8 and ran the two products at
// about half of the FMA peak), 4 elsewhere (16 zmm / q accumulators).
#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
constexpr int kStripRows = 6;
#else
constexpr int kStripRows = 4;
#endif

// f.operator()<R>(r) on the tail strip of rest < kStripRows rows (R = rest, a compile-time value).
template <int R, typename F>
inline void TailStrip(int rest, int r, F& f) {
  if constexpr (R > 0) {
    if (rest == R) return f.template operator()<R>(r);
    TailStrip<R - 1>(rest, r, f);
  }
}

// f.operator()<R>(r) for strips of kStripRows rows, then the tail strip.
template <typename F>
inline void ForRowStrips(int rows, F&& f) {
  int r = 0;
  for (; r + kStripRows <= rows; r += kStripRows) f.template operator()<kStripRows>(r);
  TailStrip<kStripRows - 1>(rows - r, r, f);
}

// The key blocks of every kv head transposed once per call, into a GrowScratch buffer (each block
// serves every task of its head: ~q_len / 128 * group of them, which used to transpose it again each):
// kt[((kvh * blocks + b) * d + e) * kKeyBlock + jj] = dim e of key b * kKeyBlock + jj (zeros past
// kv_len). Filled in parallel by the calling team.
size_t KeyBlocks(const PrefillAttentionParams& p) { return (static_cast<size_t>(p.kv_len) + kKeyBlock - 1) / kKeyBlock; }

void TransposeKeyBlock(const PrefillAttentionParams& p, int kvh, size_t b, float* kt) {
  const int d = p.head_dim;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
  const int j0 = static_cast<int>(b) * kKeyBlock;
  const int nk = std::min(kKeyBlock, p.kv_len - j0);
  const float* kbase = p.k + static_cast<size_t>(kvh) * d;
  for (int jj = 0; jj < kKeyBlock; ++jj) {
    if (jj < nk) {
      const float* kr = kbase + static_cast<size_t>(j0 + jj) * kv_stride;
      for (int e = 0; e < d; ++e) kt[static_cast<size_t>(e) * kKeyBlock + jj] = kr[e];
    } else {
      for (int e = 0; e < d; ++e) kt[static_cast<size_t>(e) * kKeyBlock + jj] = 0.f;
    }
  }
}

// One task: kv head kvh, query positions [i0, i1); kt_head: the head's transposed key blocks.
void PrefillTask(const PrefillAttentionParams& p, int kvh, int i0, int i1, const float* kt_head, Tile& t) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int offset = p.kv_len - p.q_len;
  const size_t q_stride = static_cast<size_t>(p.num_q_heads) * d;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
  const int rows = (i1 - i0) * group;
  t.q.resize(static_cast<size_t>(rows) * d);
  t.o.assign(static_cast<size_t>(rows) * d, 0.f);
  t.s.resize(static_cast<size_t>(rows) * kKeyBlock);
  t.m.assign(rows, kNegInf);
  t.l.assign(rows, 0.f);
  t.limit.resize(rows);
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r / group, h = kvh * group + r % group;
    const float* src = p.q + static_cast<size_t>(i) * q_stride + static_cast<size_t>(h) * d;
    ScaleRow(&t.q[static_cast<size_t>(r) * d], src, p.scale, d);
    t.limit[r] = i + offset;
  }
  const int last_key = i1 - 1 + offset;  // the task's last visible key
  const int first_full_limit = i0 + offset;  // every row sees keys <= this
  const float* vbase = p.v + static_cast<size_t>(kvh) * d;
  for (int j0 = 0; j0 <= last_key; j0 += kKeyBlock) {
    // Keys past nk score against the block's zero padding (or later keys) and get probability 0.
    const int nk = std::min(kKeyBlock, last_key + 1 - j0);
    const float* kt = kt_head + static_cast<size_t>(j0 / kKeyBlock) * d * kKeyBlock;
    ForRowStrips(rows, [&]<int R>(int r) { ScoreRows<R>(&t.q[static_cast<size_t>(r) * d], d, kt, &t.s[static_cast<size_t>(r) * kKeyBlock]); });
    const bool masked = j0 + kKeyBlock - 1 > first_full_limit;
    for (int r = 0; r < rows; ++r) {
      // Keys past nk, or past this row's causal limit, get probability 0.
      const int visible = masked ? std::clamp(t.limit[r] - j0 + 1, 0, nk) : nk;
      SoftmaxRow(&t.s[static_cast<size_t>(r) * kKeyBlock], visible, t.m[r], t.l[r], &t.o[static_cast<size_t>(r) * d], d);
    }
    const float* vb = vbase + static_cast<size_t>(j0) * kv_stride;
    int c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
      ForRowStrips(rows, [&]<int R>(int r) {
        AccumulateRows<R>(&t.s[static_cast<size_t>(r) * kKeyBlock], vb, kv_stride, nk, &t.o[static_cast<size_t>(r) * d], d, c0);
      });
    }
    for (; c0 < d; c0 += 16) {
      ForRowStrips(rows, [&]<int R>(int r) {
        AccumulateRows16<R>(&t.s[static_cast<size_t>(r) * kKeyBlock], vb, kv_stride, nk, &t.o[static_cast<size_t>(r) * d], d, c0);
      });
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r / group, h = kvh * group + r % group;
    float* dst = p.out + static_cast<size_t>(i) * q_stride + static_cast<size_t>(h) * d;
    ScaleRow(dst, &t.o[static_cast<size_t>(r) * d], t.l[r] > 0.f ? 1.f / t.l[r] : 0.f, d);
  }
}
#endif

#if ICE_SIMD_AVX512
// ---- AMX form (p.bf16, AmxActive, head_dim % 32 == 0, <= 256) ----------------------------------
// K and V of every kv head are first rounded to bf16 and packed as B tiles (amx.h) for the whole
// key range, in parallel; then each task (kv head, block of positions, as above) runs its rows in
// groups of 32 (two A tiles) over blocks of kAmxKeys keys: S = Q·Kᵀ in 2 x 2 C tiles (32 rows x 32
// keys, head_dim / 32 steps), the online-softmax step on S in zmm registers writing P as bf16,
// then O += P·V with O's 32 x 32 blocks loaded into C tiles, kAmxKeys / 32 steps, and stored back.
constexpr int kAmxKeys = 128;  // keys per online-softmax step
constexpr int kAmxGroup = 32;  // rows per 2 x 2 tile block

struct AmxPacked {
  const uint32_t* kt;  // kv head base: tile (key block kb of 16, dim chunk kc of 32) at (kb * d/32 + kc) * 256
  const uint32_t* vt;  // kv head base: tile (key step ks of 32, dim block db of 16) at (ks * d/16 + db) * 256
};

// Packs keys [kb * 16, +16) of kv head kvh (zeros past kv_len): kt row r, column c = the bf16
// pair (dims kc*32 + 2r, +1) of key kb*16 + c.
void AmxPackKeys(const PrefillAttentionParams& p, int kvh, int kb, uint32_t* kt) {
  const int d = p.head_dim;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
  for (int kc = 0; kc < d / 32; ++kc) {
    __m512i rows[16];
    for (int c = 0; c < 16; ++c) {
      const int key = kb * 16 + c;
      if (key < p.kv_len) {
        const float* x = p.k + key * kv_stride + static_cast<size_t>(kvh) * d + kc * 32;
        rows[c] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
      } else {
        rows[c] = _mm512_setzero_si512();
      }
    }
    Transpose16x16(rows);
    uint32_t* out = kt + (static_cast<size_t>(kb) * (d / 32) + kc) * 256;
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(out + r * 16, rows[r]);
  }
}

// bf16 bits of 16 floats in the low halves of 32-bit lanes.
inline __m512i Bf16Lanes(const float* x) {
  return _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x))));
}

// Packs keys [ks * 32, +32) of kv head kvh's values (zeros past kv_len): vt row r, column c = the
// bf16 pair (key ks*32 + 2r, +1) at dim db*16 + c.
void AmxPackValues(const PrefillAttentionParams& p, int kvh, int ks, uint32_t* vt) {
  const int d = p.head_dim;
  const size_t kv_stride = static_cast<size_t>(p.num_kv_heads) * d;
  const float* base = p.v + static_cast<size_t>(kvh) * d;
  for (int db = 0; db < d / 16; ++db) {
    uint32_t* out = vt + (static_cast<size_t>(ks) * (d / 16) + db) * 256;
    for (int r = 0; r < 16; ++r) {
      const int even = ks * 32 + 2 * r;
      const __m512i e = even < p.kv_len ? Bf16Lanes(base + even * kv_stride + db * 16) : _mm512_setzero_si512();
      const __m512i o = even + 1 < p.kv_len ? Bf16Lanes(base + (even + 1) * kv_stride + db * 16) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + r * 16, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
    }
  }
}

// One row's online-softmax step over keys [0, n32) of a block (n32 % 16 == 0): s scores, keys at
// and past `visible` get probability 0; P written to pb as bf16; m, l updated, o [d] rescaled.
inline void AmxSoftmaxRow(const float* s, int n32, int visible, float& m, float& l, uint16_t* pb, float* o, int d) {
  auto mask_of = [&](int c) -> __mmask16 {
    const int left = visible - 16 * c;
    return left >= 16 ? __mmask16{0xFFFF} : left <= 0 ? __mmask16{0} : static_cast<__mmask16>((1u << left) - 1u);
  };
  __m512 mx = _mm512_set1_ps(kNegInf);
  for (int c = 0; c < n32 / 16; ++c) mx = _mm512_mask_max_ps(mx, mask_of(c), mx, _mm512_loadu_ps(s + 16 * c));
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  if (m_new == kNegInf) {  // nothing visible yet in this row
    for (int c = 0; c < n32 / 16; ++c) _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + 16 * c), _mm256_setzero_si256());
    return;
  }
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int c = 0; c < n32 / 16; ++c) {
    const __m512 e = _mm512_maskz_mov_ps(mask_of(c), ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * c), mv)));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + 16 * c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  }
  const float alpha = m == kNegInf ? 0.f : std::exp(m - m_new);
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = m_new;
  if (alpha != 1.f) ScaleRow(o, o, alpha, d);
}

// Working memory of one AMX task, reused across tasks of a thread.
struct AmxTile {
  std::vector<uint16_t> q;  // [rows padded to 32, d] bf16 of q * scale
  std::vector<float> o;     // [rows padded to 32, d] unnormalised
  std::vector<float> m, l;  // [rows padded]
  std::vector<int> limit;   // [rows padded] last visible key (-1 for padding rows)
  alignas(64) float s[kAmxGroup * kAmxKeys];
  alignas(64) uint16_t pb[kAmxGroup * kAmxKeys];
};

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

// S[32][kAmxKeys] (columns [0, n32)) = Q rows q (32 rows, d apart) · the keys of blocks kb0...
inline void AmxScores(const uint16_t* q, int d, const uint32_t* kt, int kb0, int n32, float* s) {
  const int dc = d / 32;
  for (int jb = 0; jb < n32; jb += 32) {
    AmxZero2x2();
    const uint32_t* b0 = kt + static_cast<size_t>(kb0 + jb / 16) * dc * 256;
    for (int kc = 0; kc < dc; ++kc)
      AmxStep2x2(q + kc * 32, q + 16 * d + kc * 32, d * 2, b0 + kc * 256, b0 + (dc + kc) * 256);
    AmxStore2x2(s + jb, kAmxKeys);
  }
}

// O[32][d] += P[32][n32] · V of key steps ks0.. (n32 / 32 of them).
inline void AmxAccumulate(const uint16_t* pb, const uint32_t* vt, int ks0, int n32, float* o, int d) {
  const int dbn = d / 16;
  for (int dp = 0; dp < d; dp += 32) {
    AmxLoad2x2(o + dp, d);
    for (int ks = 0; ks < n32 / 32; ++ks) {
      const uint32_t* b = vt + (static_cast<size_t>(ks0 + ks) * dbn + dp / 16) * 256;
      AmxStep2x2(pb + ks * 32, pb + 16 * kAmxKeys + ks * 32, kAmxKeys * 2, b, b + 256);
    }
    AmxStore2x2(o + dp, d);
  }
}

// One task on AMX tiles: kv head kvh, query positions [i0, i1).
void AmxPrefillTask(const PrefillAttentionParams& p, const AmxPacked& kv, int kvh, int i0, int i1, AmxTile& t) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int offset = p.kv_len - p.q_len;
  const size_t q_stride = static_cast<size_t>(p.num_q_heads) * d;
  const int rows = (i1 - i0) * group;
  const int padded = (rows + kAmxGroup - 1) / kAmxGroup * kAmxGroup;
  t.q.resize(static_cast<size_t>(padded) * d);
  t.o.assign(static_cast<size_t>(padded) * d, 0.f);
  t.m.assign(padded, kNegInf);
  t.l.assign(padded, 0.f);
  t.limit.assign(padded, -1);
  const __m512 scale = _mm512_set1_ps(p.scale);
  for (int r = 0; r < padded; ++r) {
    uint16_t* dst = &t.q[static_cast<size_t>(r) * d];
    if (r >= rows) {
      std::fill(dst, dst + d, uint16_t{0});
      continue;
    }
    const int i = i0 + r / group, h = kvh * group + r % group;
    const float* src = p.q + static_cast<size_t>(i) * q_stride + static_cast<size_t>(h) * d;
    for (int e = 0; e < d; e += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + e),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src + e), scale))));
    t.limit[r] = i + offset;
  }
  for (int r0 = 0; r0 < rows; r0 += kAmxGroup) {
    const int last_key = t.limit[std::min(r0 + kAmxGroup, rows) - 1];  // rows are in position order
    const uint16_t* q = &t.q[static_cast<size_t>(r0) * d];
    float* o = &t.o[static_cast<size_t>(r0) * d];
    for (int j0 = 0; j0 <= last_key; j0 += kAmxKeys) {
      const int nk = std::min(kAmxKeys, last_key + 1 - j0);
      const int n32 = (nk + 31) / 32 * 32;
      AmxScores(q, d, kv.kt, j0 / 16, n32, t.s);
      for (int rr = 0; rr < kAmxGroup; ++rr) {
        const int r = r0 + rr;
        const int visible = std::clamp(t.limit[r] - j0 + 1, 0, nk);
        AmxSoftmaxRow(t.s + rr * kAmxKeys, n32, visible, t.m[r], t.l[r], t.pb + rr * kAmxKeys,
                      o + static_cast<size_t>(rr) * d, d);
      }
      AmxAccumulate(t.pb, kv.vt, j0 / 32, n32, o, d);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r / group, h = kvh * group + r % group;
    float* dst = p.out + static_cast<size_t>(i) * q_stride + static_cast<size_t>(h) * d;
    ScaleRow(dst, &t.o[static_cast<size_t>(r) * d], t.l[r] > 0.f ? 1.f / t.l[r] : 0.f, d);
  }
}

// The whole op on AMX tiles (tasks as in PrefillAttention below).
void AmxPrefillAttention(const PrefillAttentionParams& p, int positions_per_task) {
  const int d = p.head_dim;
  const int padded_keys = (p.kv_len + 31) / 32 * 32;
  const size_t per_head = static_cast<size_t>(padded_keys) * d / 2;  // uint32 words of K (and of V)
  static thread_local std::vector<uint32_t> packed;
  uint32_t* kt = GrowScratch(packed, 2 * per_head * p.num_kv_heads);
  uint32_t* vt = kt + per_head * p.num_kv_heads;
  const int key_steps = padded_keys / 32;
  const int blocks = (p.q_len + positions_per_task - 1) / positions_per_task;
  const int tasks = blocks * p.num_kv_heads;
#pragma omp parallel num_threads(CpuThreads())
  {
#pragma omp for schedule(static)
    for (int item = 0; item < key_steps * p.num_kv_heads; ++item) {
      const int kvh = item / key_steps, ks = item % key_steps;
      AmxPackKeys(p, kvh, 2 * ks, kt + kvh * per_head);
      AmxPackKeys(p, kvh, 2 * ks + 1, kt + kvh * per_head);
      AmxPackValues(p, kvh, ks, vt + kvh * per_head);
    }
    const AmxTileConfig config;
    _tile_loadconfig(&config);
    static thread_local AmxTile tile;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int block = blocks - 1 - task / p.num_kv_heads;
      const int kvh = task % p.num_kv_heads;
      const int i0 = block * positions_per_task, i1 = std::min(p.q_len, i0 + positions_per_task);
      AmxPrefillTask(p, {kt + kvh * per_head, vt + kvh * per_head}, kvh, i0, i1, tile);
    }
    _tile_release();
  }
  ReleaseLargeScratch(packed);
}

#pragma GCC pop_options
#endif

}  // namespace

Status PrefillAttention(const PrefillAttentionParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  // About 128 rows (positions x group heads) per task: each K/V block a task reads serves that
  // many rows (measured while every task still transposed its own key blocks: 64 rows 15 % slower,
  // 256 rows 5 % faster but with fewer tasks to balance). Tasks with the most keys go first.
  const int positions_per_task = std::max(1, 128 / group);
  const int blocks = (p.q_len + positions_per_task - 1) / positions_per_task;
  const int tasks = blocks * p.num_kv_heads;
#if ICE_SIMD_AVX512
  if (PrefillAttentionOnAmx(p)) {
    AmxPrefillAttention(p, positions_per_task);
    return Status::Ok();
  }
#endif
#if ICE_PREFILL_TILED
  const bool vec = p.head_dim % 16 == 0;
  const size_t key_blocks = vec ? KeyBlocks(p) : 0;
  const size_t block_elems = static_cast<size_t>(p.head_dim) * kKeyBlock;
  static thread_local std::vector<float> kt_buf;
  float* const kt = GrowScratch(kt_buf, static_cast<size_t>(p.num_kv_heads) * key_blocks * block_elems);
#else
  const bool vec = false;
#endif
#pragma omp parallel num_threads(CpuThreads())
  {
#if ICE_PREFILL_TILED
    Tile tile;
    if (vec) {
#pragma omp for schedule(static)
      for (size_t hb = 0; hb < static_cast<size_t>(p.num_kv_heads) * key_blocks; ++hb) {
        TransposeKeyBlock(p, static_cast<int>(hb / key_blocks), hb % key_blocks, kt + hb * block_elems);
      }
    }
#endif
    std::vector<float> sc;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int block = blocks - 1 - task / p.num_kv_heads;
      const int kvh = task % p.num_kv_heads;
      const int i0 = block * positions_per_task, i1 = std::min(p.q_len, i0 + positions_per_task);
#if ICE_PREFILL_TILED
      if (vec) {
        PrefillTask(p, kvh, i0, i1, kt + static_cast<size_t>(kvh) * key_blocks * block_elems, tile);
        continue;
      }
#endif
      PrefillRowsScalar(p, kvh, i0, i1, sc);
    }
  }
#if ICE_PREFILL_TILED
  ReleaseLargeScratch(kt_buf);
#endif
  (void)vec;
  return Status::Ok();
}

Status PrefillAttentionRowwise(const PrefillAttentionParams& p) {
#pragma omp parallel num_threads(CpuThreads())
  {
    std::vector<float> sc;
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int i = 0; i < p.q_len; ++i)
      for (int kvh = 0; kvh < p.num_kv_heads; ++kvh) PrefillRowsScalar(p, kvh, i, i + 1, sc);
  }
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
