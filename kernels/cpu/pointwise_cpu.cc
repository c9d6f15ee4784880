// Row-wise and elementwise CPU ops: RMSNorm, RoPE, SwiGLU, Add, Embedding.
#include <cmath>
#include <string>

#include "kernels/cpu/simd.h"  // last: switches code generation to the target

namespace icecache::kernels::cpu::ICE_SIMD_NS {
namespace {

// Below this many elements an op is a few microseconds of work, less than waking the OpenMP
// team (a futex wake per thread under OMP_WAIT_POLICY=passive), so it runs on the caller's
// thread. Decode steps (rows = batch <= 16) stay serial; prefill stays parallel.
constexpr long kMinParallelElements = 1L << 16;

int ThreadsFor(long elements) { return elements < kMinParallelElements ? 1 : CpuThreads(); }

// f(i) for i < n, split statically over `threads` OpenMP threads, or on the caller's thread
// alone without entering a parallel construct: libgomp reshapes its thread team even for an
// `if (false)` region (+21 us a call where its threads sleep, `icecache-bench omp-regions`; decode runs five of these
// ops a layer). Defined after simd.h, so it is compiled for the target like its callers.
template <typename I, typename F>
void ForRange(I n, int threads, F&& f) {
  if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (I i = 0; i < n; ++i) f(i);
  } else {
    for (I i = 0; i < n; ++i) f(i);
  }
}

}  // namespace

Status RmsNorm(const RmsNormParams& p) {
  const int threads = ThreadsFor(static_cast<long>(p.rows) * p.dim);
  DispatchDType(p.weight_dtype, [&]<DType T>() {
    ForRange(p.rows, threads, [&](int r) {
      const float* x = p.x + static_cast<size_t>(r) * p.dim;
      float* y = p.y + static_cast<size_t>(r) * p.dim;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int i = 0; i < p.dim; ++i) ss += x[i] * x[i];
      // Matches torch: x * rsqrt(mean(x^2) + eps), then * weight, all fp32.
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(p.dim) + p.eps);
      for (int i = 0; i < p.dim; ++i) y[i] = (x[i] * inv) * LoadScalar<T>(p.weight, i);
    });
  });
  return Status::Ok();
}

Status ApplyRope(const RopeParams& p) {
  const int half = p.rotary_dim / 2;
  const int threads = ThreadsFor(static_cast<long>(p.tokens) * p.heads * p.rotary_dim);
  ForRange(p.tokens, threads, [&](int t) {
    const float pos = static_cast<float>(p.positions[t]);
    float cs[512], sn[512];  // rotary_dim / 2 <= head_dim / 2; larger dims use the slow path
    const bool table = half <= 512;
    if (table) {
      for (int i = 0; i < half; ++i) {
        const float a = pos * p.inv_freq[i];
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
      }
    }
    for (int h = 0; h < p.heads; ++h) {
      float* x = p.x + (static_cast<size_t>(t) * p.heads + h) * p.head_dim;
      for (int i = 0; i < half; ++i) {
        float c, s;
        if (table) {
          c = cs[i];
          s = sn[i];
        } else {
          const float a = pos * p.inv_freq[i];
          c = std::cos(a);
          s = std::sin(a);
        }
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  });
  return Status::Ok();
}

#if ICE_SIMD_AVX512
// silu(g) * u for n <= 16 lanes (masked): sigmoid from e = exp(-|g|) <= 1, as 1 / (1 + e) for
// g >= 0 and e / (1 + e) below, so exp never overflows. ~2 ulp, like the scalar expf path
// (libm's expf is not vectorised here and was most of the op's time).
inline void SwiGlu16(const float* gate, const float* up, float* out, __mmask16 mask) {
  const __m512 g = _mm512_maskz_loadu_ps(mask, gate);
  const __m512 u = _mm512_maskz_loadu_ps(mask, up);
  const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 num = _mm512_mask_blend_ps(neg, one, e);
  const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
  _mm512_mask_storeu_ps(out, mask, _mm512_mul_ps(_mm512_mul_ps(g, sig), u));
}
#elif ICE_SIMD_AVX2
// SwiGlu16's arithmetic on 8 lanes (all valid).
inline __m256 SwiGlu8(__m256 g, __m256 u) {
  const __m256 abs_g = _mm256_and_ps(g, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 e = ExpNonPositive8(_mm256_sub_ps(_mm256_setzero_ps(), abs_g));
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
  return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}
#elif ICE_SIMD_NEON
// SwiGlu16's arithmetic on 4 lanes (all valid).
inline float32x4_t SwiGlu4(float32x4_t g, float32x4_t u) {
  const float32x4_t e = ExpNonPositive4(vnegq_f32(vabsq_f32(g)));
  const float32x4_t one = vdupq_n_f32(1.f);
  const uint32x4_t neg = vcltq_f32(g, vdupq_n_f32(0.f));
  const float32x4_t sig = vdivq_f32(vbslq_f32(neg, e, one), vaddq_f32(one, e));
  return vmulq_f32(vmulq_f32(g, sig), u);
}
#endif

Status SwiGlu(const SwiGluParams& p) {
  const int threads = ThreadsFor(p.n);
#if ICE_SIMD_AVX512
  const long blocks = (p.n + 15) / 16;
  ForRange(blocks, threads, [&](long b) {
    const long i = b * 16;
    const __mmask16 mask = p.n - i >= 16 ? static_cast<__mmask16>(0xffff)
                                         : static_cast<__mmask16>((1u << (p.n - i)) - 1u);
    SwiGlu16(p.gate + i, p.up + i, p.out + i, mask);
  });
#elif ICE_SIMD_AVX2
  const long blocks = (p.n + 7) / 8;
  ForRange(blocks, threads, [&](long b) {
    const long i = b * 8;
    const int n = static_cast<int>(std::min<long>(8, p.n - i));
    if (n == 8) {
      _mm256_storeu_ps(p.out + i, SwiGlu8(_mm256_loadu_ps(p.gate + i), _mm256_loadu_ps(p.up + i)));
    } else {
      Store8Tail(p.out + i, SwiGlu8(Load8Tail<DType::kF32>(p.gate, i, n), Load8Tail<DType::kF32>(p.up, i, n)), n);
    }
  });
#elif ICE_SIMD_NEON
  const long blocks = (p.n + 3) / 4;
  ForRange(blocks, threads, [&](long b) {
    const long i = b * 4;
    const int n = static_cast<int>(std::min<long>(4, p.n - i));
    if (n == 4) {
      vst1q_f32(p.out + i, SwiGlu4(vld1q_f32(p.gate + i), vld1q_f32(p.up + i)));
    } else {
      Store4Tail(p.out + i, SwiGlu4(Load4TailF32(p.gate, i, n), Load4TailF32(p.up, i, n)), n);
    }
  });
#else
  auto swiglu = [&](long i) {
    const float g = p.gate[i];
    p.out[i] = g / (1.f + std::exp(-g)) * p.up[i];
  };
  if (threads > 1) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (long i = 0; i < p.n; ++i) swiglu(i);
  } else {
#pragma omp simd
    for (long i = 0; i < p.n; ++i) swiglu(i);
  }
#endif
  return Status::Ok();
}

Status Add(const AddParams& p) {
  const int threads = ThreadsFor(p.n);
  if (threads > 1) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (long i = 0; i < p.n; ++i) p.y[i] += p.x[i];
  } else {
#pragma omp simd
    for (long i = 0; i < p.n; ++i) p.y[i] += p.x[i];
  }
  return Status::Ok();
}

Status Embedding(const EmbeddingParams& p) {
  for (int i = 0; i < p.n; ++i) {
    if (p.ids[i] < 0 || p.ids[i] >= p.vocab) {
      return OutOfRangeError("Embedding: token id " + std::to_string(p.ids[i]) + " at position " +
                             std::to_string(i) + " is outside [0, " + std::to_string(p.vocab) + ")");
    }
  }
  if (IsBlockQuantized(p.table_dtype)) {
    const size_t row_bytes = DTypeBytes(p.table_dtype, static_cast<size_t>(p.dim));
    for (int i = 0; i < p.n; ++i) {
      DequantizeBlocks(p.table_dtype, static_cast<const char*>(p.table) + p.ids[i] * row_bytes,
                   p.out + static_cast<size_t>(i) * p.dim, static_cast<size_t>(p.dim));
    }
    return Status::Ok();
  }
  DispatchDType(p.table_dtype, [&]<DType T>() {
    const size_t row_bytes = static_cast<size_t>(p.dim) * DTypeSize(T);
    const int threads = ThreadsFor(static_cast<long>(p.n) * p.dim);
    ForRange(p.n, threads, [&](int i) {
      ToF32<T>(static_cast<const char*>(p.table) + p.ids[i] * row_bytes,
               p.out + static_cast<size_t>(i) * p.dim, p.dim);
    });
  });
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu::ICE_SIMD_NS
