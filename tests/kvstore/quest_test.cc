// The Quest baseline: SparseLayout::kTokenOrder caches and RetrievalMode::kQuest, checked against
// a brute-force reading of the definition (page bounds and ranking computed here from the raw keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::DenseAttention;
using testing::MakePool;
using testing::ModelKv;
using testing::PagedAttention;
using testing::RandomKv;
using testing::Rounded;

constexpr int kPs = 16;

SequenceCacheOptions QuestOpts(int layers, int nkv) {
  SequenceCacheOptions o;
  o.num_layers = layers;
  o.num_kv_heads = nkv;
  o.dense_layers = 1;
  o.sink_pages = 1;
  o.window_pages = 2;
  o.layout = SparseLayout::kTokenOrder;
  return o;
}

// Brute force: per-channel min/max of the page's keys (as the pool rounds them), then
// sum_c max(q_c min_c, q_c max_c).
float BruteBound(const PagePool& pool, const ModelKv& m, int layer, int head, int64_t first, int count, const float* q) {
  std::vector<float> lo(m.dim, INFINITY), hi(m.dim, -INFINITY);
  for (int t = 0; t < count; ++t) {
    auto k = Rounded(pool, m.K(layer, first + t, head), m.dim);
    for (int c = 0; c < m.dim; ++c) lo[c] = std::min(lo[c], k[c]), hi[c] = std::max(hi[c], k[c]);
  }
  float s = 0;
  for (int c = 0; c < m.dim; ++c) s += std::max(q[c] * lo[c], q[c] * hi[c]);
  return s;
}

void ExpectPagesInOrder(const SequenceCache& seq, const PagePool& pool, const ModelKv& m, int64_t n) {
  for (int layer = 1; layer < m.layers; ++layer) {
    for (int h = 0; h < m.nkv; ++h) {
      const auto& mid = seq.middle_pages(layer, h);
      ASSERT_EQ(static_cast<int64_t>(mid.size()) * kPs, seq.window_start() - seq.sink_tokens());
      EXPECT_EQ(seq.tree(layer, h), nullptr);
      for (int64_t pos = seq.sink_tokens(); pos < seq.window_start(); ++pos) {
        int32_t page = -1;
        const TokenLocation loc = seq.LocateToken(layer, h, pos, &page);
        ASSERT_EQ(page, mid[(pos - seq.sink_tokens()) / kPs]);
        ASSERT_EQ(loc.slot, (pos - seq.sink_tokens()) % kPs);
        EXPECT_EQ(testing::ReadRow(pool, pool.KRow(page, loc.slot), m.dim), Rounded(pool, m.K(layer, pos, h), m.dim));
      }
      // Bounds: the page's per-channel min (row 0) and max (row 1).
      const auto& b = seq.middle_bounds(layer, h);
      ASSERT_EQ(b.size(), mid.size() * 2 * m.dim);
      for (size_t i = 0; i < mid.size(); ++i) {
        for (int c = 0; c < m.dim; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int t = 0; t < kPs; ++t) {
            const float x = Rounded(pool, m.K(layer, seq.sink_tokens() + static_cast<int64_t>(i) * kPs + t, h), m.dim)[c];
            lo = std::min(lo, x), hi = std::max(hi, x);
          }
          ASSERT_EQ(b[i * 2 * m.dim + c], lo);
          ASSERT_EQ(b[i * 2 * m.dim + m.dim + c], hi);
        }
      }
    }
  }
  EXPECT_EQ(seq.num_tokens(), n);
}

TEST(QuestTest, TokenOrderLayoutBuildAndAppend) {
  const int dim = 16, nkv = 2, layers = 3;
  auto pool = MakePool(dim, 2000, kernels::DType::kBF16);
  ModelKv m = RandomKv(layers, nkv, dim, 700, 3);
  const int64_t built = 500;
  auto seq = SequenceCache::Create(QuestOpts(layers, nkv), pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), built).ok());
  ExpectPagesInOrder(*seq, *pool, m, built);
  // Decode past several window evictions: the evicted window page joins the middle list.
  for (int64_t t = built; t < m.n; ++t) {
    ASSERT_TRUE(seq->BeginToken().ok());
    for (int l = 0; l < layers; ++l) ASSERT_TRUE(seq->WriteLayer(l, m.K(l, t, 0), m.V(l, t, 0)).ok());
  }
  ExpectPagesInOrder(*seq, *pool, m, m.n);
  const int64_t per_sparse_head = (m.n + kPs - 1) / kPs;  // sink + middle + window, all in order
  EXPECT_EQ(seq->pages_held(), (layers * per_sparse_head) * nkv);
  seq->Release();
  EXPECT_EQ(pool->used_pages(), 0);
}

TEST(QuestTest, SelectionMatchesBruteForceRanking) {
  const int dim = 32, nkv = 2, nq = 6, group = nq / nkv, budget = 10;
  auto pool = MakePool(dim, 3000);
  ModelKv m = RandomKv(3, nkv, dim, 1000, 7);
  auto seq = SequenceCache::Create(QuestOpts(3, nkv), pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), m.n).ok());
  std::vector<float> q(nq * dim);
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  for (auto& x : q) x = g(rng);
  // Rank-by-rank merge here (the mass merge of the same lists is retriever_test's).
  Retriever r(RetrievalPolicy{budget, RetrievalMode::kQuest, GroupMerge::kRank});
  PageSelection sel;
  ASSERT_TRUE(r.Select({seq.get()}, 2, q.data(), nq, &sel).ok());
  const int k = budget - 1 - 2;
  for (int h = 0; h < nkv; ++h) {
    const auto& mid = seq->middle_pages(2, h);
    // Brute force per query head, then rank-by-rank merge.
    std::vector<std::vector<ScoredLeaf>> lists(group);
    for (int j = 0; j < group; ++j) {
      for (int i = 0; i < static_cast<int>(mid.size()); ++i) {
        lists[j].push_back({i, BruteBound(*pool, m, 2, h, seq->sink_tokens() + int64_t{i} * kPs, kPs, &q[(h * group + j) * dim])});
      }
      std::stable_sort(lists[j].begin(), lists[j].end(), [](auto& a, auto& b) { return a.score > b.score; });
    }
    std::vector<int32_t> want = MergeRankByRank(lists, k);
    std::set<int32_t> want_pages;
    for (int32_t i : want) want_pages.insert(mid[i]);
    const int b = sel.page_indptr[h], e = sel.page_indptr[h + 1];
    ASSERT_EQ(e - b, budget);
    EXPECT_EQ(sel.page_ids[b], seq->sink_pages(2, h)[0]);
    EXPECT_EQ(sel.page_ids[e - 1], seq->window_pages(2, h).back());
    EXPECT_EQ(std::set<int32_t>(sel.page_ids.begin() + b + 1, sel.page_ids.begin() + e - 2), want_pages);
    for (int i = b; i < e; ++i) EXPECT_EQ(sel.tree_leaf[i], -1);
  }
  // Quest's bound is an upper bound of every key's score in the page.
  const auto& b0 = seq->middle_bounds(2, 0);
  for (size_t i = 0; i < seq->middle_pages(2, 0).size(); ++i) {
    const float bound = QuestBound(q.data(), &b0[i * 2 * dim], dim);
    for (int t = 0; t < kPs; ++t) {
      const float* key = m.K(2, seq->sink_tokens() + static_cast<int64_t>(i) * kPs + t, 0);
      float dot = 0;
      for (int c = 0; c < dim; ++c) dot += key[c] * q[c];
      EXPECT_LE(dot, bound + 1e-4f);
    }
  }
}

TEST(QuestTest, PlantedKeyPageIsSelected) {
  const int dim = 32, nkv = 1;
  auto pool = MakePool(dim, 3000);
  ModelKv m = RandomKv(2, nkv, dim, 2000, 11);
  std::vector<float> q(dim, 0.f);
  q[3] = 1.f;
  q[7] = -1.f;
  const int64_t planted = 937;
  for (int c = 0; c < dim; ++c) m.k[1][planted * dim + c] = 0.f;
  m.k[1][planted * dim + 3] = 40.f;
  m.k[1][planted * dim + 7] = -40.f;
  auto seq = SequenceCache::Create(QuestOpts(2, nkv), pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), m.n).ok());
  PageSelection sel;
  ASSERT_TRUE(Retriever(RetrievalPolicy{4, RetrievalMode::kQuest}).Select({seq.get()}, 1, q.data(), 1, &sel).ok());
  int32_t page = -1;
  seq->LocateToken(1, 0, planted, &page);
  EXPECT_EQ(sel.page_ids.size(), 4u);
  EXPECT_NE(std::find(sel.page_ids.begin(), sel.page_ids.end(), page), sel.page_ids.end());
}

TEST(QuestTest, FullModeOnTokenOrderIsExactAttention) {
  const int dim = 16, nkv = 2;
  auto pool = MakePool(dim, 2000);
  ModelKv m = RandomKv(2, nkv, dim, 333, 2);
  auto seq = SequenceCache::Create(QuestOpts(2, nkv), pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), m.n).ok());
  std::vector<float> q(2 * dim, 0.3f);
  PageSelection sel;
  ASSERT_TRUE(Retriever(RetrievalPolicy{4, RetrievalMode::kFull}).Select({seq.get()}, 1, q.data(), 2, &sel).ok());
  const float scale = 1.f / std::sqrt(float(dim));
  for (int h = 0; h < nkv; ++h) {
    const int b = sel.page_indptr[h], e = sel.page_indptr[h + 1];
    int tokens = 0;
    for (int i = b; i < e; ++i) tokens += sel.page_valid[i];
    ASSERT_EQ(tokens, m.n);
    auto got = PagedAttention(*pool, &sel.page_ids[b], &sel.page_valid[b], e - b, &q[h * dim], scale);
    auto want = DenseAttention(*pool, m, 1, h, &q[h * dim], scale);
    for (int c = 0; c < dim; ++c) EXPECT_NEAR(got[c], want[c], 1e-5);
  }
}

TEST(QuestTest, LayoutAndModeMismatchesAreRefused) {
  const int dim = 16;
  auto pool = MakePool(dim, 2000);
  ModelKv m = RandomKv(2, 1, dim, 300, 4);
  std::vector<float> q(dim, 1.f);
  PageSelection sel;
  auto quest = SequenceCache::Create(QuestOpts(2, 1), pool.get()).value();
  ASSERT_TRUE(quest->Build(m.kp.data(), m.vp.data(), m.n).ok());
  for (RetrievalMode mode : {RetrievalMode::kSparse, RetrievalMode::kOracle}) {
    Status s = Retriever(RetrievalPolicy{4, mode}).Select({quest.get()}, 1, q.data(), 1, &sel);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("token-order"), std::string::npos) << s.message();
  }
  EXPECT_EQ(quest->Serialize().status().code(), StatusCode::kFailedPrecondition);
  SequenceCacheOptions tree_opts = QuestOpts(2, 1);
  tree_opts.layout = SparseLayout::kDciTree;
  auto tree = SequenceCache::Create(tree_opts, pool.get()).value();
  ASSERT_TRUE(tree->Build(m.kp.data(), m.vp.data(), m.n).ok());
  Status s = Retriever(RetrievalPolicy{4, RetrievalMode::kQuest}).Select({tree.get()}, 1, q.data(), 1, &sel);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("quest"), std::string::npos) << s.message();
  SequenceCacheOptions ice = QuestOpts(3, 1);
  ice.ice_group = 2;
  EXPECT_EQ(SequenceCache::Create(ice, pool.get()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::kvstore
