// FlashInfer's view of our page pool, for the FlashInfer-based paged decode to come. Exists only
// in CUDA builds that found the pinned FlashInfer headers (cmake/flashinfer.cmake:
// ICECACHE_WITH_FLASHINFER; library icecache_flashinfer_view). This header is plain C++ (no
// FlashInfer or CUDA types): what FlashInfer's paged_kv_t addresses when pool_view.cuh builds it
// over our pool and a PagedDecodePlan, so a test can hold it against PoolKvLayout and the plan
// without a GPU (paged_kv_t's addressing is host code).
#pragma once

#include <cstdint>

#include "kernels/paged_plan.h"

namespace icecache::kernels::flashinfer_view {

// Element offsets from the pool base of K and V of token `token` of page `page`, as FlashInfer's
// paged_kv_t (bf16, NHD, one kv head per page) built by MakePoolPagedKv computes them.
struct PoolOffsets {
  int64_t k = 0;
  int64_t v = 0;
};
PoolOffsets PagedKvOffsets(int page_size, int head_dim, int32_t page, int token);

// Tokens FlashInfer's paged_kv_t reads for request r of `plan` (its get_length).
int64_t PagedKvLength(const PagedDecodePlan& plan, int r);

}  // namespace icecache::kernels::flashinfer_view
