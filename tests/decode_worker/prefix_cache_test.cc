// The decode worker's retained prefixes (decode_worker/prefix_cache.h) and the prefix copy they
// rely on (kvstore::SequenceCache::ClonePrefix), on real caches in a real page pool: a prefix
// copied from a longer sequence is the cache a prefill of those tokens builds (the same wire form,
// trees included) and shares no page with its source; lookups find the longest shared prefix
// under the same salt only; take removes, eviction spares pinned entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "decode_worker/prefix_cache.h"
#include "kvstore/block_hash.h"
#include "kvstore/dci_tree.h"

namespace icecache::decode {
namespace {

constexpr int kPage = 4, kHeadDim = 16, kLayers = 4, kKvHeads = 2;

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvstore::PagePoolOptions po;
    po.page_size = kPage;
    po.head_dim = kHeadDim;
    po.dtype = kernels::DType::kF32;  // exact: a copy read back from the pages is the original
    po.num_pages = 8192;
    auto pool = kvstore::PagePool::Create(po);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    std::mt19937 rng(5);
    std::normal_distribution<float> g;
    k_.assign(kLayers, std::vector<float>(static_cast<size_t>(kMaxTokens) * kKvHeads * kHeadDim));
    v_ = k_;
    for (int l = 0; l < kLayers; ++l) {
      for (auto& x : k_[l]) x = g(rng);
      for (auto& x : v_[l]) x = g(rng);
    }
  }

  // The first n tokens of the stored keys and values, built as a prefill builds them (ICE(r) groups
  // of 2 over the sparse layers, so followers' payloads are copied too).
  std::unique_ptr<kvstore::SequenceCache> Build(int n) {
    kvstore::SequenceCacheOptions o;
    o.num_layers = kLayers;
    o.num_kv_heads = kKvHeads;
    o.dense_layers = 1;
    o.sink_pages = 1;
    o.window_pages = 2;
    o.ice_group = 3;
    o.dci = *kvstore::DciParamsPreset("flat");
    auto cache = kvstore::SequenceCache::Create(o, pool_.get());
    EXPECT_TRUE(cache.ok());
    std::vector<const float*> kp, vp;
    for (int l = 0; l < kLayers; ++l) {
      kp.push_back(k_[l].data());
      vp.push_back(v_[l].data());
    }
    EXPECT_TRUE((*cache)->Build(kp.data(), vp.data(), n).ok());
    return std::move(*cache);
  }

  static std::vector<int32_t> Tokens(int n, int offset = 0) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = (i * 7 + 3 + offset) % 97;
    return t;
  }

  static constexpr int kMaxTokens = 300;
  std::unique_ptr<kvstore::PagePool> pool_;
  std::vector<std::vector<float>> k_, v_;
};

TEST_F(PrefixCacheTest, ClonePrefixIsThePrefillOfThosePrefixTokens) {
  auto whole = Build(kMaxTokens);
  for (int n : {1, 3, 4, 5, 37, 150, kMaxTokens - 1, kMaxTokens}) {
    SCOPED_TRACE(n);
    auto copy = whole->ClonePrefix(n);
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    auto fresh = Build(n);
    ASSERT_EQ((*copy)->num_tokens(), n);
    auto a = (*copy)->Serialize();
    auto b = fresh->Serialize();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->metadata, b->metadata);  // the same lists, trees and leaf order
    ASSERT_EQ(a->pages.size(), b->pages.size());
    // Every token's key and value where each cache says it is.
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKvHeads; ++h) {
        for (int pos = 0; pos < n; ++pos) {
          int32_t pa = -1, pb = -1;
          const auto la = (*copy)->LocateToken(l, h, pos, &pa);
          const auto lb = fresh->LocateToken(l, h, pos, &pb);
          ASSERT_EQ(la.slot, lb.slot);
          EXPECT_EQ(0, std::memcmp(pool_->KRow(pa, la.slot), pool_->KRow(pb, lb.slot), kHeadDim * sizeof(float)));
          EXPECT_EQ(0, std::memcmp(pool_->VRow(pa, la.slot), pool_->VRow(pb, lb.slot), kHeadDim * sizeof(float)));
        }
      }
    }
    // Independent pages: nothing of the source is shared.
    auto src = whole->Serialize();
    for (int32_t p : a->pages) EXPECT_EQ(std::count(src->pages.begin(), src->pages.end(), p), 0);
  }
  EXPECT_EQ(whole->ClonePrefix(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(whole->ClonePrefix(kMaxTokens + 1).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PrefixCacheTest, FindsTheLongestSharedPrefixUnderItsSaltOnly) {
  PrefixCache cache(kPage);
  const auto a = Tokens(40), b = Tokens(60, 1);
  cache.Add("s", a, Build(40), /*indexed=*/true);
  cache.Add("s", b, Build(60), true);
  EXPECT_EQ(cache.stats().entries, 2);
  // A prompt extending `a`, and one sharing 22 tokens of it (inside the sixth block).
  std::vector<int32_t> longer = a;
  longer.insert(longer.end(), {5, 6, 7});
  PrefixMatch m = cache.Find("s", longer, true);
  ASSERT_NE(m.entry, nullptr);
  EXPECT_EQ(m.tokens, 40);
  EXPECT_EQ(m.entry->tokens, a);
  std::vector<int32_t> branch(a.begin(), a.begin() + 22);
  branch.push_back(96);
  m = cache.Find("s", branch, true);
  EXPECT_EQ(m.tokens, 22);
  // Less than one shared block, another salt, or the other layout: no match.
  EXPECT_EQ(cache.Find("s", std::vector<int32_t>(a.begin(), a.begin() + 3), true).entry, nullptr);
  EXPECT_EQ(cache.Find("t", longer, true).entry, nullptr);
  EXPECT_EQ(cache.Find("s", longer, false).entry, nullptr);
  // A hash collision shares nothing: the tokens are compared.
  EXPECT_EQ(kvstore::BlockHashes(a, kPage, "s").size(), 10u);
}

TEST_F(PrefixCacheTest, TakeRemovesAndEvictionSparesPinnedEntries) {
  PrefixCache cache(kPage);
  cache.Add("s", Tokens(40), Build(40), true);
  cache.Add("s", Tokens(60, 1), Build(60), true);
  const int64_t used = pool_->used_pages();
  PrefixMatch m = cache.Find("s", Tokens(40), true);  // the 40-token entry, now most recent
  ASSERT_NE(m.entry, nullptr);
  cache.Pin(m.entry);
  // Everything: only the unpinned 60-token entry goes.
  const int64_t freed = cache.Evict(1 << 30);
  EXPECT_GT(freed, 0);
  EXPECT_EQ(cache.stats().entries, 1);
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(pool_->used_pages(), used - freed);
  auto taken = cache.Take(m.entry);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(taken->num_tokens(), 40);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(cache.stats().pages, 0);
  EXPECT_EQ(cache.Find("s", Tokens(40), true).entry, nullptr);
}

TEST_F(PrefixCacheTest, ALongerSequenceReplacesTheEntryItExtends) {
  PrefixCache cache(kPage);
  cache.Add("s", Tokens(40), Build(40), true);
  std::vector<int32_t> longer = Tokens(40);
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  cache.Add("s", longer, Build(45), true);
  EXPECT_EQ(cache.stats().entries, 1);
  cache.Add("t", Tokens(40), Build(40), true);  // another salt: both stay
  EXPECT_EQ(cache.stats().entries, 2);
}

}  // namespace
}  // namespace icecache::decode
