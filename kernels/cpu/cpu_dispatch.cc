// cpu::<op> (cpu_ops.h, prefill_attention_cpu.h): the op of the active SIMD target.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/prefill_attention_cpu.h"

namespace icecache::kernels::cpu {

Status Matmul(const MatmulParams& p) { ICE_SIMD_DISPATCH(Matmul, p); }
Status MatmulGroup(const MatmulParams* products, int count) { ICE_SIMD_DISPATCH(MatmulGroup, products, count); }
Status RmsNorm(const RmsNormParams& p) { ICE_SIMD_DISPATCH(RmsNorm, p); }
Status ApplyRope(const RopeParams& p) { ICE_SIMD_DISPATCH(ApplyRope, p); }
Status SwiGlu(const SwiGluParams& p) { ICE_SIMD_DISPATCH(SwiGlu, p); }
Status Add(const AddParams& p) { ICE_SIMD_DISPATCH(Add, p); }
Status Embedding(const EmbeddingParams& p) { ICE_SIMD_DISPATCH(Embedding, p); }
Status PrefillAttention(const PrefillAttentionParams& p) { ICE_SIMD_DISPATCH(PrefillAttention, p); }
Status PrefillAttentionRowwise(const PrefillAttentionParams& p) { ICE_SIMD_DISPATCH(PrefillAttentionRowwise, p); }
Status PagedDecodeAttention(const PagedDecodeAttentionParams& p) { ICE_SIMD_DISPATCH(PagedDecodeAttention, p); }

}  // namespace icecache::kernels::cpu
