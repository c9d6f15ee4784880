// y = x · Wᵀ (+ bias) on the CPU.
//  * m <= kGemvMaxRows (decode, batched decode): GEMV-style. Weight rows are streamed once,
//    converted to fp32 in registers and dotted with every (cache-resident) x row, three weight
//    rows by up to eight x rows at a time (AVX-512, AVX2 and NEON register blocks). Memory-bound on W at m = 1, FMA-bound at m = 8..16.
//  * larger m: work items of kPanelRows weight rows by a block of x rows (GemmRowBlocks); an
//    item converts its panel of up to kPanelK columns (PanelK) to fp32 once, then a 4x4
//    register-blocked micro-kernel multiplies the block's x rows against it (AVX-512, AVX2 and
//    NEON forms; plain loops on the scalar target).
//  * bf16 weights and MatmulParams::bf16_activations: x rounded to bf16 once per call; for m > 16
//    on the avx512 target AMX tiles where the CPU has them (AmxActive: weights packed per work
//    item into tiles), else `vdpbf16ps` register tiles over the bf16 weights in place (no fp32
//    panel); every other case runs the rounded x (widened back to fp32) through the GEMV / GEMM above.

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/simd_target.h"
#include "kernels/cpu/simd.h"  // switches code generation to the target
#include "kernels/cpu/amx.h"

namespace icecache::kernels::cpu::ICE_SIMD_NS {

namespace {

constexpr int kGemvMaxRows = 16;
constexpr int kGemvGroupRows = 8;
constexpr int kGemvFeatures = 3;
constexpr int kPanelRows = 64;
constexpr int kPanelK = 768;  // most k columns per panel: 64 x 768 fp32 = 192 KiB, within L2

// The GEMM cuts k into blocks of equal length (a multiple of 8, at most kPanelK; the last may be
// shorter). Each block ends in one horizontal sum per accumulator, so uneven cuts cost: k = 576
// (SmolLM2's hidden size) at 512 columns a block was 512 + 64, a second block of 8 iterations
// paying the whole reduction again.
int PanelK(int k) {
  const int blocks = (k + kPanelK - 1) / kPanelK;
  const int kc = (k + blocks - 1) / blocks;
  return std::min(kPanelK, (kc + 7) / 8 * 8);
}
// Panel rows per micro-kernel call: 4 x 4 zmm accumulators with AVX-512, 4 x 3 ymm with AVX2 (16
// registers: 12 accumulators, 3 panel vectors, x), 4 x 4 q registers with NEON
// (21 of 32: 16 accumulators, 4 panel vectors, x).
constexpr int kTileCols = ICE_SIMD_AVX512 || !ICE_SIMD_AVX2 ? 4 : 3;

float BiasAt(const MatmulParams& p, int j) {
  if (p.bias == nullptr) return 0.f;
  switch (p.bias_dtype) {
    case DType::kF16: return LoadScalar<DType::kF16>(p.bias, j);
    case DType::kBF16: return LoadScalar<DType::kBF16>(p.bias, j);
    default: break;  // f32 (kernels/ops.cc admits plain bias types only)
  }
  return LoadScalar<DType::kF32>(p.bias, j);
}

#if ICE_SIMD_NEON
// Elements i .. i+count-1 of a typed array (count < 4) as fp32, zeros in the other lanes.
template <DType T>
inline float32x4_t Load4Tail(const void* base, size_t i, int count) {
  constexpr size_t kElem = T == DType::kF32 ? 4 : 2;
  unsigned char buf[16] = {};
  std::memcpy(buf, static_cast<const char*>(base) + i * kElem, static_cast<size_t>(count) * kElem);
  return Load4<T>(buf, 0);
}
#endif

#if ICE_SIMD_AVX512
// out[r * 4 + c] = the lane sum of acc[r][c] for c < N (lanes N..3 zero): ReduceAdd4 per row, so a
// sum's reduction tree does not depend on N.
template <int MR, int N>
inline void StoreSums4(const __m512 (&acc)[MR][N], float* out) {
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    _mm_storeu_ps(out + r * 4, ReduceAdd4(acc[r][0], N > 1 ? acc[r][N > 1 ? 1 : 0] : zero,
                                          N > 2 ? acc[r][N > 2 ? 2 : 0] : zero, N > 3 ? acc[r][N > 3 ? 3 : 0] : zero));
  }
}
#endif

// out[r * 4 + c] = dot(x row r, weight row c) for r < MR, c < NW: each converted weight vector
// serves MR rows and each x vector NW weight rows (MR * NW <= 24 accumulators, FMA-bound rather
// than load-bound). A row's arithmetic (FMA order, tail, reduction tree) is the same for every MR
// and NW, so the rows of any 2..16-row call are computed alike; m = 1 uses Dot (another
// summation order, same error bound).
template <DType T, int MR, int NW>
void GemvBlock(const float* x, size_t ldx, const char* w, size_t w_row_bytes, int k, float* out) {
#if ICE_SIMD_AVX512
  static_assert(NW >= 1 && NW <= 4 && MR * NW <= 24);
  constexpr size_t kElem = T == DType::kF32 ? 4 : 2;
  __m512 acc[MR][NW];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[NW];
    for (int c = 0; c < NW; ++c) wv[c] = Load16<T>(w + c * w_row_bytes, i);
    if ((i * kElem) % 64 == 0) {
      // The next block's NW rows (contiguous after this block's) into L2 as one linear stream,
      // NW lines per 64 bytes consumed: 15-20 % faster at m = 8 than prefetching ahead within
      // each of the NW interleaved rows (t0: slower). Past the end of W it is harmless.
      const char* next = w + NW * w_row_bytes + i * kElem * NW;
      for (int c = 0; c < NW; ++c) _mm_prefetch(next + c * 64, _MM_HINT_T1);
    }
    for (int r = 0; r < MR; ++r) {
      __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
      // Keeps x in a register: GCC otherwise folds the load into each of the NW FMAs (NW times
      // the loads).
      __asm__("" : "+v"(xv));
      for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (i < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - i)) - 1u);
    __m512 wv[NW];
    for (int c = 0; c < NW; ++c) wv[c] = Load16Tail<T>(w + c * w_row_bytes, i, k - i);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + r * ldx + i);
      for (int c = 0; c < NW; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  StoreSums4<MR, NW>(acc, out);
#elif ICE_SIMD_AVX2
  // 16 ymm registers: the rows are taken four at a time (MR * NW <= 12 accumulators), each strip
  // of rows re-reading the NW weight rows (from L1/L2 after the first strip). Every accumulator
  // sees the same FMA sequence and reduction (HSum8) whatever MR and NW are.
  static_assert(NW >= 1 && NW <= 4);
  constexpr size_t kElem = T == DType::kF32 ? 4 : 2;
  for (int r0 = 0; r0 < MR; r0 += 4) {
    constexpr int kStrip = MR < 4 ? MR : 4;
    const int mr = std::min(kStrip, MR - r0);
    __m256 acc[kStrip][NW];
    for (int r = 0; r < kStrip; ++r)
      for (int c = 0; c < NW; ++c) acc[r][c] = _mm256_setzero_ps();
    const float* xs = x + r0 * ldx;
    int i = 0;
    for (; i + 8 <= k; i += 8) {
      __m256 wv[NW];
      for (int c = 0; c < NW; ++c) wv[c] = Load8<T>(w + c * w_row_bytes, i);
      if (r0 == 0 && (i * kElem) % 64 == 0) {
        // As the AVX-512 kernel: the next block's rows into L2 as one linear stream.
        const char* next = w + NW * w_row_bytes + i * kElem * NW;
        for (int c = 0; c < NW; ++c) _mm_prefetch(next + c * 64, _MM_HINT_T1);
      }
      for (int r = 0; r < kStrip; ++r) {
        if (r >= mr) break;
        __m256 xv = _mm256_loadu_ps(xs + r * ldx + i);
        __asm__("" : "+x"(xv));  // one load of x for the NW FMAs (see above)
        for (int c = 0; c < NW; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    if (i < k) {
      __m256 wv[NW];
      for (int c = 0; c < NW; ++c) wv[c] = Load8Tail<T>(w + c * w_row_bytes, i, k - i);
      for (int r = 0; r < mr; ++r) {
        const __m256 xv = Load8Tail<DType::kF32>(xs + r * ldx, i, k - i);
        for (int c = 0; c < NW; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < mr; ++r)
      for (int c = 0; c < NW; ++c) out[(r0 + r) * 4 + c] = HSum8(acc[r][c]);
  }
#elif ICE_SIMD_NEON
  // 32 q registers: all MR <= 8 rows in one pass (MR * NW <= 24 accumulators, NW weight vectors
  // and x), so each weight vector is converted once for all rows. Every accumulator sees the same
  // FMA sequence (the tail zero-padded) and reduction (vaddvq) whatever MR and NW are.
  static_assert(NW >= 1 && NW <= 4 && MR * NW <= 24);
  float32x4_t acc[MR][NW];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NW; ++c) acc[r][c] = vdupq_n_f32(0.f);
  int i = 0;
  for (; i + 4 <= k; i += 4) {
    float32x4_t wv[NW];
    for (int c = 0; c < NW; ++c) wv[c] = Load4<T>(w + c * w_row_bytes, i);
    for (int r = 0; r < MR; ++r) {
      const float32x4_t xv = vld1q_f32(x + r * ldx + i);
      for (int c = 0; c < NW; ++c) acc[r][c] = vfmaq_f32(acc[r][c], xv, wv[c]);
    }
  }
  if (i < k) {
    float32x4_t wv[NW];
    for (int c = 0; c < NW; ++c) wv[c] = Load4Tail<T>(w + c * w_row_bytes, i, k - i);
    for (int r = 0; r < MR; ++r) {
      const float32x4_t xv = Load4TailF32(x + r * ldx, i, k - i);
      for (int c = 0; c < NW; ++c) acc[r][c] = vfmaq_f32(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NW; ++c) out[r * 4 + c] = vaddvq_f32(acc[r][c]);
#else
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NW; ++c) out[r * 4 + c] = Dot<T>(x + r * ldx, w + c * w_row_bytes, k);
#endif
}

template <DType T, int NW>
void GemvBlockRows(int mr, const float* x, size_t ldx, const char* w, size_t w_row_bytes, int k,
                   float* out) {
  switch (mr) {
    case 8: return GemvBlock<T, 8, NW>(x, ldx, w, w_row_bytes, k, out);
    case 7: return GemvBlock<T, 7, NW>(x, ldx, w, w_row_bytes, k, out);
    case 6: return GemvBlock<T, 6, NW>(x, ldx, w, w_row_bytes, k, out);
    case 5: return GemvBlock<T, 5, NW>(x, ldx, w, w_row_bytes, k, out);
    case 4: return GemvBlock<T, 4, NW>(x, ldx, w, w_row_bytes, k, out);
    case 3: return GemvBlock<T, 3, NW>(x, ldx, w, w_row_bytes, k, out);
    case 2: return GemvBlock<T, 2, NW>(x, ldx, w, w_row_bytes, k, out);
    default: return GemvBlock<T, 1, NW>(x, ldx, w, w_row_bytes, k, out);
  }
}

// m <= kGemvMaxRows: work items, split over OpenMP. At m = 1 an item is one output feature: one
// weight row at a time (a single stream with two accumulator chains), ~25 % faster at m = 1 than
// three interleaved rows, which is what the multi-row blocks need. Otherwise an item is a block of
// kGemvFeatures output features, whose x rows are taken in groups of up to kGemvGroupRows, so the
// weight block is read from memory once and from L1/L2 for the later groups.
int GemvItems(const MatmulParams& p) { return p.m == 1 ? p.n : (p.n + kGemvFeatures - 1) / kGemvFeatures; }

template <DType T>
inline void GemvItem(const MatmulParams& p, int item) {
  const size_t row_bytes = static_cast<size_t>(p.k) * DTypeSize(T);
  const char* w = static_cast<const char*>(p.w);
  if (p.m == 1) {
    const int j = item;
    const float v = Dot<T>(p.x, w + j * row_bytes, p.k) + BiasAt(p, j);
    p.y[j] = p.accumulate ? p.y[j] + v : v;
    return;
  }
  const int j0 = item * kGemvFeatures;
  const int nb = std::min(kGemvFeatures, p.n - j0);
  float v[kGemvGroupRows * 4];
  for (int r0 = 0; r0 < p.m; r0 += kGemvGroupRows) {
    const int mr = std::min(kGemvGroupRows, p.m - r0);
    const float* x = p.x + static_cast<size_t>(r0) * p.k;
    if (nb == kGemvFeatures) {
      GemvBlockRows<T, kGemvFeatures>(mr, x, p.k, w + j0 * row_bytes, row_bytes, p.k, v);
    } else {
      for (int c = 0; c < nb; ++c) {
        float one[kGemvGroupRows * 4];
        GemvBlockRows<T, 1>(mr, x, p.k, w + (j0 + c) * row_bytes, row_bytes, p.k, one);
        for (int r = 0; r < mr; ++r) v[r * 4 + c] = one[r * 4];
      }
    }
    for (int c = 0; c < nb; ++c) {
      const float b = BiasAt(p, j0 + c);
      for (int r = 0; r < mr; ++r) {
        float& out = p.y[static_cast<size_t>(r0 + r) * p.n + j0 + c];
        out = p.accumulate ? out + v[r * 4 + c] + b : v[r * 4 + c] + b;
      }
    }
  }
}

template <DType T>
void Gemv(const MatmulParams& p) {
  const int items = GemvItems(p);
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
  for (int i = 0; i < items; ++i) GemvItem<T>(p, i);
}

// The GEMVs of several products in one OpenMP loop over all their items (MatmulGroup).
constexpr int kMaxGemvGroup = 8;
template <DType T>
void GemvGroup(const MatmulParams* ps, int count) {
  int first[kMaxGemvGroup + 1] = {0};  // first[c]: product c's first item in the joint loop
  for (int c = 0; c < count; ++c) first[c + 1] = first[c] + GemvItems(ps[c]);
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
  for (int i = 0; i < first[count]; ++i) {
    int c = 0;
    while (i >= first[c + 1]) ++c;
    GemvItem<T>(ps[c], i - first[c]);
  }
}

// acc[r][c] += dot(x row r, panel row c) over kc columns; x rows are ldx apart, panel rows ldp.
template <int MR, int NR>
void MicroKernel(const float* x, size_t ldx, const float* panel, int ldp, int kc, float* y,
                 size_t ldy) {
#if ICE_SIMD_AVX512
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= kc; i += 16) {
    __m512 wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = _mm512_loadu_ps(panel + c * ldp + i);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (i < kc) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (kc - i)) - 1u);
    __m512 wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, panel + c * ldp + i);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + r * ldx + i);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) y[r * ldy + c] += _mm512_reduce_add_ps(acc[r][c]);
#elif ICE_SIMD_AVX2
  // All NR <= 3 columns in one pass: MR x NR accumulators + NR panel vectors + x (16 ymm
  // registers at 4 x 3). (Written as passes of up to 3 columns so that NR = 4 also compiles.)
  for (int c0 = 0; c0 < NR; c0 += 3) {
    constexpr int kCols = NR < 3 ? NR : 3;
    const int nc = std::min(kCols, NR - c0);
    __m256 acc[MR][kCols];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
    const float* pc = panel + c0 * ldp;
    const int loaded = nc == kCols ? kCols : 1;  // a short last pass re-reads column 0
    int i = 0;
    for (; i + 8 <= kc; i += 8) {
      __m256 wv[kCols];
      for (int c = 0; c < kCols; ++c) wv[c] = _mm256_loadu_ps(pc + (c < loaded ? c : 0) * ldp + i);
      for (int r = 0; r < MR; ++r) {
        const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
        for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    if (i < kc) {
      __m256 wv[kCols];
      for (int c = 0; c < kCols; ++c) wv[c] = Load8Tail<DType::kF32>(pc + (c < loaded ? c : 0) * ldp, i, kc - i);
      for (int r = 0; r < MR; ++r) {
        const __m256 xv = Load8Tail<DType::kF32>(x + r * ldx, i, kc - i);
        for (int c = 0; c < kCols; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < nc; ++c) y[r * ldy + c0 + c] += HSum8(acc[r][c]);
  }
#elif ICE_SIMD_NEON
  // MR x NR <= 16 accumulators of 4 lanes (independent FMA chains enough to cover the latency),
  // NR panel vectors and x: 21 of the 32 registers.
  float32x4_t acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = vdupq_n_f32(0.f);
  int i = 0;
  for (; i + 4 <= kc; i += 4) {
    float32x4_t wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = vld1q_f32(panel + c * ldp + i);
    for (int r = 0; r < MR; ++r) {
      const float32x4_t xv = vld1q_f32(x + r * ldx + i);
      for (int c = 0; c < NR; ++c) acc[r][c] = vfmaq_f32(acc[r][c], xv, wv[c]);
    }
  }
  if (i < kc) {
    float32x4_t wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = Load4TailF32(panel + c * ldp, i, kc - i);
    for (int r = 0; r < MR; ++r) {
      const float32x4_t xv = Load4TailF32(x + r * ldx, i, kc - i);
      for (int c = 0; c < NR; ++c) acc[r][c] = vfmaq_f32(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) y[r * ldy + c] += vaddvq_f32(acc[r][c]);
#else
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) {
      float s = 0.f;
      for (int i = 0; i < kc; ++i) s += x[r * ldx + i] * panel[c * ldp + i];
      y[r * ldy + c] += s;
    }
#endif
}

template <int MR>
void MicroKernelN(int nr, const float* x, size_t ldx, const float* panel, int ldp, int kc, float* y,
                  size_t ldy) {
  switch (nr) {
    case 4: return MicroKernel<MR, 4>(x, ldx, panel, ldp, kc, y, ldy);
    case 3: return MicroKernel<MR, 3>(x, ldx, panel, ldp, kc, y, ldy);
    case 2: return MicroKernel<MR, 2>(x, ldx, panel, ldp, kc, y, ldy);
    default: return MicroKernel<MR, 1>(x, ldx, panel, ldp, kc, y, ldy);
  }
}

void MicroKernelMN(int mr, int nr, const float* x, size_t ldx, const float* panel, int ldp, int kc,
                   float* y, size_t ldy) {
  switch (mr) {
    case 4: return MicroKernelN<4>(nr, x, ldx, panel, ldp, kc, y, ldy);
    case 3: return MicroKernelN<3>(nr, x, ldx, panel, ldp, kc, y, ldy);
    case 2: return MicroKernelN<2>(nr, x, ldx, panel, ldp, kc, y, ldy);
    default: return MicroKernelN<1>(nr, x, ldx, panel, ldp, kc, y, ldy);
  }
}

// Work items of the GEMM: a panel of kPanelRows weight rows by a block of x rows. A projection
// with few panels, or a panel count the threads do not divide (SmolLM2: k/v 3 panels, q/o/down 9,
// which ran 2 + 1 and 5 + 4 on 2 threads), splits its rows as well: the fewest blocks that give
// every thread kItemsPerThread items and leave the last round of items at most kMaxIdleShare idle.
// Every output is summed in the same order however the items are cut.
constexpr int kItemsPerThread = 4;
constexpr int kMinBlockRows = 64;  // the panel's conversion stays a small share of an item
constexpr double kMaxIdleShare = 0.05;

int GemmRowBlocks(int m, int panels, int threads) {
  if (threads <= 1) return 1;
  const int most = std::max(1, m / kMinBlockRows);
  int blocks = std::clamp((kItemsPerThread * threads + panels - 1) / panels, 1, most);
  for (; blocks < most; ++blocks) {
    const int items = panels * blocks;
    const int rounds = (items + threads - 1) / threads;
    if (static_cast<double>(rounds * threads - items) <= kMaxIdleShare * items) break;
  }
  return blocks;
}

// to_panel(j, k0, kc, dst): weight row j's columns [k0, k0 + kc) as fp32 to dst; k0 and kc are
// multiples of `align` (8, or a block's 32 values for block-quantised weights), kc may be shorter
// at the end.
template <class ToPanel>
void BlockedGemm(const MatmulParams& p, int align, ToPanel to_panel) {
  const size_t k = static_cast<size_t>(p.k);
  const int panels = (p.n + kPanelRows - 1) / kPanelRows;
  const int pk = (PanelK(p.k) + align - 1) / align * align;
  const int threads = CpuThreads();
  const int row_blocks = GemmRowBlocks(p.m, panels, threads);
  const int block_rows = ((p.m + row_blocks - 1) / row_blocks + 3) / 4 * 4;  // whole 4-row strips
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> panel(static_cast<size_t>(kPanelRows) * pk);
    int converted = -1;  // the panel whose only k block `panel` holds (k <= pk), else -1
#pragma omp for schedule(dynamic, 1)
    for (int item = 0; item < panels * row_blocks; ++item) {
      const int pi = item / row_blocks;
      const int i0 = (item % row_blocks) * block_rows;
      const int mb = std::min(block_rows, p.m - i0);
      const int j0 = pi * kPanelRows;
      const int nb = std::min(kPanelRows, p.n - j0);
      if (mb <= 0) continue;
      float bias[kPanelRows];
      for (int c = 0; c < nb; ++c) bias[c] = BiasAt(p, j0 + c);
      for (size_t k0 = 0; k0 < k; k0 += pk) {
        const int kc = static_cast<int>(std::min<size_t>(pk, k - k0));
        if (converted != pi) {
          for (int c = 0; c < nb; ++c) {
            to_panel(j0 + c, k0, kc, panel.data() + static_cast<size_t>(c) * pk);
          }
          converted = kc == p.k ? pi : -1;
        }
        for (int r0 = i0; r0 < i0 + mb; r0 += 4) {
          const int mr = std::min(4, i0 + mb - r0);
          if (k0 == 0) {  // y starts at bias (+ y): here, so the strip's lines are in L1 for the sums
            for (int r = r0; r < r0 + mr; ++r) {
              float* yrow = p.y + static_cast<size_t>(r) * p.n + j0;
              if (p.accumulate) {
                for (int c = 0; c < nb; ++c) yrow[c] += bias[c];
              } else {
                std::memcpy(yrow, bias, nb * sizeof(float));
              }
            }
          }
          for (int c0 = 0; c0 < nb; c0 += kTileCols) {
            MicroKernelMN(mr, std::min(kTileCols, nb - c0), p.x + r0 * k + k0, k,
                          panel.data() + static_cast<size_t>(c0) * pk, pk, kc,
                          p.y + static_cast<size_t>(r0) * p.n + j0 + c0, p.n);
          }
        }
      }
    }
  }
}

template <DType T>
void BlockedGemm(const MatmulParams& p) {
  const char* w = static_cast<const char*>(p.w);
  const size_t k = static_cast<size_t>(p.k);
  BlockedGemm(p, 8, [&](int j, size_t k0, int kc, float* dst) { ToF32<T>(w + (j * k + k0) * DTypeSize(T), dst, kc); });
}

// Block-quantised weights for m > 16: each panel dequantised exactly (kernels/dtype.h) to fp32.
void QuantGemm(const MatmulParams& p) {
  const char* w = static_cast<const char*>(p.w);
  const size_t row_bytes = DTypeBytes(p.w_dtype, static_cast<size_t>(p.k));
  BlockedGemm(p, kQuantBlockValues, [&](int j, size_t k0, int kc, float* dst) {
    DequantizeBlocks(p.w_dtype, w + j * row_bytes + DTypeBytes(p.w_dtype, k0), dst, static_cast<size_t>(kc));
  });
}

// The x rows rounded to bf16 (round to nearest even), as bf16 bits (Out = uint16_t, for
// `vdpbf16ps` and AMX) or widened back to fp32 (Out = float, exact, for the fp32 kernels), in a
// per-thread buffer reused across calls (a prefill issues hundreds of GEMMs; a fresh buffer each
// time would fault its pages in again). A buffer grown past kKeepElems (a long prompt's x) is
// released when the call ends, so an idle worker does not hold a copy of its largest activations.
// pad > 1 (AMX tiles): rows ld() = k rounded up to pad elements apart and m rounded up to pad
// rows, the padding zero, so whole tiles can be loaded.
template <typename Out>
class RoundedX {
 public:
  static constexpr size_t kKeepElems = size_t{4} << 20;
  explicit RoundedX(const MatmulParams& p, int pad = 1);
  ~RoundedX() {
    if (buf_.size() > kKeepElems) std::vector<Out>().swap(buf_);
  }
  RoundedX(const RoundedX&) = delete;
  RoundedX& operator=(const RoundedX&) = delete;
  const Out* data() const { return buf_.data(); }
  size_t ld() const { return ld_; }

 private:
  static std::vector<Out>& Buffer() {
    static thread_local std::vector<Out> buf;
    return buf;
  }
  std::vector<Out>& buf_ = Buffer();
  size_t ld_ = 0;
};

template <typename Out>
RoundedX<Out>::RoundedX(const MatmulParams& p, int pad) {
  ld_ = (static_cast<size_t>(p.k) + pad - 1) / pad * pad;
  const int rows = (p.m + pad - 1) / pad * pad;
  const size_t count = static_cast<size_t>(rows) * ld_;
  if (buf_.size() < count) buf_.resize(count);
  Out* out = buf_.data();
  auto round_row = [&](int r) {
    Out* o = out + static_cast<size_t>(r) * ld_;
    if (r >= p.m) {
      std::fill(o, o + ld_, Out{0});
      return;
    }
    const float* x = p.x + static_cast<size_t>(r) * p.k;
    int i = 0;
#if ICE_SIMD_AVX512
    for (; i + 16 <= p.k; i += 16) {
      const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
      if constexpr (sizeof(Out) == 2) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), h);
      } else {
        _mm512_storeu_ps(o + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
    }
#endif
    for (; i < p.k; ++i) {
      if constexpr (sizeof(Out) == 2) {
        o[i] = F32ToBf16(x[i]);
      } else {
        o[i] = Bf16ToF32(F32ToBf16(x[i]));
      }
    }
    std::fill(o + p.k, o + ld_, Out{0});
  };
  if (p.m <= kGemvMaxRows) {
    for (int r = 0; r < rows; ++r) round_row(r);  // decode: a few rows, not worth a thread team
  } else {
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
    for (int r = 0; r < rows; ++r) round_row(r);
  }
}

#if ICE_SIMD_AVX512
// out[r * 4 + c] = dot(x row r, w row c) over k, x and w bf16 (ldx, ldw elements apart): per 32
// columns one `vdpbf16ps` per (row, weight row) pair, MR x NR <= 16 accumulators, reduced once at
// the end (StoreSums4).
template <int MR, int NR>
void Bf16Tile(const uint16_t* x, size_t ldx, const uint16_t* w, size_t ldw, int k, float* out) {
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= k; i += 32) {
    __m512bh wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + c * ldw + i));
    for (int r = 0; r < MR; ++r) {
      __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * ldx + i));
      __asm__("" : "+v"(xv));  // one load of x for the NR products (see GemvBlock)
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  if (i < k) {
    const __mmask32 mask = static_cast<__mmask32>((1ull << (k - i)) - 1u);
    __m512bh wv[NR];
    for (int c = 0; c < NR; ++c) {
      wv[c] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, w + c * ldw + i));
    }
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, x + r * ldx + i));
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  StoreSums4<MR, NR>(acc, out);
}

template <int MR>
void Bf16TileN(int nr, const uint16_t* x, size_t ldx, const uint16_t* w, size_t ldw, int k, float* out) {
  switch (nr) {
    case 4: return Bf16Tile<MR, 4>(x, ldx, w, ldw, k, out);
    case 3: return Bf16Tile<MR, 3>(x, ldx, w, ldw, k, out);
    case 2: return Bf16Tile<MR, 2>(x, ldx, w, ldw, k, out);
    default: return Bf16Tile<MR, 1>(x, ldx, w, ldw, k, out);
  }
}

// y = round_bf16(x) · Wᵀ for bf16 W (m > 16). Work items are blocks of kBf16BlockRows x rows by
// kPanelRows weight rows (both dimensions split, so a 192-feature projection still feeds every
// thread); consecutive items share their weight block, which stays in L2 while the item's 4-row
// x strips stream from L1.
constexpr int kBf16BlockRows = 64;

void Bf16Gemm(const MatmulParams& p, const uint16_t* xb) {
  const uint16_t* w = static_cast<const uint16_t*>(p.w);
  const size_t k = static_cast<size_t>(p.k);
  const int row_blocks = (p.m + kBf16BlockRows - 1) / kBf16BlockRows;
  const int col_blocks = (p.n + kPanelRows - 1) / kPanelRows;
#pragma omp parallel for schedule(dynamic, 1) num_threads(CpuThreads())
  for (int item = 0; item < row_blocks * col_blocks; ++item) {
    const int j0 = (item / row_blocks) * kPanelRows;
    const int i0 = (item % row_blocks) * kBf16BlockRows;
    const int nb = std::min(kPanelRows, p.n - j0);
    const int mb = std::min(kBf16BlockRows, p.m - i0);
    float v[16];
    for (int r0 = 0; r0 < mb; r0 += 4) {
      const int mr = std::min(4, mb - r0);
      const uint16_t* xs = xb + (i0 + r0) * k;
      for (int c0 = 0; c0 < nb; c0 += 4) {
        const int nr = std::min(4, nb - c0);
        const uint16_t* ws = w + (j0 + c0) * k;
        switch (mr) {
          case 4: Bf16TileN<4>(nr, xs, k, ws, k, p.k, v); break;
          case 3: Bf16TileN<3>(nr, xs, k, ws, k, p.k, v); break;
          case 2: Bf16TileN<2>(nr, xs, k, ws, k, p.k, v); break;
          default: Bf16TileN<1>(nr, xs, k, ws, k, p.k, v); break;
        }
        for (int r = 0; r < mr; ++r) {
          float* y = p.y + static_cast<size_t>(i0 + r0 + r) * p.n + j0 + c0;
          for (int c = 0; c < nr; ++c) {
            const float s = v[r * 4 + c] + BiasAt(p, j0 + c0 + c);
            y[c] = p.accumulate ? y[c] + s : s;
          }
        }
      }
    }
  }
}
// ---- AMX tiles (kernels/simd_target.h, AmxActive) ----------------------------------------------
// C += A · B per `tdpbf16ps`: A a 16 x 32 bf16 tile (16 x rows, 32 columns of k), B a 16 x 16
// tile of bf16 pairs ("VNNI" layout: row r holds, for 16 weight rows, their k elements 2r and
// 2r+1), C 16 x 16 fp32. Work items are 32 weight rows (two B tiles) by a chunk of x rows; the
// item packs its weight rows into B tiles once (16 x 16 transposes of bf16 pairs) and then runs
// 2 x 2 C tiles (32 x 32 outputs) down its x rows, k innermost. The x rows come from RoundedX
// padded to whole tiles (zeros), the weights' k tail is zero-filled while packing.
constexpr int kAmxK = 32;       // bf16 elements of k per tile row (64 bytes)
constexpr int kAmxCols = 32;    // weight rows per item (two B tiles)
constexpr int kAmxRows = 32;    // x rows per C block (two A tiles)

// Tiles 0-3 C, 4-5 A (x rows), 6-7 B (weight rows): the 2 x 2 block of amx.h.

// Weight rows j0 .. j0+cols-1 (cols <= 32; missing rows zero) of the [n, k] bf16 matrix w as B
// tiles: packed[(kc * 2 + t) * 256 + r * 16 + c] = the pair (k = kc*32 + 2r, +1) of weight row
// j0 + t*16 + c, for kc < kp / 32 (zero beyond k).
void PackAmxB(const uint16_t* w, size_t k, int j0, int cols, size_t kp, uint32_t* packed) {
  for (size_t kc = 0; kc < kp / kAmxK; ++kc) {
    const size_t k0 = kc * kAmxK;
    const __mmask32 mask = k0 + kAmxK <= k ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (k - k0)) - 1u);
    for (int t = 0; t < 2; ++t) {
      __m512i rows[16];
      for (int c = 0; c < 16; ++c) {
        const int j = t * 16 + c;
        rows[c] = j < cols ? _mm512_maskz_loadu_epi16(mask, w + static_cast<size_t>(j0 + j) * k + k0)
                           : _mm512_setzero_si512();
      }
      Transpose16x16(rows);
      uint32_t* out = packed + (kc * 2 + t) * 256;
      for (int r = 0; r < 16; ++r) _mm512_storeu_si512(out + r * 16, rows[r]);
    }
  }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

// C tiles 0..3 = the 32 x 32 block of x rows xs (ldx elements apart) times the packed B tiles,
// over kp / 32 steps of k; stored to out[32][32].
inline void AmxBlock(const uint16_t* xs, size_t ldx, const uint32_t* packed, size_t ksteps, float* out) {
  const size_t xstride = ldx * sizeof(uint16_t);
  AmxZero2x2();
  for (size_t kc = 0; kc < ksteps; ++kc)
    AmxStep2x2(xs + kc * kAmxK, xs + 16 * ldx + kc * kAmxK, xstride, packed + kc * 512, packed + kc * 512 + 256);
  AmxStore2x2(out, kAmxCols);
}

// y = round_bf16(x) · Wᵀ for bf16 W (m > 16) on AMX tiles; xb from RoundedX<uint16_t>(p, 32).
void AmxBf16Gemm(const MatmulParams& p, const uint16_t* xb, size_t ldx) {
  const uint16_t* w = static_cast<const uint16_t*>(p.w);
  const size_t k = static_cast<size_t>(p.k);
  const size_t ksteps = ldx / kAmxK;
  const int threads = CpuThreads();
  const int col_blocks = (p.n + kAmxCols - 1) / kAmxCols;
  const int row_blocks = (p.m + kAmxRows - 1) / kAmxRows;
  // Enough items to feed every thread about four times; each item packs its weights once.
  const int chunks = std::clamp((4 * threads + col_blocks - 1) / col_blocks, 1, row_blocks);
  const int chunk_blocks = (row_blocks + chunks - 1) / chunks;
#pragma omp parallel num_threads(threads)
  {
    const AmxTileConfig config;
    _tile_loadconfig(&config);
    static thread_local std::vector<uint32_t> packed;
    if (packed.size() < ksteps * 512) packed.resize(ksteps * 512);
    alignas(64) float block[kAmxRows * kAmxCols];
#pragma omp for schedule(dynamic, 1)
    for (int item = 0; item < col_blocks * chunks; ++item) {
      const int j0 = (item / chunks) * kAmxCols;
      const int cols = std::min(kAmxCols, p.n - j0);
      const int b0 = (item % chunks) * chunk_blocks;
      const int b1 = std::min(row_blocks, b0 + chunk_blocks);
      if (b0 >= b1) continue;
      PackAmxB(w, k, j0, cols, ldx, packed.data());
      for (int b = b0; b < b1; ++b) {
        const int i0 = b * kAmxRows;
        AmxBlock(xb + static_cast<size_t>(i0) * ldx, ldx, packed.data(), ksteps, block);
        const int rows = std::min(kAmxRows, p.m - i0);
        for (int r = 0; r < rows; ++r) {
          float* y = p.y + static_cast<size_t>(i0 + r) * p.n + j0;
          const float* v = block + r * kAmxCols;
          for (int c = 0; c < cols; ++c) {
            const float s = v[c] + BiasAt(p, j0 + c);
            y[c] = p.accumulate ? y[c] + s : s;
          }
        }
      }
    }
    _tile_release();
  }
}

#pragma GCC pop_options
#endif

}  // namespace

Status Matmul(const MatmulParams& p) {
  if (IsBlockQuantized(p.w_dtype)) {
    if (p.m <= kGemvMaxRows) {
      QuantGemv(&p, 1);
    } else {
      QuantGemm(p);
    }
    return Status::Ok();
  }
  if (p.bf16_activations && p.w_dtype == DType::kBF16) {
#if ICE_SIMD_AVX512
    if (p.m > kGemvMaxRows) {
      if (AmxActive()) {
        const RoundedX<uint16_t> xb(p, kAmxK);
        AmxBf16Gemm(p, xb.data(), xb.ld());
      } else {
        const RoundedX<uint16_t> xb(p);
        Bf16Gemm(p, xb.data());
      }
      return Status::Ok();
    }
#endif
    const RoundedX<float> xr(p);
    MatmulParams rounded = p;
    rounded.x = xr.data();
    if (p.m <= kGemvMaxRows) {
      Gemv<DType::kBF16>(rounded);
    } else {
      BlockedGemm<DType::kBF16>(rounded);
    }
    return Status::Ok();
  }
  DispatchDType(p.w_dtype, [&]<DType T>() {
    if (p.m <= kGemvMaxRows) {
      Gemv<T>(p);
    } else {
      BlockedGemm<T>(p);
    }
  });
  return Status::Ok();
}

Status MatmulGroup(const MatmulParams* ps, int count) {
  // Fused: every product on the GEMV path with the same activations and weight handling.
  const MatmulParams& a = ps[0];
  bool fused = count > 1 && count <= kMaxGemvGroup && a.m <= kGemvMaxRows;
  for (int c = 1; c < count && fused; ++c) {
    const MatmulParams& p = ps[c];
    fused = p.x == a.x && p.m == a.m && p.k == a.k && p.w_dtype == a.w_dtype && p.bf16_activations == a.bf16_activations &&
            p.quant_activations == a.quant_activations;
  }
  if (!fused) {
    for (int c = 0; c < count; ++c) ICE_RETURN_IF_ERROR(ICE_SIMD_NS::Matmul(ps[c]));
    return Status::Ok();
  }
  if (IsBlockQuantized(a.w_dtype)) {
    QuantGemv(ps, count);
    return Status::Ok();
  }
  if (a.bf16_activations && a.w_dtype == DType::kBF16) {
    // Matmul's GEMV path with x rounded to bf16: rounded once for the group.
    const RoundedX<float> xr(a);
    MatmulParams rounded[kMaxGemvGroup];
    for (int c = 0; c < count; ++c) {
      rounded[c] = ps[c];
      rounded[c].x = xr.data();
    }
    GemvGroup<DType::kBF16>(rounded, count);
    return Status::Ok();
  }
  DispatchDType(a.w_dtype, [&]<DType T>() { GemvGroup<T>(ps, count); });
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
