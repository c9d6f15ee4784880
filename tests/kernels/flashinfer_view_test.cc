// FlashInfer's paged_kv_t, built over our pool by kernels/flashinfer/pool_view.cuh, addresses the
// K and V rows PoolKvLayout names and reads as many tokens per request as the plan says.
#include "kernels/flashinfer/pool_view.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace icecache::kernels {
namespace {

TEST(FlashInferPoolView, AddressesOurPageLayout) {
  for (int page_size : {8, 16, 32, 64, 128}) {
    for (int head_dim : {64, 128, 256}) {
      const PoolKvLayout l = PoolKvLayoutFor(page_size, head_dim);
      for (int32_t page : {0, 1, 7, 123456}) {
        for (int token : {0, 1, page_size - 1}) {
          const flashinfer_view::PoolOffsets o = flashinfer_view::PagedKvOffsets(page_size, head_dim, page, token);
          const int64_t row = page * l.stride_page + token * l.stride_token;
          EXPECT_EQ(o.k, l.k_offset + row) << "page_size " << page_size << " head_dim " << head_dim;
          EXPECT_EQ(o.v, l.v_offset + row) << "page_size " << page_size << " head_dim " << head_dim;
          // Our layout (kernels/attention.h): page p's K block, then its V block.
          EXPECT_EQ(o.k, (2LL * page * page_size + token) * head_dim);
          EXPECT_EQ(o.v, (2LL * page * page_size + page_size + token) * head_dim);
        }
      }
    }
  }
}

TEST(FlashInferPoolView, RequestLengthsAreThePlans) {
  std::mt19937 rng(5);
  for (int page_size : {8, 16, 128}) {
    std::vector<int32_t> indptr{0}, ids, valid;
    for (int u = 0; u < 24; ++u) {
      const int n = std::uniform_int_distribution<int>(0, 9)(rng);
      for (int i = 0; i < n; ++i) {
        ids.push_back(static_cast<int32_t>(ids.size()));
        const int r = std::uniform_int_distribution<int>(0, 3)(rng);
        valid.push_back(r < 2 ? page_size : std::uniform_int_distribution<int>(0, page_size)(rng));
      }
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    PagedDecodePlan plan;
    ASSERT_TRUE(BuildPagedDecodePlan(indptr, ids, valid, page_size, &plan).ok());
    ASSERT_GT(plan.num_requests(), 0);
    for (int r = 0; r < plan.num_requests(); ++r) {
      EXPECT_EQ(flashinfer_view::PagedKvLength(plan, r), plan.kv_len(r)) << "request " << r;
    }
  }
}

}  // namespace
}  // namespace icecache::kernels
