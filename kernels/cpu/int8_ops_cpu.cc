// The IceCache store's int8 kernels (contracts: kvstore/vector_ops.h, which dispatches to the
// active SIMD target's copy of this file): the quantisers of keys and rows, the exact int8
// parent search of the DCI-tree build (ArgmaxDotI8) and the int8 scoring of a query's upper
// levels (ScoreRowsI8). Every target computes the same integers (vpdpbusd on avx512; on avx2
// vpdpbusd on ymm where the CPU has AVX-VNNI (kernels/simd_target.h), else vpmaddubsw on the
// parent search's 6-bit keys and vpmaddwd on int16-widened bytes for the 8-bit queries; vmull_s8 +
// vpadalq_s16 or sdot on neon; plain loops on scalar).
#include <climits>

#if defined(__aarch64__)
#include <sys/auxv.h>  // getauxval: the dotprod probe
#endif

#include "kernels/simd_target.h"  // AvxVnniActive
#include "kernels/cpu/simd.h"     // last: switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {
namespace {

// kI8ExtraQuads of kvstore/vector_ops.h: the words of the MIPS extra coordinate.
constexpr int kI8ExtraQuads = 1;
// kI8MaxQuads of kvstore/vector_ops.h.
constexpr int kI8MaxQuadsKernel = 256;

}  // namespace

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
#elif ICE_SIMD_NEON
  // maxnm: a NaN lane is ignored, as std::max(mx, NaN) ignores it below.
  float32x4_t m = vdupq_n_f32(0.f);
  for (; j + 4 <= n; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(v + j)));
  mx = vmaxnmvq_f32(m);
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

#if ICE_SIMD_NEON
// round(v * inv) per lane (vcvtnq: nearest, ties to even, as nearbyint), clamped to [-127, 127]
// as the scalar form clamps.
inline int32x4_t RoundClampI8x4(float32x4_t v, float32x4_t inv) {
  return vmaxq_s32(vminq_s32(vcvtnq_s32_f32(vmulq_f32(v, inv)), vdupq_n_s32(127)), vdupq_n_s32(-127));
}

// Lanes of a and b (each in [-127, 127]) as 8 bytes.
inline int8x8_t NarrowI8x8(int32x4_t a, int32x4_t b) { return vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))); }
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
#elif ICE_SIMD_NEON
  const float32x4_t vi = vdupq_n_f32(inv);
  for (; j + 8 <= n; j += 8) vst1_s8(q + j, NarrowI8x8(RoundClampI8x4(vld1q_f32(v + j), vi), RoundClampI8x4(vld1q_f32(v + j + 4), vi)));
#endif
  for (; j < n; ++j) q[j] = static_cast<int8_t>(std::clamp(std::nearbyint(v[j] * inv), -127.f, 127.f));
}

#if ICE_SIMD_AVX2
// The AVX2 int8 dot of 8-bit queries (ScoreRowsI8; no vpdpbusd, and vpmaddubsw would saturate at
// int16, 2 * 255 * 127 > 32767; the parent search's 6-bit keys take vpmaddubsw): a row
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

// The AVX2 parent search's running best of one key over a strip of 16 rows (two vectors of 8
// lanes), kept as the AVX-512 kernel keeps it: per lane dot * 128 + (127 - strip in the chunk), so
// a max picks the larger dot and, on ties, the earlier strip. Lanes of rows at or past nr (the
// strip's valid lanes: v0, v1) never count.
inline void KeepBest16(__m256i (&bk)[2], __m256i acc0, __m256i acc1, __m256i v0, __m256i v1, __m256i c) {
  const __m256i int_min = _mm256_set1_epi32(INT32_MIN);
  bk[0] = _mm256_max_epi32(bk[0], _mm256_blendv_epi8(int_min, _mm256_add_epi32(_mm256_slli_epi32(acc0, 7), c), v0));
  bk[1] = _mm256_max_epi32(bk[1], _mm256_blendv_epi8(int_min, _mm256_add_epi32(_mm256_slli_epi32(acc1, 7), c), v1));
}

// The valid lanes of strip b (rows b * 16 ..) for nr rows, as KeepBest16 takes them.
inline void StripLanes16(int nr, int b, __m256i* v0, __m256i* v1) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i rem = _mm256_set1_epi32(nr - b * 16);
  *v0 = _mm256_cmpgt_epi32(rem, lane);
  *v1 = _mm256_cmpgt_epi32(rem, _mm256_add_epi32(lane, _mm256_set1_epi32(8)));
}

// A chunk's best (from strip c0 on) into the key's (best_dot, best_row) when its dot is larger:
// the largest lane; among lanes holding it, the lowest (same strip, same dot).
inline void TakeChunkBest16(const __m256i (&bk)[2], int c0, int32_t* best_dot, int32_t* best_row) {
  __m256i mv = _mm256_max_epi32(bk[0], bk[1]);
  mv = _mm256_max_epi32(mv, _mm256_permute2x128_si256(mv, mv, 1));
  mv = _mm256_max_epi32(mv, _mm256_shuffle_epi32(mv, 0x4e));
  mv = _mm256_max_epi32(mv, _mm256_shuffle_epi32(mv, 0xb1));
  const int32_t m = _mm256_cvtsi256_si32(mv);
  const uint32_t eq = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(bk[0], mv)))) |
                      static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(bk[1], mv)))) << 8;
  const int32_t dot = m >> 7;  // arithmetic: the low 7 bits hold 127 - strip
  if (dot > *best_dot) {
    *best_dot = dot;
    *best_row = (c0 + 127 - (m & 127)) * 16 + __builtin_ctz(eq);
  }
}

// The avx2 parent search's scan, for both forms of its dots: kT keys per pass (a ragged last pass
// repeats the last key) against strips of 16 rows, in chunks of 128 strips, with the best-keeping
// of KeepBest16 / TakeChunkBest16. prepare(t, src) readies key src as the pass's t-th; strip(b,
// acc) adds strip b's dots to acc[t][0] (rows 0-7) and acc[t][1] (rows 8-15), which start at
// -128 * the key's byte sum (removing the rows' +128 offset). Inlined into each form.
// Keys per pass of each form: as many as its accumulators and operands leave ymm registers for.
constexpr int kArgmaxKeysVnni = 6, kArgmaxKeysMaddubs = 5;
template <int kT, typename Prepare, typename StripDots>
__attribute__((always_inline)) inline void ArgmaxStrips16(const int32_t* x_sum, int nx, int nr, Prepare&& prepare,
                                                          StripDots&& strip, int32_t* best) {
  const int ns = (nr + 15) / 16;
  for (int i = 0; i < nx; i += kT) {
    __m256i init[kT];
    int32_t best_dot[kT], best_row[kT];
    for (int t = 0; t < kT; ++t) {
      const int src = std::min(i + t, nx - 1);
      prepare(t, src);
      init[t] = _mm256_set1_epi32(-128 * x_sum[src]);
      best_dot[t] = INT32_MIN;
      best_row[t] = 0;
    }
    for (int c0 = 0; c0 < ns; c0 += 128) {
      const int c1 = std::min(ns, c0 + 128);
      __m256i bk[kT][2];
      for (int t = 0; t < kT; ++t) bk[t][0] = bk[t][1] = _mm256_set1_epi32(INT32_MIN);
      for (int b = c0; b < c1; ++b) {
        __m256i acc[kT][2];
        for (int t = 0; t < kT; ++t) acc[t][0] = acc[t][1] = init[t];
        strip(b, acc);
        __m256i v0, v1;
        StripLanes16(nr, b, &v0, &v1);
        const __m256i c = _mm256_set1_epi32(127 - (b - c0));
        for (int t = 0; t < kT; ++t) KeepBest16(bk[t], acc[t][0], acc[t][1], v0, v1, c);
      }
      for (int t = 0; t < kT; ++t) TakeChunkBest16(bk[t], c0, &best_dot[t], &best_row[t]);
    }
    for (int t = 0; t < kT && i + t < nx; ++t) best[i + t] = best_row[t];
  }
}
#endif

#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
// The AVX-VNNI forms of the avx2 target's int8 kernels (used where AvxVnniActive()): one
// vpdpbusd (four u8 row bytes x s8 key bytes into an int32 lane, exact) per 8 rows, key word and
// quad, where the plain avx2 forms take 2-4 integer ops (vpmaddubsw or vpmaddwd, adds). The same
// integers as those forms and the scalar loops. Compiled for AVX-VNNI on
// top of the avx2 target's ISA, so the helpers above inline into them.
#define ICE_AVX_VNNI_FN __attribute__((target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avxvnni")))

// ArgmaxDotI8 on ArgmaxStrips16: the key words as they are, the strip's row words as they are.
ICE_AVX_VNNI_FN void ArgmaxDotI8AvxVnni(const uint32_t* x, const int32_t* x_sum, int nx, const uint32_t* rows_t,
                                        int ld, int nr, int quads, int32_t* best) {
  const uint32_t* xs[kArgmaxKeysVnni];
  ArgmaxStrips16<kArgmaxKeysVnni>(
      x_sum, nx, nr, [&](int t, int src) { xs[t] = x + static_cast<size_t>(src) * quads; },
      [&](int b, __m256i (&acc)[kArgmaxKeysVnni][2]) ICE_AVX_VNNI_FN {
        const uint32_t* r = rows_t + static_cast<size_t>(b) * 16;
        for (int j = 0; j < quads; ++j, r += ld) {
          const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
          const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 8));
          for (int t = 0; t < kArgmaxKeysVnni; ++t) {
            const __m256i u = _mm256_set1_epi32(static_cast<int>(xs[t][j]));
            acc[t][0] = _mm256_dpbusd_avx_epi32(acc[t][0], r0, u);
            acc[t][1] = _mm256_dpbusd_avx_epi32(acc[t][1], r1, u);
          }
        }
      },
      best);
}

// ScoreRowsI8's dots of 16 rows (word j of row c at rw[j * 32 + c]) with nh <= 4 queries (word j
// of query h at q[h][j]), added to acc[h][0] (rows 0-7) and acc[h][1] (rows 8-15).
ICE_AVX_VNNI_FN void DotRows16AvxVnni(const uint32_t* rw, int quads, const uint32_t* const* q, int nh,
                                      __m256i (*acc)[2]) {
  __m256i a[4][2];
  for (int h = 0; h < nh; ++h) a[h][0] = acc[h][0], a[h][1] = acc[h][1];
  for (int j = 0; j < quads; ++j, rw += 32) {
    const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rw));
    const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rw + 8));
    for (int h = 0; h < nh; ++h) {
      const __m256i u = _mm256_set1_epi32(static_cast<int>(q[h][j]));
      a[h][0] = _mm256_dpbusd_avx_epi32(a[h][0], r0, u);
      a[h][1] = _mm256_dpbusd_avx_epi32(a[h][1], r1, u);
    }
  }
  for (int h = 0; h < nh; ++h) acc[h][0] = a[h][0], acc[h][1] = a[h][1];
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

int32_t QuantizeKeyI8(const float* key, int dim, float extra, uint32_t* dst, float* scale, int key_max) {
  const int dq = (dim + 3) / 4;
  const float mx = std::max(MaxAbs(key, dim), extra);
  const float km = static_cast<float>(key_max);
  const float inv = mx > 0.f ? km / mx : 0.f;
  if (scale != nullptr) *scale = mx / km;
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
#elif ICE_SIMD_NEON
  const float32x4_t vi = vdupq_n_f32(inv);
  int32x4_t acc = vdupq_n_s32(0);
  for (; j + 8 <= dim; j += 8) {
    const int32x4_t v0 = RoundClampI8x4(vld1q_f32(key + j), vi), v1 = RoundClampI8x4(vld1q_f32(key + j + 4), vi);
    acc = vaddq_s32(acc, vaddq_s32(v0, v1));
    vst1_s8(b + j, NarrowI8x8(v0, v1));
  }
  sum = vaddvq_s32(acc);
#endif
  RoundToI8(key + j, dim - j, inv, b + j);
  for (; j < dim; ++j) sum += b[j];
  const int t = static_cast<int>(std::clamp(std::nearbyint(extra * inv), 0.f, km));
  dst[dq] = Word(t, t, t, t);
  return sum + 4 * t;
}

namespace {

#if ICE_SIMD_NEON
// The NEON int8 dots, exact whatever the bytes: a row byte (value + 128) XOR 0x80 is the value as
// s8, so both forms multiply s8 by s8 (no key byte sum needed):
//  * baseline Advanced SIMD: vmull_s8 gives the products as int16 (|p| <= 128 * 128 = 16384)
//    and vpadalq_s16 adds them pairwise into int32 lanes;
//  * Armv8.2 dotprod (sdot: four s8 products into one int32 lane), where the CPU reports it
//    (HWCAP_ASIMDDP: Graviton 2+, Grace, Apple M1+): a quarter of the instructions.
// A strip function computes the dots of kI8Keys keys (word pointers xs[t], one word per quad)
// with the strip's rows (word j of row c at r + j * ld + c): d[t][v] lane l = row 4 v + l.
constexpr int kI8Keys = 4;

inline int8x16_t RowValuesS8(const uint32_t* w) {
  return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(w)), vdupq_n_u8(0x80)));
}

inline int8x16_t KeyWordS8(uint32_t w) { return vreinterpretq_s8_u32(vdupq_n_u32(w)); }

// 8 rows (two q registers of row words), 16 accumulators: for four row words and a key word,
// acc_lo lanes hold rows 0, 0, 1, 1 (two bytes each), acc_hi rows 2, 2, 3, 3; vpaddq_s32 of the
// two then holds rows 0..3.
constexpr int kMullStripRows = 8;
inline void MullStrip(const uint32_t* const* xs, const uint32_t* r, int ld, int quads, int32x4_t (&d)[kI8Keys][4]) {
  int32x4_t acc[kI8Keys][4];
  for (int t = 0; t < kI8Keys; ++t)
    for (int c = 0; c < 4; ++c) acc[t][c] = vdupq_n_s32(0);
  for (int j = 0; j < quads; ++j, r += ld) {
    const int8x16_t r0 = RowValuesS8(r), r1 = RowValuesS8(r + 4);
    for (int t = 0; t < kI8Keys; ++t) {
      const int8x16_t k = KeyWordS8(xs[t][j]);
      acc[t][0] = vpadalq_s16(acc[t][0], vmull_s8(vget_low_s8(r0), vget_low_s8(k)));
      acc[t][1] = vpadalq_s16(acc[t][1], vmull_high_s8(r0, k));
      acc[t][2] = vpadalq_s16(acc[t][2], vmull_s8(vget_low_s8(r1), vget_low_s8(k)));
      acc[t][3] = vpadalq_s16(acc[t][3], vmull_high_s8(r1, k));
    }
  }
  for (int t = 0; t < kI8Keys; ++t) {
    d[t][0] = vpaddq_s32(acc[t][0], acc[t][1]);
    d[t][1] = vpaddq_s32(acc[t][2], acc[t][3]);
  }
}

// 16 rows (four q registers), one sdot per register and key: lanes are rows. Called only when
// the CPU has dotprod (HasDotProd). Compiled for Armv8.2 + dotprod unless the build's -march
// already has it (GCC 12 rejects "+dotprod" alone for the intrinsic; dotprod exists only from
// Armv8.2 on). With a -march above that (e.g. armv9-a, ICECACHE_NATIVE on Grace) the attribute
// would lower the function's target and keep the helpers above from being inlined into it.
#if defined(__ARM_FEATURE_DOTPROD)
#define ICE_DOTPROD_FN
#else
#define ICE_DOTPROD_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
constexpr int kSdotStripRows = 16;
ICE_DOTPROD_FN void SdotStrip(const uint32_t* const* xs, const uint32_t* r, int ld, int quads,
                              int32x4_t (&d)[kI8Keys][4]) {
  int32x4_t acc[kI8Keys][4];
  for (int t = 0; t < kI8Keys; ++t)
    for (int c = 0; c < 4; ++c) acc[t][c] = vdupq_n_s32(0);
  for (int j = 0; j < quads; ++j, r += ld) {
    int8x16_t rv[4];
    for (int c = 0; c < 4; ++c) rv[c] = RowValuesS8(r + 4 * c);
    for (int t = 0; t < kI8Keys; ++t) {
      const int8x16_t k = KeyWordS8(xs[t][j]);
      for (int c = 0; c < 4; ++c) acc[t][c] = vdotq_s32(acc[t][c], rv[c], k);
    }
  }
  for (int t = 0; t < kI8Keys; ++t)
    for (int c = 0; c < 4; ++c) d[t][c] = acc[t][c];
}

bool HasDotProd() {
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
}

// ArgmaxDotI8 on NEON with strips of kRows rows (inside the 32-row blocks that hold rows). The
// running best per lane is a (dot, row) pair, replaced only by a strictly larger dot, so each
// lane keeps its earliest row; at the end the largest dot, then the lowest row holding it (the
// scalar rule). A ragged tail of keys repeats the last key.
template <int kRows, typename Strip>
void ArgmaxDotI8Neon(const uint32_t* x, int nx, const uint32_t* rows_t, int ld, int nr, int quads, Strip&& strip,
                     int32_t* best) {
  constexpr int kT = kI8Keys, kV = kRows / 4;
  const int32x4_t lane = {0, 1, 2, 3};
  const int32x4_t rows_n = vdupq_n_s32(nr);
  for (int i = 0; i < nx; i += kT) {
    const uint32_t* xs[kT];
    for (int t = 0; t < kT; ++t) xs[t] = x + static_cast<size_t>(std::min(i + t, nx - 1)) * quads;
    int32x4_t bd[kT][kV], br[kT][kV];
    for (int t = 0; t < kT; ++t)
      for (int v = 0; v < kV; ++v) {
        bd[t][v] = vdupq_n_s32(INT32_MIN);
        br[t][v] = vdupq_n_s32(0);
      }
    for (int rb = 0; rb < nr; rb += kRows) {
      int32x4_t d[kT][4];
      strip(xs, rows_t + rb, ld, quads, d);
      for (int v = 0; v < kV; ++v) {
        const int32x4_t idx = vaddq_s32(lane, vdupq_n_s32(rb + 4 * v));
        const uint32x4_t valid = vcltq_s32(idx, rows_n);  // lanes past nr never count
        for (int t = 0; t < kT; ++t) {
          const uint32x4_t g = vandq_u32(vcgtq_s32(d[t][v], bd[t][v]), valid);
          bd[t][v] = vbslq_s32(g, d[t][v], bd[t][v]);
          br[t][v] = vbslq_s32(g, idx, br[t][v]);
        }
      }
    }
    for (int t = 0; t < kT && i + t < nx; ++t) {
      int32x4_t mx = bd[t][0];
      for (int v = 1; v < kV; ++v) mx = vmaxq_s32(mx, bd[t][v]);
      const int32x4_t mv = vdupq_n_s32(vmaxvq_s32(mx));
      int32x4_t m = vdupq_n_s32(INT32_MAX);
      for (int v = 0; v < kV; ++v) m = vminq_s32(m, vbslq_s32(vceqq_s32(bd[t][v], mv), br[t][v], m));
      best[i + t] = vminvq_s32(m);
    }
  }
}

// ScoreRowsI8's rows r0 .. r0 + cnt - 1 of one block (blk: [quads][32]) against nh <= 4 queries,
// kRows rows per strip.
template <int kRows, typename Strip>
void ScoreBlockI8Neon(const uint32_t* blk, const float* scale, int quads, int r0, int cnt, const uint32_t* const* qs,
                      const float* q_scale, int nh, float* out, size_t out_stride, Strip&& strip) {
  for (int s0 = 0; s0 < cnt; s0 += kRows) {
    int32x4_t d[kI8Keys][4];
    strip(qs, blk + s0, 32, quads, d);
    const int n = std::min(kRows, cnt - s0);
    float sc[kRows] = {};
    std::memcpy(sc, scale + r0 + s0, static_cast<size_t>(n) * sizeof(float));
    for (int h = 0; h < nh; ++h) {
      const float32x4_t qv = vdupq_n_f32(q_scale[h]);
      float o[kRows];
      for (int v = 0; v < kRows / 4; ++v)
        vst1q_f32(o + 4 * v, vmulq_f32(vcvtq_f32_s32(d[h][v]), vmulq_f32(qv, vld1q_f32(sc + 4 * v))));
      std::memcpy(out + h * out_stride + r0 + s0, o, static_cast<size_t>(n) * sizeof(float));
    }
  }
}
#endif

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
  if (AvxVnniActive()) {
    ArgmaxDotI8AvxVnni(x, x_sum, nx, rows_t, ld, nr, quads, best);
    return;
  }
  // The parent search's keys are 6-bit (bytes within +-kI8ParentKeyMax = 31, the contract of
  // kvstore/vector_ops.h), so a vpmaddubsw pair (u8 row byte x s8 key byte, two products) lies
  // within 2 * 255 * 31 = 15810 and the pairs of two quads add in int16 without overflow (31620 <=
  // 32767) before one vpmaddwd by ones widens them into the int32 lanes: per 8 rows and 2 quads,
  // 2 vpmaddubsw + vpaddw + vpmaddwd + vpaddd, where the exact form for 8-bit keys (the bytes
  // widened to int16 pairs, as ScoreRowsI8 below keeps them) takes 4 vpmaddwd + 4 vpaddd. Exact:
  // the same integers as every other form. Keys in the ArgmaxStrips16 scan.
  constexpr int kT = kArgmaxKeysMaddubs;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint32_t* xs[kT];
  ArgmaxStrips16<kT>(
      x_sum, nx, nr, [&](int t, int src) { xs[t] = x + static_cast<size_t>(src) * quads; },
      [&](int b, __m256i (&acc)[kT][2]) __attribute__((always_inline)) {
        const uint32_t* r = rows_t + static_cast<size_t>(b) * 16;
        auto widen_add = [&](__m256i a, __m256i pairs) { return _mm256_add_epi32(a, _mm256_madd_epi16(pairs, ones)); };
        int j = 0;
        for (; j + 2 <= quads; j += 2, r += 2 * ld) {
          const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
          const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 8));
          const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + ld));
          const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + ld + 8));
          for (int t = 0; t < kT; ++t) {
            const __m256i ua = _mm256_set1_epi32(static_cast<int>(xs[t][j]));
            const __m256i ub = _mm256_set1_epi32(static_cast<int>(xs[t][j + 1]));
            acc[t][0] = widen_add(acc[t][0], _mm256_add_epi16(_mm256_maddubs_epi16(a0, ua), _mm256_maddubs_epi16(b0, ub)));
            acc[t][1] = widen_add(acc[t][1], _mm256_add_epi16(_mm256_maddubs_epi16(a1, ua), _mm256_maddubs_epi16(b1, ub)));
          }
        }
        if (j < quads) {  // an odd last quad alone
          const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r));
          const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 8));
          for (int t = 0; t < kT; ++t) {
            const __m256i u = _mm256_set1_epi32(static_cast<int>(xs[t][j]));
            acc[t][0] = widen_add(acc[t][0], _mm256_maddubs_epi16(r0, u));
            acc[t][1] = widen_add(acc[t][1], _mm256_maddubs_epi16(r1, u));
          }
        }
      },
      best);
  i = nx;
#elif ICE_SIMD_NEON
  // 4 keys against 8 rows (vmull_s8) or 16 rows (sdot) per pass; x_sum is not needed (see
  // RowValuesS8).
  (void)x_sum;
  if (HasDotProd()) {
    ArgmaxDotI8Neon<kSdotStripRows>(x, nx, rows_t, ld, nr, quads, SdotStrip, best);
  } else {
    ArgmaxDotI8Neon<kMullStripRows>(x, nx, rows_t, ld, nr, quads, MullStrip, best);
  }
  i = nx;
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
#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
  const bool vnni = AvxVnniActive();
#endif
  for (int h0 = 0; h0 < nq; h0 += 4) {
    const int nh = std::min(4, nq - h0);
#if ICE_SIMD_AVX2 && !ICE_SIMD_AVX512
    // The queries' words split once for all blocks (AddDotPairs), or as they are for AVX-VNNI.
    int32_t kl[4][kI8MaxQuadsKernel], kh[4][kI8MaxQuadsKernel];
    const uint32_t* qrow[4];
    for (int h = 0; h < nh; ++h) qrow[h] = qw + static_cast<size_t>(h0 + h) * qstride;
    if (!vnni) {
      for (int h = 0; h < nh; ++h) SplitS8Words(qrow[h], quads, kl[h], kh[h]);
    }
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
      // 16 rows of the block per pass, with AddDotPairs (or AVX-VNNI: DotRows16AvxVnni) and
      // ArgmaxDotI8's strip layout.
      const __m256i even = _mm256_set1_epi32(0x00ff00ff);
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      for (int half = 0; half * 16 < cnt; ++half) {
        __m256i acc[4][2];
        for (int h = 0; h < nh; ++h) acc[h][0] = acc[h][1] = _mm256_set1_epi32(-128 * q_sum[h0 + h]);
        if (vnni) {
          DotRows16AvxVnni(blk + half * 16, quads, qrow, nh, acc);
        } else {
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
#elif ICE_SIMD_NEON
      // As ArgmaxDotI8's NEON kernel (MullStrip or SdotStrip); a short group repeats its last query.
      const uint32_t* qs[kI8Keys];
      for (int h = 0; h < kI8Keys; ++h) qs[h] = qw + static_cast<size_t>(h0 + std::min(h, nh - 1)) * qstride;
      float* o = out + static_cast<size_t>(h0) * nr;
      if (HasDotProd()) {
        ScoreBlockI8Neon<kSdotStripRows>(blk, scale, quads, r0, cnt, qs, q_scale + h0, nh, o, nr, SdotStrip);
      } else {
        ScoreBlockI8Neon<kMullStripRows>(blk, scale, quads, r0, cnt, qs, q_scale + h0, nh, o, nr, MullStrip);
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

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
