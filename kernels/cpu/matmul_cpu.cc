// y = x · Wᵀ (+ bias) on the CPU.
//  * m <= kGemvMaxRows: GEMV-style. Each output feature's weight row is streamed once, converted
//    to fp32 on the fly, and dotted with the (cache-resident) x rows. Memory-bound on W.
//  * larger m: per thread a panel of kPanelRows weight rows x kPanelK columns is converted to fp32
//    once, then a 4x4 register-blocked micro-kernel multiplies every x row against it.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace icecache::kernels::cpu {

namespace {

constexpr int kGemvMaxRows = 4;
constexpr int kPanelRows = 64;
constexpr int kPanelK = 512;

float BiasAt(const MatmulParams& p, int j) {
  if (p.bias == nullptr) return 0.f;
  switch (p.bias_dtype) {
    case DType::kF16: return LoadScalar<DType::kF16>(p.bias, j);
    case DType::kBF16: return LoadScalar<DType::kBF16>(p.bias, j);
    case DType::kF32: break;
  }
  return LoadScalar<DType::kF32>(p.bias, j);
}

// out[r] = dot(x row r, w row) for r < M: each weight vector is converted once for all M rows.
template <DType T, int M>
void DotRows(const float* x, size_t ldx, const void* wrow, int k, float* out) {
#if defined(__AVX512F__)
  __m512 acc[M];
  for (int r = 0; r < M; ++r) acc[r] = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 wv = Load16<T>(wrow, i);
    for (int r = 0; r < M; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + i), wv, acc[r]);
  }
  if (i < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - i)) - 1u);
    const __m512 wv = Load16Tail<T>(wrow, i, k - i);
    for (int r = 0; r < M; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + r * ldx + i), wv, acc[r]);
    }
  }
  for (int r = 0; r < M; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
#else
  for (int r = 0; r < M; ++r) out[r] = Dot<T>(x + r * ldx, wrow, k);
#endif
}

template <DType T, int M>
void GemvRows(const MatmulParams& p) {
  const size_t row_bytes = static_cast<size_t>(p.k) * DTypeSize(T);
  const char* w = static_cast<const char*>(p.w);
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
  for (int j = 0; j < p.n; ++j) {
    float v[M];
    if constexpr (M == 1) {
      v[0] = Dot<T>(p.x, w + j * row_bytes, p.k);
    } else {
      DotRows<T, M>(p.x, p.k, w + j * row_bytes, p.k, v);
    }
    const float b = BiasAt(p, j);
    for (int r = 0; r < M; ++r) {
      float& out = p.y[static_cast<size_t>(r) * p.n + j];
      out = p.accumulate ? out + v[r] + b : v[r] + b;
    }
  }
}

template <DType T>
void Gemv(const MatmulParams& p) {
  switch (p.m) {
    case 1: return GemvRows<T, 1>(p);
    case 2: return GemvRows<T, 2>(p);
    case 3: return GemvRows<T, 3>(p);
    default: return GemvRows<T, 4>(p);
  }
}

// acc[r][c] += dot(x row r, panel row c) over kc columns; x rows are ldx apart, panel rows ldp.
template <int MR, int NR>
void MicroKernel(const float* x, size_t ldx, const float* panel, int ldp, int kc, float* y,
                 size_t ldy) {
#if defined(__AVX512F__)
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

template <DType T>
void BlockedGemm(const MatmulParams& p) {
  const size_t k = static_cast<size_t>(p.k);
  const size_t elem = DTypeSize(T);
  const char* w = static_cast<const char*>(p.w);
  const int panels = (p.n + kPanelRows - 1) / kPanelRows;
#pragma omp parallel num_threads(CpuThreads())
  {
    std::vector<float> panel(static_cast<size_t>(kPanelRows) * kPanelK);
#pragma omp for schedule(dynamic, 1)
    for (int pi = 0; pi < panels; ++pi) {
      const int j0 = pi * kPanelRows;
      const int nb = std::min(kPanelRows, p.n - j0);
      for (int r = 0; r < p.m; ++r) {
        float* yrow = p.y + static_cast<size_t>(r) * p.n + j0;
        for (int c = 0; c < nb; ++c) yrow[c] = (p.accumulate ? yrow[c] : 0.f) + BiasAt(p, j0 + c);
      }
      for (size_t k0 = 0; k0 < k; k0 += kPanelK) {
        const int kc = static_cast<int>(std::min<size_t>(kPanelK, k - k0));
        for (int c = 0; c < nb; ++c) {
          ToF32<T>(w + ((j0 + c) * k + k0) * elem, panel.data() + static_cast<size_t>(c) * kPanelK, kc);
        }
        for (int r0 = 0; r0 < p.m; r0 += 4) {
          const int mr = std::min(4, p.m - r0);
          for (int c0 = 0; c0 < nb; c0 += 4) {
            MicroKernelMN(mr, std::min(4, nb - c0), p.x + r0 * k + k0, k,
                          panel.data() + static_cast<size_t>(c0) * kPanelK, kPanelK, kc,
                          p.y + static_cast<size_t>(r0) * p.n + j0 + c0, p.n);
          }
        }
      }
    }
  }
}

}  // namespace

Status Matmul(const MatmulParams& p) {
  DispatchDType(p.w_dtype, [&]<DType T>() {
    if (p.m <= kGemvMaxRows) {
      Gemv<T>(p);
    } else {
      BlockedGemm<T>(p);
    }
  });
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu
