// Matmul's GEMV path (m <= 16) over block-quantised weights (q8_0, q4_0, q4_1: kernels/dtype.h),
// in the three numerics of MatmulParams::quant_activations (kernels/matmul.h):
//  * kFp32: each weight block converted to fp32 in registers once for all x rows, 4 FMAs per 32
//    values and row, one more by d_w (RowDotsF32);
//  * kInt16: each x row rounded once per call to int16 per block of 32 (QuantizedX); per block the
//    weights widened to int16 once, then per row two `vpmaddwd` (int16 pairs into int32) and one
//    FMA of the converted int32 lanes by d_w * d_x (RowDots<..., int16_t>);
//  * kInt8: x rounded to int8; per block and row one `vpmaddubsw` + `vpmaddwd` (u8 x s8 pairs,
//    then pairs of int16 into int32) and the same FMA; q8_0's signed weights go through `vpsignb`
//    (|w| as u8, x with w's sign) (RowDots<..., int8_t>).
// The FMA latency does not bind: the fp32 form and q8_0 keep two accumulator chains per output
// (even and odd blocks), the q4 int forms have 4 outputs in flight at m = 1 (items of 4 weight
// rows). All prefetch the weight stream ahead of the block they read, 1 KiB or one item's rows
// (int16 at 14336 x 4096 on Zen 3: 2.3-2.4 ms against 3.1-3.8 without; the hardware prefetcher
// alone runs short). The ymm forms run on the avx512 target as well; scalar and neon targets run
// the same sums in plain loops.
// Work items are weight rows, for q4 with one or two x rows 4 or 2 of them (RowsPerItem), all x
// rows of those weight rows in the item (their blocks are read from memory once), split
// statically over the OpenMP team; several products of one x in one loop (MatmulGroup).

#include <type_traits>  // std::integral_constant

#include "kernels/simd_target.h"
#include "kernels/cpu/simd.h"  // switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {

namespace {

constexpr int kBlock = kQuantBlockValues;
// How far ahead of its block RowDots prefetches the weight stream.
constexpr int kPrefetchBytes = 1024;

// The x rows of a call as the block products need them (kernels/matmul.h), for
// MatmulParams::quant_activations: kInt8 / kInt16 q [m][k] (int8_t / int16_t), d and s
// [m][k / 32] (s = d * the block's sum of q); kFp32 s only, the fp32 sums of x's blocks (for q4's
// m_w term). In per-thread buffers reused across calls (a decode step makes a few hundred),
// filled by the calling thread before the team starts.
class QuantizedX {
 public:
  explicit QuantizedX(const MatmulParams& p);
  QuantActivations mode() const { return mode_; }
  size_t blocks() const { return blocks_; }
  template <typename Q>
  const Q* q(int r) const {
    if constexpr (sizeof(Q) == 1) {
      return q8_.data() + static_cast<size_t>(r) * k_;
    } else {
      return q16_.data() + static_cast<size_t>(r) * k_;
    }
  }
  const float* d(int r) const { return d_.data() + static_cast<size_t>(r) * blocks_; }
  const float* s(int r) const { return s_.data() + static_cast<size_t>(r) * blocks_; }

 private:
  template <typename T>
  static std::vector<T>& Buffer(int which) {
    static thread_local std::vector<T> buf[2];
    return buf[which];
  }
  std::vector<int8_t>& q8_ = Buffer<int8_t>(0);
  std::vector<int16_t>& q16_ = Buffer<int16_t>(0);
  std::vector<float>& d_ = Buffer<float>(0);
  std::vector<float>& s_ = Buffer<float>(1);
  size_t k_ = 0;
  size_t blocks_ = 0;
  QuantActivations mode_ = QuantActivations::kFp32;
};

// One block of 32 values rounded to Q (int8_t: 127 levels a side, int16_t: 32767): q, and returns
// the scale d (writing d * sum(q) to *s).
template <typename Q>
inline float QuantizeBlock(const float* x, Q* q, float* s) {
  constexpr float kLevels = sizeof(Q) == 1 ? 127.f : 32767.f;
#if ICE_SIMD_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
  const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
  __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                            _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float inv = amax > 0.f ? kLevels / amax : 0.f;
  const __m256 iv = _mm256_set1_ps(inv);
  // Round to nearest even (the default MXCSR mode), as std::nearbyint below.
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv));
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  // packs work within 128-bit lanes: the 64-bit quarters come out as 0, 2, 1, 3 of the order wanted.
  const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
  if constexpr (sizeof(Q) == 1) {
    const __m256i p = _mm256_packs_epi16(p01, p23);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permute4x64_epi64(p01, 0xD8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), _mm256_permute4x64_epi64(p23, 0xD8));
  }
  const float d = amax / kLevels;
  *s = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  return d;
#else
  float amax = 0.f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inv = amax > 0.f ? kLevels / amax : 0.f;
  int sum = 0;
  for (int i = 0; i < kBlock; ++i) {
    q[i] = static_cast<Q>(std::nearbyint(x[i] * inv));
    sum += q[i];
  }
  const float d = amax / kLevels;
  *s = d * static_cast<float>(sum);
  return d;
#endif
}

QuantizedX::QuantizedX(const MatmulParams& p) {
  k_ = static_cast<size_t>(p.k);
  blocks_ = k_ / kBlock;
  mode_ = p.quant_activations;
  const size_t m = static_cast<size_t>(p.m);
  if (s_.size() < m * blocks_) s_.resize(m * blocks_);
  if (mode_ == QuantActivations::kFp32) {
    if (p.w_dtype == DType::kQ8_0) return;  // no m_w term
    for (size_t r = 0; r < m; ++r) {
      for (size_t b = 0; b < blocks_; ++b) {
        const float* x = p.x + r * k_ + b * kBlock;
        float sum = 0.f;
        for (int i = 0; i < kBlock; ++i) sum += x[i];
        s_[r * blocks_ + b] = sum;
      }
    }
    return;
  }
  if (d_.size() < m * blocks_) d_.resize(m * blocks_);
  const bool int8 = mode_ == QuantActivations::kInt8;
  if (int8 && q8_.size() < m * k_) q8_.resize(m * k_);
  if (!int8 && q16_.size() < m * k_) q16_.resize(m * k_);
  for (size_t r = 0; r < m; ++r) {
    const float* x = p.x + r * k_;
    for (size_t b = 0; b < blocks_; ++b) {
      float* s = &s_[r * blocks_ + b];
      d_[r * blocks_ + b] = int8 ? QuantizeBlock(x + b * kBlock, q8_.data() + r * k_ + b * kBlock, s)
                                 : QuantizeBlock(x + b * kBlock, q16_.data() + r * k_ + b * kBlock, s);
    }
  }
}

// a * b + c rounded the same way whatever the compiler makes of the surrounding code (one fused
// rounding where the target has FMA), so a row's result does not depend on how many rows share
// its loop.
inline float MulAdd(float a, float b, float c) {
#if ICE_SIMD_AVX2
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
#elif ICE_SIMD_NEON
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if ICE_SIMD_AVX2
  return _cvtsh_ss(h);
#else
  return F16ToF32(h);
#endif
}

// A block of W: its bytes and where its packed values start (kernels/dtype.h).
template <DType W>
constexpr size_t kBlockBytes = W == DType::kQ8_0 ? 34 : W == DType::kQ4_0 ? 18 : 20;
template <DType W>
constexpr int kQsOffset = W == DType::kQ4_1 ? 4 : 2;

// A q4 block's m_w term (q4_1: the stored m; q4_0: -8 d_w), given its d_w.
template <DType W>
inline float BlockMin(const uint8_t* blk, float dw) {
  return W == DType::kQ4_1 ? HalfAt(blk + 2) : -8.f * dw;
}

// The scalar forms' view of a block: its 32 stored values (q8_0's w_i, q4's n_i) as T.
template <DType W, typename T>
inline void BlockValues(const uint8_t* blk, T* v) {
  const uint8_t* qs = blk + kQsOffset<W>;
  if constexpr (W == DType::kQ8_0) {
    for (int i = 0; i < kBlock; ++i) v[i] = static_cast<T>(static_cast<int8_t>(qs[i]));
  } else {
    for (int i = 0; i < kBlock / 2; ++i) {
      v[i] = static_cast<T>(qs[i] & 0x0F);
      v[i + kBlock / 2] = static_cast<T>(qs[i] >> 4);
    }
  }
}

#if ICE_SIMD_AVX2
// d_w (lane 0) and, for q4_1, m_w (lane 1) of a block, the other lanes 0: one conversion.
template <DType W>
inline __m128 BlockScales(const uint8_t* blk) {
  uint32_t h = 0;
  std::memcpy(&h, blk, W == DType::kQ4_1 ? 4 : 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h)));
}
#endif

// out[r * NW + c] = dot(weight row c (rows row_bytes apart from w on), x row r0 + r) for r < MR,
// c < NW: the block products of kernels/matmul.h with x rounded to Q (int8_t or int16_t) per
// block. Each (r, c) is computed by the same operations whatever MR and NW are (a row's bits do
// not depend on the batch nor on the rows it shares a call with): per block, in block order,
// acc += float(integer dot) * (d_w * d_x) (q8_0: even and odd blocks in two chains), and for q4
// mins = fma(m_w, s_x, mins); at the end the lanes of acc summed in ReduceAdd4x8's tree, plus
// mins. NW weight rows share each block's x loads and scales (q4 decode, m = 1, runs NW = 4: at
// k = 576 the per-row setup, the nibble unpacking and the scalar scale arithmetic were most of a
// row's ~18 blocks).
template <DType W, int MR, int NW, typename Q>
void RowDots(const uint8_t* w, size_t row_bytes, int blocks, const QuantizedX& qx, int r0, float* out) {
  constexpr size_t kBytes = kBlockBytes<W>;
  [[maybe_unused]] constexpr bool kInt8 = sizeof(Q) == 1;
  constexpr bool kMins = W != DType::kQ8_0;
  const Q* xq[MR];
  const float* xd[MR];
  const float* xs[MR];
  for (int r = 0; r < MR; ++r) {
    xq[r] = qx.q<Q>(r0 + r);
    xd[r] = qx.d(r0 + r);
    xs[r] = qx.s(r0 + r);
  }
#if ICE_SIMD_AVX2
  // q8_0 keeps two chains per output (even and odd blocks, acc0 / acc1, added before the lane
  // sum): with no m_w term its block is short, and one chain bound it by the FMAs' latency.
  constexpr bool kTwoChains = W == DType::kQ8_0;
  __m256 acc0[MR][NW], acc1[MR][NW];
  __m128 mins[MR][NW];  // q4: lane 0 (q4_0) or 1 (q4_1) holds the sum over blocks of m_w * s_x
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NW; ++c) {
      acc0[r][c] = acc1[r][c] = _mm256_setzero_ps();
      mins[r][c] = _mm_setzero_ps();
    }
  }
  const __m256i low16 = _mm256_set1_epi16(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  [[maybe_unused]] const __m256i low8 = _mm256_set1_epi8(0x0F);
  // The weight stream's prefetch distance: kPrefetchBytes, or the same block of the next item's
  // rows where that is farther (a thread's items are contiguous; with NW rows in flight the
  // stream advances NW blocks a step, and 1 KiB ahead of row c fell inside the item's own rows).
  const size_t ahead = std::max<size_t>(kPrefetchBytes, NW * row_bytes);
  // Block b's products into acc (a statically named array, so it stays in registers).
  auto block = [&](int b, __m256 (&acc)[MR][NW]) __attribute__((always_inline)) {
    // The x side of the block, for every weight row: d_x in lane 0; s_x where the block's
    // BlockScales lane multiplies it (q4_1: m_w in lane 1; q4_0: m_w = -8 d_w, so -8 s_x against
    // d_w in lane 0, the same exact product), 0 in the other lanes.
    __m128 dx[MR], sx[MR];
    for (int r = 0; r < MR; ++r) {
      dx[r] = _mm_set_ss(xd[r][b]);
      if constexpr (W == DType::kQ4_1) sx[r] = _mm_set_ps(0.f, 0.f, xs[r][b], 0.f);
      if constexpr (W == DType::kQ4_0) sx[r] = _mm_set_ss(-8.f * xs[r][b]);
    }
    for (int c = 0; c < NW; ++c) {
      const uint8_t* blk = w + c * row_bytes + static_cast<size_t>(b) * kBytes;
      _mm_prefetch(reinterpret_cast<const char*>(blk) + ahead, _MM_HINT_T0);
      const __m128 dm = BlockScales<W>(blk);
      __m256i wa, wb;
      if constexpr (kInt8) {
        // wa: |w| as u8 (q8_0) or the nibbles; wb: q8_0's signs for x (`vpsignb`).
        if constexpr (W == DType::kQ8_0) {
          wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
          wa = _mm256_sign_epi8(wb, wb);
        } else {
          const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset<W>));
          wa = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low8);
        }
      } else if constexpr (W == DType::kQ8_0) {
        // The weights widened to int16.
        wa = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
        wb = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
      } else {
        // Byte i widened to int16 holds n_i (low nibble) and n_{i+16} (high nibble).
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset<W>)));
        wa = _mm256_and_si256(v, low16);
        wb = _mm256_srli_epi16(v, 4);
      }
      for (int r = 0; r < MR; ++r) {
        __m256i dots;
        if constexpr (kInt8) {
          // u8 x s8 pairs (`vpmaddubsw`), then pairs of int16 into int32 (`vpmaddwd` by 1).
          __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + b * kBlock));
          if constexpr (W == DType::kQ8_0) xv = _mm256_sign_epi8(xv, wb);
          dots = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones);
        } else {
          // int16 x int16 pairs into int32 (`vpmaddwd`).
          const __m256i* xv = reinterpret_cast<const __m256i*>(xq[r] + b * kBlock);
          dots = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256(xv)),
                                  _mm256_madd_epi16(wb, _mm256_loadu_si256(xv + 1)));
        }
        const __m256 scale = _mm256_broadcastss_ps(_mm_mul_ss(dm, dx[r]));  // d_w * d_x
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc[r][c]);
        if constexpr (kMins) mins[r][c] = _mm_fmadd_ps(dm, sx[r], mins[r][c]);
      }
    }
  };
  int b = 0;
  if constexpr (kTwoChains) {
    for (; b + 2 <= blocks; b += 2) {
      block(b, acc0);
      block(b + 1, acc1);
    }
  }
  for (; b < blocks; ++b) block(b, acc0);
  // Four chains' sums at a time in ReduceAdd4x8's tree (zeros fill a last group).
  constexpr int kChains = MR * NW;
  __m256 flat[kChains + 3];
  for (int i = 0; i < kChains + 3; ++i) {
    flat[i] = _mm256_setzero_ps();
    if (i < kChains) flat[i] = kTwoChains ? _mm256_add_ps(acc0[i / NW][i % NW], acc1[i / NW][i % NW]) : acc0[i / NW][i % NW];
  }
  for (int i = 0; i < kChains; i += 4) {
    alignas(16) float s[4];
    _mm_store_ps(s, ReduceAdd4x8(flat[i], flat[i + 1], flat[i + 2], flat[i + 3]));
    for (int t = 0; t < 4 && i + t < kChains; ++t) {
      const __m128 mn = mins[(i + t) / NW][(i + t) % NW];
      out[i + t] = s[t] + _mm_cvtss_f32(_mm_add_ss(mn, _mm_movehdup_ps(mn)));  // lanes 0 + 1
    }
  }
#else
  for (int c = 0; c < NW; ++c) {
    float acc[MR] = {}, mins[MR] = {};
    for (int b = 0; b < blocks; ++b) {
      const uint8_t* blk = w + c * row_bytes + static_cast<size_t>(b) * kBytes;
      const float dw = HalfAt(blk);
      int8_t wq[kBlock];
      BlockValues<W>(blk, wq);
      const float mw = BlockMin<W>(blk, dw);
      for (int r = 0; r < MR; ++r) {
        const Q* x = xq[r] + b * kBlock;
        int32_t sum = 0;
        for (int i = 0; i < kBlock; ++i) sum += static_cast<int32_t>(wq[i]) * x[i];
        acc[r] = MulAdd(dw * xd[r][b], static_cast<float>(sum), acc[r]);
        if constexpr (kMins) mins[r] = MulAdd(mw, xs[r][b], mins[r]);
      }
    }
    for (int r = 0; r < MR; ++r) out[r * NW + c] = acc[r] + mins[r];
  }
#endif
}

// The fp32-activation form: out[r] = sum over blocks of d_w * sum(w_i x_i) (+ m_w * sum(x_i) for
// q4), x row r0 + r in fp32 and sx its block sums (q4 only). The block's weights are converted to
// fp32 once for all MR rows.
template <DType W, int MR>
void RowDotsF32(const uint8_t* w, int blocks, const float* x, size_t ldx, const float* sx, size_t lds, float* out) {
  constexpr size_t kBytes = kBlockBytes<W>;
  float mins[2][MR] = {};
#if ICE_SIMD_AVX2
  __m256 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const __m128i low = _mm_set1_epi8(0x0F);
  auto block = [&](int b, __m256 (&acc)[MR], float (&mn)[MR]) __attribute__((always_inline)) {
    const uint8_t* blk = w + static_cast<size_t>(b) * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 dw = _mm256_set1_ps(HalfAt(blk));
    __m256 wv[4];
    if constexpr (W == DType::kQ8_0) {
      for (int c = 0; c < 4; ++c) {
        wv[c] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * c))));
      }
    } else {
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset<W>));
      const __m128i lo = _mm_and_si128(qs, low), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low);
      wv[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
      wv[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
      wv[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
      wv[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    }
    const float mw = W == DType::kQ8_0 ? 0.f : BlockMin<W>(blk, HalfAt(blk));
    for (int r = 0; r < MR; ++r) {
      const float* xb = x + r * ldx + b * kBlock;
      __m256 t = _mm256_mul_ps(wv[0], _mm256_loadu_ps(xb));
      t = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xb + 8), t);
      t = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xb + 16), t);
      t = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xb + 24), t);
      acc[r] = _mm256_fmadd_ps(t, dw, acc[r]);
      if constexpr (W != DType::kQ8_0) mn[r] = MulAdd(mw, sx[r * lds + b], mn[r]);
    }
  };
  int b = 0;
  for (; b + 2 <= blocks; b += 2) {
    block(b, acc0, mins[0]);
    block(b + 1, acc1, mins[1]);
  }
  if (b < blocks) block(b, acc0, mins[0]);
  for (int r = 0; r < MR; ++r) out[r] = HSum8(_mm256_add_ps(acc0[r], acc1[r])) + (mins[0][r] + mins[1][r]);
#else
  float acc[MR] = {};
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + static_cast<size_t>(b) * kBytes;
    const float dw = HalfAt(blk);
    float wq[kBlock];
    BlockValues<W>(blk, wq);
    const float mw = BlockMin<W>(blk, dw);
    for (int r = 0; r < MR; ++r) {
      const float* xb = x + r * ldx + b * kBlock;
      float t = 0.f;
      for (int i = 0; i < kBlock; ++i) t = MulAdd(wq[i], xb[i], t);
      acc[r] = MulAdd(dw, t, acc[r]);
      if constexpr (W != DType::kQ8_0) mins[0][r] = MulAdd(mw, sx[r * lds + b], mins[0][r]);
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = acc[r] + mins[0][r];
#endif
}

constexpr int kStripRows = 4;

// Weight rows per work item: for q4 a 1- or 2-row x shares each block's loads and scales across 4
// or 2 weight rows (RowDots' NW); more x rows are themselves the reuse. q8_0 stays at one: its
// block has little to share (no nibbles, no m_w), and four interleaved row streams read slower
// from memory (SmolLM2's 49152 x 576 lm_head on a Zen 3 guest, 2 threads: 1.4-1.6 ms against
// 1.0-1.3 for one row at a time).
template <DType W>
inline int RowsPerItem(int m) { return W == DType::kQ8_0 ? 1 : m == 1 ? 4 : m == 2 ? 2 : 1; }

// v[r * nw + c] for x rows r < mr and weight rows c < nw, one weight row at a time: rows(c, kMr,
// one) writes weight row c's results for the kMr x rows (kMr a std::integral_constant, 1..4).
template <typename Rows>
void EachWeightRow(int mr, int nw, float* v, Rows&& rows) {
  auto each = [&](auto kMr) {
    for (int c = 0; c < nw; ++c) {
      float one[kStripRows];
      rows(c, kMr, one);
      for (int r = 0; r < kMr; ++r) v[r * nw + c] = one[r];
    }
  };
  switch (mr) {
    case 4: return each(std::integral_constant<int, 4>{});
    case 3: return each(std::integral_constant<int, 3>{});
    case 2: return each(std::integral_constant<int, 2>{});
    default: return each(std::integral_constant<int, 1>{});
  }
}

// v[r * nw + c] = RowDots of x rows r0 .. r0 + mr - 1 and weight rows c < nw from w on.
template <DType W, typename Q>
void ItemDots(const uint8_t* w, size_t row_bytes, int blocks, const QuantizedX& qx, int r0, int mr, int nw,
              float* v) {
  if constexpr (W != DType::kQ8_0) {  // q8_0 items are one weight row (RowsPerItem)
    if (mr == 1 && nw == 4) return RowDots<W, 1, 4, Q>(w, row_bytes, blocks, qx, r0, v);
    if (mr == 2 && nw == 2) return RowDots<W, 2, 2, Q>(w, row_bytes, blocks, qx, r0, v);
  }
  EachWeightRow(mr, nw, v, [&](int c, auto kMr, float* one) {
    RowDots<W, kMr, 1, Q>(w + c * row_bytes, row_bytes, blocks, qx, r0, one);
  });
}

// Weight rows j0 .. j0 + nw - 1 (nw <= 4) of p against every x row.
template <DType W>
void QuantGemvItem(const MatmulParams& p, const QuantizedX& qx, int j0, int nw) {
  const int blocks = p.k / kBlock;
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes<W>;
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + static_cast<size_t>(j0) * row_bytes;
  float bias[4] = {};
  for (int c = 0; c < nw && p.bias != nullptr; ++c) {
    switch (p.bias_dtype) {
      case DType::kF16: bias[c] = LoadScalar<DType::kF16>(p.bias, j0 + c); break;
      case DType::kBF16: bias[c] = LoadScalar<DType::kBF16>(p.bias, j0 + c); break;
      default: bias[c] = LoadScalar<DType::kF32>(p.bias, j0 + c); break;
    }
  }
  for (int r0 = 0; r0 < p.m; r0 += kStripRows) {
    float v[kStripRows * 4];
    const int mr = std::min(kStripRows, p.m - r0);
    if (qx.mode() == QuantActivations::kInt8) {
      ItemDots<W, int8_t>(w, row_bytes, blocks, qx, r0, mr, nw, v);
    } else if (qx.mode() == QuantActivations::kInt16) {
      ItemDots<W, int16_t>(w, row_bytes, blocks, qx, r0, mr, nw, v);
    } else {
      const float* x = p.x + static_cast<size_t>(r0) * p.k;
      const float* sx = qx.s(r0);
      const size_t k = static_cast<size_t>(p.k), nb = qx.blocks();
      EachWeightRow(mr, nw, v, [&](int c, auto kMr, float* one) {
        RowDotsF32<W, kMr>(w + c * row_bytes, blocks, x, k, sx, nb, one);
      });
    }
    for (int r = 0; r < mr; ++r) {
      for (int c = 0; c < nw; ++c) {
        float& out = p.y[static_cast<size_t>(r0 + r) * p.n + j0 + c];
        out = p.accumulate ? out + v[r * nw + c] + bias[c] : v[r * nw + c] + bias[c];
      }
    }
  }
}

template <DType W>
void QuantGemvLoop(const MatmulParams* ps, int count, const QuantizedX& qx) {
  constexpr int kMaxGroup = 8;
  const int rows = RowsPerItem<W>(ps[0].m);  // every product of a group has the same x
  int first[kMaxGroup + 1] = {0};         // first[c]: product c's first item in the joint loop
  for (int c = 0; c < count; ++c) first[c + 1] = first[c] + (ps[c].n + rows - 1) / rows;
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
  for (int i = 0; i < first[count]; ++i) {
    int c = 0;
    while (i >= first[c + 1]) ++c;
    const int j0 = (i - first[c]) * rows;
    QuantGemvItem<W>(ps[c], qx, j0, std::min(rows, ps[c].n - j0));
  }
}

}  // namespace

void DequantizeBlocks(DType t, const void* src, float* dst, size_t n) {
#if ICE_SIMD_AVX2
  // Multiplies and adds in the order of the definition, unfused, so the values are ConvertToF32's
  // bit for bit.
  const auto* blk = static_cast<const uint8_t*>(src);
  const size_t bytes = QuantBlockBytes(t);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (size_t b = 0; b < n / kBlock; ++b, blk += bytes, dst += kBlock) {
    const __m256 d = _mm256_set1_ps(HalfAt(blk));
    __m256i v[4];
    if (t == DType::kQ8_0) {
      for (int c = 0; c < 4; ++c) v[c] = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * c)));
    } else {
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (t == DType::kQ4_1 ? 4 : 2)));
      const __m128i lo = _mm_and_si128(qs, low4), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), low4);
      v[0] = _mm256_cvtepu8_epi32(lo);
      v[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
      v[2] = _mm256_cvtepu8_epi32(hi);
      v[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
      if (t == DType::kQ4_0) {
        for (int c = 0; c < 4; ++c) v[c] = _mm256_sub_epi32(v[c], _mm256_set1_epi32(8));
      }
    }
    const __m256 m = _mm256_set1_ps(t == DType::kQ4_1 ? HalfAt(blk + 2) : 0.f);
    for (int c = 0; c < 4; ++c) {
      __m256 y = _mm256_mul_ps(d, _mm256_cvtepi32_ps(v[c]));
      if (t == DType::kQ4_1) y = _mm256_add_ps(y, m);
      _mm256_storeu_ps(dst + 8 * c, y);
    }
  }
#else
  ConvertToF32(t, src, dst, n);
#endif
}

void QuantGemv(const MatmulParams* ps, int count) {
  const QuantizedX qx(ps[0]);
  switch (ps[0].w_dtype) {
    case DType::kQ8_0: return QuantGemvLoop<DType::kQ8_0>(ps, count, qx);
    case DType::kQ4_0: return QuantGemvLoop<DType::kQ4_0>(ps, count, qx);
    case DType::kQ4_1: return QuantGemvLoop<DType::kQ4_1>(ps, count, qx);
    default: return;
  }
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
