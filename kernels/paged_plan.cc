#include "kernels/paged_plan.h"

#include <string>

namespace icecache::kernels {

Status BuildPagedDecodePlan(std::span<const int32_t> page_indptr, std::span<const int32_t> page_ids,
                            std::span<const int32_t> page_valid, int page_size, PagedDecodePlan* plan) {
  if (page_size < 1) return InvalidArgumentError("paged plan: page_size must be >= 1");
  if (page_indptr.empty() || page_indptr[0] != 0) {
    return InvalidArgumentError("paged plan: page_indptr needs num_units + 1 entries starting at 0");
  }
  const size_t units = page_indptr.size() - 1;
  for (size_t u = 0; u < units; ++u) {
    if (page_indptr[u + 1] < page_indptr[u]) {
      return InvalidArgumentError("paged plan: page_indptr decreases at unit " + std::to_string(u));
    }
  }
  const size_t total = static_cast<size_t>(page_indptr[units]);
  if (page_ids.size() != total || page_valid.size() != total) {
    return InvalidArgumentError("paged plan: page_ids and page_valid need page_indptr.back() = " +
                                std::to_string(total) + " entries");
  }
  for (size_t e = 0; e < total; ++e) {
    if (page_ids[e] < 0) return InvalidArgumentError("paged plan: negative page id at " + std::to_string(e));
    if (page_valid[e] < 0 || page_valid[e] > page_size) {
      return InvalidArgumentError("paged plan: page_valid[" + std::to_string(e) + "] = " +
                                  std::to_string(page_valid[e]) + " outside 0.." + std::to_string(page_size));
    }
  }

  PagedDecodePlan p;
  p.page_size = page_size;
  p.num_units = static_cast<int>(units);
  p.indptr.reserve(units + 1);
  p.indptr.push_back(0);
  p.indices.reserve(total);
  p.merge_indptr.reserve(units + 1);
  p.merge_indptr.push_back(0);
  auto close_request = [&](int32_t unit, int32_t last_len) {
    p.indptr.push_back(static_cast<int32_t>(p.indices.size()));
    p.last_page_len.push_back(last_len);
    p.request_unit.push_back(unit);
  };
  for (size_t u = 0; u < units; ++u) {
    const int32_t begin = page_indptr[u], end = page_indptr[u + 1];
    const size_t first_request_pages = p.indices.size();
    int32_t first_partial = -1;
    for (int32_t e = begin; e < end; ++e) {
      if (page_valid[e] == page_size) {
        p.indices.push_back(page_ids[e]);
      } else if (page_valid[e] > 0 && first_partial < 0) {
        first_partial = e;
      }
    }
    if (first_partial >= 0) p.indices.push_back(page_ids[first_partial]);
    if (p.indices.size() > first_request_pages) {
      close_request(static_cast<int32_t>(u), first_partial >= 0 ? page_valid[first_partial] : page_size);
    }
    for (int32_t e = first_partial + 1; first_partial >= 0 && e < end; ++e) {
      if (page_valid[e] == 0 || page_valid[e] == page_size) continue;
      p.indices.push_back(page_ids[e]);
      close_request(static_cast<int32_t>(u), page_valid[e]);
    }
    p.merge_indptr.push_back(static_cast<int32_t>(p.last_page_len.size()));
  }
  *plan = std::move(p);
  return Status::Ok();
}

PoolKvLayout PoolKvLayoutFor(int page_size, int head_dim) {
  PoolKvLayout l;
  l.k_offset = 0;
  l.v_offset = static_cast<int64_t>(page_size) * head_dim;
  l.stride_page = 2 * l.v_offset;
  l.stride_token = head_dim;
  return l;
}

}  // namespace icecache::kernels
