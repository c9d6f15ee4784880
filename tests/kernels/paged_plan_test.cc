// The paged decode plan (kernels/paged_plan.h) against the CPU twin: attention computed the way a
// CSR paged kernel reads the plan (every page full but each request's last, keys and values
// addressed through PoolKvLayout), merged by log-sum-exp over merge_indptr, must equal
// PagedDecodeAttention over the original lists, on every layout.
#include "kernels/paged_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_pages.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

struct Lists {
  std::vector<int32_t> indptr{0}, ids, valid;
};

// Random lists of `units` units: distinct pool pages in random order, mostly full, some partly
// filled anywhere in a list, some with no valid slot; `empty_every` > 0 leaves every such unit
// without pages.
Lists RandomLists(int units, int page_size, int max_pages, int pool_pages, int empty_every, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(pool_pages);
  for (int i = 0; i < pool_pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  Lists l;
  int next = 0;
  for (int u = 0; u < units; ++u) {
    const int n = empty_every > 0 && u % empty_every == empty_every - 1
                      ? 0
                      : std::uniform_int_distribution<int>(1, max_pages)(rng);
    for (int i = 0; i < n; ++i) {
      l.ids.push_back(perm[next++ % pool_pages]);
      const int r = std::uniform_int_distribution<int>(0, 9)(rng);
      l.valid.push_back(r < 5 ? page_size : r < 9 ? std::uniform_int_distribution<int>(1, page_size)(rng) : 0);
    }
    l.indptr.push_back(static_cast<int32_t>(l.ids.size()));
  }
  return l;
}

// One request as a CSR paged decode kernel reads it: pages indices[indptr[r] .. indptr[r+1]),
// all full but the last (last_page_len[r] tokens), K and V rows through the pool layout; query
// heads q[0 .. group). Double precision; out [group, head_dim], lse [group].
void CsrRequest(const PagedDecodePlan& plan, int r, const float* pool, const PoolKvLayout& layout,
                const float* q, int group, int head_dim, float scale, float* out, float* lse) {
  const int first = plan.indptr[r], last = plan.indptr[r + 1];
  for (int h = 0; h < group; ++h) {
    std::vector<double> s;
    std::vector<const float*> vrows;
    for (int e = first; e < last; ++e) {
      const int tokens = e + 1 == last ? plan.last_page_len[r] : plan.page_size;
      for (int t = 0; t < tokens; ++t) {
        const int64_t row = plan.indices[e] * layout.stride_page + t * layout.stride_token;
        const float* k = pool + layout.k_offset + row;
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[h * head_dim + d]) * k[d];
        s.push_back(dot * scale);
        vrows.push_back(pool + layout.v_offset + row);
      }
    }
    ASSERT_FALSE(s.empty()) << "request " << r << " attends no token";
    double mx = -1e300, sum = 0;
    for (double v : s) mx = std::max(mx, v);
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int d = 0; d < head_dim; ++d) {
      double acc = 0;
      for (size_t j = 0; j < s.size(); ++j) acc += s[j] * vrows[j][d];
      out[h * head_dim + d] = static_cast<float>(acc / sum);
    }
    lse[h] = static_cast<float>(mx + std::log(sum));
  }
}

// Every page of unit u with a valid slot appears in exactly one of its requests, with its fill;
// every page but a request's last is full.
void ExpectPlanCoversLists(const PagedDecodePlan& plan, const Lists& l) {
  ASSERT_EQ(plan.merge_indptr.size(), l.indptr.size());
  ASSERT_EQ(plan.indptr.size(), plan.last_page_len.size() + 1);
  ASSERT_EQ(plan.request_unit.size(), plan.last_page_len.size());
  ASSERT_EQ(static_cast<size_t>(plan.indptr.back()), plan.indices.size());
  for (int u = 0; u + 1 < static_cast<int>(l.indptr.size()); ++u) {
    std::map<int32_t, int> want, got;
    for (int e = l.indptr[u]; e < l.indptr[u + 1]; ++e) {
      if (l.valid[e] > 0) want[l.ids[e]] = l.valid[e];
    }
    for (int r = plan.merge_indptr[u]; r < plan.merge_indptr[u + 1]; ++r) {
      EXPECT_EQ(plan.request_unit[r], u);
      ASSERT_LT(plan.indptr[r], plan.indptr[r + 1]) << "request " << r << " has no page";
      EXPECT_GE(plan.last_page_len[r], 1);
      EXPECT_LE(plan.last_page_len[r], plan.page_size);
      for (int e = plan.indptr[r]; e < plan.indptr[r + 1]; ++e) {
        const int fill = e + 1 == plan.indptr[r + 1] ? plan.last_page_len[r] : plan.page_size;
        EXPECT_TRUE(got.emplace(plan.indices[e], fill).second) << "page " << plan.indices[e] << " twice in unit " << u;
      }
    }
    EXPECT_EQ(got, want) << "unit " << u;
    // At most one request per unit beyond its partly filled pages' count.
    int partial = 0;
    for (const auto& [page, fill] : want) partial += fill < plan.page_size;
    EXPECT_EQ(plan.merge_indptr[u + 1] - plan.merge_indptr[u], want.empty() ? 0 : std::max(partial, 1)) << "unit " << u;
  }
}

struct PlanCase {
  int batch, num_kv_heads, group, page_size, max_pages, empty_every;
};

void CheckAgainstCpuTwin(const PlanCase& c, uint32_t seed) {
  SCOPED_TRACE("page_size " + std::to_string(c.page_size) + " group " + std::to_string(c.group) + " kv heads " +
               std::to_string(c.num_kv_heads) + " batch " + std::to_string(c.batch) + " seed " + std::to_string(seed));
  const int head_dim = 32, units = c.batch * c.num_kv_heads, nq = c.num_kv_heads * c.group;
  const int pool_pages = units * c.max_pages + 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const Lists l = RandomLists(units, c.page_size, c.max_pages, pool_pages, c.empty_every, seed);
  const std::vector<float> pool =
      testing::RandomVector(static_cast<size_t>(pool_pages) * 2 * c.page_size * head_dim, seed + 1, -2.f, 2.f);
  const std::vector<float> q = testing::RandomVector(static_cast<size_t>(c.batch) * nq * head_dim, seed + 2);

  // The CPU twin over our own lists.
  std::vector<float> want(q.size()), want_lse(static_cast<size_t>(c.batch) * nq);
  PagedDecodeAttentionParams a;
  a.q = q.data();
  a.pages = pool.data();
  a.kv_dtype = DType::kF32;
  a.page_indptr = l.indptr.data();
  a.page_ids = l.ids.data();
  a.page_valid = l.valid.data();
  a.out = want.data();
  a.lse = want_lse.data();
  a.batch = c.batch;
  a.num_q_heads = nq;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = head_dim;
  a.page_size = c.page_size;
  a.scale = scale;
  ASSERT_TRUE(PagedDecodeAttention(a, Backend::kCpu).ok());

  PagedDecodePlan plan;
  const Status st = BuildPagedDecodePlan(l.indptr, l.ids, l.valid, c.page_size, &plan);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(plan.num_units, units);
  ExpectPlanCoversLists(plan, l);

  // Each request on its own (q rows of its unit's group), then merged into its unit's rows.
  const PoolKvLayout layout = PoolKvLayoutFor(c.page_size, head_dim);
  std::vector<float> got(q.size(), 0.f), got_lse(want_lse.size(), -std::numeric_limits<float>::infinity());
  std::vector<float> part(static_cast<size_t>(c.group) * head_dim), part_lse(c.group);
  for (int r = 0; r < plan.num_requests(); ++r) {
    const size_t row = static_cast<size_t>(plan.request_unit[r]) * c.group;
    CsrRequest(plan, r, pool.data(), layout, q.data() + row * head_dim, c.group, head_dim, scale, part.data(),
               part_lse.data());
    MergeStatesParams m;
    m.out = got.data() + row * head_dim;
    m.lse = got_lse.data() + row;
    m.out2 = part.data();
    m.lse2 = part_lse.data();
    m.rows = c.group;
    m.head_dim = head_dim;
    ASSERT_TRUE(MergeStates(m, Backend::kCpu).ok());
  }
  testing::ExpectClose(got, want, 1e-5, 1e-4, "out");
  testing::ExpectClose(got_lse, want_lse, 1e-5, 1e-5, "lse");
}

TEST(PagedDecodePlan, MatchesCpuTwinOnEveryLayout) {
  uint32_t seed = 1;
  for (int page_size : {8, 16, 32, 64, 128}) {
    for (int group : {1, 2, 4, 8}) {
      for (int kv_heads : {1, 2}) {
        CheckAgainstCpuTwin({3, kv_heads, group, page_size, 10, 0}, seed++);
        CheckAgainstCpuTwin({4, kv_heads, group, page_size, 6, 3}, seed++);  // some empty units
      }
    }
  }
}

TEST(PagedDecodePlan, FullPagesMakeOneRequestPerUnit) {
  const int P = 16;
  // Unit 0: three full pages; unit 1: full, full, partial last (CSR form as it is).
  const std::vector<int32_t> indptr{0, 3, 6}, ids{7, 3, 9, 1, 4, 2}, valid{P, P, P, P, P, 5};
  PagedDecodePlan plan;
  ASSERT_TRUE(BuildPagedDecodePlan(indptr, ids, valid, P, &plan).ok());
  EXPECT_TRUE(plan.one_request_per_unit());
  EXPECT_EQ(plan.indptr, indptr);
  EXPECT_EQ(plan.indices, ids);
  EXPECT_EQ(plan.last_page_len, (std::vector<int32_t>{P, 5}));
  EXPECT_EQ(plan.kv_len(0), 3 * P);
  EXPECT_EQ(plan.kv_len(1), 2 * P + 5);
}

TEST(PagedDecodePlan, PartialPagesAnywhereAreMovedLastOrSplit) {
  const int P = 8;
  // One unit, selection order: partial 3, full, empty, partial 5, full, partial 8 = full.
  const std::vector<int32_t> indptr{0, 6}, ids{10, 11, 12, 13, 14, 15}, valid{3, P, 0, 5, P, P};
  PagedDecodePlan plan;
  ASSERT_TRUE(BuildPagedDecodePlan(indptr, ids, valid, P, &plan).ok());
  EXPECT_FALSE(plan.one_request_per_unit());
  EXPECT_EQ(plan.indptr, (std::vector<int32_t>{0, 4, 5}));
  EXPECT_EQ(plan.indices, (std::vector<int32_t>{11, 14, 15, 10, 13}));
  EXPECT_EQ(plan.last_page_len, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(plan.request_unit, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(plan.merge_indptr, (std::vector<int32_t>{0, 2}));
}

TEST(PagedDecodePlan, EmptyListsGetNoRequest) {
  PagedDecodePlan plan;
  // No unit at all.
  ASSERT_TRUE(BuildPagedDecodePlan(std::vector<int32_t>{0}, {}, {}, 16, &plan).ok());
  EXPECT_EQ(plan.num_requests(), 0);
  EXPECT_EQ(plan.indptr, (std::vector<int32_t>{0}));
  // Units without pages, and one whose pages hold no valid slot.
  const std::vector<int32_t> indptr{0, 0, 2, 2, 3}, ids{5, 6, 7}, valid{0, 0, 4};
  ASSERT_TRUE(BuildPagedDecodePlan(indptr, ids, valid, 16, &plan).ok());
  EXPECT_EQ(plan.num_units, 4);
  EXPECT_FALSE(plan.one_request_per_unit());
  EXPECT_EQ(plan.merge_indptr, (std::vector<int32_t>{0, 0, 0, 0, 1}));
  EXPECT_EQ(plan.indices, (std::vector<int32_t>{7}));
  EXPECT_EQ(plan.last_page_len, (std::vector<int32_t>{4}));
}

TEST(PagedDecodePlan, RejectsBrokenLists) {
  PagedDecodePlan plan;
  plan.num_units = 42;
  const std::vector<int32_t> ok_indptr{0, 2}, ok_ids{1, 2}, ok_valid{16, 3};
  EXPECT_EQ(BuildPagedDecodePlan(ok_indptr, ok_ids, ok_valid, 0, &plan).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan({}, {}, {}, 16, &plan).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan(std::vector<int32_t>{1, 2}, ok_ids, ok_valid, 16, &plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan(std::vector<int32_t>{0, 2, 1}, ok_ids, ok_valid, 16, &plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan(ok_indptr, std::vector<int32_t>{1}, ok_valid, 16, &plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan(ok_indptr, std::vector<int32_t>{1, -2}, ok_valid, 16, &plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildPagedDecodePlan(ok_indptr, ok_ids, std::vector<int32_t>{17, 3}, 16, &plan).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.num_units, 42);  // unchanged on error
}

TEST(PagedDecodePlan, PoolLayoutAddressesWhatStoreKvWrites) {
  const int P = 16, D = 8, pages = 4;
  std::vector<float> pool(static_cast<size_t>(pages) * 2 * P * D, 0.f);
  const std::vector<float> k = testing::RandomVector(D, 3), v = testing::RandomVector(D, 4);
  const int64_t slot = 2 * P + 5;  // page 2, token 5
  StoreKvParams s;
  s.k = k.data();
  s.v = v.data();
  s.pages = pool.data();
  s.kv_dtype = DType::kF32;
  s.slot_ids = &slot;
  s.rows = 1;
  s.num_heads = 1;
  s.head_dim = D;
  s.page_size = P;
  ASSERT_TRUE(StoreKv(s, Backend::kCpu).ok());
  const PoolKvLayout l = PoolKvLayoutFor(P, D);
  const int64_t row = 2 * l.stride_page + 5 * l.stride_token;
  EXPECT_EQ(std::vector<float>(pool.begin() + l.k_offset + row, pool.begin() + l.k_offset + row + D), k);
  EXPECT_EQ(std::vector<float>(pool.begin() + l.v_offset + row, pool.begin() + l.v_offset + row + D), v);
}

}  // namespace
}  // namespace icecache::kernels
