// Builds FlashInfer's paged_kv_t over our page pool (kernels/attention.h layout) and a
// PagedDecodePlan (kernels/paged_plan.h). Include only from CUDA sources of targets linked to
// icecache_flashinfer.
//
// Mapping: a pool page holds one (layer, kv head), so the view has num_heads = 1; K rows start at
// the pool base and V rows page_size * head_dim elements later, with page stride
// 2 * page_size * head_dim and token stride head_dim (PoolKvLayout). Requests are the plan's
// (indptr, indices, last_page_len); the query heads of a request are its unit's GQA group.
#pragma once

#include <flashinfer/layout.cuh>
#include <flashinfer/page.cuh>

#include "kernels/paged_plan.h"

namespace icecache::kernels::flashinfer_view {

// pool: the pool base (device memory for a launch; null for a view that only computes offsets). indices, indptr, last_page_len: the plan's
// arrays where the kernel reads them (device memory for a launch), num_requests of them.
template <typename T>
::flashinfer::paged_kv_t<T, int32_t> MakePoolPagedKv(T* pool, int page_size, int head_dim, int num_requests,
                                                     int32_t* indices, int32_t* indptr, int32_t* last_page_len) {
  const PoolKvLayout l = PoolKvLayoutFor(page_size, head_dim);
  // NHD strides: [page, token, head]; one head, so the head stride is never stepped.
  const int64_t strides[3] = {l.stride_page, l.stride_token, l.stride_token};
  return ::flashinfer::paged_kv_t<T, int32_t>(1, page_size, head_dim, num_requests, ::flashinfer::QKVLayout::kNHD,
                                              pool, pool == nullptr ? nullptr : pool + l.v_offset, strides, strides, indices,
                                              indptr, last_page_len);
}

}  // namespace icecache::kernels::flashinfer_view
