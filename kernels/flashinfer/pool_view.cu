#include "kernels/flashinfer/pool_view.h"

#include <cuda_bf16.h>

#include "kernels/flashinfer/pool_view.cuh"

namespace icecache::kernels::flashinfer_view {

PoolOffsets PagedKvOffsets(int page_size, int head_dim, int32_t page, int token) {
  // The base pointers are ours (pool + PoolKvLayout offsets); the offsets within are FlashInfer's.
  const auto kv = MakePoolPagedKv<__nv_bfloat16>(nullptr, page_size, head_dim, 1, nullptr, nullptr, nullptr);
  const PoolKvLayout l = PoolKvLayoutFor(page_size, head_dim);
  PoolOffsets o;
  o.k = l.k_offset + static_cast<int64_t>(kv.get_elem_offset(page, 0, token, 0));
  o.v = l.v_offset + static_cast<int64_t>(kv.get_v_elem_offset(page, 0, token, 0));
  return o;
}

int64_t PagedKvLength(const PagedDecodePlan& plan, int r) {
  // paged_kv_t takes mutable pointers; get_length only reads.
  auto kv = MakePoolPagedKv<__nv_bfloat16>(nullptr, plan.page_size, 1, plan.num_requests(), nullptr,
                                           const_cast<int32_t*>(plan.indptr.data()),
                                           const_cast<int32_t*>(plan.last_page_len.data()));
  return kv.get_length(r);
}

}  // namespace icecache::kernels::flashinfer_view
