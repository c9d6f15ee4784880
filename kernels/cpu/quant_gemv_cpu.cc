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
// All keep two accumulator chains per row (even and odd blocks) so the FMA latency does not
// bind, and prefetch the weight stream 1 KiB ahead of the block they read (int16 at 14336 x 4096
// on Zen 3: 2.3-2.4 ms against 3.1-3.8 without; the hardware prefetcher alone runs short). The
// ymm forms run on the avx512 target as well; scalar and neon targets run the same sums
// in plain loops.
// Work items are weight rows (all x rows of one weight row per item, so its blocks are read from
// memory once), split statically over the OpenMP team; several products of one x in one loop
// (MatmulGroup).

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

// out[r] = dot(weight row w, x row r0 + r) for r < MR, the block products of kernels/matmul.h with
// x rounded to Q (int8_t or int16_t) per block.
template <DType W, int MR, typename Q>
void RowDots(const uint8_t* w, int blocks, const QuantizedX& qx, int r0, float* out) {
  constexpr size_t kBytes = kBlockBytes<W>;
  [[maybe_unused]] constexpr bool kInt8 = sizeof(Q) == 1;
  const Q* xq[MR];
  const float* xd[MR];
  const float* xs[MR];
  for (int r = 0; r < MR; ++r) {
    xq[r] = qx.q<Q>(r0 + r);
    xd[r] = qx.d(r0 + r);
    xs[r] = qx.s(r0 + r);
  }
  float mins[MR] = {};  // q4: the sum over blocks of m_w * s_x
#if ICE_SIMD_AVX2
  __m256 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_set1_epi8(0x0F);
  float mins1[MR] = {};  // odd blocks' share: two chains of adds, as acc0 / acc1
  // Block b's products into acc (a statically named array, so it stays in registers).
  auto block = [&](int b, __m256 (&acc)[MR], float (&mn)[MR]) {
    const uint8_t* blk = w + static_cast<size_t>(b) * kBytes;
    // The stream kPrefetchBytes ahead (into the next rows: a thread's rows are contiguous).
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
    const float dw = HalfAt(blk);
    const float mw = BlockMin<W>(blk, dw);
    if constexpr (kInt8) {
      // u8 x s8 pairs (`vpmaddubsw`), then pairs of int16 into int32 (`vpmaddwd` by 1).
      __m256i wv, aw;
      if constexpr (W == DType::kQ8_0) {
        wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        aw = _mm256_sign_epi8(wv, wv);
      } else {
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset<W>));
        wv = aw = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low);
      }
      for (int r = 0; r < MR; ++r) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + b * kBlock));
        if constexpr (W == DType::kQ8_0) xv = _mm256_sign_epi8(xv, wv);
        const __m256i dots = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_set1_ps(dw * xd[r][b]), acc[r]);
        if constexpr (W != DType::kQ8_0) mn[r] = MulAdd(mw, xs[r][b], mn[r]);
      }
    } else {
      // The weights widened to int16, then int16 x int16 pairs into int32 (`vpmaddwd`).
      __m256i wa, wb;
      if constexpr (W == DType::kQ8_0) {
        wa = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
        wb = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
      } else {
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset<W>));
        const __m128i low4 = _mm_set1_epi8(0x0F);
        wa = _mm256_cvtepu8_epi16(_mm_and_si128(qs, low4));
        wb = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(qs, 4), low4));
      }
      for (int r = 0; r < MR; ++r) {
        const __m256i* xv = reinterpret_cast<const __m256i*>(xq[r] + b * kBlock);
        const __m256i dots = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256(xv)),
                                              _mm256_madd_epi16(wb, _mm256_loadu_si256(xv + 1)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_set1_ps(dw * xd[r][b]), acc[r]);
        if constexpr (W != DType::kQ8_0) mn[r] = MulAdd(mw, xs[r][b], mn[r]);
      }
    }
  };
  int b = 0;
  for (; b + 2 <= blocks; b += 2) {
    block(b, acc0, mins);
    block(b + 1, acc1, mins1);
  }
  if (b < blocks) block(b, acc0, mins);
  for (int r = 0; r < MR; ++r) out[r] = HSum8(_mm256_add_ps(acc0[r], acc1[r])) + (mins[r] + mins1[r]);
#else
  float acc[MR] = {};
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + static_cast<size_t>(b) * kBytes;
    const float dw = HalfAt(blk);
    int8_t wq[kBlock];
    BlockValues<W>(blk, wq);
    const float mw = BlockMin<W>(blk, dw);
    for (int r = 0; r < MR; ++r) {
      const Q* x = xq[r] + b * kBlock;
      int32_t sum = 0;
      for (int i = 0; i < kBlock; ++i) sum += static_cast<int32_t>(wq[i]) * x[i];
      acc[r] = MulAdd(dw * xd[r][b], static_cast<float>(sum), acc[r]);
      if constexpr (W != DType::kQ8_0) mins[r] = MulAdd(mw, xs[r][b], mins[r]);
    }
  }
  for (int r = 0; r < MR; ++r) out[r] = acc[r] + mins[r];
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
  auto block = [&](int b, __m256 (&acc)[MR], float (&mn)[MR]) {
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

template <DType W>
void QuantGemvItem(const MatmulParams& p, const QuantizedX& qx, int j) {
  const int blocks = p.k / kBlock;
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes<W>;
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + static_cast<size_t>(j) * row_bytes;
  float bias = 0.f;
  if (p.bias != nullptr) {
    switch (p.bias_dtype) {
      case DType::kF16: bias = LoadScalar<DType::kF16>(p.bias, j); break;
      case DType::kBF16: bias = LoadScalar<DType::kBF16>(p.bias, j); break;
      default: bias = LoadScalar<DType::kF32>(p.bias, j); break;
    }
  }
  for (int r0 = 0; r0 < p.m; r0 += kStripRows) {
    float v[kStripRows];
    const int mr = std::min(kStripRows, p.m - r0);
    if (qx.mode() != QuantActivations::kFp32) {
      if (qx.mode() == QuantActivations::kInt8) {
        switch (mr) {
          case 4: RowDots<W, 4, int8_t>(w, blocks, qx, r0, v); break;
          case 3: RowDots<W, 3, int8_t>(w, blocks, qx, r0, v); break;
          case 2: RowDots<W, 2, int8_t>(w, blocks, qx, r0, v); break;
          default: RowDots<W, 1, int8_t>(w, blocks, qx, r0, v); break;
        }
      } else {
        switch (mr) {
          case 4: RowDots<W, 4, int16_t>(w, blocks, qx, r0, v); break;
          case 3: RowDots<W, 3, int16_t>(w, blocks, qx, r0, v); break;
          case 2: RowDots<W, 2, int16_t>(w, blocks, qx, r0, v); break;
          default: RowDots<W, 1, int16_t>(w, blocks, qx, r0, v); break;
        }
      }
    } else {
      const float* x = p.x + static_cast<size_t>(r0) * p.k;
      const float* sx = qx.s(r0);
      const size_t k = static_cast<size_t>(p.k), nb = qx.blocks();
      switch (mr) {
        case 4: RowDotsF32<W, 4>(w, blocks, x, k, sx, nb, v); break;
        case 3: RowDotsF32<W, 3>(w, blocks, x, k, sx, nb, v); break;
        case 2: RowDotsF32<W, 2>(w, blocks, x, k, sx, nb, v); break;
        default: RowDotsF32<W, 1>(w, blocks, x, k, sx, nb, v); break;
      }
    }
    for (int r = 0; r < mr; ++r) {
      float& out = p.y[static_cast<size_t>(r0 + r) * p.n + j];
      out = p.accumulate ? out + v[r] + bias : v[r] + bias;
    }
  }
}

template <DType W>
void QuantGemvLoop(const MatmulParams* ps, int count, const QuantizedX& qx) {
  constexpr int kMaxGroup = 8;
  int first[kMaxGroup + 1] = {0};  // first[c]: product c's first row in the joint loop
  for (int c = 0; c < count; ++c) first[c + 1] = first[c] + ps[c].n;
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
  for (int i = 0; i < first[count]; ++i) {
    int c = 0;
    while (i >= first[c + 1]) ++c;
    QuantGemvItem<W>(ps[c], qx, i - first[c]);
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
