#include "kernels/page_gather.h"

#include <cstring>
#include <numeric>

#include "kernels/attention.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

constexpr size_t kPageBytes = 64;

std::vector<uint8_t> MakeHostPool(int pages) {
  std::vector<uint8_t> pool(pages * kPageBytes);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>((i / kPageBytes) * 7 + i);
  return pool;
}

// The staging slots of a CPU-backend `cache` hold exactly the requested host pages.
void ExpectSlotsHold(const PageResidencyCache& cache, const std::vector<uint8_t>& pool,
                     const std::vector<int64_t>& pages, const std::vector<int32_t>& slots) {
  ASSERT_EQ(cache.backend(), Backend::kCpu);
  const auto* dev = static_cast<const uint8_t*>(cache.device_pages());
  for (size_t i = 0; i < pages.size(); ++i) {
    ASSERT_EQ(std::memcmp(dev + slots[i] * kPageBytes, pool.data() + pages[i] * kPageBytes,
                          kPageBytes),
              0)
        << "page " << pages[i] << " slot " << slots[i];
  }
}

TEST(PageResidencyTest, LruNeverEvictsPagesOfTheSameStep) {
  PageResidency r(3);
  PageGatherStats st;
  std::vector<PageResidency::Copy> copies;
  int32_t slots[4];
  const int64_t step1[] = {10, 11, 12};
  ASSERT_TRUE(r.Assign(step1, 3, slots, &copies, &st).ok());
  EXPECT_EQ(copies.size(), 3u);
  EXPECT_EQ(st.hits, 0);
  const int64_t step2[] = {12, 13};  // 10 is least recently used → evicted, 12 stays put
  copies.clear();
  const int32_t slot12 = slots[2];
  ASSERT_TRUE(r.Assign(step2, 2, slots, &copies, &st).ok());
  EXPECT_EQ(slots[0], slot12);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].host_page, 13);
  EXPECT_FALSE(r.IsResident(10));
  EXPECT_TRUE(r.IsResident(11));
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.evictions, 1);
  const int64_t step3[] = {11, 14, 11};  // duplicates share a slot; 12 is now the LRU page
  copies.clear();
  ASSERT_TRUE(r.Assign(step3, 3, slots, &copies, &st).ok());
  EXPECT_EQ(slots[0], slots[2]);
  EXPECT_FALSE(r.IsResident(12));
  EXPECT_TRUE(r.IsResident(13));
  const int64_t too_many[] = {1, 2, 3, 4};
  copies.clear();
  const Status s = r.Assign(too_many, 4, slots, &copies, &st);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(copies.empty());
  EXPECT_TRUE(r.IsResident(11) && r.IsResident(13) && r.IsResident(14));  // unchanged
}

TEST(PageGatherTest, CopiesOnlyMissingPagesAndCounts) {
  const auto pool = MakeHostPool(100);
  auto cache = PageResidencyCache::Create(Backend::kCpu, 8, kPageBytes);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  std::vector<int32_t> slots;
  std::vector<int64_t> step = {5, 6, 7, 50, 99};
  ASSERT_TRUE((*cache)->Gather(pool.data(), step, &slots).ok());
  ExpectSlotsHold(**cache, pool, step, slots);
  EXPECT_EQ((*cache)->stats().pages_copied, 5);
  step = {6, 7, 1, 2, 3, 5, 99};  // three new pages, four hits
  ASSERT_TRUE((*cache)->Gather(pool.data(), step, &slots).ok());
  ExpectSlotsHold(**cache, pool, step, slots);
  const PageGatherStats& st = (*cache)->stats();
  EXPECT_EQ(st.steps, 2);
  EXPECT_EQ(st.pages_copied, 8);
  EXPECT_EQ(st.hits, 4);
  EXPECT_EQ(st.evictions, 0);  // 8 distinct pages fit the 8 slots: 50 is still resident
  EXPECT_EQ(st.bytes_copied, 8 * static_cast<int64_t>(kPageBytes));
  step = {60};
  ASSERT_TRUE((*cache)->Gather(pool.data(), step, &slots).ok());
  EXPECT_EQ((*cache)->stats().evictions, 1);
  EXPECT_FALSE((*cache)->residency().IsResident(50));  // least recently used
  // A page whose host content changed is copied again after Invalidate.
  (*cache)->Invalidate(6);
  step = {6};
  const int64_t before = (*cache)->stats().pages_copied;
  ASSERT_TRUE((*cache)->Gather(pool.data(), step, &slots).ok());
  EXPECT_EQ((*cache)->stats().pages_copied, before + 1);
  step = std::vector<int64_t>(9);
  std::iota(step.begin(), step.end(), 20);
  EXPECT_EQ((*cache)->Gather(pool.data(), step, &slots).code(), StatusCode::kResourceExhausted);
  step = {-1};
  EXPECT_EQ((*cache)->Gather(pool.data(), step, &slots).code(), StatusCode::kInvalidArgument);
}

// Decode attention over gathered slots equals decode attention over the host pool directly, and
// every gathered slot holds its host page byte for byte. pinned: the pool page-locked as the decode
// worker's is (on CUDA the gather then runs as one kernel reading it through its mapped address;
// pageable, one copy per page).
void GatheredAttentionMatchesHost(Backend backend, bool pinned = false) {
  const int P = 16, d = 64, hq = 4, hkv = 2;
  const size_t page_elems = 2 * P * d;
  const int pool_pages = 40;
  auto pool_values = testing::RandomVector(pool_pages * page_elems, 5);
  PinnedHostRegion region;
  if (pinned) {
    auto r = PinnedHostRegion::Register(backend, pool_values.data(), pool_values.size() * sizeof(float));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    region = std::move(r).value();
  }
  const auto q = testing::RandomVector(hq * d, 6);
  auto cache = PageResidencyCache::Create(backend, 12, page_elems * sizeof(float));
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  std::mt19937 rng(3);
  for (int step = 0; step < 6; ++step) {
    std::vector<int64_t> pages;
    std::vector<int32_t> indptr = {0}, valid, host_ids;
    for (int g = 0; g < hkv; ++g) {
      for (int i = 0; i < 5; ++i) {
        const int id = std::uniform_int_distribution<int>(0, pool_pages - 1)(rng);
        pages.push_back(id);
        host_ids.push_back(id);
        valid.push_back(1 + id % P);
      }
      indptr.push_back(static_cast<int32_t>(pages.size()));
    }
    std::vector<int32_t> slots;
    ASSERT_TRUE((*cache)->Gather(pool_values.data(), pages, &slots).ok());
    std::vector<float> slot_copy(page_elems);
    for (size_t i = 0; i < pages.size(); ++i) {
      const size_t page_bytes = page_elems * sizeof(float);
      ASSERT_TRUE(CopyToHost(backend, slot_copy.data(),
                             static_cast<const char*>((*cache)->device_pages()) + slots[i] * page_bytes, page_bytes)
                      .ok());
      ASSERT_EQ(0, std::memcmp(slot_copy.data(), pool_values.data() + pages[i] * page_elems, page_bytes))
          << "step " << step << " page " << pages[i] << " in slot " << slots[i];
    }
    std::vector<float> want(hq * d), got(hq * d);
    PagedDecodeAttentionParams p;
    p.q = q.data();
    p.pages = pool_values.data();
    p.page_indptr = indptr.data();
    p.page_ids = host_ids.data();
    p.page_valid = valid.data();
    p.out = want.data();
    p.batch = 1;
    p.num_q_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.page_size = P;
    p.scale = 0.125f;
    ASSERT_TRUE(PagedDecodeAttention(p, Backend::kCpu).ok());
    auto dq = testing::Upload(backend, q);
    auto dindptr = testing::Upload(backend, indptr);
    auto dslots = testing::Upload(backend, slots);
    auto dvalid = testing::Upload(backend, valid);
    auto dout = testing::Upload(backend, got);
    p.q = dq.as<float>();
    p.pages = (*cache)->device_pages();
    p.page_indptr = dindptr.as<int32_t>();
    p.page_ids = dslots.as<int32_t>();
    p.page_valid = dvalid.as<int32_t>();
    p.out = dout.as<float>();
    ASSERT_TRUE(PagedDecodeAttention(p, backend).ok());
    got = testing::Download<float>(dout, got.size());
    // Same pages, same kernel on CPU: exact; CUDA: its attention tolerance (5e-5 abs).
    testing::ExpectClose(got, want, backend == Backend::kCpu ? 0 : 5e-5, 0,
                         "step " + std::to_string(step));
  }
  EXPECT_GT((*cache)->stats().hits, 0);
}

TEST(PageGatherTest, GatheredAttentionMatchesHostCpu) { GatheredAttentionMatchesHost(Backend::kCpu); }

TEST(PageGatherTest, GatheredAttentionMatchesHostCuda) {
  ICE_SKIP_WITHOUT_CUDA();
  GatheredAttentionMatchesHost(Backend::kCuda);
}

TEST(PageGatherTest, GatheredAttentionMatchesHostPinnedCpu) { GatheredAttentionMatchesHost(Backend::kCpu, true); }

TEST(PageGatherTest, GatheredAttentionMatchesHostPinnedCuda) {
  ICE_SKIP_WITHOUT_CUDA();
  GatheredAttentionMatchesHost(Backend::kCuda, /*pinned=*/true);
}

}  // namespace
}  // namespace icecache::kernels
