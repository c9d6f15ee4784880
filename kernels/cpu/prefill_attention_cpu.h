// CPU causal prefill attention (declared in kernels/attention.h as PrefillAttention): tiled over
// (kv head, block of query positions) x key blocks with an online softmax; see the .cc.
#pragma once

#include "common/status.h"
#include "kernels/attention.h"

namespace icecache::kernels::cpu {

// Same contract as kernels::PrefillAttention on host pointers.
Status PrefillAttentionTiled(const PrefillAttentionParams& p);

// The same, one query row at a time with an exact two-pass softmax (the kernel before tiling):
// the fallback's shape, and the baseline of `icecache-bench prefill-attention`.
Status PrefillAttentionRowwise(const PrefillAttentionParams& p);

}  // namespace icecache::kernels::cpu
