// Host-side plan of one batched paged decode step in the form FlashInfer-style paged decode
// kernels take (a CSR page table: indptr, indices, last_page_len), built from the page lists our
// own kernel takes (kernels::PagedDecodeAttentionParams: page_indptr, page_ids, page_valid per
// (sequence, kv head)). Pure host code: no CUDA, no device memory; the caller uploads the arrays.
//
// Our lists and the CSR form differ in two ways, and the plan bridges both:
//
// 1. Granularity. A pool page holds ONE (layer, kv head) (kernels/attention.h), so one list of ours
//    is one "request" of a paged kernel with a single kv head, whose query heads are the GQA group
//    of that kv head: request r reads q rows [request_unit[r] * group, +group) of q viewed as
//    [batch * num_kv_heads, group, head_dim] (the same memory as [batch, num_q_heads, head_dim]).
//    PoolKvLayout below gives the strides of the pool in that view.
//
// 2. Partly filled pages. The CSR form says how many tokens a request's LAST page holds and
//    assumes every other page is full. Our lists may hold partly filled pages anywhere: sparse
//    selection lists pages in selection order, not position order, and every DCI tree cell's last
//    leaf is partly filled (kvstore/dci_tree.h, LeafLayout), so a list of retrieved leaves usually
//    holds several; the newest window page is partly filled too.
//
//    Representation chosen: a unit's pages are REORDERED and SPLIT. Its full pages, in list order,
//    followed by its first partly filled page form one request; each further partly filled page is
//    a request of its own (one page, last_page_len = its fill). The requests of unit u are
//    [merge_indptr[u], merge_indptr[u+1]); their outputs are merged by log-sum-exp
//    (kernels::MergeStates pairwise, or a variable-length merge over merge_indptr in one launch),
//    exactly as the rest estimate is merged into the paged result today.
//
//    Why this is exact: decode attention is softmax over a SET of keys. Keys are stored with RoPE
//    already applied (model.cc applies it to k before Attend), and a decode query attends every
//    selected slot with no position-dependent mask, so the order of pages does not change the
//    result (up to fp32 summation order), and splitting a set into disjoint parts merged by
//    log-sum-exp gives softmax over the union (kernels::MergeStates' contract).
//
//    Rejected alternatives: reordering alone (one partly filled page can be last, not several);
//    a page_size = 1 view of the pool (indices = K row ids p * 2 * page_size + slot, every list
//    exact without a merge, but index arrays page_size times longer and per-token gathers instead
//    of whole-page loads). A unit whose partly filled pages number at most one costs no merge;
//    one_request_per_unit() says when a whole step needs none.
//
// Empty units (no page, or only pages with 0 valid slots) get no request: merge_indptr[u] ==
// merge_indptr[u+1]. Our kernel's contract for them is out = 0 and lse = -inf, which is what a
// merge over an empty range yields; a caller that launches only the requests must write those
// rows itself. Pages with 0 valid slots are dropped from every request.
//
// Thread safety: BuildPagedDecodePlan is reentrant; a plan is a plain value.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace icecache::kernels {

struct PagedDecodePlan {
  int page_size = 0;
  int num_units = 0;                   // batch * num_kv_heads of the lists planned
  std::vector<int32_t> indptr;         // [num_requests + 1] request r's pages: indices[indptr[r] .. indptr[r+1])
  std::vector<int32_t> indices;        // [indptr.back()] page ids (whatever ids the lists held: pool or device slots)
  std::vector<int32_t> last_page_len;  // [num_requests] tokens in request r's last page, 1..page_size
  std::vector<int32_t> request_unit;   // [num_requests] the (sequence, kv head) unit b * num_kv_heads + g of r
  std::vector<int32_t> merge_indptr;   // [num_units + 1] unit u's requests: [merge_indptr[u], merge_indptr[u+1])

  int num_requests() const { return static_cast<int>(last_page_len.size()); }
  // Tokens request r attends: (pages - 1) * page_size + last_page_len[r].
  int64_t kv_len(int r) const {
    return static_cast<int64_t>(indptr[r + 1] - indptr[r] - 1) * page_size + last_page_len[r];
  }
  // True when request r is unit r for every unit (no split, no empty unit): q, out and lse of the
  // step are then the requests' own arrays and no merge runs.
  bool one_request_per_unit() const { return num_requests() == num_units; }
};

// Builds *plan from the lists of PagedDecodeAttentionParams (kernels/attention.h):
//   page_indptr [num_units + 1], page_indptr[0] == 0, non-decreasing;
//   page_ids    [page_indptr[num_units]], each >= 0;
//   page_valid  [same], each in 0..page_size.
// INVALID_ARGUMENT (plan left unchanged) when the lists break that contract or page_size < 1.
// Within a request the full pages keep their list order.
Status BuildPagedDecodePlan(std::span<const int32_t> page_indptr, std::span<const int32_t> page_ids,
                            std::span<const int32_t> page_valid, int page_size, PagedDecodePlan* plan);

// The pool (kernels/attention.h layout) as a paged kernel with one kv head per page sees it, in
// elements of the pool's dtype from the pool base: page p's K row t at
// k_offset + p * stride_page + t * stride_token, its V row at v_offset + the same.
struct PoolKvLayout {
  int64_t k_offset = 0;
  int64_t v_offset = 0;      // page_size * head_dim: V block after the K block
  int64_t stride_page = 0;   // 2 * page_size * head_dim
  int64_t stride_token = 0;  // head_dim
};
PoolKvLayout PoolKvLayoutFor(int page_size, int head_dim);

}  // namespace icecache::kernels
