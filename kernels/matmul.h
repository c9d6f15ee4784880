// Dense matrix products as a Linear layer computes them: y = x · Wᵀ (+ bias).
#pragma once

#include <string_view>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

// How x meets block-quantised weights on the GEMV path (m <= 16; MatmulParams::quant_activations).
enum class QuantActivations : int {
  kFp32 = 0,   // x stays fp32: the exact products of the stored weights
  kInt16 = 1,  // x rounded to int16 per block of 32 (error <= 2^-16 of the block's max |x|)
  kInt8 = 2,   // x rounded to int8 per block of 32: llama.cpp's numerics for these weights
};

struct MatmulParams {
  const float* x = nullptr;   // [m, k] fp32 activations, row-major
  const void* w = nullptr;    // [n, k] weights of type w_dtype (Hugging Face Linear layout: out × in)
  // Plain, or (CPU only; k a multiple of 32) block-quantised: q8_0, q4_0, q4_1 (kernels/dtype.h),
  // each row k / 32 blocks, multiplied in their blocks. For m <= 16 (decode) as quant_activations
  // says; for m > 16 (prefill) the weights dequantised exactly to fp32 panels, then the f32 path.
  DType w_dtype = DType::kF32;
  const void* bias = nullptr; // [n] of type bias_dtype, or nullptr
  DType bias_dtype = DType::kF32;
  float* y = nullptr;         // [m, n] fp32 output (must not alias x)
  int m = 0;                  // rows of x (tokens); m == 1 is GEMV
  int n = 0;                  // output features
  int k = 0;                  // input features
  bool accumulate = false;    // y += x·Wᵀ instead of y = x·Wᵀ (residual add fused)
  // With bf16 weights: x is rounded to bf16 (round to nearest even) before the products, on every
  // target and at every m (so a row's result does not depend on its batch), and the product is
  // that of two bf16 matrices with fp32 accumulation (what llama.cpp and bf16 frameworks compute).
  // For m > 16 (prefill) the avx512 target multiplies on AMX tiles where the CPU has AMX-BF16
  // (kernels/simd_target.h, AmxActive), else with `vdpbf16ps` (twice the fp32 FMA rate on Zen 4);
  // everything else rounds x and runs its fp32 kernel: the same values up to summation order.
  // Ignored for other weight types.
  bool bf16_activations = false;
  // With block-quantised weights and m <= 16 (otherwise ignored):
  //  * kFp32: a block's product is d_w * sum(w_i x_i) (q8_0; n_i for q4) plus, for q4,
  //    m_w * sum(x_i) (q4_0: m_w = -8 d_w), in fp32 FMAs in a target-specific order;
  //  * kInt16 / kInt8: every x row rounded per block of 32 values: a = max |x_i|, d_x = a / L,
  //    q_i = x_i * (L / a) rounded to nearest even (all 0 when a = 0), s_x = d_x * sum(q_i), with
  //    L = 32767 / 127 (kInt8 is how llama.cpp rounds activations for these weights). A block's
  //    product is (d_w * d_x) * sum(w_i q_i) (q8_0) or (d_w * d_x) * sum(n_i q_i) + m_w * s_x
  //    (q4), integer sums exact. Error against the exact product: that of x's rounding, at most
  //    sum over blocks of d_x / 2 * sum |w_i|. kInt8: ~0.4 % of max |y| on random rows, up to
  //    ~3 % on a real model's activations (outlier channels), enough to change greedy answers
  //    (docs/BENCHMARKS.md, "Against llama.cpp"); kInt16 256 times less. Both replace fp32 x's conversions and FMAs
  //    by integer multiply-adds (`vpmaddubsw` / `vpmaddwd` on x86): 1.3-2x faster than kFp32.
  // Rows of a 1..16-row call are computed alike in every mode (a row's bits do not depend on m).
  QuantActivations quant_activations = QuantActivations::kFp32;
};

// fp32 accumulation. INVALID_ARGUMENT on null pointers, non-positive sizes, or block-quantised
// weights whose k is not a multiple of 32; UNIMPLEMENTED for block-quantised weights on a backend
// other than the CPU. The CUDA backend computes with fp32 activations whatever bf16_activations
// says.
Status Matmul(const MatmulParams& p, Backend backend = Backend::kCpu);

// Several products in one call, each computed as Matmul(products[i]) computes it (the same values
// on the same target): a layer's q/k/v or gate/up projections of one input. On the CPU, products
// on the GEMV path (m <= 16) that share x, m, k, the weight dtype and bf16_activations run in one
// OpenMP loop over all their output features: one start of the thread team instead of one per
// product (a decode step starts a few hundred regions, and each start wakes the threads that went
// to sleep since the last: docs/BENCHMARKS.md "OpenMP waiting"); anything else runs one by one. No
// product's y may overlap another product's x or y. INVALID_ARGUMENT as Matmul, naming the product,
// or for count < 1 or null products.
Status MatmulGroup(const MatmulParams* products, int count, Backend backend = Backend::kCpu);

// How the model's matmuls over bf16 and block-quantised weights take their activations, for the
// whole process (as the SIMD target is; PyTorch's set_float32_matmul_precision is the same idea):
//   kFp32  x stays fp32: the exact products of the stored weights (what transformers computes in
//          fp32);
//   kBf16  x rounded to bf16 for bf16 weights (MatmulParams::bf16_activations), prefill and decode
//          alike: the numerics of llama.cpp and of frameworks running a bf16 model; prefill
//          attention also gets bf16 products where it has a bf16 form (PrefillAttentionParams::bf16:
//          AMX); int16 x for block-quantised weights in decode (QuantActivations::kInt16);
//   kInt8  as kAuto for bf16 weights; int8 x for block-quantised weights in decode
//          (QuantActivations::kInt8): llama.cpp's numerics for them, faster, and far less exact;
//   kAuto  (default) kBf16 where the active SIMD target multiplies bf16 in hardware (avx512:
//          AMX tiles or `vdpbf16ps`, 2-4x the fp32 prefill GEMM), kFp32 elsewhere (rounding would
//          cost precision and gain nothing); int16 x for block-quantised weights in decode.
// ICECACHE_MATMUL_PRECISION=auto|fp32|bf16|int8 sets it at start (anything else: a warning, auto).
enum class MatmulPrecision : int { kAuto = 0, kFp32 = 1, kBf16 = 2, kInt8 = 3 };
std::string_view MatmulPrecisionName(MatmulPrecision p);  // "auto", "fp32", "bf16", "int8"
// MatmulPrecisionName's inverse; INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<MatmulPrecision> ParseMatmulPrecision(std::string_view name);
MatmulPrecision GetMatmulPrecision();
void SetMatmulPrecision(MatmulPrecision p);  // thread-safe; call between kernel calls
// Whether a CPU Linear layer sets bf16_activations now: kAuto resolved against ActiveSimdTarget().
// Logs the resolved choice once (INFO).
bool UseBf16Activations();
// What a CPU Linear layer over block-quantised weights sets as quant_activations now: kFp32 for
// kFp32, kInt8 for kInt8, kInt16 otherwise. Logs the choice once (INFO).
QuantActivations BlockActivations();
// Whether prefill attention over a KV cache kept in kv_dtype sets PrefillAttentionParams::bf16:
// only for bf16 KV (the K/V that decode reads are bf16 then anyway) and where
// UseBf16Activations(). An fp32 KV cache keeps fp32 attention.
bool UseBf16Attention(DType kv_dtype);

}  // namespace icecache::kernels
