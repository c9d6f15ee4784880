// CPU causal prefill attention. The op itself, cpu::PrefillAttention (declared in cpu_ops.h next
// to the other CPU ops), is tiled over (kv head, block of query positions) x key blocks with an
// online softmax; see the .cc. This header adds its row-by-row twin.
#pragma once

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/simd_target.h"

namespace icecache::kernels::cpu {

// Same contract as kernels::PrefillAttention on host pointers, one query row at a time with an
// exact two-pass softmax (the kernel before tiling): the shape of the tiled kernel's fallback
// without AVX-512, and the baseline of `icecache-bench prefill-attention`.
Status PrefillAttentionRowwise(const PrefillAttentionParams& p);

// Whether cpu::PrefillAttention runs p on AMX tiles (bf16 products): p.bf16, head_dim a multiple
// of 32 up to 256, the avx512 target active and kernels::AmxActive(). The kernel's own test.
inline bool PrefillAttentionOnAmx(const PrefillAttentionParams& p) {
  return p.bf16 && p.head_dim % 32 == 0 && p.head_dim <= 256 && ActiveSimdTarget() == SimdTarget::kAvx512 &&
         AmxActive();
}

}  // namespace icecache::kernels::cpu
